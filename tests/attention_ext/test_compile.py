"""torch.compile, torch.export and torch.library.opcheck with every attention (CPU).

A two-layer pre-norm encoder (projections in the layer, the attention swappable, as in
asr.model.encoder) compiled with fullgraph=True must trace without a graph break and give the
output and gradients of the eager model with the same seed; exported in eval mode it must give
the eager output; and every operator of torch.ops.attention_ext passes opcheck, which compares
its fake implementation (attention_ext/_fake_kernels.py) and its autograd with the kernel.
"""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import attention_ext
from attention_ext import available_attentions, build_attention
from attention_ext._ops import ops
from attention_ext.attentions.lsh import lsh_hash

# Options small enough that every approximation really approximates on 16 positions: 3 clusters,
# 4 top keys, chunks of 4, 2 LSH rounds, 2 agglomerative classes.
OPTIONS = {"clustered": dict(clusters=3, bits=8, iterations=3),
           "iclustered": dict(clusters=3, bits=8, iterations=3, topk=4),
           "lsh": dict(rounds=2, chunk_size=4), "oracle_top": dict(topk=4),
           "agglomerative": dict(classes=2)}
ATTENTIONS = sorted(available_attentions())


class TinyEncoder(nn.Module):
    """x + Attn(LN(x)), then x + FF(LN(x)), twice; k is q itself for a shared-QK attention."""

    def __init__(self, name: str, width: int = 16, heads: int = 2):
        super().__init__()
        self.heads = heads
        self.shared_qk = available_attentions()[name].needs_shared_qk
        self.layers = nn.ModuleList(nn.ModuleDict({
            "norm": nn.LayerNorm(width), "query": nn.Linear(width, width), "key": nn.Linear(width, width),
            "value": nn.Linear(width, width), "output": nn.Linear(width, width),
            "ff_norm": nn.LayerNorm(width),
            "ff": nn.Sequential(nn.Linear(width, 2 * width), nn.ReLU(), nn.Linear(2 * width, width)),
            "attention": build_attention(name, **OPTIONS.get(name, {})),
        }) for _ in range(2))

    def _split(self, x):
        batch, length, width = x.shape
        return x.view(batch, length, self.heads, width // self.heads).transpose(1, 2)

    def forward(self, x, lengths):
        for layer in self.layers:
            h = layer["norm"](x)
            q = self._split(layer["query"](h))
            k = q if self.shared_qk else self._split(layer["key"](h))
            attended = layer["attention"](q, k, self._split(layer["value"](h)), lengths)
            x = x + layer["output"](attended.transpose(1, 2).flatten(2))
            x = x + layer["ff"](layer["ff_norm"](x))
        return x


def encoder_and_batch(name):
    torch.manual_seed(0)
    model = TinyEncoder(name).double()
    x = torch.randn(3, 16, 16, dtype=torch.float64)
    lengths = torch.tensor([16, 11, 5])     # more valid positions than clusters, and padding
    return model, x, lengths


def run(model, x, lengths, seed, call=None):
    """Output and the gradients of every parameter and of x, with torch seeded to `seed`;
    `call` (the compiled model) runs the model if given."""
    x = x.clone().requires_grad_(True)
    model.zero_grad()
    torch.manual_seed(seed)
    out = (model if call is None else call)(x, lengths)
    (out * torch.linspace(-1, 1, out.shape[-1], dtype=out.dtype)).sum().backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return out.detach(), x.grad, grads


@pytest.mark.parametrize("name", ATTENTIONS)
def test_compiled_encoder_matches_eager_output_and_gradients(name):
    model, x, lengths = encoder_and_batch(name)
    eager = run(model, x, lengths, seed=7)
    compiled = run(model, x, lengths, seed=7, call=torch.compile(model, fullgraph=True, backend="aot_eager"))
    torch.testing.assert_close(compiled[0], eager[0])
    torch.testing.assert_close(compiled[1], eager[1])
    # every parameter but the key projections of a shared-QK model (not called) has a gradient
    assert compiled[2].keys() == eager[2].keys() and len(eager[2]) == 2 * (16 - 2 * model.shared_qk)
    for parameter in eager[2]:
        torch.testing.assert_close(compiled[2][parameter], eager[2][parameter], msg=parameter)
    torch._dynamo.reset()


def test_inductor_compiled_encoder_matches_eager():
    """The default backend (inductor) too, for the attention with the most operators (the other
    tests use aot_eager, which traces the same graphs but generates no code: seconds, not a minute)."""
    model, x, lengths = encoder_and_batch("iclustered")
    eager = run(model, x, lengths, seed=3)
    compiled = run(model, x, lengths, seed=3, call=torch.compile(model, fullgraph=True))
    torch.testing.assert_close(compiled[0], eager[0])
    torch.testing.assert_close(compiled[1], eager[1])
    torch._dynamo.reset()


@pytest.mark.parametrize("name", ATTENTIONS)
def test_exported_encoder_matches_eager_in_eval_mode(name):
    model, x, lengths = encoder_and_batch(name)
    model.eval()
    with torch.no_grad():
        program = torch.export.export(model, (x, lengths))
        torch.manual_seed(5)
        expected = model(x, lengths)
        torch.manual_seed(5)
        got = program.module()(x, lengths)
    torch.testing.assert_close(got, expected)
    # the exported graph holds the operators themselves, not a copy of their result (the attentions
    # with kernels run in a subgraph, with autocast off)
    called = {str(node.target) for graph in program.graph_module.modules() if isinstance(graph, torch.fx.GraphModule)
              for node in graph.graph.nodes if node.op == "call_function"}
    if name in ("clustered", "iclustered"):
        assert "attention_ext.cluster_queries.default" in called
    if name == "lsh":
        assert {"attention_ext.lsh_sorted_order.default", "attention_ext.lsh_attention_forward.default"} <= called


def test_the_random_draws_of_a_compiled_call_follow_torch_manual_seed():
    """Two compiled calls with the same seed agree, and with another seed they differ (so the
    draws are not baked into the graph as constants)."""
    model, x, lengths = encoder_and_batch("clustered")
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        outs = []
        for seed in (1, 1, 2):
            torch.manual_seed(seed)
            outs.append(compiled(x, lengths))
    torch.testing.assert_close(outs[0], outs[1])
    assert not torch.allclose(outs[0], outs[2])
    torch._dynamo.reset()


# ---- opcheck ---------------------------------------------------------------------------------------

def operator_samples():
    """(operator name, args, whether the float inputs require grad) for every operator."""
    torch.manual_seed(0)
    f64 = dict(dtype=torch.float64)
    batch, heads, length, dim, clusters, slots = 2, 2, 7, 4, 3, 2
    q, k, v = (torch.randn(batch, heads, length, dim, **f64) for _ in range(3))
    lengths = torch.tensor([7, 4])
    planes, plane_offsets = torch.randn(5, dim, **f64), torch.randn(5, **f64)
    codes = ops.hyperplane_hash(q, planes, plane_offsets, lengths)
    initial = ops.hamming_kmeans_init(codes, lengths, clusters, 123)
    assignment, _ = ops.hamming_kmeans(codes, lengths, initial, 2, 5)
    offsets, members = ops.group_by_cluster(assignment, clusters)
    weights = torch.softmax(torch.randn(batch, heads, clusters, length, **f64), dim=-1)
    topk = ops.cluster_topk(weights, lengths, slots)
    scores = torch.randn(batch, heads, length, slots, **f64)
    centroid_rows = torch.randn(batch, heads, clusters, dim, **f64)
    order = lsh_hash(q, lengths, rounds=2, chunk_size=2, seed=5).order
    out, lse = ops.lsh_attention_forward(q, v, order, lengths, 2)
    centroid_values, logsumexp = ops.centroid_attention(centroid_rows, k, v, lengths)
    rest, mass, top, top_logsumexp = ops.centroid_attention_top(centroid_rows, k, v, lengths, slots)
    _, top_weights = ops.clustered_top_attention(q, k, v, topk, offsets, members, mass, rest, 0.5)
    zeros = torch.zeros_like(q)   # equal codes and buckets whatever the random draws: a deterministic result
    return [
        ("hyperplane_hash", (q, planes, plane_offsets, lengths)),
        ("hamming_kmeans_init", (codes, lengths, clusters, 123)),
        ("hamming_kmeans", (codes, lengths, initial, 2, 5)),
        ("group_by_cluster", (assignment, clusters)),
        ("cluster_mean", (q, offsets, members)),
        ("cluster_mean_backward", (centroid_rows, assignment, offsets)),
        ("cluster_broadcast", (centroid_rows, assignment)),
        ("cluster_broadcast_backward", (q, offsets, members)),
        ("cluster_topk", (weights, lengths, slots)),
        ("centroid_attention", (centroid_rows, k, v, lengths)),
        ("centroid_attention_backward", (torch.randn_like(centroid_values), centroid_rows, k, v, lengths,
                                         centroid_values, logsumexp)),
        ("centroid_attention_top", (centroid_rows, k, v, lengths, slots)),
        ("centroid_attention_top_backward", (torch.randn_like(rest), torch.randn_like(mass), centroid_rows, k, v,
                                             lengths, rest, mass, top, top_logsumexp, torch.randn_like(k),
                                             torch.randn_like(v))),
        ("clustered_sparse_dot", (q, k, topk, offsets, members, 0.5)),
        ("clustered_sparse_dot_backward", (scores, q, k, topk, offsets, members, 0.5)),
        ("clustered_sparse_weighted_sum", (scores, v, topk, offsets, members)),
        ("clustered_sparse_weighted_sum_backward", (q, scores, v, topk, offsets, members)),
        ("clustered_top_attention", (q, k, v, topk, offsets, members, mass, rest, 0.5)),
        ("clustered_top_attention_backward", (torch.randn_like(v), q, k, v, topk, offsets, members, mass,
                                              top_weights, 0.5)),
        ("lsh_hash", (q, torch.randn(batch, heads, dim, 2, 16, **f64), lengths, torch.tensor([2, 1]))),
        ("lsh_attention_forward", (q, v, order, lengths, 2)),
        ("lsh_attention_backward", (torch.randn_like(v), q, v, order, lengths, out, lse, 2)),
        ("cluster_queries", (zeros, lengths, clusters, 5, 2)),
        ("lsh_sorted_order", (zeros, lengths, 2, 2, 4)),
    ]


SAMPLES = operator_samples()


def test_every_operator_has_a_sample():
    # From the dispatcher: dir(ops) lists only the operators some earlier code has looked up.
    registered = {name.removeprefix("attention_ext::") for name in torch._C._dispatch_get_all_op_names()
                  if name.startswith("attention_ext::")}
    assert registered == {name for name, _ in SAMPLES}


@pytest.mark.parametrize("name, args", SAMPLES, ids=[name for name, _ in SAMPLES])
def test_opcheck(name, args):
    torch.library.opcheck(getattr(ops, name).default, args)


def test_fake_shapes_follow_symbolic_lengths():
    """A compiled attention that sees several padded lengths traces them with symbolic shapes
    (dynamic=True) and still matches eager."""
    attention = build_attention("iclustered", clusters=3, topk=4)
    compiled = torch.compile(attention, fullgraph=True, backend="aot_eager", dynamic=True)
    for length in (6, 9, 2):
        q, k, v = (torch.randn(2, 2, length, 4, dtype=torch.float64) for _ in range(3))
        lengths = torch.tensor([length, max(1, length - 3)])
        torch.manual_seed(length)
        expected = attention(q, k, v, lengths)
        torch.manual_seed(length)
        torch.testing.assert_close(compiled(q, k, v, lengths), expected)
    torch._dynamo.reset()


def test_input_validation_can_be_turned_off_and_is_on_by_default():
    attention = build_attention("full")
    q = torch.randn(1, 1, 4, 2)
    with pytest.raises(ValueError, match=r"lengths must lie in \[0, 4\]"):
        attention(q, q, q, torch.tensor([5]))
    previous = attention_ext.set_input_validation(False)
    try:
        assert previous is True
        out = attention(q, q, q, torch.tensor([5]))      # unchecked: clipped to the padded length
        torch.testing.assert_close(out, attention(q, q, q, torch.tensor([4])))
    finally:
        attention_ext.set_input_validation(True)
    assert math.isfinite(float(out.sum()))


def test_a_compiled_shared_qk_attention_refuses_separate_keys_with_its_message():
    """Not a failure to read a traced tensor's storage: the attention's own message, which
    fullgraph tracing reports inside torch's error (without fullgraph: the error itself)."""
    attention = build_attention("lsh")
    q, k = torch.randn(1, 1, 4, 2), torch.randn(1, 1, 4, 2)
    with pytest.raises(Exception, match="needs a model with shared query/key projections"):
        torch.compile(attention, fullgraph=True, backend="aot_eager")(q, k, q)
    with pytest.raises(attention_ext.SharedQKRequiredError):
        torch.compile(attention, backend="aot_eager")(q, k, q)
    torch._dynamo.reset()
