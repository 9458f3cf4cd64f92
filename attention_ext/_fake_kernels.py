"""Fake (meta) implementations of the compiled operators torch.ops.attention_ext.*.

torch.compile and torch.export run a model on fake tensors (shapes, dtypes and devices, no data)
to trace it; an operator defined in C++ (csrc/*.cpp, TORCH_LIBRARY_FRAGMENT) needs a Python
function that gives its outputs' metadata without computing them. Each one below returns exactly
the shapes, dtypes and (contiguous) layouts that the CPU and CUDA kernels allocate; see the
operator's C++ file for what the outputs mean. `tests/attention_ext/test_compile.py` checks every
one against its kernel with torch.library.opcheck.

Imported by `_ops` once the kernels are loaded, so every `ops.*` has its fake implementation.
"""
from __future__ import annotations

import torch


def _fake(name: str):
    return torch.library.register_fake(f"attention_ext::{name}")


def _empty(like: torch.Tensor, *shape, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A contiguous tensor of `shape` on like's device, of like's dtype unless `dtype` is given."""
    return like.new_empty(shape, dtype=like.dtype if dtype is None else dtype)


# --- clustering.cpp -----------------------------------------------------------------------------

@_fake("hyperplane_hash")
def _hyperplane_hash(queries, planes, offsets, lengths):
    batch, heads, length, _ = queries.shape
    return _empty(queries, batch, heads, length, dtype=torch.long)          # codes


@_fake("hamming_kmeans_init")
def _hamming_kmeans_init(codes, lengths, clusters, seed):
    batch, heads, _ = codes.shape
    return _empty(codes, batch, heads, clusters)                              # centroids


@_fake("hamming_kmeans")
def _hamming_kmeans(codes, lengths, centroids, iterations, bits):
    return _empty(codes, *codes.shape), _empty(centroids, *centroids.shape)  # assignment, centroids


# --- cluster_ops.cpp ----------------------------------------------------------------------------

@_fake("group_by_cluster")
def _group_by_cluster(assignment, clusters):
    batch, heads, length = assignment.shape
    return _empty(assignment, batch, heads, clusters + 1), _empty(assignment, batch, heads, length)


@_fake("cluster_mean")
def _cluster_mean(x, offsets, members):
    batch, heads, _, dim = x.shape
    return _empty(x, batch, heads, offsets.shape[2] - 1, dim)


@_fake("cluster_mean_backward")
def _cluster_mean_backward(grad, assignment, offsets):
    batch, heads, _, dim = grad.shape
    return _empty(grad, batch, heads, assignment.shape[2], dim)


@_fake("cluster_broadcast")
def _cluster_broadcast(x, assignment):
    batch, heads, _, dim = x.shape
    return _empty(x, batch, heads, assignment.shape[2], dim)


@_fake("cluster_broadcast_backward")
def _cluster_broadcast_backward(grad, offsets, members):
    batch, heads, _, dim = grad.shape
    return _empty(grad, batch, heads, offsets.shape[2] - 1, dim)


@_fake("cluster_topk")
def _cluster_topk(weights, lengths, k):
    batch, heads, rows, length = weights.shape
    return _empty(weights, batch, heads, rows, torch.sym_min(k, length), dtype=torch.long)


# --- centroid_attention.cpp ---------------------------------------------------------------------

@_fake("centroid_attention")
def _centroid_attention(centroids, k, v, lengths):
    batch, heads, clusters, _ = centroids.shape
    return (_empty(v, batch, heads, clusters, v.shape[-1]),                   # values
            _empty(v, batch, heads, clusters))                                # logsumexp


@_fake("centroid_attention_backward")
def _centroid_attention_backward(grad, centroids, k, v, lengths, values, logsumexp):
    return _empty(centroids, *centroids.shape), _empty(k, *k.shape), _empty(v, *v.shape)


@_fake("centroid_attention_top")
def _centroid_attention_top(centroids, k, v, lengths, topk):
    batch, heads, clusters, _ = centroids.shape
    slots = min(topk, k.shape[2])
    return (_empty(v, batch, heads, clusters, v.shape[-1]),                   # V^b
            _empty(v, batch, heads, clusters),                                # mass
            _empty(v, batch, heads, clusters, slots, dtype=torch.long),       # top
            _empty(v, batch, heads, clusters))                                # logsumexp


@_fake("centroid_attention_top_backward")
def _centroid_attention_top_backward(grad_rest, grad_mass, centroids, k, v, lengths, rest, mass, top, logsumexp,
                                     grad_k, grad_v):
    return _empty(centroids, *centroids.shape)   # the key and value gradients are added into grad_k, grad_v


# --- sparse_product.cpp -------------------------------------------------------------------------

@_fake("clustered_sparse_dot")
def _clustered_sparse_dot(q, k, topk, offsets, members, scale):
    batch, heads, length, _ = q.shape
    return _empty(q, batch, heads, length, topk.shape[3])


@_fake("clustered_sparse_dot_backward")
def _clustered_sparse_dot_backward(grad, q, k, topk, offsets, members, scale):
    return _empty(q, *q.shape), _empty(k, *k.shape)                           # grad_q, grad_k


@_fake("clustered_sparse_weighted_sum")
def _clustered_sparse_weighted_sum(weights, v, topk, offsets, members):
    batch, heads, length, _ = weights.shape
    return _empty(v, batch, heads, length, v.shape[3])


@_fake("clustered_sparse_weighted_sum_backward")
def _clustered_sparse_weighted_sum_backward(grad, weights, v, topk, offsets, members):
    return _empty(weights, *weights.shape), _empty(v, *v.shape)               # grad_weights, grad_v


# --- clustered_top_attention.cpp ----------------------------------------------------------------

@_fake("clustered_top_attention")
def _clustered_top_attention(q, k, v, topk, offsets, members, mass, rest, scale):
    batch, heads, length, _ = q.shape
    return (_empty(v, batch, heads, length, v.shape[3]),                    # out
            _empty(q, batch, heads, length, topk.shape[3]))                 # weights


@_fake("clustered_top_attention_backward")
def _clustered_top_attention_backward(grad_out, q, k, v, topk, offsets, members, mass, weights, scale):
    batch, heads, clusters = mass.shape
    return (_empty(q, *q.shape), _empty(k, *k.shape), _empty(v, *v.shape),  # grad_q, grad_k, grad_v
            _empty(mass, *mass.shape),                                       # grad_mass
            _empty(v, batch, heads, clusters, v.shape[3]))                   # grad_rest


# --- lsh/ ---------------------------------------------------------------------------------------

@_fake("lsh_hash")
def _lsh_hash(q, rotations, lengths, half_buckets):
    batch, heads, length, _ = q.shape
    rounds = rotations.shape[3]
    # int64 on the device of lengths (the kernels allocate with lengths' options)
    return (_empty(lengths, batch, heads, rounds, length, dtype=torch.long),
            _empty(lengths, batch, heads, rounds, length, dtype=torch.long))  # buckets, order


def _opmath(dtype: torch.dtype) -> torch.dtype:
    """The dtype LSH's log-sum-exp is kept in: float32 for half-precision inputs."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


@_fake("lsh_attention_forward")
def _lsh_attention_forward(q, v, order, lengths, chunk_size):
    batch, heads, length, _ = q.shape
    return _empty(v, *v.shape), _empty(q, batch, heads, length, dtype=_opmath(q.dtype))  # out, lse


@_fake("lsh_attention_backward")
def _lsh_attention_backward(grad_out, q, v, order, lengths, out, lse, chunk_size):
    return _empty(q, *q.shape), _empty(v, *v.shape)                           # grad_q, grad_v
