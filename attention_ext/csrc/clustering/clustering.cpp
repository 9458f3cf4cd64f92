// Query clustering for clustered attention (paper sec. 3.2.2): hash every query to
// an int64 code with random hyperplanes, then K-Means in Hamming space.
// None of this is differentiable; it only decides which queries share a centroid.
//
// Operators (torch.ops.attention_ext.*):
//   hyperplane_hash(queries, planes, offsets, lengths) -> codes (B,H,N) int64
//   hamming_kmeans_init(codes, lengths, clusters, seed) -> centroids (B,H,C) int64
//   hamming_kmeans(codes, lengths, centroids, iterations, bits)
//       -> (assignment (B,H,N) int64, centroids (B,H,C) int64)
//
// Decisions where the paper is silent (tested in tests/attention_ext/test_clustered.py):
// - Hyperplanes cut through the cloud of valid queries of each (batch, head): bit b of a
//   query is  p_b > mean_b + offset_b * std_b,  p_b = <query, plane_b>, where mean_b and
//   std_b are the mean and (population) standard deviation of p_b over the valid queries
//   of that (batch, head) and offset_b ~ N(0, 1). Planes through the origin only see
//   angles (and waste bits when all queries lie on one side); planes at random positions
//   inside the cloud separate two queries with a probability that grows with their
//   Euclidean distance, which is what the bound of sec. 3.2.1 asks for. Scaling the
//   offset by std_b makes this independent of the queries' scale and mean.
// - Padded queries (position >= length) get code 0 and take no part in clustering.
// - A (batch, head) whose valid length L <= C puts every valid query in its own cluster
//   (cluster id = position): the clustered attention is then exactly full attention.
// - Initial centroids: codes of valid queries visited in a random order (a per-(batch,
//   head) stream seeded from `seed`, b and h) skipping codes already taken, so the C
//   initial centroids are distinct codes of distinct positions. If fewer than C distinct
//   codes exist, the remaining slots repeat centroid 0; ties go to the lowest cluster
//   index, so these slots start empty.
// - Assignment: nearest centroid by popcount(code ^ centroid), ties to the lowest index.
// - Update: each bit of a centroid is the majority vote of its members' bits; an exact
//   tie keeps the centroid's previous bit; a cluster without members keeps its code.
// - `iterations` Lloyd steps (assign, then update) are followed by one final
//   assignment, so the returned assignment is always nearest-centroid for the returned
//   centroids; iterations = 0 assigns to the initial centroids. A (batch, head) whose
//   centroids did not change in an update has converged and skips the remaining steps
//   (the result is the one all steps would give).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "checks.h"

#if defined(__AVX2__) && !defined(__AVX512BW__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace {

// Valid length of batch row b, clipped to [0, length].
inline int64_t valid_length(const int64_t* lengths, int64_t b, int64_t length) {
  const int64_t value = lengths[b];
  return value < 0 ? 0 : (value > length ? length : value);
}

inline uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

template <typename scalar_t>
void hyperplane_hash_kernel(const scalar_t* proj, const double* offset, const int64_t* len, int64_t* out,
                            int64_t heads, int64_t length, int64_t bits, int64_t columns,
                            int64_t groups) {
  std::vector<double> thresholds(groups * bits, 0.0);
  // Per-(batch, head) mean and std of each projection over the valid queries (two
  // passes in a fixed order, so the result does not depend on the padded length).
  auto statistics = [&](int64_t begin, int64_t end) {
    std::vector<double> mean(bits), var(bits);
    for (int64_t g = begin; g < end; ++g) {
      const int64_t valid = valid_length(len, g / heads, length);
      if (valid == 0) continue;
      const scalar_t* base = proj + g * length * columns;
      std::fill(mean.begin(), mean.end(), 0.0);
      std::fill(var.begin(), var.end(), 0.0);
      for (int64_t i = 0; i < valid; ++i) {
        const scalar_t* row = base + i * columns;
#pragma omp simd
        for (int64_t b = 0; b < bits; ++b) mean[b] += static_cast<double>(row[b]);
      }
      for (int64_t b = 0; b < bits; ++b) mean[b] /= static_cast<double>(valid);
      for (int64_t i = 0; i < valid; ++i) {
        const scalar_t* row = base + i * columns;
#pragma omp simd
        for (int64_t b = 0; b < bits; ++b) {
          const double d = static_cast<double>(row[b]) - mean[b];
          var[b] += d * d;
        }
      }
      double* threshold = thresholds.data() + g * bits;
      for (int64_t b = 0; b < bits; ++b)
        threshold[b] = mean[b] + offset[b] * std::sqrt(var[b] / static_cast<double>(valid));
    }
  };

  auto pack = [&](int64_t begin, int64_t end) {
    for (int64_t index = begin; index < end; ++index) {
      const int64_t g = index / length, i = index % length;
      if (i >= valid_length(len, g / heads, length)) continue;  // padded: code 0
      const scalar_t* row = proj + index * columns;
      const double* threshold = thresholds.data() + g * bits;
      int64_t code = 0;
#pragma omp simd reduction(| : code)
      for (int64_t b = 0; b < bits; ++b)
        code |= static_cast<int64_t>(static_cast<double>(row[b]) > threshold[b]) << b;
      out[index] = code;
    }
  };

  if (groups >= at::get_num_threads()) {  // one task per (batch, head): no barrier between passes
    at::parallel_for(0, groups, 1, [&](int64_t begin, int64_t end) {
      for (int64_t g = begin; g < end; ++g) {
        statistics(g, g + 1);
        pack(g * length, (g + 1) * length);
      }
    });
  } else {
    at::parallel_for(0, groups, 1, statistics);
    at::parallel_for(0, groups * length, 256, pack);
  }
}

