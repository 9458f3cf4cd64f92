"""Every attention under autocast (CPU bfloat16 always; CUDA float16 and bfloat16 when there
is a GPU), and every compiled operator on CUDA against the same operator on the CPU.

The CPU kernels are the reference of the CUDA ones (themselves tested against brute force in
test_clustered.py, test_iclustered.py and test_lsh.py, which also run on CUDA when present).
Half-precision CUDA inputs are compared with the CPU operator on the same values in float32.
"""
import math

import pytest
import torch

from attention_ext import available_attentions, build_attention
from attention_ext._ops import ops
from attention_ext.attentions.clustered import cluster_queries, group_queries
from attention_ext.attentions.lsh import lsh_hash

from kernel_devices import requires_cuda

SHARED_QK = {name for name, entry in available_attentions().items() if entry.needs_shared_qk}
# Options under which every attention is exact (full or shared-full attention), so that a
# half-precision run can be compared with a float32 run whatever the rounding did to hashes.
EXACT_OPTIONS = {"clustered": dict(clusters=24), "iclustered": dict(clusters=3, topk=24),
                 "lsh": dict(rounds=2, chunk_size=24), "oracle_top": dict(topk=24)}


def projected_inputs(device, seed=0, length=24, dim=8):
    """x (B, N, D) and q, k, v projections, as an encoder layer makes them."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(2, length, 16, generator=generator).to(device)
    projections = torch.nn.ModuleList(torch.nn.Linear(16, 2 * dim) for _ in range(3)).to(device)
    return x, projections


def used_parameters(name, projections):
    """The projections' parameters an attention's output depends on (k's not for shared QK)."""
    used = [projections[0], projections[2]] if name in SHARED_QK else list(projections)
    return [p for module in used for p in module.parameters()]


def attend(name, options, x, projections, lengths, seed=0):
    def heads(t):
        return t.view(t.shape[0], t.shape[1], 2, -1).transpose(1, 2)
    q = heads(projections[0](x))
    k = q if name in SHARED_QK else heads(projections[1](x))
    v = heads(projections[2](x))
    torch.manual_seed(seed)
    return build_attention(name, **options)(q, k, v, lengths)


@pytest.mark.parametrize("name", sorted(available_attentions()))
def test_every_attention_runs_under_cpu_autocast_bfloat16(name):
    x, projections = projected_inputs("cpu")
    lengths = torch.tensor([24, 17])
    options = EXACT_OPTIONS.get(name, {})
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = attend(name, options, x, projections, lengths)
        loss = out.float().square().sum()
    loss.backward()
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    assert all(torch.isfinite(p.grad).all() for p in used_parameters(name, projections))
    reference = attend(name, options, x, projections, lengths)
    torch.testing.assert_close(out.float(), reference, atol=6e-2, rtol=6e-2)
    assert torch.all(out[1, :, 17:] == 0)


@pytest.mark.parametrize("name", ["clustered", "iclustered", "lsh"])
def test_float32_inputs_under_autocast_compute_in_float32(name):
    """Autocast is off inside the attentions with kernels: float32 inputs give exactly the
    float32 result (with real hashing and clustering: 4 clusters, 2 chunks)."""
    generator = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 2, 40, 8, generator=generator) for _ in range(3))
    k = q if name == "lsh" else k
    options = {"lsh": dict(chunk_size=8)}.get(name, dict(clusters=4))
    attention = build_attention(name, **options)
    torch.manual_seed(3)
    plain = attention(q, k, v)
    torch.manual_seed(3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        autocast = attention(q, k, v)
    assert autocast.dtype == torch.float32 and torch.equal(autocast, plain)


# ------------------------------------------------------------------ CUDA against CPU

HALF_TYPES = [torch.float16, torch.bfloat16]


def tolerance(dtype):
    return dict(atol=2e-2, rtol=2e-2) if dtype in HALF_TYPES else {}


def on_cpu_in_float(t):
    """The same values on the CPU, half types widened to float32 (the CPU kernels' dtype)."""
    t = t.detach().cpu()
    return t.float() if t.dtype in HALF_TYPES else t


def assert_matches_cpu(cuda_result, cpu_result, dtype):
    assert cuda_result.device.type == "cuda"
    if not cuda_result.is_floating_point():
        assert torch.equal(cuda_result.cpu(), cpu_result)
        return
    assert cuda_result.dtype == dtype
    torch.testing.assert_close(cuda_result.cpu().to(cpu_result.dtype), cpu_result, **tolerance(dtype))


def random_clustering(generator, batch, heads, length, clusters, lengths):
    assignment = torch.randint(0, clusters - 1, (batch, heads, length), generator=generator)
    assignment[(torch.arange(length) >= lengths[:, None])[:, None, :].expand_as(assignment)] = -1
    return group_queries(assignment, clusters)  # the last cluster stays empty


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32] + HALF_TYPES)
def test_cluster_ops_and_sparse_products_match_cpu(dtype):
    generator = torch.Generator().manual_seed(0)
    batch, heads, length, dim, clusters, slots = 2, 3, 150, 40, 9, 12
    lengths = torch.tensor([150, 61])
    clustering = random_clustering(generator, batch, heads, length, clusters, lengths)
    offsets, members = clustering.offsets, clustering.members
    cuda_offsets, cuda_members = ops.group_by_cluster(clustering.assignment.cuda(), clusters)
    assert torch.equal(cuda_offsets.cpu(), offsets) and torch.equal(cuda_members.cpu(), members)
    q, k, v, grad_rows = (torch.randn(batch, heads, length, dim, generator=generator).to(dtype)
                          for _ in range(4))
    grad_clusters = torch.randn(batch, heads, clusters, dim, generator=generator).to(dtype)
    scores = torch.rand(batch, heads, clusters, length, generator=generator)
    # zeros of both signs tie; subnormal weights are ordered by value (fast math must not flush them)
    scores[0, 0, 0, :slots + 4] = torch.tensor([0.0, 3e-40, -0.0, 1e-39, 2e-40, 0.0, -1e-40, 5e-39] * 2)
    scores = scores.to(dtype)
    topk = ops.cluster_topk(on_cpu_in_float(scores), lengths, slots)
    topk[1, :, :, 8:] = -1  # slots without a key
    weights = torch.randn(batch, heads, length, slots, generator=generator).to(dtype)
    index = (clustering.assignment, offsets, members, topk, lengths)
    cuda_index = tuple(t.cuda() for t in index)

    def both(op, floats, indices, *extra):
        cuda = getattr(ops, op)(*(t.cuda() for t in floats), *(cuda_index[i] for i in indices), *extra)
        cpu = getattr(ops, op)(*(on_cpu_in_float(t) for t in floats), *(index[i] for i in indices), *extra)
        for got, want in zip(cuda if isinstance(cuda, tuple) else (cuda,),
                             cpu if isinstance(cpu, tuple) else (cpu,)):
            assert_matches_cpu(got, want, dtype)
        return cuda

    both("cluster_mean", (q,), (1, 2))
    both("cluster_mean_backward", (grad_clusters,), (0, 1))
    both("cluster_broadcast", (grad_clusters,), (0,))
    both("cluster_broadcast_backward", (grad_rows,), (1, 2))
    both("cluster_topk", (scores,), (4,), slots)
    both("clustered_sparse_dot", (q, k), (3, 1, 2), 0.125)
    first = both("clustered_sparse_dot_backward", (weights, q, k), (3, 1, 2), 0.125)
    both("clustered_sparse_weighted_sum", (weights, v), (3, 1, 2))
    both("clustered_sparse_weighted_sum_backward", (grad_rows, weights, v), (3, 1, 2))
    # the key gradients are summed without atomics: a second run is bit-identical
    again = ops.clustered_sparse_dot_backward(weights.cuda(), q.cuda(), k.cuda(), cuda_index[3], cuda_index[1],
                                              cuda_index[2], 0.125)
    assert all(torch.equal(a, b) for a, b in zip(first, again))


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32] + HALF_TYPES)
def test_clustering_matches_cpu(dtype):
    generator = torch.Generator().manual_seed(1)
    q = torch.randn(2, 3, 700, 32, generator=generator).to(dtype)
    lengths = torch.tensor([700, 333])
    planes, offsets = torch.randn(63, 32, generator=generator), torch.randn(63, generator=generator)
    if dtype == torch.float64:
        planes, offsets = planes.double(), offsets.double()
    codes_cpu = ops.hyperplane_hash(on_cpu_in_float(q), planes, offsets, lengths)
    codes = ops.hyperplane_hash(q.cuda(), planes.cuda(), offsets.cuda(), lengths.cuda())
    if dtype == torch.float64:
        assert torch.equal(codes.cpu(), codes_cpu)
    else:  # float32 sums in another order: a projection at its threshold may flip a bit
        differing_bits = sum(bin(int(x)).count("1") for x in (codes.cpu() ^ codes_cpu).flatten())
        assert differing_bits <= 1e-3 * codes_cpu.numel() * 63
    # from the same codes: identical initial centroids (same seeded walk) and K-Means
    cuda_codes, cuda_lengths = codes_cpu.cuda(), lengths.cuda()
    for clusters in (20, 200, 700):  # shared counters, global counters, one query per cluster
        initial = ops.hamming_kmeans_init(codes_cpu, lengths, clusters, 1234)
        assert torch.equal(ops.hamming_kmeans_init(cuda_codes, cuda_lengths, clusters, 1234).cpu(), initial)
        for iterations in (0, 3, 10):
            want = ops.hamming_kmeans(codes_cpu, lengths, initial, iterations, 63)
            got = ops.hamming_kmeans(cuda_codes, cuda_lengths, initial.cuda(), iterations, 63)
            assert torch.equal(got[0].cpu(), want[0]) and torch.equal(got[1].cpu(), want[1])


