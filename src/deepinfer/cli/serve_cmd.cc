// deepinfer serve: the OpenAI/Anthropic-compatible HTTP server (src/deepinfer/server) on one model. SIGINT /
// SIGTERM stop accepting, let in-flight requests finish for --drain-timeout seconds, then abort the rest.
#include <pthread.h>
#include <csignal>
#include <cstdlib>

#include "deepinfer/cli/commands.h"
#include "deepinfer/core/logging.h"
#include "deepinfer/io/checkpoint.h"
#include "deepinfer/server/engine_service.h"
#include "deepinfer/server/http_server.h"

namespace deepinfer::cli {
namespace {

struct ServeArgs {
  server::ModelHostOptions model;
  std::string model_arg;
  server::HttpServerOptions http;
  int max_active_requests = 256;
  int max_n = 16;
  int64_t max_tokens = 0;
  int64_t max_body_mb = 8;
  int64_t max_header_kb = 16;
  int64_t max_constraint_kb = 64;
  server::RequestLimits limits;
  double drain_timeout_s = 30;
};

int run_serve(ServeArgs a) {
  const char* env = std::getenv("DEEPINFER_HF_MODEL_DIR");
  ResolvedModel m = resolve_model_dir(a.model_arg.empty() ? std::nullopt : std::optional<std::string>(a.model_arg),
                                      env ? std::optional<std::string>(env) : std::nullopt, embedded_model_dir());
  DI_LOG_INFO("model resolved from {}: {}", m.source, m.dir);
  a.model.model_dir = m.dir;
  a.http.max_body_bytes = static_cast<size_t>(a.max_body_mb) << 20;
  a.http.max_header_bytes = static_cast<size_t>(a.max_header_kb) << 10;
  if (a.http.api_key.empty())
    if (const char* k = std::getenv("DEEPINFER_API_KEY")) a.http.api_key = k;

  // Signals are taken by sigwait on this thread only: block them before any other thread starts.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);

  auto host = server::ModelHost::load(a.model);
  server::Metrics metrics;
  server::EngineService engine(*host, metrics, {a.max_active_requests});
  server::RequestLimits limits = a.limits;
  limits.max_n = a.max_n;
  limits.max_tokens = a.max_tokens;
  limits.max_constraint_bytes = static_cast<size_t>(a.max_constraint_kb) << 10;
  server::ServerApi api(*host, limits);
  server::HttpServer http(api, engine, metrics, a.http);
  http.start();
  DI_LOG_INFO("serving model \"{}\" (max_model_len {}) on http://{}:{}{}", host->name(), host->max_model_len(),
              a.http.host, http.port(), a.http.api_key.empty() ? "" : " (API key required)");
  int sig = 0;
  sigwait(&sigs, &sig);
  DI_LOG_INFO("signal {}: draining {} in-flight requests (up to {} s)", sig, engine.active_requests(),
              a.drain_timeout_s);
  http.stop_accepting();
  engine.drain(std::chrono::milliseconds(static_cast<int64_t>(a.drain_timeout_s * 1000)));
  // The finished requests' last events (final chunk, usage, [DONE]) are written by the I/O threads.
  if (!http.wait_for_replies(std::chrono::seconds(5))) DI_LOG_WARN("drain: replies still being written after 5 s");
  http.stop();
  DI_LOG_INFO("server stopped");
  return 0;
}

}  // namespace

void register_serve(CLI::App& app, CommandRegistry& reg) {
  auto* sub = app.add_subcommand("serve", "OpenAI / Anthropic compatible HTTP server");
  auto a = std::make_shared<ServeArgs>();
  sub->add_option("--model,model", a->model_arg, "checkpoint directory (default: DEEPINFER_HF_MODEL_DIR, embedded)");
  sub->add_option("--served-model-name", a->model.served_model_name, "model id clients use (default: directory name)");
  sub->add_option("--host", a->http.host, "address to bind (default 127.0.0.1; 0.0.0.0 exposes it to the network)");
  sub->add_option("--port", a->http.port, "TCP port (0 = any free port)");
  sub->add_option("--api-key", a->http.api_key,
                  "require this key (Authorization: Bearer / x-api-key); "
                  "default DEEPINFER_API_KEY");
  sub->add_option("--device", a->model.device, "cpu | cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  sub->add_option("--threads", a->model.threads, "CPU threads (0 = all cores)");
  sub->add_option("--max-num-seqs", a->model.max_num_seqs)->check(CLI::PositiveNumber);
  sub->add_option("--max-model-len", a->model.max_model_len)->check(CLI::PositiveNumber);
  sub->add_option("--max-num-batched-tokens", a->model.max_num_batched_tokens)->check(CLI::PositiveNumber);
  sub->add_option("--kv-budget-mb", a->model.kv_budget_mb)->check(CLI::PositiveNumber);
  sub->add_option("--gpu-memory-utilization", a->model.gpu_memory_utilization,
                  "CUDA: share of device memory for weights, activations and the KV cache")
      ->check(CLI::Range(0.0, 1.0));
  sub->add_option("--scheduling-policy", a->model.scheduling_policy,
                  "fcfs | priority (requests' priority, lower first)")
      ->check(CLI::IsMember({"fcfs", "priority"}))
      ->capture_default_str();
  sub->add_option("--seed", a->model.seed, "engine seed for requests without their own");
  add_device_execution_flags(sub, a->model.weight_format, a->model.activation_quant, a->model.enforce_eager,
                             a->model.batch_invariant, a->model.kernel_choices, a->model.kv_cache_dtype);
  sub->add_option("--chat-format", a->model.chat_format, "v3 | v31 | v4 | v41 (default: from config.json)");
  sub->add_option("--speculative", a->model.speculative,
                  "speculative decoding: off | mtp (V3 family or V4-Flash base with an MTP layer) | dspark (V4.1 / "
                  "V4-Flash-0731 with DSpark draft weights)");
  sub->add_option("--num-draft-tokens", a->model.num_draft_tokens, "draft tokens verified per step");
  sub->add_option("--draft-sampling", a->model.draft_sampling,
                  "mtp: greedy (argmax drafts) | sampled (drafts drawn from the MTP module's softmax at the request's "
                  "temperature, verified with that distribution)")
      ->check(CLI::IsMember({"greedy", "sampled"}));
  sub->add_option("--draft-confidence-threshold", a->model.draft_confidence_threshold,
                  "dspark: verify the longest draft prefix whose confidence survival stays >= this (0: all drafts)");
  sub->add_option("--draft-token-budget", a->model.draft_token_budget,
                  "dspark: at most this many draft tokens verified per step across the batch (0: no cap)");
  sub->add_option("--max-active-requests", a->max_active_requests, "in flight at once; more get 429")
      ->check(CLI::PositiveNumber);
  sub->add_option("--max-n", a->max_n, "largest n per request")->check(CLI::Range(1, 128));
  sub->add_option("--max-tokens", a->max_tokens, "largest max_tokens per request (0 = the context)")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--max-body-mb", a->max_body_mb, "largest request body; larger: 413")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  sub->add_option("--max-header-kb", a->max_header_kb, "largest request line + headers; larger: 431")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  sub->add_option("--max-json-depth", a->limits.max_json_depth, "deepest array/object nesting in a body; deeper: 400")
      ->check(CLI::Range(8, 4096))
      ->capture_default_str();
  sub->add_option("--max-constraint-kb", a->max_constraint_kb,
                  "largest structured-output constraint (JSON Schema / regex / grammar text); larger: 400")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  sub->add_option("--io-threads", a->http.io_threads)->check(CLI::PositiveNumber);
  sub->add_option("--drain-timeout", a->drain_timeout_s, "seconds in-flight requests get after SIGTERM");
  reg.add(sub, [a] { return run_serve(*a); });
}

}  // namespace deepinfer::cli
