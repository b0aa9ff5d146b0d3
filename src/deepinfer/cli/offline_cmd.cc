// deepinfer offline: the reference's offline flow on the engine — requests → continuous batching with
// chunked prefill → forward (CPU reference backend, or the CUDA backend with --device cuda) → sampling → per-request
// diagnostics (tokens, decode perplexity, finite check, speculative acceptance). Text prompts need tokenizer.json in
// the model directory.
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <sstream>

#include <fmt/format.h>

#include "deepinfer/cli/commands.h"
#include "deepinfer/core/logging.h"
#include "deepinfer/engine/engine.h"
#include "deepinfer/engine/v3_model_runner.h"
#include "deepinfer/engine/v4_model_runner.h"
#include "deepinfer/io/checkpoint.h"
#include "deepinfer/kv/kv_layout.h"
#include "deepinfer/model/deepseek_v3.h"
#include "deepinfer/model/deepseek_v4.h"
#ifdef DEEPINFER_WITH_CUDA
#include "deepinfer/ops/cuda/cuda_backend.h"
#endif
#include "deepinfer/tokenizer/tokenizer.h"

namespace deepinfer::cli {
namespace {

struct OfflineArgs {
  std::string model;
  std::vector<std::string> prompts;
  std::vector<std::string> prompt_ids;
  int num_prompts = 4;
  int max_tokens = 32;
  float temperature = 0.0f;
  float top_p = 1.0f;
  int top_k = 0;
  uint64_t seed = 0;
  int max_num_seqs = 4;
  int64_t max_model_len = 32768;
  int64_t max_num_batched_tokens = 2048;
  int64_t kv_budget_mb = 1024;
  int threads = 0;
  std::string device = "cpu";
  bool ignore_eos = false;
};

// The backend for --device: the CPU reference, or CUDA device 0 (weights, activations and caches in device
// memory; only the logits come back to the host for sampling).
std::unique_ptr<Backend> make_backend(const std::string& device, int threads) {
  if (device == "cpu") return make_cpu_backend(threads);
  DI_CHECK(device == "cuda") << "--device must be cpu or cuda, got '" << device << "'";
#ifdef DEEPINFER_WITH_CUDA
  DI_CHECK_CODE(cuda::device_count() > 0, ErrorCode::kNotFound)
      << "--device cuda: no CUDA device is visible (check nvidia-smi and CUDA_VISIBLE_DEVICES)";
  return make_cuda_backend(0);
#else
  DI_FAIL(ErrorCode::kUnsupported) << "--device cuda: this deepinfer was built without CUDA (configure with "
                                      "-DDEEPINFER_ACCELERATOR=nvidia)";
#endif
}

std::vector<TokenId> parse_ids(const std::string& text, int64_t vocab) {
  std::vector<TokenId> ids;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    char* end = nullptr;
    long long v = std::strtoll(item.c_str(), &end, 10);
    DI_CHECK(end != item.c_str() && *end == '\0') << "--prompt-ids: '" << item << "' is not an integer";
    DI_CHECK(v >= 0 && v < vocab) << "--prompt-ids: token id " << v << " outside the vocabulary (" << vocab << ")";
    ids.push_back(static_cast<TokenId>(v));
  }
  DI_CHECK(!ids.empty()) << "--prompt-ids: empty prompt";
  return ids;
}

std::string escape(const std::string& s) {
  std::string out;
  for (char ch : s) {
    if (ch == '\n') out += "\\n";
    else if (ch == '"') out += "\\\"";
    else out += ch;
  }
  return out;
}

int run_offline(const OfflineArgs& a) {
  const char* env = std::getenv("DEEPINFER_HF_MODEL_DIR");
  ResolvedModel m = resolve_model_dir(a.model.empty() ? std::nullopt : std::optional<std::string>(a.model),
                                      env ? std::optional<std::string>(env) : std::nullopt, embedded_model_dir());
  DI_LOG_INFO("model resolved from {}: {}", m.source, m.dir);
  auto backend = make_backend(a.device, a.threads);
  DI_LOG_INFO("device: {}", a.device);
  // The family in config.json picks the forward and its runner: V3 (V3/R1/V3.1/V2-Lite) or V4/V4.1.
  std::unique_ptr<DeepseekV3Model> v3;
  std::unique_ptr<DeepseekV4Model> v4;
  if (load_model_config(m.dir + "/config.json").family == ModelFamily::kDeepseekV3) {
    // The V3 forward keeps its activations and MLA cache in host memory and CUDA has no MLA kernels yet.
    DI_CHECK_CODE(a.device == "cpu", ErrorCode::kUnsupported)
        << "--device " << a.device << ": the DeepSeek-V3 family runs on the CPU backend only so far";
    v3 = DeepseekV3Model::load(m.dir, *backend);
  } else {
    v4 = DeepseekV4Model::load(m.dir, *backend);
  }
  const ModelConfig& cfg = v3 ? v3->config() : v4->config();
  std::unique_ptr<tokenizer::Tokenizer> tok;
  if (std::filesystem::exists(m.dir + "/tokenizer.json")) tok = tokenizer::Tokenizer::from_file(m.dir + "/tokenizer.json");

  // Prompts: text (tokenized), explicit ids, or deterministic pseudo-random ids when none are given.
  std::vector<std::vector<TokenId>> prompts;
  for (const auto& p : a.prompts) {
    DI_CHECK_CODE(tok != nullptr, ErrorCode::kNotFound)
        << "--prompt needs " << m.dir << "/tokenizer.json; use --prompt-ids with this model";
    prompts.push_back(tok->encode(p));
    DI_CHECK(!prompts.back().empty()) << "prompt '" << p << "' encodes to no tokens";
  }
  for (const auto& p : a.prompt_ids) prompts.push_back(parse_ids(p, cfg.vocab_size));
  if (prompts.empty()) {
    uint64_t s = a.seed * 6364136223846793005ull + 1442695040888963407ull;
    for (int i = 0; i < a.num_prompts; ++i) {
      std::vector<TokenId> ids;
      for (int j = 0; j < 8 + 5 * i; ++j) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        ids.push_back(static_cast<TokenId>((s >> 33) % static_cast<uint64_t>(cfg.vocab_size)));
      }
      prompts.push_back(std::move(ids));
    }
  }

