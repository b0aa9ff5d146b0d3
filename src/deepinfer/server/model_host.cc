#include "deepinfer/server/model_host.h"

#include <chrono>
#include <filesystem>

#include "deepinfer/core/error.h"

namespace deepinfer::server {

namespace {

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
  EngineStackOptions so;
  so.model_dir = o.model_dir;
  so.device = o.device;
  so.threads = o.threads;
  so.max_num_seqs = o.max_num_seqs;
  so.max_model_len = o.max_model_len;
  so.max_num_batched_tokens = o.max_num_batched_tokens;
  so.host_kv_budget_bytes = o.kv_budget_mb * 1000 * 1000;
  so.gpu_memory_utilization = o.gpu_memory_utilization;
  so.seed = o.seed;
  so.decode_graphs = !o.enforce_eager;
  so.batch_invariant = o.batch_invariant;
  so.weight_format = o.weight_format;
  so.activation_quant = o.activation_quant;
  so.kernel_choices = o.kernel_choices;
  so.kv_cache_dtype = o.kv_cache_dtype;
  so.scheduling_policy = parse_scheduling_policy(o.scheduling_policy);
  so.speculative = o.speculative;
  so.num_draft_tokens = o.num_draft_tokens;
  so.draft_sampling = o.draft_sampling;
  so.draft_confidence_threshold = o.draft_confidence_threshold;
  so.draft_token_budget = o.draft_token_budget;
  h->stack_ = load_engine_stack(so);
  h->chat_format_ =
      o.chat_format.empty() ? default_chat_format(h->config().family) : tokenizer::parse_chat_format(o.chat_format);
  h->created_unix_ =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  return h;
}

}  // namespace deepinfer::server
