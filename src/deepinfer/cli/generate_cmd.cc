// deepinfer generate: ad-hoc generation through the Engine. Every prompt (--prompt, --prompts-file lines,
// --prompt-ids) is submitted at once and the engine batches them (continuous batching, chunked prefill).
// Results are printed in input order: plain text by default, or one JSON object per request with --json.
#include <algorithm>
#include <chrono>
#include <iostream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "deepinfer/cli/commands.h"
#include "deepinfer/cli/engine_setup.h"
#include "deepinfer/cli/structured_check.h"
#include "deepinfer/core/error.h"
#include "deepinfer/core/logging.h"

namespace deepinfer::cli {
namespace {

struct GenerateArgs {
  EngineSetupArgs setup;
  std::vector<std::string> prompts;
  std::string prompts_file;
  std::vector<std::string> prompt_ids;
  int max_tokens = 16;
  float temperature = 0.0f;
  float top_p = 1.0f;
  int top_k = 0;
  std::optional<uint64_t> seed;
  bool ignore_eos = false;
  bool stop_at_eos = false;
  bool json = false;
  StructuredFlags structured;
};

struct Prompt {
  std::optional<std::string> text;  // absent for --prompt-ids
  std::vector<TokenId> ids;
};

int run_generate(const GenerateArgs& a) {
  // Sampling parameters are checked before the model loads, so a typo fails fast.
  SamplingParams params;
  params.temperature = a.temperature;
  params.top_p = a.top_p;
  params.top_k = a.top_k;
  params.seed = a.seed;
  params.max_tokens = a.max_tokens;
  params.ignore_eos = a.ignore_eos;
  params.logprobs = 0;  // the chosen token's log-probability, for decode perplexity
  params.structured = structured_params_from_flags(a.structured);
  validate(params);
  DI_CHECK(!(a.ignore_eos && a.stop_at_eos)) << "--ignore-eos and --stop-at-eos contradict each other";
  std::vector<std::string> texts = a.prompts;
  if (!a.prompts_file.empty())
    for (auto& p : read_prompts_file(a.prompts_file)) texts.push_back(std::move(p));
  DI_CHECK(!texts.empty() || !a.prompt_ids.empty())
      << "no prompt: give --prompt TEXT, --prompts-file FILE or --prompt-ids 1,2,3";

  EngineSetup setup(a.setup);
  const int64_t vocab = setup.config().vocab_size;
  std::vector<Prompt> prompts;
  for (size_t i = 0; i < texts.size(); ++i)
    prompts.push_back({texts[i], setup.encode(texts[i], fmt::format("prompt {}", i))});
  for (const auto& p : a.prompt_ids) prompts.push_back({std::nullopt, parse_token_ids(p, vocab, "--prompt-ids")});

  Engine& engine = setup.engine();
  for (size_t i = 0; i < prompts.size(); ++i) {
    Request r;
    r.request_id = std::to_string(i);
    r.prompt_token_ids = prompts[i].ids;
    r.params = params;
    engine.add_request(std::move(r));
  }
  const auto t0 = std::chrono::steady_clock::now();
  engine.run_to_completion();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::vector<CompletedSequence> done = engine.take_finished();
  std::sort(done.begin(), done.end(),
            [](const auto& x, const auto& y) { return std::stoll(x.request_id) < std::stoll(y.request_id); });
  DI_CHECK_INTERNAL(done.size() == prompts.size()) << done.size() << " results for " << prompts.size() << " prompts";

  int64_t generated = 0;
  for (size_t i = 0; i < done.size(); ++i) {
    const CompletedSequence& d = done[i];
    generated += static_cast<int64_t>(d.output_token_ids.size());
    const double ppl = decode_perplexity(d.logprobs);
    if (a.json) {
      nlohmann::json j;
      j["index"] = i;
      if (prompts[i].text) j["prompt"] = *prompts[i].text;
      j["prompt_token_ids"] = prompts[i].ids;
      j["token_ids"] = d.output_token_ids;
      j["text"] = setup.tokenizer() ? nlohmann::json(setup.decode(d.output_token_ids)) : nlohmann::json(nullptr);
      j["finish_reason"] = stop_reason_name(d.stop_reason);
      if (!d.stop_string.empty()) j["stop_string"] = d.stop_string;
      j["num_prompt_tokens"] = d.prompt_len;
      j["num_tokens"] = d.output_token_ids.size();
      j["decode_ppl"] = ppl;
      // Tokens decoded from partial UTF-8 sequences are replaced rather than failing the whole line.
      std::cout << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
      continue;
    }
    std::string ids;
    for (size_t k = 0; k < d.output_token_ids.size(); ++k)
      ids += (k ? "," : "") + std::to_string(d.output_token_ids[k]);
    std::cout << fmt::format("[{}] ids: {}\n", i, ids);
    if (setup.tokenizer())
      std::cout << fmt::format("[{}] text: {}\n", i, quote_for_display(setup.decode(d.output_token_ids)));
    std::cout << fmt::format("[{}] prompt_tokens={} tokens={} finish={} decode_ppl {:.4f}\n", i, d.prompt_len,
                             d.output_token_ids.size(), stop_reason_name(d.stop_reason), ppl);
  }
  const EngineStats& st = engine.stats();
  std::cerr << fmt::format(
      "generate: {} requests; {} prompt tokens, {} generated tokens in {:.3f} s "
      "({:.1f} generated tokens/s), {} steps\n",
      done.size(), st.prompt_tokens_computed, generated, secs, generated / std::max(secs, 1e-9), st.steps);
  std::cerr << prefill_work_line(st) << "\n";
  return 0;
}

}  // namespace

void register_generate(CLI::App& app, CommandRegistry& reg) {
  auto* sub = app.add_subcommand("generate", "generate from one or more prompts through the engine (batched)");
  auto a = std::make_shared<GenerateArgs>();
  EngineSetupArgs& s = a->setup;
  sub->add_option("--model", s.model, "checkpoint directory (default: DEEPINFER_HF_MODEL_DIR, embedded)");
  sub->add_option("--prompt", a->prompts, "text prompt (repeatable; needs tokenizer.json in the model directory)");
  sub->add_option("--prompts-file", a->prompts_file, "file with one text prompt per line");
  sub->add_option("--prompt-ids", a->prompt_ids, "comma-separated prompt token ids (repeatable)");
  sub->add_option("--max-tokens", a->max_tokens, "tokens to generate per request")->capture_default_str();
  sub->add_option("--temperature", a->temperature, "0 = greedy")->capture_default_str();
  sub->add_option("--top-p", a->top_p, "nucleus sampling, in (0, 1]")->capture_default_str();
  sub->add_option("--top-k", a->top_k, "keep the k most likely tokens (0 = off)")->capture_default_str();
  sub->add_option("--seed", a->seed, "per-request seed: the same tokens whatever else is in the batch");
  sub->add_option("--max-num-seqs", s.max_num_seqs, "sequences batched together")->capture_default_str();
  sub->add_option("--max-model-len", s.max_model_len, "prompt + output tokens per sequence")->capture_default_str();
  sub->add_option("--max-num-batched-tokens", s.max_num_batched_tokens, "tokens per engine step")
      ->capture_default_str();
  sub->add_option("--kv-budget-mb", s.kv_budget_mb, "host memory for the KV cache (CPU backend)")
      ->capture_default_str();
  sub->add_option("--threads", s.threads, "CPU threads (0: all cores)")->capture_default_str();
  sub->add_option("--device", s.device, "cpu | cuda (GPU 0; needs a CUDA build)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  sub->add_option("--engram-token-map", s.engram_token_map_file,
                  "safetensors file holding engram.token_map (V4.1 Engram; default: built from tokenizer.json)");
  sub->add_option("--scheduling-policy", s.scheduling_policy, "fcfs | priority (requests' priority, lower first)")
      ->check(CLI::IsMember({"fcfs", "priority"}))
      ->capture_default_str();
  sub->add_flag("!--no-async-scheduling", s.async_scheduling,
                "plan each step only after the previous one finished (default: plan step N+1 while step N runs)");
  add_device_execution_flags(sub, s.weight_format, s.activation_quant, s.enforce_eager, s.batch_invariant,
                             s.kernel_choices, s.kv_cache_dtype);
  sub->add_flag("--ignore-eos", a->ignore_eos, "keep generating past EOS until --max-tokens");
  sub->add_flag("--stop-at-eos", a->stop_at_eos, "stop at an EOS token (the default; kept for old scripts)");
  sub->add_flag("--json", a->json, "one JSON object per request, in input order");
  add_structured_flags(sub, a->structured);
  sub->add_flag("--exact-prefill", s.exact_prefill,
                "V4.1: run every layer on every prompt token (transformers parity) instead of decoder SWA bounded "
                "replay");
  reg.add(sub, [a] { return run_generate(*a); });
}

}  // namespace deepinfer::cli
