// Argument checks shared by the CPU (.cpp) and CUDA (.cu) implementations of an operator,
// so both refuse the same inputs with the same message.
//
// Rule for every kernel, CPU and CUDA: nothing that can throw (TORCH_CHECK, throw, .item(),
// tensor allocation) runs inside a parallel region (an at::parallel_for body, an OpenMP block,
// any host-side parallel loop), nor in a helper such a body calls: an exception may not leave
// an OpenMP block, and a TORCH_CHECK inside lsh.cpp's parallel order check is where a
// torch 2.11 test run died with a segfault. Validate the inputs before the region; where the
// check is part of the parallel work (lsh.cpp's index_chunks), each task records what it
// found and the error is raised after the region, naming the argument, the index, the bad
// value and what is expected. Device code sets a flag the host reads after the kernel
// (lsh_cuda.cu). The one allowance: a worker's own scratch std::vector, whose only failure is
// std::bad_alloc, which at::parallel_for catches on the worker and rethrows after the region.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace attention_ext_checks {

inline void check_index(const at::Tensor& t, const char* name, int64_t dims) {
  TORCH_CHECK(t.dim() == dims && t.scalar_type() == at::kLong, name, " must be an int64 tensor with ",
              dims, " dimensions, got ", t.sizes(), " ", t.scalar_type());
}

inline void check_rows(const at::Tensor& x, const char* name) {
  TORCH_CHECK(x.dim() == 4 && x.is_floating_point(), name,
              " must be a floating tensor of shape (batch, heads, rows, dim), got ", x.sizes());
}

// The sizes of a sparse product of improved clustered attention (sparse_product.cpp).
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

}  // namespace attention_ext_checks
