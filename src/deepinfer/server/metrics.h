// Server metrics in the Prometheus text exposition format (GET /metrics). The engine thread records; any I/O
// thread renders. One mutex: recording is a few additions per engine step.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace deepinfer::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double v);
  // Appends the _bucket / _sum / _count lines of `name`.
  void render(const std::string& name, std::string* out) const;
  uint64_t count() const { return count_; }

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bound, not cumulative
  uint64_t count_ = 0;
  double sum_ = 0;
};

struct EngineGauges {
  int running = 0;  // sequences (samples) scheduled
  int waiting = 0;
  double kv_usage = 0;  // fraction of blocks not available
  int64_t prefix_query_tokens = 0;
  int64_t prefix_hit_tokens = 0;
  int64_t preemptions = 0;
  // Speculative decoding (all zero when it is off): verification steps, drafted / accepted tokens, and accepted
  // and accepted tokens by draft position (index 0 = the first draft).
  int64_t spec_steps = 0;
  int64_t spec_draft_tokens = 0;
  int64_t spec_accepted_tokens = 0;
  std::vector<int64_t> spec_draft_per_pos;
  std::vector<int64_t> spec_accepted_per_pos;
};

class Metrics {
 public:
  Metrics();
  void set_gauges(const EngineGauges& g);
  void add_prompt_tokens(int64_t n);
  void add_generation_tokens(int64_t n);
  void observe_ttft(double seconds);
  void observe_inter_token(double seconds);
  void observe_e2e(double seconds);
  void count_finished(const std::string& reason);
  void count_http(int status);
  std::string render(const std::string& model_name) const;

 private:
  mutable std::mutex mu_;
  EngineGauges gauges_;
  int64_t prompt_tokens_ = 0, generation_tokens_ = 0;
  Histogram ttft_, itl_, e2e_;
  std::map<std::string, uint64_t> finished_;
  std::map<int, uint64_t> http_;
};

}  // namespace deepinfer::server
