// The dense part of clustered attention (paper eq. 4-5) on the CPU, without the (C, N)
// attention matrix: V^c = softmax(Q^c K^T) V over the valid keys, for centroids Q^c that
// are already scaled by 1/sqrt(E).
//
//   centroid_attention(centroids (B,H,C,E), k (B,H,N,E), v (B,H,N,D), lengths (B,))
//       -> (values (B,H,C,D), logsumexp (B,H,C))
//   centroid_attention_backward(grad (B,H,C,D), centroids, k, v, lengths, values, logsumexp)
//       -> (grad_centroids, grad_k, grad_v)
// and for improved clustered attention (eq. 9, 17), with T_j the `topk` valid keys of
// largest A^c_j (ties: lower position; -1 past a sequence's length, as cluster_topk):
//   centroid_attention_top(centroids, k, v, lengths, topk)
//       -> (rest V^b (B,H,C,D), mass m (B,H,C), top T (B,H,C,min(topk,N)) int64, logsumexp)
//   centroid_attention_top_backward(grad_rest, grad_mass, centroids, k, v, lengths, rest, mass,
//                                   top, logsumexp, grad_k!, grad_v!) -> grad_centroids
//       adding its key and value gradients into grad_k and grad_v (B,H,N,E), (B,H,N,D): the
//       top-key part's gradients of the same keys (clustered_top_attention_backward), which would
//       otherwise cost a sum of two (B,H,N,.) tensors each and their allocations (iclustered.py).
//
// Why: materialising A^c = softmax(Q^c K^T) costs a (C, N) matrix per head and per pass
// (the scores, the weights, their gradients: four of them at 78 MB each for 6 heads at
// N = 32768), which no cache holds and which a fresh allocation pays for again in page
// faults on every call; that is what made clustered attention's time per element grow
// with N. Here the keys are taken block by block (a block's scores of all heads fit in
// the L2 caches): the forward keeps a running maximum, sum and weighted sum of values per
// centroid (the online softmax of FlashAttention), the backward recomputes each block's
// weights from the saved log-sum-exp. The products are batched matrix products over the
// (batch, head)s (BLAS, called outside any parallel region); the exponentials and the
// softmax bookkeeping are one parallel pass per block.
//
// Keys at positions >= a sequence's length get weight 0 (a sequence of length 0 keeps
// key 0, as the unfused path does; it has no queries, so nothing reads its rows), and
// their key and value gradients are 0. The results do not depend on the thread count.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "../common/checks.h"
#include "../common/top_k_floor.h"
#include "../common/vector_exp.h"

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <type_traits>
#include <vector>

namespace {

using attention_ext_checks::check_lengths;
using attention_ext_checks::check_rows;

using vector_exp::exp_vectorisable;

// Keys per block: a block's (C, block) scores of one head take about 256 KiB.
template <typename scalar_t>
int64_t key_block(int64_t clusters) {
  const int64_t fit = (int64_t{256} << 10) / (std::max<int64_t>(clusters, 1) * static_cast<int64_t>(sizeof(scalar_t)));
  return std::clamp<int64_t>(fit / 64 * 64, 64, 2048);
}

// Valid keys of each batch row: its length clipped to [1, N] (a length of 0 keeps key 0).
std::vector<int64_t> valid_keys(const at::Tensor& lengths, int64_t length) {
  const at::Tensor lengths_c = lengths.contiguous();
  const int64_t* len = lengths_c.data_ptr<int64_t>();
  std::vector<int64_t> valid(lengths.size(0));
  for (int64_t b = 0; b < lengths.size(0); ++b) valid[b] = std::clamp<int64_t>(len[b], 1, std::max<int64_t>(length, 1));
  return valid;
}

// One block of keys [start, start + width) of every (batch, head): the parallel pass over the
// rows of the block's scores (groups * clusters rows of `width`), with row `index` in
// scores[index * width ...] and batch row index / rows_per_batch. `row` gets the row, its
// valid width (>= 0) and the index.
template <typename scalar_t, typename Row>
void for_each_score_row(scalar_t* scores, int64_t rows, int64_t rows_per_batch, int64_t width, int64_t start,
                        const std::vector<int64_t>& valid, const Row& row) {
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t index = begin; index < end; ++index) {
      const int64_t valid_width = std::clamp<int64_t>(valid[index / rows_per_batch] - start, 0, width);
      row(scores + index * width, valid_width, index);
    }
  });
}

