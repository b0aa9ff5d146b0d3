// V3ModelRunner: runs DeepSeek-V3-family batches (V3, R1, V3.1, V2-Lite) for the engine on any Backend. Each
// state slot owns one V3SequenceState (the MLA cache: one latent + rope-key row per token and layer). The CPU
// reference keeps a sequence's whole cache in its slot, so the paged blocks the engine allocates are only
// accounting here and prefix reuse must be off (prefix_cache_supported() is false) until the MLA rows move
// into paged storage — which, unlike V4's compressed state, needs no replay: a row depends on its token only.
#pragma once

#include <memory>
#include <vector>

#include "deepinfer/engine/model_runner.h"
#include "deepinfer/model/deepseek_v3.h"

namespace deepinfer {

class V3ModelRunner final : public ModelRunner {
 public:
  V3ModelRunner(const DeepseekV3Model& model, int32_t num_slots);

  int64_t vocab_size() const override { return model_.config().vocab_size; }
  void execute(const ModelBatch& batch, std::span<float> logits) override;
  void release_slot(int32_t slot) override;
  static constexpr bool prefix_cache_supported() { return false; }

 private:
  const DeepseekV3Model& model_;
  std::vector<V3SequenceState> slots_;
};

}  // namespace deepinfer
