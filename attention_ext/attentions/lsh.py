"""Reformer LSH attention (Kitaev et al. 2020) for shared queries and keys.

    attn = build_attention("lsh", rounds=4, chunk_size=32)   # max_buckets=256 by default
    out = attn(q, q, v, lengths)          # k must be q: a model with shared QK projections

What one call does, per sequence b of valid length L and per head:

1. Keys are the unit-normalised queries (see `shared_full`: the Reformer conventions,
   including "no attention to self unless nothing else is there").
2. Hashing, `rounds` times independently: draw a random rotation R of shape
   (E, n_buckets / 2) and put each valid key x in bucket argmax([xR, -xR]).
   n_buckets = `lsh_bucket_count(L, chunk_size, max_buckets)`:
   min(the smallest even number >= L / chunk_size, at least 2; max_buckets), so a bucket
   holds about one chunk up to max_buckets * chunk_size positions (8,192 with the defaults)
   and more beyond. It depends on the sequence's own length, not on the padded length.
3. The valid positions are sorted by (bucket, position) and the sorted order is cut into
   chunks of chunk_size (the last one may be shorter). Each chunk's queries attend to the
   keys of their own chunk and of the previous chunk, cyclically (chunk 0 looks at the
   last chunk); with a single chunk only the chunk itself, so no key is counted twice.
   Padded positions take no part.
4. Rounds are combined by their log-sum-exp, o = sum_r exp(lse_r - logsumexp_r lse_r) o_r,
   with duplicates removed as in the paper's multi-round attention (its appendix): in round
   r the logit of key j is lowered by log(n_ij), n_ij being the number of rounds whose
   window of query i holds j. The result is exactly softmax attention over the union of
   the rounds' windows, every key counted once.

Decision, the cap `max_buckets` (even, >= 2, default 256): hashing projects each position on
n_buckets / 2 directions, so with one bucket per chunk its arithmetic grows with the square of
L; capped, it is linear in L. The Reformer paper treats the bucket count as a hyper-parameter,
and a bucket larger than a chunk only means that the sorted order cuts it into several chunks,
which step 3 already handles (as it does a bucket that spills over into the next chunk). Below
the cap the rule is the uncapped one, bit for bit: with the defaults every sequence up to 8,192
positions hashes, sorts and attends exactly as before the cap existed, and so does every model
trained in this project (none has seen sequences that long).

Randomness: on the CPU one seed is drawn from torch's default generator per call
(`contract.draw_seed`); the rotations of batch element b come from a generator seeded
with (seed, b). So `torch.manual_seed(s)` makes a call repeatable, and a sequence gets the
same rotations, buckets and output alone and at index 0 of a padded batch. On CUDA a forward
call draws its rotations on the device instead (`lsh_hash_on_device`: no host read, so a CUDA
graph can hold it; still repeatable under `torch.manual_seed`, but a sequence's rotations
depend on its batch's shape). `LSHAttention.hash` and `lsh_hash` with a seed give the CPU's
rotations on either device.

Hashing (projection, bucket, sort) and the chunked attention (forward and backward) are
C++ kernels in csrc/lsh/ (`lsh_hash` in hashing.cpp, `lsh_attention_forward` and
`lsh_attention_backward` in attention_forward.cpp and attention_backward.cpp) and CUDA kernels for
the same operators in csrc/lsh/lsh_cuda.cu. Dtypes (`contract.kernel_dtype`):
float32 and float64 everywhere, float16 and bfloat16 natively on CUDA (float32 accumulation and
a float32 log-sum-exp), in float32 on the CPU; the rotations are float32 (float64 for float64
inputs) on both devices, so `lsh_hash` with a seed draws the same rotations on either. Autocast is off
inside the attention: it computes in the dtype of q.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .._ops import ops
from ..contract import autocast_disabled, check_inputs, draw_seed, hashing_dtype, kernel_dtype
from ..registry import Option, register_attention

_SEED_STRIDE = 0x9E3779B97F4A7C15  # spreads consecutive batch indices over the seed space
DEFAULT_MAX_BUCKETS = 256         # the `max_buckets` option's default (see the module doc)


def lsh_bucket_count(length: int, chunk_size: int, max_buckets: int | None = None) -> int:
    """Buckets for a sequence of `length` valid positions: even, >= 2, about length / chunk_size,
    at most `max_buckets` (an even number >= 2; None: no cap)."""
    natural = 2 * max(1, math.ceil(length / (2 * chunk_size)))
    return natural if max_buckets is None else min(natural, max_buckets)


def _check_max_buckets(max_buckets: int) -> None:
    """The hashing functions' own check (the registry checks the option where it enters)."""
    if isinstance(max_buckets, bool) or not isinstance(max_buckets, int) or max_buckets < 2 or max_buckets % 2:
        raise ValueError(f"lsh: max_buckets={max_buckets!r} must be an even integer >= 2")


