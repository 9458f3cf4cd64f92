"""Every attention of the registry can live in a CUDA graph (issue 38, "ops a CUDA graph can hold").

With value checks off (`attention_ext.set_input_validation(False)`) a forward and backward on
CUDA must not synchronise with the host (run under torch.cuda.set_sync_debug_mode("error"),
which raises on any synchronising CUDA call torch makes: `.item()`, `.cpu()`, a blocking copy),
and captured in a torch.cuda.CUDAGraph it must replay, on new inputs copied into the captured
ones, what an eager call on those inputs computes.

Randomness and replays: the random draws that decide clusters and buckets happen on the device
(clustered's hash planes, LSH's rotations: torch.randn on the CUDA generator, which CUDA graphs
support: every replay draws anew from the generator's state at replay time), plus one host
number, clustered's K-Means seed (`contract.draw_seed`, torch's CPU generator), which a graph
keeps from its capture. So `torch.manual_seed(SEED)` before the capture, before the replay and
before the eager call makes the three use the same draws: the replay must then equal eager.

CUDA only (skipped without a GPU): the CPU proxy, torch.compile(fullgraph=True) of the encoder
with every attention, is tests/asr/test_encoder_compile.py and tests/attention_ext/test_compile.py.
"""
from __future__ import annotations

import pytest
import torch

import attention_ext
from attention_ext import available_attentions, build_attention
from kernel_devices import requires_cuda

pytestmark = requires_cuda

# Options that really approximate on 40 positions: 3 clusters of 8-bit codes, 4 top keys,
# chunks of 8 in 2 LSH rounds, 2 agglomerative classes.
OPTIONS = {"clustered": dict(clusters=3, bits=8, iterations=3),
           "iclustered": dict(clusters=3, bits=8, iterations=3, topk=4),
           "lsh": dict(rounds=2, chunk_size=8), "oracle_top": dict(topk=4),
           "agglomerative": dict(classes=2)}
ATTENTIONS = sorted(available_attentions())
SEED = 11


@pytest.fixture
def no_value_checks():
    """The setting a GPU training loop runs with: no value check reads a tensor on the host."""
    previous = attention_ext.set_input_validation(False)
    yield
    attention_ext.set_input_validation(previous)


def cuda_inputs(name: str, seed: int) -> dict[str, torch.Tensor]:
    """Leaf q, (k,) v with gradients, lengths with padding, and an output gradient, on CUDA."""
    generator = torch.Generator().manual_seed(seed)
    q, k, v, grad = (torch.randn(2, 2, 40, 16, generator=generator) for _ in range(4))
    tensors = {"q": q, "v": v, "grad": grad, "lengths": torch.tensor([40, 23])}
    if not available_attentions()[name].needs_shared_qk:
        tensors["k"] = k
    tensors = {key: value.cuda() for key, value in tensors.items()}
    for key in ("q", "k", "v"):
        if key in tensors:
            tensors[key].requires_grad_(True)
    return tensors


def forward_backward(attention, tensors: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    """[output, gradient of q, (of k,) of v]; k is q itself for a shared-QK attention."""
    leaves = [tensors[key] for key in ("q", "k", "v") if key in tensors]
    k = tensors.get("k", tensors["q"])
    out = attention(tensors["q"], k, tensors["v"], tensors["lengths"])
    return [out, *torch.autograd.grad(out, leaves, tensors["grad"])]


def warm_up(attention, tensors: dict[str, torch.Tensor]) -> None:
    """Three calls on a side stream, as torch.cuda.graphs' documentation asks before a capture."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            forward_backward(attention, tensors)
    torch.cuda.current_stream().wait_stream(side)


@pytest.mark.parametrize("name", ATTENTIONS)
def test_forward_and_backward_never_synchronise(name, no_value_checks):
    attention = build_attention(name, **OPTIONS.get(name, {}))
    tensors = cuda_inputs(name, seed=0)
    forward_backward(attention, tensors)   # first calls may set up libraries (cuBLAS handles)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        results = forward_backward(attention, tensors)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert all(torch.isfinite(result).all() for result in results)


@pytest.mark.parametrize("name", ATTENTIONS)
def test_captured_forward_and_backward_replay_as_eager(name, no_value_checks):
    attention = build_attention(name, **OPTIONS.get(name, {}))
    static = cuda_inputs(name, seed=0)
    warm_up(attention, static)

    graph = torch.cuda.CUDAGraph()
    torch.manual_seed(SEED)
    with torch.cuda.graph(graph):
        captured = forward_backward(attention, static)

    new = cuda_inputs(name, seed=1)
    with torch.no_grad():
        for key, tensor in new.items():
            static[key].copy_(tensor)
    torch.manual_seed(SEED)
    graph.replay()
    torch.manual_seed(SEED)
    expected = forward_backward(attention, new)
    torch.cuda.synchronize()
    for index, (got, want) in enumerate(zip(captured, expected)):
        torch.testing.assert_close(got, want, msg=f"{name}: result {index} (0 = output, then gradients)")
    # the replay computed the new inputs, not the captured ones again
    assert not torch.allclose(captured[0], forward_backward(attention, cuda_inputs(name, seed=0))[0])


@pytest.mark.parametrize("name", ["full", "lsh"])
def test_value_checks_are_skipped_while_a_graph_is_captured(name):
    """With value checks on (the default), a capture still succeeds: neither check_inputs (the
    lengths) nor LSH's CUDA kernels (their flag) read on the host while the stream captures (it
    would invalidate the capture)."""
    attention = build_attention(name, **OPTIONS.get(name, {}))
    tensors = cuda_inputs(name, seed=0)
    warm_up(attention, tensors)
    assert attention_ext.input_validation_enabled()
    graph = torch.cuda.CUDAGraph()
    torch.manual_seed(SEED)
    with torch.cuda.graph(graph):
        captured = forward_backward(attention, tensors)
    torch.manual_seed(SEED)
    graph.replay()
    torch.manual_seed(SEED)
    expected = forward_backward(attention, tensors)
    torch.cuda.synchronize()
    torch.testing.assert_close(captured[0], expected[0])


def test_lsh_kernels_refuse_bad_lengths_with_checks_on_and_do_nothing_with_them_off():
    """LSH's CUDA kernels check lengths and order on the device; the flag is read on the host only
    with value checks on. Off, a bad order makes them return zeros, never read out of bounds."""
    from attention_ext.attentions.lsh import lsh_chunked_attention
    q = torch.randn(1, 1, 4, 3, device="cuda")
    order = torch.tensor([0, 1, 1, 3], device="cuda").view(1, 1, 1, 4)   # 1 twice, 2 missing
    lengths = torch.tensor([4], device="cuda")
    with pytest.raises(RuntimeError, match="permutation of the valid positions"):
        lsh_chunked_attention(q, q, order, lengths, 2)
    previous = attention_ext.set_input_validation(False)
    try:
        out = lsh_chunked_attention(q, q, order, lengths, 2)
    finally:
        attention_ext.set_input_validation(previous)
    assert torch.equal(out, torch.zeros_like(out))
