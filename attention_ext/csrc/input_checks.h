// Argument checks shared by the CPU (.cpp) and CUDA (.cu) implementations of an operator,
// so both refuse the same inputs with the same message.
//
// Rule for every kernel, CPU and CUDA: nothing that can throw (TORCH_CHECK, throw, .item(),
// tensor allocation) runs inside a parallel region (an at::parallel_for body, an OpenMP block,
// any host-side parallel loop), nor in a helper such a body calls: an exception may not leave
// an OpenMP block, and a TORCH_CHECK inside lsh.cpp's parallel order check is where a
// torch 2.11 test run died with a segfault. Validate the inputs before the region; where the
// check is part of the parallel work (lsh.cpp's index_chunks), each task records what it
// found and the error is raised after the region, naming the argument, the index, the bad
// value and what is expected. Device code sets a flag the host reads after the kernel
// (lsh_cuda.cu). The one allowance: a worker's own scratch std::vector, whose only failure is
// std::bad_alloc, which at::parallel_for catches on the worker and rethrows after the region.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace attention_ext_checks {

inline void check_index(const at::Tensor& t, const char* name, int64_t dims) {
  TORCH_CHECK(t.dim() == dims && t.scalar_type() == at::kLong, name, " must be an int64 tensor with ",
              dims, " dimensions, got ", t.sizes(), " ", t.scalar_type());
}

inline void check_rows(const at::Tensor& x, const char* name) {
  TORCH_CHECK(x.dim() == 4 && x.is_floating_point(), name,
              " must be a floating tensor of shape (batch, heads, rows, dim), got ", x.sizes());
}

// --- clustering (clustering.cpp) ---------------------------------------------------------------

// One int64 valid length per batch row. The CUDA operators add that it is on the GPU.
inline void check_lengths(const at::Tensor& lengths, int64_t batch) {
  TORCH_CHECK(lengths.dim() == 1 && lengths.size(0) == batch && lengths.scalar_type() == at::kLong,
              "lengths must be an int64 tensor of shape (", batch, "), got ", lengths.sizes(), " ",
              lengths.scalar_type());
}

inline void check_codes(const at::Tensor& codes) {
  TORCH_CHECK(codes.dim() == 3 && codes.scalar_type() == at::kLong,
              "codes must be an int64 tensor of shape (batch, heads, length), got ", codes.sizes(),
              " ", codes.scalar_type());
}

// hyperplane_hash's queries, planes and offsets (its lengths: check_lengths after it).
// Returns the number of bits, one per plane.
inline int64_t check_hash_inputs(const at::Tensor& queries, const at::Tensor& planes,
                                 const at::Tensor& offsets) {
  TORCH_CHECK(queries.dim() == 4, "queries must have shape (batch, heads, length, dim), got ",
              queries.sizes());
  TORCH_CHECK(planes.dim() == 2 && planes.size(1) == queries.size(3),
              "planes must have shape (bits, ", queries.size(3), "), got ", planes.sizes());
  const int64_t bits = planes.size(0);
  TORCH_CHECK(bits >= 1 && bits <= 63, "hyperplane_hash: bits must lie in 1..63, got ", bits);
  TORCH_CHECK(offsets.dim() == 1 && offsets.size(0) == bits, "offsets must have shape (", bits,
              "), got ", offsets.sizes());
  return bits;
}

// hamming_kmeans's other arguments, once its codes and lengths are checked.
inline void check_kmeans_inputs(const at::Tensor& codes, const at::Tensor& initial_centroids,
                                int64_t iterations, int64_t bits) {
  TORCH_CHECK(initial_centroids.dim() == 3 && initial_centroids.scalar_type() == at::kLong &&
                  initial_centroids.size(0) == codes.size(0) &&
                  initial_centroids.size(1) == codes.size(1) && initial_centroids.size(2) >= 1,
              "centroids must be an int64 tensor of shape (", codes.size(0), ", ", codes.size(1),
              ", clusters >= 1), got ", initial_centroids.sizes(), " ", initial_centroids.scalar_type());
  TORCH_CHECK(iterations >= 0, "hamming_kmeans: iterations must be >= 0, got ", iterations);
  TORCH_CHECK(bits >= 1 && bits <= 63, "hamming_kmeans: bits must lie in 1..63, got ", bits);
}

// --- LSH attention (lsh.cpp) ---------------------------------------------------------------------
// Two steps, so that the CUDA operators check the devices of q and v in between, as before.

