"""The Triton kernels of clustered and i-clustered attention (attention_ext/attentions/clustered_triton).

Without a GPU they run in Triton's interpreter (TRITON_INTERPRET=1, set here before any kernel is
defined) on CPU tensors in float32; with one, compiled on CUDA tensors (the "cpu" cases are then
skipped: a kernel is either interpreted or compiled in one process). Checked against the
extension's kernels (the clustering bit for bit, same draws), against dense math
(dense_clustered_attention.py: the top-key attention and the whole attentions, with gradients),
and against the extension's route of the whole attentions (same seed).
"""
import math
import os

import pytest
import torch

from kernel_devices import CUDA_AVAILABLE, requires_cuda

if not CUDA_AVAILABLE:   # tests/conftest.py sets it before anything imports triton; alone, this file does too
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

import dense_clustered_attention as dense  # noqa: E402
from module_clustering import module_and_clusters  # noqa: E402
from random_inputs import on, random_qkv  # noqa: E402

from attention_ext import build_attention  # noqa: E402
from attention_ext._ops import ops  # noqa: E402
from attention_ext.attentions.clustered import group_queries, kernel_route, kernel_routes  # noqa: E402
from attention_ext.attentions.clustered_triton import triton_interpreted  # noqa: E402
from attention_ext.attentions.clustered_triton.clustering import cluster_with_draws  # noqa: E402
from attention_ext.attentions.clustered_triton.top_attention import top_attention  # noqa: E402

INTERPRETED = triton_interpreted()
DEVICES = [pytest.param("cpu", marks=pytest.mark.skipif(not INTERPRETED, reason="kernels compiled for CUDA")),
           pytest.param("cuda", marks=[requires_cuda, pytest.mark.skipif(INTERPRETED, reason="kernels interpreted")])]


@pytest.fixture(params=DEVICES)
def device(request):
    return torch.device(request.param)


@pytest.fixture
def triton_route(device):
    """The triton kernel route on `device` for the test, the previous route afterwards."""
    with kernel_routes.forced(device.type, "triton"):
        yield


def _extension_clustering(q, lengths, clusters, iterations, planes, plane_offsets, seed):
    slots = max(1, min(clusters, q.shape[2]))
    codes = ops.hyperplane_hash(q, planes, plane_offsets, lengths)
    initial = ops.hamming_kmeans_init(codes, lengths, slots, seed)
    assignment, centroids = ops.hamming_kmeans(codes, lengths, initial, iterations, planes.shape[0])
    offsets, members = ops.group_by_cluster(assignment, slots)
    return assignment, offsets, members, centroids


# (batch, heads, N, E, clusters, bits, iterations, lengths): padding, a sequence shorter than the
# clusters (one cluster per query), an empty one, fewer clusters than queries, few bits (duplicate
# codes: repeated initial centroids, empty clusters), no Lloyd step.
CLUSTERINGS = [
    (2, 2, 150, 32, 12, 63, 5, [150, 97]),
    (3, 1, 40, 16, 20, 63, 3, [40, 7, 0]),
    (1, 3, 200, 64, 40, 4, 10, [200]),
    (2, 1, 70, 16, 8, 20, 0, [70, 33]),
]


@pytest.mark.parametrize("batch, heads, length, dim, clusters, bits, iterations, lengths", CLUSTERINGS)
def test_clustering_is_the_extension_kernels(device, batch, heads, length, dim, clusters, bits, iterations, lengths):
    """Hash, initial centroids, every Lloyd step and the member lists equal the extension's
    kernels' for the same draws; the assignment is nearest-centroid for the returned centroids."""
    generator = torch.Generator().manual_seed(length + clusters)
    q = torch.randn(batch, heads, length, dim, generator=generator).to(device)
    planes = torch.randn(bits, dim, generator=generator).to(device)
    plane_offsets = torch.randn(bits, generator=generator).to(device)
    lengths = torch.tensor(lengths, device=device)
    got = cluster_with_draws(q, lengths, clusters, iterations, planes, plane_offsets, seed=987654321)
    expected = _extension_clustering(q, lengths, clusters, iterations, planes, plane_offsets, 987654321)
    for name, value, reference in zip(("assignment", "offsets", "members", "centroids"), got, expected):
        assert torch.equal(value, reference), name
    # Brute force: Hamming distances to every returned centroid, ties to the lowest index.
    codes = ops.hyperplane_hash(q, planes, plane_offsets, lengths)
    assignment, _, _, centroids = got
    differing = codes[..., :, None] ^ centroids[..., None, :]
    distance = sum(((differing >> bit) & 1) for bit in range(bits))
    valid = torch.arange(length, device=device) < lengths[:, None, None]
    kmeans = (lengths > clusters)[:, None, None]
    nearest = torch.where(kmeans, distance.argmin(-1), torch.arange(length, device=device))
    assert torch.equal(assignment, torch.where(valid, nearest, -1))