// A key and its score: a candidate for a row's top-k.
template <typename scalar_t>
struct Candidate {
  scalar_t score;
  int64_t position;
};

// "a before b" in the top-k order: larger score first, then lower position. The scores of
// a row and its weights A^c = exp(score - logsumexp) are in the same order, so these are
// the top-k keys of A^c with cluster_topk's tie rule.
// (A function object rather than a function, so that the sorts inline it.)
struct Before {
  template <typename scalar_t>
  bool operator()(const Candidate<scalar_t>& a, const Candidate<scalar_t>& b) const {
    return a.score > b.score || (a.score == b.score && a.position < b.position);
  }
};

// Keys are compared with a row's floor kChunk at a time; a pool always has room for a chunk.
constexpr int64_t kChunk = 16;

// Adds the keys of one block's row of scores (key positions first, first + 1, ...) that reach
// the row's floor to its pool of top-k candidates (`count` of `capacity` used), cutting the
// pool back to the best `slots` whenever a chunk might not fit; the floor is then the
// slots-th best kept. The first block of a row starts the floor from its strided class
// maxima (top_k_floor.h).
template <typename scalar_t>
void collect_candidates(const scalar_t* row, int64_t width, int64_t first, int64_t slots, int64_t capacity,
                        Candidate<scalar_t>* candidates, int64_t& pooled, scalar_t& floor) {
  // Locals, not the references: stores into the pool would otherwise reload them every key.
  int64_t count = pooled;
  scalar_t bar = floor;
  if (count == 0 && width > 2 * slots) {
    std::vector<scalar_t> class_max;   // once per row: scratch is allowed here
    bar = strided_class_floor(row, width, slots, class_max);
  }
  // Before a chunk that reaches the floor: if the chunk might not fit, cuts the pool back to
  // its best `slots` and raises the floor to the last of them (true when it did).
  auto make_room = [&] {
    if (count + kChunk <= capacity) return false;
    std::nth_element(candidates, candidates + (slots - 1), candidates + count, Before());
    count = slots;
    bar = candidates[slots - 1].score;
    return true;
  };
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<scalar_t, float>) {
    // One compare per chunk of 16 keys; the keys that reach the floor (about 2 per chunk
    // that has any) are packed to the front of a 16-lane buffer, and only those are written.
    static_assert(kChunk == 16, "a chunk is one 512-bit vector of floats");
    const __m512i lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    alignas(64) float scores[16];
    alignas(64) int32_t offsets[16];
    for (int64_t chunk = 0; chunk < width; chunk += kChunk) {
      const int64_t keys = std::min(width - chunk, kChunk);
      const __mmask16 present = keys == kChunk ? __mmask16(0xFFFF) : __mmask16((1u << keys) - 1);
      const __m512 x = _mm512_maskz_loadu_ps(present, row + chunk);
      __mmask16 reach = _mm512_mask_cmp_ps_mask(present, x, _mm512_set1_ps(bar), _CMP_GE_OQ);
      if (!reach) continue;
      if (make_room()) reach = _mm512_mask_cmp_ps_mask(present, x, _mm512_set1_ps(bar), _CMP_GE_OQ);
      // Compressed in registers, then stored whole: a compressing store to memory is
      // microcoded on AMD Zen 4 and measured slower than the scalar loop.
      _mm512_store_ps(scores, _mm512_maskz_compress_ps(reach, x));
      _mm512_store_si512(offsets, _mm512_maskz_compress_epi32(reach, lanes));
      const int reached = __builtin_popcount(reach);
      for (int r = 0; r < reached; ++r) candidates[count + r] = Candidate<scalar_t>{scores[r], first + chunk + offsets[r]};
      count += reached;
    }
    pooled = count;
    floor = bar;
    return;
  }
