// The two sparse products of improved clustered attention (paper sec. 3.3, supp. A.2):
// every query i of cluster j meets only the keys T_j = topk[j, :] of its cluster.
//
//   clustered_sparse_dot(q, k, topk, offsets, members, scale) -> dots (B,H,N,S)
//       dots[i, s] = scale * <q_i, k_{topk[j, s]}>
//   clustered_sparse_weighted_sum(weights (B,H,N,S), v (B,H,N,D), topk, offsets, members)
//       -> (B,H,N,D),  out_i = sum_s weights[i, s] * v_{topk[j, s]}
//   and their backward operators (the gradients with respect to q, k and weights, v).
//
// topk (B,H,C,S) int64 lists key positions per cluster; a slot of -1 is "no key" (a
// sequence with fewer valid keys than S): its dot is -inf (zero weight after softmax) and
// it adds nothing to the weighted sum. Queries in no cluster (padded ones) get dots 0
// (finite, so a softmax over them stays finite) and a zero weighted sum, and pass no
// gradient. offsets/members list the queries of each cluster (see cluster_ops.cpp).
//
// Work is done cluster by cluster (parallel over batch x heads x clusters): the members'
// rows and the cluster's S key (or value) rows are copied into small zero-padded
// contiguous blocks, and every product is a small dense matrix product computed in
// register tiles (`small_product`). Key and value gradients are summed per cluster into
// an (S, E) block that is added into the rows of its keys without two threads ever
// writing the same row (`for_each_cluster_adding_key_gradients`).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "input_checks.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

