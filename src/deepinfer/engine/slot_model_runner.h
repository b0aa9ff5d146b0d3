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
#include <chrono>
#include <concepts>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "deepinfer/core/error.h"
#include "deepinfer/engine/device_step_hooks.h"
#include "deepinfer/engine/greedy_argmax.h"
#include "deepinfer/engine/model_runner.h"
#include "deepinfer/model/decode_graphs.h"
#include "deepinfer/model/paged_rows.h"
#include "deepinfer/parallel/context_parallel.h"

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

// Speculative decoding hooks a model may have (docs/SPECULATIVE.md): the proposer's features of every position
// of a chunk, and exact truncation of a sequence's caches to a prefix of its last chunk (the rollback after
// rejected drafts; V4/V4.1 states record what a chunk changed when their `record_undo` is set). A model without
// truncate cannot speculate.
template <typename M, typename S>
concept HasFeatureForward = requires(const M& m, S& s, std::span<const int64_t> ids, std::vector<float>* f) {
  m.forward_features(s, ids, f);
};
template <typename M, typename S>
concept HasTruncate = requires(const M& m, S& s, int64_t n) {
  m.truncate(s, n);
};

// Batched decode (V3 and V4 families): one token for each of several paged sequences in one call (model-wide
// batching of the per-token work, one paged attention call per layer where the windows are paged).
template <typename M, typename S>
concept HasDecodeBatch = requires(const M& m, S& s, std::span<S* const> seqs, std::span<const int64_t> ids) {
  { m.decode_batchable(s) } -> std::convertible_to<bool>;
  m.decode_batch(seqs, ids);
};

// Decode graphs (model/decode_graphs.h): batched decode steps recorded and replayed on backends that can record.
template <typename M, typename S>
concept HasDecodeGraphs = requires(const M& m, std::span<S* const> seqs, std::span<const int64_t> ids,
                                   DecodeGraphs* g) {
  { m.new_decode_graphs() } -> std::convertible_to<std::unique_ptr<DecodeGraphs>>;
  m.decode_batch(seqs, ids, g);
};

template <typename Model>
class SlotModelRunner final : public ModelRunner {
 public:
  using State = decltype(std::declval<const Model&>().new_sequence());
  static constexpr bool kPaged = detail::PagesOf<Model>::kPaged;

  SlotModelRunner(const Model& model, int32_t num_slots, ModelRunnerOptions options = {})
      : model_(model), options_(options) {
    DI_CHECK(num_slots > 0) << "the model runner needs at least one state slot";
    slots_.resize(static_cast<size_t>(num_slots));
    cp_.resize(static_cast<size_t>(num_slots));
    if constexpr (kPaged) pages_ = model_.new_kv_pages(!options_.exact_prefill);
    // Pages with per-sequence pools (V4's open compressor groups) hold no more sequences than the slots.
    if constexpr (requires { pages_.set_max_sequences(num_slots); }) pages_.set_max_sequences(num_slots);
    if constexpr (HasDecodeGraphs<Model, State>) {
      if (options_.decode_graphs) {
        graphs_ = model_.new_decode_graphs();
        if (!graphs_->enabled()) graphs_.reset();  // the backend cannot record (the CPU)
      }
    }
  }

  // Recorded decode steps (nullptr: none, every step eager).
  const DecodeGraphs* decode_graphs() const { return graphs_.get(); }

  // Device hooks (CUDA: ops/cuda/cuda_step_hooks.h): the GPU timeline of every step, and the greedy fast path's
  // argmax of batched decode logits on the device (with ModelRunnerOptions::device_argmax).
  void set_device_hooks(std::unique_ptr<DeviceStepHooks> hooks) { hooks_ = std::move(hooks); }

