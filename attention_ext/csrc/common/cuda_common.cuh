// Shared by the CUDA kernel files (*_cuda.cu): launch helpers, warp reductions and the
// dtype rules.
//
// Dtypes: every CUDA operator takes float32, float64, float16 and bfloat16 tensors and
// loads them as they are; arithmetic runs in at::opmath_type<scalar_t> (float for the
// half types and float32, double for float64) and results are rounded to scalar_t once,
// when they are stored. Statistics that decide discrete outcomes (the hash thresholds)
// are taken in double, as on the CPU.
//
// Only c10/cuda headers are used (no ATen/cuda/CUDAContext.h): that header pulls in
// cuBLAS/cuSPARSE, which these kernels do not need.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <cstdint>
#include <initializer_list>

namespace attention_ext_cuda {

constexpr int kThreads = 256;   // threads of a one-dimensional block
constexpr int kWarp = 32;
constexpr unsigned kFullMask = 0xffffffffu;

// Blocks for `work` items at `per_block` items per block, at least 1; the y/z grid
// dimensions stay below 65536 by construction of the callers (batch * heads there).
inline unsigned blocks_for(int64_t work, int64_t per_block = kThreads) {
  const int64_t blocks = (work + per_block - 1) / per_block;
  TORCH_CHECK(blocks < (int64_t{1} << 31), "attention_ext CUDA: problem too large (", work, " items)");
  return static_cast<unsigned>(blocks < 1 ? 1 : blocks);
}

inline cudaStream_t stream() { return c10::cuda::getCurrentCUDAStream(); }

// The grid's y dimension holds batch * heads (or batch * heads * rounds).
inline unsigned grid_y(int64_t groups) {
  TORCH_CHECK(groups >= 1 && groups < 65536, "attention_ext CUDA: batch x heads (x rounds) = ", groups,
              " must lie in 1..65535");
  return static_cast<unsigned>(groups);
}

inline void check_cuda(const at::Tensor& t, const char* op, const char* name) {
  TORCH_CHECK(t.is_cuda(), op, ": ", name, " must be a CUDA tensor (all inputs on one device), got ",
              t.device());
}

// Every tensor on the CUDA device of the first. The dispatcher picks a CUDA kernel when any
// input is on CUDA, so a CPU (or other-GPU) tensor would otherwise reach the kernel as a
// foreign pointer (an illegal memory access instead of an error).
inline void check_one_device(const char* op, std::initializer_list<const at::Tensor*> tensors) {
  const at::Tensor& first = **tensors.begin();
  check_cuda(first, op, "the first input");
  for (const at::Tensor* t : tensors)
    TORCH_CHECK(t->device() == first.device(), op, ": all inputs must be on one CUDA device, got ",
                t->device(), " and ", first.device());
}

template <typename T>
__device__ __forceinline__ T warp_sum(T value) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2) value += __shfl_xor_sync(kFullMask, value, offset);
  return value;
}

template <typename T>
__device__ __forceinline__ T warp_max(T value) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    const T other = __shfl_xor_sync(kFullMask, value, offset);
    value = other > value ? other : value;
  }
  return value;
}

// Valid length of batch row b, clipped to [0, length] (as valid_length in clustering.cpp).
__device__ __forceinline__ int64_t clipped_length(const int64_t* lengths, int64_t b, int64_t length) {
  const int64_t value = lengths[b];
  return value < 0 ? 0 : (value > length ? length : value);
}

}  // namespace attention_ext_cuda

// Every dtype the CUDA operators accept.
#define ATTENTION_EXT_DISPATCH_FLOATING(TYPE, NAME, ...) \
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, TYPE, NAME, __VA_ARGS__)
