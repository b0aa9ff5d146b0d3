// Llm: the offline API over the engine, for the Python binding (and later the CLI): a model directory in,
// outputs in input order out. It owns backend → model → runner → Engine and the tokenizer; each generate call
// or stream is one Session of requests on that engine (the engine, and its caches, live as long as the Llm).
//
//   Llm llm(LlmConfig{.model_dir = dir});
//   auto outs = llm.generate({PromptInput::text("Hello")}, {params});      // one SamplingParams or one per prompt
//   auto stream = llm.generate_stream({...}, {params});
//   while (auto d = stream->next()) send(*d);                              // deltas as the engine makes them
//
// One session at a time: a stream that is still open makes generate/generate_stream fail until it is
// exhausted or closed. Every entry point is serialised by a mutex, so callers on several threads are safe.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "deepinfer/engine/engine.h"
#include "deepinfer/model/model_config.h"
#include "deepinfer/sampling/sampling_params.h"

namespace deepinfer {
class Backend;
struct EngineStack;
namespace tokenizer {
class Tokenizer;
}
}  // namespace deepinfer

namespace deepinfer::api {

struct LlmConfig {
  std::string model_dir;          // checkpoint directory (config.json + safetensors; tokenizer.json for text prompts)
  std::string device = "cpu";     // "cpu" or "cuda" (device 0; needs a CUDA build)
  int threads = 0;                // CPU backend threads (0 = all cores)
  int64_t max_model_len = 32768;  // prompt + output; capped at the model's max_position_embeddings
  int max_num_seqs = 4;
  int64_t max_num_batched_tokens = 2048;
  // KV cache memory: on CUDA gpu_memory_utilization (0, 1] of the device minus the weights; on the CPU backend
  // the host budget kv_cache_bytes (gpu_memory_utilization is validated but does not apply there).
  double gpu_memory_utilization = 0.85;
  int64_t kv_cache_bytes = int64_t{1} << 30;
  // V4.1: every layer on every prompt token (transformers parity) instead of decoder SWA bounded replay.
  bool exact_prefill = false;
  // A request's output independent of the rest of the batch (EngineStackOptions::batch_invariant; CUDA: slower).
  bool batch_invariant = false;
  // "none" (transformers' numerics), "mxfp8" (V4/V4.1) or "fp8" (the V3 family): GEMM inputs rounded as each
  // family's reference and vLLM do (EngineStackOptions::activation_quant).
  std::string activation_quant = "none";
  // CUDA: the backend's kernel choices as KEY=VALUE specs, for A/Bs (EngineStackOptions::kernel_choices).
  std::vector<std::string> kernel_choices;
  // "auto" / "f32" or "bf16": the paged cache's element type (EngineStackOptions::kv_cache_dtype).
  std::string kv_cache_dtype = "auto";
  // Expert / attention data / context parallel sizes (docs/PARALLEL.md). ep/dp > 1 run in-process ranks on the CPU
  // backend; cp > 1 runs context-parallel prefill over cp in-process ranks (CPU backend, not with ep/dp > 1).
  int ep = 1, dp = 1, cp = 1;
  // EPLB (ep > 1): re-place experts every eplb_interval engine steps (0: off), eplb_slots slots per EP rank (0: auto).
  int eplb_interval = 0, eplb_slots = 0;
  uint64_t seed = 0;        // random stream of requests without their own seed
  std::string chat_format;  // "" = from the model family (v3, v31, v4, v41)
  // Speculative decoding (docs/SPECULATIVE.md): "off", "mtp" (V3 family with MTP weights) or "dspark" (V4.1 /
  // V4-Flash-0731 with DSpark draft weights; verification lengths from its confidence head, threshold 0.3); up to
  // num_draft_tokens drafts are verified per decode step.
  std::string speculative = "off";
  int num_draft_tokens = 1;
};

// Throws InvalidArgument / Unsupported naming the field.
void validate(const LlmConfig& c);

// A prompt: text (tokenized with the model's tokenizer) or token ids.
struct PromptInput {
  std::optional<std::string> text;
  std::vector<TokenId> token_ids;
  static PromptInput from_text(std::string t) { return {std::move(t), {}}; }
  static PromptInput from_ids(std::vector<TokenId> ids) { return {std::nullopt, std::move(ids)}; }
};

// vLLM's finish reasons: "stop" (EOS, stop token, stop string, a complete structured-output sentence), "length"
// (max_tokens, max_model_len), "abort", "error" (non-finite logits, a structured-output dead end).
std::string finish_reason_name(StopReason r);

struct CompletionOutput {
  int index = 0;  // sample index within the request (0..n-1)
  // Decode of token_ids without special tokens such as EOS (vLLM's skip_special_tokens default); a matched stop
  // string is included; ids past the tokenizer's vocabulary add no text.
  std::string text;
  std::vector<TokenId> token_ids;
  std::string finish_reason;               // "" while running
  std::string engine_stop_reason;          // the engine's finer reason: "eos", "stop_token", "max_tokens", ...
  std::optional<std::string> stop_string;  // the stop string that matched
  std::optional<TokenId> stop_token_id;    // the stop token that matched (not EOS, as in vLLM)
  bool has_logprobs = false;               // params.logprobs was set
  std::vector<SampleResult> logprobs;      // per output token, when has_logprobs
  // exp(mean negative log-likelihood of the generated tokens under the raw model distribution); unset for none.
  std::optional<double> decode_ppl;
  int64_t num_cached_prompt_tokens = 0;
  int num_preemptions = 0;
};

struct RequestOutput {
  int index = 0;  // position in the input
  std::string request_id;
  std::optional<std::string> prompt;  // the text, for text prompts
  std::vector<TokenId> prompt_token_ids;
  std::vector<CompletionOutput> outputs;  // by sample index
  bool finished = false;
  // Speculative decoding statistics over the request's finished samples; unset when speculation is off.
  std::optional<double> acceptance_rate;
  std::optional<int64_t> num_draft_tokens, num_accepted_tokens;
};

// New output of one sample, in the order the engine produced it. The final delta has finished = true.
struct StreamDelta {
  int index = 0;         // input position of the request
  int sample_index = 0;  // 0..n-1
  std::vector<TokenId> token_ids;
  std::string text;  // the text these tokens made final (UTF-8 split across tokens is held back)
  bool has_logprobs = false;
  std::vector<SampleResult> logprobs;
  bool finished = false;
  std::string finish_reason;  // set on the final delta
  // The whole request's output once its last sample finished (the same value generate() returns for it).
  std::shared_ptr<const RequestOutput> request_output;
};

// Progress of a generate call: (finished requests, total requests); called after every engine step. It may
// throw (e.g. a pending KeyboardInterrupt) to cancel: the call's requests are aborted and the error propagates.
using ProgressFn = std::function<void(int64_t finished, int64_t total)>;

class Llm;
struct Session;

class GenerationStream {
 public:
  ~GenerationStream();  // aborts what is still running
  GenerationStream(const GenerationStream&) = delete;
  GenerationStream& operator=(const GenerationStream&) = delete;
  // The next delta, running engine steps as needed; nullopt when every request finished.
  std::optional<StreamDelta> next();
  // Aborts unfinished requests and frees the Llm for other calls. Idempotent.
  void close();
  bool closed() const { return session_ == nullptr; }

