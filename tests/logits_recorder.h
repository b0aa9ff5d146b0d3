// A ModelRunner wrapper for engine tests: forwards to a runner and keeps every logits row it produced, per
// sequence, in order; after_step (optional) runs after each step with the step count, on_batch before each batch.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <vector>

#include "deepinfer/engine/model_runner.h"

namespace deepinfer::testing {

class LogitsRecorder final : public ModelRunner {
 public:
  explicit LogitsRecorder(ModelRunner& inner) : inner_(inner) {}
  int64_t vocab_size() const override { return inner_.vocab_size(); }
  void execute(const ModelBatch& batch, std::span<float> logits) override {
    if (on_batch) on_batch(batch);
    inner_.execute(batch, logits);
    int64_t row = 0;
    const int64_t v = vocab_size();
    for (const BatchEntry& e : batch.entries) {
      if (!e.needs_logits) continue;
      rows[e.seq_id].emplace_back(logits.begin() + row * v, logits.begin() + (row + 1) * v);
      ++row;
    }
    if (after_step) after_step(++steps);
  }
  void release_slot(int32_t slot) override { inner_.release_slot(slot); }
  bool prefix_cache_supported() const override { return inner_.prefix_cache_supported(); }
  int prefix_replay_tokens() const override { return inner_.prefix_replay_tokens(); }
  ModelWorkStats work_stats() const override { return inner_.work_stats(); }
  int prefix_replay_tokens_past_prompt() const override { return inner_.prefix_replay_tokens_past_prompt(); }
  std::map<int64_t, std::vector<std::vector<float>>> rows;
  std::function<void(int)> after_step;
  std::function<void(const ModelBatch&)> on_batch;  // optional: sees every batch before it runs
  int steps = 0;

 private:
  ModelRunner& inner_;
};

}  // namespace deepinfer::testing
