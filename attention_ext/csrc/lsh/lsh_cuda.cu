// CUDA implementations of Reformer LSH hashing and chunked attention (lsh_cpu.h states the
// operators and their semantics: unit keys, chunk windows, self mask, rounds merged by
// log-sum-exp with duplicate keys discounted by log n_ij).
//
//   lsh_hash               projections by matmuls in opmath over slices of positions (a
//                          slice's projections hold at most about as many values as q, so
//                          memory stays linear in N although P = n_buckets / 2 grows with
//                          it, up to lsh.py's max_buckets / 2), one thread per (round, position) takes the bucket (first
//                          index on ties, as the CPU), and a sort of (bucket, position) keys
//                          per round gives the order.
//   lsh_attention_forward  one warp per valid query: over every round it streams the keys
//                          of its window (own chunk, previous chunk) with an online softmax
//                          and merges the rounds by log-sum-exp in registers. Each lane holds
//                          dim / 32 elements of the query and of the output.
//   lsh_attention_backward two passes, each recomputing the logits, without atomics:
//                          a query pass (one warp per query i) gives dq_i from its window;
//                          a key pass (one warp per key j) walks the queries whose window
//                          holds j (those of j's chunk and of the next chunk) for dk_j and
//                          dv_j, maps dk_j through the key normalisation and adds dq_j.
//                          Both are deterministic.
//
// Dtypes: q and v are read as they are (float32, float64, float16, bfloat16); arithmetic and
// the returned log-sum-exp are in opmath (float, or double for float64), out and the
// gradients in the input dtype. Head and value dims up to 32 * kMaxPerLane (256).
#include "../common/cuda_common.cuh"
#include "../common/value_checks.h"
#include "checks.h"

#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