def lsh_rotations(seed: int, batch_index: int, heads: int, rounds: int, dim: int,
                  n_buckets: int) -> torch.Tensor:
    """The random rotations of one batch element: (heads, rounds, dim, n_buckets // 2) float32.

    Drawn from a CPU generator seeded with (seed, batch_index) only, so a sequence's
    rotations do not depend on what else is in the batch.
    """
    generator = torch.Generator().manual_seed((seed + _SEED_STRIDE * (batch_index + 1)) % 2**63)
    return torch.randn(heads, rounds, dim, n_buckets // 2, generator=generator)


@dataclass
class LSHHashing:
    """The outcome of hashing one batch: what the chunked attention needs, plus the rotations."""
    rotations: list[torch.Tensor]  # per batch element: (H, R, E, n_buckets_b / 2)
    n_buckets: list[int]           # per batch element
    buckets: torch.Tensor          # (B, H, R, N) int64; -1 at padded positions
    # (B, H, R, N) int64: the valid positions sorted by (bucket, position), then the padded ones
    order: torch.Tensor


def lsh_hash(queries: torch.Tensor, lengths: torch.Tensor, rounds: int, chunk_size: int,
             seed: int, max_buckets: int = DEFAULT_MAX_BUCKETS) -> LSHHashing:
    """Buckets and sorted order of the keys of `queries` (B, H, N, E) for every round (no gradient);
    sequence b has lsh_bucket_count(L_b, chunk_size, max_buckets) buckets.

    The bucket of a unit key k = q / ||q|| is argmax([kR, -kR]); a positive scale does not
    change the argmax, so the queries are projected as they are.
    """
    _check_max_buckets(max_buckets)
    batch, heads, length, dim = queries.shape
    # The rotations' shapes depend on the lengths, so they are read on the host, once (on a GPU
    # a synchronisation). What is drawn is put together on the host and goes to the GPU in one
    # copy that does not wait for it; the kernel gets the host lengths and bucket counts.
    lengths_host = lengths.cpu()
    n_buckets = [lsh_bucket_count(valid, chunk_size, max_buckets) for valid in lengths_host.tolist()]
    rotations = [lsh_rotations(seed, b, heads, rounds, dim, n_buckets[b]) for b in range(batch)]
    # The kernel takes every element's rotations zero-padded to one width, a multiple of 16
    # columns (its SIMD tiles), and uses the first n_buckets[b] / 2 of them.
    width = -(-max(n_buckets, default=2) // 32) * 16
    padded = torch.zeros(batch, heads, dim, rounds, width, dtype=hashing_dtype(queries.dtype))
    for b, rotation in enumerate(rotations):
        padded[b, :, :, :, :rotation.shape[-1]] = rotation.permute(0, 2, 1, 3)
    half_buckets = torch.tensor([n // 2 for n in n_buckets])
    buckets, order = ops.lsh_hash(queries.detach(), padded.to(queries.device, non_blocking=True),
                                  lengths_host, half_buckets)
    return LSHHashing(rotations, n_buckets, buckets, order)


def device_rotations(queries: torch.Tensor, rounds: int, chunk_size: int,
                     max_buckets: int = DEFAULT_MAX_BUCKETS) -> torch.Tensor:
    """The rotations of a CUDA forward call, (B, H, E, R, P), drawn on q's device from torch's
    generator there. P: n_buckets(N) / 2 for the padded length N (static; at most max_buckets / 2),
    in tiles of 16; sequence b uses its first lsh_bucket_count(L_b, chunk_size, max_buckets) / 2
    columns."""
    _check_max_buckets(max_buckets)
    batch, heads, length, dim = queries.shape
    width = -(-lsh_bucket_count(length, chunk_size, max_buckets) // 32) * 16
    return torch.randn(batch, heads, dim, rounds, width, dtype=hashing_dtype(queries.dtype),
                       device=queries.device)


def lsh_hash_on_device(queries: torch.Tensor, lengths: torch.Tensor, rounds: int,
                       chunk_size: int, max_buckets: int = DEFAULT_MAX_BUCKETS) -> torch.Tensor:
    """The sorted order (B, H, R, N) of a CUDA forward call, without reading anything on the host.

    `lsh_hash` needs each sequence's bucket count on the host to draw rotations of its width: on
    a GPU a synchronisation per call, which no CUDA graph can hold. Here the rotations are drawn
    on the device (`device_rotations`), from torch's CUDA generator (graph-safe: each replay of a
    captured graph draws anew; `torch.manual_seed` makes a call repeatable), at the width of the
    padded length N, which is static, and each sequence's bucket count is computed on the device
    from its length. The buckets follow `lsh_hash`'s rule; what differs is the random stream: a
    sequence's rotations depend on its batch's shape here, not on (seed, batch index) alone.
    """
    rotations = device_rotations(queries, rounds, chunk_size, max_buckets)
    valid = lengths.clamp(0, queries.shape[2])
    half_buckets = torch.div(valid + 2 * chunk_size - 1, 2 * chunk_size,
                             rounding_mode="floor").clamp(1, max_buckets // 2)
    return ops.lsh_hash(queries, rotations, valid, half_buckets)[1]


# The hashing of a forward call as one operator, its random draws included: torch.compile and
# torch.export keep it as one opaque call, so a compiled model draws the same rotations as an
# eager one with the same seed. On the CPU the rotations' shapes depend on each sequence's valid
# length, read on the host (free there); on CUDA `lsh_hash_on_device` reads nothing on the host.
# Tagged nondeterministic_seeded: never merged with another call, nor recomputed.
@torch.library.custom_op("attention_ext::lsh_sorted_order", mutates_args=(),
                         tags=(torch.Tag.nondeterministic_seeded,))
def _lsh_sorted_order_op(queries: torch.Tensor, lengths: torch.Tensor, rounds: int,
                         chunk_size: int, max_buckets: int) -> torch.Tensor:
    """The sorted order (B, H, R, N) int64 of a forward call: on the CPU
    `lsh_hash(queries, lengths, rounds, chunk_size, draw_seed(), max_buckets).order`, on CUDA
    `lsh_hash_on_device(queries, lengths, rounds, chunk_size, max_buckets)`."""
    if queries.is_cuda:
        return lsh_hash_on_device(queries, lengths, rounds, chunk_size, max_buckets)
    return lsh_hash(queries, lengths, rounds, chunk_size, draw_seed(), max_buckets).order


@_lsh_sorted_order_op.register_fake
def _(queries, lengths, rounds, chunk_size, max_buckets):
    _check_max_buckets(max_buckets)
    batch, heads, length, _ = queries.shape
    return lengths.new_empty((batch, heads, rounds, length), dtype=torch.long)


class _LSHChunkedAttentionFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, v, order, lengths, chunk_size):
        out, lse = ops.lsh_attention_forward(q, v, order, lengths, chunk_size)
        ctx.save_for_backward(q, v, order, lengths, out, lse)
        ctx.chunk_size = chunk_size
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        q, v, order, lengths, out, lse = ctx.saved_tensors
        grad_q, grad_v = ops.lsh_attention_backward(
            grad_out, q, v, order, lengths, out, lse, ctx.chunk_size)
        return grad_q, grad_v, None, None, None


def lsh_chunked_attention(q: torch.Tensor, v: torch.Tensor, order: torch.Tensor,
                          lengths: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """The attention step of LSH for a given sorted order (B, H, R, N), differentiable in q and v.

    The keys are q / ||q|| (computed inside the kernel, gradient included); the self mask,
    the chunk windows and the multi-round combination are those of the module doc. Any
    permutation of each sequence's valid positions is accepted as a round's order.
    """
    return _LSHChunkedAttentionFunction.apply(q, v, order, lengths, chunk_size)


@register_attention("lsh", options=(
    Option("rounds", 1, 1, help="independent hashing rounds, combined by log-sum-exp"),
    Option("chunk_size", 32, 1, help="positions per chunk of the sorted buckets"),
    Option("max_buckets", DEFAULT_MAX_BUCKETS, 2, multiple_of=2,
           help="most buckets per round (below it one per chunk); keeps hashing linear in N"),
), summary="Reformer LSH attention (needs shared QK: k = q)",
   needs_shared_qk=True, number_option="rounds")
class LSHAttention(torch.nn.Module):
    """Reformer LSH attention: `rounds` hashing rounds, chunks of `chunk_size`, at most
    `max_buckets` buckets (see module doc)."""

    def __init__(self, rounds: int = 1, chunk_size: int = 32, max_buckets: int = DEFAULT_MAX_BUCKETS):
        super().__init__()
        self.rounds = rounds
        self.chunk_size = chunk_size
        self.max_buckets = max_buckets

    def extra_repr(self) -> str:
        return f"rounds={self.rounds}, chunk_size={self.chunk_size}, max_buckets={self.max_buckets}"

    def hash(self, q: torch.Tensor, lengths: torch.Tensor | None = None,
             seed: int | None = None) -> LSHHashing:
        """The buckets and sorted order a CPU call with these queries would use (seed drawn if None);
        a CUDA forward call draws its rotations on the device instead (`lsh_hash_on_device`)."""
        lengths = check_inputs(q, q, q, lengths)
        seed = draw_seed() if seed is None else seed
        return lsh_hash(q.detach().to(kernel_dtype(q.dtype, q.device)), lengths, self.rounds,
                        self.chunk_size, seed, self.max_buckets)

    def forward(self, q, k, v, lengths=None):
        lengths = check_inputs(q, k, v, lengths, attention=self)
        dtype = kernel_dtype(q.dtype, q.device)
        with autocast_disabled(q.device):
            q_kernel, v_kernel = q.to(dtype), v.to(dtype)
            # Clipped as every attention clips an unchecked length (contract.set_input_validation):
            # on the device, where LSH's CUDA kernels would otherwise flag it and do nothing.
            lengths = lengths.clamp(0, q.shape[2])
            order = _lsh_sorted_order_op(q_kernel.detach(), lengths, self.rounds, self.chunk_size,
                                         self.max_buckets)
            out = lsh_chunked_attention(q_kernel, v_kernel, order, lengths, self.chunk_size)
            return out.to(v.dtype)
