// deepinfer offline: the reference's offline example on the engine — requests → continuous batching with
// chunked prefill → forward (CPU reference backend, or the CUDA backend with --device cuda) → sampling → per-sample
// diagnostics (text, token count, speculative acceptance rate, decode perplexity, finite check), a progress line
// with prompt and generation throughput, and the decode phase as the reference reports it (avg_SPS, delivered
// tokens/s, tokens/s under the full-acceptance assumption). The reference's flags (--model_name, --ep/--dp/--cp,
// --max_model_len, --max_num_seqs, --gpu_memory_utilization, --check_structured_output, --temperature, --seed) are
// accepted with their defaults; dashed spellings work too.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <iostream>

#include <fmt/format.h>

#include "deepinfer/bench/decode_rate.h"
#include "deepinfer/cli/commands.h"
#include "deepinfer/cli/engine_setup.h"
#include "deepinfer/cli/structured_check.h"
#include "deepinfer/core/error.h"
#include "deepinfer/core/logging.h"
#include "deepinfer/engine/gpu_idle.h"
#include "deepinfer/parallel/communicator.h"

namespace deepinfer::cli {
namespace {

struct OfflineArgs {
  EngineSetupArgs setup;
  std::vector<std::string> prompts;
  std::string prompts_file;
  std::vector<std::string> prompt_ids;
  int num_prompts = 4;
  int random_prompt_len = 0;  // tokens in each random prompt; 0: lengths 8, 13, 18, ...
  int max_tokens = 32;
  float temperature = 0.0f;
  float top_p = 1.0f;
  int top_k = 0;
  std::optional<uint64_t> seed;
  int ep = 1, dp = 1, cp = 1;
  int eplb_interval = 0, eplb_slots = 0;
  bool ep_fp8_dispatch = false;
  bool check_structured_output = false;
  bool ignore_eos = false;
  // The chosen token's log-probability (decode perplexity). Greedy steps take the fast path either way
  // (ModelRunner::execute_argmax: the argmax, and this logprob, reduced on the device); off saves that reduction.
  bool logprobs = true;
};

// "acceptance_rate=0.750 mean_accepted_len=1.75 drafted=.. accepted=.. accepted_by_position=a/b,c/d" (n/a when off).
std::string spec_line(const SpecStats& s, bool on) {
  if (!on) return "acceptance_rate=n/a (no draft model)";
  if (s.drafted == 0) return "acceptance_rate=n/a (no drafts verified)";
  std::string per;
  for (size_t j = 0; j < s.drafted_at.size(); ++j)
    per += fmt::format("{}{}/{}", j ? "," : "", s.accepted_at[j], s.drafted_at[j]);
  return fmt::format("acceptance_rate={:.3f} mean_accepted_len={:.2f} drafted={} accepted={} accepted_by_position={}",
                     s.acceptance_rate(), s.mean_accepted_length(), s.drafted, s.accepted, per);
}

// Deterministic pseudo-random prompts when none are given: `len` tokens each, or lengths 8, 13, 18, ... (len 0).
std::vector<std::vector<TokenId>> random_prompts(int n, int len, uint64_t seed, int64_t vocab) {
  std::vector<std::vector<TokenId>> prompts;
  uint64_t s = seed * 6364136223846793005ull + 1442695040888963407ull;
  for (int i = 0; i < n; ++i) {
    std::vector<TokenId> ids;
    for (int j = 0; j < (len > 0 ? len : 8 + 5 * i); ++j) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      ids.push_back(static_cast<TokenId>((s >> 33) % static_cast<uint64_t>(vocab)));
    }
    prompts.push_back(std::move(ids));
  }
  return prompts;
}

// "prompt X tok/s, generation Y tok/s" over the elapsed time (vLLM's offline progress bar reports the same two).
std::string throughput(const EngineStats& st, int64_t generated, double secs) {
  secs = std::max(secs, 1e-9);
  return fmt::format("prompt {:.1f} tok/s, generation {:.1f} tok/s", st.prompt_tokens_computed / secs,
                     generated / secs);
}

int run_offline(const OfflineArgs& a) {
  // Layout and parameter errors come before the model loads.
  for (auto [flag, v] : {std::pair{"--ep", a.ep}, std::pair{"--dp", a.dp}, std::pair{"--cp", a.cp}})
    DI_CHECK(v >= 1) << flag << " must be >= 1, got " << v;
  DI_CHECK(a.eplb_interval >= 0) << "--eplb-interval must be >= 0, got " << a.eplb_interval;
  DI_CHECK(a.eplb_slots >= 0) << "--eplb-slots must be >= 0, got " << a.eplb_slots;
  DI_CHECK(a.eplb_interval == 0 || a.ep > 1) << "--eplb-interval needs expert parallelism (--ep > 1)";
  DI_CHECK(!a.ep_fp8_dispatch || a.ep > 1) << "--ep-fp8-dispatch needs expert parallelism (--ep > 1)";
  DI_CHECK(a.random_prompt_len == 0 || (a.prompts.empty() && a.prompts_file.empty() && a.prompt_ids.empty()))
      << "--random-prompt-len sets the length of the random prompts: it cannot go with --prompt, --prompts-file or "
         "--prompt-ids";
  // Divisibility errors before the model loads (with ep·dp > 1 each DP shard's ranks are its CP group).
  ParallelLayout::make(a.ep, a.dp, 0, ParallelLayout::make(a.ep, a.dp).world > 1 ? a.cp : 1);
  SamplingParams params;
  params.temperature = a.temperature;
  params.top_p = a.top_p;
  params.top_k = a.top_k;
  params.seed = a.seed;
  params.max_tokens = a.max_tokens;
  params.ignore_eos = a.ignore_eos;
  if (a.logprobs) params.logprobs = 0;  // the chosen token's log-probability, for decode perplexity
  validate(params);
  std::vector<std::string> texts = a.prompts;
  if (!a.prompts_file.empty())
    for (auto& p : read_prompts_file(a.prompts_file)) texts.push_back(std::move(p));

  EngineSetupArgs sa = a.setup;
  if (a.seed) sa.seed = *a.seed;
  sa.ep = a.ep;
  sa.dp = a.dp;
  sa.eplb_interval = a.eplb_interval;
  sa.eplb_slots = a.eplb_slots;
  sa.ep_fp8_dispatch = a.ep_fp8_dispatch;
  sa.cp = a.cp;
  EngineSetup setup(sa);
  if (setup.is_worker()) return 0;  // rank > 0 of a multi-process run: served rank 0's steps
  const int64_t vocab = setup.config().vocab_size;
  if (a.check_structured_output) {
    const int failed = run_structured_output_checks(setup);
    DI_CHECK_CODE(failed == 0, ErrorCode::kInternal) << failed << " structured output checks failed";
  }

  // Prompts: text (tokenized), explicit ids, or deterministic pseudo-random ids when none are given.
  std::vector<std::vector<TokenId>> prompts;
  for (size_t i = 0; i < texts.size(); ++i) prompts.push_back(setup.encode(texts[i], fmt::format("prompt {}", i)));
  for (const auto& p : a.prompt_ids) prompts.push_back(parse_token_ids(p, vocab, "--prompt-ids"));
  if (prompts.empty()) prompts = random_prompts(a.num_prompts, a.random_prompt_len, a.seed.value_or(0), vocab);

  Engine& engine = setup.engine();
  const bool setup_spec = a.setup.speculative != "off";
  for (size_t i = 0; i < prompts.size(); ++i) {
    Request r;
    r.request_id = std::to_string(i);
    r.prompt_token_ids = prompts[i];
    r.params = params;
    engine.add_request(std::move(r));
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  std::vector<CompletedSequence> done;
  // Wall time of the steps that computed no prompt token: the decode phase's step time (steps per second).
  std::vector<double> decode_ms;
  // The decode phase as the reference reports it (avg_SPS, delivered and full-acceptance tokens/s), in steady
  // state. A call's wall time is mostly the wait for a launch: with asynchronous scheduling the previous call's
  // (the first decode call waits for the prefill, the drain call after the last launch for the last decode), else
  // its own. A launch of decodes and no prompt token counts as a step, timed by the call that waited for it,
  // unless that call or the launching one recorded a CUDA graph (warm-up: capture, first use of the kernels;
  // reported apart).
  struct Call {
    bool pure_decode = false, recorded = false;
    double ms = 0;
    int num_decodes = 0;
    int64_t drafted = 0, accepted = 0;
  };
  std::vector<Call> calls;
  bench::DecodeCounts decode;
  decode.draft_length = setup_spec ? a.setup.num_draft_tokens : 0;
  while (engine.has_unfinished()) {
    const int64_t prompt_before = engine.stats().prompt_tokens_computed;
    const int64_t drafted_before = engine.stats().spec.drafted, accepted_before = engine.stats().spec.accepted;
    const int64_t recordings_before = engine.stats().model.decode_graph_recordings;
    const auto s0 = std::chrono::steady_clock::now();
    const StepStats step = engine.step();
    Call c;
    c.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - s0).count();
    const bool no_prompt = engine.stats().prompt_tokens_computed == prompt_before;
    c.pure_decode = no_prompt && step.num_decodes > 0;
    c.recorded = engine.stats().model.decode_graph_recordings > recordings_before;
    c.num_decodes = step.num_decodes;
    // Speculation runs synchronously: the drafts verified in this call are this step's.
    c.drafted = engine.stats().spec.drafted - drafted_before;
    c.accepted = engine.stats().spec.accepted - accepted_before;
    calls.push_back(c);
    if (no_prompt) {
      decode_ms.push_back(c.ms);
      decode.discarded += step.num_discarded;
    }
    auto finished = engine.take_finished();
    if (finished.empty()) continue;
    for (auto& f : finished) done.push_back(std::move(f));
    std::cerr << fmt::format("progress: {}/{} requests done, {:.2f} s, {}\n", done.size(), prompts.size(), elapsed(),
                             throughput(engine.stats(), engine.stats().generated_tokens, elapsed()));
  }
  const double secs = elapsed();
  std::sort(done.begin(), done.end(),
            [](const auto& x, const auto& y) { return std::stoll(x.request_id) < std::stoll(y.request_id); });
  int64_t generated = 0;
  bool all_finite = true;
  for (const auto& d : done) {
    const double ppl = decode_perplexity(d.logprobs);
    const bool finite = d.stop_reason != StopReason::kError && std::isfinite(ppl) &&
                        std::all_of(d.logprobs.begin(), d.logprobs.end(),
                                    [](const SampleResult& r) { return std::isfinite(r.logprob); });
    all_finite = all_finite && finite;
    generated += static_cast<int64_t>(d.output_token_ids.size());
    std::cout << fmt::format("[sample {}] prompt_tokens={} tokens={} stop={} decode_ppl={} finite={} {}\n",
                             d.request_id, d.prompt_len, d.output_token_ids.size(), stop_reason_name(d.stop_reason),
                             a.logprobs ? fmt::format("{:.4f}", ppl) : std::string("n/a (--no-logprobs)"),
                             finite ? "yes" : "NO", spec_line(d.spec, setup_spec));
    std::string ids;
    for (size_t k = 0; k < d.output_token_ids.size(); ++k)
      ids += (k ? "," : "") + std::to_string(d.output_token_ids[k]);
    std::cout << "  ids: " << ids << "\n";
    if (setup.tokenizer()) std::cout << "  text: " << quote_for_display(setup.decode(d.output_token_ids)) << "\n";
  }
  const EngineStats& st = engine.stats();
  if (setup_spec) std::cout << "speculative: " << spec_line(st.spec, true) << "\n";
  std::cout << fmt::format(
      "offline: {} requests, {} prompt tokens computed, {} generated tokens in {:.2f} s ({}), {} steps, "
      "{} preemptions, prefix cache hit rate {:.1f}%\n",
      done.size(), st.prompt_tokens_computed, generated, secs, throughput(st, generated, secs), st.steps,
      st.preemptions, 100.0 * st.kv.hit_rate());
  std::cout << prefill_work_line(st) << "\n";
  if (!decode_ms.empty()) {
    std::sort(decode_ms.begin(), decode_ms.end());
    const double median = decode_ms[decode_ms.size() / 2], p90 = decode_ms[decode_ms.size() * 9 / 10];
    std::cout << fmt::format(
        "decode steps: {} (steps without prompt tokens), median {:.3f} ms, p90 {:.3f} ms, {:.1f} steps/s; model "
        "runner {:.3f} ms per step overall, batched decode {:.3f} ms per call ({} calls)\n",
        decode_ms.size(), median, p90, 1000.0 / median,
        1000.0 * st.model.execute_seconds / static_cast<double>(std::max<int64_t>(st.steps, 1)),
        1000.0 * st.model.decode_batch_seconds / static_cast<double>(std::max<int64_t>(st.model.decode_batches, 1)),
        st.model.decode_batches);
  }
  int64_t warmup_steps = 0;
  double warmup_seconds = 0;
  const size_t wait_offset = engine.async_scheduling() ? 1 : 0;
  for (size_t i = 0; i < calls.size(); ++i) {
    if (!calls[i].pure_decode) continue;
    if (i + wait_offset >= calls.size()) break;  // never waited for (cannot happen: the loop drains)
    const Call& waiter = calls[i + wait_offset];
    if (calls[i].recorded || waiter.recorded) {
      ++warmup_steps;
      warmup_seconds += waiter.ms / 1000.0;
      continue;
    }
    ++decode.steps;
    decode.seconds += waiter.ms / 1000.0;
    decode.sequence_steps += calls[i].num_decodes;
    decode.drafted += calls[i].drafted;
    decode.accepted += calls[i].accepted;
  }
  // A discard is counted when the step that sampled it is processed, one call after its launch (asynchronous
  // scheduling): one from a step that also ran prompt tokens is not among the counted sequence steps.
  decode.discarded = std::min(decode.discarded, decode.sequence_steps + decode.accepted);
  std::cout << "decode rate: " << bench::format_decode_rate(decode, bench::decode_rate(decode))
            << fmt::format("; warm-up steps (a CUDA graph recorded) left out: {} ({:.6f} s)", warmup_steps,
                           warmup_seconds)
            << "\n";
  std::cout << format_gpu_idle(st.model.gpu_timed_decode_steps, st.model.gpu_decode_gap_seconds,
                               st.model.gpu_decode_span_seconds)
            << fmt::format("; greedy fast path: {} steps argmax on the device, {} on the host",
                           st.model.argmax_steps_device, st.model.argmax_steps_host)
            << "\n";
  DI_CHECK_CODE(all_finite, ErrorCode::kInternal) << "non-finite values in at least one sample";
  return 0;
}

}  // namespace