at::Tensor hyperplane_hash(const at::Tensor& queries, const at::Tensor& planes,
                           const at::Tensor& offsets, const at::Tensor& lengths) {
  const int64_t bits = attention_ext_checks::check_hyperplane_hash(queries, planes, offsets, lengths);
  const int64_t batch = queries.size(0), heads = queries.size(1), length = queries.size(2);
  const int64_t groups = batch * heads;

  // The projection is one dense product: BLAS does it far faster than a hand loop. The
  // planes are padded with zero planes to a multiple of 16 columns, a shape the GEMM
  // handles markedly faster (63 -> 64 columns: ~1.5x); the padding columns are not read.
  const int64_t columns = (bits + 15) / 16 * 16;
  const at::Tensor padded_planes =
      at::constant_pad_nd(planes.to(queries.scalar_type()), {0, 0, 0, columns - bits});
  const at::Tensor projections = at::matmul(queries, padded_planes.t()).contiguous();  // (B,H,N,columns)
  const at::Tensor offsets64 = offsets.to(at::kDouble).contiguous();
  const at::Tensor lengths_c = lengths.contiguous();
  at::Tensor codes = at::zeros({batch, heads, length}, queries.options().dtype(at::kLong));
  if (codes.numel() == 0) return codes;
  AT_DISPATCH_FLOATING_TYPES(projections.scalar_type(), "hyperplane_hash", [&] {
    hyperplane_hash_kernel<scalar_t>(projections.data_ptr<scalar_t>(), offsets64.data_ptr<double>(),
                                     lengths_c.data_ptr<int64_t>(), codes.data_ptr<int64_t>(), heads,
                                     length, bits, columns, groups);
  });
  return codes;
}

at::Tensor hamming_kmeans_init(const at::Tensor& codes, const at::Tensor& lengths,
                               int64_t clusters, int64_t seed) {
  attention_ext_checks::check_hamming_kmeans_init(codes, lengths, clusters);
  const int64_t heads = codes.size(1), length = codes.size(2);
  const int64_t groups = codes.size(0) * heads;
  const at::Tensor codes_c = codes.contiguous(), lengths_c = lengths.contiguous();
  at::Tensor centroids = at::zeros({codes.size(0), heads, clusters}, codes.options());
  const int64_t* code = codes_c.data_ptr<int64_t>();
  const int64_t* len = lengths_c.data_ptr<int64_t>();
  int64_t* centroid_out = centroids.data_ptr<int64_t>();

  at::parallel_for(0, groups, 1, [&](int64_t begin, int64_t end) {
    std::vector<int64_t> order;
    for (int64_t g = begin; g < end; ++g) {
      const int64_t b = g / heads, h = g % heads;
      const int64_t valid = valid_length(len, b, length);
      const int64_t* head_codes = code + g * length;
      int64_t* cent = centroid_out + g * clusters;
      if (valid <= clusters) {  // one cluster per query; centroids are the codes themselves
        for (int64_t i = 0; i < valid; ++i) cent[i] = head_codes[i];
        continue;
      }
      // The stream depends on (seed, b, h) only, not on the batch size or padded length.
      uint64_t state = static_cast<uint64_t>(seed);
      state = splitmix64(state) ^ static_cast<uint64_t>(b);
      state = splitmix64(state) ^ static_cast<uint64_t>(h);
      order.resize(valid);
      for (int64_t i = 0; i < valid; ++i) order[i] = i;
      int64_t filled = 0;
      for (int64_t i = 0; i < valid && filled < clusters; ++i) {
        // Fisher-Yates step: a uniform pick among the positions not visited yet.
        const int64_t pick = i + static_cast<int64_t>(splitmix64(state) % static_cast<uint64_t>(valid - i));
        std::swap(order[i], order[pick]);
        const int64_t candidate = head_codes[order[i]];
        bool taken = false;
        for (int64_t c = 0; c < filled && !taken; ++c) taken = cent[c] == candidate;
        if (!taken) cent[filled++] = candidate;
      }
      for (int64_t c = filled; c < clusters; ++c) cent[c] = cent[0];
    }
  });
  return centroids;
}

