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
  kError,        // non-finite logits, a failed step (e.g. ResourceExhausted) or repeated KV allocation failures
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
// Speculative decoding counters. Position j counts the verification steps that verified a draft at j (0-based)
// and those that accepted it; accepted tokens = sum of accepted_at. The per-position vectors are as long as the
// longest verification so far (at most k; shorter when the policy or the per-step draft budget never let k through).
struct SpecStats {
  int64_t steps = 0;  // verification steps (decode steps that verified at least one draft)
  int64_t drafted = 0;
  int64_t accepted = 0;
  std::vector<int64_t> drafted_at, accepted_at;
  void add(int drafted_n, int accepted_n) {
    if (drafted_n <= 0) return;
    ++steps;
    drafted += drafted_n;
    accepted += accepted_n;
    if (drafted_at.size() < static_cast<size_t>(drafted_n)) {
      drafted_at.resize(drafted_n, 0);
      accepted_at.resize(drafted_n, 0);
    }
    for (int j = 0; j < drafted_n; ++j) ++drafted_at[j];
    for (int j = 0; j < accepted_n; ++j) ++accepted_at[j];
  }
  // Accepted / verified drafts; tokens per verification step (accepted + 1).
  double acceptance_rate() const { return drafted > 0 ? static_cast<double>(accepted) / drafted : 0.0; }
  double mean_accepted_length() const { return steps > 0 ? 1.0 + static_cast<double>(accepted) / steps : 0.0; }
};

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
  SpecStats spec;  // this sample's speculative decoding counters
};

}  // namespace deepinfer