  // Turns speculative decoding on: `proposer` drafts for every sequence and observes every chunk.
  void set_proposer(std::unique_ptr<spec::Proposer> proposer) {
    DI_CHECK_CODE(!proposer || (HasTruncate<Model, State>), ErrorCode::kUnsupported)
        << "speculative decoding: rolling back this model's caches after rejected drafts is not implemented yet";
    if (proposer && proposer->feature_dim() > 0) {
      DI_CHECK_CODE((HasFeatureForward<Model, State>), ErrorCode::kUnsupported)
          << "draft proposer '" << proposer->name() << "' needs target features this model does not provide";
    }
    proposer_ = std::move(proposer);
  }
  bool speculative() const override { return proposer_ != nullptr; }
  spec::Draft propose(const spec::DraftRequest& req) override {
    DI_CHECK_CODE(proposer_ != nullptr, ErrorCode::kUnsupported) << "no draft proposer";
    return proposer_->propose(req);
  }

  int64_t vocab_size() const override { return model_.config().vocab_size; }
  bool prefix_cache_supported() const override { return kPaged; }
  int prefix_replay_tokens() const override {
    if constexpr (kPaged) return model_.prefix_replay_tokens(!options_.exact_prefill);
    return 0;
  }
  int prefix_replay_tokens_past_prompt() const override {
    if constexpr (kPaged) return model_.prefix_replay_tokens_past_prompt(!options_.exact_prefill);
    return 0;
  }

  void execute(const ModelBatch& batch, std::span<float> logits) override {
    if (cp_follower_) return follow(batch);
    const int64_t vocab = vocab_size();
    DI_CHECK(static_cast<int64_t>(logits.size()) >= batch.num_logits_rows * vocab)
        << "logits buffer holds " << logits.size() << " values, need " << batch.num_logits_rows * vocab;
    run(batch, logits, nullptr);
  }

  // The greedy fast path: rows from forward() (prefill chunks, unbatched decodes) are reduced on the host as they
  // come back; the batched decode rows on the device when there are hooks (only ids, flags and the
  // chosen tokens' logprobs cross over).
  // device_argmax off: execute() and the host reduction of the copied rows (the comparison).
  void execute_argmax(const ModelBatch& batch, const ArgmaxRows& out) override {
    if (cp_follower_ || !options_.device_argmax) {
      ++work_.argmax_steps_host;
      return ModelRunner::execute_argmax(batch, out);
    }
    out.check_room(batch.num_logits_rows);
    run(batch, {}, &out);
  }

  ModelWorkStats work_stats() const override {
    ModelWorkStats w = work_;
    if (graphs_) {
      w.decode_graph_recordings = graphs_->stats().recorded;
      w.decode_graph_replays = graphs_->stats().replays;
      w.decode_steps_eager = graphs_->stats().eager + graphs_->stats().padded_eager;
    }
    if (hooks_) {
      w.gpu_timed_decode_steps = hooks_->timed_decode_steps();
      w.gpu_decode_gap_seconds = hooks_->decode_gap_seconds();
      w.gpu_decode_span_seconds = hooks_->decode_span_seconds();
    }
    return w;
  }

