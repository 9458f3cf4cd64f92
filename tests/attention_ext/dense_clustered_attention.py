"""The equations of clustered and improved clustered attention (Vyas et al. 2020,
eq. 3-6, 9-11) written with dense matrices, for small N only.

Independent of attention_ext's kernels: given a cluster assignment (and for the improved
version the top-k sets), everything is plain torch math on one-hot S (N x C), the
centroids Q^c, the clustered attention A^c (C x N), the top-k mask T (C x N) and the
improved attention A^t (N x N). All functions work on (B, H, ...) batches, and
autograd through them gives the reference gradients.
"""
import math

import torch


def key_mask(lengths, length):
    """(B, 1, 1, N) True on valid keys; a length-0 sequence keeps key 0 (no empty softmax)."""
    return (torch.arange(length) < lengths.clamp(min=1)[:, None])[:, None, None, :]


def one_hot_clusters(assignment, clusters, dtype):
    """S: (B, H, N, C) with S[i, j] = 1 when query i is in cluster j (padded rows are 0)."""
    valid = assignment >= 0
    one_hot = torch.nn.functional.one_hot(assignment.clamp(min=0), clusters).to(dtype)
    return one_hot * valid[..., None]


def centroids(q, membership):
    """eq. 3: Q^c_j = sum_i S_ij Q_i / sum_i S_ij (zero for an empty cluster)."""
    counts = membership.sum(2)[..., None]                            # (B, H, C, 1)
    return (membership.transpose(-1, -2) @ q) / counts.clamp(min=1)


def centroid_attention(q, k, lengths, assignment, clusters):
    """eq. 4: A^c = softmax(Q^c K^T / sqrt(E)) over the valid keys, (B, H, C, N)."""
    membership = one_hot_clusters(assignment, clusters, q.dtype)
    scores = centroids(q, membership) @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    return torch.softmax(scores.masked_fill(~key_mask(lengths, k.shape[2]), float("-inf")), -1)


def clustered_attention(q, k, v, lengths, assignment, clusters):
    """eq. 5-6: V_i = sum_j S_ij (A^c V)_j."""
    membership = one_hot_clusters(assignment, clusters, q.dtype)
    return membership @ (centroid_attention(q, k, lengths, assignment, clusters) @ v)


def full_attention_matrix(q, k, lengths):
    """A = softmax(Q K^T / sqrt(E)) over the valid keys, (B, H, N, N); padded query rows 0."""
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    attention = torch.softmax(scores.masked_fill(~key_mask(lengths, k.shape[2]), float("-inf")), -1)
    valid_query = (torch.arange(q.shape[2]) < lengths[:, None])[:, None, :, None]
    return attention * valid_query


def topk_mask(attention, lengths, topk):
    """T: (B, H, C, N) bool, each row's `topk` largest entries among the valid keys
    (all valid keys when there are fewer)."""
    length = attention.shape[-1]
    mask = torch.zeros_like(attention, dtype=torch.bool)
    for b, valid in enumerate(lengths.tolist()):
        kept = min(topk, valid)
        if kept == 0:
            continue
        index = attention[b, :, :, :valid].topk(kept, dim=-1).indices
        mask[b].scatter_(-1, index, True)
    assert mask.shape[-1] == length
    return mask


def improved_attention_matrix(q, k, lengths, assignment, clusters, top):
    """eq. 9-10: A^t (B, H, N, N). For query i of cluster j, on T_j:
    m_j * softmax over T_j of q_i k_l / sqrt(E), with m_j = sum_{l in T_j} A^c_jl;
    elsewhere A^c_jl. Padded query rows are 0."""
    membership = one_hot_clusters(assignment, clusters, q.dtype)     # (B, H, N, C)
    attention_c = centroid_attention(q, k, lengths, assignment, clusters)
    mass = (attention_c * top).sum(-1, keepdim=True)                 # (B, H, C, 1)
    per_query_c = membership @ attention_c                           # (B, H, N, N)
    per_query_top = (membership @ top.to(q.dtype)) > 0.5
    per_query_mass = membership @ mass                               # (B, H, N, 1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    has_top = per_query_top.any(-1, keepdim=True)
    scores = scores.masked_fill(~per_query_top, float("-inf")).masked_fill(~has_top, 0.0)
    exact = torch.softmax(scores, -1) * per_query_top
    return torch.where(per_query_top, per_query_mass * exact, per_query_c)


def improved_clustered_attention(q, k, v, lengths, assignment, clusters, top):
    """eq. 11: V = A^t V."""
    return improved_attention_matrix(q, k, lengths, assignment, clusters, top) @ v
