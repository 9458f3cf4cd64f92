// LSH hashing on the CPU (`lsh_hash`): the projections onto the random rotations that
// attention_ext/attentions/lsh.py draws, the buckets, and the positions sorted by (bucket, position).
#include <ATen/ATen.h>
#include <torch/library.h>

#include "checks.h"
#include "lsh_cpu.h"

namespace {

using namespace lsh_cpu;

// --- Bucketing ------------------------------------------------------------------------
// rotations (B, H, E, R, P): per round the element's random rotation in its first
// half_buckets[b] columns (P >= that, a multiple of kLanes; the rest is ignored). The bucket
// of a valid position is argmax([x, -x]) with x = q R (the unit key's argmax is the same),
// ties to the first index as torch.argmax. A counting sort then lists the valid positions
// by (bucket, position), the padded positions after them.
//
// The projection x is never stored, not even one row of it: the product is computed in
// register tiles (kHashTileRows positions x kHashTileVectors SIMD vectors of columns, over
// the whole depth E) and each tile's values go straight into a running maximum and minimum
// per position and lane. Memory is that state for kHashBlockRows positions; time is the
// product's N E P multiply-adds (P = n_buckets / 2 grows with N up to lsh.py's max_buckets / 2:
// linear in N beyond that; the tiles keep it near the core's peak rate).
constexpr int64_t kHashBlockRows = 32;  // positions whose extremes are tracked at once
// 2 vectors of columns per row; rows as small_gemm's tiles (8 on AVX-512: 16 accumulators in
// its 32 vector registers; on AVX2 each vector is two of its 16 registers, so 3 rows: 8 rows
// there kept most accumulators on the stack). The rows do not change any sum's order.
constexpr int kHashTileRows = kGemmRows;
constexpr int kHashTileVectors = 2;

// The largest and the smallest projection of one position seen so far, per SIMD lane (lane
// l sees the columns l, l + W, ... in increasing order), with their columns; lane-wise the
// first occurrence wins, and reduce() picks the lowest column among the lanes' equals, so
// ties go to the first index overall.
template <typename T>
struct ProjectionExtremes {
  static constexpr int W = static_cast<int>(kLanes<T>);
  T up[W], down[W];
  int32_t up_at[W], down_at[W];

  void reset() {
    for (int l = 0; l < W; ++l) {
      up[l] = -std::numeric_limits<T>::infinity();
      down[l] = std::numeric_limits<T>::infinity();
      up_at[l] = down_at[l] = 0;  // a valid column whatever the values (NaN included)
    }
  }

  // Lane-wise update with the values of columns first..first+W-1 (those >= limit ignored).
  inline void update(const T* __restrict values, int32_t first, int64_t limit) {
#pragma omp simd
    for (int l = 0; l < W; ++l) {
      const T value = values[l];
      const int32_t column = first + l;
      const bool inside = column < limit;
      const bool above = inside & (value > up[l]), below = inside & (value < down[l]);
      up[l] = above ? value : up[l];
      up_at[l] = above ? column : up_at[l];
      down[l] = below ? value : down[l];
      down_at[l] = below ? column : down_at[l];
    }
  }

