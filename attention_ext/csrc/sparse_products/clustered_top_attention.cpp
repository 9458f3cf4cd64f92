// The top-key part of improved clustered attention (paper sec. 3.3, eq. 15-17) on the CPU,
// fused into one operator pair: query i of cluster j gets
//
//   out_i = m_j * sum_s softmax_s(scale * <q_i, k_{T_j[s]}>) v_{T_j[s]} + rest_j
//
//   clustered_top_attention(q (B,H,N,E), k (B,H,N,E), v (B,H,N,D), topk (B,H,C,S) int64,
//                           offsets, members, mass (B,H,C), rest (B,H,C,D), scale)
//       -> (out (B,H,N,D), weights (B,H,N,S))
//   clustered_top_attention_backward(grad_out, q, k, v, topk, offsets, members, mass, weights, scale)
//       -> (grad_q, grad_k, grad_v, grad_mass (B,H,C), grad_rest (B,H,C,D))
//
// `weights` are the softmax probabilities (before the mass) at each query's row, kept for
// the backward. A slot of -1 is no key (score -inf, weight 0; a row without any key gets
// weights 0 and out = rest_j); queries in no cluster (padded ones) get out 0 and weights 0
// and pass no gradient. offsets/members list the queries of each cluster (cluster_ops.cpp).
//
// Why one pair: the unfused route (sparse dot, softmax, times the broadcast mass, sparse
// weighted sum, plus the broadcast rest; the CUDA route still) gathers the members' scattered
// rows again in every stage and writes a (B,H,N,S) or (B,H,N,D) tensor between stages. All
// queries of cluster j share the keys T_j, so here a cluster's members' rows and its S key and
// value rows are gathered once (cluster_blocks.h) and everything else is small dense products
// and row loops on those blocks, in cache.
//
// The backward reads the saved weights rather than recomputing them from q and k (one
// 128-byte row per member for S = 32 float32, against one more members x S x E product and
// the exponentials): measured at N = 4096 (1 x 6 heads x 64), recomputing made forward +
// backward about 1 ms slower (9.2 against 8.2 ms on 2 threads, 19.6 against 18.7 on one).
//
// Rows written once at scattered positions (out, weights, grad_q) are written with streaming
// stores (without them the forward took 7.3 instead of 5.1 ms on one thread at N = 4096: a
// plain store first reads the row's lines), and those outputs are allocated without
// zero-filling; only the rows of queries in no cluster are zeroed.
//
// Backward per cluster, with W the members' weights, G their rows of grad_out and m = m_j:
//   dW = G V_T^T, dV_T = (m W)^T G, grad_m = sum_i sum_s W dW, grad_rest = sum_i G_i,
//   dS = scale m W (dW - rowsum_s(W dW)), dQ = dS K_T, dK_T = dS^T Q.
// Key and value gradients are added into their rows in cluster order without two threads
// writing one row (for_each_cluster_adding_key_gradients): the results do not depend on the
// thread count.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "../common/vector_exp.h"
#include "checks.h"
#include "cluster_blocks.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <tuple>
#include <vector>

