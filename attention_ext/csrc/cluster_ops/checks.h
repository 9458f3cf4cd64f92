// The argument checks of the per-cluster operators (cluster_ops.cpp), written once and called by
// the CPU and the CUDA entry of each before any parallel work; the CUDA entries then add that
// every input is on one CUDA device (cluster_ops_cuda.cu). What needs the values of a tensor
// (group_by_cluster's ids below `clusters`) stays with each entry: the CPU reads them, CUDA
// checks them on the device without waiting for it.
#pragma once

#include "../common/checks.h"

#include <cstdint>

namespace attention_ext_checks {

// group_by_cluster(assignment (B,H,N), clusters).
inline void check_group_by_cluster(const at::Tensor& assignment, int64_t clusters) {
  check_index(assignment, "assignment", 3);
  TORCH_CHECK(clusters >= 1, "group_by_cluster: clusters must be >= 1, got ", clusters);
}

// cluster_mean(x (B,H,N,D), offsets (B,H,C+1), members (B,H,N)).
inline void check_cluster_mean(const at::Tensor& x, const at::Tensor& offsets, const at::Tensor& members) {
  check_rows(x, "cluster_mean: x");
  check_index(offsets, "offsets", 3);
  check_index(members, "members", 3);
  TORCH_CHECK(members.size(2) == x.size(2), "cluster_mean: members must have length ", x.size(2));
}

// cluster_mean_backward(grad (B,H,C,D), assignment (B,H,N), offsets (B,H,C+1)).
inline void check_cluster_mean_backward(const at::Tensor& grad, const at::Tensor& assignment,
                                        const at::Tensor& offsets) {
  check_rows(grad, "cluster_mean_backward: grad");
  check_index(assignment, "assignment", 3);
  check_index(offsets, "offsets", 3);
  TORCH_CHECK(offsets.size(2) == grad.size(2) + 1, "cluster_mean_backward: offsets must have ",
              grad.size(2) + 1, " columns");
}

// cluster_broadcast(x (B,H,C,D), assignment (B,H,N)).
inline void check_cluster_broadcast(const at::Tensor& x, const at::Tensor& assignment) {
  check_rows(x, "cluster_broadcast: x");
  check_index(assignment, "assignment", 3);
}

// cluster_broadcast_backward(grad (B,H,N,D), offsets (B,H,C+1), members (B,H,N)).
inline void check_cluster_broadcast_backward(const at::Tensor& grad, const at::Tensor& offsets,
                                             const at::Tensor& members) {
  check_rows(grad, "cluster_broadcast_backward: grad");
  check_index(offsets, "offsets", 3);
  check_index(members, "members", 3);
}

// cluster_topk(weights (B,H,C,N), lengths (B,), k).
inline void check_cluster_topk(const at::Tensor& weights, const at::Tensor& lengths, int64_t k) {
  check_rows(weights, "cluster_topk: weights");
  TORCH_CHECK(k >= 1, "cluster_topk: k must be >= 1, got ", k);
  TORCH_CHECK(lengths.dim() == 1 && lengths.size(0) == weights.size(0) && lengths.scalar_type() == at::kLong,
              "cluster_topk: lengths must be an int64 tensor of shape (", weights.size(0), ")");
}

}  // namespace attention_ext_checks
