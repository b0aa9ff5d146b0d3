// SlotModelRunner<Model>: runs a model's batches for the engine on any Backend (Model::new_sequence(),
// Model::forward(state, ids) -> f32 logits [rows, vocab]), one per-sequence state per state slot.
//
// Paged models (Model::new_kv_pages()) keep their persistent rows — V3 MLA latents; V4/V4.1 window rows,
// compressed entries and indexer keys — in pages owned by this runner and addressed by each entry's block
// table, so a sequence can start at a prefix hit: Model::start_at(state, start, prefix ids) rebuilds the
// per-sequence state that is not paged (compressor counters, Engram look-back) and the engine re-runs
// Model::prefix_replay_tokens() positions before the hit for the rest (V4's CSA overlap slice, V4.1's decoder
// windows under bounded replay). Models without pages keep their whole cache in the slot; then the engine's
// blocks are only accounting and prefix reuse is off.
#pragma once

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "deepinfer/core/error.h"
#include "deepinfer/engine/model_runner.h"
#include "deepinfer/model/paged_rows.h"

namespace deepinfer {

namespace detail {
template <typename M, typename = void>
struct PagesOf {
  using type = int;  // not paged
  static constexpr bool kPaged = false;
};
template <typename M>
struct PagesOf<M, std::void_t<decltype(std::declval<const M&>().new_kv_pages(true))>> {
  using type = decltype(std::declval<const M&>().new_kv_pages(true));
  static constexpr bool kPaged = true;
};
}  // namespace detail

template <typename Model>
class SlotModelRunner final : public ModelRunner {
 public:
  using State = decltype(std::declval<const Model&>().new_sequence());
  static constexpr bool kPaged = detail::PagesOf<Model>::kPaged;

  SlotModelRunner(const Model& model, int32_t num_slots, ModelRunnerOptions options = {})
      : model_(model), options_(options) {
    DI_CHECK(num_slots > 0) << "the model runner needs at least one state slot";
    slots_.resize(static_cast<size_t>(num_slots));
    if constexpr (kPaged) pages_ = model_.new_kv_pages(!options_.exact_prefill);
  }

  int64_t vocab_size() const override { return model_.config().vocab_size; }
  bool prefix_cache_supported() const override { return kPaged; }
  int prefix_replay_tokens() const override {
    if constexpr (kPaged) return model_.prefix_replay_tokens(!options_.exact_prefill);
    return 0;
  }

  void execute(const ModelBatch& batch, std::span<float> logits) override {
    const int64_t vocab = vocab_size();
    DI_CHECK(static_cast<int64_t>(logits.size()) >= batch.num_logits_rows * vocab)
        << "logits buffer holds " << logits.size() << " values, need " << batch.num_logits_rows * vocab;
    int64_t row = 0;
    // Sequences are independent: each entry advances only its own slot and its own pages' rows, so batch
    // composition cannot change a sequence's logits (batch invariance).
    for (const BatchEntry& e : batch.entries) {
      DI_CHECK_INTERNAL(e.state_slot >= 0 && e.state_slot < static_cast<int32_t>(slots_.size()))
          << "state slot " << e.state_slot << " out of range";
      State& st = slots_[e.state_slot];
      if (e.reset_state) {
        st = model_.new_sequence();
        if constexpr (kPaged) {
          std::vector<int64_t> prefix(e.prefix_token_ids.begin(), e.prefix_token_ids.end());
          DI_CHECK_INTERNAL(static_cast<int64_t>(prefix.size()) == e.start)
              << "sequence " << e.seq_id << " starts at " << e.start << " with " << prefix.size() << " prefix ids";
          model_.start_at(st, e.start, prefix);
        } else {
          DI_CHECK_CODE(e.start == 0, ErrorCode::kUnsupported)
              << "the model runner keeps whole caches per slot and cannot start a sequence at position " << e.start
              << " (disable the prefix cache)";
        }
        if constexpr (requires { st.decoder_from; }) {
          if (!options_.exact_prefill) st.decoder_from = model_.bounded_decoder_from(e.prompt_len);
        }
        if constexpr (requires { st.mla_naive_until; }) st.mla_naive_until = model_.mla_naive_until(e.prompt_len);
      }
      if constexpr (kPaged) {
        st.pages = &pages_;
        st.ref = PageRef{e.block_table, batch.block_size, e.persistent_until};
      }
      DI_CHECK_INTERNAL(st.num_tokens == e.start)
          << "slot " << e.state_slot << " holds " << st.num_tokens << " tokens but the chunk starts at " << e.start;
      const std::vector<int64_t> ids = resolve_token_ids(batch, e);  // a pending token comes from the last step
      const int64_t T = static_cast<int64_t>(ids.size()), layers = model_.config().num_layers;
      int64_t skipped = 0;  // decoder layer-tokens bounded replay leaves out
      if constexpr (requires { st.decoder_from; }) {
        if (model_.decoder_start() >= 0)
          skipped = std::clamp<int64_t>(st.decoder_from - e.start, 0, T) * (layers - model_.decoder_start());
      }
      auto out = model_.forward(st, ids);  // f32 [rows, vocab]: the last rows of the chunk
      const int64_t prompt_tokens = std::clamp<int64_t>(e.prompt_len - e.start, 0, T);  // recompute included
      work_.layer_tokens += prompt_tokens * layers - skipped;
      work_.layer_tokens_skipped += skipped;
      if (e.needs_logits) {
        const int64_t rows = out.shape()[0];
        DI_CHECK_INTERNAL(rows > 0) << "sequence " << e.seq_id << ": no logits for position " << e.end() - 1;
        const float* last = out.template data<float>() + (rows - 1) * vocab;
        std::memcpy(logits.data() + row * vocab, last, static_cast<size_t>(vocab) * sizeof(float));
        ++row;
      }
    }
  }

  ModelWorkStats work_stats() const override { return work_; }

  KvFootprint kv_footprint(int block_size) const override {
    KvFootprint f;
    if constexpr (kPaged) {
      f.bytes_per_block = pages_.bytes_per_block(block_size);
      f.bytes_per_slot = model_.slot_bytes_bound(!options_.exact_prefill);
    }
    return f;
  }
  void set_num_blocks(int32_t num_blocks) override {
    if constexpr (kPaged) pages_.set_max_blocks(num_blocks);
  }
  KvAllocation kv_allocation() const override {
    KvAllocation a;
    if constexpr (kPaged) {
      a.page_bytes = pages_.bytes_allocated();
      for (const State& st : slots_) {
        const int64_t b = model_.slot_bytes(st);
        a.slot_bytes += b;
        a.max_slot_bytes = std::max(a.max_slot_bytes, b);
      }
    }
    return a;
  }

  void release_slot(int32_t slot) override {
    if (slot >= 0 && slot < static_cast<int32_t>(slots_.size())) slots_[slot] = State{};
  }

 private:
  const Model& model_;
  ModelRunnerOptions options_;
  std::vector<State> slots_;
  typename detail::PagesOf<Model>::type pages_{};
  ModelWorkStats work_;
};

}  // namespace deepinfer
