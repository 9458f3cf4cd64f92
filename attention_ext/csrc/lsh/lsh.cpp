// Reformer (LSH) chunked attention on CPU, forward and backward.
//
// Python (attention_ext/lsh.py) draws the random rotations; `lsh_hash` here projects the
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
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "../common/vector_exp.h"
#include "checks.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

namespace {

int64_t chunk_count(int64_t valid, int64_t chunk) { return (valid + chunk - 1) / chunk; }

// Tasks per thread at least, so that small problems run inline: a parallel region costs
// tens of microseconds, and far more when other processes hold the cores.
int64_t grain_for(int64_t work_per_task, int64_t work_per_grain = 1 << 18) {
  return std::max<int64_t>(1, work_per_grain / std::max<int64_t>(1, work_per_task));
}

int64_t previous_chunk(int64_t c, int64_t chunks) { return (c + chunks - 1) % chunks; }

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

// Checks that each round's first L entries are a permutation of 0..L-1 (a wrong
// order would read out of bounds) and records every position's chunk per round.
// No check throws inside the parallel region (see common/checks.h): a task that meets a bad
// entry notes its slot and stops, and the error is raised after the region for the first
// task (in task order) with one, so the message does not depend on the thread count.
void index_chunks(const LshProblem& p, int32_t* chunk_of) {
  const int64_t tasks = p.batch * p.heads * p.rounds;
  std::vector<int64_t> bad_slot(tasks, -1);  // per task: the first slot that breaks the permutation
  run_tasks(tasks, grain_for(8 * p.length), [&](TaskQueue& queue) {
    std::vector<char> seen(p.length);
    for (int64_t t; queue.pop(t);) {
      const int64_t bh = t / p.rounds, r = t % p.rounds, b = bh / p.heads;
      const int64_t valid = p.valid(b);
      const int64_t* order = p.round_order(bh, r);
      int32_t* chunks = chunk_of + (bh * p.rounds + r) * p.length;
      std::fill(seen.begin(), seen.end(), 0);
      for (int64_t s = 0; s < valid; ++s) {
        const int64_t pos = order[s];
        if (pos < 0 || pos >= valid || seen[pos]) {
          bad_slot[t] = s;
          break;
        }
        seen[pos] = 1;
        chunks[pos] = static_cast<int32_t>(s / p.chunk);
      }
    }
  });
  const auto bad = std::find_if(bad_slot.begin(), bad_slot.end(), [](int64_t s) { return s >= 0; });
  if (bad == bad_slot.end()) return;
  const int64_t t = bad - bad_slot.begin(), s = *bad;
  const int64_t bh = t / p.rounds, r = t % p.rounds, b = bh / p.heads, h = bh % p.heads;
  const int64_t valid = p.valid(b), pos = p.round_order(bh, r)[s];
  TORCH_CHECK(false, "lsh attention: order[", b, ", ", h, ", ", r, ", :", valid,
              "] must be a permutation of the valid positions 0..", valid - 1, ", but order[", b,
              ", ", h, ", ", r, ", ", s, "] = ", pos,
              pos < 0 || pos >= valid ? " is outside that range" : " repeats an earlier entry");
}

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

// --- One chunk's window in one round ------------------------------------------------------
// The scores are kept transposed, keys x queries ("key-major"): softmax statistics then
// vectorise across queries, and only the chunk's query-side matrices need transposing.
// Keys are the chunk's own positions first (in sorted order; so key qi is query qi's
// own key), then the previous chunk's.
template <typename T>
constexpr T kNormEps = T(1e-12);  // torch.nn.functional.normalize's default eps

template <typename T>
struct ChunkWindow {
  int64_t chunk, dim, value_dim, dim_pad, value_pad, query_pad;
  bool backward;
  std::vector<int64_t> query_pos, key_pos;
  std::vector<T> key_inv_norm;     // (2 chunk,): 1 / max(||q_j||, eps) of each key
  std::vector<char> key_clamped;   // (2 chunk,): ||q_j|| < eps (the norm is the constant eps)
  std::vector<T> q_t;          // (dim, query_pad)              queries transposed
  std::vector<T> keys_rows;    // (2 chunk, dim_pad)           unit keys
  std::vector<T> values_rows;  // (2 chunk, value_pad)
  std::vector<T> q_rows;       // (chunk, dim_pad)                backward only
  std::vector<int32_t> key_chunks;    // (rounds, 2 chunk): each key's chunk in every round
  std::vector<int32_t> query_chunks;  // (rounds, 2, query_pad): each query's own and previous chunk
  std::vector<int32_t> counts;        // (query_pad,)
  int64_t queries = 0, keys = 0, chunks = 0;