namespace {

using attention_ext_checks::SparseInputs;
using attention_ext_checks::SparseShape;
using attention_ext_checks::check_sparse;
using attention_ext_checks::check_sparse_keys;
using attention_ext_checks::check_sparse_scores;
using cluster_blocks::Cluster;
using cluster_blocks::Scratch;
using cluster_blocks::finish_streaming_stores;
using cluster_blocks::for_each_cluster;
using cluster_blocks::for_each_cluster_adding_key_gradients;
using cluster_blocks::gather_coefficients;
using cluster_blocks::gather_columns;
using cluster_blocks::gather_rows;
using cluster_blocks::kLanes;
using cluster_blocks::round_up;
using cluster_blocks::small_product;
using cluster_blocks::store_row_streaming;
using cluster_blocks::zero_rows_outside_clusters;
using vector_exp::exp_vectorisable;

template <typename scalar_t>
void top_attention_kernel(const scalar_t* q, const scalar_t* k, const scalar_t* v, const int64_t* topk,
                          const int64_t* offsets, const int64_t* members, const scalar_t* mass,
                          const scalar_t* rest, scalar_t* out, scalar_t* weights, const SparseShape& s,
                          int64_t dim, int64_t value_dim, scalar_t scale) {
  const int64_t slots = s.slots;
  const int64_t padded_slots = round_up(slots, kLanes<scalar_t>);
  const int64_t padded_values = round_up(value_dim, kLanes<scalar_t>);
  constexpr scalar_t minus_infinity = -std::numeric_limits<scalar_t>::infinity();
  for_each_cluster<scalar_t>(s, topk, offsets, members, [&](Scratch<scalar_t>& sc, const Cluster& cluster) {
    const int64_t count = cluster.count;
    const int64_t* rows = sc.rows.data();
    const int64_t* keys = cluster.keys;
    sc.a.resize(dim * padded_slots);                            // K_T^T
    sc.b.resize(count * std::max(dim, padded_values));          // the scaled queries, then the output rows
    sc.c.resize(count * padded_slots);                          // scores, then m W
    sc.d.resize(slots * padded_values);                         // V_T
    sc.e.resize(slots);                                         // 0 on a key, -inf on an empty slot
    gather_columns(k + cluster.g * s.length * dim, keys, slots, dim, padded_slots, sc.a.data());
    gather_rows(q, rows, count, dim, dim, scale, sc.b.data());
    small_product(count, padded_slots, dim, sc.b.data(), dim, 1, sc.a.data(), padded_slots, sc.c.data(),
                  padded_slots);
    scalar_t* bias = sc.e.data();
    for (int64_t slot = 0; slot < slots; ++slot) bias[slot] = keys[slot] < 0 ? minus_infinity : scalar_t(0);
    const scalar_t m = mass[cluster.index];
    for (int64_t member = 0; member < count; ++member) {
      scalar_t* row = sc.c.data() + member * padded_slots;
      scalar_t* weight = weights + rows[member] * slots;
      scalar_t largest = minus_infinity;
#pragma omp simd reduction(max : largest)
      for (int64_t slot = 0; slot < slots; ++slot) {
        row[slot] += bias[slot];
        largest = row[slot] > largest ? row[slot] : largest;
      }
      if (largest == minus_infinity) {   // no key at all: weights 0, out = rest
        std::fill(row, row + slots, scalar_t(0));
        std::fill(weight, weight + slots, scalar_t(0));
        continue;
      }
      scalar_t sum = 0;
#pragma omp simd reduction(+ : sum)
      for (int64_t slot = 0; slot < slots; ++slot) {
        row[slot] = exp_vectorisable(row[slot] - largest);
        sum += row[slot];
      }
      const scalar_t inverse = scalar_t(1) / sum;
#pragma omp simd
      for (int64_t slot = 0; slot < slots; ++slot) row[slot] *= inverse;
      store_row_streaming(weight, row, slots);
#pragma omp simd
      for (int64_t slot = 0; slot < slots; ++slot) row[slot] *= m;
    }
    gather_rows(v + cluster.g * s.length * value_dim, keys, slots, value_dim, padded_values, scalar_t(1),
                sc.d.data());
    small_product(count, padded_values, slots, sc.c.data(), padded_slots, 1, sc.d.data(), padded_values,
                  sc.b.data(), padded_values);
    const scalar_t* rest_row = rest + cluster.index * value_dim;
    for (int64_t member = 0; member < count; ++member) {
      scalar_t* src = sc.b.data() + member * padded_values;
      scalar_t* dst = out + rows[member] * value_dim;
#pragma omp simd
      for (int64_t d = 0; d < value_dim; ++d) src[d] += rest_row[d];
      store_row_streaming(dst, src, value_dim);
    }
    finish_streaming_stores();
  });
}

template <typename scalar_t>
void top_attention_backward_kernel(const scalar_t* grad, const scalar_t* q, const scalar_t* k, const scalar_t* v,
                                   const int64_t* topk, const int64_t* offsets, const int64_t* members,
                                   const scalar_t* mass, const scalar_t* weights, scalar_t* grad_q,
                                   scalar_t* grad_k, scalar_t* grad_v, scalar_t* grad_mass, scalar_t* grad_rest,
                                   const SparseShape& s, int64_t dim, int64_t value_dim, scalar_t scale) {
  const int64_t slots = s.slots;
  const int64_t padded_slots = round_up(slots, kLanes<scalar_t>);
  const int64_t padded_dim = round_up(dim, kLanes<scalar_t>);
  const int64_t padded_values = round_up(value_dim, kLanes<scalar_t>);
  const int64_t padded_widest = std::max(padded_dim, padded_values);
  for_each_cluster_adding_key_gradients<scalar_t>(
      s, topk, offsets, members, {{grad_k, dim}, {grad_v, value_dim}},
      [&](Scratch<scalar_t>& sc, const Cluster& cluster, scalar_t* block) {
    // block: the (S, dim) key gradients, then the (S, value_dim) value gradients
    const int64_t count = cluster.count;
    const int64_t* rows = sc.rows.data();
    const int64_t* keys = cluster.keys;
    sc.a.resize(count * padded_widest);                                  // G, then Q
    sc.b.resize(std::max(value_dim * padded_slots, slots * padded_dim));  // V_T^T, then K_T
    sc.c.resize(count * padded_slots);                                   // dW, then dS
    sc.d.resize(count * slots);                                          // W, then m W
    sc.e.resize(std::max(count, slots) * padded_widest);                 // a product before it is copied out
    gather_rows(grad, rows, count, value_dim, padded_values, scalar_t(1), sc.a.data());
    gather_columns(v + cluster.g * s.length * value_dim, keys, slots, value_dim, padded_slots, sc.b.data());
    small_product(count, padded_slots, value_dim, sc.a.data(), padded_values, 1, sc.b.data(), padded_slots,
                  sc.c.data(), padded_slots);
    gather_coefficients(weights, rows, count, keys, slots, scalar_t(1), sc.d.data());   // 0 on empty slots
    const scalar_t m = mass[cluster.index];
    scalar_t mass_gradient = 0;
    for (int64_t member = 0; member < count; ++member) {
      scalar_t* d_weight = sc.c.data() + member * padded_slots;
      scalar_t* weight = sc.d.data() + member * slots;
      scalar_t row_sum = 0;
#pragma omp simd reduction(+ : row_sum)
      for (int64_t slot = 0; slot < slots; ++slot) row_sum += weight[slot] * d_weight[slot];
      mass_gradient += row_sum;
      const scalar_t factor = scale * m;
#pragma omp simd
      for (int64_t slot = 0; slot < slots; ++slot) {
        d_weight[slot] = factor * weight[slot] * (d_weight[slot] - row_sum);
        weight[slot] *= m;
      }
    }
    grad_mass[cluster.index] = mass_gradient;
    scalar_t* rest_row = grad_rest + cluster.index * value_dim;   // zero-initialised
    for (int64_t member = 0; member < count; ++member) {
      const scalar_t* src = sc.a.data() + member * padded_values;
#pragma omp simd
      for (int64_t d = 0; d < value_dim; ++d) rest_row[d] += src[d];
    }
    // dV_T = (m W)^T G
    scalar_t* value_block = block + slots * dim;
    small_product(slots, padded_values, count, sc.d.data(), 1, slots, sc.a.data(), padded_values, sc.e.data(),
                  padded_values);
    for (int64_t slot = 0; slot < slots; ++slot)
      std::copy(sc.e.data() + slot * padded_values, sc.e.data() + slot * padded_values + value_dim,
                value_block + slot * value_dim);
    // dQ = dS K_T
    gather_rows(k + cluster.g * s.length * dim, keys, slots, dim, padded_dim, scalar_t(1), sc.b.data());
    small_product(count, padded_dim, slots, sc.c.data(), padded_slots, 1, sc.b.data(), padded_dim, sc.e.data(),
                  padded_dim);
    for (int64_t member = 0; member < count; ++member)
      store_row_streaming(grad_q + rows[member] * dim, sc.e.data() + member * padded_dim, dim);
    finish_streaming_stores();
    // dK_T = dS^T Q
    gather_rows(q, rows, count, dim, padded_dim, scalar_t(1), sc.a.data());
    small_product(slots, padded_dim, count, sc.c.data(), 1, padded_slots, sc.a.data(), padded_dim, sc.e.data(),
                  padded_dim);
    for (int64_t slot = 0; slot < slots; ++slot)
      std::copy(sc.e.data() + slot * padded_dim, sc.e.data() + slot * padded_dim + dim, block + slot * dim);
  });
}

// The inputs both operators share: the sparse checks (checks.h), the keys, the values, the
// mass, and topk's positions (read as row indices inside the parallel region).
SparseShape check_top_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const at::Tensor& topk, const at::Tensor& offsets, const at::Tensor& members,
                                const at::Tensor& mass, const char* op) {
  const SparseShape s = check_sparse(q, topk, offsets, members, op);
  check_sparse_keys(q, k, op);
  TORCH_CHECK(v.dim() == 4 && v.size(0) == s.batch && v.size(1) == s.heads && v.size(2) == s.length &&
                  v.scalar_type() == q.scalar_type(),
              op, ": v must have shape (", s.batch, ", ", s.heads, ", ", s.length, ", dim) and q's dtype ",
              q.scalar_type(), ", got ", v.sizes(), " ", v.scalar_type());
  TORCH_CHECK(mass.dim() == 3 && mass.size(0) == s.batch && mass.size(1) == s.heads && mass.size(2) == s.clusters &&
                  mass.scalar_type() == q.scalar_type(),
              op, ": mass must have shape (", s.batch, ", ", s.heads, ", ", s.clusters, ") and q's dtype, got ",
              mass.sizes(), " ", mass.scalar_type());
  TORCH_CHECK(topk.numel() == 0 || (topk.min().item<int64_t>() >= -1 && topk.max().item<int64_t>() < s.length), op,
              ": topk holds positions outside [-1, ", s.length, ")");
  return s;
}

