#include "deepinfer/spec/dspark_proposer.h"

#include <algorithm>
#include <cmath>

#include "deepinfer/core/error.h"

namespace deepinfer::spec {

DsparkProposer::DsparkProposer(const DeepseekV4Model& model, int32_t num_slots) : model_(model), draft_(model) {
  DI_CHECK(num_slots > 0) << "DsparkProposer needs at least one slot";
  slots_.resize(static_cast<size_t>(num_slots));
}

int64_t DsparkProposer::feature_dim() const {
  return static_cast<int64_t>(draft_.target_layers().size()) * model_.config().hidden_size;
}

DsparkProposer::Slot& DsparkProposer::slot(int32_t s) {
  DI_CHECK_INTERNAL(s >= 0 && s < static_cast<int32_t>(slots_.size())) << "DSpark proposer: slot " << s;
  return slots_[s];
}

const DsparkContext* DsparkProposer::context(int32_t s) const {
  if (s < 0 || s >= static_cast<int32_t>(slots_.size()) || !slots_[s].active) return nullptr;
  return &slots_[s].ctx;
}

void DsparkProposer::release_slot(int32_t s) {
  if (s >= 0 && s < static_cast<int32_t>(slots_.size())) slots_[s] = Slot{};
}

void DsparkProposer::observe(const TargetChunk& c) {
  Slot& st = slot(c.slot);
  const int64_t F = feature_dim(), n = static_cast<int64_t>(c.ids.size());
  DI_CHECK_INTERNAL(c.feature_dim == F && static_cast<int64_t>(c.features.size()) == n * F)
      << "DSpark proposer: " << c.features.size() << " feature values for " << n << " positions of width " << F;
  if (c.reset || !st.active) {
    st = Slot{};
    st.active = true;
    st.ctx = draft_.new_context();
  }
  // A chunk that starts inside what the cache holds re-covers positions (rollback), within the ring's slack;
  // anything further back restarts the cache.
  if (c.start < st.ctx.num_positions) {
    try {
      draft_.truncate(st.ctx, c.start);
    } catch (const Error&) {
      st.ctx = draft_.new_context();
    }
  }
  // Positions without target features (before a bounded-replay decoder segment) arrive as NaN rows: they stay
  // out of the cache.
  int64_t first = 0;
  while (first < n && std::isnan(c.features[first * F])) ++first;
  TensorMemory& mem = model_.memory();
  if (first < n) {
    OwnedTensor rows = mem.from_host(DType::kF32, {n - first, F}, c.features.data() + first * F);
    draft_.append_context(st.ctx, rows.view(), c.start + first);
  } else {
    draft_.append_context(st.ctx, Tensor(nullptr, DType::kF32, {0, F}), c.start + n);
  }
  st.anchor = c.next_token;
}

Draft DsparkProposer::propose(const DraftRequest& req) {
  Slot& st = slot(req.slot);
  Draft d;
  if (req.max_tokens <= 0 || !st.active || !st.anchor) return d;
  DI_CHECK_INTERNAL(req.position == st.ctx.num_positions + 1)
      << "DSpark proposer: drafting at position " << req.position << " after a cache of " << st.ctx.num_positions;
  const int n = std::min(req.max_tokens, draft_.block_size());
  const DsparkProposal p = draft_.propose(st.ctx, *st.anchor, n, [](int, std::span<const float> row) {
    return static_cast<int64_t>(std::max_element(row.begin(), row.end()) - row.begin());
  });
  d.tokens.assign(p.tokens.begin(), p.tokens.end());
  d.confidence = p.confidence;
  return d;
}

}  // namespace deepinfer::spec
