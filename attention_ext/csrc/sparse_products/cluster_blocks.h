// The per-cluster blocks of improved clustered attention's CPU kernels (sparse_product.cpp,
// clustered_top_attention.cpp): every query i of cluster j meets only the S keys T_j of its
// cluster, so a cluster's work is dense small-matrix work on a members x S block. The members'
// rows and the cluster's key (or value) rows are copied into small zero-padded contiguous
// blocks (`gather_rows`, `gather_columns`, `gather_coefficients`), the products run in register
// tiles (`small_product`), and the loops over clusters (`for_each_cluster`,
// `for_each_cluster_adding_key_gradients`) share the clusters out over the threads so that
// the results do not depend on the thread count.
//
// The helpers run inside parallel regions (the loops over clusters and
// `zero_rows_outside_clusters` open them): nothing here may throw (common/checks.h); the only
// allocations are a worker's own scratch vectors.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "checks.h"

#if defined(__AVX512F__) || defined(__AVX__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <vector>

namespace cluster_blocks {

using attention_ext_checks::SparseShape;

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

// Rows of a full tile. A tile row is one 512-bit accumulator on AVX-512 (32 registers: 8 rows)
// but two 256-bit ones on AVX2, whose 16 registers 8 rows would overfill (16 accumulators, plus B's
// row and A's broadcast: spilled to the stack in the inner loop); 6 rows x 2 vectors is the
// classic AVX2 sgemm tile. The sums run over k in the same order either way: same results.
#if defined(__AVX512F__)
constexpr int kTileRows = 8;
#else
constexpr int kTileRows = 6;
#endif

// C (rows x columns) = A (rows x depth) @ B (depth x columns) for the small per-cluster
// products; B and C are row-major with strides ldb, ldc, and columns, ldb and ldc are
// multiples of kLanes (the callers pad with zeros).
// The rows left after the full tiles go in one tile of their own size: each row of a tile
// is an independent chain of multiply-adds, and tiles of one row would wait on their own
// chain's latency (a cluster's member count is rarely a multiple of 8).
template <typename scalar_t>
void small_product(int64_t rows, int64_t columns, int64_t depth, const scalar_t* A, int64_t a_row,
                   int64_t a_col, const scalar_t* B, int64_t ldb, scalar_t* C, int64_t ldc) {
  for (int64_t n = 0; n < columns; n += kLanes<scalar_t>) {
    int64_t m = 0;
    for (; m + kTileRows <= rows; m += kTileRows)
      product_tile<scalar_t, kTileRows>(depth, A + m * a_row, a_row, a_col, B + n, ldb, C + m * ldc + n, ldc);
    const scalar_t* a = A + m * a_row;
    scalar_t* c = C + m * ldc + n;
    switch (rows - m) {
      case 7: product_tile<scalar_t, 7>(depth, a, a_row, a_col, B + n, ldb, c, ldc); break;
      case 6: product_tile<scalar_t, 6>(depth, a, a_row, a_col, B + n, ldb, c, ldc); break;
      case 5: product_tile<scalar_t, 5>(depth, a, a_row, a_col, B + n, ldb, c, ldc); break;
      case 4: product_tile<scalar_t, 4>(depth, a, a_row, a_col, B + n, ldb, c, ldc); break;
      case 3: product_tile<scalar_t, 3>(depth, a, a_row, a_col, B + n, ldb, c, ldc); break;
      case 2: product_tile<scalar_t, 2>(depth, a, a_row, a_col, B + n, ldb, c, ldc); break;
      case 1: product_tile<scalar_t, 1>(depth, a, a_row, a_col, B + n, ldb, c, ldc); break;
      default: break;
    }
  }
}

// The gathers below read rows at scattered positions; asking for a row a few steps ahead
// hides most of the memory latency, which otherwise dominates these kernels.
constexpr int64_t kPrefetchRows = 8;

template <typename scalar_t>
inline void prefetch_row(const scalar_t* rows, int64_t index, int64_t dim) {
  if (index < 0) return;
  const char* start = reinterpret_cast<const char*>(rows + index * dim);
  const char* stop = reinterpret_cast<const char*>(rows + (index + 1) * dim);
  for (const char* line = start; line < stop; line += 64) __builtin_prefetch(line);
}

// Asks for the first rows a gather will read (the gathers ask for the later ones as they go).
template <typename scalar_t>
inline void prefetch_first_rows(const scalar_t* rows, const int64_t* index, int64_t count, int64_t dim) {
  for (int64_t m = 0; m < std::min(count, kPrefetchRows); ++m) prefetch_row(rows, index[m], dim);
}

// dst[0, n) = src[0, n), with non-temporal (streaming) stores where the target allows: a row
// written once at a scattered position otherwise costs a read of its lines first (they are
// rarely in cache), and evicts lines the next clusters need. The caller issues
// finish_streaming_stores() before the region ends (streaming stores are weakly ordered).
template <typename scalar_t>
inline void store_row_streaming(scalar_t* dst, const scalar_t* src, int64_t n) {
#if defined(__AVX512F__) || defined(__AVX__)
#if defined(__AVX512F__)
  constexpr int64_t kBytes = 64;
#else
  constexpr int64_t kBytes = 32;
#endif
  constexpr int64_t kWidth = kBytes / static_cast<int64_t>(sizeof(scalar_t));
  if (reinterpret_cast<uintptr_t>(dst) % kBytes == 0 && n % kWidth == 0) {
    for (int64_t j = 0; j < n; j += kWidth) {
      if constexpr (std::is_same_v<scalar_t, float>) {
#if defined(__AVX512F__)
        _mm512_stream_ps(dst + j, _mm512_loadu_ps(src + j));
#else
        _mm256_stream_ps(dst + j, _mm256_loadu_ps(src + j));
#endif
      } else {
#if defined(__AVX512F__)
        _mm512_stream_pd(dst + j, _mm512_loadu_pd(src + j));
#else
        _mm256_stream_pd(dst + j, _mm256_loadu_pd(src + j));
#endif
      }
    }
    return;
  }
#endif
  std::copy(src, src + n, dst);
}

inline void finish_streaming_stores() {
#if defined(__AVX512F__) || defined(__AVX__)
  _mm_sfence();
#endif
}

// out (count x stride) = the rows `index` of rows (. x dim), zero-padded to `stride`
// columns, times `factor`; an index < 0 gives a zero row.
template <typename scalar_t>
void gather_rows(const scalar_t* rows, const int64_t* index, int64_t count, int64_t dim, int64_t stride,
                 scalar_t factor, scalar_t* out) {
  prefetch_first_rows(rows, index, count, dim);
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
  prefetch_first_rows(rows, index, count, dim);
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
  prefetch_first_rows(coefficients, query, count, slots);
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
  std::vector<scalar_t> a, b, c, d, e;
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
  prefetch_first_rows(rows, keys, slots, dim);
  for (int64_t slot = 0; slot < slots; ++slot) {
    if (slot + kPrefetchRows < slots) prefetch_row(rows, keys[slot + kPrefetchRows], dim);  // scattered rows
    if (keys[slot] < 0) continue;
    const scalar_t* src = block + slot * dim;
    scalar_t* dst = rows + keys[slot] * dim;
#pragma omp simd
    for (int64_t d = 0; d < dim; ++d) dst[d] += src[d];
  }
}

// The data of a contiguous (B, H, N, dim) tensor and its row width.
template <typename scalar_t>
struct Rows {
  scalar_t* rows;
  int64_t dim;
};

// Zeroes the rows of the positions that are in no cluster (padded queries) in each target, for
// outputs whose member rows a kernel writes: cheaper than zero-filling a whole output first (a
// pass over memory that is then written again).
template <typename scalar_t>
void zero_rows_outside_clusters(const SparseShape& s, const int64_t* offsets, const int64_t* members,
                                const std::vector<Rows<scalar_t>>& targets) {
  // A pass over the member lists: short sequences go to one task together.
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(s.length, 1));
  at::parallel_for(0, s.batch * s.heads, grain, [&](int64_t begin, int64_t end) {
    std::vector<char> in_cluster(s.length);
    for (int64_t g = begin; g < end; ++g) {
      std::fill(in_cluster.begin(), in_cluster.end(), 0);
      const int64_t* member = members + g * s.length;
      for (int64_t i = 0; i < offsets[g * (s.clusters + 1) + s.clusters]; ++i) in_cluster[member[i]] = 1;
      for (int64_t position = 0; position < s.length; ++position) {
        if (in_cluster[position]) continue;
        for (const Rows<scalar_t>& target : targets) {
          scalar_t* row = target.rows + (g * s.length + position) * target.dim;
          std::fill(row, row + target.dim, scalar_t(0));
        }
      }
    }
  });
}

