#include "deepinfer/server/metrics.h"

#include <fmt/format.h>

namespace deepinfer::server {

Histogram::Histogram(std::vector<double> upper_bounds) : bounds_(std::move(upper_bounds)), counts_(bounds_.size()) {}

void Histogram::observe(double v) {
  for (size_t i = 0; i < bounds_.size(); ++i) {
    if (v <= bounds_[i]) {
      ++counts_[i];
      break;
    }
  }
  ++count_;
  sum_ += v;
}

void Histogram::render(const std::string& name, std::string* out) const {
  uint64_t cum = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cum += counts_[i];
    *out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, bounds_[i], cum);
  }
  *out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {}\n{}_count {}\n", name, count_, name, sum_, name, count_);
}

Metrics::Metrics()
    : ttft_({0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
             80.0}),
      itl_({0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0}),
      e2e_({0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0}) {}

void Metrics::set_gauges(const EngineGauges& g) {
  std::lock_guard<std::mutex> lock(mu_);
  gauges_ = g;
}
void Metrics::add_prompt_tokens(int64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  prompt_tokens_ += n;
}
void Metrics::add_generation_tokens(int64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  generation_tokens_ += n;
}
void Metrics::observe_ttft(double s) {
  std::lock_guard<std::mutex> lock(mu_);
  ttft_.observe(s);
}
void Metrics::observe_inter_token(double s) {
  std::lock_guard<std::mutex> lock(mu_);
  itl_.observe(s);
}
void Metrics::observe_e2e(double s) {
  std::lock_guard<std::mutex> lock(mu_);
  e2e_.observe(s);
}
void Metrics::count_finished(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  ++finished_[reason];
}
void Metrics::count_http(int status) {
  std::lock_guard<std::mutex> lock(mu_);
  ++http_[status];
}

std::string Metrics::render(const std::string& model) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string o;
  auto head = [&](const char* name, const char* type, const char* help) {
    o += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  };
  const std::string lbl = fmt::format("{{model_name=\"{}\"}}", model);
  head("deepinfer_num_requests_running", "gauge", "Sequences in the running batch.");
  o += fmt::format("deepinfer_num_requests_running{} {}\n", lbl, gauges_.running);
  head("deepinfer_num_requests_waiting", "gauge", "Sequences waiting to be scheduled (including preempted).");
  o += fmt::format("deepinfer_num_requests_waiting{} {}\n", lbl, gauges_.waiting);
  head("deepinfer_kv_cache_usage_perc", "gauge", "Fraction of KV-cache blocks in use (1 = full).");
  o += fmt::format("deepinfer_kv_cache_usage_perc{} {}\n", lbl, gauges_.kv_usage);
  head("deepinfer_prefix_cache_queries_total", "counter", "Prompt tokens looked up in the prefix cache.");
  o += fmt::format("deepinfer_prefix_cache_queries_total{} {}\n", lbl, gauges_.prefix_query_tokens);
  head("deepinfer_prefix_cache_hits_total", "counter", "Prompt tokens found in the prefix cache.");
  o += fmt::format("deepinfer_prefix_cache_hits_total{} {}\n", lbl, gauges_.prefix_hit_tokens);
  head("deepinfer_prefix_cache_hit_rate", "gauge", "prefix_cache_hits_total / prefix_cache_queries_total.");
  o += fmt::format(
      "deepinfer_prefix_cache_hit_rate{} {}\n", lbl,
      gauges_.prefix_query_tokens ? static_cast<double>(gauges_.prefix_hit_tokens) / gauges_.prefix_query_tokens : 0.0);
  head("deepinfer_num_preemptions_total", "counter", "Sequences preempted (recompute).");
  o += fmt::format("deepinfer_num_preemptions_total{} {}\n", lbl, gauges_.preemptions);
  head("deepinfer_spec_decode_num_drafts_total", "counter", "Speculative verification steps (sequence-steps).");
  o += fmt::format("deepinfer_spec_decode_num_drafts_total{} {}\n", lbl, gauges_.spec_steps);
  head("deepinfer_spec_decode_num_draft_tokens_total", "counter", "Draft tokens verified.");
  o += fmt::format("deepinfer_spec_decode_num_draft_tokens_total{} {}\n", lbl, gauges_.spec_draft_tokens);
  head("deepinfer_spec_decode_num_accepted_tokens_total", "counter", "Draft tokens accepted.");
  o += fmt::format("deepinfer_spec_decode_num_accepted_tokens_total{} {}\n", lbl, gauges_.spec_accepted_tokens);
  head("deepinfer_spec_decode_acceptance_rate", "gauge",
       "spec_decode_num_accepted_tokens_total / spec_decode_num_draft_tokens_total (0 without drafts).");
  o += fmt::format("deepinfer_spec_decode_acceptance_rate{} {}\n", lbl,
                   gauges_.spec_draft_tokens > 0 ? static_cast<double>(gauges_.spec_accepted_tokens) /
                                                       static_cast<double>(gauges_.spec_draft_tokens)
                                                 : 0.0);
  head("deepinfer_spec_decode_num_draft_tokens_per_pos_total", "counter",
       "Draft tokens verified by position (acceptance at a position = accepted / verified there).");
  for (size_t i = 0; i < gauges_.spec_draft_per_pos.size(); ++i)
    o += fmt::format("deepinfer_spec_decode_num_draft_tokens_per_pos_total{{model_name=\"{}\",position=\"{}\"}} {}\n",
                     model, i, gauges_.spec_draft_per_pos[i]);
  head("deepinfer_spec_decode_num_accepted_tokens_per_pos_total", "counter", "Accepted draft tokens by position.");
  for (size_t i = 0; i < gauges_.spec_accepted_per_pos.size(); ++i)
    o +=
        fmt::format("deepinfer_spec_decode_num_accepted_tokens_per_pos_total{{model_name=\"{}\",position=\"{}\"}} {}\n",
                    model, i, gauges_.spec_accepted_per_pos[i]);
  head("deepinfer_prompt_tokens_total", "counter", "Prompt tokens of admitted requests.");
  o += fmt::format("deepinfer_prompt_tokens_total{} {}\n", lbl, prompt_tokens_);
  head("deepinfer_generation_tokens_total", "counter", "Generated tokens.");
  o += fmt::format("deepinfer_generation_tokens_total{} {}\n", lbl, generation_tokens_);
  head("deepinfer_request_success_total", "counter", "Finished samples by finish reason.");
  for (const auto& [r, n] : finished_)
    o += fmt::format("deepinfer_request_success_total{{model_name=\"{}\",finished_reason=\"{}\"}} {}\n", model, r, n);
  head("deepinfer_http_requests_total", "counter", "HTTP responses by status code.");
  for (const auto& [s, n] : http_) o += fmt::format("deepinfer_http_requests_total{{status=\"{}\"}} {}\n", s, n);
  head("deepinfer_time_to_first_token_seconds", "histogram", "Arrival to first generated token.");
  ttft_.render("deepinfer_time_to_first_token_seconds", &o);
  head("deepinfer_inter_token_latency_seconds", "histogram", "Time between consecutive tokens of a sample.");
  itl_.render("deepinfer_inter_token_latency_seconds", &o);
  head("deepinfer_e2e_request_latency_seconds", "histogram", "Arrival to the last token of a sample.");
  e2e_.render("deepinfer_e2e_request_latency_seconds", &o);
  return o;
}

}  // namespace deepinfer::server
