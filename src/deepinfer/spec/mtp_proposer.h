// MTP draft proposer for the DeepSeek-V3 family (docs/SPECULATIVE.md, MODELS.md Part B §5): the checkpoint's MTP
// module drafts t_{i+2} from the target's final hidden state h_i and t_{i+1}. Its MLA cache covers every verified
// position the target ran for the slot (from the slot's first chunk on: a prefix-cache hit leaves the skipped
// positions out, which only lowers acceptance). Draft k > 1 chains the module on its own output hidden state;
// those chained cache rows are dropped before propose returns. Drafts are greedy (point masses): lossless for
// any temperature by the verifier's rule, with higher acceptance at low temperature.
#pragma once

#include <vector>

#include "deepinfer/core/tensor.h"
#include "deepinfer/model/deepseek_v3.h"
#include "deepinfer/spec/proposer.h"

namespace deepinfer::spec {

class MtpProposer final : public Proposer {
 public:
  // Throws Unsupported when the model's checkpoint has no MTP weights.
  MtpProposer(const DeepseekV3Model& model, int32_t num_slots);

  std::string_view name() const override { return "mtp"; }
  int64_t feature_dim() const override { return model_.config().hidden_size; }
  void observe(const TargetChunk& chunk) override;
  Draft propose(const DraftRequest& req) override;
  void release_slot(int32_t slot) override;

 private:
  struct Slot {
    bool active = false;
    V3SequenceState cache;              // MTP rows for positions [base, cache.num_tokens)
    std::vector<float> pending_hidden;  // h of position cache.num_tokens, waiting for its next token
    // After the last observe with a next token: the module's logits row for the next draft and its output.
    std::vector<float> last_logits;
    std::vector<float> last_hidden;
  };
  Slot& slot(int32_t s);

  const DeepseekV3Model& model_;
  std::vector<Slot> slots_;
};

}  // namespace deepinfer::spec
