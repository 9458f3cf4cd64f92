// The argument checks of the LSH operators (lsh_cpu.h), written once and called by the CPU and the
// CUDA entry of each before any parallel work or kernel launch. What stays with each entry: on the
// CPU that the rotations' column indices fit its kernel's int32 and that lengths and the sorted
// order are valid (read on the host, the order inside the parallel index pass); on CUDA that the
// inputs are on one device, the head dims it supports, and the lengths and order checked on the
// device (a flag read after the kernel while value checks are on, common/value_checks.h).
#pragma once

#include "../common/checks.h"

#include <ATen/OpMathType.h>

#include <algorithm>
#include <cstdint>

namespace attention_ext_checks {

// lsh_hash(q (B,H,N,E), rotations (B,H,E,R,P), lengths (B,), half_buckets (B,)): the shapes, and
// the rotations' dtype, q's or the one q is computed in (float32 rotations for half-precision q).
inline void check_lsh_hash(const at::Tensor& q, const at::Tensor& rotations, const at::Tensor& lengths,
                           const at::Tensor& half_buckets) {
  TORCH_CHECK(q.dim() == 4, "lsh_hash: q must be (B, H, N, E), got ", q.sizes());
  const int64_t batch = q.size(0);
  TORCH_CHECK(rotations.dim() == 5 && rotations.size(0) == batch && rotations.size(1) == q.size(1) &&
                  rotations.size(2) == q.size(3) && rotations.size(4) % 16 == 0,
              "lsh_hash: rotations must be (B, H, E, R, P) with P a multiple of 16 for q ", q.sizes(),
              ", got ", rotations.sizes());
  const auto opmath = at::toOpMathType(q.scalar_type());
  TORCH_CHECK(rotations.scalar_type() == q.scalar_type() || rotations.scalar_type() == opmath,
              "lsh_hash: rotations must have the dtype of q", opmath == q.scalar_type() ? "" : " or ",
              opmath == q.scalar_type() ? "" : c10::toString(opmath), ", got ", rotations.scalar_type());
  TORCH_CHECK(lengths.dim() == 1 && lengths.size(0) == batch && half_buckets.dim() == 1 &&
                  half_buckets.size(0) == batch,
              "lsh_hash: lengths and half_buckets must be (B,) = (", batch, ",)");
}

// lsh_hash's lengths and half_buckets, read on the host: every length in [0, N], every bucket
// count in [1, P]. Returns the largest bucket count.
inline int64_t check_lsh_hash_values(const int64_t* lengths, const int64_t* half_buckets, int64_t batch,
                                     int64_t length, int64_t columns) {
  int64_t max_half = 1;
  for (int64_t b = 0; b < batch; ++b) {
    TORCH_CHECK(lengths[b] >= 0 && lengths[b] <= length, "lsh_hash: lengths[", b, "] = ", lengths[b],
                " is outside [0, ", length, "]");
    TORCH_CHECK(half_buckets[b] >= 1 && half_buckets[b] <= columns, "lsh_hash: half_buckets[", b, "] = ",
                half_buckets[b], " is outside [1, ", columns, "]");
    max_half = std::max(max_half, half_buckets[b]);
  }
  return max_half;
}

// lsh_attention_forward(q (B,H,N,E), v (B,H,N,Ev), order (B,H,R,N), lengths (B,), chunk_size).
inline void check_lsh_attention(const at::Tensor& q, const at::Tensor& v, const at::Tensor& order,
                                const at::Tensor& lengths, int64_t chunk_size) {
  TORCH_CHECK(q.dim() == 4, "lsh attention: q must be (B, H, N, E), got ", q.sizes());
  TORCH_CHECK(v.dim() == 4 && v.size(0) == q.size(0) && v.size(1) == q.size(1) && v.size(2) == q.size(2),
              "lsh attention: v must share (B, H, N) with q; got ", q.sizes(), ", ", v.sizes());
  TORCH_CHECK(v.scalar_type() == q.scalar_type(), "lsh attention: q and v must share one dtype");
  TORCH_CHECK(chunk_size >= 1, "lsh attention: chunk_size must be >= 1, got ", chunk_size);
  TORCH_CHECK(order.dim() == 4 && order.size(0) == q.size(0) && order.size(1) == q.size(1) &&
                  order.size(3) == q.size(2) && order.size(2) >= 1,
              "lsh attention: order must be (B, H, rounds, N) for q ", q.sizes(), ", got ", order.sizes());
  TORCH_CHECK(lengths.dim() == 1 && lengths.size(0) == q.size(0),
              "lsh attention: lengths must be (B,), got ", lengths.sizes());
}

// lsh_attention_backward(grad_out, q, v, order, lengths, out, lse (B,H,N), chunk_size).
inline void check_lsh_attention_backward(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& v,
                                         const at::Tensor& order, const at::Tensor& lengths,
                                         const at::Tensor& out, const at::Tensor& lse, int64_t chunk_size) {
  check_lsh_attention(q, v, order, lengths, chunk_size);
  TORCH_CHECK(grad_out.sizes() == v.sizes() && out.sizes() == v.sizes(),
              "lsh attention backward: grad_out and out must have the shape of v");
  TORCH_CHECK(lse.dim() == 3 && lse.size(0) == q.size(0) && lse.size(1) == q.size(1) && lse.size(2) == q.size(2),
              "lsh attention backward: lse must be (B, H, N), got ", lse.sizes());
}

}  // namespace attention_ext_checks
