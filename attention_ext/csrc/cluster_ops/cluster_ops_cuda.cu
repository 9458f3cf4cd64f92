// CUDA implementations of the per-cluster operations of cluster_ops.cpp (same operators,
// same semantics; see that file for the layout of assignment / offsets / members).
//
//   group_by_cluster      ATen ops on the device: a sort of (cluster, position) keys gives
//                         the members in increasing position; counts by scatter_add.
//   cluster_mean(_backward), cluster_broadcast(_backward)
//                         one thread per (row, column): a cluster's sum runs over its
//                         members in increasing position, in opmath (float for the half
//                         types), so it is deterministic; no atomics.
//   cluster_topk          each row's valid weights become distinct int64 keys (value
//                         order, then lower position first), whose top-k torch.topk picks;
//                         float64 weights (which do not fit 32 bits) use a stable sort.
#include "../common/cuda_common.cuh"
#include "checks.h"

#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <limits>

namespace {

using namespace attention_ext_cuda;

std::tuple<at::Tensor, at::Tensor> group_by_cluster_cuda(const at::Tensor& assignment, int64_t clusters) {
  attention_ext_checks::check_group_by_cluster(assignment, clusters);
  const c10::cuda::CUDAGuard guard(assignment.device());
  const int64_t batch = assignment.size(0), heads = assignment.size(1), length = assignment.size(2);
  const at::Tensor assign = assignment.contiguous();
  at::Tensor offsets = at::zeros({batch, heads, clusters + 1}, assign.options());
  if (assign.numel() == 0) return {offsets, at::full({batch, heads, length}, -1, assign.options())};
  // Checked on the device: reading the maximum on the host would stall every forward pass until
  // the GPU caught up (the ids come from hamming_kmeans, so this only guards a direct caller).
  at::_assert_async(assign.max() < clusters, "group_by_cluster: a cluster id is >= clusters");
  TORCH_CHECK((clusters + 1) <= std::numeric_limits<int64_t>::max() / std::max<int64_t>(length, 1),
              "group_by_cluster: clusters x length too large");
  // counts[c + 1] = members of cluster c; slot 0 collects the padded queries and is cleared.
  at::Tensor counts = at::zeros({batch, heads, clusters + 1}, assign.options());
  counts.scatter_add_(2, assign.clamp_min(-1) + 1, at::ones_like(assign));
  counts.select(2, 0).zero_();
  offsets.copy_(counts.cumsum(2));
  // Sorting (cluster, position) keys, padded queries last, lists every cluster's members in
  // increasing position; the keys are distinct, so the order is fully determined.
  const at::Tensor position = at::arange(length, assign.options()).view({1, 1, length});
  const at::Tensor key = at::where(assign >= 0, assign * length + position, clusters * length + position);
  const at::Tensor sorted = std::get<0>(key.sort(/*dim=*/2));
  at::Tensor members = at::where(sorted < clusters * length, sorted.remainder(length),
                                 at::full({}, -1, assign.options()));
  return {offsets, members.contiguous()};
}

// out[g, c, d] = sum (or mean) of x[g, i, d] over the members i of cluster c.
template <typename scalar_t>
__global__ void sum_member_rows_kernel(const scalar_t* __restrict__ x, const int64_t* __restrict__ offsets,
                                       const int64_t* __restrict__ members, scalar_t* __restrict__ out,
                                       int64_t groups, int64_t clusters, int64_t length, int64_t dim,
                                       bool mean) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t index = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (index >= groups * clusters * dim) return;
  const int64_t d = index % dim, gc = index / dim, g = gc / clusters, c = gc % clusters;
  const int64_t* offset = offsets + g * (clusters + 1);
  const int64_t first = offset[c], last = offset[c + 1];
  if (first == last) return;  // empty cluster: zero row, read by no query
  const int64_t* member = members + g * length;
  const scalar_t* rows = x + g * length * dim;
  acc_t acc = 0;
  for (int64_t m = first; m < last; ++m) acc += static_cast<acc_t>(rows[member[m] * dim + d]);
  if (mean) acc *= acc_t(1) / static_cast<acc_t>(last - first);
  out[index] = static_cast<scalar_t>(acc);
}

