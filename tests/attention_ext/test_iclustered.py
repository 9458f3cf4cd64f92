"""Improved clustered attention against the dense equations of the paper (eq. 9-11),
Proposition 2, the per-cluster top-k and sparse products, and the contract's edge cases."""
import pytest
import torch
import torch.nn.functional as F

from attention_ext import AttentionConfigError, build_attention
from attention_ext._ops import ops
from attention_ext.attentions.clustered import ClusterBroadcast, group_queries
from attention_ext.attentions.iclustered import ClusteredSparseDot, ClusteredSparseWeightedSum, SplitTopMass

import dense_clustered_attention as dense
from module_clustering import module_and_clusters
from random_inputs import on, random_qkv


def as_mask(topk, length):
    """(B, H, C, N) bool from a list of key positions per row, where -1 is no key."""
    mask = torch.zeros(*topk.shape[:-1], length + 1, dtype=torch.bool)
    mask.scatter_(-1, torch.where(topk >= 0, topk, length), True)
    return mask[..., :length]


def dense_reference(q, k, v, lengths, clusters, topk):
    """A^c, T and the output of eq. 11, all computed densely in the test."""
    with torch.no_grad():
        attention_c = dense.centroid_attention(q, k, lengths, clusters.assignment, clusters.clusters)
    top = dense.topk_mask(attention_c, lengths, topk)
    out = dense.improved_clustered_attention(q, k, v, lengths, clusters.assignment, clusters.clusters, top)
    return out, attention_c, top


@pytest.mark.parametrize("lengths", [None, torch.tensor([26, 12, 3])])
def test_iclustered_matches_dense_equations_forward_and_gradients(lengths, device):
    q, k, v = random_qkv((3, 2, 26, 6))
    qd, kd, vd = on(device, q, k, v)
    out, clusters = module_and_clusters("iclustered", qd, kd, vd, None if lengths is None else lengths.to(device),
                                        seed=3, clusters=4, topk=5, iterations=4)
    clusters = type(clusters)(*(t.cpu() for t in clusters))
    full_lengths = lengths if lengths is not None else torch.full((3,), 26)
    expected, attention_c, top = dense_reference(q, k, v, full_lengths, clusters, topk=5)
    # the module's top-k keys are the test's (as sets; a length-3 sequence keeps its 3 keys)
    module_top = ops.cluster_topk(*on(device, attention_c, full_lengths), 5).cpu()
    assert torch.equal(as_mask(module_top, 26), top)
    torch.testing.assert_close(out.cpu(), expected)
    grad = torch.randn_like(expected)
    got = torch.autograd.grad(out, (qd, kd, vd), grad.to(device))
    want = torch.autograd.grad(expected, (q, k, v), grad)
    for g, w in zip(got, want):
        torch.testing.assert_close(g.cpu(), w)


def test_shared_queries_and_keys():
    q, _, v = random_qkv((1, 3, 20, 4), seed=2)
    lengths = torch.tensor([17])
    out, clusters = module_and_clusters("iclustered", q, q, v, lengths, seed=1, clusters=3, topk=4)
    expected, _, _ = dense_reference(q, q, v, lengths, clusters, topk=4)
    torch.testing.assert_close(out, expected)
    got = torch.autograd.grad(out.square().sum(), (q, v))
    want = torch.autograd.grad(expected.square().sum(), (q, v))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)


def test_proposition_2_improved_is_closer_to_full_attention_than_clustered():
    """||A^t_i - A_i||_1 <= ||A^c_j - A_i||_1 for every query i of cluster j (eq. 12),
    with A^t built from the module's clustering and top-k, and the module computing A^t V."""
    generator = torch.Generator().manual_seed(0)
    centres = 2.0 * torch.randn(2, 4, 8, dtype=torch.float64, generator=generator)
    labels = torch.randint(0, 4, (2, 60), generator=generator)
    q = centres[torch.arange(2)[:, None], labels] + 0.3 * torch.randn(2, 60, 8, dtype=torch.float64,
                                                                     generator=generator)
    q = q[:, None].expand(2, 2, 60, 8).contiguous()
    k = torch.randn(2, 2, 60, 8, dtype=torch.float64, generator=generator)
    v = torch.randn(2, 2, 60, 8, dtype=torch.float64, generator=generator)
    lengths = torch.tensor([60, 47])
    out, clusters = module_and_clusters("iclustered", q, k, v, lengths, seed=9, clusters=4, topk=6)
    attention_c = dense.centroid_attention(q, k, lengths, clusters.assignment, 4)
    top = as_mask(ops.cluster_topk(attention_c, lengths, 6), 60)
    improved = dense.improved_attention_matrix(q, k, lengths, clusters.assignment, 4, top)
    torch.testing.assert_close(out, improved @ v)
    full = dense.full_attention_matrix(q, k, lengths)
    membership = dense.one_hot_clusters(clusters.assignment, 4, q.dtype)
    clustered = membership @ attention_c                 # A^c_j as the row of each query
    error_improved = (improved - full).abs().sum(-1)
    error_clustered = (clustered - full).abs().sum(-1)
    assert torch.all(error_improved <= error_clustered + 1e-12)
    assert error_improved.sum() < 0.9 * error_clustered.sum()   # and strictly better overall