// As for_each_cluster, for backward bodies that also compute gradients of the cluster's S
// key (and value) rows: body(scratch, cluster, block) writes, for each target t in order,
// an (S, targets[t].dim) block, one after the other in `block`; each is added into its
// target's rows at the cluster's keys. Clusters of one (batch, head) share keys, so their
// additions must not run concurrently:
// - with at least as many (batch, head)s as threads, a task takes whole (batch, head)s
//   and adds each block right away, while it is in cache;
// - otherwise (batch 1, few heads) the clusters are shared out, every block is kept, and
//   the blocks are added afterwards, one (batch, head) per task.
// Either way the additions into a row happen in cluster order, so the result does not
// depend on the thread count.
template <typename scalar_t, typename Body>
void for_each_cluster_adding_key_gradients(const SparseShape& s, const int64_t* topk, const int64_t* offsets,
                                           const int64_t* members, const std::vector<Rows<scalar_t>>& targets,
                                           const Body& body) {
  const int64_t groups = s.batch * s.heads;
  int64_t block_size = 0;
  for (const Rows<scalar_t>& target : targets) block_size += s.slots * target.dim;
  auto nonempty = [&](int64_t g, int64_t c) {
    const int64_t* offset = offsets + g * (s.clusters + 1);
    return offset[c + 1] > offset[c];
  };
  auto add_blocks = [&](const scalar_t* block, const int64_t* keys, int64_t g) {
    for (const Rows<scalar_t>& target : targets) {
      add_block(block, keys, s.slots, target.dim, target.rows + g * s.length * target.dim);
      block += s.slots * target.dim;
    }
  };
  if (groups >= at::get_num_threads()) {
    at::parallel_for(0, groups, 1, [&](int64_t begin, int64_t end) {
      Scratch<scalar_t> scratch;
      std::vector<scalar_t> block(block_size);
      for (int64_t index = begin * s.clusters; index < end * s.clusters; ++index)
        run_cluster(s, topk, offsets, members, index, scratch, [&](Scratch<scalar_t>& sc, const Cluster& cluster) {
          body(sc, cluster, block.data());
          add_blocks(block.data(), cluster.keys, cluster.g);
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
          add_blocks(blocks.get() + (g * s.clusters + c) * block_size, topk + (g * s.clusters + c) * s.slots, g);
  });
}

}  // namespace cluster_blocks
