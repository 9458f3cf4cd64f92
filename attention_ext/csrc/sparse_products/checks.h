// The argument checks of the sparse products of improved clustered attention (sparse_product.cpp,
// and the fused pair of clustered_top_attention.cpp, which share their index tensors), written once
// and called by the CPU and the CUDA entry of each operator before any parallel work; the CUDA
// entries then add that every input is on one CUDA device (sparse_product_cuda.cu).
#pragma once

#include "../common/checks.h"

#include <cstdint>

namespace attention_ext_checks {

// The sizes of a sparse product.
struct SparseShape {
  int64_t batch, heads, length, clusters, slots;
};

inline SparseShape check_sparse(const at::Tensor& rows, const at::Tensor& topk, const at::Tensor& offsets,
                                const at::Tensor& members, const char* op) {
  TORCH_CHECK(rows.dim() == 4 && rows.is_floating_point(), op,
              ": expected a floating tensor of shape (batch, heads, length, dim), got ", rows.sizes());
  TORCH_CHECK(topk.dim() == 4 && topk.scalar_type() == at::kLong && topk.size(0) == rows.size(0) &&
                  topk.size(1) == rows.size(1),
              op, ": topk must be int64 of shape (", rows.size(0), ", ", rows.size(1),
              ", clusters, slots), got ", topk.sizes(), " ", topk.scalar_type());
  TORCH_CHECK(offsets.dim() == 3 && offsets.scalar_type() == at::kLong &&
                  offsets.size(0) == rows.size(0) && offsets.size(1) == rows.size(1) &&
                  offsets.size(2) == topk.size(2) + 1,
              op, ": offsets must be int64 of shape (", rows.size(0), ", ", rows.size(1), ", ",
              topk.size(2) + 1, "), got ", offsets.sizes());
  TORCH_CHECK(members.dim() == 3 && members.scalar_type() == at::kLong &&
                  members.size(0) == rows.size(0) && members.size(1) == rows.size(1) &&
                  members.size(2) == rows.size(2),
              op, ": members must be int64 of shape ", rows.sizes().slice(0, 3), ", got ",
              members.sizes());
  return {rows.size(0), rows.size(1), rows.size(2), topk.size(2), topk.size(3)};
}

// The keys of clustered_sparse_dot (forward and backward): q's shape and dtype.
inline void check_sparse_keys(const at::Tensor& q, const at::Tensor& k, const char* op) {
  TORCH_CHECK(k.sizes() == q.sizes() && k.scalar_type() == q.scalar_type(), op, ": k must match q ", q.sizes(),
              " ", q.scalar_type(), ", got ", k.sizes(), " ", k.scalar_type());
}

// A tensor of one score per (batch, head, position, slot): clustered_sparse_dot's gradient and
// clustered_sparse_weighted_sum's weights, forward and backward alike; of `dtype` unless that is
// Undefined (a gradient: the CUDA operators convert it, the CPU ones refuse another dtype when
// they read it).
inline void check_sparse_scores(const at::Tensor& scores, const SparseShape& s, at::ScalarType dtype,
                                const char* op, const char* what) {
  TORCH_CHECK(scores.dim() == 4 && scores.size(0) == s.batch && scores.size(1) == s.heads &&
                  scores.size(2) == s.length && scores.size(3) == s.slots &&
                  (dtype == at::ScalarType::Undefined || scores.scalar_type() == dtype),
              op, ": ", what, " must have shape (", s.batch, ", ", s.heads, ", ", s.length, ", ", s.slots, ")",
              dtype == at::ScalarType::Undefined ? "" : " and the rows' dtype", ", got ", scores.sizes(), " ",
              scores.scalar_type());
}

// The index tensors of a sparse product, contiguous, taken once check_sparse has passed.
struct SparseInputs {
  at::Tensor topk, offsets, members;
  SparseInputs(const at::Tensor& t, const at::Tensor& o, const at::Tensor& m)
      : topk(t.contiguous()), offsets(o.contiguous()), members(m.contiguous()) {}
};

// clustered_sparse_dot(q, k, topk, offsets, members, scale).
inline SparseShape check_clustered_sparse_dot(const at::Tensor& q, const at::Tensor& k, const at::Tensor& topk,
                                              const at::Tensor& offsets, const at::Tensor& members) {
  const SparseShape s = check_sparse(q, topk, offsets, members, "clustered_sparse_dot");
  check_sparse_keys(q, k, "clustered_sparse_dot");
  return s;
}

// clustered_sparse_dot_backward(grad, q, k, topk, offsets, members, scale).
inline SparseShape check_clustered_sparse_dot_backward(const at::Tensor& grad, const at::Tensor& q,
                                                       const at::Tensor& k, const at::Tensor& topk,
                                                       const at::Tensor& offsets, const at::Tensor& members) {
  const SparseShape s = check_sparse(q, topk, offsets, members, "clustered_sparse_dot_backward");
  check_sparse_keys(q, k, "clustered_sparse_dot_backward");
  check_sparse_scores(grad, s, at::ScalarType::Undefined, "clustered_sparse_dot_backward", "grad");
  return s;
}

// clustered_sparse_weighted_sum(weights, v, topk, offsets, members).
inline SparseShape check_clustered_sparse_weighted_sum(const at::Tensor& weights, const at::Tensor& v,
                                                       const at::Tensor& topk, const at::Tensor& offsets,
                                                       const at::Tensor& members) {
  const SparseShape s = check_sparse(v, topk, offsets, members, "clustered_sparse_weighted_sum");
  check_sparse_scores(weights, s, v.scalar_type(), "clustered_sparse_weighted_sum", "weights");
  return s;
}

// clustered_sparse_weighted_sum_backward(grad, weights, v, topk, offsets, members).
inline SparseShape check_clustered_sparse_weighted_sum_backward(const at::Tensor& grad, const at::Tensor& weights,
                                                                const at::Tensor& v, const at::Tensor& topk,
                                                                const at::Tensor& offsets,
                                                                const at::Tensor& members) {
  const SparseShape s = check_sparse(v, topk, offsets, members, "clustered_sparse_weighted_sum_backward");
  TORCH_CHECK(grad.sizes() == v.sizes(), "clustered_sparse_weighted_sum_backward: grad must match v ",
              v.sizes(), ", got ", grad.sizes());
  check_sparse_scores(weights, s, v.scalar_type(), "clustered_sparse_weighted_sum_backward", "weights");
  return s;
}

}  // namespace attention_ext_checks
