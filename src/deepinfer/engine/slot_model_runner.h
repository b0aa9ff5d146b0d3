// SlotModelRunner<Model>: runs a model's batches for the engine on any Backend, one whole per-sequence cache
// state per state slot (Model::new_sequence(), Model::forward(state, ids) -> f32 logits [T, vocab]). The
// reference models keep a sequence's whole cache in its slot, so the paged blocks the engine allocates are
// only accounting here and prefix reuse must be off (prefix_cache_supported() is false) until the models'
// persistent entries move into paged storage.
#pragma once

#include <cstring>
#include <utility>
#include <vector>

#include "deepinfer/core/error.h"
#include "deepinfer/engine/model_runner.h"

namespace deepinfer {

template <typename Model>
class SlotModelRunner final : public ModelRunner {
 public:
  using State = decltype(std::declval<const Model&>().new_sequence());

  SlotModelRunner(const Model& model, int32_t num_slots) : model_(model) {
    DI_CHECK(num_slots > 0) << "the model runner needs at least one state slot";
    slots_.resize(static_cast<size_t>(num_slots));
  }

  int64_t vocab_size() const override { return model_.config().vocab_size; }
  static constexpr bool prefix_cache_supported() { return false; }

  void execute(const ModelBatch& batch, std::span<float> logits) override {
    const int64_t vocab = vocab_size();
    DI_CHECK(static_cast<int64_t>(logits.size()) >= batch.num_logits_rows * vocab)
        << "logits buffer holds " << logits.size() << " values, need " << batch.num_logits_rows * vocab;
    int64_t row = 0;
    // Sequences are independent: each entry advances only its own slot, so batch composition cannot change a
    // sequence's logits (batch invariance).
    for (const BatchEntry& e : batch.entries) {
      DI_CHECK_INTERNAL(e.state_slot >= 0 && e.state_slot < static_cast<int32_t>(slots_.size()))
          << "state slot " << e.state_slot << " out of range";
      State& st = slots_[e.state_slot];
      if (e.reset_state) {
        DI_CHECK_CODE(e.start == 0, ErrorCode::kUnsupported)
            << "the model runner keeps whole caches per slot and cannot start a sequence at position " << e.start
            << " (disable the prefix cache)";
        st = model_.new_sequence();
      }
      DI_CHECK_INTERNAL(st.num_tokens == e.start)
          << "slot " << e.state_slot << " holds " << st.num_tokens << " tokens but the chunk starts at " << e.start;
      std::vector<int64_t> ids(e.token_ids.begin(), e.token_ids.end());
      auto out = model_.forward(st, ids);  // f32 [T, vocab]
      if (e.needs_logits) {
        const float* last = out.template data<float>() + (static_cast<int64_t>(ids.size()) - 1) * vocab;
        std::memcpy(logits.data() + row * vocab, last, static_cast<size_t>(vocab) * sizeof(float));
        ++row;
      }
    }
  }

  void release_slot(int32_t slot) override {
    if (slot >= 0 && slot < static_cast<int32_t>(slots_.size())) slots_[slot] = State{};
  }

 private:
  const Model& model_;
  std::vector<State> slots_;
};

}  // namespace deepinfer
