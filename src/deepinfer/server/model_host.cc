#include "deepinfer/server/model_host.h"

#include <chrono>
#include <filesystem>

#include "deepinfer/core/error.h"
#include "deepinfer/core/logging.h"
#include "deepinfer/engine/structured_output.h"
#include "deepinfer/engine/v3_model_runner.h"
#include "deepinfer/engine/v4_model_runner.h"
#include "deepinfer/kv/kv_layout.h"
#include "deepinfer/model/deepseek_v3.h"
#include "deepinfer/model/deepseek_v4.h"
#include "deepinfer/structured/grammar_compiler.h"
#ifdef DEEPINFER_WITH_CUDA
#include "deepinfer/ops/cuda/cuda_backend.h"
#endif

namespace deepinfer::server {

namespace {

std::unique_ptr<Backend> make_backend(const std::string& device, int threads) {
  if (device == "cpu") return make_cpu_backend(threads);
  DI_CHECK(device == "cuda") << "--device must be cpu or cuda, got '" << device << "'";
#ifdef DEEPINFER_WITH_CUDA
  DI_CHECK_CODE(cuda::device_count() > 0, ErrorCode::kNotFound) << "--device cuda: no CUDA device is visible";
  return make_cuda_backend(0);
#else
  DI_FAIL(ErrorCode::kUnsupported) << "--device cuda: this deepinfer was built without CUDA";
#endif
}

tokenizer::ChatFormat default_chat_format(ModelFamily family) {
  switch (family) {
    case ModelFamily::kDeepseekV3:
      return tokenizer::ChatFormat::kV3;
    case ModelFamily::kDeepseekV4:
      return tokenizer::ChatFormat::kV4;
    case ModelFamily::kDeepseekV41:
      return tokenizer::ChatFormat::kV41;
  }
  return tokenizer::ChatFormat::kV41;
}

}  // namespace

ModelHost::~ModelHost() = default;

std::unique_ptr<ModelHost> ModelHost::load(const ModelHostOptions& o) {
  namespace fs = std::filesystem;
  DI_CHECK_CODE(fs::exists(o.model_dir + "/config.json"), ErrorCode::kNotFound)
      << "--model " << o.model_dir << ": no config.json there";
  DI_CHECK(o.max_num_seqs > 0) << "--max-num-seqs must be positive, got " << o.max_num_seqs;
  std::unique_ptr<ModelHost> h(new ModelHost());
  h->name_ = o.served_model_name;
  if (h->name_.empty()) {
    fs::path p = fs::path(o.model_dir).lexically_normal();
    h->name_ = p.filename().empty() ? p.parent_path().filename().string() : p.filename().string();
  }
  h->backend_ = make_backend(o.device, o.threads);
  h->config_ = load_model_config(o.model_dir + "/config.json");
  if (h->config_.family == ModelFamily::kDeepseekV3) {
    h->v3_ = DeepseekV3Model::load(o.model_dir, *h->backend_);
  } else {
    h->v4_ = DeepseekV4Model::load(o.model_dir, *h->backend_);
  }
  if (fs::exists(o.model_dir + "/tokenizer.json"))
    h->tokenizer_ = tokenizer::Tokenizer::from_file(o.model_dir + "/tokenizer.json");
  else
    DI_LOG_WARN("{} has no tokenizer.json: only token-id prompts are accepted", o.model_dir);
  h->chat_format_ =
      o.chat_format.empty() ? default_chat_format(h->config_.family) : tokenizer::parse_chat_format(o.chat_format);

  const ModelConfig& cfg = h->config_;
  const int64_t max_model_len = std::min<int64_t>(o.max_model_len, cfg.max_position_embeddings);
  KvLayout layout = make_kv_layout(cfg);
  KvSizing sizing = size_kv_cache(layout, o.kv_budget_mb * 1000 * 1000, o.max_num_seqs, max_model_len);
  log_kv_sizing(layout, sizing, max_model_len);
  EngineConfig& ec = h->engine_config_;
  ec.scheduler.max_num_seqs = o.max_num_seqs;
  ec.scheduler.max_model_len = max_model_len;
  ec.scheduler.max_num_batched_tokens = o.max_num_batched_tokens;
  ec.seed = o.seed;
  for (int64_t e : cfg.eos_token_ids) ec.eos_token_ids.push_back(static_cast<TokenId>(e));
  if (h->tokenizer_) {
    const tokenizer::Tokenizer* tok = h->tokenizer_.get();
    // Config vocabularies are padded past the tokenizer's: ids that name no token are left out, never thrown on.
    ec.detokenize = [tok](std::span<const TokenId> ids) {
      std::vector<TokenId> valid;
      valid.reserve(ids.size());
      for (TokenId id : ids)
        if (tok->is_valid_id(id)) valid.push_back(id);
      return tok->decode(valid);
    };
    // Structured output needs each token's bytes on their own; a tokenizer with separators cannot have it.
    try {
      ec.grammar_compiler = std::make_shared<structured::GrammarCompiler>(
          make_structured_tokenizer_info(*tok, ec.eos_token_ids, cfg.vocab_size));
    } catch (const Error& e) {
      h->structured_unavailable_ = e.message();
      DI_LOG_WARN("structured output disabled: {}", e.message());
    }
  } else {
    h->structured_unavailable_ = "the model directory has no tokenizer.json";
  }
  if (h->v3_)
    h->runner_ = std::make_unique<V3ModelRunner>(*h->v3_, sizing.num_state_slots);
  else
    h->runner_ = std::make_unique<V4ModelRunner>(*h->v4_, sizing.num_state_slots);
  // Prefix reuse when the runner's caches are paged (as EngineSetup does for the CLI).
  ec.kv = make_kv_cache_config(layout, sizing, h->runner_->prefix_cache_supported(), /*allow_bounded_replay=*/true);
  ec.kv.prefix_replay_tokens = h->runner_->prefix_replay_tokens();
  h->created_unix_ =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  return h;
}

}  // namespace deepinfer::server