  const int64_t max_model_len = std::min<int64_t>(a.max_model_len, cfg.max_position_embeddings);
  KvLayout layout = make_kv_layout(cfg);
  KvSizing sizing = size_kv_cache(layout, a.kv_budget_mb * 1000 * 1000, a.max_num_seqs, max_model_len);
  log_kv_sizing(layout, sizing, max_model_len);
  EngineConfig ec;
  ec.scheduler.max_num_seqs = a.max_num_seqs;
  ec.scheduler.max_model_len = max_model_len;
  ec.scheduler.max_num_batched_tokens = a.max_num_batched_tokens;
  ec.kv.num_blocks = sizing.num_blocks;
  ec.kv.block_size = layout.block_size;
  ec.kv.num_state_slots = sizing.num_state_slots;
  ec.kv.enable_prefix_cache = v3 ? V3ModelRunner::prefix_cache_supported() : V4ModelRunner::prefix_cache_supported();
  ec.seed = a.seed;
  for (int64_t e : cfg.eos_token_ids) ec.eos_token_ids.push_back(static_cast<TokenId>(e));
  if (tok) ec.detokenize = [&tok](std::span<const TokenId> ids) { return tok->decode(ids); };
  std::unique_ptr<ModelRunner> runner;
  if (v3) {
    runner = std::make_unique<V3ModelRunner>(*v3, sizing.num_state_slots);
  } else {
    runner = std::make_unique<V4ModelRunner>(*v4, sizing.num_state_slots);
  }
  Engine engine(ec, *runner);