 private:
  // One step: logits rows into `logits`, or (am set) their argmax into `am`.
  void run(const ModelBatch& batch, std::span<float> logits, const ArgmaxRows* am) {
    const auto t0 = std::chrono::steady_clock::now();
    struct Timer {
      double& total;
      std::chrono::steady_clock::time_point t0;
      ~Timer() { total += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); }
    } timer{work_.execute_seconds, t0};
    // The GPU timeline's events around the step's work (also when it throws, so they stay paired).
    struct Timeline {
      DeviceStepHooks* hooks;
      bool decode;
      ~Timeline() {
        if (hooks) hooks->step_end(decode);
      }
    } timeline{hooks_.get(),
               !batch.entries.empty() && std::all_of(batch.entries.begin(), batch.entries.end(),
                                                     [](const BatchEntry& e) { return e.start >= e.prompt_len; })};
    if (hooks_) hooks_->step_begin();
    bool device_reduced = false;
    const int64_t vocab = vocab_size();
    int64_t row = 0;
    if (proposer_) step_.assign(batch.entries.size(), {});
    size_t entry_index = 0;
    // Decode entries the model can batch wait here and run together after the loop (their logits rows are
    // reserved in entry order).
    std::vector<State*> decode_states;
    std::vector<int64_t> decode_ids, decode_rows;
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
        set_prefill_form(st, e.prompt_len);
        reset_cp(e.state_slot, st, e.start);
      }
      if constexpr (kPaged) {
        st.pages = &pages_;
        st.ref = PageRef{e.block_table, batch.block_size, e.persistent_until};
      }
      if constexpr (requires { st.record_undo; }) st.record_undo = proposer_ != nullptr;
      DI_CHECK_INTERNAL(st.num_tokens == e.start)
          << "slot " << e.state_slot << " holds " << st.num_tokens << " tokens but the chunk starts at " << e.start;
      const std::vector<int64_t> ids = resolve_token_ids(batch, e);  // a pending token comes from the last step
      const int64_t T = static_cast<int64_t>(ids.size()), layers = model_.config().num_layers;
      int64_t skipped = 0;  // decoder layer-tokens bounded replay leaves out
      if constexpr (requires { st.decoder_from; }) {
        if (model_.decoder_start() >= 0)
          skipped = std::clamp<int64_t>(st.decoder_from - e.start, 0, T) * (layers - model_.decoder_start());
      }
      if (proposer_) step_[entry_index].ids = ids;
      if constexpr (HasDecodeBatch<Model, State>) {
        if (options_.batch_decode && !proposer_ && T == 1 && model_.decode_batchable(st)) {
          cp_[e.state_slot] = CpScratch{};  // as forward(): the slot moves on without scratch ranks
          const int64_t prompt_tokens = std::clamp<int64_t>(e.prompt_len - e.start, 0, T);
          work_.layer_tokens += prompt_tokens * layers;
          decode_states.push_back(&st);
          decode_ids.push_back(ids[0]);
          decode_rows.push_back(e.needs_logits ? row : -1);
          if (e.needs_logits) {
            DI_CHECK_INTERNAL(e.num_logits == 1)
                << "sequence " << e.seq_id << ": " << e.num_logits << " logits rows of a 1-token chunk";
            ++row;
          }
          ++entry_index;
          continue;
        }
      }
      auto out = [&] {
        if constexpr (HasFeatureForward<Model, State>) {
          if (proposer_ && proposer_->feature_dim() > 0)
            return model_.forward_features(st, ids, &step_[entry_index].features);
        }
        return forward(e, st, ids);  // f32 [rows, vocab]: the last rows of the chunk
      }();
      ++entry_index;
      const int64_t prompt_tokens = std::clamp<int64_t>(e.prompt_len - e.start, 0, T);  // recompute included
      work_.layer_tokens += prompt_tokens * layers - skipped;
      work_.layer_tokens_skipped += skipped;
      if (e.needs_logits) {
        const int64_t rows = out.shape()[0], want = e.num_logits;
        DI_CHECK_INTERNAL(want >= 1 && want <= T)
            << "sequence " << e.seq_id << ": " << want << " logits rows of a " << T << "-token chunk";
        DI_CHECK_CODE(rows >= want, ErrorCode::kUnsupported) << "sequence " << e.seq_id << ": the model returned "
                                                             << rows << " logits rows, verification needs " << want;
        const float* first = out.template data<float>() + (rows - want) * vocab;
        if (am) {
          for (int64_t i = 0; i < want; ++i) am->put(row + i, std::span<const float>(first + i * vocab, vocab));
        } else {
          std::memcpy(logits.data() + row * vocab, first, static_cast<size_t>(want * vocab) * sizeof(float));
        }
        row += want;
      }
    }
    if constexpr (HasDecodeBatch<Model, State>) {
      if (!decode_states.empty()) {
        Timer decode_timer{work_.decode_batch_seconds, std::chrono::steady_clock::now()};
        ++work_.decode_batches;
        const std::span<State* const> states(decode_states);
        const size_t n = decode_states.size();
        if constexpr (requires(const DeviceLogitsFn* f) {
                        model_.decode_batch(states, decode_ids, graphs_.get(), f);
                      }) {
          if (am && hooks_) {
            // Only B ids, flags (and logprobs) come back, not [B, vocab] floats.
            std::vector<TokenId> tokens(n);
            std::vector<uint8_t> non_finite(n);
            std::vector<float> logprobs(am->wants_logprobs() ? n : 0);
            const ArgmaxRows batch_out{tokens, non_finite, logprobs};
            const DeviceLogitsFn reduce = [&](const Tensor& l) { hooks_->argmax(l, batch_out); };
            model_.decode_batch(states, decode_ids, graphs_.get(), &reduce);
            for (size_t i = 0; i < n; ++i)
              if (decode_rows[i] >= 0) {
                am->tokens[decode_rows[i]] = tokens[i];
                am->non_finite[decode_rows[i]] = non_finite[i];
                if (am->wants_logprobs()) am->logprobs[decode_rows[i]] = logprobs[i];
              }
            device_reduced = true;
          }
        }
        if (!device_reduced) {
          const auto out = [&] {
            if constexpr (HasDecodeGraphs<Model, State>)
              return model_.decode_batch(states, decode_ids, graphs_.get());
            else
              return model_.decode_batch(states, decode_ids);
          }();
          for (size_t i = 0; i < n; ++i) {
            if (decode_rows[i] < 0) continue;
            const float* r = out.template data<float>() + i * vocab;
            if (am)
              am->put(decode_rows[i], std::span<const float>(r, vocab));
            else
              std::memcpy(logits.data() + decode_rows[i] * vocab, r, static_cast<size_t>(vocab) * sizeof(float));
          }
        }
        work_.batched_decodes += static_cast<int64_t>(n);
      }
    }
    if (am) ++(device_reduced ? work_.argmax_steps_device : work_.argmax_steps_host);
  }

 public:
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

  void commit_step(const ModelBatch& batch, std::span<const Kept> kept) override {
    if (!proposer_) return;
    DI_CHECK_INTERNAL(kept.size() == batch.entries.size() && step_.size() == batch.entries.size())
        << "commit_step: " << kept.size() << " kept counts for " << batch.entries.size() << " entries";
    for (size_t i = 0; i < kept.size(); ++i) {
      const BatchEntry& e = batch.entries[i];
      StepEntry& se = step_[i];
      State& st = slots_[e.state_slot];
      const int64_t T = static_cast<int64_t>(se.ids.size()), n = kept[i].positions;
      DI_CHECK_INTERNAL(n >= 1 && n <= T) << "sequence " << e.seq_id << " keeps " << n << " of " << T << " positions";
      if (n < T) {
        if constexpr (HasTruncate<Model, State>) {
          model_.truncate(st, e.start + n);
        } else {
          DI_FAIL(ErrorCode::kInternal) << "sequence " << e.seq_id << ": no rollback for this model";
        }
      }
      std::vector<TokenId> ids(se.ids.begin(), se.ids.begin() + n);
      spec::TargetChunk c;
      c.slot = e.state_slot;
      c.reset = e.reset_state;
      c.prefix_ids = e.prefix_token_ids;
      c.start = e.start;
      c.ids = ids;
      c.feature_dim = proposer_->feature_dim();
      if (c.feature_dim > 0) {
        DI_CHECK_INTERNAL(static_cast<int64_t>(se.features.size()) == T * c.feature_dim)
            << "sequence " << e.seq_id << ": " << se.features.size() << " feature values for " << T << " positions";
        c.features = std::span<const float>(se.features).first(static_cast<size_t>(n * c.feature_dim));
      }
      c.next_token = kept[i].next_token;
      proposer_->observe(c);
    }
    step_.clear();
  }

  void release_slot(int32_t slot) override {
    if (slot >= 0 && slot < static_cast<int32_t>(slots_.size())) {
      slots_[slot] = State{};
      cp_[slot] = CpScratch{};
    }
    if (proposer_) proposer_->release_slot(slot);
  }

  // Context parallelism for prefill (parallel/context_parallel.h): a prompt chunk of a sequence that started at
  // position 0 is split zig-zag across `cp` ranks when it has at least 2·cp tokens; rank 0 runs on the slot's
  // state, ranks 1..cp−1 on scratch states that the prompt's last chunk frees. cp 1 = off.
  //
  // `follower`: this runner hosts one rank > 0 of a CP group whose rank 0 (the engine's runner) lives in another
  // process (one process per GPU, parallel/cp_process_runner.h). It gets the same batches in the same order, makes
  // the same split decisions, runs only the CP prompt chunks (its shard, on a scratch state; the launcher runs only
  // this process's rank) and writes no logits; everything else runs on rank 0 alone. `skipped` (followers only) runs
  // once for every entry rank 0 runs alone: with expert parallelism, the idle forward that pairs rank 0's MoE
  // exchanges.
  void set_context_parallel(int cp, CpLauncher launcher, bool follower = false, std::function<void()> skipped = {}) {
    DI_CHECK(cp >= 1) << "context-parallel size " << cp << " must be >= 1";
    DI_CHECK(cp == 1 || launcher) << "context parallel (cp " << cp << ") needs a launcher";
    DI_CHECK(!follower || cp > 1) << "a context-parallel follower needs cp > 1, got " << cp;
    cp_size_ = cp;
    cp_launcher_ = std::move(launcher);
    cp_follower_ = follower;
    cp_skipped_ = std::move(skipped);
  }
  // Prompt chunks that ran context-parallel so far (tests, logs).
  int64_t cp_chunks() const { return cp_chunks_; }

 private:
  // Ranks 1..cp−1 of a slot's sequence: their states mirror the slot's through position `synced` (−1: none).
  struct CpScratch {
    std::vector<State> ranks;
    int64_t synced = -1;
  };

  void reset_cp(int32_t slot, const State& st, int64_t start) {
    CpScratch& s = cp_[slot];
    s = CpScratch{};
    // A sequence starting at a prefix hit has rows only in the pages; scratch ranks could not read them.
    if (cp_size_ == 1 || start != 0) return;
    for (int r = 1; r < cp_size_; ++r) {
      State h = model_.new_sequence();
      if constexpr (requires { h.decoder_from; }) h.decoder_from = st.decoder_from;
      if constexpr (requires { h.mla_naive_until; }) h.mla_naive_until = st.mla_naive_until;
      s.ranks.push_back(std::move(h));
    }
    s.synced = 0;
  }

  // Prefill form of a new sequence (V4.1 bounded replay's decoder start, V3's naive-MLA span).
  void set_prefill_form(State& st, int64_t prompt_len) const {
    if constexpr (requires { st.decoder_from; }) {
      if (!options_.exact_prefill) st.decoder_from = model_.bounded_decoder_from(prompt_len);
    }
    if constexpr (requires { st.mla_naive_until; }) st.mla_naive_until = model_.mla_naive_until(prompt_len);
  }

  // Whether this chunk runs context-parallel: a prompt chunk of a sequence whose scratch ranks are in step, long
  // enough to give every rank a token. Every rank of the group decides alike from the same batches.
  bool cp_chunk(const BatchEntry& e) const {
    const CpScratch& s = cp_[e.state_slot];
    return e.start < e.prompt_len && s.synced == e.start &&
           cp_splittable(static_cast<int64_t>(e.token_ids.size()), cp_size_);
  }

  // A follower's step (set_context_parallel): the bookkeeping of every entry, the forward of its CP chunks only.
  void follow(const ModelBatch& batch) {
    for (const BatchEntry& e : batch.entries) {
      DI_CHECK_INTERNAL(e.state_slot >= 0 && e.state_slot < static_cast<int32_t>(slots_.size()))
          << "state slot " << e.state_slot << " out of range";
      if (e.reset_state) {
        State st = model_.new_sequence();
        set_prefill_form(st, e.prompt_len);
        reset_cp(e.state_slot, st, e.start);
      }
      if (!cp_chunk(e)) {
        cp_[e.state_slot] = CpScratch{};  // rank 0 runs it alone, as the driver does
        if (cp_skipped_) cp_skipped_();
        continue;
      }
      run_cp(e, nullptr, resolve_token_ids(batch, e));
    }
  }

  auto forward(const BatchEntry& e, State& st, const std::vector<int64_t>& ids) {
    if (!cp_chunk(e)) {
      cp_[e.state_slot] = CpScratch{};  // the slot moves on without the scratch ranks
      // Only the rows this entry reads (a prompt chunk's last one, a verification's draft + 1; none mid-prompt)
      // where the model can compute just those: the head of a long chunk is [T, vocab] otherwise.
      if constexpr (requires { model_.forward(st, ids, nullptr, nullptr, nullptr, int64_t{}); })
        return model_.forward(st, ids, nullptr, nullptr, nullptr, e.needs_logits ? int64_t{e.num_logits} : 0);
      else
        return model_.forward(st, ids);
    }
    return run_cp(e, &st, ids);
  }

  // One CP chunk on the launcher's ranks; rank 0 runs on `st` (the slot's state; nullptr on a follower, which
  // hosts no rank 0) and returns its logits rows, the others on their scratch states.
  auto run_cp(const BatchEntry& e, State* st, const std::vector<int64_t>& ids) {
    CpScratch& s = cp_[e.state_slot];
    const int64_t T = static_cast<int64_t>(ids.size());
    const int n = cp_size_;
    decltype(model_.forward(*st, ids)) out;
    cp_launcher_(n, [&](int rank, const AllGatherBytes& all_gather) {
      DI_CHECK_INTERNAL(rank > 0 || st != nullptr) << "context parallel: a follower asked to run rank 0";
      CpShard shard(rank, n, T, all_gather);
      State& mine = rank == 0 ? *st : s.ranks[static_cast<size_t>(rank - 1)];
      // V4's forward takes a stream-capture pointer before the shard; V3's does not.
      auto rows = [&] {
        if constexpr (requires { model_.forward(mine, ids, nullptr, nullptr, &shard); })
          return model_.forward(mine, ids, nullptr, nullptr, &shard);
        else
          return model_.forward(mine, ids, nullptr, &shard);
      }();
      if (rank == 0) out = std::move(rows);  // rank 0 owns the chunk's last token
    });
    ++cp_chunks_;
    s.synced = e.end();
    if (e.end() >= e.prompt_len) s = CpScratch{};  // decode runs on rank 0 alone
    return out;
  }

  int cp_size_ = 1;
  bool cp_follower_ = false;
  std::function<void()> cp_skipped_;
  CpLauncher cp_launcher_;
  std::vector<CpScratch> cp_;
  int64_t cp_chunks_ = 0;
  const Model& model_;
  ModelRunnerOptions options_;
  std::vector<State> slots_;
  typename detail::PagesOf<Model>::type pages_{};
  ModelWorkStats work_;
  // Speculative decoding: what commit_step needs of each entry of the step just executed.
  struct StepEntry {
    std::vector<int64_t> ids;
    std::vector<float> features;  // [T, proposer feature_dim]
  };
  std::unique_ptr<spec::Proposer> proposer_;
  std::vector<StepEntry> step_;
  std::unique_ptr<DecodeGraphs> graphs_;
  std::unique_ptr<DeviceStepHooks> hooks_;
};

}  // namespace deepinfer