 private:
  friend class Llm;
  GenerationStream(Llm& llm, std::unique_ptr<Session> session);
  Llm& llm_;
  std::unique_ptr<Session> session_;
};

class Llm {
 public:
  // Loads the model (Unsupported for cp > 1 off the CPU backend or with ep/dp > 1, ep/dp > 1 on cuda, or --device cuda
  // without CUDA, NotFound for a missing directory or file, InvalidArgument naming a bad field).
  explicit Llm(LlmConfig config);
  ~Llm();
  Llm(const Llm&) = delete;
  Llm& operator=(const Llm&) = delete;

  const LlmConfig& config() const { return config_; }
  const ModelConfig& model_config() const { return *model_config_; }
  int64_t max_model_len() const { return max_model_len_; }
  bool has_tokenizer() const { return tok_ != nullptr; }

  // Need tokenizer.json (NotFound otherwise).
  std::vector<TokenId> encode(const std::string& text) const;
  std::string decode(const std::vector<TokenId>& ids, bool skip_special_tokens = false) const;
  // A chat request ({"messages": [...], "tools": ..., "thinking": ..., "reasoning_effort": ...} or a bare messages
  // array) rendered with the model's chat encoder (config.chat_format, else by family) and encoded.
  std::vector<TokenId> encode_chat(const nlohmann::ordered_json& request) const;
  std::string chat_format_name() const;

  // `params` holds one entry for all prompts or one per prompt. Outputs are in input order. Errors name the
  // prompt ("prompts[2]: ..."); nothing stays queued after an error.
  std::vector<RequestOutput> generate(const std::vector<PromptInput>& prompts,
                                      const std::vector<SamplingParams>& params, const ProgressFn& progress = {});
  std::unique_ptr<GenerationStream> generate_stream(const std::vector<PromptInput>& prompts,
                                                    const std::vector<SamplingParams>& params);

  EngineStats stats() const;

 private:
  friend class GenerationStream;
  std::unique_ptr<Session> start_session(const std::vector<PromptInput>& prompts,
                                         const std::vector<SamplingParams>& params);
  void end_session(Session& s);                                      // aborts unfinished requests; mutex held
  void step_session(Session& s);                                     // one engine step; mutex held
  void handle_delta(Session& s, int index, const SequenceDelta& d);  // the engine's stream callback
  const tokenizer::Tokenizer& tokenizer() const;

  LlmConfig config_;
  int64_t max_model_len_ = 0;
  std::unique_ptr<EngineStack> stack_;  // backend, model, tokenizer, runner, engine config
  const ModelConfig* model_config_ = nullptr;
  const tokenizer::Tokenizer* tok_ = nullptr;
  std::string structured_unavailable_;  // why structured output is off ("" = available)
  std::unique_ptr<Engine> engine_;
  mutable std::mutex mu_;
  Session* active_ = nullptr;  // the session the engine's deltas belong to
  int64_t next_session_ = 0;
};

}  // namespace deepinfer::api
