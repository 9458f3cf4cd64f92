"""Triton kernels of i-clustered attention's top-key part (eq. 9-11, 15-17), one program per
(batch, head, cluster): the cluster's top keys K_T, V_T (S slots) and their centroid weights a
are loaded once, then its member queries are taken in blocks of BLOCK_M rows (the member lists of
QueryClusters). For query i of cluster j, with m_j = sum_s a_js and F_j = (A^c V)_j:

    out_i = m_j * softmax_s(scale q_i . k_s) V_T + F_j - sum_s a_js v_s

(the last two terms are V^b_j = sum over the keys not in T_j of A^c_jl v_l, eq. 17). Program
(g, C) writes the zero rows of the padded queries. The backward recomputes the softmax; the
keys and values of T_j get gradients from every member, summed in the program and added to the
(float32) key and value gradients atomically, since clusters share keys.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _cluster_keys(k_ptr, v_ptr, attention_ptr, top_ptr, g, j, clusters, length, dim, top_slots,
                  S_PAD: tl.constexpr, E_PAD: tl.constexpr):
    """(top keys, present, K_T (S, E), V_T (S, E), a (S,) float32) of cluster j of (batch, head) g."""
    slot = tl.arange(0, S_PAD)
    columns = tl.arange(0, E_PAD)
    top = tl.load(top_ptr + (g * clusters + j) * top_slots + slot, mask=slot < top_slots, other=-1)
    present = top >= 0
    key = tl.where(present, top, 0)
    ok = present[:, None] & (columns < dim)[None, :]
    rows = g * length * dim + key[:, None] * dim + columns[None, :]
    keys = tl.load(k_ptr + rows, mask=ok, other=0.0)
    values = tl.load(v_ptr + rows, mask=ok, other=0.0)
    weights = tl.load(attention_ptr + (g * clusters + j) * length + key, mask=present, other=0.0).to(tl.float32)
    return key, present, keys, values, weights


@triton.jit
def _member_softmax(q_ptr, members_ptr, g, start, end, keys, present, length, dim, scale,
                    BLOCK_M: tl.constexpr, E_PAD: tl.constexpr, IEEE: tl.constexpr):
    """(member positions, their row offsets, row mask, their queries, softmax weights (M, S) float32)
    for the members start..end-1 (at most BLOCK_M) of a cluster."""
    row = tl.arange(0, BLOCK_M)
    columns = tl.arange(0, E_PAD)
    member_ok = (start + row) < end
    member = tl.load(members_ptr + g * length + start + row, mask=member_ok, other=0)
    offsets = g * length * dim + member[:, None] * dim + columns[None, :]
    ok = member_ok[:, None] & (columns < dim)[None, :]
    queries = tl.load(q_ptr + offsets, mask=ok, other=0.0)
    if IEEE:
        dots = tl.dot(queries.to(tl.float32), tl.trans(keys.to(tl.float32)), input_precision="ieee")
    else:
        dots = tl.dot(queries, tl.trans(keys), out_dtype=tl.float32)
    dots = tl.where(present[None, :], dots * scale, float("-inf"))
    weights = tl.exp(dots - tl.max(dots, 1)[:, None])
    return offsets, ok, queries, weights / tl.sum(weights, 1)[:, None]


@triton.jit
def _zero_padded_rows(out_ptr, offsets_ptr, g, clusters, length, dim, BLOCK_M: tl.constexpr, E_PAD: tl.constexpr):
    """Rows valid..N-1 of (batch, head) g set to 0 (valid = the clustered queries)."""
    valid = tl.load(offsets_ptr + g * (clusters + 1) + clusters)
    row = tl.arange(0, BLOCK_M)
    columns = tl.arange(0, E_PAD)
    for start in range(valid, length, BLOCK_M):
        ok = ((start + row) < length)[:, None] & (columns < dim)[None, :]
        tl.store(out_ptr + g * length * dim + (start + row)[:, None] * dim + columns[None, :],
                 tl.zeros([BLOCK_M, E_PAD], dtype=out_ptr.dtype.element_ty), mask=ok)


@triton.jit
def top_attention_forward_kernel(q_ptr, k_ptr, v_ptr, attention_ptr, full_ptr, top_ptr, offsets_ptr, members_ptr,
                                 out_ptr, clusters, length, dim, top_slots, scale,
                                 BLOCK_M: tl.constexpr, S_PAD: tl.constexpr, E_PAD: tl.constexpr,
                                 IEEE: tl.constexpr):
    g = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1).to(tl.int64)
    if j == clusters:
        _zero_padded_rows(out_ptr, offsets_ptr, g, clusters, length, dim, BLOCK_M, E_PAD)
    else:
        columns = tl.arange(0, E_PAD)
        key, present, keys, values, a = _cluster_keys(k_ptr, v_ptr, attention_ptr, top_ptr, g, j, clusters,
                                                      length, dim, top_slots, S_PAD, E_PAD)
        mass = tl.sum(a, 0)
        full = tl.load(full_ptr + (g * clusters + j) * dim + columns, mask=columns < dim, other=0.0)
        rest = full.to(tl.float32) - tl.sum(a[:, None] * values.to(tl.float32), 0)   # V^b_j
        start = tl.load(offsets_ptr + g * (clusters + 1) + j)
        end = tl.load(offsets_ptr + g * (clusters + 1) + j + 1)
        for first in range(start, end, BLOCK_M):
            offsets, ok, _, weights = _member_softmax(q_ptr, members_ptr, g, first, end, keys, present, length,
                                                      dim, scale, BLOCK_M, E_PAD, IEEE)
            if IEEE:
                top = tl.dot(weights, values, input_precision="ieee")
            else:
                top = tl.dot(weights.to(values.dtype), values, out_dtype=tl.float32)
            out = mass * top + rest[None, :]
            tl.store(out_ptr + offsets, out.to(out_ptr.dtype.element_ty), mask=ok)


@triton.jit
def top_attention_backward_kernel(grad_ptr, q_ptr, k_ptr, v_ptr, attention_ptr, top_ptr, offsets_ptr, members_ptr,
                                  grad_q_ptr, grad_k_ptr, grad_v_ptr, grad_attention_ptr, grad_full_ptr,
                                  clusters, length, dim, top_slots, scale,
                                  BLOCK_M: tl.constexpr, S_PAD: tl.constexpr, E_PAD: tl.constexpr):
    """grad_q rows (and 0 for padded queries), grad_k, grad_v (float32, added to), grad of A^c at
    (j, T_j) (its other entries stay as they are: 0), grad_full (C, E) = sum of the members' grads.
    float32 products throughout (the backward is not where the time goes)."""
    g = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1).to(tl.int64)
    if j == clusters:
        _zero_padded_rows(grad_q_ptr, offsets_ptr, g, clusters, length, dim, BLOCK_M, E_PAD)
    else:
        columns = tl.arange(0, E_PAD)
        key, present, keys, values, a = _cluster_keys(k_ptr, v_ptr, attention_ptr, top_ptr, g, j, clusters,
                                                      length, dim, top_slots, S_PAD, E_PAD)
        keys = keys.to(tl.float32)
        values = values.to(tl.float32)
        mass = tl.sum(a, 0)
        grad_keys = tl.zeros([S_PAD, E_PAD], dtype=tl.float32)
        grad_values = tl.zeros([S_PAD, E_PAD], dtype=tl.float32)
        grad_sum = tl.zeros([E_PAD], dtype=tl.float32)
        grad_mass = tl.zeros([E_PAD], dtype=tl.float32)   # summed over the columns at the end
        start = tl.load(offsets_ptr + g * (clusters + 1) + j)
        end = tl.load(offsets_ptr + g * (clusters + 1) + j + 1)
        for first in range(start, end, BLOCK_M):
            offsets, ok, queries, weights = _member_softmax(q_ptr, members_ptr, g, first, end, keys, present, length,
                                                            dim, scale, BLOCK_M, E_PAD, True)
            grad = tl.load(grad_ptr + offsets, mask=ok, other=0.0).to(tl.float32)
            top = tl.dot(weights, values, input_precision="ieee")                      # (M, E)
            grad_weights = mass * tl.dot(grad, tl.trans(values), input_precision="ieee")  # (M, S)
            grad_dots = weights * (grad_weights - tl.sum(weights * grad_weights, 1)[:, None])
            grad_queries = scale * tl.dot(grad_dots, keys, input_precision="ieee")
            tl.store(grad_q_ptr + offsets, grad_queries.to(grad_q_ptr.dtype.element_ty), mask=ok)
            grad_keys += scale * tl.dot(tl.trans(grad_dots), queries.to(tl.float32), input_precision="ieee")
            grad_values += mass * tl.dot(tl.trans(weights), grad, input_precision="ieee")
            grad_sum += tl.sum(grad, 0)
            grad_mass += tl.sum(grad * top, 0)
        grad_values -= a[:, None] * grad_sum[None, :]
        # A^c_js enters through m_j (every slot) and through V^b_j (minus its value)
        grad_a = tl.sum(grad_mass, 0) - tl.sum(values * grad_sum[None, :], 1)
        ok = present[:, None] & (columns < dim)[None, :]
        rows = g * length * dim + key[:, None] * dim + columns[None, :]
        tl.atomic_add(grad_k_ptr + rows, grad_keys, mask=ok)
        tl.atomic_add(grad_v_ptr + rows, grad_values, mask=ok)
        tl.store(grad_attention_ptr + (g * clusters + j) * length + key,
                 grad_a.to(grad_attention_ptr.dtype.element_ty), mask=present)
        tl.store(grad_full_ptr + (g * clusters + j) * dim + columns,
                 grad_sum.to(grad_full_ptr.dtype.element_ty), mask=columns < dim)