#elif defined(__AVX2__)
  if constexpr (std::is_same_v<scalar_t, float>) {
    // The same with two 8-lane compares per chunk (AVX2 has no compress): the mask of the keys
    // that reach the floor, and only those written, one per set bit. The loop below instead
    // writes all 16 keys of a chunk that has any, which made the forward's top-k bookkeeping
    // cost 2.5 ms more than on AVX-512 at N=4096 (clustered_profile).
    static_assert(kChunk == 16, "a chunk is two 256-bit vectors of floats");
    const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    auto reaching = [&](const __m256 x, const __m256i present) {
      const __m256 reach = _mm256_and_ps(_mm256_cmp_ps(x, _mm256_set1_ps(bar), _CMP_GE_OQ), _mm256_castsi256_ps(present));
      return static_cast<unsigned>(_mm256_movemask_ps(reach));
    };
    for (int64_t chunk = 0; chunk < width; chunk += kChunk) {
      const int64_t keys = std::min(width - chunk, kChunk);
      // lanes past the row's end are neither loaded nor compared (maskload reads nothing there)
      const __m256i present_low = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(std::min<int64_t>(keys, 8))), lanes);
      const __m256i present_high = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(std::max<int64_t>(keys - 8, 0))), lanes);
      const __m256 low = _mm256_maskload_ps(row + chunk, present_low);
      const __m256 high = _mm256_maskload_ps(row + chunk + 8, present_high);
      unsigned reach = reaching(low, present_low) | (reaching(high, present_high) << 8);
      if (!reach) continue;
      if (make_room()) reach = reaching(low, present_low) | (reaching(high, present_high) << 8);
      for (; reach; reach &= reach - 1) {
        const int64_t offset = __builtin_ctz(reach);
        candidates[count++] = Candidate<scalar_t>{row[chunk + offset], first + chunk + offset};
      }
    }
    pooled = count;
    floor = bar;
    return;
  }
#endif
  for (int64_t chunk = 0; chunk < width; chunk += kChunk) {
    const int64_t stop = std::min(width, chunk + kChunk);
    const scalar_t current = bar;
    int reaches = 0;
#pragma omp simd reduction(| : reaches)
    for (int64_t j = chunk; j < stop; ++j) reaches |= row[j] >= current;
    if (!reaches) continue;
    make_room();
    // Without a branch per key: every key is written, and the count only moves past those
    // at or above the floor (a branch here was mispredicted so often that the top-k
    // bookkeeping cost as much as the products).
    for (int64_t j = chunk; j < stop; ++j) {
      candidates[count] = Candidate<scalar_t>{row[j], first + j};
      count += row[j] >= bar;
    }
  }
  pooled = count;
  floor = bar;
}