std::tuple<at::Tensor, at::Tensor> clustered_top_attention(const at::Tensor& q, const at::Tensor& k,
                                                           const at::Tensor& v, const at::Tensor& topk,
                                                           const at::Tensor& offsets, const at::Tensor& members,
                                                           const at::Tensor& mass, const at::Tensor& rest,
                                                           double scale) {
  const char* op = "clustered_top_attention";
  const SparseShape s = check_top_attention(q, k, v, topk, offsets, members, mass, op);
  const int64_t value_dim = v.size(3);
  TORCH_CHECK(rest.dim() == 4 && rest.size(0) == s.batch && rest.size(1) == s.heads && rest.size(2) == s.clusters &&
                  rest.size(3) == value_dim && rest.scalar_type() == q.scalar_type(),
              op, ": rest must have shape (", s.batch, ", ", s.heads, ", ", s.clusters, ", ", value_dim,
              ") and q's dtype, got ", rest.sizes(), " ", rest.scalar_type());
  const at::Tensor q_c = q.contiguous(), k_c = k.contiguous(), v_c = v.contiguous();
  const at::Tensor mass_c = mass.contiguous(), rest_c = rest.contiguous();
  const SparseInputs in(topk, offsets, members);
  // Every member's rows are written by the kernel, the others (padded queries) zeroed.
  at::Tensor out = at::empty({s.batch, s.heads, s.length, value_dim}, v.options());
  at::Tensor weights = at::empty({s.batch, s.heads, s.length, s.slots}, q.options());
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "clustered_top_attention", [&] {
    zero_rows_outside_clusters<scalar_t>(s, in.offsets.data_ptr<int64_t>(), in.members.data_ptr<int64_t>(),
                                         {{out.data_ptr<scalar_t>(), value_dim},
                                          {weights.data_ptr<scalar_t>(), s.slots}});
    top_attention_kernel<scalar_t>(q_c.data_ptr<scalar_t>(), k_c.data_ptr<scalar_t>(), v_c.data_ptr<scalar_t>(),
                                   in.topk.data_ptr<int64_t>(), in.offsets.data_ptr<int64_t>(),
                                   in.members.data_ptr<int64_t>(), mass_c.data_ptr<scalar_t>(),
                                   rest_c.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(),
                                   weights.data_ptr<scalar_t>(), s, q.size(3), value_dim,
                                   static_cast<scalar_t>(scale));
  });
  return {out, weights};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> clustered_top_attention_backward(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& topk, const at::Tensor& offsets, const at::Tensor& members, const at::Tensor& mass,
    const at::Tensor& weights, double scale) {
  const char* op = "clustered_top_attention_backward";
  const SparseShape s = check_top_attention(q, k, v, topk, offsets, members, mass, op);
  TORCH_CHECK(grad_out.sizes() == v.sizes() && grad_out.scalar_type() == v.scalar_type(), op,
              ": grad_out must match v ", v.sizes(), " ", v.scalar_type(), ", got ", grad_out.sizes(), " ",
              grad_out.scalar_type());
  check_sparse_scores(weights, s, q.scalar_type(), op, "weights");
  const int64_t value_dim = v.size(3);
  const at::Tensor grad_c = grad_out.contiguous(), q_c = q.contiguous(), k_c = k.contiguous();
  const at::Tensor v_c = v.contiguous(), mass_c = mass.contiguous(), weights_c = weights.contiguous();
  const SparseInputs in(topk, offsets, members);
  at::Tensor grad_q = at::empty_like(q_c);   // every member's row is written, the others zeroed
  at::Tensor grad_k = at::zeros_like(k_c);
  at::Tensor grad_v = at::zeros_like(v_c);
  at::Tensor grad_mass = at::zeros_like(mass_c);
  at::Tensor grad_rest = at::zeros({s.batch, s.heads, s.clusters, value_dim}, v.options());
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "clustered_top_attention_backward", [&] {
    zero_rows_outside_clusters<scalar_t>(s, in.offsets.data_ptr<int64_t>(), in.members.data_ptr<int64_t>(),
                                         {{grad_q.data_ptr<scalar_t>(), q.size(3)}});
    top_attention_backward_kernel<scalar_t>(
        grad_c.data_ptr<scalar_t>(), q_c.data_ptr<scalar_t>(), k_c.data_ptr<scalar_t>(), v_c.data_ptr<scalar_t>(),
        in.topk.data_ptr<int64_t>(), in.offsets.data_ptr<int64_t>(), in.members.data_ptr<int64_t>(),
        mass_c.data_ptr<scalar_t>(), weights_c.data_ptr<scalar_t>(), grad_q.data_ptr<scalar_t>(),
        grad_k.data_ptr<scalar_t>(), grad_v.data_ptr<scalar_t>(), grad_mass.data_ptr<scalar_t>(),
        grad_rest.data_ptr<scalar_t>(), s, q.size(3), value_dim, static_cast<scalar_t>(scale));
  });
  return {grad_q, grad_k, grad_v, grad_mass, grad_rest};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(attention_ext, m) {
  m.def("clustered_top_attention(Tensor q, Tensor k, Tensor v, Tensor topk, Tensor offsets, Tensor members,"
        " Tensor mass, Tensor rest, float scale) -> (Tensor, Tensor)");
  m.def("clustered_top_attention_backward(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor topk,"
        " Tensor offsets, Tensor members, Tensor mass, Tensor weights, float scale)"
        " -> (Tensor, Tensor, Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(attention_ext, CPU, m) {
  m.impl("clustered_top_attention", &clustered_top_attention);
  m.impl("clustered_top_attention_backward", &clustered_top_attention_backward);
}
