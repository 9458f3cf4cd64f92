"""Improved clustered attention (Vyas et al., 2020, sec. 3.3 and supplementary A.2).

    attn = build_attention("iclustered", clusters=100, topk=32)
    out = attn(q, k, v, lengths)

As clustered attention, the queries are clustered and the centroids attend to all valid
keys, A^c = softmax(Q^c K^T / sqrt(E)). Then for each cluster j its `topk` keys T_j with
the largest A^c_j are taken, with their mass m_j = sum_{l in T_j} A^c_jl (eq. 9), and a
query i of cluster j attends as (eq. 10-11, 15-17)

    V_i = m_j * sum_{l in T_j} softmax_{T_j}(q_i . k_l / sqrt(E)) v_l      (V^t_i)
        + sum_{l not in T_j} A^c_jl v_l                                   (V^b_j)

On the CPU (`ImprovedClusteredCPU`), T, m and V^b come from one fused pass over the keys
(csrc/centroid_attention.cpp; alone, `CentroidTopSplit`) and V^t + V^b from one fused operator
pair that works cluster by cluster (csrc/clustered_top_attention.cpp; alone,
`ClusteredTopAttention`). On CUDA, A^c is
formed, T is taken by `top_keys`, and V^t takes two sparse products per query
(`ClusteredSparseDot`, `ClusteredSparseWeightedSum`, csrc/sparse_product_cuda.cu) around a
softmax; V^b is one dense product per cluster. Gradients flow into q (through the centroids
and the exact top-k products), k, v, and into m_j through A^c; only the choice of T_j is not
differentiable.

Dtypes and autocast as in `attention_ext.attentions.clustered`. Decisions: the top-k are taken among the valid keys, largest first, ties to the lower
position; `topk` larger than a sequence's valid length keeps all its valid keys (then
m_j = 1, V^b = 0 and the result is exactly full attention). Clustering decisions are
those of `attention_ext.attentions.clustered`.
"""
from __future__ import annotations

import math

import torch

from .._ops import ops
from ..contract import autocast_disabled, check_inputs, kernel_dtype
from ..registry import Option, register_attention
from .clustered import (CLUSTERING_OPTIONS, ClusterBroadcast, QueryClusters, centroid_attention,
                        cluster_queries, empty_attention, kernel_route)


class ClusteredSparseDot(torch.autograd.Function):
    """dots[b, h, i, s] = scale * <q_i, k_{T_j[s]}> for query i of cluster j, where
    T = topk (B, H, C, S). A slot of -1 (no key) gives -inf; padded queries give 0."""

    @staticmethod
    def forward(ctx, q, k, topk, clusters: QueryClusters, scale: float):
        ctx.save_for_backward(q, k, topk)
        ctx.clusters, ctx.scale = clusters, scale
        return ops.clustered_sparse_dot(q, k, topk, clusters.offsets, clusters.members, scale)

    @staticmethod
    def backward(ctx, grad):
        q, k, topk = ctx.saved_tensors
        clusters = ctx.clusters
        grad_q, grad_k = ops.clustered_sparse_dot_backward(
            grad, q, k, topk, clusters.offsets, clusters.members, ctx.scale)
        return grad_q, grad_k, None, None, None


class ClusteredSparseWeightedSum(torch.autograd.Function):
    """out[b, h, i] = sum_s weights[b, h, i, s] * v_{T_j[s]} for query i of cluster j;
    slots of -1 add nothing and padded queries give 0."""

    @staticmethod
    def forward(ctx, weights, v, topk, clusters: QueryClusters):
        ctx.save_for_backward(weights, v, topk)
        ctx.clusters = clusters
        return ops.clustered_sparse_weighted_sum(weights, v, topk, clusters.offsets, clusters.members)

    @staticmethod
    def backward(ctx, grad):
        weights, v, topk = ctx.saved_tensors
        clusters = ctx.clusters
        grad_weights, grad_v = ops.clustered_sparse_weighted_sum_backward(
            grad, weights, v, topk, clusters.offsets, clusters.members)
        return grad_weights, grad_v, None, None