// The forward of both operators. With slots > 0 it also keeps, per row, the candidates for
// its `slots` largest scores (a pool that is cut back to the best `slots` whenever it is
// full; a key enters only when its score reaches the pool's floor, the slots-th best kept),
// and at the end turns `out` into V^b = V^c - sum_{l in T} A^c_l v_l, writing T, and the mass
// m = sum_{l in T} A^c_l.
template <typename scalar_t>
void centroid_attention_kernel(const at::Tensor& queries, const at::Tensor& keys, const at::Tensor& vals,
                               const std::vector<int64_t>& valid, const std::vector<int64_t>& lengths, int64_t heads,
                               int64_t slots, at::Tensor& out, at::Tensor& logsumexp, at::Tensor& top,
                               at::Tensor& mass) {
  const int64_t groups = queries.size(0), clusters = queries.size(1), value_dim = vals.size(2);
  const int64_t length = keys.size(1), rows = groups * clusters;
  const int64_t longest = *std::max_element(valid.begin(), valid.end());
  const at::TensorOptions options = vals.options();
  const int64_t block = key_block<scalar_t>(clusters);
  // Running maximum and sum of exp(score - maximum) of each row, and (in `out`) the
  // running sum of exp(score - maximum) v.
  std::vector<scalar_t> maximum(rows, -std::numeric_limits<scalar_t>::infinity()), total(rows, 0);
  const int64_t capacity = slots > 0 ? std::max<int64_t>(4 * slots, 4 * kChunk) : 0;
  // Not value-initialised (a zero-filled vector would write every slot once more): only
  // the first pooled[row] slots of a row are ever read.
  std::unique_ptr<Candidate<scalar_t>[]> pool(new Candidate<scalar_t>[slots > 0 ? rows * capacity : 0]);
  std::vector<int64_t> pooled(slots > 0 ? rows : 0, 0);
  std::vector<scalar_t> floor(slots > 0 ? rows : 0, -std::numeric_limits<scalar_t>::infinity());
  at::Tensor scores = at::empty({groups, clusters, std::min(block, longest)}, options);
  scalar_t* out_rows = out.data_ptr<scalar_t>();
  for (int64_t start = 0; start < longest; start += block) {
    const int64_t width = std::min(block, longest - start);
    at::Tensor block_scores = scores.narrow(2, 0, width);
    if (width != scores.size(2)) block_scores = at::empty({groups, clusters, width}, options);
    at::bmm_out(block_scores, queries, keys.narrow(1, start, width).transpose(1, 2));
    for_each_score_row(block_scores.data_ptr<scalar_t>(), rows, heads * clusters, width, start, valid,
                       [&](scalar_t* row, int64_t valid_width, int64_t index) {
      if (valid_width == 0) {  // the whole block is padding for this sequence
        std::fill(row, row + width, scalar_t(0));
        return;
      }
      if (slots > 0)
        collect_candidates(row, valid_width, start, slots, capacity, pool.get() + index * capacity, pooled[index],
                           floor[index]);
      scalar_t block_max = -std::numeric_limits<scalar_t>::infinity();
#pragma omp simd reduction(max : block_max)
      for (int64_t j = 0; j < valid_width; ++j) block_max = row[j] > block_max ? row[j] : block_max;
      const scalar_t fresh = std::max(maximum[index], block_max);
      // Rescale what earlier blocks summed to the new maximum.
      const scalar_t rescale = maximum[index] == fresh ? scalar_t(1) : exp_vectorisable(maximum[index] - fresh);
      scalar_t sum = 0;
#pragma omp simd reduction(+ : sum)
      for (int64_t j = 0; j < valid_width; ++j) {
        row[j] = exp_vectorisable(row[j] - fresh);
        sum += row[j];
      }
      std::fill(row + valid_width, row + width, scalar_t(0));
      maximum[index] = fresh;
      total[index] = total[index] * rescale + sum;
      if (rescale != scalar_t(1)) {
        scalar_t* acc = out_rows + index * value_dim;
#pragma omp simd
        for (int64_t d = 0; d < value_dim; ++d) acc[d] *= rescale;
      }
    });
    out.baddbmm_(block_scores, vals.narrow(1, start, width));
  }
  scalar_t* lse = logsumexp.data_ptr<scalar_t>();
  int64_t* top_rows = slots > 0 ? top.data_ptr<int64_t>() : nullptr;
  scalar_t* mass_rows = slots > 0 ? mass.data_ptr<scalar_t>() : nullptr;
  const scalar_t* value_rows = vals.data_ptr<scalar_t>();
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t index = begin; index < end; ++index) {
      const scalar_t inverse = scalar_t(1) / total[index];
      scalar_t* acc = out_rows + index * value_dim;
#pragma omp simd
      for (int64_t d = 0; d < value_dim; ++d) acc[d] *= inverse;
      lse[index] = maximum[index] + std::log(total[index]);
      if (slots == 0) continue;
      Candidate<scalar_t>* candidates = pool.get() + index * capacity;
      const int64_t g = index / clusters;
      const int64_t kept = std::min(slots, lengths[g / heads]);   // 0 for a sequence of length 0
      const int64_t found = std::min(kept, pooled[index]);
      // The best `found` first (linear), then only those sorted.
      if (found < pooled[index])
        std::nth_element(candidates, candidates + found, candidates + pooled[index], Before());
      std::sort(candidates, candidates + found, Before());
      scalar_t top_mass = 0;
      const scalar_t* group_values = value_rows + g * length * value_dim;
      for (int64_t s = 0; s < std::min<int64_t>(found, 4); ++s)   // scattered rows: ask early
        __builtin_prefetch(group_values + candidates[s].position * value_dim);
      for (int64_t s = 0; s < found; ++s) {
        if (s + 4 < found) __builtin_prefetch(group_values + candidates[s + 4].position * value_dim);
        const scalar_t weight = std::exp(candidates[s].score - lse[index]);
        top_mass += weight;
        const scalar_t* value = value_rows + (g * length + candidates[s].position) * value_dim;
        for (int64_t d = 0; d < value_dim; ++d) acc[d] -= weight * value[d];
        top_rows[index * slots + s] = candidates[s].position;
      }
      mass_rows[index] = top_mass;
      // T holds every valid key: V^b is exactly 0 (the subtraction would leave rounding).
      if (found > 0 && found == lengths[g / heads]) std::fill(acc, acc + value_dim, scalar_t(0));
    }
  });
}

