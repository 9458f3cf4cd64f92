// Per-cluster operations of clustered and i-clustered attention (paper eq. 3, 6, and
// the top-k keys T of eq. 9-10).
//
// A clustering of the queries of each (batch, head) is held as
//   assignment (B,H,N) int64  cluster id of each query, -1 for padded queries,
//   offsets    (B,H,C+1) int64 and members (B,H,N) int64: the query positions of
//              cluster c are members[offsets[c] .. offsets[c+1]), in increasing order;
//              members past offsets[C] are -1.
//
// Operators (torch.ops.attention_ext.*):
//   group_by_cluster(assignment, clusters) -> (offsets, members)
//   cluster_mean(x (B,H,N,D), offsets, members) -> (B,H,C,D)      mean of member rows (eq. 3)
//   cluster_mean_backward(grad (B,H,C,D), assignment, offsets) -> (B,H,N,D)
//   cluster_broadcast(x (B,H,C,D), assignment) -> (B,H,N,D)       row of own cluster (eq. 6)
//   cluster_broadcast_backward(grad (B,H,N,D), offsets, members) -> (B,H,C,D)
//   cluster_topk(weights (B,H,C,N), lengths, k) -> (B,H,C,min(k,N)) int64
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "../common/top_k_floor.h"
#include "checks.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <utility>
#include <vector>

namespace {

std::tuple<at::Tensor, at::Tensor> group_by_cluster(const at::Tensor& assignment, int64_t clusters) {
  attention_ext_checks::check_group_by_cluster(assignment, clusters);
  const int64_t batch = assignment.size(0), heads = assignment.size(1), length = assignment.size(2);
  const at::Tensor assign_c = assignment.contiguous();
  TORCH_CHECK(assign_c.numel() == 0 || assign_c.max().item<int64_t>() < clusters,
              "group_by_cluster: a cluster id is >= clusters (", clusters, ")");
  at::Tensor offsets = at::zeros({batch, heads, clusters + 1}, assignment.options());
  at::Tensor members = at::full({batch, heads, length}, -1, assignment.options());
  const int64_t* assign = assign_c.data_ptr<int64_t>();
  int64_t* offset_all = offsets.data_ptr<int64_t>();
  int64_t* member_all = members.data_ptr<int64_t>();
  at::parallel_for(0, batch * heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<int64_t> cursor(clusters);
    for (int64_t g = begin; g < end; ++g) {
      const int64_t* a = assign + g * length;
      int64_t* offset = offset_all + g * (clusters + 1);
      for (int64_t i = 0; i < length; ++i)
        if (a[i] >= 0) offset[a[i] + 1] += 1;
      for (int64_t c = 0; c < clusters; ++c) offset[c + 1] += offset[c];
      std::copy(offset, offset + clusters, cursor.begin());
      int64_t* member = member_all + g * length;
      for (int64_t i = 0; i < length; ++i)
        if (a[i] >= 0) member[cursor[a[i]]++] = i;
    }
  });
  return {offsets, members};
}

// out[g, c] = sum (or mean) of rows x[g, i] over the members i of cluster c.
template <typename scalar_t>
void sum_member_rows(const scalar_t* x, const int64_t* offset_all, const int64_t* member_all,
                     scalar_t* out, int64_t groups, int64_t clusters, int64_t length, int64_t dim,
                     bool mean) {
  at::parallel_for(0, groups * clusters, 8, [&](int64_t begin, int64_t end) {
    for (int64_t index = begin; index < end; ++index) {
      const int64_t g = index / clusters, c = index % clusters;
      const int64_t* offset = offset_all + g * (clusters + 1);
      const int64_t first = offset[c], last = offset[c + 1];
      if (first == last) continue;  // empty cluster: zero row, read by no query
      const int64_t* member = member_all + g * length;
      const scalar_t* rows = x + g * length * dim;
      scalar_t* acc = out + index * dim;
      for (int64_t m = first; m < last; ++m) {
        const scalar_t* row = rows + member[m] * dim;
#pragma omp simd
        for (int64_t d = 0; d < dim; ++d) acc[d] += row[d];
      }
      if (!mean) continue;
      const scalar_t inverse = scalar_t(1) / static_cast<scalar_t>(last - first);
#pragma omp simd
      for (int64_t d = 0; d < dim; ++d) acc[d] *= inverse;
    }
  });
}