class SplitTopMass(torch.autograd.Function):
    """(A^c, T) -> (m, A^c with the top-k keys zeroed): m_j = sum_{l in T_j} A^c_jl (eq. 9),
    (B, H, C, 1), and the weights of V^b (eq. 17).

    One pass over the (C, N) weights each way, where gather + scatter under autograd
    would make four (a zero-filled gradient, a scatter-add, an addition, a masked copy).
    """

    @staticmethod
    def forward(ctx, attention, topk):
        present = topk >= 0
        # A slot of -1 only occurs when T_j already holds every valid key (or none, for an
        # empty sequence): point it at slot 0's key (key 0 in a row without keys), so the
        # scatters below write that key several times with one value, and keep it out of
        # the mass. A row without keys writes key 0 back unchanged.
        index = torch.where(present, topk, topk[..., :1].clamp(min=0))
        has_top = present[..., :1]
        ctx.save_for_backward(index, has_top)
        mass = (attention.gather(-1, index) * present).sum(-1, keepdim=True)
        kept = torch.where(has_top, 0.0, attention.gather(-1, index[..., :1]))
        return mass, attention.scatter(-1, index, kept.expand(index.shape))

    @staticmethod
    def backward(ctx, grad_mass, grad_rest):
        index, has_top = ctx.saved_tensors
        # d rest / d A^c is 1 off T and 0 on T; d m_j / d A^c_jl is 1 on T. Every slot of
        # a row writes one value: m_j's gradient, or the passed-through gradient of key 0
        # in a row without keys.
        on_top = torch.where(has_top, grad_mass, grad_rest.gather(-1, index[..., :1]))
        return grad_rest.scatter(-1, index, on_top.expand(index.shape)), None


class CentroidTopSplit(torch.autograd.Function):
    """For centroids already scaled by 1/sqrt(E): T (each cluster's top-k keys under A^c, as
    `top_keys`), m_j = sum_{l in T_j} A^c_jl (eq. 9) and V^b_j = sum_{l not in T_j} A^c_jl v_l
    (eq. 17), without materialising A^c: the CPU kernel (csrc/centroid_attention.cpp) takes
    the keys block by block, keeping each row's running softmax and top-k candidates, and
    its backward recomputes each block's weights. Returns (V^b (B, H, C, D), m (B, H, C, 1), T)."""

    @staticmethod
    def forward(ctx, centroids, k, v, lengths, topk: int):
        rest, mass, top, logsumexp = ops.centroid_attention_top(centroids, k, v, lengths, topk)
        ctx.save_for_backward(centroids, k, v, lengths, rest, mass, top, logsumexp)
        ctx.mark_non_differentiable(top)
        return rest, mass.unsqueeze(-1), top

    @staticmethod
    def backward(ctx, grad_rest, grad_mass, _):
        centroids, k, v, lengths, rest, mass, top, logsumexp = ctx.saved_tensors
        grad_k, grad_v = torch.zeros_like(k), torch.zeros_like(v)   # the operator adds into them
        grad_centroids = ops.centroid_attention_top_backward(
            grad_rest, grad_mass.squeeze(-1), centroids, k, v, lengths, rest, mass, top, logsumexp, grad_k, grad_v)
        return grad_centroids, grad_k, grad_v, None, None


class ClusteredTopAttention(torch.autograd.Function):
    """V^t + V^b of eq. 15-17 in one operator pair (csrc/clustered_top_attention.cpp, CPU):
    query i of cluster j gets m_j * softmax_s(scale <q_i, k_{T_j[s]}>) V_{T_j} + rest_j, with
    mass m (B, H, C) and rest = V^b (B, H, C, D). Slots of -1 hold no key; padded queries get 0.
    The forward also returns the softmax weights (B, H, N, S), saved for the backward, which
    works cluster by cluster on the members' rows gathered once."""

    @staticmethod
    def forward(ctx, q, k, v, mass, rest, topk, clusters: QueryClusters, scale: float):
        out, weights = ops.clustered_top_attention(q, k, v, topk, clusters.offsets, clusters.members, mass, rest,
                                                   scale)
        ctx.save_for_backward(q, k, v, mass, topk, weights)
        ctx.clusters, ctx.scale = clusters, scale
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, mass, topk, weights = ctx.saved_tensors
        clusters = ctx.clusters
        grad_q, grad_k, grad_v, grad_mass, grad_rest = ops.clustered_top_attention_backward(
            grad, q, k, v, topk, clusters.offsets, clusters.members, mass, weights, ctx.scale)
        return grad_q, grad_k, grad_v, grad_mass, grad_rest, None, None, None