@requires_cuda
@pytest.mark.parametrize("batch,heads,length,clusters", [
    (4, 2, 33000, 20),   # 8 x 129 blocks of 256 queries would be > 1024 blocks: 512 per block
    (4, 4, 65536, 20),   # 16 x 128 blocks of 512 would be > 1024 blocks: 1024 per block
    (1, 1, 7000, 4100),  # more centroids than shared memory holds (4096): walk and steps in global memory
])
def test_kmeans_schedules_of_large_inputs_match_cpu(batch, heads, length, clusters):
    """The CUDA K-Means schedules that test_clustering_matches_cpu's inputs do not reach, on
    random codes with padding: identical initial centroids, assignment and centroids."""
    generator = torch.Generator().manual_seed(length)
    codes = torch.randint(0, 2**62, (batch, heads, length), generator=generator)
    lengths = torch.full((batch,), length)
    lengths[-1] = length * 2 // 3
    assert int(lengths.min()) > clusters   # the seeded walk and Lloyd steps, not one query per cluster
    initial = ops.hamming_kmeans_init(codes, lengths, clusters, 99)
    assert torch.equal(ops.hamming_kmeans_init(codes.cuda(), lengths.cuda(), clusters, 99).cpu(), initial)
    want = ops.hamming_kmeans(codes, lengths, initial, 3, 63)
    got = ops.hamming_kmeans(codes.cuda(), lengths.cuda(), initial.cuda(), 3, 63)
    assert torch.equal(got[0].cpu(), want[0]) and torch.equal(got[1].cpu(), want[1])


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32] + HALF_TYPES)
@pytest.mark.parametrize("rounds,chunk_size", [(1, 32), (3, 16), (2, 1000)])
def test_lsh_kernels_match_cpu(dtype, rounds, chunk_size):
    generator = torch.Generator().manual_seed(2)
    q, v, grad = (torch.randn(2, 3, 300, 64, generator=generator).to(dtype) for _ in range(3))
    q[0, 0, 5] = 0  # a zero query: its unit key is clamped
    lengths = torch.tensor([300, 1])
    hashing = lsh_hash(on_cpu_in_float(q), lengths, rounds, chunk_size, seed=5)
    cuda_hashing = lsh_hash(q.cuda(), lengths.cuda(), rounds, chunk_size, seed=5)
    agree = (cuda_hashing.buckets.cpu() == hashing.buckets).float().mean()
    assert agree == 1 if dtype == torch.float64 else agree > 0.99
    order = hashing.order  # the same order on both devices, so outputs are comparable
    out_cpu, lse_cpu = ops.lsh_attention_forward(on_cpu_in_float(q), on_cpu_in_float(v), order, lengths,
                                                 chunk_size)
    out, lse = ops.lsh_attention_forward(q.cuda(), v.cuda(), order.cuda(), lengths.cuda(), chunk_size)
    assert_matches_cpu(out, out_cpu, dtype)
    torch.testing.assert_close(lse.cpu().to(lse_cpu.dtype), lse_cpu, **tolerance(dtype))
    want = ops.lsh_attention_backward(on_cpu_in_float(grad), on_cpu_in_float(q), on_cpu_in_float(v), order,
                                      lengths, out_cpu, lse_cpu, chunk_size)
    got = ops.lsh_attention_backward(grad.cuda(), q.cuda(), v.cuda(), order.cuda(), lengths.cuda(), out, lse,
                                     chunk_size)
    # The zero query's gradient is scaled by 1 / eps (~1e11): compared on its own (float16 cannot hold
    # it: inf), so that it does not set the scale of every other gradient.
    zero = (0, 0, 5)
    if dtype != torch.float16:
        size = want[0][zero].abs().max()
        torch.testing.assert_close(got[0][zero].cpu().to(size.dtype) / size, want[0][zero] / size,
                                   **tolerance(dtype))
    for i, (g, w) in enumerate(zip(got, want)):
        g, w = g.cpu().to(w.dtype), w.clone()
        if i == 0:
            g[zero], w[zero] = 0, 0
        scale = max(1.0, w.abs().max().item())  # half-precision gradients: relative to their size
        torch.testing.assert_close(g / scale, w / scale, **tolerance(dtype))


