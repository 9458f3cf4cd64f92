"""Devices for the kernel tests: "cpu" always, "cuda" when this torch sees a GPU.

A test that takes the `device` fixture runs once per device; the cuda run is skipped
(at collection cost only) where torch.cuda.is_available() is False, as in CI.
"""
import pytest
import torch

CUDA_AVAILABLE = torch.cuda.is_available()
requires_cuda = pytest.mark.skipif(not CUDA_AVAILABLE, reason="no CUDA device (torch.cuda.is_available() is False)")
DEVICES = ["cpu", pytest.param("cuda", marks=requires_cuda)]


@pytest.fixture(params=DEVICES)
def device(request):
    return torch.device(request.param)