class ImprovedClusteredCPU(torch.autograd.Function):
    """The whole CPU route after clustering as one autograd node: the centroids (eq. 3, scaled by
    1/sqrt(E)), the fused centroid pass (T, m, V^b, as CentroidTopSplit) and the fused top-key
    attention (as ClusteredTopAttention). One node because q, k and v get gradients from both
    passes: the centroid backward adds its key and value gradients into the top-key backward's,
    and the centroid mean's query gradient is added to the top-key backward's. As separate nodes,
    autograd allocated and summed two (B, H, N, .) tensors for each of q, k and v: 2 ms of 34 at
    N = 4096 (1 x 6 heads x 64, two AVX2 threads)."""

    @staticmethod
    def forward(ctx, q, k, v, lengths, clusters: QueryClusters, scale: float, topk: int):
        centroids = ops.cluster_mean(q, clusters.offsets, clusters.members) * scale
        rest, mass, top, logsumexp = ops.centroid_attention_top(centroids, k, v, lengths, topk)       # eq. 4, 9, 17
        out, weights = ops.clustered_top_attention(q, k, v, top, clusters.offsets, clusters.members, mass, rest,
                                                   scale)                                           # eq. 15-17
        ctx.save_for_backward(q, k, v, lengths, centroids, rest, mass, top, logsumexp, weights)
        ctx.clusters, ctx.scale = clusters, scale
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, lengths, centroids, rest, mass, top, logsumexp, weights = ctx.saved_tensors
        clusters, scale = ctx.clusters, ctx.scale
        grad_q, grad_k, grad_v, grad_mass, grad_rest = ops.clustered_top_attention_backward(
            grad, q, k, v, top, clusters.offsets, clusters.members, mass, weights, scale)
        grad_centroids = ops.centroid_attention_top_backward(grad_rest, grad_mass, centroids, k, v, lengths, rest,
                                                             mass, top, logsumexp, grad_k, grad_v)
        grad_q += ops.cluster_mean_backward(grad_centroids * scale, clusters.assignment, clusters.offsets)
        return grad_q, grad_k, grad_v, None, None, None, None


def top_keys(attention: torch.Tensor, lengths: torch.Tensor, topk: int) -> torch.Tensor:
    """(B, H, C, min(topk, N)) int64: each cluster's keys with the largest attention among
    the valid ones, largest first; slots past a sequence's valid length are -1."""
    return ops.cluster_topk(attention.detach(), lengths, topk)


@register_attention("iclustered", options=CLUSTERING_OPTIONS + (
                        Option("topk", 32, 1, help="keys per cluster attended exactly"),),
                    summary="improved clustered attention: clustered + exact attention on each "
                            "cluster's top-k keys (Vyas et al. 2020)",
                    aliases=("i-clustered", "improved-clustered"), number_option="clusters")
class ImprovedClusteredAttention(torch.nn.Module):
    """Improved clustered attention: exact attention on each cluster's top-k keys,
    rescaled to their clustered mass, plus the clustered attention on the other keys."""

    def __init__(self, clusters: int = 100, bits: int = 63, iterations: int = 10, topk: int = 32):
        super().__init__()
        self.clusters, self.bits, self.iterations, self.topk = clusters, bits, iterations, topk

    def extra_repr(self) -> str:
        return (f"clusters={self.clusters}, bits={self.bits}, iterations={self.iterations}, "
                f"topk={self.topk}")

    def forward(self, q, k, v, lengths=None):
        padded = lengths is not None
        lengths = check_inputs(q, k, v, lengths, attention=self)
        if q.numel() == 0 or v.numel() == 0:
            return empty_attention(q, k, v)
        with autocast_disabled(q.device):
            return self._attend(q, k, v, lengths, padded)

    def _triton_top_attention(self, q) -> bool:
        """Whether the top-key part runs as clustered_triton's kernels (the triton kernel route)."""
        if kernel_route(q, self.clusters) != "triton":
            return False
        from .clustered_triton import top_attention
        return top_attention.supports(q, self.topk)

    def _attend(self, q, k, v, lengths, padded):
        dtype = kernel_dtype(q.dtype, q.device)
        q, k, v, input_dtype = q.to(dtype), k.to(dtype), v.to(dtype), q.dtype
        clusters = cluster_queries(q, lengths, self.clusters, self.bits, self.iterations)
        scale = 1.0 / math.sqrt(q.shape[-1])
        if q.device.type == "cpu" and kernel_route(q, self.clusters) == "extension":   # A^c never whole
            return ImprovedClusteredCPU.apply(q, k, v, lengths, clusters, scale, self.topk).to(input_dtype)
        attention = centroid_attention(q, k, lengths, clusters, padded)          # A^c, eq. 4
        topk = top_keys(attention, lengths, self.topk)                           # T
        if self._triton_top_attention(q):   # eq. 9-11, 15-17 in one launch each way
            from .clustered_triton.top_attention import top_attention
            full = torch.matmul(attention, v)                                    # F = A^c V
            out = top_attention(q, k, v, attention, full, topk, clusters.offsets, clusters.members, scale)
            return out.to(input_dtype)
        mass, attention_rest = SplitTopMass.apply(attention, topk)               # m_j, eq. 9
        bottom_values = torch.matmul(attention_rest, v)                          # V^b_j, eq. 17
        dots = ClusteredSparseDot.apply(q, k, topk, clusters, scale)
        weights = torch.softmax(dots, dim=-1) * ClusterBroadcast.apply(mass, clusters)
        top_values = ClusteredSparseWeightedSum.apply(weights, v, topk, clusters)  # V^t_i, eq. 16
        return (top_values + ClusterBroadcast.apply(bottom_values, clusters)).to(input_dtype)  # eq. 15