def test_topk_covering_every_key_is_full_attention():
    q, k, v = random_qkv((2, 3, 14, 5), dtype=torch.float32, seed=4)
    lengths = torch.tensor([14, 6])
    out = build_attention("iclustered", clusters=3, topk=14)(q, k, v, lengths)
    mask = (torch.arange(14) < lengths[:, None])[:, None, None, :]
    full = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    full = full * (torch.arange(14) < lengths[:, None])[:, None, :, None]
    torch.testing.assert_close(out, full)
    got = torch.autograd.grad(out.sum(), (q, k, v))
    want = torch.autograd.grad(full.sum(), (q, k, v))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    # topk far beyond the length is clipped to it
    torch.testing.assert_close(build_attention("iclustered", clusters=2, topk=1000)(q, k, v, lengths), full)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cluster_topk_matches_torch_topk_with_lengths_and_ties(device, dtype):
    generator = torch.Generator().manual_seed(1)
    weights = torch.rand(2, 2, 5, 12, generator=generator, dtype=dtype)
    lengths = torch.tensor([12, 4])
    top = ops.cluster_topk(*on(device, weights, lengths), 6).cpu()
    assert torch.equal(top[0], weights[0].topk(6, dim=-1).indices)
    want = weights[1, :, :, :4].topk(4, dim=-1).indices
    assert torch.equal(top[1, :, :, :4], want) and torch.all(top[1, :, :, 4:] == -1)
    ties = torch.tensor([[[[0.1, 0.5, 0.2, 0.5, 0.5, 0.2, -0.0, 0.0]]]], dtype=dtype, device=device)
    assert ops.cluster_topk(ties, torch.tensor([6], device=device), 4).tolist() == [[[[1, 3, 4, 2]]]]
    assert ops.cluster_topk(ties, torch.tensor([8], device=device), 8).tolist() == [[[[1, 3, 4, 2, 5, 0, 6, 7]]]]
    assert ops.cluster_topk(ties, torch.tensor([0], device=device), 2).tolist() == [[[[-1, -1]]]]


def test_sparse_products_gradcheck_and_values(device):
    lengths = torch.tensor([6, 3])
    generator = torch.Generator().manual_seed(2)
    assignment = torch.randint(0, 2, (2, 2, 6), generator=generator)
    assignment[1, :, 3:] = -1
    clusters = group_queries(assignment, 3)           # cluster 2 is empty
    topk = torch.stack([torch.randperm(6, generator=generator)[:4] for _ in range(12)]).view(2, 2, 3, 4)
    topk[1] = torch.tensor([2, 0, -1, -1])           # a short sequence: slots without keys
    q, k, v = (torch.randn(2, 2, 6, 3, dtype=torch.float64, generator=generator).requires_grad_()
               for _ in range(3))
    weights = torch.randn(2, 2, 6, 4, dtype=torch.float64, generator=generator, requires_grad=True)
    # the kernels run on `device`; the values are checked against sums written here, on the CPU
    clusters = type(clusters)(*(t.to(device) for t in clusters))
    q, k, v, weights, topk = on(device, q, k, v, weights, topk)
    # slots without a key give -inf, constant in q and k: gradcheck the finite part
    assert torch.autograd.gradcheck(
        lambda a, b: ClusteredSparseDot.apply(a, b, topk, clusters, 0.7).clamp(min=-1e30), (q, k))
    assert torch.autograd.gradcheck(
        lambda w, x: ClusteredSparseWeightedSum.apply(w, x, topk, clusters), (weights, v))
    assert torch.autograd.gradcheck(lambda x: ClusterBroadcast.apply(x, clusters),
                                    (torch.randn(2, 2, 3, 1, dtype=torch.float64, requires_grad=True,
                                                 device=device),))
    dots = ClusteredSparseDot.apply(q, k, topk, clusters, 0.7).cpu()
    summed = ClusteredSparseWeightedSum.apply(weights, v, topk, clusters).cpu()
    q, k, v, weights, topk = (t.detach().cpu() for t in (q, k, v, weights, topk))
    for b in range(2):
        for h in range(2):
            for i in range(6):
                j = int(assignment[b, h, i])
                if j < 0:
                    assert torch.all(dots[b, h, i] == 0) and torch.all(summed[b, h, i] == 0)
                    continue
                expected_sum = torch.zeros(3, dtype=torch.float64)
                for s, key in enumerate(topk[b, h, j].tolist()):
                    if key < 0:
                        assert dots[b, h, i, s] == float("-inf")
                        continue
                    torch.testing.assert_close(dots[b, h, i, s], 0.7 * q[b, h, i] @ k[b, h, key])
                    expected_sum += weights[b, h, i, s] * v[b, h, key]
                torch.testing.assert_close(summed[b, h, i], expected_sum)


