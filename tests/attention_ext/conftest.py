"""Fixtures of the kernel tests. `device`: a test that takes it runs once per device of
kernel_devices.DEVICES; the cuda run is skipped (at collection cost only) where
torch.cuda.is_available() is False, as in CI. `threads`: runs a callable under a given torch
thread count.
"""
import pytest
import torch

from kernel_devices import DEVICES


@pytest.fixture(params=DEVICES)
def device(request):
    return torch.device(request.param)


@pytest.fixture
def threads():
    """Runs a callable under a given torch thread count and restores the previous one."""
    previous = torch.get_num_threads()

    def run(count, function):
        torch.set_num_threads(count)
        try:
            return function()
        finally:
            torch.set_num_threads(previous)
    yield run
    torch.set_num_threads(previous)
