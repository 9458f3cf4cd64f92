"""Devices for the kernel tests: "cpu" always, "cuda" when this torch sees a GPU.

Its own module (not conftest.py) so that test files can import it by a name no other
test folder uses: tests/asr has a conftest.py too.
"""
import pytest
import torch

CUDA_AVAILABLE = torch.cuda.is_available()
requires_cuda = pytest.mark.skipif(not CUDA_AVAILABLE, reason="no CUDA device (torch.cuda.is_available() is False)")
DEVICES = ["cpu", pytest.param("cuda", marks=requires_cuda)]
