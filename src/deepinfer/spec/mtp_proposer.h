// MTP draft proposers (docs/SPECULATIVE.md): the checkpoint's MTP module drafts t_{i+2} from the target's features
// at position i and t_{i+1}. DeepSeek-V3 family (MODELS.md Part B §5): features = the final hidden state h_i, one
// MLA block. DeepSeek-V4-Flash base (Part A §4, model/v4_mtp_draft.h): features = the hc streams before hc_head,
// one SWA-only V4 block. The module's cache covers every verified position the target ran for the slot (from the
// slot's first chunk on: a prefix-cache hit leaves the skipped positions out, which only lowers acceptance).
// Draft k > 1 chains the module on its own output features; those chained cache rows are dropped before propose
// returns.
//
// Drafts are greedy (point masses; lossless at any temperature by the verifier's rule) unless the proposer samples
// (MtpDraftSampling::kSampled): then a request with temperature T > 0 gets drafts drawn from q = softmax(logits / T)
// of the module with the sequence's random stream (draws >= kDraftRngDrawBase), and q goes with them to the
// verifier's rejection sampler; greedy requests still get argmax drafts.
#pragma once

#include <span>
#include <vector>

#include "deepinfer/core/tensor.h"
#include "deepinfer/model/deepseek_v3.h"
#include "deepinfer/model/v4_mtp_draft.h"
#include "deepinfer/spec/proposer.h"

namespace deepinfer::spec {

enum class MtpDraftSampling { kGreedy, kSampled };

// What the proposer needs from an MTP module: a per-slot cache over positions [begin, end), the module's forward
// on features + next tokens (logits and output features), and truncation.
struct V3MtpModule {
  using Model = DeepseekV3Model;
  using Cache = V3SequenceState;
  explicit V3MtpModule(const DeepseekV3Model& m);  // throws Unsupported without MTP weights
  int64_t feature_dim() const { return model.config().hidden_size; }
  Cache new_cache(int64_t base) const { return model.new_mtp_sequence(base); }
  static int64_t begin(const Cache& c) { return c.kv_base; }
  static int64_t end(const Cache& c) { return c.num_tokens; }
  void truncate(Cache& c, int64_t n) const { model.truncate(c, n); }
  HostTensor forward(Cache& c, std::span<const float> features, std::span<const int64_t> next, HostTensor* out) const {
    return model.mtp_forward(c, features, next, out);
  }
  const DeepseekV3Model& model;
};

struct V4MtpModule {
  using Model = DeepseekV4Model;
  using Cache = V4MtpCache;
  explicit V4MtpModule(const DeepseekV4Model& m) : draft(m) {}  // throws Unsupported without MTP weights
  int64_t feature_dim() const { return draft.feature_dim(); }
  Cache new_cache(int64_t base) const { return draft.new_cache(base); }
  static int64_t begin(const Cache& c) { return c.kv_base; }
  static int64_t end(const Cache& c) { return c.num_tokens; }
  void truncate(Cache& c, int64_t n) const { draft.truncate(c, n); }
  HostTensor forward(Cache& c, std::span<const float> features, std::span<const int64_t> next, HostTensor* out) const {
    return draft.forward(c, features, next, out);
  }
  V4MtpDraft draft;
};

template <typename Module>
class BasicMtpProposer final : public Proposer {
 public:
  BasicMtpProposer(const typename Module::Model& model, int32_t num_slots,
                   MtpDraftSampling sampling = MtpDraftSampling::kGreedy);

  std::string_view name() const override { return "mtp"; }
  int64_t feature_dim() const override { return module_.feature_dim(); }
  void observe(const TargetChunk& chunk) override;
  Draft propose(const DraftRequest& req) override;
  void release_slot(int32_t slot) override;

 private:
  struct Slot {
    bool active = false;
    typename Module::Cache cache;         // module rows for positions [begin, end)
    std::vector<float> pending_features;  // features of position end(cache), waiting for its next token
    // After the last observe with a next token: the module's logits row for the next draft and its output.
    std::vector<float> last_logits;
    std::vector<float> last_features;
  };
  Slot& slot(int32_t s);

  Module module_;
  MtpDraftSampling sampling_;
  std::vector<Slot> slots_;
};

using MtpProposer = BasicMtpProposer<V3MtpModule>;    // DeepSeek-V3 family
using V4MtpProposer = BasicMtpProposer<V4MtpModule>;  // DeepSeek-V4-Flash base

// The draft distribution of a sampled MTP draft: softmax(logits / temperature) (temperature > 0).
std::vector<float> mtp_draft_distribution(std::span<const float> logits, float temperature);

}  // namespace deepinfer::spec
