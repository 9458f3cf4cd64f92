// CUDA implementations of the sparse products of improved clustered attention
// (sparse_product.cpp states the operators and their conventions: -1 slots, padded queries).
//
// One block per (batch-head, cluster) walks the cluster's members; its S keys (or values)
// are read from global memory, where the cluster's few rows stay in cache. Dots of a member
// with the S keys take one warp per member (lanes along the row, coalesced); the products
// that combine key rows take one thread per (member or slot, element). Sums run in opmath
// (float for the half types).
//
// Key and value gradients: a key can be in the top-k of several clusters, so its gradient
// is a sum over clusters. Instead of atomics (whose order varies from run to run), each
// cluster writes its (S, dim) block of contributions, and a second pass adds, for every
// key, the blocks that name it in increasing cluster order (the (key, cluster, slot)
// triples are sorted once). The result is deterministic, like the CPU's.
#include "../common/cuda_common.cuh"
#include "checks.h"

#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <limits>

namespace {

using namespace attention_ext_cuda;

using attention_ext_checks::SparseInputs;
using attention_ext_checks::SparseShape;

// The cluster of this block: its flat (group, cluster) index, member rows and keys.
struct BlockCluster {
  int64_t g, index, count;
  const int64_t* member;  // positions of the members (count of them)
  const int64_t* keys;    // S key positions, -1 for none
};

__device__ __forceinline__ BlockCluster block_cluster(const SparseShape& s, const int64_t* topk,
                                                      const int64_t* offsets, const int64_t* members) {
  const int64_t c = blockIdx.x, g = blockIdx.y;
  const int64_t* offset = offsets + g * (s.clusters + 1);
  return {g, g * s.clusters + c, offset[c + 1] - offset[c], members + g * s.length + offset[c],
          topk + (g * s.clusters + c) * s.slots};
}

dim3 cluster_grid(const SparseShape& s) {
  TORCH_CHECK(s.clusters < (int64_t{1} << 31), "too many clusters for the CUDA kernels: ", s.clusters);
  return dim3(static_cast<unsigned>(s.clusters), grid_y(s.batch * s.heads));
}

// out[i, s] = scale * <rows_i, key_rows_{T[s]}> for the members i, `empty` on empty slots:
// the sparse dot (rows q, key rows k, empty -inf) and the weights' gradient of the weighted
// sum (rows grad, key rows v, scale 1, empty 0). One warp per member: the lanes split the
// element index (e = lane, lane + 32, ...), a warp sum gives each dot (a fixed order, so
// deterministic), and lane j keeps the dot of slot first + j for one coalesced store per 32
// slots. (One thread per (member, slot) walking a whole row made the 32 lanes of a warp read
// 32 different key rows at every element.)
template <typename scalar_t>
__global__ void member_key_dots_kernel(const scalar_t* __restrict__ rows, const scalar_t* __restrict__ key_rows,
                                       const int64_t* __restrict__ topk, const int64_t* __restrict__ offsets,
                                       const int64_t* __restrict__ members, scalar_t* __restrict__ out,
                                       SparseShape s, int64_t dim, double scale, double empty) {
  using acc_t = at::opmath_type<scalar_t>;
  const BlockCluster cl = block_cluster(s, topk, offsets, members);
  const int64_t base = cl.g * s.length;
  const int lane = threadIdx.x % kWarp;
  const int64_t warps = blockDim.x / kWarp;
  // Every bound below is the same in all lanes of a warp, so all 32 take part in warp_sum.
  for (int64_t m = threadIdx.x / kWarp; m < cl.count; m += warps) {
    const int64_t row = base + cl.member[m];
    const scalar_t* a = rows + row * dim;
    for (int64_t first = 0; first < s.slots; first += kWarp) {
      const int64_t count = min(static_cast<int64_t>(kWarp), s.slots - first);
      acc_t mine = 0;
      for (int64_t j = 0; j < count; ++j) {
        const int64_t key = cl.keys[first + j];
        acc_t dot = static_cast<acc_t>(empty);
        if (key >= 0) {
          const scalar_t* b = key_rows + (base + key) * dim;
          acc_t partial = 0;
          for (int64_t e = lane; e < dim; e += kWarp)
            partial += static_cast<acc_t>(a[e]) * static_cast<acc_t>(b[e]);
          dot = warp_sum(partial) * static_cast<acc_t>(scale);
        }
        if (lane == j) mine = dot;
      }
      if (lane < count) out[row * s.slots + first + lane] = static_cast<scalar_t>(mine);
    }
  }
}

// out_i[e] = factor * sum_s coefficient[i, s] * rows[T[s], e] for the members i (empty
// slots add nothing). Serves the gradient of q in sparse dot (coefficient = grad of the
// dots) and the weighted sum itself (coefficient = weights).
template <typename scalar_t>
__global__ void combine_key_rows_kernel(const scalar_t* __restrict__ coefficients,
                                        const scalar_t* __restrict__ rows, const int64_t* __restrict__ topk,
                                        const int64_t* __restrict__ offsets,
                                        const int64_t* __restrict__ members, scalar_t* __restrict__ out,
                                        SparseShape s, int64_t dim, double factor) {
  using acc_t = at::opmath_type<scalar_t>;
  const BlockCluster cl = block_cluster(s, topk, offsets, members);
  const int64_t base = cl.g * s.length;
  for (int64_t pair = threadIdx.x; pair < cl.count * dim; pair += blockDim.x) {
    const int64_t m = pair / dim, e = pair % dim;
    const int64_t row = base + cl.member[m];
    const scalar_t* coefficient = coefficients + row * s.slots;
    acc_t acc = 0;
    for (int64_t slot = 0; slot < s.slots; ++slot) {
      const int64_t key = cl.keys[slot];
      if (key < 0) continue;
      acc += static_cast<acc_t>(coefficient[slot]) * static_cast<acc_t>(rows[(base + key) * dim + e]);
    }
    out[row * dim + e] = static_cast<scalar_t>(acc * static_cast<acc_t>(factor));
  }
}

// block[g, c, s, e] = factor * sum_{members i} coefficient[i, s] * x[i, e] (0 on empty
// slots): the contribution of cluster c to the gradient of its key (or value) T[s].
template <typename scalar_t>
__global__ void cluster_key_blocks_kernel(const scalar_t* __restrict__ coefficients,
                                          const scalar_t* __restrict__ x, const int64_t* __restrict__ topk,
                                          const int64_t* __restrict__ offsets,
                                          const int64_t* __restrict__ members,
                                          at::opmath_type<scalar_t>* __restrict__ blocks, SparseShape s,
                                          int64_t dim, double factor) {
  using acc_t = at::opmath_type<scalar_t>;
  const BlockCluster cl = block_cluster(s, topk, offsets, members);
  if (cl.count == 0) return;  // blocks start zeroed
  const int64_t base = cl.g * s.length;
  for (int64_t pair = threadIdx.x; pair < s.slots * dim; pair += blockDim.x) {
    const int64_t slot = pair / dim, e = pair % dim;
    if (cl.keys[slot] < 0) continue;
    acc_t acc = 0;
    for (int64_t m = 0; m < cl.count; ++m) {
      const int64_t row = base + cl.member[m];
      acc += static_cast<acc_t>(coefficients[row * s.slots + slot]) * static_cast<acc_t>(x[row * dim + e]);
    }
    blocks[(cl.index * s.slots + slot) * dim + e] = acc * static_cast<acc_t>(factor);
  }
}

// grad_rows[g, key, e] = sum of the blocks naming that key, in increasing (cluster, slot).
// `sorted` holds the triples as key_row * (C * S) + (c * S + slot), ascending, with
// key_row = g * N + key (entries of empty slots sort last, past every key row); each
// thread starts at the first entry of a key row and sums that row's run of entries.
template <typename scalar_t>
__global__ void add_blocks_to_rows_kernel(const int64_t* __restrict__ sorted,
                                          const at::opmath_type<scalar_t>* __restrict__ blocks,
                                          scalar_t* __restrict__ grad_rows, int64_t entries,
                                          int64_t per_group, int64_t key_rows, int64_t length,
                                          int64_t slots, int64_t dim) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t index = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (index >= entries * dim) return;
  const int64_t entry = index / dim, e = index % dim;
  const int64_t key_row = sorted[entry] / per_group;
  if (key_row >= key_rows) return;                                      // an empty slot
  if (entry > 0 && sorted[entry - 1] / per_group == key_row) return;    // not the run's first
  const int64_t g = key_row / length;
  acc_t acc = 0;
  for (int64_t at = entry; at < entries && sorted[at] / per_group == key_row; ++at) {
    const int64_t cluster_slot = sorted[at] % per_group;                // c * S + slot
    acc += blocks[((g * per_group) + cluster_slot) * dim + e];
  }
  grad_rows[key_row * dim + e] = static_cast<scalar_t>(acc);
  (void)slots;
}

