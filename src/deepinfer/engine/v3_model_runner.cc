#include "deepinfer/engine/v3_model_runner.h"

#include <cstring>

#include "deepinfer/core/error.h"

namespace deepinfer {

V3ModelRunner::V3ModelRunner(const DeepseekV3Model& model, int32_t num_slots) : model_(model) {
  DI_CHECK(num_slots > 0) << "V3ModelRunner needs at least one state slot";
  slots_.resize(static_cast<size_t>(num_slots));
}

void V3ModelRunner::execute(const ModelBatch& batch, std::span<float> logits) {
  const int64_t vocab = vocab_size();
  DI_CHECK(static_cast<int64_t>(logits.size()) >= batch.num_logits_rows * vocab)
      << "logits buffer holds " << logits.size() << " values, need " << batch.num_logits_rows * vocab;
  int64_t row = 0;
  // Sequences are independent: each entry advances only its own slot, so batch composition cannot change a
  // sequence's logits (batch invariance).
  for (const BatchEntry& e : batch.entries) {
    DI_CHECK_INTERNAL(e.state_slot >= 0 && e.state_slot < static_cast<int32_t>(slots_.size()))
        << "state slot " << e.state_slot << " out of range";
    V3SequenceState& st = slots_[e.state_slot];
    if (e.reset_state) {
      DI_CHECK_CODE(e.start == 0, ErrorCode::kUnsupported)
          << "V3ModelRunner keeps whole caches per slot and cannot start a sequence at position " << e.start
          << " (disable the prefix cache)";
      st = model_.new_sequence();
    }
    DI_CHECK_INTERNAL(st.num_tokens == e.start)
        << "slot " << e.state_slot << " holds " << st.num_tokens << " tokens but the chunk starts at " << e.start;
    std::vector<int64_t> ids(e.token_ids.begin(), e.token_ids.end());
    HostTensor out = model_.forward(st, ids);  // f32 [T, vocab]
    if (e.needs_logits) {
      const float* last = out.data<float>() + (static_cast<int64_t>(ids.size()) - 1) * vocab;
      std::memcpy(logits.data() + row * vocab, last, static_cast<size_t>(vocab) * sizeof(float));
      ++row;
    }
  }
}

void V3ModelRunner::release_slot(int32_t slot) {
  if (slot >= 0 && slot < static_cast<int32_t>(slots_.size())) slots_[slot] = V3SequenceState{};
}

}  // namespace deepinfer
