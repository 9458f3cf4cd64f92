"""The `device` fixture of the kernel tests: a test that takes it runs once per device of
kernel_devices.DEVICES; the cuda run is skipped (at collection cost only) where
torch.cuda.is_available() is False, as in CI.
"""
import pytest
import torch

from kernel_devices import DEVICES


@pytest.fixture(params=DEVICES)
def device(request):
    return torch.device(request.param)