// Adds every cluster's (S, dim) block into the rows of its keys (see the file comment).
template <typename scalar_t>
void add_blocks_to_rows(const at::Tensor& blocks, const at::Tensor& topk, const SparseShape& s,
                        int64_t dim, at::Tensor& grad_rows) {
  const int64_t groups = s.batch * s.heads, per_group = s.clusters * s.slots;
  const int64_t key_rows = groups * s.length, entries = groups * per_group;
  if (entries == 0 || dim == 0) return;
  TORCH_CHECK(key_rows + 1 <= std::numeric_limits<int64_t>::max() / std::max<int64_t>(per_group, 1),
              "sparse products on CUDA: batch x heads x length x clusters x slots too large");
  const auto options = topk.options();
  const at::Tensor group = at::arange(groups, options).view({s.batch, s.heads, 1, 1});
  const at::Tensor cluster_slot = at::arange(per_group, options).view({1, 1, s.clusters, s.slots});
  const at::Tensor key_row = at::where(topk >= 0, group * s.length + topk, at::full({}, key_rows, options));
  const at::Tensor sorted = std::get<0>((key_row * per_group + cluster_slot).reshape({-1}).sort());
  add_blocks_to_rows_kernel<scalar_t><<<blocks_for(entries * dim), kThreads, 0, stream()>>>(
      sorted.data_ptr<int64_t>(), blocks.data_ptr<at::opmath_type<scalar_t>>(), grad_rows.data_ptr<scalar_t>(),
      entries, per_group, key_rows, s.length, s.slots, dim);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

at::Tensor clustered_sparse_dot_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& topk,
                                     const at::Tensor& offsets, const at::Tensor& members, double scale) {
  const SparseShape s = attention_ext_checks::check_clustered_sparse_dot(q, k, topk, offsets, members);
  check_one_device("clustered_sparse_dot", {&q, &k, &topk, &offsets, &members});
  const c10::cuda::CUDAGuard guard(q.device());
  const at::Tensor q_c = q.contiguous(), k_c = k.contiguous();
  const SparseInputs in(topk, offsets, members);
  at::Tensor out = at::zeros({s.batch, s.heads, s.length, s.slots}, q.options());
  if (out.numel() == 0 || s.clusters == 0) return out;
  ATTENTION_EXT_DISPATCH_FLOATING(q.scalar_type(), "clustered_sparse_dot_cuda", [&] {
    member_key_dots_kernel<scalar_t><<<cluster_grid(s), kThreads, 0, stream()>>>(
        q_c.data_ptr<scalar_t>(), k_c.data_ptr<scalar_t>(), in.topk.data_ptr<int64_t>(),
        in.offsets.data_ptr<int64_t>(), in.members.data_ptr<int64_t>(), out.data_ptr<scalar_t>(), s,
        q.size(3), scale, -INFINITY);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor> clustered_sparse_dot_backward_cuda(
    const at::Tensor& grad, const at::Tensor& q, const at::Tensor& k, const at::Tensor& topk,
    const at::Tensor& offsets, const at::Tensor& members, double scale) {
  const SparseShape s =
      attention_ext_checks::check_clustered_sparse_dot_backward(grad, q, k, topk, offsets, members);
  check_one_device("clustered_sparse_dot_backward", {&q, &k, &grad, &topk, &offsets, &members});
  const c10::cuda::CUDAGuard guard(q.device());
  const int64_t dim = q.size(3);
  const at::Tensor grad_c = grad.to(q.scalar_type()).contiguous(), q_c = q.contiguous(), k_c = k.contiguous();
  const SparseInputs in(topk, offsets, members);
  at::Tensor grad_q = at::zeros_like(q_c);
  at::Tensor grad_k = at::zeros_like(k_c);
  if (q.numel() == 0 || s.clusters == 0 || s.slots == 0) return {grad_q, grad_k};
  ATTENTION_EXT_DISPATCH_FLOATING(q.scalar_type(), "clustered_sparse_dot_backward_cuda", [&] {
    // grad_q_i = scale * sum_s grad[i, s] k_{T[s]}
    combine_key_rows_kernel<scalar_t><<<cluster_grid(s), kThreads, 0, stream()>>>(
        grad_c.data_ptr<scalar_t>(), k_c.data_ptr<scalar_t>(), in.topk.data_ptr<int64_t>(),
        in.offsets.data_ptr<int64_t>(), in.members.data_ptr<int64_t>(), grad_q.data_ptr<scalar_t>(), s,
        dim, scale);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    // grad_k_{T[s]} += scale * sum_i grad[i, s] q_i, per cluster, then per key
    at::Tensor blocks = at::zeros({s.batch * s.heads * s.clusters, s.slots, dim},
                                  q.options().dtype(at::toOpMathType(q.scalar_type())));
    cluster_key_blocks_kernel<scalar_t><<<cluster_grid(s), kThreads, 0, stream()>>>(
        grad_c.data_ptr<scalar_t>(), q_c.data_ptr<scalar_t>(), in.topk.data_ptr<int64_t>(),
        in.offsets.data_ptr<int64_t>(), in.members.data_ptr<int64_t>(),
        blocks.data_ptr<at::opmath_type<scalar_t>>(), s, dim, scale);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    add_blocks_to_rows<scalar_t>(blocks, in.topk, s, dim, grad_k);
  });
  return {grad_q, grad_k};
}

at::Tensor clustered_sparse_weighted_sum_cuda(const at::Tensor& weights, const at::Tensor& v,
                                              const at::Tensor& topk, const at::Tensor& offsets,
                                              const at::Tensor& members) {
  const SparseShape s =
      attention_ext_checks::check_clustered_sparse_weighted_sum(weights, v, topk, offsets, members);
  check_one_device("clustered_sparse_weighted_sum", {&v, &weights, &topk, &offsets, &members});
  const c10::cuda::CUDAGuard guard(v.device());
  const at::Tensor w_c = weights.contiguous(), v_c = v.contiguous();
  const SparseInputs in(topk, offsets, members);
  at::Tensor out = at::zeros({s.batch, s.heads, s.length, v.size(3)}, v.options());
  if (out.numel() == 0 || s.clusters == 0) return out;
  ATTENTION_EXT_DISPATCH_FLOATING(v.scalar_type(), "clustered_sparse_weighted_sum_cuda", [&] {
    combine_key_rows_kernel<scalar_t><<<cluster_grid(s), kThreads, 0, stream()>>>(
        w_c.data_ptr<scalar_t>(), v_c.data_ptr<scalar_t>(), in.topk.data_ptr<int64_t>(),
        in.offsets.data_ptr<int64_t>(), in.members.data_ptr<int64_t>(), out.data_ptr<scalar_t>(), s,
        v.size(3), 1.0);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor> clustered_sparse_weighted_sum_backward_cuda(
    const at::Tensor& grad, const at::Tensor& weights, const at::Tensor& v, const at::Tensor& topk,
    const at::Tensor& offsets, const at::Tensor& members) {
  const SparseShape s = attention_ext_checks::check_clustered_sparse_weighted_sum_backward(
      grad, weights, v, topk, offsets, members);
  check_one_device("clustered_sparse_weighted_sum_backward", {&v, &weights, &grad, &topk, &offsets, &members});
  const c10::cuda::CUDAGuard guard(v.device());
  const int64_t dim = v.size(3);
  const at::Tensor grad_c = grad.to(v.scalar_type()).contiguous(), w_c = weights.contiguous(),
                   v_c = v.contiguous();
  const SparseInputs in(topk, offsets, members);
  at::Tensor grad_w = at::zeros_like(w_c);
  at::Tensor grad_v = at::zeros_like(v_c);
  if (v.numel() == 0 || s.clusters == 0 || s.slots == 0) return {grad_w, grad_v};
  ATTENTION_EXT_DISPATCH_FLOATING(v.scalar_type(), "clustered_sparse_weighted_sum_backward_cuda", [&] {
    // grad_w[i, s] = <grad_i, v_{T[s]}>, 0 on empty slots
    member_key_dots_kernel<scalar_t><<<cluster_grid(s), kThreads, 0, stream()>>>(
        grad_c.data_ptr<scalar_t>(), v_c.data_ptr<scalar_t>(), in.topk.data_ptr<int64_t>(),
        in.offsets.data_ptr<int64_t>(), in.members.data_ptr<int64_t>(), grad_w.data_ptr<scalar_t>(), s, dim,
        1.0, 0.0);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    // grad_v_{T[s]} += sum_i weights[i, s] grad_i, per cluster, then per value row
    at::Tensor blocks = at::zeros({s.batch * s.heads * s.clusters, s.slots, dim},
                                  v.options().dtype(at::toOpMathType(v.scalar_type())));
    cluster_key_blocks_kernel<scalar_t><<<cluster_grid(s), kThreads, 0, stream()>>>(
        w_c.data_ptr<scalar_t>(), grad_c.data_ptr<scalar_t>(), in.topk.data_ptr<int64_t>(),
        in.offsets.data_ptr<int64_t>(), in.members.data_ptr<int64_t>(),
        blocks.data_ptr<at::opmath_type<scalar_t>>(), s, dim, 1.0);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    add_blocks_to_rows<scalar_t>(blocks, in.topk, s, dim, grad_v);
  });
  return {grad_w, grad_v};
}

}  // namespace

TORCH_LIBRARY_IMPL(attention_ext, CUDA, m) {
  m.impl("clustered_sparse_dot", &clustered_sparse_dot_cuda);
  m.impl("clustered_sparse_dot_backward", &clustered_sparse_dot_backward_cuda);
  m.impl("clustered_sparse_weighted_sum", &clustered_sparse_weighted_sum_cuda);
  m.impl("clustered_sparse_weighted_sum_backward", &clustered_sparse_weighted_sum_backward_cuda);
}
