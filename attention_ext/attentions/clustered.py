"""Clustered attention (Vyas et al., 2020, sec. 3.2) and the query clustering it shares
with improved clustered attention.

    attn = build_attention("clustered", clusters=100, bits=63, iterations=10)
    out = attn(q, k, v, lengths)

Per (batch, head) the valid queries are hashed to `bits`-bit codes by random
hyperplanes and grouped by K-Means in Hamming space (`cluster_queries`). Each
cluster's centroid is the mean of its member queries (eq. 3), the centroids attend to
all valid keys, A^c = softmax(Q^c K^T / sqrt(E)) (eq. 4), V^c = A^c V (eq. 5), and
every query receives its cluster's row of V^c (eq. 6). Gradients reach q through the
centroids and k, v through the dense product; the clustering itself is not
differentiable.

Decisions where the paper is silent (the C++ side, csrc/clustering.cpp, explains the
hashing and K-Means ones in full):
- Hyperplanes cut through the cloud of valid queries at random positions (offset
  mean + N(0,1) * std of the projections), so the hash reflects Euclidean closeness.
  The planes (bits, E) and offsets (bits,) are drawn with torch.randn from the default
  generator of q's device on every call (CUDA's on a GPU: no copy from the host, so a CUDA
  graph holds it), then one `draw_seed()` seeds the per-(batch, head) choice of initial
  centroids: `torch.manual_seed(s)` makes a call repeatable, and a sequence is clustered
  the same alone or at the same batch index of a padded batch.
- A sequence with at most `clusters` valid queries gives each query its own cluster:
  the result is then exactly full attention.
- Padded queries are in no cluster (id -1), count in no centroid, and output 0.
- Initial centroids are distinct codes of randomly chosen valid queries; Hamming ties go
  to the lowest cluster id; a majority-vote tie keeps the centroid's previous bit; a
  cluster that loses all its members keeps its code. Empty clusters have a zero centroid
  whose row of A^c no query reads.
- `iterations` Lloyd steps are followed by one final assignment; 0 is allowed and means
  "assign to the initial centroids".
- Dtypes (`contract.kernel_dtype`): float32 and float64 everywhere; float16 and bfloat16
  natively on CUDA (half-precision loads, float32 accumulation), in float32 on the CPU
  (cast back on return). Hash planes are float32 (float64 for float64 inputs) on both
  devices (drawn from each device's generator: a seed gives other planes on CPU and CUDA).
  Autocast is off inside the attention (`contract.autocast_disabled`): it computes in the dtype of q, which under autocast is the projections' half precision.
"""
from __future__ import annotations

import math
import os
from typing import NamedTuple

import torch

from .._ops import ops
from ..contract import autocast_disabled, check_inputs, draw_clustering, kernel_dtype, valid_positions
from ..dispatch import Route, RouteCall, RouteDispatch, takes_every_call
from ..registry import Option, register_attention
from .clustered_triton import TRITON_AVAILABLE, triton_interpreted

CLUSTERING_OPTIONS = (
    Option("clusters", 100, 1, help="query clusters per sequence and head"),
    Option("bits", 63, 1, 63, help="hash bits per query"),
    Option("iterations", 10, 0, help="Lloyd iterations of Hamming K-Means"),
)


class QueryClusters(NamedTuple):
    """A clustering of the queries of every (batch, head).

    assignment: (B, H, N) int64, cluster id of each query, -1 for padded queries.
    counts:     (B, H, C) int64, members per cluster.
    offsets, members: the same grouping as lists: the queries of cluster c are
        members[..., offsets[..., c]:offsets[..., c + 1]] in increasing position
        (members past offsets[..., C] are -1).
    """
    assignment: torch.Tensor
    counts: torch.Tensor
    offsets: torch.Tensor
    members: torch.Tensor

    @property
    def clusters(self) -> int:
        return self.counts.shape[-1]


def group_queries(assignment: torch.Tensor, clusters: int) -> QueryClusters:
    """Builds the `QueryClusters` of a given (B, H, N) assignment to `clusters` clusters."""
    offsets, members = ops.group_by_cluster(assignment, clusters)
    return _query_clusters(assignment, offsets, members)


def _query_clusters(assignment: torch.Tensor, offsets: torch.Tensor, members: torch.Tensor) -> QueryClusters:
    return QueryClusters(assignment, offsets[..., 1:] - offsets[..., :-1], offsets, members)


