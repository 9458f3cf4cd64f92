"""The fused top-key operators of improved clustered attention on the CPU
(csrc/clustered_top_attention.cpp) against the formula of eq. 15-17 written densely here, thread
counts, gradchecks of `ClusteredTopAttention` and of the whole CPU route (`ImprovedClusteredCPU`),
and the whole CPU attention against the unfused route (sparse dot, softmax, mass, sparse weighted
sum, V^b) built from the other ops."""
import math

import pytest
import torch

from attention_ext import build_attention
from attention_ext._ops import ops
from attention_ext.attentions.clustered import ClusterBroadcast, ClusterMean, cluster_queries, group_queries
from attention_ext.attentions.iclustered import (CentroidTopSplit, ClusteredSparseDot, ClusteredSparseWeightedSum,
                                      ClusteredTopAttention, ImprovedClusteredCPU)


def dense_top_attention(q, k, v, topk, assignment, mass, rest, scale):
    """(out, weights): query i of cluster j = assignment[i] gets
    mass_j * softmax_s(scale <q_i, k_{T_j[s]}>) V_{T_j} + rest_j, by indexing every query's
    keys and values; slots of -1 hold no key, a query without any key gets rest_j, a query in
    no cluster 0. Differentiable in q, k, v, mass and rest."""
    batch, heads, length, _ = q.shape
    b = torch.arange(batch)[:, None, None, None]
    h = torch.arange(heads)[None, :, None, None]
    cluster = assignment.clamp(min=0)                                        # (B, H, N)
    keys = topk[b[..., 0], h[..., 0], cluster]                               # (B, H, N, S)
    present = keys >= 0
    scores = scale * (q[..., None, :] * k[b, h, keys.clamp(min=0)]).sum(-1)  # (B, H, N, S)
    scores = scores.masked_fill(~present, float("-inf"))
    scores = scores.masked_fill(~present.any(-1, keepdim=True), 0.0)         # rows without keys: finite
    weights = torch.softmax(scores, -1) * present
    top = (weights[..., None] * v[b, h, keys.clamp(min=0)]).sum(-2)          # (B, H, N, D)
    out = mass[b[..., 0], h[..., 0], cluster][..., None] * top + rest[b[..., 0], h[..., 0], cluster]
    in_cluster = (assignment >= 0)[..., None]
    return out * in_cluster, weights * in_cluster


def sparse_case(dtype=torch.float64, seed=0, dim=5, value_dim=7, slots=5):
    """Batch 2 of lengths 13 and 8 (padded queries), 2 heads, 4 clusters of which the last is
    empty, slots of -1, one cluster whose slots are all -1."""
    generator = torch.Generator().manual_seed(seed)
    batch, heads, length, clusters = 2, 2, 13, 4
    lengths = torch.tensor([13, 8])
    assignment = torch.randint(0, clusters - 1, (batch, heads, length), generator=generator)
    assignment[1, :, 8:] = -1
    assignment[0, 0, :3] = 0                                      # cluster 0 of (0, 0) has members
    topk = torch.stack([torch.randperm(13, generator=generator)[:slots]
                        for _ in range(batch * heads * clusters)]).view(batch, heads, clusters, slots)
    topk[1] = torch.randperm(8, generator=generator)[:slots]      # keys of the short sequence only
    topk[1, :, :, 3:] = -1                                        # slots without a key
    topk[0, 1, 2, 1] = -1                                         # a hole between keys
    topk[0, 0, 0] = -1                                            # a cluster with members but no key
    clusters_ = group_queries(assignment, clusters)
    q, k = (torch.randn(batch, heads, length, dim, dtype=dtype, generator=generator) for _ in range(2))
    v = torch.randn(batch, heads, length, value_dim, dtype=dtype, generator=generator)
    mass = torch.rand(batch, heads, clusters, dtype=dtype, generator=generator)
    rest = torch.randn(batch, heads, clusters, value_dim, dtype=dtype, generator=generator)
    grad = torch.randn(batch, heads, length, value_dim, dtype=dtype, generator=generator)
    assert lengths.tolist() == [13, 8] and int(clusters_.counts[..., -1].sum()) == 0
    return q, k, v, topk, clusters_, mass, rest, grad


# Rows whose width is a multiple of a vector (16 float32, 8 float64 elements) are written with
# streaming stores, other widths with plain ones: both kinds for both dtypes.
@pytest.mark.parametrize("dtype, dims", [(torch.float64, (5, 7, 5)), (torch.float32, (5, 7, 5)),
                                         (torch.float64, (8, 16, 8)), (torch.float32, (16, 32, 5))])
