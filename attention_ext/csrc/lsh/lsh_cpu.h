// Reformer (LSH) chunked attention on CPU, forward and backward.
//
// Python (attention_ext/attentions/lsh.py) draws the random rotations; `lsh_hash` here projects the
// queries onto them, takes the buckets and sorts the positions by (bucket, position), and
// `lsh_attention_forward/backward` do the chunked attention.
//
// Inputs (made contiguous):
//   q          : (B, H, N, E)  queries; the keys are the unit-normalised queries
//                k_j = q_j / max(||q_j||, 1e-12) (torch.nn.functional.normalize), computed
//                here on the fly, and backward includes the normalisation's gradient
//   v          : (B, H, N, Ev) values
//   order      : (B, H, R, N)  int64; per round, the first lengths[b] entries are
//                the valid positions sorted by (bucket, position); the rest is ignored
//   lengths    : (B,)          int64 valid lengths
// For a sequence of valid length L, round r splits order[b, h, r, :L] into
// n = ceil(L / chunk) chunks; the queries of chunk c attend to the keys of chunk c
// and of chunk (c - 1) mod n (only when n > 1, so no key is counted twice). A query
// never attends to itself unless it is the only key of its window (L == 1).
//
// Rounds are combined so that the result is exact softmax attention over the union
// of the rounds' windows, each key counted once (Reformer, appendix "multi-round
// LSH attention"): in round r the logit of key j for query i is lowered by
// log(n_ij), n_ij = the number of rounds whose window of i holds j, and the round
// outputs are merged by their log-sum-exp. out and lse (the total log-sum-exp of
// each query, 0 for padded queries) are returned; backward recomputes the logits.
//
// Parallelism: one parallel region per round (torch's intra-op threads via
// at::parallel_for), whose threads pop tasks from a shared counter. A task is a group of
// kChunksPerTask consecutive chunks of one (batch, head). Forward: each query row is owned
// by one task per round. Backward: a chunk also writes key/value gradients into its
// previous chunk; the rows a group's first chunk writes into another group are buffered and
// added after the region, so no two tasks touch the same rows.
//
// The files, by stage: hashing.cpp (lsh_hash: projections, buckets, sorted order),
// prepare.cpp (the checked problem both attention passes start from), attention_forward.cpp
// and attention_backward.cpp (the chunked attention); this header holds what they share
// (the task queue, row helpers, the small products, LshProblem) and chunk_window.h the
// window and the walk over chunks that the two attention passes share.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "../common/vector_exp.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

namespace lsh_cpu {

inline int64_t chunk_count(int64_t valid, int64_t chunk) { return (valid + chunk - 1) / chunk; }

// Tasks per thread at least, so that small problems run inline: a parallel region costs
// tens of microseconds, and far more when other processes hold the cores.
inline int64_t grain_for(int64_t work_per_task, int64_t work_per_grain = 1 << 18) {
  return std::max<int64_t>(1, work_per_grain / std::max<int64_t>(1, work_per_task));
}

inline int64_t previous_chunk(int64_t c, int64_t chunks) { return (c + chunks - 1) % chunks; }

// Task indices 0..tasks-1 handed out one at a time to the threads of a parallel region.
// Unlike at::parallel_for's fixed split, a thread that another process preempts does not
// keep half the work: the others take the remaining tasks (the cores are often shared).
class TaskQueue {
 public:
  explicit TaskQueue(int64_t tasks) : tasks_(tasks) {}
  bool pop(int64_t& task) {
    task = next_.fetch_add(1, std::memory_order_relaxed);
    return task < tasks_;
  }