// out[g, i] = x[g, assignment[i]] (divided by the cluster's size when `mean`), 0 for
// padded queries. Every row of out is written, so it may come uninitialised: for long
// sequences a zero fill would be a whole extra pass over the output.
template <typename scalar_t>
void copy_cluster_rows(const scalar_t* x, const int64_t* assign, const int64_t* offset_all,
                       scalar_t* out, int64_t groups, int64_t clusters, int64_t length, int64_t dim,
                       bool mean) {
  at::parallel_for(0, groups * length, 64, [&](int64_t begin, int64_t end) {
    for (int64_t index = begin; index < end; ++index) {
      const int64_t a = assign[index];
      if (a < 0) {  // padded query: a zero row (out is not zero-filled beforehand)
        std::fill(out + index * dim, out + (index + 1) * dim, scalar_t(0));
        continue;
      }
      const int64_t g = index / length;
      scalar_t factor = 1;
      if (mean) {
        const int64_t* offset = offset_all + g * (clusters + 1);
        factor = scalar_t(1) / static_cast<scalar_t>(offset[a + 1] - offset[a]);
      }
      const scalar_t* row = x + (g * clusters + a) * dim;
      scalar_t* dst = out + index * dim;
#pragma omp simd
      for (int64_t d = 0; d < dim; ++d) dst[d] = row[d] * factor;
    }
  });
}

at::Tensor cluster_mean(const at::Tensor& x, const at::Tensor& offsets, const at::Tensor& members) {
  attention_ext_checks::check_cluster_mean(x, offsets, members);
  const int64_t batch = x.size(0), heads = x.size(1), length = x.size(2), dim = x.size(3);
  const int64_t clusters = offsets.size(2) - 1;
  const at::Tensor x_c = x.contiguous(), offsets_c = offsets.contiguous(), members_c = members.contiguous();
  at::Tensor out = at::zeros({batch, heads, clusters, dim}, x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "cluster_mean", [&] {
    sum_member_rows<scalar_t>(x_c.data_ptr<scalar_t>(), offsets_c.data_ptr<int64_t>(),
                              members_c.data_ptr<int64_t>(), out.data_ptr<scalar_t>(), batch * heads,
                              clusters, length, dim, /*mean=*/true);
  });
  return out;
}

at::Tensor cluster_mean_backward(const at::Tensor& grad, const at::Tensor& assignment,
                                 const at::Tensor& offsets) {
  attention_ext_checks::check_cluster_mean_backward(grad, assignment, offsets);
  const int64_t batch = grad.size(0), heads = grad.size(1), clusters = grad.size(2), dim = grad.size(3);
  const int64_t length = assignment.size(2);
  const at::Tensor grad_c = grad.contiguous(), assign_c = assignment.contiguous(),
                   offsets_c = offsets.contiguous();
  at::Tensor out = at::empty({batch, heads, length, dim}, grad.options());
  AT_DISPATCH_FLOATING_TYPES(grad.scalar_type(), "cluster_mean_backward", [&] {
    copy_cluster_rows<scalar_t>(grad_c.data_ptr<scalar_t>(), assign_c.data_ptr<int64_t>(),
                                offsets_c.data_ptr<int64_t>(), out.data_ptr<scalar_t>(), batch * heads,
                                clusters, length, dim, /*mean=*/true);
  });
  return out;
}

at::Tensor cluster_broadcast(const at::Tensor& x, const at::Tensor& assignment) {
  attention_ext_checks::check_cluster_broadcast(x, assignment);
  const int64_t batch = x.size(0), heads = x.size(1), clusters = x.size(2), dim = x.size(3);
  const int64_t length = assignment.size(2);
  const at::Tensor x_c = x.contiguous(), assign_c = assignment.contiguous();
  at::Tensor out = at::empty({batch, heads, length, dim}, x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "cluster_broadcast", [&] {
    copy_cluster_rows<scalar_t>(x_c.data_ptr<scalar_t>(), assign_c.data_ptr<int64_t>(), nullptr,
                                out.data_ptr<scalar_t>(), batch * heads, clusters, length, dim,
                                /*mean=*/false);
  });
  return out;
}

at::Tensor cluster_broadcast_backward(const at::Tensor& grad, const at::Tensor& offsets,
                                      const at::Tensor& members) {
  attention_ext_checks::check_cluster_broadcast_backward(grad, offsets, members);
  const int64_t batch = grad.size(0), heads = grad.size(1), length = grad.size(2), dim = grad.size(3);
  const int64_t clusters = offsets.size(2) - 1;
  const at::Tensor grad_c = grad.contiguous(), offsets_c = offsets.contiguous(),
                   members_c = members.contiguous();
  at::Tensor out = at::zeros({batch, heads, clusters, dim}, grad.options());
  AT_DISPATCH_FLOATING_TYPES(grad.scalar_type(), "cluster_broadcast_backward", [&] {
    sum_member_rows<scalar_t>(grad_c.data_ptr<scalar_t>(), offsets_c.data_ptr<int64_t>(),
                              members_c.data_ptr<int64_t>(), out.data_ptr<scalar_t>(), batch * heads,
                              clusters, length, dim, /*mean=*/false);
  });
  return out;
}

