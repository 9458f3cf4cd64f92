// A cheap lower bound for a top-k selection over one row of scores, shared by cluster_topk
// (cluster_ops.cpp) and the fused top-k of i-clustered attention (centroid_attention.cpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <vector>

// Split row[0, valid) into strided classes (l mod classes, classes = min(valid, max(2k, 64)
// rounded up to 16)) and return the k-th largest class maximum: the k class maxima at or above
// it are k different keys, so every one of the row's top k scores is >= it. Needs 1 <= k <= valid;
// `scratch` is working memory the caller may reuse between rows.
template <typename scalar_t>
scalar_t strided_class_floor(const scalar_t* row, int64_t valid, int64_t k, std::vector<scalar_t>& scratch) {
  const int64_t classes = std::min(valid, (std::max<int64_t>(2 * k, 64) + 15) / 16 * 16);
  scratch.assign(row, row + classes);
  scalar_t* m = scratch.data();
  for (int64_t first = classes; first < valid; first += classes) {
    const int64_t count = std::min(classes, valid - first);
    const scalar_t* segment = row + first;
#pragma omp simd
    for (int64_t j = 0; j < count; ++j) m[j] = segment[j] > m[j] ? segment[j] : m[j];
  }
  std::nth_element(scratch.begin(), scratch.begin() + (k - 1), scratch.end(), std::greater<scalar_t>());
  return scratch[k - 1];
}
