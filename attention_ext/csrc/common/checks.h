// Argument checks every operator family uses (the argument checks of each operator are in its
// family's checks.h, e.g. lsh/checks.h, called by both its CPU (.cpp) and CUDA (.cu) entry, so
// both refuse the same inputs with the same message; each CUDA entry adds that its inputs are on
// one CUDA device, common/cuda_common.cuh).
//
// Rule for every kernel, CPU and CUDA: nothing that can throw (TORCH_CHECK, throw, .item(),
// tensor allocation) runs inside a parallel region (an at::parallel_for body, an OpenMP block,
// any host-side parallel loop), nor in a helper such a body calls: an exception may not leave
// an OpenMP block, and a TORCH_CHECK inside lsh's parallel order check (then lsh/lsh.cpp) is where a
// torch 2.11 test run died with a segfault. Validate the inputs before the region; where the
// check is part of the parallel work (lsh/prepare.cpp's index_chunks), each task records what it
// found and the error is raised after the region, naming the argument, the index, the bad
// value and what is expected. Device code sets a flag the host reads after the kernel
// (lsh/lsh_cuda.cu). The one allowance: a worker's own scratch std::vector, whose only failure is
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

// One int64 valid length per batch row. The CUDA operators add that it is on the GPU.
inline void check_lengths(const at::Tensor& lengths, int64_t batch) {
  TORCH_CHECK(lengths.dim() == 1 && lengths.size(0) == batch && lengths.scalar_type() == at::kLong,
              "lengths must be an int64 tensor of shape (", batch, "), got ", lengths.sizes(), " ",
              lengths.scalar_type());
}

}  // namespace attention_ext_checks