// The centroid nearest to code x in Hamming distance, the lowest index among equally near
// ones: distance and index packed in one key, whose minimum is that centroid.
inline int64_t nearest_centroid(int64_t x, const int64_t* cent, int64_t clusters) {
  int64_t best = std::numeric_limits<int64_t>::max();
#pragma omp simd reduction(min : best)
  for (int64_t c = 0; c < clusters; ++c) {
    const int64_t key = (static_cast<int64_t>(__builtin_popcountll(static_cast<uint64_t>(x ^ cent[c]))) << 32) | c;
    best = key < best ? key : best;
  }
  return best & 0xFFFFFFFFLL;
}

// nearest_centroid of kCodesAtOnce consecutive codes: each centroid meets all of them in one
// vector step, which needs no minimum across the lanes per code (the costly part of the
// one-code loop); 16 codes are two independent 8-lane chains. A strictly closer centroid
// replaces the best, so ties keep the lowest index.
constexpr int kCodesAtOnce = 16;

#if defined(__AVX2__) && !defined(__AVX512BW__)
// AVX2 (the x86-64-v3 build of the Docker image): GCC vectorises the loop below with AVX-512BW
// (a byte-table popcount) but not with AVX2, where it ran scalar popcnt lane by lane and K-Means
// took 9.5 ms instead of 1.4 at N=4096 (clustered_profile, 2 threads). Here the same byte-table
// popcount is written out: each nibble's bit count looked up with pshufb, the bytes of each 64-bit
// lane summed with psadbw (Mula, Kurz and Lemire, "Faster population counts using AVX2").
inline __m256i popcount_lanes(__m256i v) {
  const __m256i table = _mm256_setr_epi8(0, 1, 1, 2, 1, 2, 2, 3, 1, 2, 2, 3, 2, 3, 3, 4,
                                         0, 1, 1, 2, 1, 2, 2, 3, 1, 2, 2, 3, 2, 3, 3, 4);
  const __m256i nibble = _mm256_set1_epi8(0x0f);
  const __m256i low = _mm256_shuffle_epi8(table, _mm256_and_si256(v, nibble));
  const __m256i high = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(v, 4), nibble));
  return _mm256_sad_epu8(_mm256_add_epi8(low, high), _mm256_setzero_si256());
}

// Distance and centroid index packed in one 32-bit key, (distance << 24) | index, so one unsigned
// minimum keeps the nearest centroid and, among equally near ones, the lowest index (the one-code
// loop's rule) - one instruction where a compare and two blends were (blends are 2 uops on most
// AVX2 CPUs), and no separate register of indexes. Up to 2^24 centroids; more take the one-code loop.
constexpr int64_t kPackedIndexLimit = int64_t{1} << 24;

