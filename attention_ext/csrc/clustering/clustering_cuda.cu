// CUDA implementations of the query clustering of clustering.cpp (same operators, same
// decisions; the comment at the top of clustering.cpp states them).
//
//   hyperplane_hash      projections by one matmul in opmath (float, or double for float64
//                        inputs); per-(batch, head, bit) mean and standard deviation in
//                        double (one block each, a fixed reduction order); one thread per
//                        query packs its bits.
//   hamming_kmeans_init  one block per (batch, head); its first warp runs the same
//                        seeded Fisher-Yates walk as the CPU (splitmix64 stream of
//                        (seed, b, h)) in lockstep, so the initial centroids are identical
//                        to the CPU's; the duplicate check of each step is spread over the
//                        lanes, against centroids in shared memory. The walk is sequential
//                        but short (it stops after `clusters` distinct codes).
//   hamming_kmeans       the Lloyd loop runs on the host, one launch per step: assign
//                        (one thread per query, 256 to 1024 queries per block, centroids in
//                        shared memory) with the members' bit counts added per warp
//                        (__match_any / __ballot) into shared (or, for many clusters,
//                        global) integer counters, then added to global memory; the last
//                        block of each (batch, head) to finish (a counter of arrivals, the
//                        threadfence pattern) does its majority vote. A (batch, head)
//                        whose centroids did not change is marked settled and skipped,
//                        as on the CPU. Integer counts make the result exact and identical
//                        to the CPU's for the same codes and initial centroids.
//
// Codes computed from float projections can differ from the CPU's where a projection lies
// within rounding of its threshold (the two sum in different orders); float64 inputs
// give the same codes in practice.
#include "../common/cuda_common.cuh"
#include "checks.h"

#include <torch/library.h>

#include <cmath>
#include <cstdint>