def hash_queries(q: torch.Tensor, lengths: torch.Tensor, planes: torch.Tensor,
                 offsets: torch.Tensor) -> torch.Tensor:
    """(B, H, N) int64 codes: bit b is set when <q, planes[b]> exceeds
    mean_b + offsets[b] * std_b, the statistics taken over the valid queries of that
    (batch, head). Padded queries get code 0."""
    return ops.hyperplane_hash(q.detach(), planes, offsets, lengths)


def cluster_queries(q: torch.Tensor, lengths: torch.Tensor, clusters: int, bits: int,
                    iterations: int) -> QueryClusters:
    """Groups the valid queries of every (batch, head) into at most `clusters` clusters
    (sec. 3.2.2): random-hyperplane hashing, then Hamming K-Means. Not differentiable.

    The tensors have min(clusters, N) cluster slots; a sequence with L <= clusters valid
    queries puts query i alone in cluster i.
    """
    cluster_op = _cluster_queries_op
    if kernel_route(q, clusters) == "triton":
        from .clustered_triton import clustering   # imports triton: only where this route runs
        cluster_op = clustering.cluster_queries_op
    assignment, offsets, members = cluster_op(q.detach(), lengths, clusters, bits, iterations)
    return _query_clusters(assignment, offsets, members)


# Which kernels clustered and i-clustered attention run: "triton", the Triton kernels of
# attentions/clustered_triton (the clustering as one launch: the hash, every Lloyd step and the member
# lists; i-clustered's top-key attention as one launch each way); "extension", the extension's kernels
# (csrc/clustering and group_by_cluster: one launch per Lloyd step; i-clustered's sparse products).
# Both give the same clusters for the same draws and the same values within rounding. CUDA takes the
# extension, the route that has passed its tests on a GPU (an H200); the Triton kernels have run only
# in Triton's interpreter, so CUDA takes them only when asked: ATTENTION_EXT_CUDA_KERNELS=triton, or
# `kernel_routes.forced("cuda", "triton")` (the GPU report times both). The CPU keeps the extension,
# and runs triton only when forced (under Triton's interpreter, TRITON_INTERPRET=1: the tests).
CUDA_KERNELS_VARIABLE = "ATTENTION_EXT_CUDA_KERNELS"
def _triton_declines(call: RouteCall) -> str | None:
    if not TRITON_AVAILABLE:
        return "triton is not installed (pip install triton)"
    if call.device_type == "cpu" and not triton_interpreted():
        return "Triton runs on the CPU only in its interpreter (TRITON_INTERPRET=1, for tests)"
    if call.device_type == "cuda" and triton_interpreted():
        return "Triton's interpreter (TRITON_INTERPRET=1) runs CPU tensors only"
    if call.device_type not in ("cpu", "cuda"):
        return f"no Triton kernels for {call.device_type}"
    if call.dtype is None:
        return None
    from .clustered_triton import clustering   # imports triton: only where this route may run
    if call.dtype not in clustering.DTYPES:
        return f"{call.dtype} (its kernels take {', '.join(str(d) for d in clustering.DTYPES)})"
    if call.slots > clustering.MAX_SLOTS:
        return f"{call.slots} cluster slots (at most {clustering.MAX_SLOTS})"
    return None


def _kernel_preference(call: RouteCall) -> tuple[str, ...]:
    if call.device_type != "cuda":
        return ("extension",)
    asked = os.environ.get(CUDA_KERNELS_VARIABLE, "extension")
    if asked not in ("extension", "triton"):
        raise ValueError(f"{CUDA_KERNELS_VARIABLE}={asked!r}: give extension (the default) or triton")
    return ("triton", "extension") if asked == "triton" else ("extension",)


kernel_routes = RouteDispatch(
    "kernel route", (Route("triton", _triton_declines), Route("extension", takes_every_call)),
    preference=_kernel_preference)


def kernel_route(q: torch.Tensor, clusters: int) -> str:
    """The kernel route a call with queries q takes: "triton" or "extension"."""
    return kernel_routes.choose(RouteCall(q.device.type, q.dtype, min(clusters, q.shape[2])))


def cluster_slots(clusters: int, length):
    """Cluster slots of a clustering of `length` queries: min(clusters, length), at least 1."""
    return torch.sym_max(1, torch.sym_min(clusters, length))


