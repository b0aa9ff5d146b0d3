#include "deepinfer/spec/mtp_proposer.h"

#include "deepinfer/core/error.h"
#include "deepinfer/sampling/logits_processors.h"
#include "deepinfer/sampling/sampler.h"

namespace deepinfer::spec {

V3MtpModule::V3MtpModule(const DeepseekV3Model& m) : model(m) {
  DI_CHECK_CODE(m.num_mtp_layers() > 0, ErrorCode::kUnsupported)
      << "--speculative mtp: the checkpoint has no MTP weights (num_nextn_predict_layers = "
      << m.config().draft.num_layers << ")";
}

namespace {

std::vector<float> divided(std::span<const float> logits, float temperature) {
  DI_CHECK(temperature > 0) << "MTP draft distribution: temperature must be > 0, got " << temperature;
  std::vector<float> out(logits.begin(), logits.end());
  for (float& v : out) v /= temperature;
  return out;
}

std::vector<float> as_floats(const std::vector<double>& p) { return std::vector<float>(p.begin(), p.end()); }

}  // namespace

std::vector<float> mtp_draft_distribution(std::span<const float> logits, float temperature) {
  return as_floats(softmax(divided(logits, temperature)));
}

template <typename Module>
BasicMtpProposer<Module>::BasicMtpProposer(const typename Module::Model& model, int32_t num_slots,
                                           MtpDraftSampling sampling)
    : module_(model), sampling_(sampling) {
  DI_CHECK(num_slots > 0) << "MtpProposer needs at least one slot";
  slots_.resize(static_cast<size_t>(num_slots));
}

template <typename Module>
typename BasicMtpProposer<Module>::Slot& BasicMtpProposer<Module>::slot(int32_t s) {
  DI_CHECK_INTERNAL(s >= 0 && s < static_cast<int32_t>(slots_.size())) << "MTP proposer: slot " << s;
  return slots_[s];
}

template <typename Module>
void BasicMtpProposer<Module>::release_slot(int32_t s) {
  if (s >= 0 && s < static_cast<int32_t>(slots_.size())) slots_[s] = Slot{};
}

template <typename Module>
void BasicMtpProposer<Module>::observe(const TargetChunk& c) {
  Slot& st = slot(c.slot);
  const int64_t D = feature_dim(), n = static_cast<int64_t>(c.ids.size());
  DI_CHECK_INTERNAL(c.feature_dim == D && static_cast<int64_t>(c.features.size()) == n * D)
      << "MTP proposer: " << c.features.size() << " feature values for " << n << " positions of width " << D;
  if (c.reset || !st.active) {
    st = Slot{};
    st.active = true;
    st.cache = module_.new_cache(c.start);
  }
  // Rows to run: the pending position (its next token is this chunk's first), then every chunk position whose
  // next token is known. Anything the cache holds past that is a rolled-back speculation.
  std::vector<float> features;
  std::vector<int64_t> next;
  int64_t first = c.start;  // the position the first row runs at
  const int64_t end = Module::end(st.cache);
  if (!st.pending_features.empty()) {
    DI_CHECK_INTERNAL(c.start == end + 1 && n > 0)
        << "MTP proposer: chunk at " << c.start << " after a pending position " << end;
    first = end;
    features = std::move(st.pending_features);
    next.push_back(c.ids[0]);
    st.pending_features.clear();
  } else {
    DI_CHECK_INTERNAL(c.start <= end && c.start >= Module::begin(st.cache))
        << "MTP proposer: chunk at " << c.start << " but the cache covers [" << Module::begin(st.cache) << ", " << end
        << ")";
    module_.truncate(st.cache, c.start);
  }
  for (int64_t i = 0; i < n; ++i) {
    const float* h = c.features.data() + i * D;
    if (i + 1 < n || c.next_token) {
      features.insert(features.end(), h, h + D);
      next.push_back(i + 1 < n ? c.ids[i + 1] : *c.next_token);
    } else {
      st.pending_features.assign(h, h + D);
    }
  }
  st.last_logits.clear();
  st.last_features.clear();
  if (next.empty()) return;
  DI_CHECK_INTERNAL(first == Module::end(st.cache))
      << "MTP proposer: rows from " << first << ", cache at " << Module::end(st.cache);
  HostTensor out_features;
  const HostTensor logits = module_.forward(st.cache, features, next, &out_features);
  if (!c.next_token) return;  // no draft before the sequence's next token is known
  const int64_t rows = logits.shape()[0], V = logits.shape()[1];
  const float* lr = logits.data<float>() + (rows - 1) * V;
  const float* hr = out_features.data<float>() + (rows - 1) * D;
  st.last_logits.assign(lr, lr + V);
  st.last_features.assign(hr, hr + D);
}

template <typename Module>
Draft BasicMtpProposer<Module>::propose(const DraftRequest& req) {
  Slot& st = slot(req.slot);
  Draft d;
  if (req.max_tokens <= 0 || st.last_logits.empty()) return d;  // nothing observed yet: verify nothing
  const float temperature = req.params ? req.params->temperature : 0.0f;
  const bool sampled = sampling_ == MtpDraftSampling::kSampled && temperature > 0;
  const int64_t exact = Module::end(st.cache);
  std::vector<float> logits = st.last_logits, features = st.last_features;
  for (int j = 0; j < req.max_tokens; ++j) {
    TokenId t;
    if (sampled) {
      // q = softmax(logits / T), drawn by the sampler's inverse CDF over the same scaled row.
      const std::vector<float> scaled = divided(logits, temperature);
      t = sample_from_logits(scaled, rng_uniform(req.key, req.position + j, kDraftRngDrawBase));
      d.probs.push_back(as_floats(softmax(scaled)));
    } else {
      t = argmax(logits);
    }
    if (t < 0) {
      if (sampled) d.probs.pop_back();
      break;
    }
    d.tokens.push_back(t);
    if (j + 1 == req.max_tokens) break;
    // Chain: the module at the next position, fed its own output features and the token it just drafted.
    HostTensor out_features;
    const int64_t id = t;
    const HostTensor l = module_.forward(st.cache, features, std::span<const int64_t>(&id, 1), &out_features);
    logits.assign(l.data<float>(), l.data<float>() + l.numel());
    features.assign(out_features.data<float>(), out_features.data<float>() + out_features.numel());
  }
  module_.truncate(st.cache, exact);  // chained rows are speculative
  return d;
}

template class BasicMtpProposer<V3MtpModule>;
template class BasicMtpProposer<V4MtpModule>;

}  // namespace deepinfer::spec
