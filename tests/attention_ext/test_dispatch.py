"""The route dispatch: the order a call's routes are tried in, forcing a route, and which kernels
CUDA takes by default (what has run on a GPU)."""
import pytest
import torch

from attention_ext.dispatch import Route, RouteCall, RouteDispatch, takes_every_call


def test_the_first_preferred_route_that_takes_a_call_runs_and_a_forced_one_goes_first():
    def cpu_only(call):
        return None if call.device_type == "cpu" else f"no {call.device_type} kernel"
    routes = RouteDispatch("test route", (Route("fused", cpu_only), Route("plain", takes_every_call)),
                           preference=lambda call: ("fused", "plain"))
    assert routes.choose(RouteCall("cpu", torch.float32)) == "fused"
    assert routes.choose(RouteCall("cuda", torch.float32)) == "plain"
    assert routes.reasons(RouteCall("cuda", torch.float32)) == {"fused": "no cuda kernel", "plain": None}
    with routes.forced("cpu", "plain"):
        assert routes.choose(RouteCall("cpu", torch.float32)) == "plain"
    assert routes.choose(RouteCall("cpu", torch.float32)) == "fused"
    with pytest.raises(ValueError, match="the fused test route cannot run on cuda: no cuda kernel"):
        with routes.forced("cuda", "fused"):   # a route that cannot run on the device is refused at once
            pass


def test_cuda_takes_the_extension_kernels_unless_triton_is_asked_for(monkeypatch):
    # the Triton kernels have run only in the interpreter: a GPU default must be what ran on a GPU
    from attention_ext.attentions.clustered import CUDA_KERNELS_VARIABLE, kernel_routes
    from attention_ext.dispatch import RouteCall
    call = RouteCall("cuda", torch.float32, 100)
    monkeypatch.delenv(CUDA_KERNELS_VARIABLE, raising=False)
    assert kernel_routes.order(call) == ("extension",)
    monkeypatch.setenv(CUDA_KERNELS_VARIABLE, "triton")
    assert kernel_routes.order(call) == ("triton", "extension")
    assert kernel_routes.order(RouteCall("cpu", torch.float32, 100)) == ("extension",)
    monkeypatch.setenv(CUDA_KERNELS_VARIABLE, "fast")
    with pytest.raises(ValueError, match="ATTENTION_EXT_CUDA_KERNELS='fast': give extension .the default. or triton"):
        kernel_routes.order(call)
