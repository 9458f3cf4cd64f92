"""Clustered attention: the hashing and Hamming K-Means against brute force, the module
against the dense equations of the paper (eq. 3-6), and the edge cases of the contract."""
import math

import pytest
import torch
import torch.nn.functional as F

from attention_ext import AttentionConfigError, build_attention
from attention_ext._ops import ops
from attention_ext.attentions.clustered import ClusterBroadcast, ClusterMean, cluster_queries, group_queries

import dense_clustered_attention as dense
from module_clustering import module_and_clusters
from random_inputs import on, random_qkv


def popcount(x):
    return bin(x & (2**64 - 1)).count("1")


# ---------------------------------------------------------------- hashing and K-Means

def test_hyperplane_hash_matches_projection_thresholds(device):
    torch.manual_seed(0)
    q = torch.randn(2, 3, 17, 5, dtype=torch.float64)
    lengths = torch.tensor([17, 6])
    planes, offsets = torch.randn(11, 5, dtype=torch.float64), torch.randn(11, dtype=torch.float64)
    codes = ops.hyperplane_hash(*on(device, q, planes, offsets, lengths)).cpu()
    for b, valid in enumerate(lengths.tolist()):
        projections = q[b, :, :valid] @ planes.T                        # (H, L, bits)
        mean = projections.mean(1, keepdim=True)
        std = projections.std(1, unbiased=False, keepdim=True)
        bits = projections > mean + offsets * std
        expected = (bits.long() << torch.arange(11)).sum(-1)
        assert torch.equal(codes[b, :, :valid], expected)
        assert torch.all(codes[b, :, valid:] == 0)
    # one (batch, head) alone takes the kernel's other schedule: same codes
    alone = ops.hyperplane_hash(*on(device, q[1:, 2:], planes, offsets, lengths[1:])).cpu()
    assert torch.equal(alone[0, 0], codes[1, 2])


def brute_force_lloyd(codes, centroids, iterations, bits):
    """One (batch, head): `iterations` of (nearest centroid, majority vote with ties
    keeping the old bit, empty clusters keeping their code), then a final assignment."""
    centroids = list(centroids)

    def assign():
        return [min(range(len(centroids)), key=lambda c: (popcount(x ^ centroids[c]), c))
                for x in codes]

    for _ in range(iterations):
        assignment = assign()
        for c in range(len(centroids)):
            members = [x for x, a in zip(codes, assignment) if a == c]
            if not members:
                continue
            fresh = 0
            for bit in range(bits):
                ones = sum((x >> bit) & 1 for x in members)
                if 2 * ones > len(members) or (2 * ones == len(members) and (centroids[c] >> bit) & 1):
                    fresh |= 1 << bit
            centroids[c] = fresh
    return assign(), centroids


@pytest.mark.parametrize("iterations", [0, 1, 3, 12])  # 12: heads settle before the last step
def test_lloyd_steps_match_brute_force(iterations, device):
    generator = torch.Generator().manual_seed(iterations)
    bits, clusters = 6, 5
    codes = torch.randint(0, 2**bits, (2, 2, 30), generator=generator)
    lengths = torch.tensor([30, 13])
    centroids = torch.randint(0, 2**bits, (2, 2, clusters), generator=generator)
    centroids[0, 0, 4] = centroids[0, 0, 1]   # a duplicate centroid loses every tie
    assignment, final = (t.cpu() for t in ops.hamming_kmeans(*on(device, codes, lengths, centroids),
                                                                 iterations, bits))
    for b in range(2):
        valid = int(lengths[b])
        for h in range(2):
            want_assignment, want_centroids = brute_force_lloyd(
                codes[b, h, :valid].tolist(), centroids[b, h].tolist(), iterations, bits)
            assert assignment[b, h, :valid].tolist() == want_assignment
            assert final[b, h].tolist() == want_centroids
            assert torch.all(assignment[b, h, valid:] == -1)
            # one (batch, head) alone takes the kernel's other schedule (steps shared out
            # over positions instead of heads over threads): same result
            alone, alone_final = (t.cpu() for t in ops.hamming_kmeans(
                *on(device, codes[b:b + 1, h:h + 1], lengths[b:b + 1], centroids[b:b + 1, h:h + 1]),
                iterations, bits))
            assert alone[0, 0, :valid].tolist() == want_assignment
            assert alone_final[0, 0].tolist() == want_centroids
    if iterations == 0:
        assert not torch.any(assignment[0, 0] == 4)