def test_split_top_mass_gradcheck_and_values():
    generator = torch.Generator().manual_seed(3)
    attention = torch.rand(2, 1, 3, 7, dtype=torch.float64, generator=generator, requires_grad=True)
    topk = torch.tensor([[[[4, 1, 6], [0, 2, 5], [3, 6, 2]]],
                         [[[2, 0, -1], [1, 2, 0], [-1, -1, -1]]]])   # a short and an empty row
    mass, rest = SplitTopMass.apply(attention, topk)
    top = as_mask(topk, 7)
    torch.testing.assert_close(mass[..., 0], (attention * top).sum(-1))
    torch.testing.assert_close(rest, attention * ~top)
    assert torch.autograd.gradcheck(lambda a: SplitTopMass.apply(a, topk), (attention,))


def test_padding_does_not_change_a_sequence():
    sequence = random_qkv((1, 2, 40, 6), seed=4)
    padded = random_qkv((3, 2, 52, 6), seed=5)
    with torch.no_grad():
        for p, s in zip(padded, sequence):
            p[0, :, :40] = s[0]
    attention = build_attention("iclustered", clusters=5, topk=7)
    torch.manual_seed(11)
    alone = attention(*sequence, torch.tensor([40]))
    torch.manual_seed(11)
    batch = attention(*padded, torch.tensor([40, 52, 9]))
    torch.testing.assert_close(batch[0, :, :40], alone[0])
    assert torch.all(batch[0, :, 40:] == 0)


def test_seeded_calls_repeat():
    q, k, v = random_qkv((2, 2, 64, 8), dtype=torch.float32)
    attention = build_attention("iclustered", clusters=4, topk=8)
    torch.manual_seed(5)
    first = attention(q, k, v)
    torch.manual_seed(5)
    assert torch.equal(attention(q, k, v), first)


@pytest.mark.parametrize("lengths", [[1], [1, 1, 1], [0, 4], [0, 0], [6, 1]])
def test_tiny_and_empty_sequences(lengths, device):
    lengths = torch.tensor(lengths)
    q, k, v = random_qkv((len(lengths), 2, max(int(lengths.max()), 1) + 2, 3), dtype=torch.float32)
    full = (dense.full_attention_matrix(q, k, lengths) @ v).to(device)
    q, k, v = on(device, q, k, v)
    out = build_attention("iclustered", clusters=2, topk=3)(q, k, v, lengths.to(device))
    assert torch.isfinite(out).all()
    for b, valid in enumerate(lengths.tolist()):
        assert torch.all(out[b, :, valid:] == 0)
        if valid <= 2:  # every query its own cluster, and top-3 covers every key
            torch.testing.assert_close(out[b, :, :valid], full[b, :, :valid])
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


def test_batch_mixing_very_short_and_long_sequences():
    q, k, v = random_qkv((2, 1, 5000, 8), dtype=torch.float32, seed=6)
    lengths = torch.tensor([5, 5000])
    out = build_attention("iclustered")(q, k, v, lengths)
    assert torch.isfinite(out).all() and torch.all(out[0, :, 5:] == 0)
    full = dense.full_attention_matrix(q[:1, :, :5], k[:1, :, :5], lengths[:1]) @ v[:1, :, :5]
    torch.testing.assert_close(out[:1, :, :5], full)
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


@pytest.mark.parametrize("options", [dict(topk=0), dict(bits=64), dict(clusters=0), dict(rounds=2)])
def test_bad_options_are_refused_at_build_time(options):
    with pytest.raises(AttentionConfigError, match=next(iter(options))):
        build_attention("iclustered", **options)
