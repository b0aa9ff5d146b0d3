// DSpark draft proposer for DeepSeek-V4.1 and V4-Flash-0731 (docs/SPECULATIVE.md, model/dspark_draft.h). Per
// slot it keeps the draft's context cache, fed by observe() with the target's averaged attention-input streams
// of the verified positions (DeepseekV4Model::forward_features), and the anchor: the token sampled after them.
// propose() runs the block pass for the anchor and the sequential Markov head: up to block_size drafts with
// their confidences, which the confidence policy turns into a verification length. Drafts are greedy (point
// masses), so verification is lossless at any temperature.
#pragma once

#include <optional>
#include <vector>

#include "deepinfer/model/dspark_draft.h"
#include "deepinfer/spec/proposer.h"

namespace deepinfer::spec {

class DsparkProposer final : public Proposer {
 public:
  // Throws Unsupported when the model cannot draft with DSpark (DsparkDraft::unavailable_reason).
  DsparkProposer(const DeepseekV4Model& model, int32_t num_slots);

  std::string_view name() const override { return "dspark"; }
  int64_t feature_dim() const override;
  void observe(const TargetChunk& chunk) override;
  Draft propose(const DraftRequest& req) override;
  void release_slot(int32_t slot) override;

  const DsparkContext* context(int32_t slot) const;  // for tests

 private:
  struct Slot {
    bool active = false;
    DsparkContext ctx;
    std::optional<TokenId> anchor;  // the token at position ctx.num_positions, once sampled
  };
  Slot& slot(int32_t s);

  const DeepseekV4Model& model_;
  DsparkDraft draft_;
  std::vector<Slot> slots_;
};

}  // namespace deepinfer::spec