namespace {

using attention_ext_checks::SparseInputs;
using attention_ext_checks::SparseShape;
using attention_ext_checks::check_sparse;
using attention_ext_checks::check_sparse_keys;
using attention_ext_checks::check_sparse_scores;

// Elements of one 512-bit vector: the width of a column tile of the small products.
template <typename scalar_t>
constexpr int64_t kLanes = 64 / static_cast<int64_t>(sizeof(scalar_t));

inline int64_t round_up(int64_t value, int64_t multiple) { return (value + multiple - 1) / multiple * multiple; }

// One R x kLanes tile of C = A @ B, held in registers over the whole sum over k (a
// running sum kept in memory would make every step wait for the previous store).
// A(r, k) = A[r * a_row + k * a_col], so a transposed A is a_row = 1, a_col = lda.
template <typename scalar_t, int R>
inline void product_tile(int64_t depth, const scalar_t* A, int64_t a_row, int64_t a_col,
                         const scalar_t* B, int64_t ldb, scalar_t* C, int64_t ldc) {
  constexpr int64_t W = kLanes<scalar_t>;
  scalar_t acc[R][W];
  for (int r = 0; r < R; ++r)
    for (int64_t j = 0; j < W; ++j) acc[r][j] = 0;
  for (int64_t k = 0; k < depth; ++k) {
    const scalar_t* b = B + k * ldb;
    for (int r = 0; r < R; ++r) {
      const scalar_t a = A[r * a_row + k * a_col];
#pragma omp simd
      for (int64_t j = 0; j < W; ++j) acc[r][j] += a * b[j];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int64_t j = 0; j < W; ++j) C[r * ldc + j] = acc[r][j];
}

// C (rows x columns) = A (rows x depth) @ B (depth x columns) for the small per-cluster
// products; B and C are row-major with strides ldb, ldc, and columns, ldb and ldc are
// multiples of kLanes (the callers pad with zeros).
template <typename scalar_t>
void small_product(int64_t rows, int64_t columns, int64_t depth, const scalar_t* A, int64_t a_row,
                   int64_t a_col, const scalar_t* B, int64_t ldb, scalar_t* C, int64_t ldc) {
  for (int64_t n = 0; n < columns; n += kLanes<scalar_t>) {
    int64_t m = 0;
    for (; m + 8 <= rows; m += 8)
      product_tile<scalar_t, 8>(depth, A + m * a_row, a_row, a_col, B + n, ldb, C + m * ldc + n, ldc);
    for (; m + 4 <= rows; m += 4)
      product_tile<scalar_t, 4>(depth, A + m * a_row, a_row, a_col, B + n, ldb, C + m * ldc + n, ldc);
    for (; m < rows; ++m)
      product_tile<scalar_t, 1>(depth, A + m * a_row, a_row, a_col, B + n, ldb, C + m * ldc + n, ldc);
  }
}

// The gathers below read rows at scattered positions; asking for a row a few steps ahead
// hides most of the memory latency, which otherwise dominates these kernels.
constexpr int64_t kPrefetchRows = 4;

template <typename scalar_t>
inline void prefetch_row(const scalar_t* rows, int64_t index, int64_t dim) {
  if (index < 0) return;
  const char* start = reinterpret_cast<const char*>(rows + index * dim);
  const char* stop = reinterpret_cast<const char*>(rows + (index + 1) * dim);
  for (const char* line = start; line < stop; line += 64) __builtin_prefetch(line);
}

// out (count x stride) = the rows `index` of rows (. x dim), zero-padded to `stride`
// columns, times `factor`; an index < 0 gives a zero row.
template <typename scalar_t>
void gather_rows(const scalar_t* rows, const int64_t* index, int64_t count, int64_t dim, int64_t stride,
                 scalar_t factor, scalar_t* out) {
  for (int64_t m = 0; m < count; ++m) {
    if (m + kPrefetchRows < count) prefetch_row(rows, index[m + kPrefetchRows], dim);
    scalar_t* dst = out + m * stride;
    std::fill(dst, dst + stride, scalar_t(0));
    if (index[m] < 0) continue;
    const scalar_t* src = rows + index[m] * dim;
    for (int64_t d = 0; d < dim; ++d) dst[d] = factor * src[d];
  }
}

// out (dim x stride) = the transposed rows `index` of rows (. x dim), zero-padded to
// `stride` columns; an index < 0 gives a zero column.
template <typename scalar_t>
void gather_columns(const scalar_t* rows, const int64_t* index, int64_t count, int64_t dim, int64_t stride,
                    scalar_t* out) {
  std::fill(out, out + dim * stride, scalar_t(0));
  for (int64_t m = 0; m < count; ++m) {
    if (m + kPrefetchRows < count) prefetch_row(rows, index[m + kPrefetchRows], dim);
    if (index[m] < 0) continue;
    const scalar_t* src = rows + index[m] * dim;
    for (int64_t d = 0; d < dim; ++d) out[d * stride + m] = src[d];
  }
}

// The cluster's slot coefficients of its members, (count x slots), zero on empty slots.
// The members' rows lie anywhere in the sequence: their loads missed the caches one after
// the other (most of the time of the three kernels that call this), so rows are asked for
// a few members ahead, and a row is copied with one vector select instead of a branch per slot.
template <typename scalar_t>
void gather_coefficients(const scalar_t* coefficients, const int64_t* query, int64_t count,
                         const int64_t* keys, int64_t slots, scalar_t factor, scalar_t* out) {
  for (int64_t m = 0; m < count; ++m) {
    if (m + kPrefetchRows < count) prefetch_row(coefficients, query[m + kPrefetchRows], slots);
    const scalar_t* src = coefficients + query[m] * slots;
    scalar_t* dst = out + m * slots;
#pragma omp simd
    for (int64_t slot = 0; slot < slots; ++slot) dst[slot] = keys[slot] < 0 ? scalar_t(0) : factor * src[slot];
  }
}

// Per-thread buffers of the cluster bodies, reused from cluster to cluster (a body
// resizes them to what it needs; they only grow, so allocation stops after the first
// clusters).
template <typename scalar_t>
struct Scratch {
  std::vector<int64_t> rows;  // flat (batch-head, position) row of each member
  std::vector<scalar_t> a, b, c, d;
};

// One cluster with members: its (batch-head) group g, flat index g * clusters + c, its S
// key positions and the flat rows of its `count` member queries (scratch.rows).
struct Cluster {
  int64_t index, g;
  const int64_t* keys;
  int64_t count;
};

template <typename scalar_t, typename Body>
void run_cluster(const SparseShape& s, const int64_t* topk, const int64_t* offsets, const int64_t* members,
                 int64_t index, Scratch<scalar_t>& scratch, const Body& body) {
  const int64_t g = index / s.clusters, c = index % s.clusters;
  const int64_t* offset = offsets + g * (s.clusters + 1);
  const int64_t count = offset[c + 1] - offset[c];
  if (count == 0) return;
  const int64_t* member = members + g * s.length + offset[c];
  scratch.rows.resize(count);
  for (int64_t m = 0; m < count; ++m) scratch.rows[m] = g * s.length + member[m];
  body(scratch, Cluster{index, g, topk + index * s.slots, count});
}

// Calls body(scratch, cluster) for every cluster with members, shared out over all
// (batch, head, cluster)s.
template <typename scalar_t, typename Body>
void for_each_cluster(const SparseShape& s, const int64_t* topk, const int64_t* offsets,
                      const int64_t* members, const Body& body) {
  at::parallel_for(0, s.batch * s.heads * s.clusters, 4, [&](int64_t begin, int64_t end) {
    Scratch<scalar_t> scratch;
    for (int64_t index = begin; index < end; ++index)
      run_cluster(s, topk, offsets, members, index, scratch, body);
  });
}

// rows[keys[slot]] += block[slot] for the S (slots, dim) rows of a cluster's block.
template <typename scalar_t>
void add_block(const scalar_t* block, const int64_t* keys, int64_t slots, int64_t dim, scalar_t* rows) {
  for (int64_t slot = 0; slot < slots; ++slot) {
    if (slot + kPrefetchRows < slots) prefetch_row(rows, keys[slot + kPrefetchRows], dim);  // scattered rows
    if (keys[slot] < 0) continue;
    const scalar_t* src = block + slot * dim;
    scalar_t* dst = rows + keys[slot] * dim;
#pragma omp simd
    for (int64_t d = 0; d < dim; ++d) dst[d] += src[d];
  }
}

// As for_each_cluster, for backward bodies that also compute the gradient of the
// cluster's S key (or value) rows: body(scratch, cluster, block) writes that (S, dim)
// block, which is added into grad_rows (B, H, N, dim) at the cluster's keys. Clusters of
// one (batch, head) share keys, so their additions must not run concurrently:
// - with at least as many (batch, head)s as threads, a task takes whole (batch, head)s
//   and adds each block right away, while it is in cache;
// - otherwise (batch 1, few heads) the clusters are shared out, every block is kept, and
//   the blocks are added afterwards, one (batch, head) per task.
// Either way the additions into a row happen in cluster order, so the result does not
// depend on the thread count.
template <typename scalar_t, typename Body>
void for_each_cluster_adding_key_gradients(const SparseShape& s, const int64_t* topk, const int64_t* offsets,
                                           const int64_t* members, int64_t dim, scalar_t* grad_rows,
                                           const Body& body) {
  const int64_t groups = s.batch * s.heads, block_size = s.slots * dim;
  auto nonempty = [&](int64_t g, int64_t c) {
    const int64_t* offset = offsets + g * (s.clusters + 1);
    return offset[c + 1] > offset[c];
  };
  if (groups >= at::get_num_threads()) {
    at::parallel_for(0, groups, 1, [&](int64_t begin, int64_t end) {
      Scratch<scalar_t> scratch;
      std::vector<scalar_t> block(block_size);
      for (int64_t index = begin * s.clusters; index < end * s.clusters; ++index)
        run_cluster(s, topk, offsets, members, index, scratch, [&](Scratch<scalar_t>& sc, const Cluster& cluster) {
          body(sc, cluster, block.data());
          add_block(block.data(), cluster.keys, s.slots, dim, grad_rows + cluster.g * s.length * dim);
        });
    });
    return;
  }
  // Uninitialised on purpose: only the blocks of clusters with members are written and read.
  std::unique_ptr<scalar_t[]> blocks(new scalar_t[groups * s.clusters * block_size]);
  for_each_cluster<scalar_t>(s, topk, offsets, members, [&](Scratch<scalar_t>& sc, const Cluster& cluster) {
    body(sc, cluster, blocks.get() + cluster.index * block_size);
  });
  at::parallel_for(0, groups, 1, [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g)
      for (int64_t c = 0; c < s.clusters; ++c)
        if (nonempty(g, c))
          add_block(blocks.get() + (g * s.clusters + c) * block_size, topk + (g * s.clusters + c) * s.slots,
                    s.slots, dim, grad_rows + g * s.length * dim);
  });
}

template <typename scalar_t>
void sparse_dot_kernel(const scalar_t* q, const scalar_t* k, const int64_t* topk, const int64_t* offsets,
                       const int64_t* members, scalar_t* out, const SparseShape& s, int64_t dim,
                       scalar_t factor) {
  const int64_t padded_slots = round_up(s.slots, kLanes<scalar_t>);
  for_each_cluster<scalar_t>(s, topk, offsets, members, [&](Scratch<scalar_t>& sc, const Cluster& cluster) {
    const int64_t count = cluster.count;
    const int64_t* rows = sc.rows.data();
    sc.a.resize(dim * padded_slots);
    sc.b.resize(count * dim);
    sc.c.resize(count * padded_slots);
    gather_columns(k + cluster.g * s.length * dim, cluster.keys, s.slots, dim, padded_slots, sc.a.data());
    gather_rows(q, rows, count, dim, dim, factor, sc.b.data());
    small_product(count, padded_slots, dim, sc.b.data(), dim, 1, sc.a.data(), padded_slots, sc.c.data(),
                  padded_slots);
    const int64_t* keys = cluster.keys;
    for (int64_t m = 0; m < count; ++m) {
      const scalar_t* src = sc.c.data() + m * padded_slots;
      scalar_t* dst = out + rows[m] * s.slots;
#pragma omp simd
      for (int64_t slot = 0; slot < s.slots; ++slot)
        dst[slot] = keys[slot] < 0 ? -std::numeric_limits<scalar_t>::infinity() : src[slot];
    }
  });
}

template <typename scalar_t>
void sparse_dot_backward_kernel(const scalar_t* grad, const scalar_t* q, const scalar_t* k,
                                const int64_t* topk, const int64_t* offsets, const int64_t* members,
                                scalar_t* grad_q, scalar_t* grad_k, const SparseShape& s, int64_t dim,
                                scalar_t factor) {
  const int64_t padded_dim = round_up(dim, kLanes<scalar_t>);
  for_each_cluster_adding_key_gradients<scalar_t>(
      s, topk, offsets, members, dim, grad_k,
      [&](Scratch<scalar_t>& sc, const Cluster& cluster, scalar_t* key_grad) {
    const int64_t count = cluster.count;
    const int64_t* rows = sc.rows.data();
    sc.a.resize(count * s.slots);
    sc.b.resize(s.slots * padded_dim);
    sc.c.resize(count * padded_dim);
    sc.d.resize(std::max(count, s.slots) * padded_dim);
    gather_coefficients(grad, rows, count, cluster.keys, s.slots, factor, sc.a.data());
    // grad_q_i = scale * sum_s grad[i, s] k_{T[s]}
    gather_rows(k + cluster.g * s.length * dim, cluster.keys, s.slots, dim, padded_dim, scalar_t(1), sc.b.data());
    small_product(count, padded_dim, s.slots, sc.a.data(), s.slots, 1, sc.b.data(), padded_dim, sc.d.data(),
                  padded_dim);
    for (int64_t m = 0; m < count; ++m)
      std::copy(sc.d.data() + m * padded_dim, sc.d.data() + m * padded_dim + dim, grad_q + rows[m] * dim);
    // grad_k_{T[s]} += scale * sum_i grad[i, s] q_i: coefficient^T @ queries
    gather_rows(q, rows, count, dim, padded_dim, scalar_t(1), sc.c.data());
    small_product(s.slots, padded_dim, count, sc.a.data(), 1, s.slots, sc.c.data(), padded_dim, sc.d.data(),
                  padded_dim);
    for (int64_t slot = 0; slot < s.slots; ++slot)
      std::copy(sc.d.data() + slot * padded_dim, sc.d.data() + slot * padded_dim + dim, key_grad + slot * dim);
  });
}

template <typename scalar_t>
void sparse_weighted_sum_kernel(const scalar_t* weights, const scalar_t* v, const int64_t* topk,
                                const int64_t* offsets, const int64_t* members, scalar_t* out,
                                const SparseShape& s, int64_t dim) {
  const int64_t padded_dim = round_up(dim, kLanes<scalar_t>);
  for_each_cluster<scalar_t>(s, topk, offsets, members, [&](Scratch<scalar_t>& sc, const Cluster& cluster) {
    const int64_t count = cluster.count;
    const int64_t* rows = sc.rows.data();
    sc.a.resize(count * s.slots);
    sc.b.resize(s.slots * padded_dim);
    sc.c.resize(count * padded_dim);
    gather_coefficients(weights, rows, count, cluster.keys, s.slots, scalar_t(1), sc.a.data());
    gather_rows(v + cluster.g * s.length * dim, cluster.keys, s.slots, dim, padded_dim, scalar_t(1), sc.b.data());
    small_product(count, padded_dim, s.slots, sc.a.data(), s.slots, 1, sc.b.data(), padded_dim, sc.c.data(),
                  padded_dim);
    for (int64_t m = 0; m < count; ++m)
      std::copy(sc.c.data() + m * padded_dim, sc.c.data() + m * padded_dim + dim, out + rows[m] * dim);
  });
}

template <typename scalar_t>
void sparse_weighted_sum_backward_kernel(const scalar_t* grad, const scalar_t* weights, const scalar_t* v,
                                         const int64_t* topk, const int64_t* offsets,
                                         const int64_t* members, scalar_t* grad_w, scalar_t* grad_v,
                                         const SparseShape& s, int64_t dim) {
  const int64_t padded_dim = round_up(dim, kLanes<scalar_t>);
  const int64_t padded_slots = round_up(s.slots, kLanes<scalar_t>);
  for_each_cluster_adding_key_gradients<scalar_t>(
      s, topk, offsets, members, dim, grad_v,
      [&](Scratch<scalar_t>& sc, const Cluster& cluster, scalar_t* value_grad) {
    const int64_t count = cluster.count;
    const int64_t* rows = sc.rows.data();
    sc.a.resize(count * padded_dim);
    sc.b.resize(dim * padded_slots);
    sc.c.resize(count * s.slots);
    sc.d.resize(std::max(count * padded_slots, s.slots * padded_dim));
    gather_rows(grad, rows, count, dim, padded_dim, scalar_t(1), sc.a.data());
    // grad_w[i, s] = <grad_i, v_{T[s]}> (0 on empty slots: zero columns)
    gather_columns(v + cluster.g * s.length * dim, cluster.keys, s.slots, dim, padded_slots, sc.b.data());
    small_product(count, padded_slots, dim, sc.a.data(), padded_dim, 1, sc.b.data(), padded_slots, sc.d.data(),
                  padded_slots);
    for (int64_t m = 0; m < count; ++m)
      std::copy(sc.d.data() + m * padded_slots, sc.d.data() + m * padded_slots + s.slots,
                grad_w + rows[m] * s.slots);
    // grad_v_{T[s]} += sum_i weights[i, s] grad_i: weights^T @ grads
    gather_coefficients(weights, rows, count, cluster.keys, s.slots, scalar_t(1), sc.c.data());
    small_product(s.slots, padded_dim, count, sc.c.data(), 1, s.slots, sc.a.data(), padded_dim, sc.d.data(),
                  padded_dim);
    for (int64_t slot = 0; slot < s.slots; ++slot)
      std::copy(sc.d.data() + slot * padded_dim, sc.d.data() + slot * padded_dim + dim, value_grad + slot * dim);
  });
}

at::Tensor clustered_sparse_dot(const at::Tensor& q, const at::Tensor& k, const at::Tensor& topk,
                                const at::Tensor& offsets, const at::Tensor& members, double scale) {
  const SparseShape s = check_sparse(q, topk, offsets, members, "clustered_sparse_dot");
  check_sparse_keys(q, k, "clustered_sparse_dot");
  const at::Tensor q_c = q.contiguous(), k_c = k.contiguous();
  const SparseInputs in(topk, offsets, members);
  at::Tensor out = at::zeros({s.batch, s.heads, s.length, s.slots}, q.options());
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "clustered_sparse_dot", [&] {
    sparse_dot_kernel<scalar_t>(q_c.data_ptr<scalar_t>(), k_c.data_ptr<scalar_t>(),
                                in.topk.data_ptr<int64_t>(), in.offsets.data_ptr<int64_t>(),
                                in.members.data_ptr<int64_t>(), out.data_ptr<scalar_t>(), s, q.size(3),
                                static_cast<scalar_t>(scale));
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor> clustered_sparse_dot_backward(
    const at::Tensor& grad, const at::Tensor& q, const at::Tensor& k, const at::Tensor& topk,
    const at::Tensor& offsets, const at::Tensor& members, double scale) {
  const SparseShape s = check_sparse(q, topk, offsets, members, "clustered_sparse_dot_backward");
  check_sparse_keys(q, k, "clustered_sparse_dot_backward");
  check_sparse_scores(grad, s, at::ScalarType::Undefined, "clustered_sparse_dot_backward", "grad");
  const int64_t dim = q.size(3);
  const at::Tensor grad_c = grad.contiguous(), q_c = q.contiguous(), k_c = k.contiguous();
  const SparseInputs in(topk, offsets, members);
  at::Tensor grad_q = at::zeros_like(q_c);
  at::Tensor grad_k = at::zeros_like(k_c);
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "clustered_sparse_dot_backward", [&] {
    sparse_dot_backward_kernel<scalar_t>(grad_c.data_ptr<scalar_t>(), q_c.data_ptr<scalar_t>(),
                                         k_c.data_ptr<scalar_t>(), in.topk.data_ptr<int64_t>(),
                                         in.offsets.data_ptr<int64_t>(), in.members.data_ptr<int64_t>(),
                                         grad_q.data_ptr<scalar_t>(), grad_k.data_ptr<scalar_t>(), s, dim,
                                         static_cast<scalar_t>(scale));
  });
  return {grad_q, grad_k};
}

at::Tensor clustered_sparse_weighted_sum(const at::Tensor& weights, const at::Tensor& v,
                                         const at::Tensor& topk, const at::Tensor& offsets,
                                         const at::Tensor& members) {
  const SparseShape s = check_sparse(v, topk, offsets, members, "clustered_sparse_weighted_sum");
  check_sparse_scores(weights, s, v.scalar_type(), "clustered_sparse_weighted_sum", "weights");
  const at::Tensor w_c = weights.contiguous(), v_c = v.contiguous();
  const SparseInputs in(topk, offsets, members);
  at::Tensor out = at::zeros({s.batch, s.heads, s.length, v.size(3)}, v.options());
  AT_DISPATCH_FLOATING_TYPES(v.scalar_type(), "clustered_sparse_weighted_sum", [&] {
    sparse_weighted_sum_kernel<scalar_t>(w_c.data_ptr<scalar_t>(), v_c.data_ptr<scalar_t>(),
                                         in.topk.data_ptr<int64_t>(), in.offsets.data_ptr<int64_t>(),
                                         in.members.data_ptr<int64_t>(), out.data_ptr<scalar_t>(), s,
                                         v.size(3));
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor> clustered_sparse_weighted_sum_backward(
    const at::Tensor& grad, const at::Tensor& weights, const at::Tensor& v, const at::Tensor& topk,
    const at::Tensor& offsets, const at::Tensor& members) {
  const SparseShape s = check_sparse(v, topk, offsets, members, "clustered_sparse_weighted_sum_backward");
  TORCH_CHECK(grad.sizes() == v.sizes(), "clustered_sparse_weighted_sum_backward: grad must match v ",
              v.sizes(), ", got ", grad.sizes());
  check_sparse_scores(weights, s, v.scalar_type(), "clustered_sparse_weighted_sum_backward", "weights");
  const int64_t dim = v.size(3);
  const at::Tensor grad_c = grad.contiguous(), w_c = weights.contiguous(), v_c = v.contiguous();
  const SparseInputs in(topk, offsets, members);
  at::Tensor grad_w = at::zeros_like(w_c);
  at::Tensor grad_v = at::zeros_like(v_c);
  AT_DISPATCH_FLOATING_TYPES(v.scalar_type(), "clustered_sparse_weighted_sum_backward", [&] {
    sparse_weighted_sum_backward_kernel<scalar_t>(
        grad_c.data_ptr<scalar_t>(), w_c.data_ptr<scalar_t>(), v_c.data_ptr<scalar_t>(),
        in.topk.data_ptr<int64_t>(), in.offsets.data_ptr<int64_t>(), in.members.data_ptr<int64_t>(),
        grad_w.data_ptr<scalar_t>(), grad_v.data_ptr<scalar_t>(), s, dim);
  });
  return {grad_w, grad_v};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(attention_ext, m) {
  m.def("clustered_sparse_dot(Tensor q, Tensor k, Tensor topk, Tensor offsets, Tensor members,"
        " float scale) -> Tensor");
  m.def("clustered_sparse_dot_backward(Tensor grad, Tensor q, Tensor k, Tensor topk, Tensor offsets,"
        " Tensor members, float scale) -> (Tensor, Tensor)");
  m.def("clustered_sparse_weighted_sum(Tensor weights, Tensor v, Tensor topk, Tensor offsets,"
        " Tensor members) -> Tensor");
  m.def("clustered_sparse_weighted_sum_backward(Tensor grad, Tensor weights, Tensor v, Tensor topk,"
        " Tensor offsets, Tensor members) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(attention_ext, CPU, m) {
  m.impl("clustered_sparse_dot", &clustered_sparse_dot);
  m.impl("clustered_sparse_dot_backward", &clustered_sparse_dot_backward);
  m.impl("clustered_sparse_weighted_sum", &clustered_sparse_weighted_sum);
  m.impl("clustered_sparse_weighted_sum_backward", &clustered_sparse_weighted_sum_backward);
}