  ChunkWindow(int64_t chunk_, int64_t dim_, int64_t value_dim_, int64_t rounds, bool backward_)
      : chunk(chunk_), dim(dim_), value_dim(value_dim_),
        dim_pad(round_up(dim_, kLanes<T>)), value_pad(round_up(value_dim_, kLanes<T>)),
        query_pad(round_up(chunk_, kLanes<T>)), backward(backward_), query_pos(chunk_),
        key_pos(2 * chunk_), key_inv_norm(2 * chunk_), key_clamped(2 * chunk_),
        q_t(dim_ * query_pad, T(0)), keys_rows(2 * chunk_ * dim_pad, T(0)),
        values_rows(2 * chunk_ * value_pad, T(0)),
        q_rows(backward_ ? chunk_ * dim_pad : 0, T(0)),
        key_chunks(rounds > 1 ? rounds * 2 * chunk_ : 0),
        query_chunks(rounds > 1 ? rounds * 2 * query_pad : 0), counts(query_pad) {}

  // The chunk whose own rows (keys 0..queries-1) the window holds: the next chunk of the
  // same (batch, head, round) takes them as its previous chunk's keys, moved within the
  // buffers instead of gathered from memory and normalised again.
  int64_t held_bh = -1, held_round = -1, held_chunk = -1;

  // Moves the rows of keys 0..count-1 to keys at..at+count-1 (at >= 0; the ranges may overlap).
  void move_keys(int64_t count, int64_t at, int64_t rounds) {
    const auto move = [&](auto& buffer, int64_t width, int64_t offset) {
      std::copy_backward(buffer.begin() + offset, buffer.begin() + offset + count * width,
                         buffer.begin() + offset + (at + count) * width);
    };
    move(key_pos, 1, 0);
    move(key_inv_norm, 1, 0);
    move(key_clamped, 1, 0);
    move(keys_rows, dim_pad, 0);
    move(values_rows, value_pad, 0);
    if (rounds > 1)
      for (int64_t other = 0; other < rounds; ++other) move(key_chunks, 1, other * 2 * chunk);
  }

  // Normalises and stores key j (position key_pos[j]) and its value.
  void load_key(int64_t j, const T* q_bh, const T* values_bh) {
    const T* q_row = q_bh + key_pos[j] * dim;
    T squares = 0;
#pragma omp simd reduction(+ : squares)
    for (int64_t e = 0; e < dim; ++e) squares += q_row[e] * q_row[e];
    const T norm = std::sqrt(squares);
    key_clamped[j] = norm < kNormEps<T>;
    key_inv_norm[j] = T(1) / (key_clamped[j] ? kNormEps<T> : norm);
    T* k_row = &keys_rows[j * dim_pad];
    const T inv = key_inv_norm[j];
#pragma omp simd
    for (int64_t e = 0; e < dim; ++e) k_row[e] = q_row[e] * inv;
    copy_row(&values_rows[j * value_pad], values_bh + key_pos[j] * value_dim, value_dim);
  }

