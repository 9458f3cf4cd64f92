// The backward pass of LSH's chunked attention on the CPU (`lsh_attention_backward`): the
// chunk scores recomputed from the saved output and log-sum-exp (lsh_cpu.h).
#include <ATen/ATen.h>
#include <torch/library.h>

#include "checks.h"
#include "chunk_window.h"

namespace {

using namespace lsh_cpu;

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

}  // namespace

TORCH_LIBRARY_FRAGMENT(attention_ext, m) {
  m.def("lsh_attention_backward(Tensor grad_out, Tensor q, Tensor v, Tensor order, "
        "Tensor lengths, Tensor out, Tensor lse, int chunk_size) -> (Tensor grad_q, Tensor grad_v)");
}

TORCH_LIBRARY_IMPL(attention_ext, CPU, m) {
  m.impl("lsh_attention_backward", &lsh_attention_backward_cpu);
}
