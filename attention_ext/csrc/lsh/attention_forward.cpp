// The forward pass of LSH's chunked attention on the CPU (`lsh_attention_forward`): each
// chunk's queries against its window, the rounds merged by log-sum-exp (lsh_cpu.h).
#include <ATen/ATen.h>
#include <torch/library.h>

#include "checks.h"
#include "chunk_window.h"

namespace {

using namespace lsh_cpu;

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

}  // namespace

TORCH_LIBRARY_FRAGMENT(attention_ext, m) {
  m.def("lsh_attention_forward(Tensor q, Tensor v, Tensor order, Tensor lengths, int chunk_size) "
        "-> (Tensor out, Tensor lse)");
}

TORCH_LIBRARY_IMPL(attention_ext, CPU, m) {
  m.impl("lsh_attention_forward", &lsh_attention_forward_cpu);
}