  void gather(const LshProblem& p, int64_t bh, int64_t r, int64_t c, const T* q_bh,
              const T* values_bh) {
    const int64_t valid = p.valid(bh / p.heads);
    const int64_t* order = p.round_order(bh, r);
    chunks = chunk_count(valid, p.chunk);
    const int64_t begin = c * p.chunk, end = std::min(begin + p.chunk, valid);
    queries = end - begin;
    keys = queries;
    bool reused = false;
    int64_t prev_begin = 0;
    if (chunks > 1) {
      const int64_t prev = previous_chunk(c, chunks);
      prev_begin = prev * p.chunk;
      keys += std::min(prev_begin + p.chunk, valid) - prev_begin;
      reused = held_bh == bh && held_round == r && held_chunk == prev;
      if (reused) move_keys(keys - queries, queries, p.rounds);
    }
    for (int64_t i = 0; i < queries; ++i) query_pos[i] = key_pos[i] = order[begin + i];
    for (int64_t i = 0; i < queries; ++i) {
      const T* q_row = q_bh + query_pos[i] * dim;
      for (int64_t e = 0; e < dim; ++e) q_t[e * query_pad + i] = q_row[e];
      if (backward) copy_row(&q_rows[i * dim_pad], q_row, dim);
    }
    // Query columns past the last query must read as zero.
    for (int64_t e = 0; e < dim; ++e)
      std::fill(&q_t[e * query_pad + queries], &q_t[(e + 1) * query_pad], T(0));
    for (int64_t j = 0; j < queries; ++j) load_key(j, q_bh, values_bh);
    if (!reused)
      for (int64_t j = queries; j < keys; ++j) {
        key_pos[j] = order[prev_begin + j - queries];
        load_key(j, q_bh, values_bh);
      }
    if (p.rounds > 1) {
      for (int64_t other = 0; other < p.rounds; ++other) {
        const int32_t* chunk_of = p.round_chunk_of(bh, other);
        for (int64_t j = 0; j < (reused ? queries : keys); ++j)
          key_chunks[other * 2 * chunk + j] = chunk_of[key_pos[j]];
        int32_t* own = &query_chunks[(other * 2) * query_pad];
        int32_t* prev = &query_chunks[(other * 2 + 1) * query_pad];
        for (int64_t i = 0; i < queries; ++i) {
          own[i] = chunk_of[query_pos[i]];
          prev[i] = chunks > 1 ? static_cast<int32_t>(previous_chunk(own[i], chunks)) : own[i];
        }
      }
    }
    held_bh = bh;
    held_round = r;
    held_chunk = c;
  }

  // Turns a gradient g with respect to unit key j into one with respect to its query
  // q_j: (g - k_j (k_j . g)) / ||q_j||, or g / eps where the norm was clamped.
  void unit_key_backward(int64_t j, T* g) const {
    const T inv = key_inv_norm[j];
    if (key_clamped[j]) {
#pragma omp simd
      for (int64_t e = 0; e < dim; ++e) g[e] *= inv;
      return;
    }
    const T* k_row = &keys_rows[j * dim_pad];
    T dot = 0;
#pragma omp simd reduction(+ : dot)
    for (int64_t e = 0; e < dim; ++e) dot += k_row[e] * g[e];
#pragma omp simd
    for (int64_t e = 0; e < dim; ++e) g[e] = (g[e] - k_row[e] * dot) * inv;
  }

  // Turns the raw products q_i . k_j of key row j (one entry per query) into logits:
  // times 1/sqrt(E), minus log n_ij when rounds > 1 (n_ij = the rounds whose window of
  // query i holds key j, this round included).
  void logits_of_key(const LshProblem& p, int64_t r, int64_t j, const T* log_table, T scale,
                     T* row) {
    if (p.rounds > 1) {
      int32_t* n = counts.data();
      for (int64_t i = 0; i < queries; ++i) n[i] = 1;
      for (int64_t other = 0; other < p.rounds; ++other) {
        if (other == r) continue;
        const int32_t key_chunk = key_chunks[other * 2 * chunk + j];
        const int32_t* own = &query_chunks[(other * 2) * query_pad];
        const int32_t* prev = &query_chunks[(other * 2 + 1) * query_pad];
#pragma omp simd
        for (int64_t i = 0; i < queries; ++i) n[i] += (own[i] == key_chunk) | (prev[i] == key_chunk);
      }
#pragma omp simd
      for (int64_t i = 0; i < queries; ++i) row[i] = row[i] * scale - log_table[n[i]];
    } else {
#pragma omp simd
      for (int64_t i = 0; i < queries; ++i) row[i] *= scale;
    }
  }
};

template <typename T>
std::vector<T> log_count_table(int64_t rounds) {
  std::vector<T> table(rounds + 1, 0);
  for (int64_t n = 1; n <= rounds; ++n) table[n] = static_cast<T>(std::log(double(n)));
  return table;
}

// Tasks own groups of this many consecutive chunks of one (batch, head) and round, so a
// task can prefetch its next chunk's rows and take each chunk's previous-chunk keys from the
// window it has just computed (ChunkWindow::gather); only a group's first chunk gathers both.
constexpr int64_t kChunksPerTask = 8;

// Tasks per (batch, head) in a round: the groups of the longest sequence's chunks.
int64_t groups_per_head(const LshProblem& p) { return chunk_count(p.max_chunks, kChunksPerTask); }

// The chunks task t owns in round r: chunks first..last-1 of one (batch, head).
struct ChunkGroup {
  int64_t task, bh, valid, chunks, first, last;  // valid: the sequence's length; chunks: its count
  int64_t base, value_base;                      // where the (batch, head)'s rows start in q, in v
  const int64_t* order;                          // the round's sorted positions