# One operator for the whole clustering, random draws included: torch.compile and torch.export
# then keep it as one opaque call that draws from torch's default generator exactly as an eager
# call does (a traced torch.randn would draw from the compiler's own generator instead, and
# draw_seed's .item() would break the graph). Tagged nondeterministic_seeded so that the
# compiler never merges two calls with equal inputs into one, nor recomputes one in backward.
@torch.library.custom_op("attention_ext::cluster_queries", mutates_args=(),
                         tags=(torch.Tag.nondeterministic_seeded,))
def _cluster_queries_op(q: torch.Tensor, lengths: torch.Tensor, clusters: int, bits: int,
                        iterations: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(assignment, offsets, members) of `cluster_queries`, for q without gradient."""
    slots = cluster_slots(clusters, q.shape[2])
    planes, plane_offsets, seed = draw_clustering(q, bits)
    codes = hash_queries(q, lengths, planes, plane_offsets)
    initial = ops.hamming_kmeans_init(codes, lengths, slots, seed)
    assignment, _ = ops.hamming_kmeans(codes, lengths, initial, iterations, bits)
    offsets, members = ops.group_by_cluster(assignment, slots)
    return assignment, offsets, members


@_cluster_queries_op.register_fake
def _(q, lengths, clusters, bits, iterations):
    batch, heads, length, _ = q.shape
    long = dict(dtype=torch.long)
    return (q.new_empty((batch, heads, length), **long),
            q.new_empty((batch, heads, cluster_slots(clusters, length) + 1), **long),
            q.new_empty((batch, heads, length), **long))


class ClusterMean(torch.autograd.Function):
    """(B, H, N, D) rows -> (B, H, C, D): each cluster's mean of its members' rows (eq. 3).
    Empty clusters give a zero row."""

    @staticmethod
    def forward(ctx, x, clusters: QueryClusters):
        ctx.clusters = clusters
        return ops.cluster_mean(x, clusters.offsets, clusters.members)

    @staticmethod
    def backward(ctx, grad):
        clusters = ctx.clusters
        return ops.cluster_mean_backward(grad, clusters.assignment, clusters.offsets), None


class ClusterBroadcast(torch.autograd.Function):
    """(B, H, C, D) rows -> (B, H, N, D): each query gets its cluster's row (eq. 6);
    padded queries get zeros."""

    @staticmethod
    def forward(ctx, x, clusters: QueryClusters):
        ctx.clusters = clusters
        return ops.cluster_broadcast(x, clusters.assignment)

    @staticmethod
    def backward(ctx, grad):
        clusters = ctx.clusters
        return ops.cluster_broadcast_backward(grad, clusters.offsets, clusters.members), None


def empty_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The output for inputs without any element: zeros of v's shape, connected to q, k
    and v so that a backward pass gives them (empty or zero) gradients."""
    return v * 0 + (q.sum() + k.sum()) * 0


class CentroidValues(torch.autograd.Function):
    """V^c = softmax(Q^c K^T) V over the valid keys (eq. 4-5), (B, H, C, D), for centroids
    already scaled by 1/sqrt(E), without materialising the (C, N) weights: the CPU kernel
    (csrc/centroid_attention.cpp) takes the keys block by block with an online softmax, and
    its backward recomputes each block's weights from the saved log-sum-exp."""

    @staticmethod
    def forward(ctx, centroids, k, v, lengths):
        values, logsumexp = ops.centroid_attention(centroids, k, v, lengths)
        ctx.save_for_backward(centroids, k, v, lengths, values, logsumexp)
        return values

    @staticmethod
    def backward(ctx, grad):
        grad_centroids, grad_k, grad_v = ops.centroid_attention_backward(grad, *ctx.saved_tensors)
        return grad_centroids, grad_k, grad_v, None


def centroid_attention(q: torch.Tensor, k: torch.Tensor, lengths: torch.Tensor,
                       clusters: QueryClusters, padded: bool = True) -> torch.Tensor:
    """A^c = softmax(Q^c K^T / sqrt(E)) over the valid keys (eq. 3-4), (B, H, C, N).

    A sequence of length 0 keeps key 0 so that no row of the softmax is empty; it has
    no queries, so nothing reads those rows. `padded=False` says that every sequence is
    full (a call without lengths), which skips the key mask.
    """
    # Scaling the (C, E) centroids rather than the (C, N) scores saves two passes over
    # the largest tensor here (forward and backward).
    centroids = ClusterMean.apply(q, clusters) * (1.0 / math.sqrt(q.shape[-1]))
    scores = torch.matmul(centroids, k.transpose(-1, -2))
    if padded:   # whether any key really is would be a host synchronisation to ask
        key_valid = valid_positions(lengths.clamp(min=1), k.shape[2])[:, None, None, :]
        scores = scores.masked_fill(~key_valid, float("-inf"))
    return torch.softmax(scores, dim=-1)


# How clustered attention computes its centroid part V^c = softmax(Q^c K^T / sqrt(E)) V: "fused", our
# kernel (CPU only: the keys in blocks with an online softmax, CentroidValues); "unfused", three torch
# operators (the (C, N) weights materialised, centroid_attention); "sdpa", torch's
# scaled_dot_product_attention with the C centroids as queries (on CUDA FlashAttention where no key is
# masked, else another of its backends). All three compute the same values and gradients. The
# preference is what measurement chose (attention_ext/RESULTS.md, "The GPU: status and known costs" and "CPU speed"; the
# project's GPU report times unfused and sdpa on CUDA): on the CPU fused, with either instruction
# set torch's kernels use; on CUDA sdpa in half precision and unfused in float32 and float64 (SDPA's
# float32 kernels were the slower at long N); elsewhere unfused.
def _fused_declines(call: RouteCall) -> str | None:
    return None if call.device_type == "cpu" else "the fused centroid route is a CPU kernel"


def _centroid_preference(call: RouteCall) -> tuple[str, ...]:
    if call.device_type == "cpu":
        return ("fused", "unfused", "sdpa")
    if call.device_type == "cuda" and call.dtype in (torch.bfloat16, torch.float16):
        return ("sdpa", "unfused")
    return ("unfused", "sdpa")


centroid_routes = RouteDispatch(
    "centroid route", (Route("fused", _fused_declines), Route("unfused", takes_every_call),
                       Route("sdpa", takes_every_call)),
    preference=_centroid_preference)


def centroid_route(device_type: str, dtype: torch.dtype) -> str:
    """The centroid route a call on `device_type` in `dtype` takes."""
    return centroid_routes.choose(RouteCall(device_type, dtype))


def centroid_route_values(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: torch.Tensor,
                          clusters: QueryClusters, padded: bool = True) -> torch.Tensor:
    """V^c (B, H, C, D) by the route chosen for q's device and dtype (centroid_route)."""
    route = centroid_route(q.device.type, q.dtype)
    scale = 1.0 / math.sqrt(q.shape[-1])
    if route == "fused":   # the (C, N) weights are never needed whole
        return CentroidValues.apply(ClusterMean.apply(q, clusters) * scale, k, v, lengths)
    if route == "sdpa":
        key_valid = valid_positions(lengths.clamp(min=1), k.shape[2])[:, None, None, :] if padded else None
        return torch.nn.functional.scaled_dot_product_attention(ClusterMean.apply(q, clusters), k, v,
                                                                attn_mask=key_valid, scale=scale)
    return torch.matmul(centroid_attention(q, k, lengths, clusters, padded), v)


@register_attention("clustered", options=CLUSTERING_OPTIONS, number_option="clusters",
                    summary="clustered attention: one softmax per query cluster (Vyas et al. 2020)")
class ClusteredAttention(torch.nn.Module):
    """Clustered attention: queries share the attention of their cluster's centroid."""

    def __init__(self, clusters: int = 100, bits: int = 63, iterations: int = 10):
        super().__init__()
        self.clusters, self.bits, self.iterations = clusters, bits, iterations

    def extra_repr(self) -> str:
        return f"clusters={self.clusters}, bits={self.bits}, iterations={self.iterations}"

    def forward(self, q, k, v, lengths=None):
        padded = lengths is not None
        lengths = check_inputs(q, k, v, lengths, attention=self)
        if q.numel() == 0 or v.numel() == 0:
            return empty_attention(q, k, v)
        dtype = kernel_dtype(q.dtype, q.device)
        with autocast_disabled(q.device):
            q, k, v, input_dtype = q.to(dtype), k.to(dtype), v.to(dtype), q.dtype
            clusters = cluster_queries(q, lengths, self.clusters, self.bits, self.iterations)
            centroid_values = centroid_route_values(q, k, v, lengths, clusters, padded)  # eq. 3-5
            return ClusterBroadcast.apply(centroid_values, clusters).to(input_dtype)  # eq. 6