@requires_cuda
@pytest.mark.parametrize("dtype", HALF_TYPES)
@pytest.mark.parametrize("name", sorted(available_attentions()))
def test_every_attention_under_cuda_autocast(name, dtype):
    x, projections = projected_inputs("cuda")
    lengths = torch.tensor([24, 17], device="cuda")
    options = EXACT_OPTIONS.get(name, {})
    with torch.autocast("cuda", dtype=dtype):
        out = attend(name, options, x, projections, lengths)
        loss = out.float().square().sum()
    loss.backward()
    assert out.dtype == dtype and torch.isfinite(out).all()
    assert all(torch.isfinite(p.grad).all() for p in used_parameters(name, projections))
    reference = attend(name, options, x.cpu(), projections.cpu(), lengths.cpu())
    torch.testing.assert_close(out.float().cpu(), reference, atol=6e-2, rtol=6e-2)


@requires_cuda
@pytest.mark.parametrize("dtype", HALF_TYPES)
@pytest.mark.parametrize("name", ["clustered", "iclustered"])
def test_clustered_attentions_in_half_precision_on_cuda_match_float32(name, dtype):
    """With real clustering (100 of 2000 queries): the same seed gives the same planes (drawn in
    float32 from the CUDA generator) and initial centroids in both dtypes; codes may differ on
    near-ties, so the outputs are compared by their mean error, which a different clustering
    would raise far above it."""
    generator = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 2, 2000, 64, generator=generator).to(dtype).cuda() for _ in range(3))
    attention = build_attention(name, clusters=100)
    torch.manual_seed(8)
    out = attention(q, k, v)
    torch.manual_seed(8)
    reference = attention(q.float(), k.float(), v.float()).cpu()
    assert out.dtype == dtype
    error = (out.float().cpu() - reference).abs().mean() / reference.abs().mean()
    assert error < 2e-2 and not math.isnan(error)