namespace {

using namespace attention_ext_cuda;

constexpr int kMaxPerLane = 8;      // elements of a row per lane: dims up to 256
constexpr int kWarpsPerBlock = 8;

struct LshShape {
  int64_t heads, rounds, length, dim, value_dim, chunk;
};

__device__ __forceinline__ int64_t chunk_count(int64_t valid, int64_t chunk) { return (valid + chunk - 1) / chunk; }

__device__ __forceinline__ int64_t chunk_size_of(int64_t c, int64_t valid, int64_t chunk) {
  const int64_t begin = c * chunk;
  return min(begin + chunk, valid) - begin;
}

// --- hashing -------------------------------------------------------------------------------

// bucket = argmax([x, -x]) over the first `half` projections of the round (first index on
// ties: x[up] >= -x[down] keeps up); sort key bucket * N + n for valid positions, and
// `padded_base + n` for padded ones, so a sort lists the valid positions by (bucket,
// position) and the padded ones after them in position order. `projected` holds the
// projections of positions first..first+rows-1 only: (B, H, rows, R * P).
template <typename acc_t>
__global__ void bucket_kernel(const acc_t* __restrict__ projected, const int64_t* __restrict__ lengths,
                              const int64_t* __restrict__ half_buckets, int64_t* __restrict__ buckets,
                              int64_t* __restrict__ keys, int64_t heads, int64_t rounds, int64_t length,
                              int64_t columns, int64_t padded_base, int64_t first, int64_t rows) {
  const int64_t local = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (local >= rows) return;
  const int64_t n = first + local;
  const int64_t t = blockIdx.y, bh = t / rounds, r = t % rounds, b = bh / heads;
  // Clamped so that unchecked values (device-resident lengths and bucket counts are not read on
  // the host) cannot index past the projections; checked values are never changed by it.
  const int64_t valid = lengths[b], half = min(max(half_buckets[b], int64_t{1}), columns);
  const int64_t out = t * length + n;
  if (n >= valid) {
    buckets[out] = -1;
    keys[out] = padded_base + n;
    return;
  }
  const acc_t* x = projected + (bh * rows + local) * rounds * columns + r * columns;
  int64_t up = 0, down = 0;
  for (int64_t j = 1; j < half; ++j) {
    if (x[j] > x[up]) up = j;
    if (x[j] < x[down]) down = j;
  }
  const int64_t bucket = x[up] >= -x[down] ? up : half + down;
  buckets[out] = bucket;
  keys[out] = bucket * length + n;
}

std::tuple<at::Tensor, at::Tensor> lsh_hash_cuda(const at::Tensor& q_in, const at::Tensor& rotations_in,
                                                 const at::Tensor& lengths_in,
                                                 const at::Tensor& half_buckets_in) {
  attention_ext_checks::check_lsh_hash(q_in, rotations_in, lengths_in, half_buckets_in);
  const int64_t batch = q_in.size(0), heads = q_in.size(1), length = q_in.size(2), dim = q_in.size(3);
  const auto opmath = at::toOpMathType(q_in.scalar_type());
  const int64_t rounds = rotations_in.size(3), columns = rotations_in.size(4);
  const c10::cuda::CUDAGuard guard(q_in.device());
  const auto long_options = q_in.options().dtype(at::kLong);
  at::Tensor buckets = at::empty({batch, heads, rounds, length}, long_options);
  at::Tensor order = at::empty({batch, heads, rounds, length}, long_options);
  // Host lengths and bucket counts (lsh.py's lsh_hash, the seeded hashing of LSHAttention.hash)
  // are checked on the host for free and staged to the GPU without waiting for it. Device ones
  // (the forward's hashing, lsh.py's sorted order on CUDA) are not read on the host, so that the
  // hashing never synchronises and a CUDA graph can hold it: the kernel clamps them into range,
  // and the sort keys of padded positions start above those of any bucket the rotations allow.
  at::Tensor lengths, half_buckets;
  int64_t max_half = columns;
  if (lengths_in.is_cuda() && half_buckets_in.is_cuda()) {
    lengths = lengths_in.to(at::kLong).contiguous();
    half_buckets = half_buckets_in.to(at::kLong).contiguous();
  } else {
    const at::Tensor lengths_host = lengths_in.to(at::kCPU, at::kLong).contiguous();
    const at::Tensor half_host = half_buckets_in.to(at::kCPU, at::kLong).contiguous();
    max_half = attention_ext_checks::check_lsh_hash_values(
        lengths_host.data_ptr<int64_t>(), half_host.data_ptr<int64_t>(), batch, length, columns);
    lengths = lengths_host.to(q_in.device(), at::kLong, /*non_blocking=*/true);
    half_buckets = half_host.to(q_in.device(), at::kLong, /*non_blocking=*/true);
  }
  if (buckets.numel() == 0) return {buckets, order};
  at::Tensor keys = at::empty({batch, heads, rounds, length}, long_options);
  const int64_t padded_base = 2 * max_half * length;
  const at::Tensor q_op = q_in.to(opmath);
  const at::Tensor rotation_matrix = rotations_in.to(opmath).reshape({batch, heads, dim, rounds * columns});
  // (B, H, rows, E) @ (B, H, E, R * P) for slices of positions: P grows with N, so the
  // projections of all N positions would take memory quadratic in N. A slice holds about
  // as many values as q (at least 256 positions, so each matmul stays large).
  const int64_t slice =
      std::min(length, std::max<int64_t>(256, length * dim / std::max<int64_t>(1, rounds * columns)));
  for (int64_t first = 0; first < length; first += slice) {
    const int64_t rows = std::min(slice, length - first);
    const at::Tensor projected = at::matmul(q_op.narrow(2, first, rows), rotation_matrix).contiguous();
    AT_DISPATCH_FLOATING_TYPES(opmath, "lsh_hash_cuda", [&] {
      bucket_kernel<scalar_t><<<dim3(blocks_for(rows), grid_y(batch * heads * rounds)), kThreads, 0, stream()>>>(
          projected.data_ptr<scalar_t>(), lengths.data_ptr<int64_t>(), half_buckets.data_ptr<int64_t>(),
          buckets.data_ptr<int64_t>(), keys.data_ptr<int64_t>(), heads, rounds, length, columns, padded_base,
          first, rows);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  }
  order.copy_(std::get<0>(keys.sort(/*dim=*/3)).remainder(length));
  return {buckets, order};
}

// --- preparation shared by forward and backward --------------------------------------------

// Checks that lengths lie in [0, N] (flag bit 1) and that each round's first L entries of
// order are a permutation of 0..L-1 (bit 2), and records each valid position's chunk.
__global__ void index_chunks_kernel(const int64_t* __restrict__ order, const int64_t* __restrict__ lengths,
                                    int32_t* __restrict__ seen, int32_t* __restrict__ chunk_of,
                                    int32_t* __restrict__ flag, int64_t heads, int64_t rounds, int64_t length,
                                    int64_t chunk) {
  const int64_t s = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (s >= length) return;
  const int64_t t = blockIdx.y, b = t / rounds / heads;
  const int64_t valid = lengths[b];
  if (valid < 0 || valid > length) {
    atomicOr(flag, 1);
    return;
  }
  if (s >= valid) return;
  const int64_t pos = order[t * length + s];
  if (pos < 0 || pos >= valid || atomicAdd(&seen[t * length + pos], 1) != 0) {
    atomicOr(flag, 2);
    return;
  }
  chunk_of[t * length + pos] = static_cast<int32_t>(s / chunk);
}

// norms[bh, n] = ||q_n|| in opmath (one warp per row).
template <typename scalar_t>
__global__ void row_norms_kernel(const scalar_t* __restrict__ q, at::opmath_type<scalar_t>* __restrict__ norms,
                                 int64_t rows, int64_t dim) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t row = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= rows) return;
  acc_t squares = 0;
  for (int64_t e = lane; e < dim; e += kWarp) {
    const acc_t x = static_cast<acc_t>(q[row * dim + e]);
    squares += x * x;
  }
  squares = warp_sum(squares);
  if (lane == 0) norms[row] = sqrt(squares);
}

struct Prepared {
  at::Tensor order, lengths, chunk_of, norms;
  at::Tensor flag;  // (1,) int32, non-zero when lengths or order are invalid: the kernels then do nothing
  LshShape shape;
};

Prepared prepare(const at::Tensor& q, const at::Tensor& v, const at::Tensor& order_in,
                 const at::Tensor& lengths_in, int64_t chunk_size) {
  check_one_device("lsh attention", {&q, &v});
  const int64_t per_lane = (std::max(q.size(3), v.size(3)) + kWarp - 1) / kWarp;
  TORCH_CHECK(per_lane <= kMaxPerLane, "lsh attention on CUDA: head and value dims up to ",
              kWarp * kMaxPerLane, " are supported, got ", q.size(3), " and ", v.size(3));
  Prepared p;
  p.order = order_in.to(q.device(), at::kLong).contiguous();
  p.lengths = lengths_in.to(q.device(), at::kLong).contiguous();
  const int64_t batch = q.size(0), heads = q.size(1), rounds = order_in.size(2), length = q.size(2);
  // A chunk longer than the sequence behaves like one of exactly its length (one chunk).
  const int64_t chunk = std::min(chunk_size, std::max<int64_t>(length, 1));
  p.shape = {heads, rounds, length, q.size(3), v.size(3), chunk};
  const auto int_options = q.options().dtype(at::kInt);
  p.chunk_of = at::zeros({batch, heads, rounds, length}, int_options);
  p.flag = at::zeros({1}, int_options);
  if (batch * heads * length > 0) {
    at::Tensor seen = at::zeros({batch, heads, rounds, length}, int_options);
    index_chunks_kernel<<<dim3(blocks_for(length), grid_y(batch * heads * rounds)), kThreads, 0, stream()>>>(
        p.order.data_ptr<int64_t>(), p.lengths.data_ptr<int64_t>(), seen.data_ptr<int32_t>(),
        p.chunk_of.data_ptr<int32_t>(), p.flag.data_ptr<int32_t>(), heads, rounds, length, chunk);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    // Reading the flag waits for the GPU: only with value checks on (attention_ext.set_input_validation)
    // and never while a CUDA graph is captured. Unread, a bad flag makes every warp of the attention
    // kernels return at once: zero output and gradients, never a read out of bounds.
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    C10_CUDA_CHECK(cudaStreamIsCapturing(stream(), &capture));
    if (attention_ext_checks::device_value_checks().load() && capture == cudaStreamCaptureStatusNone) {
      const int32_t problems = p.flag.item<int32_t>();
      TORCH_CHECK(!(problems & 1), "lsh attention: a length is outside [0, ", length, "], got ",
                  p.lengths.cpu());
      TORCH_CHECK(!(problems & 2), "lsh attention: order[b, :, r, :L] must be a permutation of the valid "
                  "positions 0..L-1 for every batch element b (of valid length L) and round r");
    }
  }
  p.norms = at::empty({batch, heads, length}, q.options().dtype(at::toOpMathType(q.scalar_type())));
  return p;
}

// Everything a warp needs to walk the windows; all pointers are of one (batch, head).
template <typename acc_t>
struct Window {
  const int64_t* order;     // (R, N)
  const int32_t* chunk_of;  // (R, N)
  int64_t rounds, length, chunk, valid, chunks;
  acc_t scale;