// The backward of both operators: with slots > 0 (top given), `grad` is the gradient of V^b
// and grad_mass that of m; d/dA^c_l is grad . v_l off T and grad_mass on T, and v_l's gradient
// only takes the weights off T.
template <typename scalar_t>
void centroid_attention_backward_kernel(const at::Tensor& queries, const at::Tensor& keys, const at::Tensor& vals,
                                        const at::Tensor& grad_values, const at::Tensor& values,
                                        const at::Tensor& logsumexp, const std::vector<int64_t>& valid, int64_t heads,
                                        const at::Tensor& top, const at::Tensor& grad_mass, const at::Tensor& mass,
                                        at::Tensor& grad_queries, at::Tensor& grad_keys, at::Tensor& grad_vals,
                                        bool accumulate) {
  const int64_t groups = queries.size(0), clusters = queries.size(1);
  const int64_t value_dim = vals.size(2), rows = groups * clusters;
  const int64_t longest = *std::max_element(valid.begin(), valid.end());
  const int64_t slots = top.defined() ? top.size(3) : 0;
  const at::TensorOptions options = vals.options();
  const int64_t block = key_block<scalar_t>(clusters);
  const scalar_t* value_rows = values.data_ptr<scalar_t>();
  const scalar_t* grad_rows = grad_values.data_ptr<scalar_t>();
  const scalar_t* lse = logsumexp.data_ptr<scalar_t>();
  const int64_t* top_rows = slots > 0 ? top.data_ptr<int64_t>() : nullptr;
  const scalar_t* grad_mass_rows = slots > 0 ? grad_mass.data_ptr<scalar_t>() : nullptr;
  const scalar_t* mass_rows = slots > 0 ? mass.data_ptr<scalar_t>() : nullptr;
  // delta = sum_l A_l dL/dA_l, the softmax backward's row term: grad . values (+ grad_mass * m).
  std::vector<scalar_t> delta(rows);
  at::parallel_for(0, rows, 64, [&](int64_t begin, int64_t end) {
    for (int64_t index = begin; index < end; ++index) {
      scalar_t sum = slots > 0 ? grad_mass_rows[index] * mass_rows[index] : scalar_t(0);
      for (int64_t d = 0; d < value_dim; ++d) sum += grad_rows[index * value_dim + d] * value_rows[index * value_dim + d];
      delta[index] = sum;
    }
  });
  const int64_t first_width = std::min(block, longest);
  at::Tensor weights = at::empty({groups, clusters, first_width}, options);
  at::Tensor grad_scores = at::empty({groups, clusters, first_width}, options);
  for (int64_t start = 0; start < longest; start += block) {
    const int64_t width = std::min(block, longest - start);
    if (width != weights.size(2)) {
      weights = at::empty({groups, clusters, width}, options);
      grad_scores = at::empty({groups, clusters, width}, options);
    }
    const at::Tensor block_keys = keys.narrow(1, start, width);
    at::bmm_out(weights, queries, block_keys.transpose(1, 2));
    at::bmm_out(grad_scores, grad_values, vals.narrow(1, start, width).transpose(1, 2));  // dA = grad V^T
    // A = exp(score - logsumexp) (0 on padded keys), dS = A * (dA - delta); then A loses its
    // top keys (their values' gradient does not come from V^b).
    scalar_t* weight_rows = weights.data_ptr<scalar_t>();
    for_each_score_row(grad_scores.data_ptr<scalar_t>(), rows, heads * clusters, width, start, valid,
                       [&](scalar_t* row, int64_t valid_width, int64_t index) {
      scalar_t* a = weight_rows + index * width;
      const scalar_t offset = lse[index], term = delta[index];
#pragma omp simd
      for (int64_t j = 0; j < valid_width; ++j) {
        a[j] = exp_vectorisable(a[j] - offset);
        row[j] = a[j] * (row[j] - term);
      }
      std::fill(a + valid_width, a + width, scalar_t(0));
      std::fill(row + valid_width, row + width, scalar_t(0));
      for (int64_t s = 0; s < slots; ++s) {
        const int64_t j = top_rows[index * slots + s] - start;
        if (j < 0 || j >= valid_width) continue;  // elsewhere, or -1
        row[j] = a[j] * (grad_mass_rows[index] - term);
        a[j] = 0;
      }
    });
    // The block's key and value gradients go straight into place (or are added there).
    at::Tensor value_block = grad_vals.narrow(1, start, width), key_block_grad = grad_keys.narrow(1, start, width);
    if (accumulate) {
      value_block.baddbmm_(weights.transpose(1, 2), grad_values);           // dV += A^T grad
      key_block_grad.baddbmm_(grad_scores.transpose(1, 2), queries);        // dK += dS^T Q^c
    } else {
      at::bmm_out(value_block, weights.transpose(1, 2), grad_values);       // dV = A^T grad
      at::bmm_out(key_block_grad, grad_scores.transpose(1, 2), queries);    // dK = dS^T Q^c
    }
    grad_queries.baddbmm_(grad_scores, block_keys);                                      // dQ^c += dS K
    // Their rows past a sequence's length are 0 (their weights are 0, but 0 * inf is not; what was
    // added to is 0 there too, as no padded key is among the top keys).
    for (int64_t b = 0; b < static_cast<int64_t>(valid.size()); ++b) {
      const int64_t first = std::max(valid[b], start), stop = start + width;
      if (first >= stop) continue;
      grad_keys.narrow(0, b * heads, heads).narrow(1, first, stop - first).zero_();
      grad_vals.narrow(0, b * heads, heads).narrow(1, first, stop - first).zero_();
    }
  }
}