inline void nearest_centroids(const int64_t* x, const int64_t* cent, int64_t clusters, int64_t* out) {
  if (clusters >= kPackedIndexLimit) {
    for (int lane = 0; lane < kCodesAtOnce; ++lane) out[lane] = nearest_centroid(x[lane], cent, clusters);
    return;
  }
  constexpr int kVectors = kCodesAtOnce / 4;   // four 64-bit codes per register
  __m256i codes[kVectors], best[kVectors];
  for (int v = 0; v < kVectors; ++v) {
    codes[v] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 4 * v));
    best[v] = _mm256_set1_epi64x(0x7FFFFFFF);   // above every key; the upper 32 bits of each lane stay 0
  }
  for (int64_t c = 0; c < clusters; ++c) {
    const __m256i centroid = _mm256_set1_epi64x(cent[c]), index = _mm256_set1_epi64x(c);
    for (int v = 0; v < kVectors; ++v) {
      const __m256i distance = popcount_lanes(_mm256_xor_si256(codes[v], centroid));   // < 2^7, low 32 bits
      const __m256i key = _mm256_or_si256(_mm256_slli_epi32(distance, 24), index);
      best[v] = _mm256_min_epu32(best[v], key);
    }
  }
  const __m256i index_bits = _mm256_set1_epi64x(kPackedIndexLimit - 1);
  for (int v = 0; v < kVectors; ++v)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 4 * v), _mm256_and_si256(best[v], index_bits));
}
#else
inline void nearest_centroids(const int64_t* x, const int64_t* cent, int64_t clusters, int64_t* out) {
  int64_t best[kCodesAtOnce], nearest[kCodesAtOnce];
  for (int lane = 0; lane < kCodesAtOnce; ++lane) {
    best[lane] = 65;   // more than any distance between 64-bit codes
    nearest[lane] = 0;
  }
  for (int64_t c = 0; c < clusters; ++c) {
    const uint64_t centroid = static_cast<uint64_t>(cent[c]);
#pragma omp simd
    for (int lane = 0; lane < kCodesAtOnce; ++lane) {
      const int64_t distance = __builtin_popcountll(static_cast<uint64_t>(x[lane]) ^ centroid);
      const bool closer = distance < best[lane];
      best[lane] = closer ? distance : best[lane];
      nearest[lane] = closer ? c : nearest[lane];
    }
  }
  for (int lane = 0; lane < kCodesAtOnce; ++lane) out[lane] = nearest[lane];
}
#endif

// Hamming K-Means over every (batch, head): the codes and lengths it reads, the centroids and
// the assignment it writes. A (batch, head) is settled once an update leaves all its centroids
// unchanged: its assignment is then already the nearest-centroid one and no later step changes
// it, so it is skipped (the result is the same as running all iterations).
struct KMeansRun {
  const int64_t* code;   // (B, H, N)
  const int64_t* len;    // (B,)
  int64_t* cent_all;     // (B, H, C)
  int64_t* assign_all;   // (B, H, N)
  int64_t heads, length, clusters, bits;
  std::vector<uint8_t> settled;   // per (batch, head)

  // Assigns flat positions begin..end-1 of (batch, head, position) to their nearest centroids
  // (-1 for padded ones; its own cluster for each query of a head with at most C of them).
  void assign(int64_t begin, int64_t end) {
    for (int64_t index = begin; index < end; ++index) {
      const int64_t g = index / length, i = index % length;
      if (settled[g]) continue;
      const int64_t valid = valid_length(len, g / heads, length);
      if (i >= valid) {
        assign_all[index] = -1;
      } else if (valid <= clusters) {
        assign_all[index] = i;
      } else {
        // The run of valid queries of this (batch, head) from here, kCodesAtOnce at a time.
        const int64_t* cent = cent_all + g * clusters;
        const int64_t run_end = std::min(end, g * length + valid);
        for (; index + kCodesAtOnce <= run_end; index += kCodesAtOnce)
          nearest_centroids(code + index, cent, clusters, assign_all + index);
        for (; index < run_end; ++index) assign_all[index] = nearest_centroid(code[index], cent, clusters);
        --index;  // the loop's ++index comes next
      }
    }
  }