inline void check_lsh_rows(const at::Tensor& q, const at::Tensor& v) {
  TORCH_CHECK(q.dim() == 4, "lsh attention: q must be (B, H, N, E), got ", q.sizes());
  TORCH_CHECK(v.dim() == 4 && v.size(0) == q.size(0) && v.size(1) == q.size(1) && v.size(2) == q.size(2),
              "lsh attention: v must share (B, H, N) with q; got ", q.sizes(), ", ", v.sizes());
  TORCH_CHECK(v.scalar_type() == q.scalar_type(), "lsh attention: q and v must share one dtype");
}

inline void check_lsh_schedule(const at::Tensor& q, const at::Tensor& order, const at::Tensor& lengths,
                               int64_t chunk_size) {
  TORCH_CHECK(chunk_size >= 1, "lsh attention: chunk_size must be >= 1, got ", chunk_size);
  TORCH_CHECK(order.dim() == 4 && order.size(0) == q.size(0) && order.size(1) == q.size(1) &&
                  order.size(3) == q.size(2) && order.size(2) >= 1,
              "lsh attention: order must be (B, H, rounds, N) for q ", q.sizes(), ", got ", order.sizes());
  TORCH_CHECK(lengths.dim() == 1 && lengths.size(0) == q.size(0),
              "lsh attention: lengths must be (B,), got ", lengths.sizes());
}

// --- sparse products of improved clustered attention (sparse_product.cpp) -----------------------

// The sizes of a sparse product.
struct SparseShape {
  int64_t batch, heads, length, clusters, slots;
};

inline SparseShape check_sparse(const at::Tensor& rows, const at::Tensor& topk, const at::Tensor& offsets,
                                const at::Tensor& members, const char* op) {
  TORCH_CHECK(rows.dim() == 4 && rows.is_floating_point(), op,
              ": expected a floating tensor of shape (batch, heads, length, dim), got ", rows.sizes());
  TORCH_CHECK(topk.dim() == 4 && topk.scalar_type() == at::kLong && topk.size(0) == rows.size(0) &&
                  topk.size(1) == rows.size(1),
              op, ": topk must be int64 of shape (", rows.size(0), ", ", rows.size(1),
              ", clusters, slots), got ", topk.sizes(), " ", topk.scalar_type());
  TORCH_CHECK(offsets.dim() == 3 && offsets.scalar_type() == at::kLong &&
                  offsets.size(0) == rows.size(0) && offsets.size(1) == rows.size(1) &&
                  offsets.size(2) == topk.size(2) + 1,
              op, ": offsets must be int64 of shape (", rows.size(0), ", ", rows.size(1), ", ",
              topk.size(2) + 1, "), got ", offsets.sizes());
  TORCH_CHECK(members.dim() == 3 && members.scalar_type() == at::kLong &&
                  members.size(0) == rows.size(0) && members.size(1) == rows.size(1) &&
                  members.size(2) == rows.size(2),
              op, ": members must be int64 of shape ", rows.sizes().slice(0, 3), ", got ",
              members.sizes());
  return {rows.size(0), rows.size(1), rows.size(2), topk.size(2), topk.size(3)};
}

// The keys of clustered_sparse_dot (forward and backward): q's shape and dtype.
inline void check_sparse_keys(const at::Tensor& q, const at::Tensor& k, const char* op) {
  TORCH_CHECK(k.sizes() == q.sizes() && k.scalar_type() == q.scalar_type(), op, ": k must match q ", q.sizes(),
              " ", q.scalar_type(), ", got ", k.sizes(), " ", k.scalar_type());
}

// A tensor of one score per (batch, head, position, slot): clustered_sparse_dot's gradient and
// clustered_sparse_weighted_sum's weights, forward and backward alike; of `dtype` unless that is
// Undefined (a gradient: the CUDA operators convert it, the CPU ones refuse another dtype when
// they read it).
inline void check_sparse_scores(const at::Tensor& scores, const SparseShape& s, at::ScalarType dtype,
                                const char* op, const char* what) {
  TORCH_CHECK(scores.dim() == 4 && scores.size(0) == s.batch && scores.size(1) == s.heads &&
                  scores.size(2) == s.length && scores.size(3) == s.slots &&
                  (dtype == at::ScalarType::Undefined || scores.scalar_type() == dtype),
              op, ": ", what, " must have shape (", s.batch, ", ", s.heads, ", ", s.length, ", ", s.slots, ")",
              dtype == at::ScalarType::Undefined ? "" : " and the rows' dtype", ", got ", scores.sizes(), " ",
              scores.scalar_type());
}

// The index tensors of a sparse product, contiguous, taken once check_sparse has passed.
struct SparseInputs {
  at::Tensor topk, offsets, members;
  SparseInputs(const at::Tensor& t, const at::Tensor& o, const at::Tensor& m)
      : topk(t.contiguous()), offsets(o.contiguous()), members(m.contiguous()) {}
};

}  // namespace attention_ext_checks