struct CentroidShape {
  int64_t batch, heads, clusters, dim, length, value_dim;
};

CentroidShape check_centroid_attention(const at::Tensor& centroids, const at::Tensor& k, const at::Tensor& v,
                                       const at::Tensor& lengths, const char* op) {
  check_rows(centroids, op);
  check_rows(k, op);
  check_rows(v, op);
  TORCH_CHECK(k.size(0) == centroids.size(0) && k.size(1) == centroids.size(1) && k.size(3) == centroids.size(3) &&
                  k.scalar_type() == centroids.scalar_type(),
              op, ": k must have shape (", centroids.size(0), ", ", centroids.size(1), ", length, ", centroids.size(3),
              ") and the centroids' dtype ", centroids.scalar_type(), ", got ", k.sizes(), " ", k.scalar_type());
  TORCH_CHECK(v.size(0) == k.size(0) && v.size(1) == k.size(1) && v.size(2) == k.size(2) &&
                  v.scalar_type() == k.scalar_type(),
              op, ": v must have shape (", k.size(0), ", ", k.size(1), ", ", k.size(2), ", dim) and k's dtype, got ",
              v.sizes(), " ", v.scalar_type());
  check_lengths(lengths, centroids.size(0));
  return {centroids.size(0), centroids.size(1), centroids.size(2), centroids.size(3), k.size(2), v.size(3)};
}

