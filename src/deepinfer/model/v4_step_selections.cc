// V4StepSelections (see the header): forward()'s per-sequence Selection logic over the padded [B, n_max] masks of a
// batched decode step. Padding is harmless to top-k: scores are −inf past a row's entries, −inf picks are dropped and
// ties go to the lower index, so a padded row selects what its own [1, ne] row selects.
#include "deepinfer/model/v4_step_selections.h"

#include "deepinfer/core/dtype.h"

namespace deepinfer {

Tensor row_prefix(const Tensor& t, int64_t b, int64_t n) { return t.row(b).slice(0, n).reshape({1, n}); }

void V4StepSelections::reset(int64_t rows) {
  held_.clear();
  topk_.assign(static_cast<size_t>(rows), {});
  candidates_.assign(static_cast<size_t>(rows), {});
  latest_topk_ = -1;
  latest_counts_.clear();
}

void V4StepSelections::select(Backend& be, TensorMemory& mem, const LayerPlan& plan, const V4AttentionConfig& ac,
                              int ratio, const Tensor& scores, const Tensor& positions, const std::vector<int64_t>& ne,
                              const std::vector<int64_t>& host_positions) {
  const int64_t B = static_cast<int64_t>(ne.size()), n = scores.dim(1);
  Tensor allowed;
  if (plan.candidate_source) {
    OwnedTensor c = mem.zeros(DType::kU8, {B, n});
    be.candidate_blocks({scores, positions, c.view(), ratio, ac.candidate_topk_blocks, ac.candidate_block_size});
    // The block of the newest visible entry is forced in: a row whose query sees past its entries would force a block
    // of padding over [B, n] (none over its own [1, ne]), taking a slot from a real block. Such a row runs alone.
    for (int64_t b = 0; b < B; ++b) {
      if (ne[b] == 0 || (host_positions[b] + 1) / ratio <= ne[b]) continue;
      be.candidate_blocks({row_prefix(scores, b, ne[b]), positions.slice(b, b + 1), row_prefix(c.view(), b, ne[b]),
                           ratio, ac.candidate_topk_blocks, ac.candidate_block_size});
      ++counts_.single_rows;
    }
    publish(candidates_, std::move(c), ne);
  } else if (plan.csa2_role == Csa2Role::kReindex) {
    allowed = candidates_for(mem, ne, n);
  }
  OwnedTensor t = mem.zeros(DType::kU8, {B, n});
  be.topk_mask({scores, allowed, t.view(), ac.index_topk});
  publish(topk_, std::move(t), ne);
}

Tensor V4StepSelections::attended(TensorMemory& mem, const std::vector<int64_t>& ne, int64_t n_max) {
  bool direct = latest_topk_ >= 0 && held_[latest_topk_].shape()[1] == n_max;
  for (size_t b = 0; b < ne.size() && direct; ++b) {
    const bool covers = ne[b] > 0 && topk_[b].n == ne[b];
    // A row attending nothing needs a zero row: one whose sequence had no entries when the top-k was published.
    direct = covers ? topk_[b].at == latest_topk_ : latest_counts_[b] == 0;
  }
  if (direct) {
    ++counts_.direct_masks;
    return held_[latest_topk_].view();
  }
  ++counts_.assembled_masks;
  OwnedTensor m = mem.zeros(DType::kU8, {static_cast<int64_t>(ne.size()), n_max});
  for (size_t b = 0; b < ne.size(); ++b)
    if (ne[b] > 0 && topk_[b].n == ne[b])
      mem.copy(row_prefix(m.view(), b, ne[b]), row_prefix(held_[topk_[b].at].view(), b, ne[b]));
  held_.push_back(std::move(m));
  return held_.back().view();
}

void V4StepSelections::publish(std::vector<RowMask>& rows, OwnedTensor&& mask, const std::vector<int64_t>& ne) {
  held_.push_back(std::move(mask));
  const int at = static_cast<int>(held_.size()) - 1;
  for (size_t b = 0; b < ne.size(); ++b)
    if (ne[b] > 0) rows[b] = {at, ne[b]};
  if (&rows == &topk_) {
    latest_topk_ = at;
    latest_counts_ = ne;
  }
}

// Reindex: a row whose candidates cover exactly its entries is restricted to them; the others are not.
Tensor V4StepSelections::candidates_for(TensorMemory& mem, const std::vector<int64_t>& ne, int64_t n) {
  const int64_t B = static_cast<int64_t>(ne.size());
  int source = -1;  // the candidates tensor of the restricted rows, when they all use one
  bool any = false, direct = true;
  for (int64_t b = 0; b < B; ++b) {
    if (ne[b] == 0) continue;  // all −inf: selects nothing either way
    if (candidates_[b].n != ne[b]) {
      direct = false;
      continue;
    }
    any = true;
    if (source < 0) source = candidates_[b].at;
    direct = direct && source == candidates_[b].at;
  }
  if (!any) return {};
  if (direct && held_[source].shape()[1] == n) {
    ++counts_.direct_allowed;
    return held_[source].view();
  }
  ++counts_.assembled_allowed;
  std::vector<uint8_t> ones(static_cast<size_t>(B * n), 1);
  OwnedTensor a = mem.from_host(DType::kU8, {B, n}, ones.data());
  for (int64_t b = 0; b < B; ++b)
    if (ne[b] > 0 && candidates_[b].n == ne[b])
      mem.copy(row_prefix(a.view(), b, ne[b]), row_prefix(held_[candidates_[b].at].view(), b, ne[b]));
  held_.push_back(std::move(a));
  return held_.back().view();
}

}  // namespace deepinfer
