// ModelRunner: the one interface between the engine and a forward pass. The engine hands it a ModelBatch built
// from the step's plan; it returns one row of logits per entry that needs them. Everything the forward pass
// needs about the cache is in the batch: where each sequence's paged entries live (block table) and which
// per-sequence state slot is its own.
//
// Cache addressing (see docs/ENGINE.md): a paged cache kind with ratio r (1 for per-token kinds) keeps the entry
// of token group g of a sequence in block block_table[g*r / block_size] at row (g*r % block_size) / r. A
// per-sequence kind (SWA ring, compressor pending state, Engram look-back) keeps one record per state slot.
//
// Threading: with asynchronous scheduling the engine calls execute and release_slot from one worker thread, in
// step order, while it plans the next step; vocab_size may be called from any thread.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include <optional>

#include "deepinfer/engine/greedy_argmax.h"
#include "deepinfer/kv/block_table.h"
#include "deepinfer/kv/kv_footprint.h"
#include "deepinfer/sampling/sampling_params.h"
#include "deepinfer/spec/proposer.h"

namespace deepinfer {

struct BatchEntry {
  int64_t seq_id = 0;
  std::span<const TokenId> token_ids;    // the tokens at positions [start, start + token_ids.size())
  int64_t start = 0;                     // position of token_ids[0]
  std::span<const BlockId> block_table;  // covers every position < start + token_ids.size()
  int32_t state_slot = -1;
  // The slot's per-sequence state starts empty at `start` (first chunk after admission or preemption); else it
  // continues from the previous chunk of this sequence.
  bool reset_state = false;
  // Positions below this already have persistent (paged) entries, possibly in blocks shared with other
  // sequences: the model runs them only to rebuild per-sequence state ("bounded replay") and must not write
  // their paged entries.
  int64_t persistent_until = 0;
  // The sequence's tokens before `start` (state rebuilt from token ids at a prefix hit: Engram look-back). Set only
  // with reset_state.
  std::span<const TokenId> prefix_token_ids;
  // The sequence's prompt length (V4.1 bounded replay runs the decoder layers on its last window only; a
  // recompute after preemption keeps the same split).
  int64_t prompt_len = 0;
  bool needs_logits = false;  // logits of the last position are wanted
  // Logits rows wanted (with needs_logits): the last num_logits positions, in position order. More than 1 for a
  // speculative verification chunk [t, d_1 .. d_n] (n + 1 rows).
  int32_t num_logits = 1;
  // Asynchronous scheduling: >= 0 when the last token is not known to the host yet: it is the token the previous
  // step sampled from its logits row `pending_row`, found in ModelBatch::prev_sampled_tokens (token_ids holds
  // kPendingToken there). A device runner gathers it from the sampler's output buffer on the device, so step N+1
  // is launched without a host round trip; use resolve_token_ids() on the host.
  int32_t pending_row = -1;
  int64_t end() const { return start + static_cast<int64_t>(token_ids.size()); }
};

// Options of a model runner that change what the forward computes.
struct ModelRunnerOptions {
  // V4.1: run every layer on every prompt token (transformers parity). Off: "decoder SWA bounded replay"
  // (MODELS.md Part A §2.3), the decoder layers run on the last n_win prompt tokens only.
  bool exact_prefill = false;
  // Batched decode steps recorded once per padded shape and replayed (CUDA graphs, model/decode_graphs.h), where
  // the model and backend support it; off = every step launched op by op (vLLM's --enforce-eager).
  bool decode_graphs = true;
  // Run the decode entries of a step together through the model's decode_batch (models with one: the V3 and V4
  // families) where the model allows it. Off: one forward per sequence (the comparison, and a fallback).
  bool batch_decode = true;
  // The greedy fast path (ModelRunner::execute_argmax) reduces the logits rows to their argmax on the device where
  // the runner has device hooks (CUDA) and copies back only those. Off: execute() and the host argmax (the
  // comparison: the full logits rows copied to the host).
  bool device_argmax = true;
};

// Prefill work of the runner so far (prompt positions, including recompute after preemption), in layer-tokens
// (one layer run on one token).
struct ModelWorkStats {
  int64_t layer_tokens = 0;          // layer-tokens run
  int64_t layer_tokens_skipped = 0;  // decoder layer-tokens bounded replay did not run
  // Batched decode steps (ModelRunnerOptions::decode_graphs): recorded, replayed, run eagerly.
  int64_t decode_graph_recordings = 0, decode_graph_replays = 0, decode_steps_eager = 0;
  // Host wall time inside execute() (the model's work, waited for) and in its batched decode part: subtracted from
  // a step's time, what the engine spends around the model.
  double execute_seconds = 0, decode_batch_seconds = 0;
  int64_t decode_batches = 0;
  int64_t batched_decodes = 0;  // decode tokens that ran through the model's decode_batch
  // GPU idle between decode steps (CUDA only: events on the backend's stream when a step's execute begins and ends,
  // engine/gpu_idle.h): per decode step (no prompt position) that followed another step, the gap between the two
  // on the GPU, and the span = the gaps plus those steps' own GPU time. Zero steps on backends without a timeline.
  int64_t gpu_timed_decode_steps = 0;
  double gpu_decode_gap_seconds = 0, gpu_decode_span_seconds = 0;
  // Steps that ran through execute_argmax reducing on the device (the greedy fast path), and through its host
  // fallback.
  int64_t argmax_steps_device = 0, argmax_steps_host = 0;
};

// The placeholder for a token sampled by the previous, still unfinished step (never a valid token id).
inline constexpr TokenId kPendingToken = -1;

struct ModelBatch {
  std::vector<BatchEntry> entries;  // decodes first, then prefill chunks
  int block_size = 0;
  int64_t num_tokens = 0;       // sum of entry lengths
  int64_t num_logits_rows = 0;  // sum of num_logits over the entries with needs_logits
  // The tokens the previous step sampled, one per logits row of that step (what pending_row indexes). On the CPU
  // a host array the sampler filled; a device executor would point at device memory instead.
  std::span<const TokenId> prev_sampled_tokens;
};

// The entry's token ids with a pending last token resolved from batch.prev_sampled_tokens, widened to the models'
// int64 ids. Throws Internal if a pending row is out of range.
std::vector<int64_t> resolve_token_ids(const ModelBatch& batch, const BatchEntry& e);

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;
  virtual int64_t vocab_size() const = 0;
  // Runs the batch and writes fp32 logits, row i for the i-th entry with needs_logits, into `logits`
  // ([num_logits_rows, vocab_size], row-major). A sequence's logits must not depend on the rest of the batch.
  virtual void execute(const ModelBatch& batch, std::span<float> logits) = 0;
  // The greedy fast path (StepExecutor, for a step whose every row is sampled greedily with no processor that
  // needs the host): per logits row its argmax (sampling/sampler.h argmax: lowest id on ties, -inf and NaN
  // skipped, -1 when nothing is left), 1 in `out.non_finite` when the row holds NaN or +inf (the executor's
  // kNonFinite) and, when `out.logprobs` is not empty, the chosen token's logprob (greedy_argmax.h), instead of the
  // rows. The default runs execute() and reduces on the host; a device runner reduces on the device and copies back
  // only these. Every span of `out` holds num_logits_rows entries.
  virtual void execute_argmax(const ModelBatch& batch, const ArgmaxRows& out);
  // The slot's sequence finished or was preempted; its state may be dropped (the next user resets it anyway).
  // Called in step order with execute (after every step that used the slot), on the thread that executes.
  virtual void release_slot(int32_t slot) {}
  virtual ModelWorkStats work_stats() const { return {}; }
  // Prefix reuse: true when the runner's persistent caches live in the engine's blocks (then a sequence can
  // start at a prefix hit); the positions before a hit it must re-run to rebuild per-sequence state.
  virtual bool prefix_cache_supported() const { return false; }
  virtual int prefix_replay_tokens() const { return 0; }
  // The most positions to re-run for a hit past the prompt (a recompute after preemption): the replay grows by the
  // hit's distance past the prompt up to this (V4.1 bounded replay's decoder windows). The engine fills
  // KvCacheConfig::prefix_replay_tokens_past_prompt from it.
  virtual int prefix_replay_tokens_past_prompt() const { return prefix_replay_tokens(); }
  // The bytes its caches take per block of the engine's pool and per state slot, as allocated (cache sizing uses
  // them; see kv_footprint.h). Zero for a runner whose caches are not sized by the engine.
  virtual KvFootprint kv_footprint(int /*block_size*/) const { return {}; }
  // The engine's pool has num_blocks blocks: page storage never grows past them. Called by the Engine's
  // constructor, before any execute.
  virtual void set_num_blocks(int32_t /*num_blocks*/) {}
  // What the caches hold now (pages and slot states), to check kv_footprint against. Not thread-safe with
  // execute: call it between steps of a synchronous engine.
  virtual KvAllocation kv_allocation() const { return {}; }

  // Speculative decoding (docs/SPECULATIVE.md). A runner with a draft proposer drafts on the executing thread;
  // after sampling every step the executor calls commit_step, which truncates the target's caches to the kept
  // positions and feeds the proposer.
  virtual bool speculative() const { return false; }
  virtual spec::Draft propose(const spec::DraftRequest& req);
  // Per batch entry, in order: how many of its positions the sequence keeps (the whole chunk except for a
  // verification chunk with rejected drafts) and the token sampled after them, if any.
  struct Kept {
    int64_t positions = 0;
    std::optional<TokenId> next_token;
  };
  virtual void commit_step(const ModelBatch& batch, std::span<const Kept> kept) {}

 private:
  std::vector<float> argmax_logits_;  // the default execute_argmax's rows, kept between steps
};

}  // namespace deepinfer
