// Sequence: the engine-owned state of one sample of one request. Plain data; the Engine mutates it between
// steps and the Scheduler only reads it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "deepinfer/engine/request.h"
#include "deepinfer/kv/block_table.h"
#include "deepinfer/kv/kv_cache_manager.h"

namespace deepinfer {

struct StructuredState;  // structured_output.h

// One lifecycle, in order. kRunning covers the prefill chunks (also the recompute after a preemption);
// kDecoding starts once every token but the newest sampled one is in the cache. A preempted sequence has
// dropped its cache (recompute policy) and waits again, ahead of newer arrivals.
enum class SequenceStatus : uint8_t { kWaiting, kRunning, kDecoding, kPreempted, kFinished };
std::string_view sequence_status_name(SequenceStatus s);

struct Sequence {
  int64_t id = 0;  // engine-unique and increasing with arrival: the FCFS order
  std::string request_id;
  int sample_index = 0;
  std::shared_ptr<const SamplingParams> params;
  int priority = 0;  // Request::priority (the priority scheduling policy serves lower values first)

  std::vector<TokenId> tokens;  // prompt then output
  int64_t prompt_len = 0;
  // Cache entries exist for positions [0, num_computed). The next step computes from here.
  int64_t num_computed = 0;
  // Positions below this had their persistent (paged) entries from the prefix cache: a replayed chunk must not
  // rewrite them (the blocks may be shared).
  int64_t persistent_until = 0;

  SequenceStatus status = SequenceStatus::kWaiting;
  StopReason stop_reason = StopReason::kNone;
  std::string stop_string;

  BlockTable block_table;
  PrefixCursor prefix_cursor;
  int32_t state_slot = -1;   // per-sequence cache state (SWA ring, compressor state); -1 while not running
  bool reset_state = false;  // the next chunk starts the slot's state afresh

  // Asynchronous scheduling: tokens sampled by launched steps whose results are not processed yet (0 to 2). The
  // scheduler counts them (num_tokens) without knowing their values; the newest one is the sample of logits row
  // `pending_row` of the last launched step. `final_pending`: the newest pending token reaches max_tokens or
  // max_model_len, so the sequence finishes when it lands and must not be scheduled again.
  int num_pending = 0;
  int32_t pending_row = -1;
  bool final_pending = false;
  bool registered = false;  // the step executor holds its sampling history

  std::vector<SampleResult> logprobs;           // per output token, when requested
  std::shared_ptr<StructuredState> structured;  // set when params->structured is active
  int64_t num_cached_prompt_tokens = 0;
  int num_preemptions = 0;
  SpecStats spec;
  int num_allocation_failures = 0;  // consecutive failed block allocations (Engine::commit)
  // Speculative decoding: the last chunk ran sampled its next token, so a draft proposer has observed every
  // position before the newest token and knows that token (not so after a prompt or recompute chunk that did not
  // end the sequence, whose one-token remainder is not a decode the proposer can draft for).
  bool last_chunk_sampled = false;

  // Tokens once every pending sample lands: what the scheduler plans with.
  int64_t num_tokens() const { return num_known() + num_pending; }
  // Tokens whose values are known (prompt and processed outputs).
  int64_t num_known() const { return static_cast<int64_t>(tokens.size()); }
  int64_t num_output() const { return num_known() - prompt_len; }
  bool finished() const { return status == SequenceStatus::kFinished; }
  bool waiting() const { return status == SequenceStatus::kWaiting || status == SequenceStatus::kPreempted; }
  // Only the newest token (possibly still pending) is missing from the cache: the next step is a one-token decode.
  bool is_decode() const { return !waiting() && num_computed == num_tokens() - 1; }
  std::span<const TokenId> prompt() const { return {tokens.data(), static_cast<size_t>(prompt_len)}; }
  std::span<const TokenId> output() const { return {tokens.data() + prompt_len, static_cast<size_t>(num_output())}; }
};

}  // namespace deepinfer