// (values or V^b, logsumexp, top, mass); top and mass only when slots > 0.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> centroid_attention_forward(
    const at::Tensor& centroids, const at::Tensor& k, const at::Tensor& v, const at::Tensor& lengths,
    int64_t slots, const char* op) {
  const CentroidShape s = check_centroid_attention(centroids, k, v, lengths, op);
  const int64_t groups = s.batch * s.heads;
  at::Tensor values = at::zeros({s.batch, s.heads, s.clusters, s.value_dim}, v.options());
  at::Tensor logsumexp = at::zeros({s.batch, s.heads, s.clusters}, v.options());
  at::Tensor top = at::full({s.batch, s.heads, s.clusters, slots}, -1, v.options().dtype(at::kLong));
  at::Tensor mass = at::zeros({s.batch, s.heads, s.clusters}, v.options());
  if (groups * s.clusters == 0 || s.length == 0) return {values, logsumexp, top, mass};
  const std::vector<int64_t> valid = valid_keys(lengths, s.length);
  std::vector<int64_t> clipped(valid.size());   // lengths in [0, N]: the keys T may take
  const at::Tensor lengths_c = lengths.contiguous();
  for (size_t b = 0; b < valid.size(); ++b)
    clipped[b] = std::clamp<int64_t>(lengths_c.data_ptr<int64_t>()[b], 0, s.length);
  const at::Tensor queries = centroids.contiguous().view({groups, s.clusters, s.dim});
  const at::Tensor keys = k.contiguous().view({groups, s.length, s.dim});
  const at::Tensor vals = v.contiguous().view({groups, s.length, s.value_dim});
  at::Tensor out = values.view({groups, s.clusters, s.value_dim});
  AT_DISPATCH_FLOATING_TYPES(v.scalar_type(), "centroid_attention", [&] {
    centroid_attention_kernel<scalar_t>(queries, keys, vals, valid, clipped, s.heads, slots, out, logsumexp, top,
                                        mass);
  });
  return {values, logsumexp, top, mass};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> centroid_attention_backward_impl(
    const at::Tensor& grad, const at::Tensor& centroids, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& lengths, const at::Tensor& values, const at::Tensor& logsumexp, const at::Tensor& top,
    const at::Tensor& grad_mass, const at::Tensor& mass, const at::Tensor& grad_k_into,
    const at::Tensor& grad_v_into, const char* op) {
  const CentroidShape s = check_centroid_attention(centroids, k, v, lengths, op);
  const int64_t groups = s.batch * s.heads;
  const std::vector<int64_t> value_shape{s.batch, s.heads, s.clusters, s.value_dim};
  const std::vector<int64_t> row_shape{s.batch, s.heads, s.clusters};
  TORCH_CHECK(grad.sizes() == value_shape && grad.scalar_type() == v.scalar_type(), op, ": grad must have shape ",
              at::IntArrayRef(value_shape), " and v's dtype, got ", grad.sizes(), " ", grad.scalar_type());
  TORCH_CHECK(values.sizes() == value_shape && values.scalar_type() == v.scalar_type(), op,
              ": values must have shape ", at::IntArrayRef(value_shape), " and v's dtype, got ", values.sizes());
  TORCH_CHECK(logsumexp.sizes() == row_shape && logsumexp.scalar_type() == v.scalar_type(), op,
              ": logsumexp must have shape ", at::IntArrayRef(row_shape), " and v's dtype, got ", logsumexp.sizes());
  if (top.defined()) {
    TORCH_CHECK(top.dim() == 4 && top.sizes().slice(0, 3) == at::IntArrayRef(row_shape) &&
                    top.scalar_type() == at::kLong,
                op, ": top must be int64 of shape (", s.batch, ", ", s.heads, ", ", s.clusters, ", slots), got ",
                top.sizes(), " ", top.scalar_type());
    TORCH_CHECK(grad_mass.sizes() == row_shape && mass.sizes() == row_shape &&
                    grad_mass.scalar_type() == v.scalar_type() && mass.scalar_type() == v.scalar_type(),
                op, ": grad_mass and mass must have shape ", at::IntArrayRef(row_shape), " and v's dtype, got ",
                grad_mass.sizes(), " and ", mass.sizes());
    // Read as key positions in the parallel pass: refuse what would index out of the block.
    TORCH_CHECK(top.numel() == 0 || (top.min().item<int64_t>() >= -1 && top.max().item<int64_t>() < s.length), op,
                ": top holds positions outside [-1, ", s.length, ")");
  }
  const bool accumulate = grad_k_into.defined();
  if (accumulate) {
    TORCH_CHECK(grad_k_into.sizes() == k.sizes() && grad_k_into.scalar_type() == k.scalar_type() &&
                    grad_k_into.is_contiguous() && grad_v_into.sizes() == v.sizes() &&
                    grad_v_into.scalar_type() == v.scalar_type() && grad_v_into.is_contiguous(),
                op, ": grad_k and grad_v must be contiguous, with k's shape ", k.sizes(), " and v's ", v.sizes(),
                " and their dtype ", k.scalar_type(), ", got ", grad_k_into.sizes(), " ", grad_k_into.scalar_type(),
                " and ", grad_v_into.sizes(), " ", grad_v_into.scalar_type());
  }
  at::Tensor grad_centroids = at::zeros({s.batch, s.heads, s.clusters, s.dim}, centroids.options());
  // Every row of these is written: the valid ones by the products, the padded ones zeroed.
  at::Tensor grad_k = accumulate ? grad_k_into : at::empty({s.batch, s.heads, s.length, s.dim}, k.options());
  at::Tensor grad_v = accumulate ? grad_v_into : at::empty({s.batch, s.heads, s.length, s.value_dim}, v.options());
  if (groups * s.clusters == 0 || s.length == 0) {   // no gradient to add
    if (!accumulate) {
      grad_k.zero_();
      grad_v.zero_();
    }
    return {grad_centroids, grad_k, grad_v};
  }
  const std::vector<int64_t> valid = valid_keys(lengths, s.length);
  const int64_t longest = *std::max_element(valid.begin(), valid.end());
  const at::Tensor queries = centroids.contiguous().view({groups, s.clusters, s.dim});
  const at::Tensor keys = k.contiguous().view({groups, s.length, s.dim});
  const at::Tensor vals = v.contiguous().view({groups, s.length, s.value_dim});
  const at::Tensor grad_values = grad.contiguous().view({groups, s.clusters, s.value_dim});
  const at::Tensor values_c = values.contiguous(), logsumexp_c = logsumexp.contiguous();
  const at::Tensor top_c = top.defined() ? top.contiguous() : top;
  const at::Tensor grad_mass_c = top.defined() ? grad_mass.contiguous() : grad_mass;
  const at::Tensor mass_c = top.defined() ? mass.contiguous() : mass;
  at::Tensor grad_queries = grad_centroids.view({groups, s.clusters, s.dim});
  at::Tensor grad_keys = grad_k.view({groups, s.length, s.dim});
  at::Tensor grad_vals = grad_v.view({groups, s.length, s.value_dim});
  AT_DISPATCH_FLOATING_TYPES(v.scalar_type(), "centroid_attention_backward", [&] {
    centroid_attention_backward_kernel<scalar_t>(queries, keys, vals, grad_values, values_c, logsumexp_c, valid,
                                                 s.heads, top_c, grad_mass_c, mass_c, grad_queries, grad_keys,
                                                 grad_vals, accumulate);
  });
  // Positions past the longest valid length (padding of every sequence).
  if (longest < s.length) {
    grad_k.narrow(2, longest, s.length - longest).zero_();
    grad_v.narrow(2, longest, s.length - longest).zero_();
  }
  return {grad_centroids, grad_k, grad_v};
}

std::tuple<at::Tensor, at::Tensor> centroid_attention(const at::Tensor& centroids, const at::Tensor& k,
                                                      const at::Tensor& v, const at::Tensor& lengths) {
  auto [values, logsumexp, top, mass] = centroid_attention_forward(centroids, k, v, lengths, 0, "centroid_attention");
  return {values, logsumexp};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> centroid_attention_backward(
    const at::Tensor& grad, const at::Tensor& centroids, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& lengths, const at::Tensor& values, const at::Tensor& logsumexp) {
  return centroid_attention_backward_impl(grad, centroids, k, v, lengths, values, logsumexp, at::Tensor(),
                                          at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(),
                                          "centroid_attention_backward");
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> centroid_attention_top(
    const at::Tensor& centroids, const at::Tensor& k, const at::Tensor& v, const at::Tensor& lengths, int64_t topk) {
  TORCH_CHECK(topk >= 1, "centroid_attention_top: topk must be >= 1, got ", topk);
  auto [rest, logsumexp, top, mass] =
      centroid_attention_forward(centroids, k, v, lengths, std::min(topk, k.dim() == 4 ? k.size(2) : topk),
                                 "centroid_attention_top");
  return {rest, mass, top, logsumexp};
}

at::Tensor centroid_attention_top_backward(const at::Tensor& grad_rest, const at::Tensor& grad_mass,
                                           const at::Tensor& centroids, const at::Tensor& k, const at::Tensor& v,
                                           const at::Tensor& lengths, const at::Tensor& rest, const at::Tensor& mass,
                                           const at::Tensor& top, const at::Tensor& logsumexp, at::Tensor& grad_k,
                                           at::Tensor& grad_v) {
  return std::get<0>(centroid_attention_backward_impl(grad_rest, centroids, k, v, lengths, rest, logsumexp, top,
                                                      grad_mass, mass, grad_k, grad_v,
                                                      "centroid_attention_top_backward"));
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(attention_ext, m) {
  m.def("centroid_attention(Tensor centroids, Tensor k, Tensor v, Tensor lengths) -> (Tensor, Tensor)");
  m.def("centroid_attention_backward(Tensor grad, Tensor centroids, Tensor k, Tensor v, Tensor lengths,"
        " Tensor values, Tensor logsumexp) -> (Tensor, Tensor, Tensor)");
  m.def("centroid_attention_top(Tensor centroids, Tensor k, Tensor v, Tensor lengths, int topk)"
        " -> (Tensor, Tensor, Tensor, Tensor)");
  m.def("centroid_attention_top_backward(Tensor grad_rest, Tensor grad_mass, Tensor centroids, Tensor k, Tensor v,"
        " Tensor lengths, Tensor rest, Tensor mass, Tensor top, Tensor logsumexp, Tensor(a!) grad_k,"
        " Tensor(b!) grad_v) -> Tensor");
}

TORCH_LIBRARY_IMPL(attention_ext, CPU, m) {
  m.impl("centroid_attention", &centroid_attention);
  m.impl("centroid_attention_backward", &centroid_attention_backward);
  m.impl("centroid_attention_top", &centroid_attention_top);
  m.impl("centroid_attention_top_backward", &centroid_attention_top_backward);
}