def _top_attention_inputs(device, lengths, clusters, topk, seed):
    batch, heads, length, dim = len(lengths), 2, 60, 16
    q, k, v = on(device, *random_qkv((batch, heads, length, dim), torch.float32, seed))
    lengths = torch.tensor(lengths, device=device)
    generator = torch.Generator().manual_seed(seed)
    valid = torch.arange(length) < lengths.cpu()[:, None, None]
    assignment = torch.where(valid, torch.randint(0, clusters, (batch, heads, length), generator=generator), -1)
    scores = torch.randn(batch, heads, clusters, length, generator=generator) * 3
    key_valid = dense.key_mask(lengths.cpu(), length)
    attention = torch.softmax(scores.masked_fill(~key_valid, float("-inf")), -1).to(device).requires_grad_()
    full = torch.randn(batch, heads, clusters, dim, generator=generator).to(device).requires_grad_()
    top = ops.cluster_topk(attention.detach(), lengths, topk)
    return q, k, v, lengths, group_queries(assignment.to(device), clusters), attention, full, top


def _dense_top_attention(q, k, v, lengths, clusters, attention, full, top):
    """eq. 15-17 with dense matrices: m_j softmax_T(scale q K^T) V on T_j, plus F_j minus A^c's
    part on T_j (the rest V^b_j); padded queries 0."""
    slots = torch.nn.functional.one_hot(top.clamp(min=0), attention.shape[-1]) * (top >= 0)[..., None]
    top_mask = slots.sum(-2) > 0
    membership = dense.one_hot_clusters(clusters.assignment, clusters.clusters, q.dtype)
    mass = (attention * top_mask).sum(-1, keepdim=True)
    rest = full - (attention * top_mask) @ v
    per_query_top = (membership @ top_mask.to(q.dtype)) > 0.5
    scores = (q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])).masked_fill(~per_query_top, float("-inf"))
    exact = torch.nan_to_num(torch.softmax(scores, -1)) @ v
    return (membership @ mass) * exact + membership @ rest


@pytest.mark.parametrize("lengths, clusters, topk", [([60, 41], 7, 5), ([60, 3], 5, 16), ([25, 0], 3, 30)])
def test_top_attention_is_dense_math(device, lengths, clusters, topk):
    """Output and gradients (q, k, v, A^c, F) of the top-key kernels against dense math; topk
    beyond a sequence (slots of -1), an empty sequence, empty clusters."""
    q, k, v, lengths, groups, attention, full, top = _top_attention_inputs(device, lengths, clusters, topk, seed=3)
    inputs = (q, k, v, attention, full)
    out = top_attention(q, k, v, attention, full, top, groups.offsets, groups.members, 1 / math.sqrt(q.shape[-1]))
    reference = _dense_top_attention(q, k, v, lengths, groups, attention, full, top)
    torch.testing.assert_close(out, reference, atol=2e-5, rtol=1e-5)
    upstream = torch.randn_like(out)
    got = torch.autograd.grad(out, inputs, upstream)
    expected = torch.autograd.grad(reference, inputs, upstream)
    for name, value, wanted in zip(("q", "k", "v", "attention", "full"), got, expected):
        torch.testing.assert_close(value, wanted, atol=2e-5, rtol=1e-5, msg=name)