def test_operators_match_the_dense_formula_with_gradients(dtype, dims):
    q, k, v, topk, clusters, mass, rest, grad = sparse_case(dtype, 0, *dims)
    scale = 0.7
    out, weights = ops.clustered_top_attention(q, k, v, topk, clusters.offsets, clusters.members, mass, rest, scale)
    leaves = [x.double().requires_grad_() for x in (q, k, v, mass, rest)]
    expected, expected_weights = dense_top_attention(*leaves[:3], topk, clusters.assignment, *leaves[3:], scale)
    tolerance = dict(atol=1e-12, rtol=1e-10) if dtype == torch.float64 else dict(atol=2e-6, rtol=2e-5)
    torch.testing.assert_close(out.double(), expected, **tolerance)
    torch.testing.assert_close(weights.double(), expected_weights, **tolerance)
    assert torch.all(out[1, :, 8:] == 0) and torch.all(weights[1, :, 8:] == 0)        # padded queries
    no_key = clusters.assignment[0, 0] == 0
    assert torch.all(weights[0, 0][no_key] == 0)
    assert torch.equal(out[0, 0][no_key], rest[0, 0, 0].expand(int(no_key.sum()), rest.shape[-1]))

    grads = ops.clustered_top_attention_backward(grad, q, k, v, topk, clusters.offsets, clusters.members, mass,
                                                 weights, scale)
    expected_grads = torch.autograd.grad(expected, leaves, grad.double())
    for name, got, want in zip(["q", "k", "v", "mass", "rest"], grads, expected_grads):
        torch.testing.assert_close(got.double(), want, **tolerance, msg=lambda m: f"grad_{name}: {m}")
    assert torch.all(grads[3][..., -1] == 0) and torch.all(grads[4][..., -1, :] == 0)  # the empty cluster


def test_function_gradcheck():
    q, k, v, topk, clusters, mass, rest, _ = sparse_case(seed=1)
    inputs = [x.requires_grad_() for x in (q, k, v, mass, rest)]
    # fast mode (random projections of the Jacobian): the full check takes about 2000 calls here,
    # and the test above already compares every gradient with the dense formula's
    assert torch.autograd.gradcheck(
        lambda *x: ClusteredTopAttention.apply(*x, topk, clusters, 0.6), inputs, fast_mode=True)


def test_cpu_route_gradcheck():
    """The one autograd node of the CPU route, whose backward adds the centroid pass's key and value
    gradients and the centroid mean's query gradient into the top-key part's (padded queries and
    keys, an empty cluster, slots of -1 where a cluster has fewer valid keys than slots)."""
    q, k, v, _, clusters, _, _, _ = sparse_case(seed=1)
    inputs = [x.requires_grad_() for x in (q, k, v)]
    lengths = torch.tensor([13, 8])
    # fast mode (random projections of the Jacobian): the full check takes about 1000 calls here,
    # and the test above compares every gradient of the top-key part with the dense formula's
    assert torch.autograd.gradcheck(
        lambda *x: ImprovedClusteredCPU.apply(*x, lengths, clusters, 0.6, 10), inputs, fast_mode=True)


# (1, 1): fewer (batch, head)s than threads, the key gradients kept per cluster and added after;
# (2, 3): whole heads per task.
@pytest.mark.parametrize("batch,heads", [(1, 1), (2, 3)])
def test_results_do_not_depend_on_the_thread_count(threads, batch, heads):
    generator = torch.Generator().manual_seed(4)
    length, slots, clusters = 700, 16, 20
    q, k, v, grad = (torch.randn(batch, heads, length, 32, generator=generator) for _ in range(4))
    lengths = torch.tensor([length, length - 250][:batch])
    torch.manual_seed(2)
    grouping = cluster_queries(q, lengths, clusters, bits=31, iterations=5)
    scores = torch.randn(batch, heads, clusters, length, generator=generator)
    topk = ops.cluster_topk(scores, lengths, slots)
    mass = torch.rand(batch, heads, clusters, generator=generator)
    rest = torch.randn(batch, heads, clusters, 32, generator=generator)

    def run_both():
        out, weights = ops.clustered_top_attention(q, k, v, topk, grouping.offsets, grouping.members, mass, rest,
                                                   0.25)
        return (out, weights, *ops.clustered_top_attention_backward(
            grad, q, k, v, topk, grouping.offsets, grouping.members, mass, weights, 0.25))

    serial = threads(1, run_both)
    for count in (2, 3):
        for expected, actual in zip(serial, threads(count, run_both)):
            assert torch.equal(expected, actual)


def unfused_iclustered(q, k, v, lengths, clusters, bits, iterations, topk):
    """The CPU route before the fusion: CentroidTopSplit, then sparse dot, softmax, times the
    broadcast mass, sparse weighted sum, plus the broadcast V^b."""
    grouping = cluster_queries(q, lengths, clusters, bits, iterations)
    scale = 1.0 / math.sqrt(q.shape[-1])
    centroids = ClusterMean.apply(q, grouping) * scale
    bottom, mass, top = CentroidTopSplit.apply(centroids, k, v, lengths, topk)
    dots = ClusteredSparseDot.apply(q, k, top, grouping, scale)
    weights = torch.softmax(dots, dim=-1) * ClusterBroadcast.apply(mass, grouping)
    return ClusteredSparseWeightedSum.apply(weights, v, top, grouping) + ClusterBroadcast.apply(bottom, grouping)


def test_cpu_attention_equals_the_unfused_route():
    generator = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, 3, 300, 16, generator=generator).requires_grad_() for _ in range(3))
    lengths = torch.tensor([300, 170])
    options = dict(clusters=10, bits=31, iterations=5, topk=12)
    torch.manual_seed(8)
    out = build_attention("iclustered", **options)(q, k, v, lengths)
    torch.manual_seed(8)
    expected = unfused_iclustered(q, k, v, lengths, **options)
    torch.testing.assert_close(out, expected)
    assert torch.all(out[1, :, 170:] == 0)
    grad = torch.randn(out.shape, generator=generator)
    got = torch.autograd.grad(out, (q, k, v), grad)
    want = torch.autograd.grad(expected, (q, k, v), grad)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
