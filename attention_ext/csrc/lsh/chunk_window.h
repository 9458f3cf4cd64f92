// The window of one chunk in one round and the walk over a round's chunks, shared by the
// forward (attention_forward.cpp) and backward (attention_backward.cpp) passes of LSH's
// chunked attention on the CPU (lsh_cpu.h says what the operators compute).
#pragma once

#include "lsh_cpu.h"

namespace lsh_cpu {

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
inline int64_t groups_per_head(const LshProblem& p) { return chunk_count(p.max_chunks, kChunksPerTask); }

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

}  // namespace lsh_cpu