 private:
  const int64_t tasks_;
  std::atomic<int64_t> next_{0};
};

// Runs worker(queue) on up to tasks / grain of torch's intra-op threads (inline when that
// is one); each worker sets up its scratch buffers once, then pops tasks until none is left.
// A worker must not throw (see common/checks.h): it records a failure for the caller to
// raise after the region.
template <typename Worker>
void run_tasks(int64_t tasks, int64_t grain, const Worker& worker) {
  TaskQueue queue(tasks);
  const int64_t workers = std::min<int64_t>(at::get_num_threads(), chunk_count(tasks, grain));
  at::parallel_for(0, std::max<int64_t>(workers, 1), 1,
                   [&](int64_t, int64_t) { worker(queue); });
}

// exp over an array (the softmax weights of a chunk's window): common/vector_exp.h's, which the
// compiler vectorises; double: std::exp, so float64 gradchecks see libm accuracy.
// What float outputs changed when this file's own copy of the polynomial gave way to it: the
// copy clamped its input to [-87, 88], so a weight more than 87 below its row's maximum came out
// ~1.6e-38 (e^-87) instead of 0, and a NaN came out as that too. vector_exp gives exactly 0 below
// -87.3 (and keeps a NaN a NaN). Such a weight adds at most ~1e-38 times a value row to a sum
// whose largest weight is 1, so outputs and log-sum-exps change by that at most (in practice
// not at all: it is lost to rounding); what changes visibly is a gradient that only such weights
// reach: a key whose every weight underflows now gets exactly 0 value and key gradients, as exact
// math rounded to float32 does, where it got ~1e-38 times the output gradients
// (tests/attention_ext/test_lsh.py). Inputs are at most 0 here (logits minus their
// maximum or their log-sum-exp), so the upper clamps (88 and 88.3) never act.
inline void exp_inplace(double* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = std::exp(x[i]);
}

inline void exp_inplace(float* __restrict x, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) x[i] = vector_exp::exp_vectorisable(x[i]);
}

template <typename T>
inline void copy_row(T* __restrict dst, const T* __restrict src, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dst[i] = src[i];
}

// Asks the cache for rows (positions[0..count) of a (N, width) array) needed soon: a
// chunk's rows are scattered over the sequence, so fetching the next chunk's rows while
// this one computes hides most of the memory latency.
// kWrite asks for the lines with the intent to write: a row written without being read
// (the output of round 0, a gradient row zeroed) would otherwise cost a miss at the store.
template <bool kWrite = false, typename T>
inline void prefetch_rows(const T* base, const int64_t* positions, int64_t count, int64_t width) {
  for (int64_t i = 0; i < count; ++i) {
    const char* row = reinterpret_cast<const char*>(base + positions[i] * width);
    for (int64_t byte = 0; byte < width * static_cast<int64_t>(sizeof(T)); byte += 64)
      __builtin_prefetch(row + byte, kWrite ? 1 : 0);
  }
}

template <typename T>
inline void add_row(T* __restrict dst, const T* __restrict src, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
}

// Shapes and raw pointers shared by the forward and backward passes.
struct LshProblem {
  int64_t batch, heads, rounds, length, dim, value_dim, chunk, max_chunks;
  const int64_t* order;    // (B, H, R, N)
  const int64_t* lengths;  // (B,)
  const int32_t* chunk_of; // (B, H, R, N): chunk of each valid position per round (rounds > 1)

  int64_t valid(int64_t b) const { return lengths[b]; }
  const int64_t* round_order(int64_t bh, int64_t r) const {
    return order + (bh * rounds + r) * length;
  }
  const int32_t* round_chunk_of(int64_t bh, int64_t r) const {
    return chunk_of + (bh * rounds + r) * length;
  }
};

// --- Small dense products on per-chunk buffers ------------------------------------------
// A chunk's matrices are at most (2 * chunk) x max(E, chunk); a register-tiled loop
// (ROWS x COLS accumulators, COLS a multiple of one SIMD vector) that the compiler
// vectorises beats calling a BLAS on such sizes. The B operand and C are row-major with
// column counts padded to kLanes; A is read one element at a time, with any strides, so a
// transposed A costs nothing.
template <typename T>
constexpr int64_t kLanes = 64 / sizeof(T);  // one 512-bit vector (two 256-bit ones)

inline int64_t round_up(int64_t x, int64_t multiple) {
  return (x + multiple - 1) / multiple * multiple;
}

struct Strides {  // element (r, k) of A lives at a[r * row + k * col]
  int64_t row, col;
};

