// The argument checks of the clustering operators (clustering.cpp), written once and called by
// the CPU and the CUDA entry of each before any parallel work; the CUDA entries then add that the
// lengths are on the GPU (clustering_cuda.cu).
#pragma once

#include "../common/checks.h"

#include <cstdint>

namespace attention_ext_checks {

inline void check_codes(const at::Tensor& codes) {
  TORCH_CHECK(codes.dim() == 3 && codes.scalar_type() == at::kLong,
              "codes must be an int64 tensor of shape (batch, heads, length), got ", codes.sizes(),
              " ", codes.scalar_type());
}

// hyperplane_hash(queries, planes, offsets, lengths); returns the number of bits, one per plane.
inline int64_t check_hyperplane_hash(const at::Tensor& queries, const at::Tensor& planes,
                                     const at::Tensor& offsets, const at::Tensor& lengths) {
  TORCH_CHECK(queries.dim() == 4, "queries must have shape (batch, heads, length, dim), got ",
              queries.sizes());
  TORCH_CHECK(planes.dim() == 2 && planes.size(1) == queries.size(3),
              "planes must have shape (bits, ", queries.size(3), "), got ", planes.sizes());
  const int64_t bits = planes.size(0);
  TORCH_CHECK(bits >= 1 && bits <= 63, "hyperplane_hash: bits must lie in 1..63, got ", bits);
  TORCH_CHECK(offsets.dim() == 1 && offsets.size(0) == bits, "offsets must have shape (", bits,
              "), got ", offsets.sizes());
  check_lengths(lengths, queries.size(0));
  return bits;
}

// hamming_kmeans_init(codes, lengths, clusters, seed).
inline void check_hamming_kmeans_init(const at::Tensor& codes, const at::Tensor& lengths, int64_t clusters) {
  check_codes(codes);
  check_lengths(lengths, codes.size(0));
  TORCH_CHECK(clusters >= 1, "hamming_kmeans_init: clusters must be >= 1, got ", clusters);
}

// hamming_kmeans(codes, lengths, initial_centroids, iterations, bits); returns the number of clusters.
inline int64_t check_hamming_kmeans(const at::Tensor& codes, const at::Tensor& lengths,
                                    const at::Tensor& initial_centroids, int64_t iterations, int64_t bits) {
  check_codes(codes);
  check_lengths(lengths, codes.size(0));
  TORCH_CHECK(initial_centroids.dim() == 3 && initial_centroids.scalar_type() == at::kLong &&
                  initial_centroids.size(0) == codes.size(0) &&
                  initial_centroids.size(1) == codes.size(1) && initial_centroids.size(2) >= 1,
              "centroids must be an int64 tensor of shape (", codes.size(0), ", ", codes.size(1),
              ", clusters >= 1), got ", initial_centroids.sizes(), " ", initial_centroids.scalar_type());
  TORCH_CHECK(iterations >= 0, "hamming_kmeans: iterations must be >= 0, got ", iterations);
  TORCH_CHECK(bits >= 1 && bits <= 63, "hamming_kmeans: bits must lie in 1..63, got ", bits);
  const int64_t clusters = initial_centroids.size(2);
  TORCH_CHECK(clusters < (int64_t{1} << 31), "hamming_kmeans: too many clusters: ", clusters);
  return clusters;
}

}  // namespace attention_ext_checks
