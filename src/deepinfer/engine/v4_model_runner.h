// V4ModelRunner: runs DeepSeek-V4 / V4.1 batches for the engine on any Backend. Each state slot owns one
// V4SequenceState (SWA rings, compressor state, compressed entries, indexer keys, Engram look-back): the CPU
// reference keeps a sequence's whole cache in its slot, so the paged blocks the engine allocates are only
// accounting here and prefix reuse must be off (prefix_cache_supported() is false) until the compressed
// entries move into paged storage.
#pragma once

#include <memory>
#include <vector>

#include "deepinfer/engine/model_runner.h"
#include "deepinfer/model/deepseek_v4.h"

namespace deepinfer {

class V4ModelRunner final : public ModelRunner {
 public:
  V4ModelRunner(const DeepseekV4Model& model, int32_t num_slots);

  int64_t vocab_size() const override { return model_.config().vocab_size; }
  void execute(const ModelBatch& batch, std::span<float> logits) override;
  void release_slot(int32_t slot) override;
  static constexpr bool prefix_cache_supported() { return false; }

 private:
  const DeepseekV4Model& model_;
  std::vector<V4SequenceState> slots_;
};

}  // namespace deepinfer
