// `deepinfer bench serve`: the serving load generator (bench/serve_bench.h) against a server on loopback, either
// one already running (--port) or one started in this process on a free loopback port (--model, as `serve`
// would load it). Prints a table and the JSON report (also written to --result-file).
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <memory>
#include <string>

#include "deepinfer/bench/serve_bench.h"
#include "deepinfer/cli/commands.h"
#include "deepinfer/core/error.h"
#include "deepinfer/core/logging.h"
#include "deepinfer/io/checkpoint.h"
#include "deepinfer/server/engine_service.h"
#include "deepinfer/server/http_server.h"

namespace deepinfer::cli {
namespace {

struct BenchServeArgs {
  bench::ServeBenchOptions bench;
  std::string dataset = "random";
  std::string result_file;
  // In-process server (when --port is not given).
  std::string model_arg;
  int threads = 0;
  int64_t kv_budget_mb = 0;
  std::string speculative = "off";  // as `serve` (docs/SPECULATIVE.md)
  int num_draft_tokens = 1;
  std::string draft_sampling = "greedy";
  double draft_confidence_threshold = 0.3;
  int64_t draft_token_budget = 0;
};

int run_bench_serve(BenchServeArgs a) {
  a.bench.lengths = bench::parse_length_distribution(a.dataset);
  std::unique_ptr<server::ModelHost> host;
  std::unique_ptr<server::Metrics> metrics;
  std::unique_ptr<server::EngineService> engine;
  std::unique_ptr<server::ServerApi> api;
  std::unique_ptr<server::HttpServer> http;
  DI_CHECK(a.bench.port == 0 || a.speculative == "off")
      << "bench serve: --speculative configures the server started in this process; with --port the running "
         "server's own settings apply (its /metrics still gives the acceptance)";
  if (a.bench.port == 0) {
    const char* env = std::getenv("DEEPINFER_HF_MODEL_DIR");
    ResolvedModel m = resolve_model_dir(a.model_arg.empty() ? std::nullopt : std::optional<std::string>(a.model_arg),
                                        env ? std::optional<std::string>(env) : std::nullopt, embedded_model_dir());
    server::ModelHostOptions mo;
    mo.model_dir = m.dir;
    mo.threads = a.threads;
    mo.max_num_seqs = a.bench.max_concurrency;
    if (a.kv_budget_mb > 0) mo.kv_budget_mb = a.kv_budget_mb;
    mo.speculative = a.speculative;
    mo.num_draft_tokens = a.num_draft_tokens;
    mo.draft_sampling = a.draft_sampling;
    mo.draft_confidence_threshold = a.draft_confidence_threshold;
    mo.draft_token_budget = a.draft_token_budget;
    host = server::ModelHost::load(mo);
    metrics = std::make_unique<server::Metrics>();
    engine = std::make_unique<server::EngineService>(*host, *metrics,
                                                     server::EngineServiceOptions{a.bench.max_concurrency + 8});
    api = std::make_unique<server::ServerApi>(*host, server::RequestLimits{});
    server::HttpServerOptions ho;
    ho.host = "127.0.0.1";
    ho.port = 0;
    http = std::make_unique<server::HttpServer>(*api, *engine, *metrics, ho);
    http->start();
    a.bench.host = "127.0.0.1";
    a.bench.port = http->port();
    a.bench.api_key.clear();
    DI_LOG_INFO("bench serve: model {} served in this process on 127.0.0.1:{}", m.dir, a.bench.port);
  }
  bench::ServeBenchReport r = bench::run_serve_bench(a.bench);
  if (http) http->stop();
  const std::string json = r.to_json();
  std::printf("%s%s\n", r.table().c_str(), json.c_str());
  if (!a.result_file.empty()) {
    std::ofstream f(a.result_file);
    DI_CHECK(f.good()) << "--result-file: cannot write " << a.result_file;
    f << json << "\n";
  }
  return r.failed == 0 && r.completed > 0 ? 0 : 1;
}

}  // namespace

void register_bench_serve(CLI::App* bench_cmd, CommandRegistry& reg) {
  auto* sub = bench_cmd->add_subcommand(
      "serve", "serving load generator: TTFT / TPOT / ITL / throughput of a loopback server (or one started here)");
  auto a = std::make_shared<BenchServeArgs>();
  sub->add_option("--host", a->bench.host, "server address (loopback only)")->capture_default_str();
  sub->add_option("--port", a->bench.port, "server port; without it a server is started in this process");
  sub->add_option("--api-key", a->bench.api_key, "the server's API key (default DEEPINFER_API_KEY)");
  sub->add_option("--model", a->model_arg, "in-process server: checkpoint directory (default: embedded model)");
  sub->add_option("--threads", a->threads, "in-process server: CPU threads (0 = all cores)");
  sub->add_option("--kv-budget-mb", a->kv_budget_mb, "in-process server: host KV cache budget");
  sub->add_option("--speculative", a->speculative,
                  "in-process server: speculative decoding off | mtp | dspark (as `serve`); the report then shows "
                  "acceptance per draft position from /metrics")
      ->capture_default_str();
  sub->add_option("--num-draft-tokens", a->num_draft_tokens, "in-process server: draft tokens verified per step");
  sub->add_option("--draft-sampling", a->draft_sampling, "in-process server, mtp: greedy | sampled drafts (as `serve`)")
      ->check(CLI::IsMember({"greedy", "sampled"}))
      ->capture_default_str();
  sub->add_option("--draft-confidence-threshold", a->draft_confidence_threshold,
                  "in-process server, dspark: verify the longest draft prefix whose confidence survival stays >= this");
  sub->add_option("--draft-token-budget", a->draft_token_budget,
                  "in-process server, dspark: draft tokens verified per step across the batch at most (0: no cap)");
  sub->add_option("--served-model", a->bench.model, "model id to request (default: the server's first)");
  sub->add_option("--dataset", a->dataset, "length distribution: random (uniform) | sharegpt (log-normal, synthetic)")
      ->capture_default_str();
  sub->add_option("--input-len", a->bench.input_len, "prompt tokens (random: mean; sharegpt: median)")
      ->capture_default_str();
  sub->add_option("--output-len", a->bench.output_len, "generated tokens (random: mean; sharegpt: median)")
      ->capture_default_str();
  sub->add_option("--range-ratio", a->bench.range_ratio, "random: lengths uniform in len * [1 - r, 1 + r]")
      ->capture_default_str();
  sub->add_option("--num-prompts", a->bench.num_prompts, "requests to send")->capture_default_str();
  sub->add_option("--max-concurrency", a->bench.max_concurrency, "requests in flight at most")->capture_default_str();
  sub->add_option("--request-rate", a->bench.request_rate, "requests per second, Poisson arrivals (default: inf)");
  sub->add_option("--time-limit", a->bench.time_limit_s, "seconds: no request starts later, streams are cut")
      ->capture_default_str();
  sub->add_option("--seed", a->bench.seed, "seed of lengths, prompts and arrivals")->capture_default_str();
  sub->add_option("--result-file", a->result_file, "also write the JSON report here");
  reg.add(sub, [a] {
    BenchServeArgs args = *a;
    if (args.bench.api_key.empty())
      if (const char* k = std::getenv("DEEPINFER_API_KEY")) args.bench.api_key = k;
    return run_bench_serve(args);
  });
}

}  // namespace deepinfer::cli
