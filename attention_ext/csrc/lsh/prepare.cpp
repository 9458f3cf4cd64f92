// The checked problem both passes of LSH's chunked attention on the CPU start from: lengths
// checked, every position's chunk per round indexed (and the order checked while doing so).
#include <ATen/ATen.h>

#include "checks.h"
#include "lsh_cpu.h"

namespace lsh_cpu {

namespace {

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

}  // namespace

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

}  // namespace lsh_cpu
