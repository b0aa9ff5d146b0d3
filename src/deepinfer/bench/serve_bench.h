// Serving load generator (`deepinfer bench serve`): streamed /v1/completions requests against a server on
// loopback, with synthetic prompt/output lengths, sent at a Poisson request rate or as a closed loop of at most
// max_concurrency requests in flight, bounded in count and time. Reports vLLM's `bench serve` metrics: request
// and token throughput, TTFT, TPOT, ITL and end-to-end latency (mean / median / p99).
//
// Prompts are token ids (so input lengths are exact on any tokenizer) drawn from the ids of an English passage
// the server's /tokenize returns; outputs are exactly their length (`ignore_eos`). Definitions: TTFT = request sent
// → first streamed chunk with tokens; ITL = gap between consecutive chunks with tokens of one request; TPOT =
// (end-to-end - TTFT) / (output tokens - 1) per request; throughputs = totals / wall time of the run.
//
// Speculative decoding: the server's /metrics counters (deepinfer_spec_decode_*) are read before and after the run;
// when the run verified drafts, the report adds their difference: acceptance rate, mean acceptance length (tokens
// per verification step) and acceptance per draft position (vLLM's `bench serve` shows the same).
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace deepinfer::bench {

enum class LengthDistribution {
  kRandom,    // uniform in [len * (1 - range_ratio), len * (1 + range_ratio)] (vLLM's random dataset)
  kShareGpt,  // log-normal around len: ShareGPT conversations' heavy tail, synthetic (no dataset is read)
};
LengthDistribution parse_length_distribution(const std::string& name);  // "random" | "sharegpt"

struct ServeBenchOptions {
  std::string host = "127.0.0.1";  // loopback only
  uint16_t port = 0;
  std::string api_key;
  std::string model;  // "" = the first of GET /v1/models
  LengthDistribution lengths = LengthDistribution::kRandom;
  int input_len = 128;
  int output_len = 64;
  double range_ratio = 0.5;
  int num_prompts = 64;
  int max_concurrency = 8;
  double request_rate = std::numeric_limits<double>::infinity();  // requests per second (Poisson); inf = closed loop
  double time_limit_s = 600;  // no request starts later; those in flight are cut at the limit
  uint64_t seed = 0;
};

struct LatencyStats {
  int64_t count = 0;
  double mean_ms = 0, median_ms = 0, p99_ms = 0;
};
LatencyStats latency_stats(std::vector<double> seconds);

// The speculative-decoding counters of a deepinfer server's /metrics (all zero without speculation).
struct SpecDecodeStats {
  int64_t steps = 0;                             // verification steps (sequence-steps that verified at least one draft)
  int64_t drafted = 0;                           // draft tokens verified
  int64_t accepted = 0;                          // of them accepted
  std::vector<int64_t> drafted_at, accepted_at;  // by draft position (index 0 = the first draft)

  double acceptance_rate() const;        // accepted / drafted (0 without drafts)
  double mean_accepted_length() const;   // 1 + accepted / steps: tokens a verification step adds (0 without steps)
  double acceptance_at(size_t j) const;  // accepted_at[j] / drafted_at[j] (0 where nothing was drafted)
};
// Parses the deepinfer_spec_decode_* series of a Prometheus text exposition (absent series count as zero).
SpecDecodeStats parse_spec_decode_metrics(const std::string& prometheus_text);
// after - before, per counter and position (a server restart in between is an InvalidArgument).
SpecDecodeStats spec_decode_delta(const SpecDecodeStats& before, const SpecDecodeStats& after);

struct ServeBenchReport {
  std::string model, distribution;
  int num_prompts = 0, completed = 0, failed = 0, max_concurrency = 0;
  double request_rate = 0;
  double wall_s = 0;
  int64_t input_tokens = 0, output_tokens = 0;
  double request_throughput = 0, output_throughput = 0, total_token_throughput = 0;  // per second
  LatencyStats ttft, tpot, itl, e2e;
  std::string first_error;
  SpecDecodeStats spec;  // what the run's requests verified (steps == 0: no speculation, or no /metrics)

  std::string to_json() const;
  std::string table() const;
};

// Validates the options (InvalidArgument naming the option) and runs the benchmark.
ServeBenchReport run_serve_bench(const ServeBenchOptions& o);

// The lengths the run would use: n (input, output) pairs, each at least 1.
std::vector<std::pair<int, int>> sample_lengths(const ServeBenchOptions& o);

}  // namespace deepinfer::bench