  __device__ int64_t previous(int64_t c) const { return (c + chunks - 1) % chunks; }

  // log n_ij: the rounds whose window of query i holds key j (round r itself included).
  __device__ acc_t log_count(int64_t r, int64_t i, int64_t j) const {
    if (rounds == 1) return 0;
    int n = 1;
    for (int64_t other = 0; other < rounds; ++other) {
      if (other == r) continue;
      const int32_t key_chunk = chunk_of[other * length + j];
      const int32_t own = chunk_of[other * length + i];
      const int32_t prev = chunks > 1 ? static_cast<int32_t>(previous(own)) : own;
      n += (key_chunk == own) | (key_chunk == prev);
    }
    return log(static_cast<acc_t>(n));
  }

  // Keys in the window of a query of chunk c: its own chunk, then the previous one.
  __device__ int64_t window_size(int64_t c) const {
    return chunk_size_of(c, valid, chunk) + (chunks > 1 ? chunk_size_of(previous(c), valid, chunk) : 0);
  }
};

template <typename acc_t, int P>
struct LaneRow {  // the elements e = lane + 32 p of a row
  acc_t x[P];

  template <typename scalar_t>
  __device__ void load(const scalar_t* row, int64_t dim, int lane, acc_t factor = 1) {
#pragma unroll
    for (int p = 0; p < P; ++p) {
      const int64_t e = lane + kWarp * p;
      x[p] = e < dim ? static_cast<acc_t>(row[e]) * factor : acc_t(0);
    }
  }
  __device__ void fill(acc_t value) {
#pragma unroll
    for (int p = 0; p < P; ++p) x[p] = value;
  }
  template <typename scalar_t>
  __device__ acc_t dot(const scalar_t* row, int64_t dim, int lane) const {  // warp-wide
    acc_t partial = 0;
#pragma unroll
    for (int p = 0; p < P; ++p) {
      const int64_t e = lane + kWarp * p;
      if (e < dim) partial += x[p] * static_cast<acc_t>(row[e]);
    }
    return warp_sum(partial);
  }
  template <typename scalar_t>
  __device__ void add_scaled(const scalar_t* row, int64_t dim, int lane, acc_t factor) {
#pragma unroll
    for (int p = 0; p < P; ++p) {
      const int64_t e = lane + kWarp * p;
      if (e < dim) x[p] += factor * static_cast<acc_t>(row[e]);
    }
  }
  template <typename scalar_t>
  __device__ void store(scalar_t* row, int64_t dim, int lane) const {
#pragma unroll
    for (int p = 0; p < P; ++p) {
      const int64_t e = lane + kWarp * p;
      if (e < dim) row[e] = static_cast<scalar_t>(x[p]);
    }
  }
};

// The warp's (batch-head, position) and its Window; false when the position is padded.
template <typename acc_t>
__device__ bool warp_position(const LshShape& s, const int64_t* order, const int64_t* lengths,
                              const int32_t* chunk_of, const int32_t* flag, int64_t& bh, int64_t& position,
                              Window<acc_t>& w) {
  position = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / kWarp;
  bh = blockIdx.y;
  if (*flag != 0) return false;   // invalid lengths or order (prepare): nothing is safe to read
  const int64_t valid = lengths[bh / s.heads];
  if (position >= valid) return false;
  w = Window<acc_t>{order + bh * s.rounds * s.length, chunk_of + bh * s.rounds * s.length, s.rounds,
                    s.length, s.chunk, valid, chunk_count(valid, s.chunk),
                    static_cast<acc_t>(1.0 / sqrt(static_cast<double>(s.dim)))};
  return true;
}

// The walk of query i's windows that the forward and the backward's query pass share: round by
// round, every key j of the window (its own chunk, then the previous one; i itself only where it
// is alone there) with the logit q_i . k_j / sqrt(E) - log n_ij and 1 / max(||q_j||, eps);
// on_key(j, inverse_norm, logit) for each, on_round_end(r) after each round's last.
template <typename acc_t, int P, typename scalar_t, typename OnKey, typename OnRoundEnd>
__device__ __forceinline__ void walk_query_windows(const Window<acc_t>& w, int64_t i, const LaneRow<acc_t, P>& query,
                                                   const scalar_t* q_bh, const acc_t* norm_bh, int64_t dim,
                                                   int lane, OnKey&& on_key, OnRoundEnd&& on_round_end) {
  for (int64_t r = 0; r < w.rounds; ++r) {
    const int64_t c = w.chunk_of[r * w.length + i];
    const bool mask_self = w.window_size(c) > 1;
    const int64_t* round_order = w.order + r * w.length;
    for (int part = 0; part < (w.chunks > 1 ? 2 : 1); ++part) {
      const int64_t kc = part == 0 ? c : w.previous(c);
      const int64_t begin = kc * w.chunk, end = begin + chunk_size_of(kc, w.valid, w.chunk);
      for (int64_t slot = begin; slot < end; ++slot) {
        const int64_t j = round_order[slot];
        if (mask_self && j == i) continue;
        const acc_t inverse_norm = acc_t(1) / max(norm_bh[j], acc_t(1e-12));
        const acc_t logit = query.dot(q_bh + j * dim, dim, lane) * inverse_norm * w.scale - w.log_count(r, i, j);
        on_key(j, inverse_norm, logit);
      }
    }
    on_round_end(r);
  }
}

template <typename scalar_t, int P>
__global__ void __launch_bounds__(kWarpsPerBlock * kWarp)
lsh_forward_kernel(const scalar_t* __restrict__ q, const scalar_t* __restrict__ v,
                   const int64_t* __restrict__ order, const int64_t* __restrict__ lengths,
                   const int32_t* __restrict__ chunk_of, const int32_t* __restrict__ flag,
                   const at::opmath_type<scalar_t>* __restrict__ norms,
                   scalar_t* __restrict__ out, at::opmath_type<scalar_t>* __restrict__ lse, LshShape s) {
  using acc_t = at::opmath_type<scalar_t>;
  int64_t bh, i;
  Window<acc_t> w;
  if (!warp_position(s, order, lengths, chunk_of, flag, bh, i, w)) return;
  const int lane = threadIdx.x % kWarp;
  const scalar_t* q_bh = q + bh * s.length * s.dim;
  const scalar_t* v_bh = v + bh * s.length * s.value_dim;
  const acc_t* norm_bh = norms + bh * s.length;
  LaneRow<acc_t, P> query, merged, acc;
  query.load(q_bh + i * s.dim, s.dim, lane);
  merged.fill(0);
  acc_t merged_lse = 0;
  // The round's online softmax: its running maximum, sum of weights and weighted sum of values.
  acc_t running_max = -INFINITY, total = 0;
  acc.fill(0);
  const auto on_key = [&](int64_t j, acc_t, acc_t logit) {
    const acc_t new_max = max(running_max, logit);
    const acc_t correction = exp(running_max - new_max);  // 0 on the first key
    const acc_t weight = exp(logit - new_max);
    total = total * correction + weight;
#pragma unroll
    for (int p = 0; p < P; ++p) acc.x[p] *= correction;
    acc.add_scaled(v_bh + j * s.value_dim, s.value_dim, lane, weight);
    running_max = new_max;
  };
  const auto on_round_end = [&](int64_t r) {
    const acc_t round_lse = running_max + log(total);
    if (r == 0) {
#pragma unroll
      for (int p = 0; p < P; ++p) merged.x[p] = acc.x[p] / total;
      merged_lse = round_lse;
    } else {  // merge with the earlier rounds by log-sum-exp
      const acc_t both = max(merged_lse, round_lse) + log1p(exp(-fabs(merged_lse - round_lse)));
      const acc_t keep = exp(merged_lse - both), add = exp(round_lse - both) / total;
#pragma unroll
      for (int p = 0; p < P; ++p) merged.x[p] = merged.x[p] * keep + acc.x[p] * add;
      merged_lse = both;
    }
    running_max = -INFINITY;
    total = 0;
    acc.fill(0);
  };
  walk_query_windows(w, i, query, q_bh, norm_bh, s.dim, lane, on_key, on_round_end);
  merged.store(out + (bh * s.length + i) * s.value_dim, s.value_dim, lane);
  if (lane == 0) lse[bh * s.length + i] = merged_lse;
}

// Query pass of backward: dq_i = sum_j dlogit_ij k_j over every round's window, with
// dlogit_ij = p_ij (dO_i . v_j - dO_i . o_i) / sqrt(E), p_ij = exp(logit_ij - lse_i); also
// writes delta_i = dO_i . o_i for the key pass.
template <typename scalar_t, int P>
__global__ void __launch_bounds__(kWarpsPerBlock * kWarp)
lsh_backward_query_kernel(const scalar_t* __restrict__ grad_out, const scalar_t* __restrict__ q,
                          const scalar_t* __restrict__ v, const scalar_t* __restrict__ out,
                          const at::opmath_type<scalar_t>* __restrict__ lse, const int64_t* __restrict__ order,
                          const int64_t* __restrict__ lengths, const int32_t* __restrict__ chunk_of,
                          const int32_t* __restrict__ flag, const at::opmath_type<scalar_t>* __restrict__ norms,
                          at::opmath_type<scalar_t>* __restrict__ dq, at::opmath_type<scalar_t>* __restrict__ delta,
                          LshShape s) {
  using acc_t = at::opmath_type<scalar_t>;
  int64_t bh, i;
  Window<acc_t> w;
  if (!warp_position(s, order, lengths, chunk_of, flag, bh, i, w)) return;
  const int lane = threadIdx.x % kWarp;
  const scalar_t* q_bh = q + bh * s.length * s.dim;
  const scalar_t* v_bh = v + bh * s.length * s.value_dim;
  const acc_t* norm_bh = norms + bh * s.length;
  const int64_t row = bh * s.length + i;
  LaneRow<acc_t, P> query, go, gq;
  query.load(q_bh + i * s.dim, s.dim, lane);
  go.load(grad_out + row * s.value_dim, s.value_dim, lane);
  gq.fill(0);
  const acc_t row_delta = go.dot(out + row * s.value_dim, s.value_dim, lane);
  const acc_t row_lse = lse[row];
  const auto on_key = [&](int64_t j, acc_t inverse_norm, acc_t logit) {
    const acc_t p = exp(logit - row_lse);
    const acc_t dlogit = p * (go.dot(v_bh + j * s.value_dim, s.value_dim, lane) - row_delta) * w.scale;
    gq.add_scaled(q_bh + j * s.dim, s.dim, lane, dlogit * inverse_norm);  // dlogit * k_j
  };
  walk_query_windows(w, i, query, q_bh, norm_bh, s.dim, lane, on_key, [](int64_t) {});
  gq.store(dq + row * s.dim, s.dim, lane);
  if (lane == 0) delta[row] = row_delta;
}

// Key pass of backward: for key j, the queries whose window holds j in round r are those of
// j's chunk c and, with more than one chunk, of the next chunk (c + 1) mod chunks.
// dk_j = sum_i dlogit_ij q_i, dv_j = sum_i p_ij dO_i; then grad_q_j = dq_j + the gradient
// through k_j = q_j / max(||q_j||, eps): (dk - k (k . dk)) / ||q_j||, or dk / eps when clamped.
template <typename scalar_t, int P>
__global__ void __launch_bounds__(kWarpsPerBlock * kWarp)
lsh_backward_key_kernel(const scalar_t* __restrict__ grad_out, const scalar_t* __restrict__ q,
                        const scalar_t* __restrict__ v, const at::opmath_type<scalar_t>* __restrict__ lse,
                        const int64_t* __restrict__ order, const int64_t* __restrict__ lengths,
                        const int32_t* __restrict__ chunk_of, const int32_t* __restrict__ flag,
                        const at::opmath_type<scalar_t>* __restrict__ norms,
                        const at::opmath_type<scalar_t>* __restrict__ dq,
                        const at::opmath_type<scalar_t>* __restrict__ delta, scalar_t* __restrict__ grad_q,
                        scalar_t* __restrict__ grad_v, LshShape s) {
  using acc_t = at::opmath_type<scalar_t>;
  int64_t bh, j;
  Window<acc_t> w;
  if (!warp_position(s, order, lengths, chunk_of, flag, bh, j, w)) return;
  const int lane = threadIdx.x % kWarp;
  const scalar_t* q_bh = q + bh * s.length * s.dim;
  const acc_t* norm_bh = norms + bh * s.length;
  const int64_t base = bh * s.length, row = base + j;
  const acc_t norm = norm_bh[j];
  const bool clamped = norm < acc_t(1e-12);
  const acc_t inverse_norm = acc_t(1) / (clamped ? acc_t(1e-12) : norm);
  LaneRow<acc_t, P> key, value, dk, dv;
  key.load(q_bh + j * s.dim, s.dim, lane, inverse_norm);  // the unit key
  value.load(v + row * s.value_dim, s.value_dim, lane);
  dk.fill(0);
  dv.fill(0);
  for (int64_t r = 0; r < s.rounds; ++r) {
    const int64_t c = w.chunk_of[r * s.length + j];
    const int64_t* round_order = w.order + r * s.length;
    for (int part = 0; part < (w.chunks > 1 ? 2 : 1); ++part) {
      const int64_t qc = part == 0 ? c : (c + 1) % w.chunks;
      const bool mask_self = w.window_size(qc) > 1;
      const int64_t begin = qc * s.chunk, end = begin + chunk_size_of(qc, w.valid, s.chunk);
      for (int64_t slot = begin; slot < end; ++slot) {
        const int64_t i = round_order[slot];
        if (mask_self && i == j) continue;
        const scalar_t* q_row = q_bh + i * s.dim;
        const scalar_t* go_row = grad_out + (base + i) * s.value_dim;
        const acc_t logit = key.dot(q_row, s.dim, lane) * w.scale - w.log_count(r, i, j);
        const acc_t p = exp(logit - lse[base + i]);
        const acc_t dlogit = p * (value.dot(go_row, s.value_dim, lane) - delta[base + i]) * w.scale;
        dk.add_scaled(q_row, s.dim, lane, dlogit);
        dv.add_scaled(go_row, s.value_dim, lane, p);
      }
    }
  }
  if (clamped) {
#pragma unroll
    for (int p = 0; p < P; ++p) dk.x[p] *= inverse_norm;
  } else {
    acc_t partial = 0;
#pragma unroll
    for (int p = 0; p < P; ++p) partial += key.x[p] * dk.x[p];  // zero past dim
    const acc_t along = warp_sum(partial);
#pragma unroll
    for (int p = 0; p < P; ++p) dk.x[p] = (dk.x[p] - key.x[p] * along) * inverse_norm;
  }
  dk.add_scaled(dq + row * s.dim, s.dim, lane, acc_t(1));
  dk.store(grad_q + row * s.dim, s.dim, lane);
  dv.store(grad_v + row * s.value_dim, s.value_dim, lane);
}

template <typename Launch>
void dispatch_per_lane(int64_t dim, int64_t value_dim, const Launch& launch) {
  const int64_t per_lane = (std::max(dim, value_dim) + kWarp - 1) / kWarp;
  if (per_lane <= 1) launch(std::integral_constant<int, 1>{});
  else if (per_lane <= 2) launch(std::integral_constant<int, 2>{});
  else if (per_lane <= 4) launch(std::integral_constant<int, 4>{});
  else launch(std::integral_constant<int, kMaxPerLane>{});
}

template <typename scalar_t>
void launch_norms(const at::Tensor& q, at::Tensor& norms) {
  const int64_t rows = q.size(0) * q.size(1) * q.size(2);
  row_norms_kernel<scalar_t><<<blocks_for(rows * kWarp), kThreads, 0, stream()>>>(
      q.data_ptr<scalar_t>(), norms.data_ptr<at::opmath_type<scalar_t>>(), rows, q.size(3));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

dim3 warp_grid(const at::Tensor& q) {
  return dim3(blocks_for(q.size(2), kWarpsPerBlock), grid_y(q.size(0) * q.size(1)));
}

std::tuple<at::Tensor, at::Tensor> lsh_attention_forward_cuda(const at::Tensor& q_in, const at::Tensor& v_in,
                                                              const at::Tensor& order,
                                                              const at::Tensor& lengths, int64_t chunk_size) {
  attention_ext_checks::check_lsh_attention(q_in, v_in, order, lengths, chunk_size);
  const c10::cuda::CUDAGuard guard(q_in.device());
  Prepared p = prepare(q_in, v_in, order, lengths, chunk_size);
  const at::Tensor q = q_in.contiguous(), v = v_in.contiguous();
  at::Tensor out = at::zeros_like(v, at::MemoryFormat::Contiguous);
  at::Tensor lse = at::zeros({q.size(0), q.size(1), q.size(2)}, q.options().dtype(at::toOpMathType(q.scalar_type())));
  if (q.size(0) * q.size(1) * q.size(2) == 0) return {out, lse};
  ATTENTION_EXT_DISPATCH_FLOATING(q.scalar_type(), "lsh_attention_forward_cuda", [&] {
    launch_norms<scalar_t>(q, p.norms);
    dispatch_per_lane(p.shape.dim, p.shape.value_dim, [&](auto per_lane) {
      lsh_forward_kernel<scalar_t, decltype(per_lane)::value><<<warp_grid(q), kWarpsPerBlock * kWarp, 0, stream()>>>(
          q.data_ptr<scalar_t>(), v.data_ptr<scalar_t>(), p.order.data_ptr<int64_t>(),
          p.lengths.data_ptr<int64_t>(), p.chunk_of.data_ptr<int32_t>(), p.flag.data_ptr<int32_t>(),
          p.norms.data_ptr<at::opmath_type<scalar_t>>(), out.data_ptr<scalar_t>(),
          lse.data_ptr<at::opmath_type<scalar_t>>(), p.shape);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
  return {out, lse};
}

std::tuple<at::Tensor, at::Tensor> lsh_attention_backward_cuda(
    const at::Tensor& grad_out_in, const at::Tensor& q_in, const at::Tensor& v_in, const at::Tensor& order,
    const at::Tensor& lengths, const at::Tensor& out_in, const at::Tensor& lse_in, int64_t chunk_size) {
  attention_ext_checks::check_lsh_attention_backward(grad_out_in, q_in, v_in, order, lengths, out_in, lse_in,
                                                     chunk_size);
  check_one_device("lsh attention backward", {&q_in, &grad_out_in, &out_in, &lse_in});
  const c10::cuda::CUDAGuard guard(q_in.device());
  Prepared p = prepare(q_in, v_in, order, lengths, chunk_size);
  const auto opmath = at::toOpMathType(q_in.scalar_type());
  const at::Tensor q = q_in.contiguous(), v = v_in.contiguous();
  const at::Tensor grad_out = grad_out_in.to(q.scalar_type()).contiguous();
  const at::Tensor out = out_in.to(q.scalar_type()).contiguous(), lse = lse_in.to(opmath).contiguous();
  at::Tensor grad_q = at::zeros_like(q, at::MemoryFormat::Contiguous);
  at::Tensor grad_v = at::zeros_like(v, at::MemoryFormat::Contiguous);
  if (q.size(0) * q.size(1) * q.size(2) == 0) return {grad_q, grad_v};
  at::Tensor dq = at::empty(q.sizes(), q.options().dtype(opmath));
  at::Tensor delta = at::empty({q.size(0), q.size(1), q.size(2)}, q.options().dtype(opmath));
  ATTENTION_EXT_DISPATCH_FLOATING(q.scalar_type(), "lsh_attention_backward_cuda", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    launch_norms<scalar_t>(q, p.norms);
    dispatch_per_lane(p.shape.dim, p.shape.value_dim, [&](auto per_lane) {
      constexpr int P = decltype(per_lane)::value;
      lsh_backward_query_kernel<scalar_t, P><<<warp_grid(q), kWarpsPerBlock * kWarp, 0, stream()>>>(
          grad_out.data_ptr<scalar_t>(), q.data_ptr<scalar_t>(), v.data_ptr<scalar_t>(),
          out.data_ptr<scalar_t>(), lse.data_ptr<acc_t>(), p.order.data_ptr<int64_t>(),
          p.lengths.data_ptr<int64_t>(), p.chunk_of.data_ptr<int32_t>(), p.flag.data_ptr<int32_t>(),
          p.norms.data_ptr<acc_t>(), dq.data_ptr<acc_t>(), delta.data_ptr<acc_t>(), p.shape);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      lsh_backward_key_kernel<scalar_t, P><<<warp_grid(q), kWarpsPerBlock * kWarp, 0, stream()>>>(
          grad_out.data_ptr<scalar_t>(), q.data_ptr<scalar_t>(), v.data_ptr<scalar_t>(), lse.data_ptr<acc_t>(),
          p.order.data_ptr<int64_t>(), p.lengths.data_ptr<int64_t>(), p.chunk_of.data_ptr<int32_t>(),
          p.flag.data_ptr<int32_t>(), p.norms.data_ptr<acc_t>(), dq.data_ptr<acc_t>(), delta.data_ptr<acc_t>(),
          grad_q.data_ptr<scalar_t>(), grad_v.data_ptr<scalar_t>(), p.shape);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
  return {grad_q, grad_v};
}

}  // namespace

TORCH_LIBRARY_IMPL(attention_ext, CUDA, m) {
  m.impl("lsh_hash", &lsh_hash_cuda);
  m.impl("lsh_attention_forward", &lsh_attention_forward_cuda);
  m.impl("lsh_attention_backward", &lsh_attention_backward_cuda);
}
