"""The speech encoder compiles as one graph with every attention of the registry (CPU, in CI).

torch.compile(fullgraph=True) fails on any graph break, so a pass says that no attention's forward
or backward reads a tensor's value on the host from Python (`.item()`, `.tolist()`, a branch on a
tensor): the proxy, on any machine, for what tests/attention_ext/test_cuda_graphs.py checks on a
GPU. Every attention is traced with the aot_eager backend (the graphs inductor would get, without
generating code: 5-15 s per attention on two shared cores, where inductor took a minute for one);
`compile_encoder` itself (inductor, as `trainer.compile=true` runs it) is tested in
test_encoder.py, and inductor with i-clustered in tests/attention_ext/test_compile.py.
"""
import pytest
import torch

from attention_ext import available_attentions, validate_attention
from asr.model.encoder import TransformerEncoder

# Options that really approximate on 20 frames (as tests/attention_ext/test_compile.py's).
OPTIONS = {"clustered": dict(clusters=3, bits=8, iterations=3),
           "iclustered": dict(clusters=3, bits=8, iterations=3, topk=4),
           "lsh": dict(rounds=2, chunk_size=4), "oracle_top": dict(topk=4),
           "agglomerative": dict(classes=2)}


def encoder(name: str) -> TransformerEncoder:
    torch.manual_seed(0)
    return TransformerEncoder(
        12, layers=2, heads=2, head_dim=4, ff_dim=16, dropout=0.0, subsampling=1, subsampling_channels=4,
        shared_qk=available_attentions()[name].needs_shared_qk, positions="sinusoidal", norm="pre", input_norm=False,
        attention=validate_attention(name, **OPTIONS.get(name, {}))).train()


def output_and_gradients(model, features, lengths):
    """The states and every parameter's gradient, with torch seeded (the attentions' draws)."""
    model.zero_grad()
    torch.manual_seed(5)
    out, _ = model(features, lengths)
    (out * torch.linspace(-1, 1, out.shape[-1])).sum().backward()
    return out.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def assert_compiled_matches_eager(name, compile_in_place):
    eager = encoder(name)
    compiled = encoder(name)
    compile_in_place(compiled)
    features = torch.randn(3, 20, 12, generator=torch.Generator().manual_seed(1))
    lengths = torch.tensor([20, 13, 6])     # more frames than clusters, and padding
    expected, expected_grads = output_and_gradients(eager, features, lengths)
    got, got_grads = output_and_gradients(compiled, features, lengths)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
    assert got_grads.keys() == expected_grads.keys() and expected_grads
    for parameter, grad in expected_grads.items():
        torch.testing.assert_close(got_grads[parameter], grad, rtol=1e-4, atol=1e-5, msg=parameter)
    torch._dynamo.reset()


@pytest.mark.parametrize("name", sorted(available_attentions()))
def test_encoder_traces_as_one_graph_and_matches_eager(name):
    assert_compiled_matches_eager(name, lambda model: model.compile(fullgraph=True, backend="aot_eager"))