  ChunkGroup(const LshProblem& p, int64_t t, int64_t r)
      : task(t), bh(t / groups_per_head(p)), valid(p.valid(bh / p.heads)), chunks(chunk_count(valid, p.chunk)),
        first(t % groups_per_head(p) * kChunksPerTask), last(std::min(first + kChunksPerTask, chunks)),
        base(bh * p.length * p.dim), value_base(bh * p.length * p.value_dim), order(p.round_order(bh, r)) {}

  bool owns(int64_t c) const { return c >= first && c < last; }
};

// The positions of the chunk after the one being computed, and how many (0 after a group's
// last chunk, whose successor another task computes): the rows worth fetching now.
struct NextChunk {
  const int64_t* positions;
  int64_t count;
};

// The walk the forward and backward passes share, for round r: one parallel region whose tasks
// are the chunk groups of every (batch, head). Each thread sets up a window and the pass's
// Scratch once; then, for every chunk c of each group it pops, in order, the window is gathered
// (c's queries, its own and its previous chunk's keys and values), the next chunk's rows of q and
// v are asked for, and step(w, scratch, group, c, next) does the pass's work on the window.
template <typename T, typename Scratch, typename Step>
void walk_chunks(const LshProblem& p, int64_t r, int64_t grain, bool backward, const T* q, const T* values,
                 const Step& step) {
  run_tasks(p.batch * p.heads * groups_per_head(p), grain, [&](TaskQueue& queue) {
    ChunkWindow<T> w(p.chunk, p.dim, p.value_dim, p.rounds, backward);
    Scratch scratch(w);
    for (int64_t t; queue.pop(t);) {
      const ChunkGroup group(p, t, r);
      for (int64_t c = group.first; c < group.last; ++c) {
        w.gather(p, group.bh, r, c, q + group.base, values + group.value_base);
        NextChunk next{nullptr, 0};
        if (c + 1 < group.last) {
          next = {group.order + (c + 1) * p.chunk, std::min(p.chunk, group.valid - (c + 1) * p.chunk)};
          prefetch_rows(q + group.base, next.positions, next.count, p.dim);
          prefetch_rows(values + group.value_base, next.positions, next.count, p.value_dim);
        }
        step(w, scratch, group, c, next);
      }
    }
  });
}

// A forward thread's buffers, beside its window: the key-major scores, the mixed values, and
// per query the running maximum logit and the sum of weights.
template <typename T>
struct ForwardScratch {
  std::vector<T> scores, mixed, max_logit, total;
  explicit ForwardScratch(const ChunkWindow<T>& w)
      : scores(2 * w.chunk * w.query_pad), mixed(w.chunk * w.value_pad), max_logit(w.query_pad),
        total(w.query_pad) {}
};

template <typename T>
void forward_kernel(const LshProblem& p, const T* q, const T* values, T* out, T* lse) {
  const int64_t E = p.dim, Ev = p.value_dim, N = p.length, C = p.chunk;
  const T scale = static_cast<T>(1.0 / std::sqrt(double(E)));
  const T infinity = std::numeric_limits<T>::infinity();
  const auto log_table = log_count_table<T>(p.rounds);
  const int64_t grain = grain_for(4 * kChunksPerTask * C * C * (E + Ev));
  for (int64_t r = 0; r < p.rounds; ++r) {
    walk_chunks<T, ForwardScratch<T>>(p, r, grain, /*backward=*/false, q, values,
                                      [&](ChunkWindow<T>& w, ForwardScratch<T>& s, const ChunkGroup& group,
                                          int64_t, const NextChunk& next) {
      // round 0 writes the output rows without reading them
      if (r == 0)
        prefetch_rows<true>(out + group.value_base, next.positions, next.count, Ev);
      else
        prefetch_rows(out + group.value_base, next.positions, next.count, Ev);
      const int64_t Q = w.queries, K = w.keys, Cp = w.query_pad;
      // scores[j][i] = q_i . k_j
      small_gemm<T>(w.keys_rows.data(), {w.dim_pad, 1}, w.q_t.data(), Cp, s.scores.data(), Cp, K, E, Cp);
      const bool mask_self = K > 1;  // key qi is query qi itself
      std::fill(s.max_logit.begin(), s.max_logit.end(), -infinity);
      for (int64_t j = 0; j < K; ++j) {
        T* row = &s.scores[j * Cp];
        w.logits_of_key(p, r, j, log_table.data(), scale, row);
        if (mask_self && j < Q) row[j] = -infinity;
#pragma omp simd
        for (int64_t i = 0; i < Q; ++i) s.max_logit[i] = std::max(s.max_logit[i], row[i]);
      }
      std::fill(s.total.begin(), s.total.end(), T(0));
      for (int64_t j = 0; j < K; ++j) {
        T* row = &s.scores[j * Cp];
#pragma omp simd
        for (int64_t i = 0; i < Q; ++i) row[i] -= s.max_logit[i];
        exp_inplace(row, Q);
        if (mask_self && j < Q) row[j] = 0;
#pragma omp simd
        for (int64_t i = 0; i < Q; ++i) s.total[i] += row[i];
      }
      // mixed[i] = sum_j weight_ij v_j, weights read transposed from scores
      small_gemm<T>(s.scores.data(), {1, Cp}, w.values_rows.data(), w.value_pad, s.mixed.data(), w.value_pad,
                    Q, K, w.value_pad);
      for (int64_t i = 0; i < Q; ++i) {
        const int64_t pos = w.query_pos[i];
        const T* o = &s.mixed[i * w.value_pad];
        T* out_row = out + group.value_base + pos * Ev;
        T& row_lse = lse[group.bh * N + pos];
        const T round_lse = s.max_logit[i] + std::log(s.total[i]);
        if (r == 0) {
          const T inv = T(1) / s.total[i];
          for (int64_t e = 0; e < Ev; ++e) out_row[e] = o[e] * inv;
          row_lse = round_lse;
        } else {  // merge with the earlier rounds by log-sum-exp
          const T merged = std::max(row_lse, round_lse) + std::log1p(std::exp(-std::abs(row_lse - round_lse)));
          const T keep = std::exp(row_lse - merged);
          const T add = std::exp(round_lse - merged) / s.total[i];
          for (int64_t e = 0; e < Ev; ++e) out_row[e] = out_row[e] * keep + o[e] * add;
          row_lse = merged;
        }
      }
    });
  }
}

// A backward thread's buffers, beside its window: the weights and the logits' gradients
// (key-major), the chunk's output gradients (row- and column-major), per query its log-sum-exp
// and dO . o, and the chunk's query, key and value gradients.
template <typename T>
struct BackwardScratch {
  std::vector<T> prob, dlogit, go_rows, go_t, row_lse, go_dot_out, dq, dk, dv;
  explicit BackwardScratch(const ChunkWindow<T>& w)
      : prob(2 * w.chunk * w.query_pad), dlogit(2 * w.chunk * w.query_pad), go_rows(w.chunk * w.value_pad, T(0)),
        go_t(w.value_dim * w.query_pad, T(0)), row_lse(w.query_pad), go_dot_out(w.query_pad),
        dq(w.chunk * w.dim_pad), dk(2 * w.chunk * w.dim_pad), dv(2 * w.chunk * w.value_pad) {}
};

// Where the key and value gradients of rows another task owns wait until the parallel region
// is over: a group's first chunk also writes into the chunk before it, which the previous group
// owns, so each task has a slot of `chunk` rows. Left uninitialised (only the rows a task
// writes are read), not zeroed on every call.
template <typename T>
struct BoundaryRows {
  int64_t chunk, dim, value_dim;
  std::unique_ptr<T[]> dk, dv;
  std::unique_ptr<int64_t[]> positions;
  std::vector<int64_t> rows;  // per task: rows written so far this round

