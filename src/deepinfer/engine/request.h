// Request: what the API layer (CLI, server, Python) hands the engine, and the deltas it streams back.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "deepinfer/sampling/sampler.h"
#include "deepinfer/sampling/sampling_params.h"

namespace deepinfer {

// Why a sequence finished. kNone while it runs.
enum class StopReason : uint8_t {
  kNone,
  kEos,          // the model's EOS token (not with ignore_eos)
  kStopToken,    // one of params.stop_token_ids
  kStopString,   // one of params.stop matched the detokenized output
  kMaxTokens,    // params.max_tokens outputs
  kMaxModelLen,  // prompt + output reached max_model_len
  kAborted,      // Engine::abort
  kError,        // the model produced non-finite logits for this sequence
  // Structured output: no sampleable token is left. kGrammarComplete: the output is a complete sentence of the
  // grammar, nothing may follow and EOS is not allowed (ignore_eos, min_tokens). kGrammarDeadEnd: the output is
  // incomplete and no token of the vocabulary continues it (e.g. the grammar needs a character no token spells).
  kGrammarComplete,
  kGrammarDeadEnd,
};
std::string_view stop_reason_name(StopReason r);

struct Request {
  std::string request_id;  // unique among unfinished requests
  std::vector<TokenId> prompt_token_ids;
  SamplingParams params;
  // The priority scheduling policy serves lower values first (ties in arrival order), as vLLM's; FCFS ignores it.
  int priority = 0;
  // Informational (latency metrics); arrival (FCFS) order is the order of add_request calls.
  std::chrono::steady_clock::time_point arrival_time = std::chrono::steady_clock::now();
};

// New tokens of one sample of one request, produced by one engine step. The final delta of a sample has
// finished = true (possibly with no new tokens, e.g. on abort).
struct SequenceDelta {
  std::string request_id;
  int sample_index = 0;
  std::vector<TokenId> new_token_ids;
  std::vector<SampleResult> logprobs;  // one per new token when params.logprobs is set
  bool finished = false;
  StopReason stop_reason = StopReason::kNone;
  std::string stop_string;  // the stop string that matched (kStopString)
};
using StreamCallback = std::function<void(const SequenceDelta&)>;

// A finished sample, kept until Engine::take_finished.
struct CompletedSequence {
  std::string request_id;
  int sample_index = 0;
  int64_t prompt_len = 0;
  std::vector<TokenId> output_token_ids;
  std::vector<SampleResult> logprobs;
  StopReason stop_reason = StopReason::kNone;
  std::string stop_string;
  int64_t num_cached_prompt_tokens = 0;  // persistent cache entries taken from the prefix cache at admission
  int num_preemptions = 0;
};

}  // namespace deepinfer
