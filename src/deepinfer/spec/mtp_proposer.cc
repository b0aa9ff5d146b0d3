#include "deepinfer/spec/mtp_proposer.h"

#include "deepinfer/core/error.h"
#include "deepinfer/sampling/sampler.h"

namespace deepinfer::spec {

MtpProposer::MtpProposer(const DeepseekV3Model& model, int32_t num_slots) : model_(model) {
  DI_CHECK_CODE(model.num_mtp_layers() > 0, ErrorCode::kUnsupported)
      << "--speculative mtp: the checkpoint has no MTP weights (num_nextn_predict_layers = "
      << model.config().draft.num_layers << ")";
  DI_CHECK(num_slots > 0) << "MtpProposer needs at least one slot";
  slots_.resize(static_cast<size_t>(num_slots));
}

MtpProposer::Slot& MtpProposer::slot(int32_t s) {
  DI_CHECK_INTERNAL(s >= 0 && s < static_cast<int32_t>(slots_.size())) << "MTP proposer: slot " << s;
  return slots_[s];
}

void MtpProposer::release_slot(int32_t s) {
  if (s >= 0 && s < static_cast<int32_t>(slots_.size())) slots_[s] = Slot{};
}

void MtpProposer::observe(const TargetChunk& c) {
  Slot& st = slot(c.slot);
  const int64_t D = feature_dim(), n = static_cast<int64_t>(c.ids.size());
  DI_CHECK_INTERNAL(c.feature_dim == D && static_cast<int64_t>(c.features.size()) == n * D)
      << "MTP proposer: " << c.features.size() << " feature values for " << n << " positions of width " << D;
  if (c.reset || !st.active) {
    st = Slot{};
    st.active = true;
    st.cache = model_.new_mtp_sequence(c.start);
  }
  // Rows to run: the pending position (its next token is this chunk's first), then every chunk position whose
  // next token is known. Anything the cache holds past that is a rolled-back speculation.
  std::vector<float> hidden;
  std::vector<int64_t> next;
  int64_t first = c.start;  // the position the first row runs at
  if (!st.pending_hidden.empty()) {
    DI_CHECK_INTERNAL(c.start == st.cache.num_tokens + 1 && n > 0)
        << "MTP proposer: chunk at " << c.start << " after a pending position " << st.cache.num_tokens;
    first = st.cache.num_tokens;
    hidden = std::move(st.pending_hidden);
    next.push_back(c.ids[0]);
    st.pending_hidden.clear();
  } else {
    DI_CHECK_INTERNAL(c.start <= st.cache.num_tokens && c.start >= st.cache.kv_base)
        << "MTP proposer: chunk at " << c.start << " but the cache covers [" << st.cache.kv_base << ", "
        << st.cache.num_tokens << ")";
    model_.truncate(st.cache, c.start);
  }
  for (int64_t i = 0; i < n; ++i) {
    const float* h = c.features.data() + i * D;
    if (i + 1 < n || c.next_token) {
      hidden.insert(hidden.end(), h, h + D);
      next.push_back(i + 1 < n ? c.ids[i + 1] : *c.next_token);
    } else {
      st.pending_hidden.assign(h, h + D);
    }
  }
  st.last_logits.clear();
  st.last_hidden.clear();
  if (next.empty()) return;
  DI_CHECK_INTERNAL(first == st.cache.num_tokens)
      << "MTP proposer: rows from " << first << ", cache at " << st.cache.num_tokens;
  HostTensor out_hidden;
  const HostTensor logits = model_.mtp_forward(st.cache, hidden, next, &out_hidden);
  if (!c.next_token) return;  // no draft before the sequence's next token is known
  const int64_t rows = logits.shape()[0], V = logits.shape()[1];
  const float* lr = logits.data<float>() + (rows - 1) * V;
  const float* hr = out_hidden.data<float>() + (rows - 1) * D;
  st.last_logits.assign(lr, lr + V);
  st.last_hidden.assign(hr, hr + D);
}

Draft MtpProposer::propose(const DraftRequest& req) {
  Slot& st = slot(req.slot);
  Draft d;
  if (req.max_tokens <= 0 || st.last_logits.empty()) return d;  // nothing observed yet: verify nothing
  const int64_t exact = st.cache.num_tokens;
  std::vector<float> logits = st.last_logits, hidden = st.last_hidden;
  for (int j = 0; j < req.max_tokens; ++j) {
    const TokenId t = argmax(logits);
    if (t < 0) break;
    d.tokens.push_back(t);
    if (j + 1 == req.max_tokens) break;
    // Chain: the module at the next position, fed its own output hidden and the token it just drafted.
    HostTensor out_hidden;
    const int64_t id = t;
    const HostTensor l = model_.mtp_forward(st.cache, hidden, std::span<const int64_t>(&id, 1), &out_hidden);
    logits.assign(l.data<float>(), l.data<float>() + l.numel());
    hidden.assign(out_hidden.data<float>(), out_hidden.data<float>() + out_hidden.numel());
  }
  model_.truncate(st.cache, exact);  // chained rows are speculative
  return d;
}

}  // namespace deepinfer::spec
