"""i-clustered attention's top-key part (eq. 9-11, 15-17) as one Triton launch forward and one
backward (top_attention_kernels.py), behind `attention_ext_triton::top_attention`. The extension's
CUDA route takes about 16 launches forward for it (SplitTopMass's gathers and scatters, V^b's
product, two sparse products around a softmax, two broadcasts) and more backward.

Given A^c (B, H, C, N), F = A^c V (B, H, C, E), the top keys T (B, H, C, S) (-1: no key) and
the clusters' member lists, it returns m_j softmax_T(scale q_i K_T^T) V_T + V^b_j for every
query i of cluster j, with V^b_j = F_j - sum_{l in T_j} A^c_jl v_l, and zeros for padded
queries. Gradients: q, k, v, A^c (at T only) and F; T and the clusters are not differentiated.
"""
from __future__ import annotations

import torch
import triton

from .top_attention_kernels import top_attention_backward_kernel, top_attention_forward_kernel

# K_T, V_T and their gradients sit in registers: up to 64 top keys and head dim 128 the kernels spill
# (almost) nothing to local memory (ptxas -v for sm_90); 128 keys spilled kilobytes in the backward.
MAX_SLOTS = 64
MAX_DIM = 128
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def supports(q: torch.Tensor, topk: int) -> bool:
    """Whether the top-key kernels take q (B, H, N, E) with `topk` keys per cluster."""
    return q.dtype in DTYPES and q.shape[-1] <= MAX_DIM and min(topk, q.shape[2]) <= MAX_SLOTS


def _blocks(q: torch.Tensor, top: torch.Tensor, backward: bool) -> dict:
    """Members per block (64 where clusters are large, forward only), the padded key slots and head
    dim, and the warps that keep these tiles in registers (ptxas -v for sm_90)."""
    large = not backward and q.shape[2] > 64 * top.shape[2]
    return dict(BLOCK_M=64 if large else 16, S_PAD=max(16, triton.next_power_of_2(top.shape[-1])),
                E_PAD=max(16, triton.next_power_of_2(q.shape[-1])), num_warps=8 if large or backward else 4)


# Opaque custom operators (torch.library.custom_op), as the extension's: torch.compile and CUDA graphs
# take them as they are. (torch.library.triton_op would let inductor see the launches, but under Triton's
# interpreter it runs the kernels on fake tensors, so the compile tests could not run in CI.)
@torch.library.custom_op("attention_ext_triton::top_attention", mutates_args=())
def top_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attention: torch.Tensor, full: torch.Tensor,
                  top: torch.Tensor, offsets: torch.Tensor, members: torch.Tensor, scale: float) -> torch.Tensor:
    """(B, H, N, E): eq. 15-17 for every query (see the module docstring)."""
    batch, heads, length, dim = q.shape
    clusters = top.shape[2]
    q, k, v, attention, full, top = (t.contiguous() for t in (q, k, v, attention, full, top))
    out = torch.empty_like(q)
    if out.numel() == 0:
        return out
    top_attention_forward_kernel[(batch * heads, clusters + 1)](
        q, k, v, attention, full, top, offsets.contiguous(), members.contiguous(), out,
        clusters, length, dim, top.shape[-1], scale, IEEE=q.dtype == torch.float32, **_blocks(q, top, False))
    return out


@torch.library.custom_op("attention_ext_triton::top_attention_backward", mutates_args=())
def top_attention_backward(grad: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           attention: torch.Tensor, top: torch.Tensor, offsets: torch.Tensor, members: torch.Tensor,
                           scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                                  torch.Tensor]:
    """Gradients of top_attention for q, k, v, attention and full."""
    batch, heads, length, dim = q.shape
    clusters = top.shape[2]
    grad, q, k, v, attention, top = (t.contiguous() for t in (grad, q, k, v, attention, top))
    grad_q = torch.empty_like(q)
    grad_k = torch.zeros(k.shape, dtype=torch.float32, device=k.device)   # added to atomically
    grad_v = torch.zeros(v.shape, dtype=torch.float32, device=v.device)
    grad_attention = torch.zeros_like(attention)
    grad_full = q.new_empty(batch, heads, clusters, dim)
    if q.numel() > 0:
        top_attention_backward_kernel[(batch * heads, clusters + 1)](
            grad, q, k, v, attention, top, offsets.contiguous(), members.contiguous(),
            grad_q, grad_k, grad_v, grad_attention, grad_full,
            clusters, length, dim, top.shape[-1], scale, **_blocks(q, top, True))
    return grad_q, grad_k.to(k.dtype), grad_v.to(v.dtype), grad_attention, grad_full


@top_attention.register_fake
def _(q, k, v, attention, full, top, offsets, members, scale):
    return torch.empty_like(q)


@top_attention_backward.register_fake
def _(grad, q, k, v, attention, top, offsets, members, scale):
    return (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), torch.empty_like(attention),
            q.new_empty(q.shape[0], q.shape[1], top.shape[2], q.shape[3]))


def _setup_context(ctx, inputs, output):
    q, k, v, attention, _, top, offsets, members, scale = inputs
    ctx.save_for_backward(q, k, v, attention, top, offsets, members)
    ctx.scale = scale


def _backward(ctx, grad):
    q, k, v, attention, top, offsets, members = ctx.saved_tensors
    grads = top_attention_backward(grad, q, k, v, attention, top, offsets, members, ctx.scale)
    return (*grads, None, None, None, None)


top_attention.register_autograd(_backward, setup_context=_setup_context)