// acc = a (ROWS x depth) . b (depth x COLS), in registers: the products of small_gemm and of
// the hashing's projections (project_tile_extremes), so both sum over the depth in one order.
template <typename T, int ROWS, int COLS>
inline void tile_products(const T* __restrict a, Strides as, const T* __restrict b, int64_t ldb, int64_t depth,
                          T (&acc)[ROWS][COLS]) {
  for (int r = 0; r < ROWS; ++r)
#pragma omp simd
    for (int j = 0; j < COLS; ++j) acc[r][j] = 0;
  for (int64_t k = 0; k < depth; ++k) {
    const T* b_row = b + k * ldb;
    for (int r = 0; r < ROWS; ++r) {
      const T a_rk = a[r * as.row + k * as.col];
#pragma omp simd
      for (int j = 0; j < COLS; ++j) acc[r][j] += a_rk * b_row[j];
    }
  }
}

template <typename T, int ROWS, int COLS>
inline void gemm_tile(const T* __restrict a, Strides as, const T* __restrict b, int64_t ldb,
                      T* __restrict c, int64_t ldc, int64_t depth) {
  T acc[ROWS][COLS];
  tile_products<T, ROWS, COLS>(a, as, b, ldb, depth, acc);
  for (int r = 0; r < ROWS; ++r) {
    T* c_row = c + r * ldc;
#pragma omp simd
    for (int j = 0; j < COLS; ++j) c_row[j] = acc[r][j];
  }
}

// Rows of small_gemm's register tile. Its 2 x kLanes columns are 2 vectors per row on
// AVX-512 (32 vector registers: 8 rows give 16 accumulators, and each loaded row of B feeds
// 8 FMAs per vector instead of 4, which doubles the rate) but 4 on AVX2 (16 registers: 4 rows
// would already fill them all, so 3 rows, 12 accumulators).
#if defined(__AVX512F__)
constexpr int kGemmRows = 8;
#else
constexpr int kGemmRows = 3;
#endif

template <typename T, int COLS>
inline void gemm_columns(const T* a, Strides as, const T* b, int64_t ldb, T* c, int64_t ldc,
                         int64_t rows, int64_t depth) {
  int64_t r = 0;
  for (; r + kGemmRows <= rows; r += kGemmRows)
    gemm_tile<T, kGemmRows, COLS>(a + r * as.row, as, b, ldb, c + r * ldc, ldc, depth);
  if constexpr (kGemmRows > 4) {
    if (r + 4 <= rows) {
      gemm_tile<T, 4, COLS>(a + r * as.row, as, b, ldb, c + r * ldc, ldc, depth);
      r += 4;
    }
  }
  for (; r < rows; ++r)
    gemm_tile<T, 1, COLS>(a + r * as.row, as, b, ldb, c + r * ldc, ldc, depth);
}

// c (rows x cols) = a (rows x depth) . b (depth x cols); cols a multiple of kLanes<T>.
template <typename T>
void small_gemm(const T* a, Strides as, const T* b, int64_t ldb, T* c, int64_t ldc,
                int64_t rows, int64_t depth, int64_t cols) {
  constexpr int W = static_cast<int>(kLanes<T>);
  int64_t j = 0;
  for (; j + 2 * W <= cols; j += 2 * W)
    gemm_columns<T, 2 * W>(a, as, b + j, ldb, c + j, ldc, rows, depth);
  for (; j < cols; j += W) gemm_columns<T, W>(a, as, b + j, ldb, c + j, ldc, rows, depth);
}

// --- The checked problem (prepare.cpp) ----------------------------------------------------

struct PreparedInputs {
  at::Tensor order, lengths, chunk_of;
  LshProblem problem;
};

// The problem of checked inputs (lsh/checks.h): the lengths' values checked on the host, the
// order's while its chunks are indexed.
PreparedInputs prepare(const at::Tensor& q, const at::Tensor& v, const at::Tensor& order_in,
                       const at::Tensor& lengths_in, int64_t chunk_size);

// Zeroes the rows of padded positions (b, :, lengths[b]:) of a (B, H, N, ...) tensor;
// the kernels write every valid row.
void zero_padded_rows(at::Tensor& t, const LshProblem& p);

}  // namespace lsh_cpu