// out[g, i, d] = x[g, assignment[i], d] (divided by the cluster's size when `mean`), 0 for
// padded queries (out starts zeroed).
template <typename scalar_t>
__global__ void copy_cluster_rows_kernel(const scalar_t* __restrict__ x, const int64_t* __restrict__ assign,
                                         const int64_t* __restrict__ offsets, scalar_t* __restrict__ out,
                                         int64_t groups, int64_t clusters, int64_t length, int64_t dim,
                                         bool mean) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t index = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (index >= groups * length * dim) return;
  const int64_t d = index % dim, row = index / dim, g = row / length;
  const int64_t a = assign[row];
  if (a < 0) return;
  acc_t factor = 1;
  if (mean) {
    const int64_t* offset = offsets + g * (clusters + 1);
    factor = acc_t(1) / static_cast<acc_t>(offset[a + 1] - offset[a]);
  }
  out[index] = static_cast<scalar_t>(static_cast<acc_t>(x[(g * clusters + a) * dim + d]) * factor);
}

template <typename scalar_t>
void launch_sum_member_rows(const at::Tensor& x, const at::Tensor& offsets, const at::Tensor& members,
                            at::Tensor& out, int64_t clusters, int64_t length, bool mean) {
  const int64_t groups = out.size(0) * out.size(1), dim = out.size(3);
  const int64_t work = groups * clusters * dim;
  if (work == 0) return;
  sum_member_rows_kernel<scalar_t><<<blocks_for(work), kThreads, 0, stream()>>>(
      x.data_ptr<scalar_t>(), offsets.data_ptr<int64_t>(), members.data_ptr<int64_t>(),
      out.data_ptr<scalar_t>(), groups, clusters, length, dim, mean);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename scalar_t>
void launch_copy_cluster_rows(const at::Tensor& x, const at::Tensor& assign, const int64_t* offsets,
                              at::Tensor& out, int64_t clusters, bool mean) {
  const int64_t groups = out.size(0) * out.size(1), length = out.size(2), dim = out.size(3);
  const int64_t work = groups * length * dim;
  if (work == 0) return;
  copy_cluster_rows_kernel<scalar_t><<<blocks_for(work), kThreads, 0, stream()>>>(
      x.data_ptr<scalar_t>(), assign.data_ptr<int64_t>(), offsets, out.data_ptr<scalar_t>(), groups,
      clusters, length, dim, mean);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

at::Tensor cluster_mean_cuda(const at::Tensor& x, const at::Tensor& offsets, const at::Tensor& members) {
  attention_ext_checks::check_cluster_mean(x, offsets, members);
  check_one_device("cluster_mean", {&x, &offsets, &members});
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t length = x.size(2), clusters = offsets.size(2) - 1;
  const at::Tensor x_c = x.contiguous(), offsets_c = offsets.contiguous(), members_c = members.contiguous();
  at::Tensor out = at::zeros({x.size(0), x.size(1), clusters, x.size(3)}, x.options());
  ATTENTION_EXT_DISPATCH_FLOATING(x.scalar_type(), "cluster_mean_cuda", [&] {
    launch_sum_member_rows<scalar_t>(x_c, offsets_c, members_c, out, clusters, length, /*mean=*/true);
  });
  return out;
}

at::Tensor cluster_mean_backward_cuda(const at::Tensor& grad, const at::Tensor& assignment,
                                      const at::Tensor& offsets) {
  attention_ext_checks::check_cluster_mean_backward(grad, assignment, offsets);
  check_one_device("cluster_mean_backward", {&grad, &assignment, &offsets});
  const c10::cuda::CUDAGuard guard(grad.device());
  const int64_t clusters = grad.size(2);
  const at::Tensor grad_c = grad.contiguous(), assign_c = assignment.contiguous(),
                   offsets_c = offsets.contiguous();
  at::Tensor out = at::zeros({grad.size(0), grad.size(1), assignment.size(2), grad.size(3)}, grad.options());
  ATTENTION_EXT_DISPATCH_FLOATING(grad.scalar_type(), "cluster_mean_backward_cuda", [&] {
    launch_copy_cluster_rows<scalar_t>(grad_c, assign_c, offsets_c.data_ptr<int64_t>(), out, clusters,
                                       /*mean=*/true);
  });
  return out;
}

at::Tensor cluster_broadcast_cuda(const at::Tensor& x, const at::Tensor& assignment) {
  attention_ext_checks::check_cluster_broadcast(x, assignment);
  check_one_device("cluster_broadcast", {&x, &assignment});
  const c10::cuda::CUDAGuard guard(x.device());
  const at::Tensor x_c = x.contiguous(), assign_c = assignment.contiguous();
  at::Tensor out = at::zeros({x.size(0), x.size(1), assignment.size(2), x.size(3)}, x.options());
  ATTENTION_EXT_DISPATCH_FLOATING(x.scalar_type(), "cluster_broadcast_cuda", [&] {
    launch_copy_cluster_rows<scalar_t>(x_c, assign_c, nullptr, out, x.size(2), /*mean=*/false);
  });
  return out;
}

at::Tensor cluster_broadcast_backward_cuda(const at::Tensor& grad, const at::Tensor& offsets,
                                           const at::Tensor& members) {
  attention_ext_checks::check_cluster_broadcast_backward(grad, offsets, members);
  check_one_device("cluster_broadcast_backward", {&grad, &offsets, &members});
  const c10::cuda::CUDAGuard guard(grad.device());
  const int64_t length = grad.size(2), clusters = offsets.size(2) - 1;
  const at::Tensor grad_c = grad.contiguous(), offsets_c = offsets.contiguous(),
                   members_c = members.contiguous();
  at::Tensor out = at::zeros({grad.size(0), grad.size(1), clusters, grad.size(3)}, grad.options());
  ATTENTION_EXT_DISPATCH_FLOATING(grad.scalar_type(), "cluster_broadcast_backward_cuda", [&] {
    launch_sum_member_rows<scalar_t>(grad_c, offsets_c, members_c, out, clusters, length, /*mean=*/false);
  });
  return out;
}

// --- cluster_topk --------------------------------------------------------------------------
constexpr int64_t kInvalidKey = std::numeric_limits<int64_t>::min();

// A float's bits as an unsigned integer with the float's order (-0 counted as +0, so that
// equal weights tie as on the CPU).
// Tested on the bits: under --use_fast_math a float compare flushes subnormals, so
// `value == 0.0f` would tie every subnormal weight with 0 (the CPU orders them).
__device__ __forceinline__ uint32_t ordered_bits(float value) {
  uint32_t bits = __float_as_uint(value);
  if ((bits & 0x7fffffffu) == 0) bits = 0;
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

__device__ __forceinline__ int64_t ordered_bits(double value) {
  const int64_t bits = __double_as_longlong(value == 0.0 ? 0.0 : value);
  return bits >= 0 ? bits : (bits ^ std::numeric_limits<int64_t>::max());
}

// Keys of rows [first_row, first_row + rows): larger weight -> larger key, equal weights ->
// the lower position has the larger key; positions past the row's valid length get
// kInvalidKey. Half types and float32 pack (32-bit ordered value, ~position); float64 keys
// hold the value only (its ties are resolved by a stable sort).
template <typename scalar_t>
__global__ void topk_keys_kernel(const scalar_t* __restrict__ weights, const int64_t* __restrict__ lengths,
                                 int64_t* __restrict__ keys, int64_t first_row, int64_t rows,
                                 int64_t rows_per_batch, int64_t length) {
  const int64_t index = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (index >= rows * length) return;
  const int64_t row = first_row + index / length, position = index % length;
  const int64_t valid = clipped_length(lengths, row / rows_per_batch, length);
  if (position >= valid) {
    keys[index] = kInvalidKey;
    return;
  }
  const scalar_t w = weights[row * length + position];
  if constexpr (std::is_same_v<scalar_t, double>) {
    keys[index] = ordered_bits(w);
  } else {
    const uint64_t packed = (static_cast<uint64_t>(ordered_bits(static_cast<float>(w))) << 32) |
                            (0xffffffffull - static_cast<uint64_t>(position));
    keys[index] = static_cast<int64_t>(packed ^ 0x8000000000000000ull);
  }
}

// For every row (cluster) the positions of its k largest weights among the valid keys,
// largest first, ties to the lower position; slots past a short sequence's keys are -1.
at::Tensor cluster_topk_cuda(const at::Tensor& weights, const at::Tensor& lengths, int64_t k) {
  attention_ext_checks::check_cluster_topk(weights, lengths, k);
  const c10::cuda::CUDAGuard guard(weights.device());
  const int64_t batch = weights.size(0), heads = weights.size(1), rows_per_head = weights.size(2),
                length = weights.size(3);
  check_one_device("cluster_topk", {&weights, &lengths});
  TORCH_CHECK(length < 0xffffffffLL, "cluster_topk: at most 2^32 - 2 keys per row on CUDA, got ", length);
  const int64_t slots = std::min(k, length);
  at::Tensor out = at::full({batch, heads, rows_per_head, slots}, -1, weights.options().dtype(at::kLong));
  if (out.numel() == 0) return out;
  const at::Tensor w = weights.contiguous(), lengths_c = lengths.contiguous();
  const int64_t rows = batch * heads * rows_per_head, rows_per_batch = heads * rows_per_head;
  at::Tensor out_rows = out.view({rows, slots});
  // Rows are processed in groups so that the int64 keys take at most ~64 MiB at a time.
  const int64_t rows_per_pass = std::max<int64_t>(1, (int64_t{8} << 20) / length);
  for (int64_t first = 0; first < rows; first += rows_per_pass) {
    const int64_t count = std::min(rows_per_pass, rows - first);
    at::Tensor keys = at::empty({count, length}, out.options());
    ATTENTION_EXT_DISPATCH_FLOATING(w.scalar_type(), "cluster_topk_cuda", [&] {
      topk_keys_kernel<scalar_t><<<blocks_for(count * length), kThreads, 0, stream()>>>(
          w.data_ptr<scalar_t>(), lengths_c.data_ptr<int64_t>(), keys.data_ptr<int64_t>(), first, count,
          rows_per_batch, length);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
    at::Tensor top_keys, top_positions;
    if (w.scalar_type() == at::kDouble) {
      // A stable descending sort keeps equal weights in increasing position.
      auto sorted = keys.sort(/*stable=*/true, /*dim=*/1, /*descending=*/true);
      top_keys = std::get<0>(sorted).narrow(1, 0, slots);
      top_positions = std::get<1>(sorted).narrow(1, 0, slots);
    } else {
      auto top = keys.topk(slots, /*dim=*/1, /*largest=*/true, /*sorted=*/true);
      top_keys = std::get<0>(top);
      top_positions = std::get<1>(top);
    }
    out_rows.narrow(0, first, count)
        .copy_(at::where(top_keys == kInvalidKey, at::full({}, -1, out.options()), top_positions));
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(attention_ext, CUDA, m) {
  m.impl("group_by_cluster", &group_by_cluster_cuda);
  m.impl("cluster_mean", &cluster_mean_cuda);
  m.impl("cluster_mean_backward", &cluster_mean_backward_cuda);
  m.impl("cluster_broadcast", &cluster_broadcast_cuda);
  m.impl("cluster_broadcast_backward", &cluster_broadcast_backward_cuda);
  m.impl("cluster_topk", &cluster_topk_cuda);
}