// Top-k of each row in two cheap passes instead of a heap update per newcomer. The valid
// positions are split into `classes` strided classes (l mod classes); the k-th largest of
// the class maxima is a lower bound t of the k-th largest weight (the k classes whose
// maxima reach t hold k weights >= t), so the top k are among the few weights >= t,
// which are then sorted. Strided classes make the maxima an elementwise (vectorised)
// maximum of consecutive row segments.
template <typename scalar_t>
void topk_kernel(const scalar_t* ws, const int64_t* len, int64_t* out, int64_t groups, int64_t heads,
                 int64_t rows, int64_t length, int64_t slots) {
  using Entry = std::pair<scalar_t, int64_t>;
  // "a before b" in the final order: larger weight first, then lower position.
  auto better = [](const Entry& a, const Entry& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  constexpr int64_t kBlock = 16;
  at::parallel_for(0, groups * rows, 4, [&](int64_t begin, int64_t end) {
    std::vector<Entry> candidates;
    std::vector<scalar_t> class_max;
    for (int64_t index = begin; index < end; ++index) {
      const int64_t b = index / (heads * rows);
      const int64_t valid = std::max<int64_t>(0, std::min(len[b], length));
      const scalar_t* row = ws + index * length;
      const int64_t kept = std::min(slots, valid);
      if (kept == 0) continue;
      scalar_t threshold = -std::numeric_limits<scalar_t>::infinity();
      if (valid > 2 * kept) {
        threshold = strided_class_floor(row, valid, kept, class_max);
      }
      candidates.clear();
      for (int64_t start = 0; start < valid; start += kBlock) {
        const int64_t stop = std::min(valid, start + kBlock);
        int reaches = 0;
#pragma omp simd reduction(| : reaches)
        for (int64_t l = start; l < stop; ++l) reaches |= row[l] >= threshold;
        if (!reaches) continue;
        for (int64_t l = start; l < stop; ++l)
          if (row[l] >= threshold) candidates.push_back(Entry{row[l], l});
      }
      const int64_t found = std::min<int64_t>(kept, static_cast<int64_t>(candidates.size()));
      std::partial_sort(candidates.begin(), candidates.begin() + found, candidates.end(), better);
      int64_t* dst = out + index * slots;
      for (int64_t s = 0; s < found; ++s) dst[s] = candidates[s].second;
    }
  });
}

// For every row (cluster) the positions of its k largest weights among the valid keys
// (position < length), largest first, ties to the lower position. A row whose sequence
// has fewer than k valid keys lists all of them and fills the remaining slots with -1.
at::Tensor cluster_topk(const at::Tensor& weights, const at::Tensor& lengths, int64_t k) {
  attention_ext_checks::check_cluster_topk(weights, lengths, k);
  const int64_t batch = weights.size(0), heads = weights.size(1), rows = weights.size(2),
                length = weights.size(3);
  const int64_t slots = std::min(k, length);
  const at::Tensor w_c = weights.contiguous(), lengths_c = lengths.contiguous();
  at::Tensor out = at::full({batch, heads, rows, slots}, -1, weights.options().dtype(at::kLong));
  if (out.numel() == 0) return out;
  AT_DISPATCH_FLOATING_TYPES(weights.scalar_type(), "cluster_topk", [&] {
    topk_kernel<scalar_t>(w_c.data_ptr<scalar_t>(), lengths_c.data_ptr<int64_t>(),
                          out.data_ptr<int64_t>(), batch * heads, heads, rows, length, slots);
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(attention_ext, m) {
  m.def("group_by_cluster(Tensor assignment, int clusters) -> (Tensor, Tensor)");
  m.def("cluster_mean(Tensor x, Tensor offsets, Tensor members) -> Tensor");
  m.def("cluster_mean_backward(Tensor grad, Tensor assignment, Tensor offsets) -> Tensor");
  m.def("cluster_broadcast(Tensor x, Tensor assignment) -> Tensor");
  m.def("cluster_broadcast_backward(Tensor grad, Tensor offsets, Tensor members) -> Tensor");
  m.def("cluster_topk(Tensor weights, Tensor lengths, int k) -> Tensor");
}

TORCH_LIBRARY_IMPL(attention_ext, CPU, m) {
  m.impl("group_by_cluster", &group_by_cluster);
  m.impl("cluster_mean", &cluster_mean);
  m.impl("cluster_mean_backward", &cluster_mean_backward);
  m.impl("cluster_broadcast", &cluster_broadcast);
  m.impl("cluster_broadcast_backward", &cluster_broadcast_backward);
  m.impl("cluster_topk", &cluster_topk);
}