  for (size_t i = 0; i < prompts.size(); ++i) {
    Request r;
    r.request_id = std::to_string(i);
    r.prompt_token_ids = prompts[i];
    r.params.temperature = a.temperature;
    r.params.top_p = a.top_p;
    r.params.top_k = a.top_k;
    r.params.max_tokens = a.max_tokens;
    r.params.ignore_eos = a.ignore_eos;
    r.params.logprobs = 0;  // the chosen token's log-probability, for decode perplexity
    engine.add_request(std::move(r));
  }
  const auto t0 = std::chrono::steady_clock::now();
  engine.run_to_completion();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  auto done = engine.take_finished();
  std::sort(done.begin(), done.end(), [](const auto& x, const auto& y) { return std::stoi(x.request_id) < std::stoi(y.request_id); });
  int64_t generated = 0;
  bool all_finite = true;
  for (const auto& d : done) {
    double nll = 0;
    for (const auto& lp : d.logprobs) nll -= lp.logprob;
    const double ppl = d.logprobs.empty() ? 0.0 : std::exp(nll / static_cast<double>(d.logprobs.size()));
    const bool finite = d.stop_reason != StopReason::kError && std::isfinite(ppl);
    all_finite = all_finite && finite;
    generated += static_cast<int64_t>(d.output_token_ids.size());
    std::cout << fmt::format("[sample {}] prompt_tokens={} tokens={} stop={} decode_ppl={:.4f} finite={} "
                             "acceptance_rate=n/a (no draft model)\n",
                             d.request_id, d.prompt_len, d.output_token_ids.size(), stop_reason_name(d.stop_reason),
                             ppl, finite ? "yes" : "NO");
    std::ostringstream ids;
    for (size_t k = 0; k < d.output_token_ids.size(); ++k) ids << (k ? "," : "") << d.output_token_ids[k];
    std::cout << "  ids: " << ids.str() << "\n";
    if (tok) std::cout << "  text: \"" << escape(tok->decode(d.output_token_ids)) << "\"\n";
  }
  const auto& st = engine.stats();
  std::cout << fmt::format("offline: {} requests, {} generated tokens in {:.2f} s ({:.1f} tokens/s), {} steps, "
                           "{} prompt tokens computed, {} preemptions\n",
                           done.size(), generated, secs, generated / std::max(secs, 1e-9), st.steps,
                           st.prompt_tokens_computed, st.preemptions);
  DI_CHECK_CODE(all_finite, ErrorCode::kInternal) << "non-finite values in at least one sample";
  return 0;
}

}  // namespace

void register_offline(CLI::App& app, CommandRegistry& reg) {
  auto* sub = app.add_subcommand("offline", "offline generation through the engine with per-request diagnostics");
  auto a = std::make_shared<OfflineArgs>();
  sub->add_option("--model,--model_name", a->model, "checkpoint directory (default: DEEPINFER_HF_MODEL_DIR, embedded)");
  sub->add_option("--prompt", a->prompts, "text prompt (repeatable; needs tokenizer.json)");
  sub->add_option("--prompt-ids", a->prompt_ids, "comma-separated token ids (repeatable)");
  sub->add_option("--num-prompts", a->num_prompts, "random prompts to run when none are given");
  sub->add_option("--max-tokens", a->max_tokens, "tokens to generate per request")->check(CLI::PositiveNumber);
  sub->add_option("--temperature", a->temperature, "0 = greedy");
  sub->add_option("--top-p", a->top_p);
  sub->add_option("--top-k", a->top_k);
  sub->add_option("--seed", a->seed, "engine seed (deterministic sampling)");
  sub->add_option("--max-num-seqs", a->max_num_seqs)->check(CLI::PositiveNumber);
  sub->add_option("--max-model-len", a->max_model_len)->check(CLI::PositiveNumber);
  sub->add_option("--max-num-batched-tokens", a->max_num_batched_tokens)->check(CLI::PositiveNumber);
  sub->add_option("--kv-budget-mb", a->kv_budget_mb, "host memory for the KV cache (CPU backend)");
  sub->add_option("--threads", a->threads, "CPU threads (0 = all cores)");
  sub->add_option("--device", a->device, "cpu | cuda (GPU 0; needs a CUDA build)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  sub->add_flag("--ignore-eos", a->ignore_eos);
  reg.add(sub, [a] { return run_offline(*a); });
}

}  // namespace deepinfer::cli
