"""One Triton kernel for the whole query clustering of one (batch, head): the hash thresholds and
codes, the initial centroids, every Lloyd step of Hamming K-Means, the final assignment and the
member lists. The extension's route (csrc/clustering/ and group_by_cluster) takes about 50
launches for the same work, one per Lloyd step; here a (batch, head) is one program, so the steps
need no grid-wide synchronisation. The price: a (batch, head) runs on one SM, so a batch of few
heads leaves most of a large GPU idle during the clustering (the ASR shape, 32 x 4 heads, fills it).

Semantics are those of csrc/clustering/clustering.cpp (its top comment), bit for bit given the same
projections: thresholds mean_b + offset_b * std_b in float64 over the valid queries; the seeded
Fisher-Yates walk (splitmix64 stream of (seed, b, h)) for the initial centroids; nearest centroid
by Hamming distance, ties to the lowest index; majority vote per bit, an exact tie keeping the
old bit and an empty cluster its code; `iterations` steps then one final assignment (a head whose
centroids did not change in a step stops early, as in the extension: the same result). Hamming
distances are popcounts of code ^ centroid (the popc instruction); the members' bit counts are one
matrix product, one-hot^T x bits, on tensor cores (exact: 0/1 in float16, float32 sums).

Program-private scratch (the codes, the walk's order) is written and read back by other threads of
the same program: tl.debug_barrier() (a block barrier) separates the writes from the reads.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _splitmix64(state):
    state = state + 0x9E3779B97F4A7C15
    z = state
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
    z = (z ^ (z >> 27)) * 0x94D049BB133111EB
    return state, z ^ (z >> 31)


@triton.jit
def _bit_matrix(codes, BITS: tl.constexpr):
    """(R,) int64 codes -> (R, BITS) int32 matrix of their bits."""
    shifts = tl.arange(0, BITS).to(tl.int64)
    return ((codes[:, None] >> shifts[None, :]) & 1).to(tl.int32)


@triton.jit
def _popcount(x, PTX: tl.constexpr):
    """Set bits of non-negative int64 x, as int32: the popc instruction where compiled for CUDA,
    the same count by shifts and masks (SWAR) in the interpreter, which runs no PTX."""
    if PTX:
        return tl.inline_asm_elementwise("popc.b64 $0, $1;", "=r,l", [x], dtype=tl.int32, is_pure=True, pack=1)
    else:
        x = x - ((x >> 1) & 0x5555555555555555)
        x = (x & 0x3333333333333333) + ((x >> 2) & 0x3333333333333333)
        x = (x + (x >> 4)) & 0x0F0F0F0F0F0F0F0F
        return ((x * 0x0101010101010101) >> 56).to(tl.int32)


@triton.jit
def _nearest(codes, centroids, slots, C_PAD: tl.constexpr, PTX: tl.constexpr):
    """Nearest centroid of each of (R,) codes: fewest differing bits, ties to the lowest index
    (distance and index packed in one key whose minimum is that centroid)."""
    distance = _popcount(codes[:, None] ^ centroids[None, :], PTX)
    index = tl.arange(0, C_PAD)
    key = tl.where(index[None, :] < slots, distance * C_PAD + index[None, :], 65 * C_PAD)
    return tl.min(key, 1) % C_PAD


@triton.jit
def _hash_codes(proj_ptr, plane_offsets_ptr, codes_ptr, valid, bits,
                BLOCK_N: tl.constexpr, BITS: tl.constexpr):
    """Codes of the valid queries of one (batch, head) from their (N, bits) projections."""
    rows = tl.arange(0, BLOCK_N)
    columns = tl.arange(0, BITS)
    column_ok = columns < bits
    total = tl.zeros([BITS], dtype=tl.float64)
    for start in range(0, valid, BLOCK_N):
        ok = ((start + rows) < valid)[:, None] & column_ok[None, :]
        p = tl.load(proj_ptr + (start + rows)[:, None] * bits + columns[None, :], mask=ok, other=0.0)
        total += tl.sum(p.to(tl.float64), 0)
    mean = total / tl.maximum(valid, 1).to(tl.float64)
    squares = tl.zeros([BITS], dtype=tl.float64)
    for start in range(0, valid, BLOCK_N):
        ok = ((start + rows) < valid)[:, None] & column_ok[None, :]
        p = tl.load(proj_ptr + (start + rows)[:, None] * bits + columns[None, :], mask=ok, other=0.0)
        d = tl.where(ok, p.to(tl.float64) - mean[None, :], 0.0)
        squares += tl.sum(d * d, 0)
    offset = tl.load(plane_offsets_ptr + columns, mask=column_ok, other=0.0).to(tl.float64)
    threshold = mean + offset * tl.sqrt(squares / tl.maximum(valid, 1).to(tl.float64))
    for start in range(0, valid, BLOCK_N):
        ok = ((start + rows) < valid)[:, None] & column_ok[None, :]
        p = tl.load(proj_ptr + (start + rows)[:, None] * bits + columns[None, :], mask=ok, other=0.0)
        set_bits = ok & (p.to(tl.float64) > threshold[None, :])
        code = tl.sum(set_bits.to(tl.int64) << columns.to(tl.int64)[None, :], 1)
        tl.store(codes_ptr + start + rows, code, mask=(start + rows) < valid)


@triton.jit
def _initial_centroids(codes_ptr, order_ptr, valid, slots, seed, b, h,
                       BLOCK_N: tl.constexpr, C_PAD: tl.constexpr):
    """clustering.cpp's walk: valid positions in a seeded random order, distinct codes kept,
    the remaining slots repeating centroid 0. With valid <= slots: the codes themselves."""
    index = tl.arange(0, C_PAD)
    own_codes = tl.load(codes_ptr + index, mask=index < valid, other=0)
    walked = tl.where(valid > slots, valid, 0)   # the walk only runs when K-Means does
    rows = tl.arange(0, BLOCK_N)
    for start in range(0, walked, BLOCK_N):
        tl.store(order_ptr + start + rows, start + rows, mask=(start + rows) < walked)
    tl.debug_barrier()
    state = tl.cast(seed, tl.uint64)
    state, z = _splitmix64(state)
    state = z ^ b.to(tl.uint64)
    state, z = _splitmix64(state)
    state = z ^ h.to(tl.uint64)
    centroids = tl.zeros([C_PAD], dtype=tl.int64)
    step = 0
    filled = 0
    while (step < walked) & (filled < slots):
        state, z = _splitmix64(state)
        pick = step + (z % (walked - step).to(tl.uint64)).to(tl.int32)
        at_step = tl.load(order_ptr + step)
        at_pick = tl.load(order_ptr + pick)
        tl.debug_barrier()   # every thread has read both before they are swapped
        tl.store(order_ptr + pick, at_step)
        tl.store(order_ptr + step, at_pick)
        candidate = tl.load(codes_ptr + at_pick)
        taken = tl.max(((index < filled) & (centroids == candidate)).to(tl.int32), 0)
        centroids = tl.where((index == filled) & (taken == 0), candidate, centroids)
        filled += 1 - taken
        step += 1
        tl.debug_barrier()   # the swap is seen by every thread in the next step
    first = tl.sum(tl.where(index == 0, centroids, 0), 0)
    return tl.where(valid > slots, tl.where(index < filled, centroids, first), own_codes)


@triton.jit
def _lloyd_step(codes_ptr, centroids, valid, slots,
                BLOCK_N: tl.constexpr, C_PAD: tl.constexpr, BITS: tl.constexpr, PTX: tl.constexpr):
    """One assignment + majority-vote update of the (C_PAD,) int64 centroid codes."""
    rows = tl.arange(0, BLOCK_N)
    index = tl.arange(0, C_PAD)
    ones = tl.zeros([C_PAD, BITS], dtype=tl.float32)
    members = tl.zeros([C_PAD], dtype=tl.int32)
    for start in range(0, valid, BLOCK_N):
        ok = (start + rows) < valid
        codes = tl.load(codes_ptr + start + rows, mask=ok, other=0)
        nearest = _nearest(codes, centroids, slots, C_PAD, PTX)
        one_hot = ((nearest[:, None] == index[None, :]) & ok[:, None]).to(tl.float16)
        # the members' bit counts per cluster: one-hot^T x bits, exact (0/1 in float16, float32 sums)
        ones += tl.dot(tl.trans(one_hot), _bit_matrix(codes, BITS).to(tl.float16), out_dtype=tl.float32)
        members += tl.sum(one_hot.to(tl.int32), 0)
    old = _bit_matrix(centroids, BITS)
    twice = 2 * ones.to(tl.int32)
    size = members[:, None]
    vote = tl.where(twice > size, 1, tl.where(twice < size, 0, old))
    bits = tl.where(size > 0, vote, old)
    return tl.sum(bits.to(tl.int64) << tl.arange(0, BITS).to(tl.int64)[None, :], 1)


@triton.jit
def _final_assignment(codes_ptr, assignment_ptr, counts_ptr, offsets_ptr, members_ptr, centroids,
                      valid, slots, length, BLOCK_N: tl.constexpr, C_PAD: tl.constexpr, PTX: tl.constexpr):
    """The assignment (-1 for padded queries; position i for a head with valid <= slots) and the
    counts, then the member lists (increasing position within a cluster, -1 past the last)."""
    rows = tl.arange(0, BLOCK_N)
    index = tl.arange(0, C_PAD)
    counts = tl.zeros([C_PAD], dtype=tl.int32)
    for start in range(0, length, BLOCK_N):
        position = start + rows
        ok = position < valid
        nearest = _nearest(tl.load(codes_ptr + position, mask=ok, other=0), centroids, slots, C_PAD, PTX)
        nearest = tl.where(valid > slots, nearest, position)
        tl.store(assignment_ptr + position, tl.where(ok, nearest, -1).to(tl.int64), mask=position < length)
        counts += tl.sum(((nearest[:, None] == index[None, :]) & ok[:, None]).to(tl.int32), 0)
    tl.store(counts_ptr + index, counts.to(tl.int64), mask=index < slots)
    ends = tl.cumsum(counts, 0)
    tl.store(offsets_ptr + 1 + index, ends.to(tl.int64), mask=index < slots)
    tl.store(offsets_ptr, 0)
    tl.debug_barrier()   # the assignment is read back by other threads
    filled = ends - counts   # where each cluster's next member goes
    for start in range(0, length, BLOCK_N):
        position = start + rows
        ok = position < valid
        cluster = tl.load(assignment_ptr + position, mask=ok, other=-1)
        one_hot = ((cluster[:, None] == index[None, :]) & ok[:, None]).to(tl.int32)
        before = tl.cumsum(one_hot, 0) - one_hot   # earlier members of the same cluster in this block
        slot = tl.sum(one_hot * (filled[None, :] + before), 1)
        tl.store(members_ptr + slot, position.to(tl.int64), mask=ok)
        tl.store(members_ptr + position, -1, mask=(position >= valid) & (position < length))
        filled += tl.sum(one_hot, 0)


# The seed is any 62-bit value: never specialised (Triton makes an int argument equal to 1 a constant).
@triton.jit(do_not_specialize=["seed"])
def cluster_queries_kernel(proj_ptr, plane_offsets_ptr, lengths_ptr, codes_ptr, order_ptr, assignment_ptr,
                           counts_ptr, offsets_ptr, members_ptr, centroids_ptr,
                           seed, heads, length, slots, bits, iterations,
                           BLOCK_N: tl.constexpr, C_PAD: tl.constexpr, BITS: tl.constexpr, PTX: tl.constexpr):
    """One program per (batch, head) g. Inputs: proj (G, N, bits) float32 projections, plane
    offsets (bits,), lengths (B,) int64. Scratch: codes (G, N) int64, order (G, N) int32.
    Outputs (int64): assignment (G, N), counts (G, slots), offsets (G, slots + 1), members (G, N),
    centroids (G, slots)."""
    g = tl.program_id(0).to(tl.int64)
    b = g // heads
    h = g % heads
    valid = tl.minimum(tl.maximum(tl.load(lengths_ptr + b), 0), length).to(tl.int32)
    codes_ptr += g * length
    order_ptr += g * length
    # 32 rows at a time: the hash's float64 tiles would otherwise set the registers of the whole kernel
    _hash_codes(proj_ptr + g * length * bits, plane_offsets_ptr, codes_ptr, valid, bits, 32, BITS)
    tl.debug_barrier()
    centroids = _initial_centroids(codes_ptr, order_ptr, valid, slots, seed, b, h, BLOCK_N, C_PAD)
    steps = tl.where(valid > slots, iterations, 0)
    step = 0
    changed = 1
    while (step < steps) & (changed > 0):   # a step that changes no centroid has converged
        updated = _lloyd_step(codes_ptr, centroids, valid, slots, BLOCK_N, C_PAD, BITS, PTX)
        changed = tl.max((updated != centroids).to(tl.int32), 0)
        centroids = updated
        step += 1
    index = tl.arange(0, C_PAD)
    tl.store(centroids_ptr + g * slots + index, centroids, mask=index < slots)
    _final_assignment(codes_ptr, assignment_ptr + g * length, counts_ptr + g * slots,
                      offsets_ptr + g * (slots + 1), members_ptr + g * length, centroids,
                      valid, slots, length, BLOCK_N, C_PAD, PTX)
