"""The query clustering as one Triton launch per call (clustering_kernel.py), behind the operator
`attention_ext_triton::cluster_queries`, which returns what the extension's route returns
(attention_ext.attentions.clustered._cluster_queries_op): (assignment, offsets, members), with the same random
draws in the same order (planes, plane offsets, then one seed), so a seeded call clusters alike on
either route (up to a projection within rounding of its threshold).

Launches per call: the two draws of the planes and offsets, the projections' cast and matrix product
(cuBLAS, float32 as the extension's route), and the kernel.
"""
from __future__ import annotations

import torch
import triton

from ...contract import draw_clustering
from . import triton_interpreted
from .clustering_kernel import cluster_queries_kernel

# The kernel holds a (clusters x 64) bit matrix and counts in registers: up to 256 cluster slots.
MAX_SLOTS = 256
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# One program runs per (batch, head), so it takes a whole SM's warps: 16 warps with BLOCK_N x slots = 8192
# need at most 128 registers a thread and spill nothing from 16 to 256 slots (ptxas -v for sm_90).
_WARPS = 16


def supports(q: torch.Tensor, clusters: int) -> bool:
    """Whether this clustering takes q (B, H, N, E) with `clusters`: float32 or half precision and
    at most MAX_SLOTS cluster slots (min(clusters, N))."""
    return q.dtype in DTYPES and min(clusters, q.shape[2]) <= MAX_SLOTS


def _slots(clusters: int, length: int) -> int:
    return max(1, min(clusters, length))


def cluster_with_draws(q: torch.Tensor, lengths: torch.Tensor, clusters: int, iterations: int,
                       planes: torch.Tensor, plane_offsets: torch.Tensor, seed: int):
    """The clustering for given random draws: planes (bits, E), plane offsets (bits,) and the seed
    of the initial centroids. Returns (assignment (B, H, N), offsets (B, H, S + 1), members
    (B, H, N), centroids (B, H, S)), int64, S = min(clusters, N) cluster slots."""
    batch, heads, length, _ = q.shape
    bits, slots, groups = planes.shape[0], _slots(clusters, length), batch * heads
    projections = torch.matmul(q.detach().to(planes.dtype), planes.t()).contiguous()   # (B, H, N, bits)
    plane_offsets = plane_offsets.to(q.device).contiguous()
    lengths = lengths.to(q.device, torch.int64).contiguous()
    long = dict(dtype=torch.int64, device=q.device)
    assignment = torch.empty(batch, heads, length, **long)
    offsets = torch.empty(batch, heads, slots + 1, **long)
    members = torch.empty(batch, heads, length, **long)
    centroids = torch.empty(batch, heads, slots, **long)
    if assignment.numel() == 0:
        return assignment, offsets.zero_(), members, centroids.zero_()
    counts = torch.empty(batch, heads, slots, **long)
    codes = torch.empty(groups, length, **long)
    order = torch.empty(groups, length, dtype=torch.int32, device=q.device)
    slot_block = max(16, triton.next_power_of_2(slots))
    cluster_queries_kernel[(groups,)](
        projections, plane_offsets, lengths, codes, order, assignment, counts, offsets, members, centroids,
        seed, heads, length, slots, bits, iterations,
        BLOCK_N=max(16, min(128, 8192 // slot_block)), C_PAD=slot_block, BITS=64, PTX=not triton_interpreted(),
        num_warps=_WARPS)
    return assignment, offsets, members, centroids


# An opaque operator with its random draws inside, as the extension's route (clustered.py says why).
@torch.library.custom_op("attention_ext_triton::cluster_queries", mutates_args=(),
                         tags=(torch.Tag.nondeterministic_seeded,))
def cluster_queries_op(q: torch.Tensor, lengths: torch.Tensor, clusters: int, bits: int,
                       iterations: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(assignment, offsets, members) of attention_ext.attentions.clustered.cluster_queries, for q without gradient."""
    planes, plane_offsets, seed = draw_clustering(q, bits)   # as the extension's route draws them
    return cluster_with_draws(q, lengths, clusters, iterations, planes, plane_offsets, seed)[:3]


@cluster_queries_op.register_fake
def _(q, lengths, clusters, bits, iterations):
    batch, heads, length, _ = q.shape
    slots = torch.sym_max(1, torch.sym_min(clusters, length))
    long = dict(dtype=torch.long)
    return (q.new_empty((batch, heads, length), **long), q.new_empty((batch, heads, slots + 1), **long),
            q.new_empty((batch, heads, length), **long))
