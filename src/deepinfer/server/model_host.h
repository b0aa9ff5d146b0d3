// ModelHost: everything the server needs from one loaded checkpoint — the forward, its runner, the tokenizer, the
// chat format and the engine configuration. Built once at startup; the engine thread owns the runner afterwards.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "deepinfer/engine/engine.h"
#include "deepinfer/engine/engine_factory.h"
#include "deepinfer/engine/model_runner.h"
#include "deepinfer/model/model_config.h"
#include "deepinfer/ops/ops.h"
#include "deepinfer/tokenizer/chat_encoding.h"
#include "deepinfer/tokenizer/tokenizer.h"

namespace deepinfer::server {

struct ModelHostOptions {
  std::string model_dir;
  std::string served_model_name;  // "" = the directory's last component
  std::string device = "cpu";     // cpu | cuda
  int threads = 0;
  int max_num_seqs = 8;
  int64_t max_model_len = 32768;  // capped by the config's max_position_embeddings
  int64_t max_num_batched_tokens = 2048;
  int64_t kv_budget_mb = 1024;           // CPU backend: the KV cache's host memory
  double gpu_memory_utilization = 0.85;  // CUDA: share of the device for weights, activations and the cache
  uint64_t seed = 0;
  bool enforce_eager = false;               // no decode graphs (EngineSetupArgs::enforce_eager)
  bool batch_invariant = false;             // EngineStackOptions::batch_invariant
  std::string weight_format = "auto";       // auto | f32 | fp8 (EngineStackOptions::weight_format)
  std::string activation_quant = "none";    // none | mxfp8 (EngineStackOptions::activation_quant)
  std::vector<std::string> kernel_choices;  // CUDA KEY=VALUE specs (EngineStackOptions::kernel_choices)
  std::string kv_cache_dtype = "auto";      // auto | f32 | bf16 (EngineStackOptions::kv_cache_dtype)
  std::string scheduling_policy = "fcfs";   // fcfs | priority (the requests' "priority" field, lower first)
  std::string chat_format;                  // "" = from the config family (V3 → v3, V4 → v4, V4.1 → v41)
  std::string speculative = "off";          // off | mtp | dspark (docs/SPECULATIVE.md)
  int num_draft_tokens = 1;
  std::string draft_sampling = "greedy";    // mtp: greedy | sampled
  double draft_confidence_threshold = 0.3;  // dspark
  int64_t draft_token_budget = 0;           // dspark, 0 = no cap
};

class ModelHost {
 public:
  // Throws NotFound / InvalidArgument naming the path or option.
  static std::unique_ptr<ModelHost> load(const ModelHostOptions& options);
  ~ModelHost();

  const std::string& name() const { return name_; }
  const ModelConfig& config() const { return *stack_->config; }
  // Null when the directory has no tokenizer.json: only token-id prompts work then.
  const tokenizer::Tokenizer* tokenizer() const { return stack_->tokenizer.get(); }
  tokenizer::ChatFormat chat_format() const { return chat_format_; }
  int64_t max_model_len() const { return stack_->engine_config.scheduler.max_model_len; }
  int64_t vocab_size() const { return config().vocab_size; }
  const EngineConfig& engine_config() const { return stack_->engine_config; }
  ModelRunner& runner() { return *stack_->runner; }
  int64_t created_unix() const { return created_unix_; }
  // Null when structured output is unavailable; structured_unavailable() says why.
  structured::GrammarCompiler* grammar_compiler() const { return engine_config().grammar_compiler.get(); }
  const std::string& structured_unavailable() const { return stack_->structured_unavailable; }

 private:
  ModelHost() = default;
  std::string name_;
  std::unique_ptr<EngineStack> stack_;
  tokenizer::ChatFormat chat_format_ = tokenizer::ChatFormat::kV41;
  int64_t created_unix_ = 0;
};

}  // namespace deepinfer::server