  BoundaryRows(int64_t tasks, int64_t chunk_, int64_t dim_, int64_t value_dim_)
      : chunk(chunk_), dim(dim_), value_dim(value_dim_), dk(new T[tasks * chunk_ * dim_]),
        dv(new T[tasks * chunk_ * value_dim_]), positions(new int64_t[tasks * chunk_]), rows(tasks) {}

  void keep(int64_t task, int64_t position, const T* key_grad, const T* value_grad) {
    const int64_t slot = task * chunk + rows[task]++;
    positions[slot] = position;
    copy_row(&dk[slot * dim], key_grad, dim);
    copy_row(&dv[slot * value_dim], value_grad, value_dim);
  }

  // Adds every kept row into the gradients (after the region, task by task: the same order
  // whatever the thread count) and empties the slots for the next round.
  void add_to(const LshProblem& p, T* grad_q, T* grad_values) {
    for (int64_t task = 0; task < static_cast<int64_t>(rows.size()); ++task) {
      const int64_t bh = task / groups_per_head(p);
      for (int64_t row = 0; row < rows[task]; ++row) {
        const int64_t slot = task * chunk + row, pos = positions[slot];
        add_row(grad_q + (bh * p.length + pos) * dim, &dk[slot * dim], dim);
        add_row(grad_values + (bh * p.length + pos) * value_dim, &dv[slot * value_dim], value_dim);
      }
      rows[task] = 0;
    }
  }
};

// Round 0 of the backward zeroes the gradient rows of chunk c (they start uninitialised) before
// anything adds to them; only their owner writes rows during the region. A chunk is zeroed at
// its own step, its rows prefetched for writing during the step before, except where the group's
// first chunk wraps around to its last (a sequence of at most kChunksPerTask chunks): the first
// chunk adds into that one, so it is zeroed first.
template <typename T>
void zero_gradient_rows(const LshProblem& p, const ChunkGroup& group, int64_t c, T* grad_q, T* grad_values) {
  const auto zero = [&](int64_t chunk_index) {
    const int64_t end_slot = std::min((chunk_index + 1) * p.chunk, group.valid);
    for (int64_t s = chunk_index * p.chunk; s < end_slot; ++s) {
      std::fill_n(grad_q + group.base + group.order[s] * p.dim, p.dim, T(0));
      std::fill_n(grad_values + group.value_base + group.order[s] * p.value_dim, p.value_dim, T(0));
    }
  };
  const int64_t wrapped = group.chunks > 1 ? previous_chunk(group.first, group.chunks) : -1;
  const bool wraps_within = wrapped > group.first && wrapped < group.last;
  if (c == group.first && wraps_within) zero(wrapped);
  if (!(wraps_within && c == wrapped)) zero(c);
}

template <typename T>
void backward_kernel(const LshProblem& p, const T* grad_out, const T* q, const T* values,
                     const T* out, const T* lse, T* grad_q, T* grad_values) {
  const int64_t E = p.dim, Ev = p.value_dim, N = p.length, C = p.chunk;
  const T scale = static_cast<T>(1.0 / std::sqrt(double(E)));
  const auto log_table = log_count_table<T>(p.rounds);
  BoundaryRows<T> boundary(p.batch * p.heads * groups_per_head(p), C, E, Ev);
  const int64_t grain = grain_for(10 * kChunksPerTask * C * C * (E + Ev));
  for (int64_t r = 0; r < p.rounds; ++r) {
    walk_chunks<T, BackwardScratch<T>>(p, r, grain, /*backward=*/true, q, values,
                                       [&](ChunkWindow<T>& w, BackwardScratch<T>& s, const ChunkGroup& group,
                                           int64_t c, const NextChunk& next) {
      const int64_t base = group.base, value_base = group.value_base;
      if (r == 0) zero_gradient_rows(p, group, c, grad_q, grad_values);
      prefetch_rows(grad_out + value_base, next.positions, next.count, Ev);
      prefetch_rows(out + value_base, next.positions, next.count, Ev);
      prefetch_rows<true>(grad_q + base, next.positions, next.count, E);
      prefetch_rows<true>(grad_values + value_base, next.positions, next.count, Ev);
      const int64_t Q = w.queries, K = w.keys, Cp = w.query_pad;
      for (int64_t i = 0; i < Q; ++i) {
        const int64_t pos = w.query_pos[i];
        const T* go = grad_out + value_base + pos * Ev;
        const T* o = out + value_base + pos * Ev;
        copy_row(&s.go_rows[i * w.value_pad], go, Ev);
        T dot = 0;
#pragma omp simd reduction(+ : dot)
        for (int64_t e = 0; e < Ev; ++e) dot += go[e] * o[e];
        s.go_dot_out[i] = dot;
        s.row_lse[i] = lse[group.bh * N + pos];
      }
      for (int64_t e = 0; e < Ev; ++e)  // transposed from the copy in L1
        for (int64_t i = 0; i < Q; ++i) s.go_t[e * Cp + i] = s.go_rows[i * w.value_pad + e];
      for (int64_t e = 0; e < Ev; ++e) std::fill(&s.go_t[e * Cp + Q], &s.go_t[(e + 1) * Cp], T(0));
      // prob[j][i] = q_i . k_j for now; dlogit[j][i] = dO_i . v_j
      small_gemm<T>(w.keys_rows.data(), {w.dim_pad, 1}, w.q_t.data(), Cp, s.prob.data(), Cp, K, E, Cp);
      small_gemm<T>(w.values_rows.data(), {w.value_pad, 1}, s.go_t.data(), Cp, s.dlogit.data(), Cp, K, Ev, Cp);
      const bool mask_self = K > 1;
      for (int64_t j = 0; j < K; ++j) {
        // prob: this entry's share of the total softmax (lse holds all rounds);
        // dlogit = prob * (dO_i . v_j - dO_i . o_i), times 1/sqrt(E) for d/d(q_i . k_j).
        T* p_row = &s.prob[j * Cp];
        T* d_row = &s.dlogit[j * Cp];
        w.logits_of_key(p, r, j, log_table.data(), scale, p_row);
#pragma omp simd
        for (int64_t i = 0; i < Q; ++i) p_row[i] -= s.row_lse[i];
        exp_inplace(p_row, Q);
        if (mask_self && j < Q) p_row[j] = 0;
#pragma omp simd
        for (int64_t i = 0; i < Q; ++i) d_row[i] = p_row[i] * (d_row[i] - s.go_dot_out[i]) * scale;
      }
      // dq = dlogit^T keys, dk = dlogit q (then through the key normalisation), dv = prob dO
      small_gemm<T>(s.dlogit.data(), {1, Cp}, w.keys_rows.data(), w.dim_pad, s.dq.data(), w.dim_pad, Q, K,
                    w.dim_pad);
      small_gemm<T>(s.dlogit.data(), {Cp, 1}, w.q_rows.data(), w.dim_pad, s.dk.data(), w.dim_pad, K, Q, w.dim_pad);
      small_gemm<T>(s.prob.data(), {Cp, 1}, s.go_rows.data(), w.value_pad, s.dv.data(), w.value_pad, K, Q,
                    w.value_pad);
      for (int64_t i = 0; i < Q; ++i) add_row(grad_q + base + w.query_pos[i] * E, &s.dq[i * w.dim_pad], E);
      // Keys 0..Q-1 are this chunk's own; keys Q..K-1 the previous chunk's.
      const bool prev_owned = group.owns(previous_chunk(c, group.chunks));
      for (int64_t j = 0; j < K; ++j) {
        w.unit_key_backward(j, &s.dk[j * w.dim_pad]);
        if (j >= Q && !prev_owned) {
          boundary.keep(group.task, w.key_pos[j], &s.dk[j * w.dim_pad], &s.dv[j * w.value_pad]);
          continue;
        }
        add_row(grad_q + base + w.key_pos[j] * E, &s.dk[j * w.dim_pad], E);
        add_row(grad_values + value_base + w.key_pos[j] * Ev, &s.dv[j * w.value_pad], Ev);
      }
    });
    boundary.add_to(p, grad_q, grad_values);
  }
}

struct PreparedInputs {
  at::Tensor order, lengths, chunk_of;
  LshProblem problem;
};

// The problem of checked inputs (lsh/checks.h): the lengths' values checked on the host, the
// order's while its chunks are indexed.
PreparedInputs prepare(const at::Tensor& q, const at::Tensor& v, const at::Tensor& order_in,
                       const at::Tensor& lengths_in, int64_t chunk_size) {
  PreparedInputs prepared;
  prepared.order = order_in.to(at::kLong).contiguous();
  prepared.lengths = lengths_in.to(at::kLong).contiguous();
  LshProblem& p = prepared.problem;
  p.batch = q.size(0);
  p.heads = q.size(1);
  p.rounds = order_in.size(2);
  p.length = q.size(2);
  p.dim = q.size(3);
  p.value_dim = v.size(3);
  p.order = prepared.order.data_ptr<int64_t>();
  p.lengths = prepared.lengths.data_ptr<int64_t>();
  int64_t longest = 0;
  for (int64_t b = 0; b < p.batch; ++b) {
    TORCH_CHECK(p.lengths[b] >= 0 && p.lengths[b] <= p.length, "lsh attention: lengths[", b,
                "] = ", p.lengths[b], " is outside [0, ", p.length, "]");
    longest = std::max(longest, p.lengths[b]);
  }
  // A chunk longer than the longest sequence behaves like one of exactly that length
  // (one chunk per sequence); clamping keeps the per-thread buffers small.
  p.chunk = std::min(chunk_size, std::max<int64_t>(longest, 1));
  p.max_chunks = chunk_count(longest, p.chunk);
  prepared.chunk_of = at::empty({p.batch, p.heads, p.rounds, p.length}, at::kInt);
  index_chunks(p, prepared.chunk_of.data_ptr<int32_t>());
  p.chunk_of = prepared.chunk_of.data_ptr<int32_t>();
  return prepared;
}

// Zeroes the rows of padded positions (b, :, lengths[b]:) of a (B, H, N, ...) tensor;
// the kernels write every valid row.
void zero_padded_rows(at::Tensor& t, const LshProblem& p) {
  for (int64_t b = 0; b < p.batch; ++b)
    if (p.lengths[b] < p.length) t.select(0, b).narrow(1, p.lengths[b], p.length - p.lengths[b]).zero_();
}

std::tuple<at::Tensor, at::Tensor> lsh_attention_forward_cpu(const at::Tensor& q_in,
                                                             const at::Tensor& v_in,
                                                             const at::Tensor& order,
                                                             const at::Tensor& lengths,
                                                             int64_t chunk_size) {
  attention_ext_checks::check_lsh_attention(q_in, v_in, order, lengths, chunk_size);
  const PreparedInputs prepared = prepare(q_in, v_in, order, lengths, chunk_size);
  const at::Tensor q = q_in.contiguous(), v = v_in.contiguous();
  at::Tensor out = at::empty_like(v, at::MemoryFormat::Contiguous);
  at::Tensor lse = at::empty({q.size(0), q.size(1), q.size(2)}, q.options());
  zero_padded_rows(out, prepared.problem);
  zero_padded_rows(lse, prepared.problem);
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "lsh_attention_forward", [&] {
    forward_kernel<scalar_t>(prepared.problem, q.data_ptr<scalar_t>(), v.data_ptr<scalar_t>(),
                             out.data_ptr<scalar_t>(), lse.data_ptr<scalar_t>());
  });
  return {out, lse};
}