def test_kmeans_recovers_groups_around_known_centres(device):
    generator = torch.Generator().manual_seed(3)
    centres = [0, 2**63 - 1, 0x5555555555555555, 0x0F0F0F0F0F0F0F0F]
    codes, group = [], []
    for g, centre in enumerate(centres):
        for _ in range(25):  # flip 3 of the 63 bits
            flips = torch.randperm(63, generator=generator)[:3].tolist()
            codes.append(centre ^ sum(1 << f for f in flips))
            group.append(g)
    order = torch.randperm(len(codes), generator=generator).tolist()
    codes_t = torch.tensor([[[codes[i] for i in order]]])
    group = [group[i] for i in order]
    start = [codes[25 * g] for g in range(4)]          # one member of each group
    assignment, final = (t.cpu() for t in ops.hamming_kmeans(
        *on(device, codes_t, torch.tensor([100]), torch.tensor([[start]])), 2, 63))
    assert assignment[0, 0].tolist() == group
    assert final[0, 0].tolist() == centres               # majority vote undoes the flips
    # and the final assignment is the nearest centroid by popcount
    for x, a in zip(codes_t[0, 0].tolist(), assignment[0, 0].tolist()):
        assert popcount(x ^ final[0, 0, a].item()) == min(popcount(x ^ c) for c in centres)


def test_initial_centroids_are_distinct_codes_of_valid_queries(device):
    codes = torch.tensor([[[5, 5, 5, 9, 9, 7, 7, 1, 2, 3],
                           [4, 4, 4, 4, 4, 4, 4, 4, 4, 4]]], device=device)
    lengths = torch.tensor([7], device=device)
    centroids = ops.hamming_kmeans_init(codes, lengths, 3, 123)
    assert sorted(centroids[0, 0].tolist()) == [5, 7, 9]   # positions 7.. are padding
    # fewer distinct codes than clusters: the spare slots repeat centroid 0 and stay empty
    assert centroids[0, 1].tolist() == [4, 4, 4]
    assignment, _ = ops.hamming_kmeans(codes, lengths, centroids, 3, 63)
    assert torch.all(assignment[0, 1, :7] == 0)
    assert torch.equal(ops.hamming_kmeans_init(codes, lengths, 3, 123), centroids)


def test_short_sequences_put_every_query_in_its_own_cluster(device):
    q = torch.randn(2, 2, 9, 4, device=device)
    clusters = cluster_queries(q, torch.tensor([9, 4], device=device), clusters=9, bits=63, iterations=10)
    assert clusters.assignment[0].tolist() == [list(range(9))] * 2
    assert clusters.assignment[1].tolist() == [list(range(4)) + [-1] * 5] * 2
    assert clusters.counts[1].tolist() == [[1] * 4 + [0] * 5] * 2


def test_cluster_queries_groups_nearby_queries(device):
    """Queries drawn tightly around 3 distant centres land in 3 pure clusters."""
    torch.manual_seed(4)
    centres = torch.randn(3, 16) * 5
    labels = torch.randint(0, 3, (200,))
    q = (centres[labels] + 0.01 * torch.randn(200, 16)).view(1, 1, 200, 16)
    clusters = cluster_queries(*on(device, q, torch.tensor([200])), clusters=3, bits=63, iterations=10)
    clusters = type(clusters)(*(t.cpu() for t in clusters))
    assignment = clusters.assignment[0, 0]
    for c in range(3):
        assert labels[assignment == c].unique().numel() <= 1
    assert clusters.counts.sum() == 200 and clusters.offsets[0, 0, -1] == 200


# ---------------------------------------------------------------- autograd functions

def random_clusters(batch, heads, length, clusters, lengths, seed):
    generator = torch.Generator().manual_seed(seed)
    assignment = torch.randint(0, clusters - 1, (batch, heads, length), generator=generator)
    assignment[(torch.arange(length) >= lengths[:, None])[:, None, :].expand_as(assignment)] = -1
    return group_queries(assignment, clusters)   # cluster `clusters - 1` is always empty


