// ModelHost: everything the server needs from one loaded checkpoint — the forward, its runner, the tokenizer, the
// chat format and the engine configuration. Built once at startup; the engine thread owns the runner afterwards.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "deepinfer/engine/engine.h"
#include "deepinfer/engine/model_runner.h"
#include "deepinfer/model/model_config.h"
#include "deepinfer/ops/ops.h"
#include "deepinfer/tokenizer/chat_encoding.h"
#include "deepinfer/tokenizer/tokenizer.h"

namespace deepinfer {
class DeepseekV3Model;
class DeepseekV4Model;
}  // namespace deepinfer

namespace deepinfer::server {

struct ModelHostOptions {
  std::string model_dir;
  std::string served_model_name;  // "" = the directory's last component
  std::string device = "cpu";     // cpu | cuda
  int threads = 0;
  int max_num_seqs = 8;
  int64_t max_model_len = 32768;  // capped by the config's max_position_embeddings
  int64_t max_num_batched_tokens = 2048;
  int64_t kv_budget_mb = 1024;
  uint64_t seed = 0;
  std::string chat_format;  // "" = from the config family (V3 → v3, V4 → v4, V4.1 → v41)
};

class ModelHost {
 public:
  // Throws NotFound / InvalidArgument naming the path or option.
  static std::unique_ptr<ModelHost> load(const ModelHostOptions& options);
  ~ModelHost();

  const std::string& name() const { return name_; }
  const ModelConfig& config() const { return config_; }
  // Null when the directory has no tokenizer.json: only token-id prompts work then.
  const tokenizer::Tokenizer* tokenizer() const { return tokenizer_.get(); }
  tokenizer::ChatFormat chat_format() const { return chat_format_; }
  int64_t max_model_len() const { return engine_config_.scheduler.max_model_len; }
  int64_t vocab_size() const { return config_.vocab_size; }
  const EngineConfig& engine_config() const { return engine_config_; }
  ModelRunner& runner() { return *runner_; }
  int64_t created_unix() const { return created_unix_; }
  // Null when structured output is unavailable; structured_unavailable() says why.
  structured::GrammarCompiler* grammar_compiler() const { return engine_config_.grammar_compiler.get(); }
  const std::string& structured_unavailable() const { return structured_unavailable_; }

 private:
  ModelHost() = default;
  std::string name_;
  ModelConfig config_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<DeepseekV3Model> v3_;
  std::unique_ptr<DeepseekV4Model> v4_;
  std::unique_ptr<ModelRunner> runner_;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer_;
  tokenizer::ChatFormat chat_format_ = tokenizer::ChatFormat::kV41;
  EngineConfig engine_config_;
  int64_t created_unix_ = 0;
  std::string structured_unavailable_;
};

}  // namespace deepinfer::server