namespace {

using namespace attention_ext_cuda;

// After the operator's checks (checks.h), the device: the kernels read the lengths.
void check_lengths_on_gpu(const at::Tensor& lengths) {
  TORCH_CHECK(lengths.is_cuda(), "lengths must be on the CUDA device of the codes/queries, got ",
              lengths.device());
}

// --- hyperplane_hash -------------------------------------------------------------------------

// threshold[g, bit] = mean + offset[bit] * std of proj[g, :valid, bit], in double.
template <typename acc_t>
__global__ void hash_threshold_kernel(const acc_t* __restrict__ proj, const double* __restrict__ offsets,
                                      const int64_t* __restrict__ lengths, double* __restrict__ thresholds,
                                      int64_t heads, int64_t length, int64_t bits) {
  __shared__ double partial[kThreads];
  const int64_t bit = blockIdx.x, g = blockIdx.y;
  const int64_t valid = clipped_length(lengths, g / heads, length);
  if (valid == 0) return;  // no valid query reads the threshold
  const acc_t* column = proj + g * length * bits + bit;
  auto block_sum = [&](double value) {
    partial[threadIdx.x] = value;
    __syncthreads();
    for (int stride = kThreads / 2; stride > 0; stride /= 2) {
      if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
      __syncthreads();
    }
    const double total = partial[0];
    __syncthreads();
    return total;
  };
  double sum = 0;
  for (int64_t i = threadIdx.x; i < valid; i += kThreads) sum += static_cast<double>(column[i * bits]);
  const double mean = block_sum(sum) / static_cast<double>(valid);
  double squares = 0;
  for (int64_t i = threadIdx.x; i < valid; i += kThreads) {
    const double d = static_cast<double>(column[i * bits]) - mean;
    squares += d * d;
  }
  const double variance = block_sum(squares) / static_cast<double>(valid);
  if (threadIdx.x == 0) thresholds[g * bits + bit] = mean + offsets[bit] * sqrt(variance);
}

template <typename acc_t>
__global__ void hash_pack_kernel(const acc_t* __restrict__ proj, const double* __restrict__ thresholds,
                                 const int64_t* __restrict__ lengths, int64_t* __restrict__ codes,
                                 int64_t heads, int64_t length, int64_t bits, int64_t total) {
  const int64_t index = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (index >= total) return;
  const int64_t g = index / length, i = index % length;
  if (i >= clipped_length(lengths, g / heads, length)) return;  // padded: code 0
  const acc_t* row = proj + index * bits;
  const double* threshold = thresholds + g * bits;
  int64_t code = 0;
  for (int64_t b = 0; b < bits; ++b)
    code |= static_cast<int64_t>(static_cast<double>(row[b]) > threshold[b]) << b;
  codes[index] = code;
}

at::Tensor hyperplane_hash_cuda(const at::Tensor& queries, const at::Tensor& planes,
                                const at::Tensor& offsets, const at::Tensor& lengths) {
  const int64_t bits = attention_ext_checks::check_hyperplane_hash(queries, planes, offsets, lengths);
  check_lengths_on_gpu(lengths);
  const c10::cuda::CUDAGuard guard(queries.device());
  const int64_t batch = queries.size(0), heads = queries.size(1), length = queries.size(2);
  const int64_t groups = batch * heads;
  at::Tensor codes = at::zeros({batch, heads, length}, queries.options().dtype(at::kLong));
  if (codes.numel() == 0) return codes;
  // Half-precision queries are projected in float32 (their values exactly, planes unrounded).
  const auto opmath = at::toOpMathType(queries.scalar_type());
  const at::Tensor projections =
      at::matmul(queries.to(opmath), planes.to(queries.device(), opmath).t()).contiguous();  // (B,H,N,bits)
  const at::Tensor offsets64 = offsets.to(queries.device(), at::kDouble).contiguous();
  const at::Tensor lengths_c = lengths.to(queries.device()).contiguous();
  at::Tensor thresholds = at::zeros({groups, bits}, offsets64.options());
  AT_DISPATCH_FLOATING_TYPES(opmath, "hyperplane_hash_cuda", [&] {
    hash_threshold_kernel<scalar_t><<<dim3(bits, grid_y(groups)), kThreads, 0, stream()>>>(
        projections.data_ptr<scalar_t>(), offsets64.data_ptr<double>(), lengths_c.data_ptr<int64_t>(),
        thresholds.data_ptr<double>(), heads, length, bits);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    hash_pack_kernel<scalar_t><<<blocks_for(groups * length), kThreads, 0, stream()>>>(
        projections.data_ptr<scalar_t>(), thresholds.data_ptr<double>(), lengths_c.data_ptr<int64_t>(),
        codes.data_ptr<int64_t>(), heads, length, bits, groups * length);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return codes;
}

// --- hamming_kmeans_init -----------------------------------------------------------------------

__device__ __forceinline__ uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

constexpr int64_t kSharedCentroids = 4096;     // up to this many centroids are staged in shared memory

// One block per (batch, head) (the walk is sequential); `order` is (groups, length) scratch.
// The block's first warp runs the CPU's walk in lockstep: every lane draws the same stream,
// lane 0 swaps, and the check whether a candidate's code is already a centroid is spread over
// the 32 lanes (each a strided share of the centroids found so far, then a vote). The
// centroids sit in shared memory when `shared` (clusters <= kSharedCentroids): the check reads
// each one once per step, which from global memory made the walk about clusters^2 / 2
// dependent cache round trips.
__global__ void kmeans_init_kernel(const int64_t* __restrict__ codes, const int64_t* __restrict__ lengths,
                                   int64_t* __restrict__ centroids, int64_t* __restrict__ order,
                                   int64_t heads, int64_t length, int64_t clusters, uint64_t seed,
                                   bool shared) {
  extern __shared__ unsigned char init_shared_raw[];
  const int64_t g = blockIdx.x, b = g / heads, h = g % heads;
  const int64_t valid = clipped_length(lengths, b, length);
  const int64_t* head_codes = codes + g * length;
  int64_t* cent_g = centroids + g * clusters;
  if (valid <= clusters) {  // one cluster per query; centroids are the codes themselves
    for (int64_t i = threadIdx.x; i < valid; i += blockDim.x) cent_g[i] = head_codes[i];
    return;
  }
  int64_t* head_order = order + g * length;
  for (int64_t i = threadIdx.x; i < valid; i += blockDim.x) head_order[i] = i;
  __syncthreads();
  if (threadIdx.x >= kWarp) return;
  const int lane = threadIdx.x;
  int64_t* cent = shared ? reinterpret_cast<int64_t*>(init_shared_raw) : cent_g;
  // The CPU's walk, step for step: the stream depends on (seed, b, h) only. Every value that
  // decides the loop (state, i, filled) is the same in all lanes.
  uint64_t state = seed;
  state = splitmix64(state) ^ static_cast<uint64_t>(b);
  state = splitmix64(state) ^ static_cast<uint64_t>(h);
  int64_t filled = 0;
  for (int64_t i = 0; i < valid && filled < clusters; ++i) {
    const int64_t pick = i + static_cast<int64_t>(splitmix64(state) % static_cast<uint64_t>(valid - i));
    const int64_t swapped = head_order[pick];
    const int64_t candidate = head_codes[swapped];
    __syncwarp();  // every lane has read head_order[pick] before lane 0 overwrites it
    if (lane == 0) {
      head_order[pick] = head_order[i];
      head_order[i] = swapped;
    }
    bool taken = false;
    for (int64_t c = lane; c < filled; c += kWarp) taken |= cent[c] == candidate;
    if (!__any_sync(kFullMask, taken)) {
      if (lane == 0) cent[filled] = candidate;
      ++filled;
    }
    __syncwarp();  // lane 0's writes (order, centroid) are seen by every lane in the next step
  }
  // filled >= 1: the first candidate is never taken.
  for (int64_t c = filled + lane; c < clusters; c += kWarp) cent[c] = cent[0];
  if (!shared) return;
  __syncwarp();
  for (int64_t c = lane; c < clusters; c += kWarp) cent_g[c] = cent[c];
}

at::Tensor hamming_kmeans_init_cuda(const at::Tensor& codes, const at::Tensor& lengths, int64_t clusters,
                                    int64_t seed) {
  attention_ext_checks::check_hamming_kmeans_init(codes, lengths, clusters);
  check_lengths_on_gpu(lengths);
  const c10::cuda::CUDAGuard guard(codes.device());
  const int64_t heads = codes.size(1), length = codes.size(2), groups = codes.size(0) * heads;
  at::Tensor centroids = at::zeros({codes.size(0), heads, clusters}, codes.options());
  if (groups == 0) return centroids;
  TORCH_CHECK(groups < (int64_t{1} << 31), "hamming_kmeans_init: too many (batch, head)s");
  const at::Tensor codes_c = codes.contiguous(), lengths_c = lengths.to(codes.device()).contiguous();
  at::Tensor order = at::empty({groups, std::max<int64_t>(length, 1)}, codes.options());
  const bool shared = clusters <= kSharedCentroids;
  kmeans_init_kernel<<<static_cast<unsigned>(groups), kThreads, shared ? clusters * sizeof(int64_t) : 0,
                       stream()>>>(
      codes_c.data_ptr<int64_t>(), lengths_c.data_ptr<int64_t>(), centroids.data_ptr<int64_t>(),
      order.data_ptr<int64_t>(), heads, length, clusters, static_cast<uint64_t>(seed), shared);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return centroids;
}

// --- hamming_kmeans ----------------------------------------------------------------------------
// Queries assigned by one block: 256 (one per thread) while that makes at most
// kAssignBlocks blocks, so that a batch of one long sequence (6 (batch, head)s) fills a large
// GPU (132 SMs on an H100) instead of 6 x N / 1024 blocks; up to 1024 for larger problems,
// where every block adding its bit counts to global memory would cost more than it gains.
constexpr int64_t kAssignBlocks = 1024;

int64_t assign_positions_per_block(int64_t length, int64_t groups) {
  for (const int64_t per_block : {int64_t{256}, int64_t{512}})
    if (groups * ((length + per_block - 1) / per_block) <= kAssignBlocks) return per_block;
  return 1024;
}
constexpr int64_t kSharedCounts = 128;         // up to this many clusters count bits in shared memory

// The majority vote of (batch, head) g, run by the one block that finished g's counting last:
// each centroid bit becomes its members' majority (an exact tie keeps the old bit; a cluster
// without members keeps its code); g is settled when no centroid changes (at once when it has
// no more valid queries than clusters). Clears the counters and g's arrivals for the next step.
// The counts were added by other blocks (atomics, in L2), so they are read past L1 (__ldcg).
__device__ void update_centroids(int64_t g, bool kmeans, int64_t* centroids, int32_t* settled,
                                 int32_t* ones, int32_t* members, int32_t* arrivals, int64_t clusters,
                                 int64_t bits) {
  int changed = 0;
  for (int64_t c = threadIdx.x; kmeans && c < clusters; c += blockDim.x) {
    int32_t* count = ones + (g * clusters + c) * 64;
    const int64_t size = __ldcg(members + g * clusters + c);
    if (size == 0) continue;  // empty: keep the code
    int64_t* cent = centroids + g * clusters + c;
    const int64_t old = *cent;
    int64_t fresh = 0;
    for (int64_t b = 0; b < bits; ++b) {
      const int64_t twice = 2 * static_cast<int64_t>(__ldcg(count + b));
      const int64_t bit = twice > size ? 1 : (twice < size ? 0 : (old >> b) & 1);
      fresh |= bit << b;
      count[b] = 0;
    }
    members[g * clusters + c] = 0;
    changed |= fresh != old;
    *cent = fresh;
  }
  changed = __syncthreads_or(changed);
  if (threadIdx.x == 0) {
    settled[g] = !changed;
    arrivals[g] = 0;
  }
}

// Assigns queries [blockIdx.x * per_block, ...) of (batch, head) blockIdx.y to their
// nearest centroid (fewest differing bits, ties to the lowest index); padded queries get -1.
// With kCount (a Lloyd step), also adds every member's bits to ones[g, c, bit] and 1 to
// members[g, c], and the last of g's blocks to finish then updates g's centroids
// (update_centroids), so a step is one launch. A settled g is skipped by all its blocks.
template <bool kCount>
__global__ void kmeans_assign_kernel(const int64_t* __restrict__ codes, const int64_t* __restrict__ lengths,
                                     int64_t* __restrict__ centroids, int32_t* __restrict__ settled,
                                     int64_t* __restrict__ assignment, int32_t* __restrict__ ones,
                                     int32_t* __restrict__ members, int32_t* __restrict__ arrivals,
                                     int64_t heads, int64_t length, int64_t clusters, int64_t bits,
                                     int64_t per_block) {
  extern __shared__ unsigned char shared_raw[];
  __shared__ int last_block;
  const int64_t g = blockIdx.y;
  if (settled[g]) return;  // its assignment is already final (the same for all blocks of g)
  const int64_t valid = clipped_length(lengths, g / heads, length);
  const bool kmeans = valid > clusters;
  const bool shared_centroids = clusters <= kSharedCentroids;
  const bool shared_counts = kCount && clusters <= kSharedCounts;
  int64_t* cent_s = reinterpret_cast<int64_t*>(shared_raw);
  int32_t* counts_s = reinterpret_cast<int32_t*>(cent_s + (shared_centroids ? clusters : 0));
  int32_t* members_s = counts_s + clusters * 64;
  const int64_t* cent_g = centroids + g * clusters;
  if (kmeans && shared_centroids)
    for (int64_t c = threadIdx.x; c < clusters; c += blockDim.x) cent_s[c] = cent_g[c];
  if (kmeans && shared_counts)
    for (int64_t c = threadIdx.x; c < clusters * 65; c += blockDim.x) counts_s[c] = 0;
  __syncthreads();
  const int64_t* cent = shared_centroids ? cent_s : cent_g;
  int32_t* count_ones = shared_counts ? counts_s : ones + g * clusters * 64;
  int32_t* count_members = shared_counts ? members_s : members + g * clusters;
  const int64_t first = blockIdx.x * per_block;
  const int64_t last = min(first + per_block, length);
  const int lane = threadIdx.x % kWarp;
  // The loop bounds are the same for every thread, so whole warps take part in the
  // warp-wide votes below.
  for (int64_t base = first; base < last; base += blockDim.x) {
    const int64_t i = base + threadIdx.x;
    int64_t cluster = -1, x = 0;
    if (i < last) {
      if (i >= valid) {
        assignment[g * length + i] = -1;
      } else if (!kmeans) {
        assignment[g * length + i] = i;
      } else {
        x = codes[g * length + i];
        int best_distance = 65;
        for (int64_t c = 0; c < clusters; ++c) {
          const int distance = __popcll(static_cast<unsigned long long>(x ^ cent[c]));
          if (distance < best_distance) {
            best_distance = distance;
            cluster = c;
          }
        }
        assignment[g * length + i] = cluster;
      }
    }
    if (!kCount || !kmeans) continue;  // block-uniform
    // Lanes with the same cluster add their bit counts once, through their lowest lane.
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 700
    const unsigned peers = __match_any_sync(kFullMask, static_cast<unsigned long long>(cluster));
#else  // no __match_any_sync before Volta: every lane adds its own bits
    const unsigned peers = 1u << lane;
#endif
    const bool leader = cluster >= 0 && (__ffs(peers) - 1) == lane;
    for (int64_t bit = 0; bit < bits; ++bit) {
      const unsigned set = __ballot_sync(kFullMask, cluster >= 0 && ((x >> bit) & 1));
      const int count = __popc(set & peers);
      if (leader && count > 0) atomicAdd(&count_ones[cluster * 64 + bit], count);
    }
    if (leader) atomicAdd(&count_members[cluster], __popc(peers));
  }
  if constexpr (kCount) {
    if (shared_counts && kmeans) {  // block-uniform
      __syncthreads();
      int32_t* ones_g = ones + g * clusters * 64;
      int32_t* members_g = members + g * clusters;
      for (int64_t index = threadIdx.x; index < clusters * 64; index += blockDim.x)
        if (counts_s[index]) atomicAdd(&ones_g[index], counts_s[index]);
      for (int64_t c = threadIdx.x; c < clusters; c += blockDim.x)
        if (members_s[c]) atomicAdd(&members_g[c], members_s[c]);
    }
    // The threadfence pattern (CUDA Programming Guide, "Memory Fence Functions"): every
    // thread's counts are visible device-wide before its block's arrival is counted, so the
    // block that arrives last sees the counts of all the others.
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last_block = atomicAdd(arrivals + g, 1) == static_cast<int>(gridDim.x) - 1;
    __syncthreads();
    if (!last_block) return;  // block-uniform
    __threadfence();
    update_centroids(g, kmeans, centroids, settled, ones, members, arrivals, clusters, bits);
  }
}

std::tuple<at::Tensor, at::Tensor> hamming_kmeans_cuda(const at::Tensor& codes, const at::Tensor& lengths,
                                                       const at::Tensor& initial_centroids,
                                                       int64_t iterations, int64_t bits) {
  const int64_t clusters =
      attention_ext_checks::check_hamming_kmeans(codes, lengths, initial_centroids, iterations, bits);
  check_lengths_on_gpu(lengths);
  const c10::cuda::CUDAGuard guard(codes.device());
  const int64_t heads = codes.size(1), length = codes.size(2);
  const int64_t groups = codes.size(0) * heads;
  at::Tensor centroids = initial_centroids.to(codes.device()).contiguous().clone();
  at::Tensor assignment = at::empty({codes.size(0), heads, length}, codes.options());
  if (assignment.numel() == 0) return {assignment, centroids};
  const at::Tensor codes_c = codes.contiguous(), lengths_c = lengths.to(codes.device()).contiguous();
  const auto int_options = codes.options().dtype(at::kInt);
  at::Tensor settled = at::zeros({groups}, int_options);
  at::Tensor ones = at::zeros({groups, clusters, 64}, int_options);
  at::Tensor members = at::zeros({groups, clusters}, int_options);
  at::Tensor arrivals = at::zeros({groups}, int_options);  // blocks of g done with a step's counts

  const int64_t per_block = assign_positions_per_block(length, groups);  // a multiple of kThreads
  const dim3 assign_grid(blocks_for(length, per_block), grid_y(groups));
  const size_t centroid_bytes = clusters <= kSharedCentroids ? clusters * sizeof(int64_t) : 0;
  const size_t count_bytes = clusters <= kSharedCounts ? clusters * 65 * sizeof(int32_t) : 0;
  auto assign = [&](bool count) {
    if (count) {
      kmeans_assign_kernel<true><<<assign_grid, kThreads, centroid_bytes + count_bytes, stream()>>>(
          codes_c.data_ptr<int64_t>(), lengths_c.data_ptr<int64_t>(), centroids.data_ptr<int64_t>(),
          settled.data_ptr<int32_t>(), assignment.data_ptr<int64_t>(), ones.data_ptr<int32_t>(),
          members.data_ptr<int32_t>(), arrivals.data_ptr<int32_t>(), heads, length, clusters, bits,
          per_block);
    } else {
      kmeans_assign_kernel<false><<<assign_grid, kThreads, centroid_bytes, stream()>>>(
          codes_c.data_ptr<int64_t>(), lengths_c.data_ptr<int64_t>(), centroids.data_ptr<int64_t>(),
          settled.data_ptr<int32_t>(), assignment.data_ptr<int64_t>(), ones.data_ptr<int32_t>(),
          members.data_ptr<int32_t>(), arrivals.data_ptr<int32_t>(), heads, length, clusters, bits,
          per_block);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  };
  for (int64_t it = 0; it < iterations; ++it) assign(/*count=*/true);  // a Lloyd step: assign + update
  assign(/*count=*/false);
  return {assignment, centroids};
}

}  // namespace

TORCH_LIBRARY_IMPL(attention_ext, CUDA, m) {
  m.impl("hyperplane_hash", &hyperplane_hash_cuda);
  m.impl("hamming_kmeans_init", &hamming_kmeans_init_cuda);
  m.impl("hamming_kmeans", &hamming_kmeans_cuda);
}