def test_cluster_mean_and_broadcast_gradcheck(device):
    lengths = torch.tensor([7, 3])
    clusters = random_clusters(2, 2, 7, 4, lengths, seed=5)
    clusters = type(clusters)(*(t.to(device) for t in clusters))
    x = torch.randn(2, 2, 7, 3, dtype=torch.float64, requires_grad=True, device=device)
    rows = torch.randn(2, 2, 4, 3, dtype=torch.float64, requires_grad=True, device=device)
    assert torch.autograd.gradcheck(lambda t: ClusterMean.apply(t, clusters), (x,))
    assert torch.autograd.gradcheck(lambda t: ClusterBroadcast.apply(t, clusters), (rows,))
    membership = dense.one_hot_clusters(clusters.assignment, 4, torch.float64)
    torch.testing.assert_close(ClusterMean.apply(x, clusters), dense.centroids(x, membership))
    torch.testing.assert_close(ClusterBroadcast.apply(rows, clusters), membership @ rows)
    # group_by_cluster itself: members in increasing position, offsets from the counts
    assignment = clusters.assignment.cpu()
    offsets, members = clusters.offsets.cpu(), clusters.members.cpu()
    for b in range(2):
        for h in range(2):
            for c in range(4):
                want = (assignment[b, h] == c).nonzero().flatten().tolist()
                assert members[b, h, offsets[b, h, c]:offsets[b, h, c + 1]].tolist() == want
            assert torch.all(members[b, h, offsets[b, h, -1]:] == -1)


# ---------------------------------------------------------------- the attention

@pytest.mark.parametrize("lengths", [None, torch.tensor([23, 11, 1])])
def test_clustered_matches_dense_equations_forward_and_gradients(lengths, device):
    q, k, v = random_qkv((3, 2, 23, 6))
    qd, kd, vd = on(device, q, k, v)
    out, clusters = module_and_clusters("clustered", qd, kd, vd, None if lengths is None else lengths.to(device),
                                        seed=7, clusters=4, iterations=5)
    clusters = type(clusters)(*(t.cpu() for t in clusters))
    full_lengths = lengths if lengths is not None else torch.full((3,), 23)
    expected = dense.clustered_attention(q, k, v, full_lengths, clusters.assignment, clusters.clusters)
    torch.testing.assert_close(out.cpu(), expected)
    assert clusters.counts[0].gt(1).any()                  # some cluster really shares a centroid
    grad = torch.randn_like(expected)
    got = torch.autograd.grad(out, (qd, kd, vd), grad.to(device))
    want = torch.autograd.grad(expected, (q, k, v), grad)
    for g, w in zip(got, want):
        torch.testing.assert_close(g.cpu(), w)


def test_shared_queries_and_keys():
    q, _, v = random_qkv((2, 2, 15, 4), seed=1)
    out, clusters = module_and_clusters("clustered", q, q, v, torch.tensor([15, 9]), seed=2, clusters=3)
    expected = dense.clustered_attention(q, q, v, torch.tensor([15, 9]), clusters.assignment, 3)
    torch.testing.assert_close(out, expected)
    got = torch.autograd.grad(out.square().sum(), (q, v))
    want = torch.autograd.grad(expected.square().sum(), (q, v))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)


def test_as_many_clusters_as_queries_is_full_attention():
    q, k, v = random_qkv((2, 3, 12, 5), dtype=torch.float32, seed=3)
    lengths = torch.tensor([12, 5])
    out = build_attention("clustered", clusters=12)(q, k, v, lengths)
    mask = (torch.arange(12) < lengths[:, None])[:, None, None, :]
    full = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    full = full * (torch.arange(12) < lengths[:, None])[:, None, :, None]
    torch.testing.assert_close(out, full)
    got = torch.autograd.grad(out.sum(), (q, k, v))
    want = torch.autograd.grad(full.sum(), (q, k, v))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    # a batch where only the long sequence exceeds the clusters: the short one is exact
    out = build_attention("clustered", clusters=6)(q, k, v, lengths)
    torch.testing.assert_close(out[1], full[1])


def test_padding_does_not_change_a_sequence(device):
    sequence = random_qkv((1, 2, 40, 6), seed=4)
    padded = random_qkv((3, 2, 55, 6), seed=5)
    with torch.no_grad():
        for p, s in zip(padded, sequence):
            p[0, :, :40] = s[0]
    attention = build_attention("clustered", clusters=5)
    torch.manual_seed(11)
    alone = attention(*on(device, *sequence), torch.tensor([40], device=device))
    torch.manual_seed(11)
    batch = attention(*on(device, *padded), torch.tensor([40, 55, 9], device=device))
    torch.testing.assert_close(batch[0, :, :40], alone[0])
    assert torch.all(batch[0, :, 40:] == 0)


def test_seeded_calls_repeat(device):
    q, k, v = on(device, *random_qkv((2, 2, 64, 8), dtype=torch.float32))
    attention = build_attention("clustered", clusters=4)
    torch.manual_seed(5)
    first = attention(q, k, v)
    torch.manual_seed(5)
    assert torch.equal(attention(q, k, v), first)
    torch.manual_seed(6)
    assert not torch.equal(attention(q, k, v), first)