void register_offline(CLI::App& app, CommandRegistry& reg) {
  auto* sub = app.add_subcommand("offline", "offline generation through the engine with per-request diagnostics");
  auto a = std::make_shared<OfflineArgs>();
  EngineSetupArgs& s = a->setup;
  sub->add_option("--model_name,--model", s.model,
                  "checkpoint directory (default: DEEPINFER_HF_MODEL_DIR, then the embedded model)");
  sub->add_option("--prompt", a->prompts, "text prompt (repeatable; needs tokenizer.json)");
  sub->add_option("--prompts-file", a->prompts_file, "file with one text prompt per line");
  sub->add_option("--prompt-ids", a->prompt_ids, "comma-separated token ids (repeatable)");
  sub->add_option("--num-prompts", a->num_prompts, "random prompts to run when none are given")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  sub->add_option("--random-prompt-len", a->random_prompt_len,
                  "tokens in each random prompt (0: lengths 8, 13, 18, ...): a long-prompt or long-context workload")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  sub->add_option("--max-tokens,--max_tokens", a->max_tokens, "tokens to generate per request")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  sub->add_option("--temperature", a->temperature, "0 = greedy")->capture_default_str();
  sub->add_option("--top-p,--top_p", a->top_p)->capture_default_str();
  sub->add_option("--top-k,--top_k", a->top_k)->capture_default_str();
  sub->add_option("--seed", a->seed, "per-request seed: deterministic sampling whatever the batch");
  sub->add_option("--ep", a->ep, "expert-parallel size")->capture_default_str();
  sub->add_option("--dp", a->dp, "attention data-parallel size")->capture_default_str();
  sub->add_option("--cp", a->cp, "context-parallel size")->capture_default_str();
  sub->add_option("--eplb-interval", a->eplb_interval,
                  "EP load balancing: re-place experts (with redundant replicas) every N engine steps (0 = off)")
      ->capture_default_str();
  sub->add_option("--eplb-slots", a->eplb_slots, "EPLB expert slots per EP rank (0 = ceil(experts / ep) + 1)")
      ->capture_default_str();
  sub->add_flag("--ep-fp8-dispatch", a->ep_fp8_dispatch,
                "send MoE token rows between EP ranks in FP8 e4m3 with per-128 scales (lossy, ~3.9x fewer bytes)");
  sub->add_option("--max_num_seqs,--max-num-seqs", s.max_num_seqs, "sequences batched together")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  sub->add_option("--max_model_len,--max-model-len", s.max_model_len,
                  "prompt + output tokens per sequence (clamped to the model's max_position_embeddings)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  sub->add_option("--max_num_batched_tokens,--max-num-batched-tokens", s.max_num_batched_tokens,
                  "tokens per engine step")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  sub->add_option("--gpu_memory_utilization,--gpu-memory-utilization", s.gpu_memory_utilization,
                  "fraction of device memory for weights, activations and the KV cache (CUDA)")
      ->capture_default_str();
  sub->add_option("--kv-budget-mb", s.kv_budget_mb, "host memory for the KV cache (CPU backend)")
      ->capture_default_str();
  sub->add_flag("--check_structured_output", a->check_structured_output,
                "run regex, JSON Schema and EBNF constrained generations and report pass/fail");
  sub->add_option("--threads", s.threads, "CPU threads (0 = all cores)")->capture_default_str();
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
  sub->add_flag("!--no-batch-decode", s.batch_decode,
                "run each decode as its own forward (default: one batched decode forward per step where the model "
                "has one)");
  sub->add_flag("--ignore-eos", a->ignore_eos, "keep generating past EOS until --max-tokens");
  sub->add_flag("!--no-logprobs", a->logprobs,
                "skip the chosen tokens' log-probabilities (decode_ppl n/a). Greedy steps take the fast path either "
                "way (on CUDA the argmax, and the chosen token's log-probability, reduced on the device: only ids "
                "and log-probabilities copied back)");
  sub->add_flag("!--no-device-argmax", s.device_argmax,
                "CUDA: greedy fast-path steps copy the full logits rows to the host and take the argmax (and the "
                "log-probability) there (the comparison for the device reduction)");
  sub->add_option("--speculative", s.speculative,
                  "speculative decoding: off | mtp (V3 family or V4-Flash base with an MTP layer) | dspark (V4.1 / "
                  "V4-Flash-0731 with DSpark draft weights)")
      ->check(CLI::IsMember({"off", "mtp", "dspark"}))
      ->capture_default_str();
  sub->add_option("--num-draft-tokens,--num_draft_tokens", s.num_draft_tokens, "draft tokens verified per step")
      ->check(CLI::Range(1, 16))
      ->capture_default_str();
  sub->add_option("--draft-sampling", s.draft_sampling,
                  "mtp: greedy (argmax drafts) | sampled (drafts drawn from the MTP module's softmax at the request's "
                  "temperature, verified with that distribution)")
      ->check(CLI::IsMember({"greedy", "sampled"}))
      ->capture_default_str();
  sub->add_option("--draft-confidence-threshold", s.draft_confidence_threshold,
                  "dspark: verify the longest draft prefix whose confidence survival stays >= this (0: all drafts)")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  sub->add_option("--draft-token-budget", s.draft_token_budget,
                  "dspark: at most this many draft tokens verified per step across the batch (0: no cap)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  sub->add_flag("--exact-prefill", s.exact_prefill,
                "V4.1: run every layer on every prompt token (transformers parity) instead of decoder SWA bounded "
                "replay");
  reg.add(sub, [a] { return run_offline(*a); });
}

}  // namespace deepinfer::cli