  // argmax([x, -x]) over the 2 half columns: the largest x if it is >= -(smallest x).
  // The lanes' values are never NaN (they start at -inf / +inf and only a larger / smaller
  // value replaces them), so the extreme value and then the lowest column holding it are
  // two vectorised reductions, the same lane as a scan with ties to the lower column.
  int64_t bucket(int64_t half) const {
    T top = up[0], bottom = down[0];
#pragma omp simd reduction(max : top) reduction(min : bottom)
    for (int l = 0; l < W; ++l) {
      top = std::max(top, up[l]);
      bottom = std::min(bottom, down[l]);
    }
    int32_t top_at = std::numeric_limits<int32_t>::max(), bottom_at = top_at;
#pragma omp simd reduction(min : top_at, bottom_at)
    for (int l = 0; l < W; ++l) {
      top_at = std::min(top_at, up[l] == top ? up_at[l] : std::numeric_limits<int32_t>::max());
      bottom_at = std::min(bottom_at,
                           down[l] == bottom ? down_at[l] : std::numeric_limits<int32_t>::max());
    }
    return top >= -bottom ? top_at : half + bottom_at;
  }
};

// Projects ROWS positions (rows of a, row stride dim) onto the NV * W columns of b starting
// at column `first` (row stride ldb) and folds the values into the positions' extremes.
// The sum over the depth is small_gemm's (tile_products), so the values are those a stored
// projection would hold.
template <typename T, int ROWS, int NV>
inline void project_tile_extremes(const T* __restrict a, int64_t dim, const T* __restrict b,
                                  int64_t ldb, int32_t first, int64_t limit,
                                  ProjectionExtremes<T>* __restrict extremes) {
  constexpr int W = static_cast<int>(kLanes<T>);
  constexpr int COLS = NV * W;
  T acc[ROWS][COLS];
  tile_products<T, ROWS, COLS>(a, {dim, 1}, b, ldb, dim, acc);
  for (int r = 0; r < ROWS; ++r)
    for (int v = 0; v < NV; ++v) extremes[r].update(&acc[r][v * W], first + v * W, limit);
}

template <typename T, int NV>
inline void project_rows_extremes(const T* a, int64_t dim, const T* b, int64_t ldb, int32_t first,
                                  int64_t limit, ProjectionExtremes<T>* extremes, int64_t rows) {
  int64_t r = 0;
  for (; r + kHashTileRows <= rows; r += kHashTileRows)
    project_tile_extremes<T, kHashTileRows, NV>(a + r * dim, dim, b, ldb, first, limit,
                                                extremes + r);
  for (; r < rows; ++r)
    project_tile_extremes<T, 1, NV>(a + r * dim, dim, b, ldb, first, limit, extremes + r);
}

template <typename T>
void hash_kernel(const T* q, const T* rotations, const int64_t* lengths,
                 const int64_t* half_buckets, int64_t batch, int64_t heads, int64_t length,
                 int64_t dim, int64_t rounds, int64_t columns, int64_t* buckets, int64_t* order) {
  constexpr int64_t W = kLanes<T>, tile_columns = kHashTileVectors * W;
  // One task per (batch, head, round): project, take buckets, counting-sort.
  run_tasks(batch * heads * rounds, grain_for(length * dim * columns), [&](TaskQueue& queue) {
    std::vector<ProjectionExtremes<T>> extremes(kHashBlockRows);
    std::vector<int64_t> starts;
    for (int64_t t; queue.pop(t);) {
      const int64_t bh = t / rounds, r = t % rounds, b = bh / heads;
      const int64_t valid = lengths[b], half = half_buckets[b];
      const int64_t used_columns = round_up(half, W);  // <= columns, which is a multiple of W
      const T* rotation = rotations + bh * dim * rounds * columns + r * columns;
      const int64_t ldb = rounds * columns;
      int64_t* bucket = buckets + t * length;
      int64_t* sorted = order + t * length;
      for (int64_t first = 0; first < valid; first += kHashBlockRows) {
        const int64_t rows = std::min(kHashBlockRows, valid - first);
        const T* a = q + (bh * length + first) * dim;
        for (int64_t i = 0; i < rows; ++i) extremes[i].reset();
        // Column tiles in increasing order, as the lane-wise first occurrence needs.
        int64_t j = 0;
        for (; j + tile_columns <= used_columns; j += tile_columns)
          project_rows_extremes<T, kHashTileVectors>(a, dim, rotation + j, ldb,
                                                     static_cast<int32_t>(j), half,
                                                     extremes.data(), rows);
        for (; j < used_columns; j += W)
          project_rows_extremes<T, 1>(a, dim, rotation + j, ldb, static_cast<int32_t>(j), half,
                                      extremes.data(), rows);
        for (int64_t i = 0; i < rows; ++i) bucket[first + i] = extremes[i].bucket(half);
      }
      starts.assign(2 * half + 1, 0);
      for (int64_t n = 0; n < valid; ++n) ++starts[bucket[n] + 1];
      for (int64_t k = 0; k < 2 * half; ++k) starts[k + 1] += starts[k];
      for (int64_t n = 0; n < valid; ++n) sorted[starts[bucket[n]]++] = n;
      for (int64_t n = valid; n < length; ++n) {
        bucket[n] = -1;
        sorted[n] = n;
      }
    }
  });
}

std::tuple<at::Tensor, at::Tensor> lsh_hash_cpu(const at::Tensor& q_in,
                                                const at::Tensor& rotations_in,
                                                const at::Tensor& lengths_in,
                                                const at::Tensor& half_buckets_in) {
  attention_ext_checks::check_lsh_hash(q_in, rotations_in, lengths_in, half_buckets_in);
  const int64_t batch = q_in.size(0), heads = q_in.size(1), length = q_in.size(2),
                dim = q_in.size(3);
  const int64_t rounds = rotations_in.size(3), columns = rotations_in.size(4);
  TORCH_CHECK(columns <= std::numeric_limits<int32_t>::max(),
              "lsh_hash: rotations have ", columns, " columns, more than the kernel's int32 "
              "column indices hold");
  const at::Tensor q = q_in.contiguous(), rotations = rotations_in.contiguous();
  const at::Tensor lengths = lengths_in.to(at::kLong).contiguous();
  const at::Tensor half_buckets = half_buckets_in.to(at::kLong).contiguous();
  attention_ext_checks::check_lsh_hash_values(lengths.data_ptr<int64_t>(), half_buckets.data_ptr<int64_t>(),
                                              batch, length, columns);
  at::Tensor buckets = at::empty({batch, heads, rounds, length}, lengths.options());
  at::Tensor order = at::empty({batch, heads, rounds, length}, lengths.options());
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "lsh_hash", [&] {
    TORCH_CHECK(columns % kLanes<scalar_t> == 0, "lsh_hash: P must be a multiple of ",
                kLanes<scalar_t>);
    hash_kernel<scalar_t>(q.data_ptr<scalar_t>(), rotations.data_ptr<scalar_t>(),
                          lengths.data_ptr<int64_t>(), half_buckets.data_ptr<int64_t>(), batch,
                          heads, length, dim, rounds, columns, buckets.data_ptr<int64_t>(),
                          order.data_ptr<int64_t>());
  });
  return {buckets, order};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(attention_ext, m) {
  m.def("lsh_hash(Tensor q, Tensor rotations, Tensor lengths, Tensor half_buckets) "
        "-> (Tensor buckets, Tensor order)");
}

TORCH_LIBRARY_IMPL(attention_ext, CPU, m) {
  m.impl("lsh_hash", &lsh_hash_cpu);
}