@pytest.mark.parametrize("lengths", [[1], [1, 1, 1], [0, 4], [0, 0], [5, 1]])
def test_tiny_and_empty_sequences(lengths, device):
    lengths = torch.tensor(lengths)
    q, k, v = random_qkv((len(lengths), 2, max(int(lengths.max()), 1) + 2, 3), dtype=torch.float32)
    expected = dense.clustered_attention(q, k, v, lengths, *_identity_if_short(lengths, q.shape[2]))
    q, k, v = on(device, q, k, v)
    out = build_attention("clustered", clusters=2)(q, k, v, lengths.to(device))
    expected = expected.to(device)
    assert torch.isfinite(out).all()
    for b, valid in enumerate(lengths.tolist()):
        assert torch.all(out[b, :, valid:] == 0)
        if valid <= 2:  # each query its own cluster: full attention
            torch.testing.assert_close(out[b, :, :valid], expected[b, :, :valid])
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


def _identity_if_short(lengths, length):
    positions = torch.arange(length).expand(len(lengths), 1, length)
    assignment = torch.where(positions < lengths[:, None, None], positions, -1)
    return assignment, length


def test_batch_mixing_very_short_and_long_sequences():
    q, k, v = random_qkv((2, 1, 5000, 8), dtype=torch.float32, seed=6)
    lengths = torch.tensor([5, 5000])
    out = build_attention("clustered")(q, k, v, lengths)
    assert torch.isfinite(out).all() and torch.all(out[0, :, 5:] == 0)
    expected = dense.clustered_attention(q[:1, :, :5], k[:1, :, :5], v[:1, :, :5], lengths[:1],
                                         torch.arange(5).view(1, 1, 5), 5)
    torch.testing.assert_close(out[:1, :, :5], expected)   # 5 <= 100 clusters: exact
    out.sum().backward()
    assert torch.isfinite(q.grad).all() and torch.isfinite(k.grad).all()


def test_no_lengths_means_full_length():
    q, k, v = random_qkv((2, 2, 30, 4), seed=8)
    attention = build_attention("clustered", clusters=3)
    torch.manual_seed(1)
    without = attention(q, k, v)
    torch.manual_seed(1)
    with_lengths = attention(q, k, v, torch.tensor([30, 30]))
    torch.testing.assert_close(without, with_lengths)


@pytest.mark.parametrize("options", [dict(bits=0), dict(bits=64), dict(clusters=0),
                                     dict(iterations=-1), dict(topk=3)])
def test_bad_options_are_refused_at_build_time(options):
    with pytest.raises(AttentionConfigError, match=next(iter(options))):
        build_attention("clustered", **options)


def test_float32_and_float64_agree():
    q, k, v = random_qkv((1, 2, 50, 8), seed=9)
    attention = build_attention("clustered", clusters=50)   # exact: no hashing sign flips
    torch.testing.assert_close(attention(q.float(), k.float(), v.float()),
                               attention(q, k, v).float(), atol=1e-5, rtol=1e-4)
    assert math.isfinite(attention(q, k, v).sum().item())


@pytest.mark.parametrize("name", ["clustered", "iclustered"])
def test_empty_strided_and_half_precision_inputs(name):
    attention = build_attention(name, clusters=3)
    for shape in [(2, 2, 0, 4), (0, 2, 5, 4)]:
        q, k, v = random_qkv(shape, dtype=torch.float32)
        out = attention(q, k, v)
        out.sum().backward()
        assert out.shape == shape and q.grad.shape == shape
    # a (B, N, H, E) projection viewed as (B, H, N, E) is not contiguous
    q, k, v = (t.detach().transpose(1, 2) for t in random_qkv((2, 9, 3, 4), dtype=torch.float32))
    torch.manual_seed(0)
    strided = attention(q, k, v, torch.tensor([9, 6]))
    torch.manual_seed(0)
    dense_copy = attention(q.contiguous(), k.contiguous(), v.contiguous(), torch.tensor([9, 6]))
    assert torch.equal(strided, dense_copy)
    # bfloat16 is computed in float32 and returned as bfloat16
    torch.manual_seed(0)
    low = attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), torch.tensor([9, 6]))
    torch.manual_seed(0)
    high = attention(q.bfloat16().float(), k.bfloat16().float(), v.bfloat16().float(), torch.tensor([9, 6]))
    assert low.dtype == torch.bfloat16 and torch.equal(low, high.bfloat16())