@pytest.mark.parametrize("name", ["clustered", "iclustered"])
def test_whole_attention_is_dense_math(device, triton_route, name):
    """Forward and backward of each attention on the triton route against the dense equations
    for the clustering the route made (padding, an empty cluster or two)."""
    q, k, v = on(device, *random_qkv((2, 2, 90, 32), torch.float32, seed=4))
    lengths = torch.tensor([90, 50], device=device)
    options = dict(clusters=9, iterations=4) | (dict(topk=6) if name == "iclustered" else {})
    out, clusters = module_and_clusters(name, q, k, v, lengths, seed=11, **options)
    qd, kd, vd = (t.detach().cpu().double().requires_grad_() for t in (q, k, v))
    assignment, lengths_cpu = clusters.assignment.cpu(), lengths.cpu()
    if name == "clustered":
        reference = dense.clustered_attention(qd, kd, vd, lengths_cpu, assignment, clusters.clusters)
    else:
        top = dense.topk_mask(dense.centroid_attention(qd, kd, lengths_cpu, assignment, clusters.clusters),
                              lengths_cpu, 6)
        reference = dense.improved_clustered_attention(qd, kd, vd, lengths_cpu, assignment, clusters.clusters, top)
    torch.testing.assert_close(out.detach().cpu().double(), reference.detach(), atol=1e-5, rtol=1e-4)
    upstream = torch.randn(out.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    got = torch.autograd.grad(out, (q, k, v), upstream.to(device, out.dtype))
    expected = torch.autograd.grad(reference, (qd, kd, vd), upstream)
    for label, value, wanted in zip("qkv", got, expected):
        torch.testing.assert_close(value.cpu().double(), wanted, atol=1e-4, rtol=1e-4, msg=label)


# (N, lengths, clusters, topk): K-Means with padding; fewer queries than clusters (a cluster per
# query: full attention) with an empty sequence; topk beyond a sequence.
ROUTE_CASES = [(120, [120, 77], 10, 8), (12, [12, 0], 20, 4), (40, [40, 9], 6, 16)]


@pytest.mark.parametrize("name", ["clustered", "iclustered"])
@pytest.mark.parametrize("length, lengths, clusters, topk", ROUTE_CASES)
def test_routes_agree(device, name, length, lengths, clusters, topk):
    """The triton route and the extension's route of the whole attention, same seed: the same
    clusters (so values and gradients equal within rounding)."""
    q, k, v = on(device, *random_qkv((2, 3, length, 16), torch.float32, seed=6))
    lengths = torch.tensor(lengths, device=device)
    options = dict(clusters=clusters, iterations=5) | (dict(topk=topk) if name == "iclustered" else {})
    results = {}
    for route in ("extension", "triton"):
        with kernel_routes.forced(device.type, route):
            torch.manual_seed(21)
            out = build_attention(name, **options)(q, k, v, lengths)
            results[route] = (out, *torch.autograd.grad(out.square().sum(), (q, k, v)))
    for label, value, wanted in zip(("out", "q", "k", "v"), results["triton"], results["extension"]):
        torch.testing.assert_close(value, wanted, atol=2e-5, rtol=1e-5, msg=label)


@requires_cuda
@pytest.mark.skipif(INTERPRETED, reason="kernels interpreted")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_on_cuda(dtype):
    """On CUDA the default route is triton, also in half precision: the same clusters as the
    extension's route, outputs within the dtype's rounding."""
    q, k, v = on("cuda", *random_qkv((2, 4, 1000, 64), torch.float32, seed=7))
    q, k, v = (t.detach().to(dtype).requires_grad_() for t in (q, k, v))
    lengths = torch.tensor([1000, 613], device="cuda")
    for name in ("clustered", "iclustered"):
        outputs = {}
        for route in ("extension", None):   # None: the dispatch's choice, triton
            with kernel_routes.forced("cuda", route):
                torch.manual_seed(8)
                outputs[route] = build_attention(name, clusters=50)(q, k, v, lengths).float()
        torch.testing.assert_close(outputs[None], outputs["extension"], atol=3e-2, rtol=3e-2)


def test_kernel_route_choices():
    """A route outside the list is refused with the allowed ones; the CPU keeps the extension by
    default; a call the forced triton route declines (float64, too many cluster slots) falls to the
    extension."""
    with pytest.raises(ValueError, match="choose one of triton, extension"):
        with kernel_routes.forced("cuda", "fast"):
            pass
    assert kernel_route(torch.zeros(1, 1, 4, 8), clusters=2) == "extension"
    if INTERPRETED:
        with kernel_routes.forced("cpu", "triton"):
            assert kernel_route(torch.zeros(1, 1, 4, 8), clusters=2) == "triton"
            assert kernel_route(torch.zeros(1, 1, 4, 8, dtype=torch.float64), clusters=2) == "extension"
            assert kernel_route(torch.zeros(1, 1, 300, 8), clusters=300) == "extension"


@pytest.mark.parametrize("name", ["clustered", "iclustered"])
def test_compiles_without_graph_breaks(device, triton_route, name):
    """torch.compile(fullgraph=True) takes each attention on the triton route (its operators have
    fake implementations), with the values and gradients of an eager call with the same seed."""
    q, k, v = on(device, *random_qkv((2, 2, 50, 16), torch.float32, seed=9))
    lengths = torch.tensor([50, 31], device=device)
    attention = build_attention(name, clusters=6, **(dict(topk=5) if name == "iclustered" else {}))
    results = []
    for module in (torch.compile(attention, fullgraph=True, backend="aot_eager"), attention):
        torch.manual_seed(2)
        out = module(q, k, v, lengths)
        results.append((out, *torch.autograd.grad(out.square().sum(), (q, k, v))))
    for label, value, wanted in zip(("out", "q", "k", "v"), *results):
        torch.testing.assert_close(value, wanted, atol=1e-6, rtol=1e-6, msg=label)

