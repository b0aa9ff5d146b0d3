// `deepinfer bench serve` (bench/serve_bench.h): the length distributions, the statistics, a run against an
// in-process server on the embedded tiny model, and the CLI end to end (table + JSON with sane fields).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <thread>

#include <nlohmann/json.hpp>

#include "deepinfer/bench/serve_bench.h"
#include "deepinfer/core/error.h"
#include "server/server_test_util.h"

namespace deepinfer::bench {
namespace {

std::string tiny_model_dir() { return std::string(DEEPINFER_SOURCE_DIR) + "/models/default"; }

TEST(ServeBench, LengthDistributions) {
  ServeBenchOptions o;
  o.num_prompts = 2000;
  o.input_len = 100;
  o.output_len = 50;
  o.range_ratio = 0.5;
  auto r = sample_lengths(o);
  ASSERT_EQ(r.size(), 2000u);
  double in_sum = 0;
  for (auto [in, out] : r) {
    EXPECT_GE(in, 50);
    EXPECT_LE(in, 150);
    EXPECT_GE(out, 25);
    EXPECT_LE(out, 75);
    in_sum += in;
  }
  EXPECT_NEAR(in_sum / 2000, 100, 3);
  EXPECT_EQ(sample_lengths(o), r) << "the same seed gives the same lengths";
  o.lengths = LengthDistribution::kShareGpt;
  auto s = sample_lengths(o);
  std::vector<int> ins;
  for (auto [in, out] : s) ins.push_back(in);
  std::sort(ins.begin(), ins.end());
  EXPECT_NEAR(ins[1000], 100, 12) << "median near --input-len";
  EXPECT_GT(ins[1990], 5 * ins[1000]) << "a heavy tail, as in ShareGPT";
  EXPECT_GE(ins.front(), 1);
  EXPECT_THROW(parse_length_distribution("sharegpt4"), Error);
}

TEST(ServeBench, LatencyStats) {
  std::vector<double> xs;
  for (int i = 1; i <= 100; ++i) xs.push_back(i / 1000.0);  // 1..100 ms, shuffled below
  std::reverse(xs.begin(), xs.end());
  LatencyStats s = latency_stats(xs);
  EXPECT_EQ(s.count, 100);
  EXPECT_NEAR(s.mean_ms, 50.5, 1e-9);
  EXPECT_NEAR(s.median_ms, 50.5, 1e-9);
  EXPECT_NEAR(s.p99_ms, 99, 1e-9);
  EXPECT_EQ(latency_stats({}).count, 0);
}

TEST(ServeBench, RefusesNonLoopbackAndBadOptions) {
  ServeBenchOptions o;
  o.host = "10.1.2.3";
  o.port = 8000;
  EXPECT_THROW(run_serve_bench(o), Error);
  o.host = "127.0.0.1";
  o.max_concurrency = 0;
  EXPECT_THROW(run_serve_bench(o), Error);
}

TEST(ServeBench, RunAgainstTinyModel) {
  auto server = testing::TestServer::start(tiny_model_dir());
  ServeBenchOptions o;
  o.port = server->port;
  o.num_prompts = 6;
  o.max_concurrency = 3;
  o.input_len = 12;
  o.output_len = 6;
  o.request_rate = 50;
  o.time_limit_s = 120;
  ServeBenchReport r = run_serve_bench(o);
  EXPECT_EQ(r.completed, 6) << r.first_error;
  EXPECT_EQ(r.failed, 0) << r.first_error;
  EXPECT_EQ(r.model, "test-model");
  int64_t want_out = 0, want_in = 0;
  for (auto [in, out] : sample_lengths(o)) {
    want_in += in;
    want_out += out;
  }
  EXPECT_EQ(r.output_tokens, want_out) << "ignore_eos: every request generates exactly its length";
  EXPECT_EQ(r.input_tokens, want_in) << "token-id prompts have exactly their length";
  EXPECT_GT(r.wall_s, 0);
  EXPECT_NEAR(r.request_throughput, 6 / r.wall_s, 1e-9);
  EXPECT_NEAR(r.output_throughput, want_out / r.wall_s, 1e-9);
  for (const LatencyStats* s : {&r.ttft, &r.tpot, &r.itl, &r.e2e}) {
    EXPECT_GT(s->count, 0);
    EXPECT_GT(s->mean_ms, 0);
    EXPECT_LE(s->median_ms, s->p99_ms);
  }
  EXPECT_EQ(r.ttft.count, 6);
  EXPECT_LE(r.itl.count, want_out - 6);  // at most one gap per token after the first
  EXPECT_LE(r.ttft.p99_ms, r.e2e.p99_ms);
  // The engine retires a request just after its last bytes reach the client, so wait (bounded) for the count.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (server->engine->active_requests() != 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(server->engine->active_requests(), 0);
}

TEST(ServeBench, SpecDecodeMetricsParseAndDelta) {
  const std::string before =
      "# TYPE deepinfer_spec_decode_num_drafts_total counter\n"
      "deepinfer_spec_decode_num_drafts_total{model_name=\"m\"} 4\n"
      "deepinfer_spec_decode_num_draft_tokens_total{model_name=\"m\"} 8\n"
      "deepinfer_spec_decode_num_accepted_tokens_total{model_name=\"m\"} 5\n"
      "deepinfer_spec_decode_num_draft_tokens_per_pos_total{model_name=\"m\",position=\"0\"} 4\n"
      "deepinfer_spec_decode_num_draft_tokens_per_pos_total{model_name=\"m\",position=\"1\"} 4\n"
      "deepinfer_spec_decode_num_accepted_tokens_per_pos_total{model_name=\"m\",position=\"0\"} 3\n"
      "deepinfer_spec_decode_num_accepted_tokens_per_pos_total{model_name=\"m\",position=\"1\"} 2\n";
  const SpecDecodeStats b = parse_spec_decode_metrics(before);
  EXPECT_EQ(b.steps, 4);
  EXPECT_EQ(b.drafted, 8);
  EXPECT_EQ(b.accepted, 5);
  EXPECT_EQ(b.drafted_at, (std::vector<int64_t>{4, 4}));
  EXPECT_EQ(b.accepted_at, (std::vector<int64_t>{3, 2}));
  EXPECT_DOUBLE_EQ(b.acceptance_rate(), 5.0 / 8);
  EXPECT_DOUBLE_EQ(b.mean_accepted_length(), 1 + 5.0 / 4);
  EXPECT_DOUBLE_EQ(b.acceptance_at(1), 0.5);
  EXPECT_DOUBLE_EQ(b.acceptance_at(7), 0);
  // A third position appears later; the delta is per counter and position.
  std::string after_text = before;
  for (auto [from, to] : std::vector<std::pair<std::string, std::string>>{
           {"drafts_total{model_name=\"m\"} 4", "drafts_total{model_name=\"m\"} 10"},
           {"draft_tokens_total{model_name=\"m\"} 8", "draft_tokens_total{model_name=\"m\"} 24"},
           {"accepted_tokens_total{model_name=\"m\"} 5", "accepted_tokens_total{model_name=\"m\"} 14"},
           {"draft_tokens_per_pos_total{model_name=\"m\",position=\"0\"} 4",
            "draft_tokens_per_pos_total{model_name=\"m\",position=\"0\"} 10"},
           {"draft_tokens_per_pos_total{model_name=\"m\",position=\"1\"} 4",
            "draft_tokens_per_pos_total{model_name=\"m\",position=\"1\"} 10"},
           {"accepted_tokens_per_pos_total{model_name=\"m\",position=\"0\"} 3",
            "accepted_tokens_per_pos_total{model_name=\"m\",position=\"0\"} 8"}}) {
    const size_t at = after_text.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    after_text.replace(at, from.size(), to);
  }
  after_text +=
      "deepinfer_spec_decode_num_draft_tokens_per_pos_total{model_name=\"m\",position=\"2\"} 4\n"
      "deepinfer_spec_decode_num_accepted_tokens_per_pos_total{model_name=\"m\",position=\"2\"} 1\n";
  const SpecDecodeStats d = spec_decode_delta(b, parse_spec_decode_metrics(after_text));
  EXPECT_EQ(d.steps, 6);
  EXPECT_EQ(d.drafted, 16);
  EXPECT_EQ(d.accepted, 9);
  EXPECT_EQ(d.drafted_at, (std::vector<int64_t>{6, 6, 4}));
  EXPECT_EQ(d.accepted_at, (std::vector<int64_t>{5, 0, 1}));
  EXPECT_DOUBLE_EQ(d.mean_accepted_length(), 1 + 9.0 / 6);
  // No speculation: nothing parsed, nothing reported.
  const SpecDecodeStats none = parse_spec_decode_metrics("deepinfer_num_requests_running{model_name=\"m\"} 0\n");
  EXPECT_EQ(none.steps, 0);
  EXPECT_TRUE(none.drafted_at.empty());
  EXPECT_THROW(spec_decode_delta(d, b), Error) << "counters going down (a restarted server) are refused";
}

// The CTest check of the CLI: a few requests against the embedded tiny model served in-process.
TEST(ServeBench, CliReportsTableAndJson) {
  auto r = testing::run_cli(
      "bench serve --threads 1 --num-prompts 4 --max-concurrency 2 --input-len 16 --output-len 8 --dataset "
      "sharegpt --time-limit 120");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("Serving Benchmark Result"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("Median TTFT (ms):"), std::string::npos) << r.output;
  const size_t brace = r.output.find("\n{");
  ASSERT_NE(brace, std::string::npos) << r.output;
  auto j = nlohmann::json::parse(r.output.substr(brace + 1));
  EXPECT_EQ(j["completed"], 4);
  EXPECT_EQ(j["failed"], 0);
  EXPECT_EQ(j["dataset"], "sharegpt");
  EXPECT_GT(j["total_output_tokens"].get<int64_t>(), 0);
  EXPECT_GT(j["output_throughput"].get<double>(), 0);
  for (const char* m : {"ttft", "tpot", "itl", "e2el"}) {
    const double mean = j[std::string("mean_") + m + "_ms"], median = j[std::string("median_") + m + "_ms"],
                 p99 = j[std::string("p99_") + m + "_ms"];
    EXPECT_GT(mean, 0) << m;
    EXPECT_GT(median, 0) << m;
    EXPECT_LE(median, p99) << m;
  }
  EXPECT_FALSE(j.contains("spec_decode")) << "no speculation, no speculative section";
  EXPECT_EQ(r.output.find("Speculative Decoding"), std::string::npos) << r.output;
  auto bad = testing::run_cli("bench serve --host 192.0.2.1 --port 8000 --num-prompts 1");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("loopback"), std::string::npos) << bad.output;
  auto spec_external = testing::run_cli("bench serve --port 8000 --speculative mtp --num-prompts 1");
  EXPECT_NE(spec_external.exit_code, 0);
  EXPECT_NE(spec_external.output.find("--speculative"), std::string::npos) << spec_external.output;
}

// With speculation on the in-process server (the tiny model's MTP layer, 2 drafts), the report carries the
// acceptance of the run's drafts, consistent with itself and with the requests' token counts.
TEST(ServeBench, CliReportsSpeculativeAcceptance) {
  auto r = testing::run_cli(
      "bench serve --threads 1 --num-prompts 3 --max-concurrency 3 --input-len 12 --output-len 10 --range-ratio 0 "
      "--speculative mtp --num-draft-tokens 2 --time-limit 120");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("Speculative Decoding"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("Mean acceptance length:"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("  Position 1:"), std::string::npos) << r.output;
  const size_t brace = r.output.find("\n{");
  ASSERT_NE(brace, std::string::npos) << r.output;
  auto j = nlohmann::json::parse(r.output.substr(brace + 1));
  EXPECT_EQ(j["completed"], 3);
  ASSERT_TRUE(j.contains("spec_decode")) << r.output;
  const auto& s = j["spec_decode"];
  const int64_t steps = s["num_drafts"], drafted = s["num_draft_tokens"], accepted = s["num_accepted_tokens"];
  EXPECT_GT(steps, 0);
  EXPECT_GE(drafted, steps);
  EXPECT_LE(drafted, 2 * steps);
  EXPECT_GE(accepted, 0);
  EXPECT_LE(accepted, drafted);
  const auto per_drafted = s["num_draft_tokens_per_pos"].get<std::vector<int64_t>>();
  const auto per_accepted = s["num_accepted_tokens_per_pos"].get<std::vector<int64_t>>();
  ASSERT_EQ(per_drafted.size(), 2u);
  ASSERT_EQ(per_accepted.size(), 2u);
  EXPECT_EQ(per_drafted[0], steps) << "every verification step verifies a first draft";
  EXPECT_EQ(per_drafted[0] + per_drafted[1], drafted);
  EXPECT_EQ(per_accepted[0] + per_accepted[1], accepted);
  EXPECT_LE(per_accepted[1], per_accepted[0]) << "a second draft is accepted only after the first";
  EXPECT_DOUBLE_EQ(s["acceptance_rate"].get<double>(), static_cast<double>(accepted) / drafted);
  EXPECT_DOUBLE_EQ(s["mean_acceptance_length"].get<double>(), 1 + static_cast<double>(accepted) / steps);
  // Each verification step emits 1 + its accepted drafts; the first token of a request comes from its prompt.
  EXPECT_LE(steps + accepted, j["total_output_tokens"].get<int64_t>() - 3);
}

}  // namespace
}  // namespace deepinfer::bench
