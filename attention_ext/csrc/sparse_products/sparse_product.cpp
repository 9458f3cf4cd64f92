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
// writing the same row (`for_each_cluster_adding_key_gradients`). These helpers live in
// cluster_blocks.h, shared with the fused kernels of clustered_top_attention.cpp, which
// the CPU route of ImprovedClusteredAttention uses instead of these four operators (they
// stay for experiments and as the CPU twins of the CUDA kernels).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "checks.h"
#include "cluster_blocks.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

namespace {

using attention_ext_checks::SparseInputs;
using attention_ext_checks::SparseShape;
using cluster_blocks::Cluster;
using cluster_blocks::Scratch;
using cluster_blocks::for_each_cluster;
using cluster_blocks::for_each_cluster_adding_key_gradients;
using cluster_blocks::gather_coefficients;
using cluster_blocks::gather_columns;
using cluster_blocks::gather_rows;
using cluster_blocks::kLanes;
using cluster_blocks::round_up;
using cluster_blocks::small_product;

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
      s, topk, offsets, members, {{grad_k, dim}},
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
      s, topk, offsets, members, {{grad_v, dim}},
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
  const SparseShape s = attention_ext_checks::check_clustered_sparse_dot(q, k, topk, offsets, members);
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
  const SparseShape s =
      attention_ext_checks::check_clustered_sparse_dot_backward(grad, q, k, topk, offsets, members);
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
  const SparseShape s =
      attention_ext_checks::check_clustered_sparse_weighted_sum(weights, v, topk, offsets, members);
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
  const SparseShape s = attention_ext_checks::check_clustered_sparse_weighted_sum_backward(
      grad, weights, v, topk, offsets, members);
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