  // Moves every centroid of (batch, head)s begin..end-1 to the majority vote of its members'
  // bits (an exact tie keeps the bit, a cluster without members its code), and marks a head
  // whose centroids did not change as settled.
  void update(int64_t begin, int64_t end) {
    std::vector<int64_t> ones(clusters * 64), members(clusters);
    for (int64_t g = begin; g < end; ++g) {
      const int64_t valid = valid_length(len, g / heads, length);
      if (settled[g]) continue;
      if (valid <= clusters) {  // one query per cluster, assigned by the assign before
        settled[g] = 1;
        continue;
      }
      std::fill(ones.begin(), ones.end(), 0);
      std::fill(members.begin(), members.end(), 0);
      const int64_t* head_codes = code + g * length;
      const int64_t* head_assign = assign_all + g * length;
      for (int64_t i = 0; i < valid; ++i) {
        const int64_t a = head_assign[i];
        const uint64_t x = static_cast<uint64_t>(head_codes[i]);
        int64_t* count = ones.data() + a * 64;
        members[a] += 1;
#pragma omp simd
        for (int64_t b = 0; b < 64; ++b) count[b] += static_cast<int64_t>((x >> b) & 1ULL);
      }
      int64_t* cent = cent_all + g * clusters;
      bool changed = false;
      for (int64_t c = 0; c < clusters; ++c) {
        if (members[c] == 0) continue;  // empty: keep the code
        const int64_t* count = ones.data() + c * 64;
        const int64_t old = cent[c];
        int64_t fresh = 0;
        for (int64_t b = 0; b < bits; ++b) {
          const int64_t twice = 2 * count[b];
          const int64_t bit = twice > members[c] ? 1 : (twice < members[c] ? 0 : (old >> b) & 1);
          fresh |= bit << b;
        }
        changed = changed || fresh != old;
        cent[c] = fresh;
      }
      settled[g] = !changed;
    }
  }
};

std::tuple<at::Tensor, at::Tensor> hamming_kmeans(const at::Tensor& codes, const at::Tensor& lengths,
                                                  const at::Tensor& initial_centroids,
                                                  int64_t iterations, int64_t bits) {
  const int64_t clusters =
      attention_ext_checks::check_hamming_kmeans(codes, lengths, initial_centroids, iterations, bits);
  const int64_t heads = codes.size(1), length = codes.size(2);
  const int64_t groups = codes.size(0) * heads;
  const at::Tensor codes_c = codes.contiguous(), lengths_c = lengths.contiguous();
  at::Tensor centroids = initial_centroids.contiguous().clone();
  at::Tensor assignment = at::empty({codes.size(0), heads, length}, codes.options());
  KMeansRun run{codes_c.data_ptr<int64_t>(), lengths_c.data_ptr<int64_t>(), centroids.data_ptr<int64_t>(),
                assignment.data_ptr<int64_t>(), heads, length, clusters, bits, std::vector<uint8_t>(groups, 0)};

  if (groups >= at::get_num_threads()) {
    // Enough (batch, head)s to share out: each thread runs whole K-Means on its own,
    // with no barrier per step and the head's codes kept in cache.
    at::parallel_for(0, groups, 1, [&](int64_t begin, int64_t end) {
      for (int64_t g = begin; g < end; ++g) {
        for (int64_t it = 0; it < iterations && !run.settled[g]; ++it) {
          run.assign(g * length, (g + 1) * length);
          run.update(g, g + 1);
        }
        run.assign(g * length, (g + 1) * length);
      }
    });
    return {assignment, centroids};
  }
  // Few (batch, head)s (batch 1, one head): every step is shared out over the positions.
  bool any_kmeans = false;  // some (batch, head) has more valid queries than clusters
  for (int64_t b = 0; b < codes.size(0); ++b)
    any_kmeans = any_kmeans || valid_length(run.len, b, length) > clusters;
  const auto assign = [&](int64_t begin, int64_t end) { run.assign(begin, end); };
  if (any_kmeans) {
    for (int64_t it = 0; it < iterations; ++it) {
      at::parallel_for(0, groups * length, 256, assign);
      at::parallel_for(0, groups, 1, [&](int64_t begin, int64_t end) { run.update(begin, end); });
      if (std::all_of(run.settled.begin(), run.settled.end(), [](uint8_t s) { return s != 0; })) break;
    }
  }
  at::parallel_for(0, groups * length, 256, assign);
  return {assignment, centroids};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(attention_ext, m) {
  m.def("hyperplane_hash(Tensor queries, Tensor planes, Tensor offsets, Tensor lengths) -> Tensor");
  m.def("hamming_kmeans_init(Tensor codes, Tensor lengths, int clusters, int seed) -> Tensor");
  m.def("hamming_kmeans(Tensor codes, Tensor lengths, Tensor centroids, int iterations, int bits)"
        " -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(attention_ext, CPU, m) {
  m.impl("hyperplane_hash", &hyperplane_hash);
  m.impl("hamming_kmeans_init", &hamming_kmeans_init);
  m.impl("hamming_kmeans", &hamming_kmeans);
}