std::tuple<at::Tensor, at::Tensor> lsh_attention_backward_cpu(
    const at::Tensor& grad_out_in, const at::Tensor& q_in, const at::Tensor& v_in,
    const at::Tensor& order, const at::Tensor& lengths, const at::Tensor& out_in,
    const at::Tensor& lse_in, int64_t chunk_size) {
  attention_ext_checks::check_lsh_attention_backward(grad_out_in, q_in, v_in, order, lengths, out_in, lse_in,
                                                     chunk_size);
  const PreparedInputs prepared = prepare(q_in, v_in, order, lengths, chunk_size);
  const at::Tensor q = q_in.contiguous(), v = v_in.contiguous();
  const at::Tensor grad_out = grad_out_in.to(q.scalar_type()).contiguous();
  const at::Tensor out = out_in.contiguous(), lse = lse_in.contiguous();
  // Valid rows are zeroed by the kernel's first round, next to their first use.
  at::Tensor grad_q = at::empty_like(q, at::MemoryFormat::Contiguous);
  at::Tensor grad_v = at::empty_like(v, at::MemoryFormat::Contiguous);
  zero_padded_rows(grad_q, prepared.problem);
  zero_padded_rows(grad_v, prepared.problem);
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "lsh_attention_backward", [&] {
    backward_kernel<scalar_t>(prepared.problem, grad_out.data_ptr<scalar_t>(),
                              q.data_ptr<scalar_t>(), v.data_ptr<scalar_t>(),
                              out.data_ptr<scalar_t>(), lse.data_ptr<scalar_t>(),
                              grad_q.data_ptr<scalar_t>(), grad_v.data_ptr<scalar_t>());
  });
  return {grad_q, grad_v};
}

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
// product's N E P multiply-adds (P = n_buckets / 2 grows with N, so the arithmetic of
// Reformer hashing is quadratic in N; the tiles keep it near the core's peak rate).
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
  m.def("lsh_attention_forward(Tensor q, Tensor v, Tensor order, Tensor lengths, int chunk_size) "
        "-> (Tensor out, Tensor lse)");
  m.def("lsh_attention_backward(Tensor grad_out, Tensor q, Tensor v, Tensor order, "
        "Tensor lengths, Tensor out, Tensor lse, int chunk_size) -> (Tensor grad_q, Tensor grad_v)");
}

TORCH_LIBRARY_IMPL(attention_ext, CPU, m) {
  m.impl("lsh_hash", &lsh_hash_cpu);
  m.impl("lsh_attention_forward", &lsh_attention_forward_cpu);
  m.impl("lsh_attention_backward", &lsh_attention_backward_cpu);
}
