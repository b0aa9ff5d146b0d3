#include "deepinfer/cli/engine_setup.h"

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "deepinfer/cli/commands.h"
#include "deepinfer/core/error.h"
#include "deepinfer/core/logging.h"
#include "deepinfer/engine/structured_output.h"
#include "deepinfer/engine/v3_model_runner.h"
#include "deepinfer/engine/v4_model_runner.h"
#include "deepinfer/io/checkpoint.h"
#include "deepinfer/io/safetensors.h"
#include "deepinfer/model/deepseek_v3.h"
#include "deepinfer/model/deepseek_v4.h"
#ifdef DEEPINFER_WITH_CUDA
#include "deepinfer/ops/cuda/cuda_backend.h"
#endif

namespace deepinfer::cli {
namespace {

void log_prefill_mode(const DeepseekV4Model& m, bool exact) {
  if (m.decoder_start() < 0) return;
  if (exact) {
    DI_LOG_INFO("prefill: exact (every layer on every prompt token, transformers parity)");
  } else {
    DI_LOG_INFO(
        "prefill: decoder SWA bounded replay (layers {}+ run on the last {} prompt tokens only; "
        "--exact-prefill for transformers parity)",
        m.decoder_start(), m.decoder_window());
  }
}

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

// The memory the KV cache may use on the chosen device.
int64_t cache_budget_bytes(const EngineSetupArgs& a, [[maybe_unused]] const std::string& dir) {
  DI_CHECK(a.gpu_memory_utilization > 0.0 && a.gpu_memory_utilization <= 1.0)
      << "gpu_memory_utilization must be in (0, 1], got " << a.gpu_memory_utilization;
  DI_CHECK(a.kv_budget_mb >= 1) << "kv_budget_mb must be >= 1, got " << a.kv_budget_mb;
#ifdef DEEPINFER_WITH_CUDA
  if (a.device == "cuda") {
    // The weights' footprint on the device: the checkpoint's safetensors files (uploaded as stored).
    int64_t weight_bytes = 0;
    for (const auto& e : std::filesystem::directory_iterator(dir))
      if (e.is_regular_file() && e.path().extension() == ".safetensors")
        weight_bytes += static_cast<int64_t>(e.file_size());
    const cuda::DeviceInfo info = cuda::select_device(0);
    // Activations of the reference forward are small next to the weights at these batch sizes; keep 5% of the
    // device for them and the allocator's slack.
    const int64_t total = static_cast<int64_t>(info.total_memory);
    const int64_t budget = kv_budget_bytes(total, a.gpu_memory_utilization, weight_bytes, total / 20);
    DI_LOG_INFO("cache budget: {:.2f} * {:.1f} GiB ({}) - weights - activations = {:.1f} MiB", a.gpu_memory_utilization,
                static_cast<double>(total) / (1 << 30), info.name, static_cast<double>(budget) / (1 << 20));
    return budget;
  }
#endif
  DI_LOG_INFO("cache budget: {} MB of host memory (--kv-budget-mb; gpu_memory_utilization applies to devices)",
              a.kv_budget_mb);
  return a.kv_budget_mb * 1000 * 1000;
}

}  // namespace

EngineSetup::EngineSetup(const EngineSetupArgs& a, StreamCallback on_delta) {
  const char* env = std::getenv("DEEPINFER_HF_MODEL_DIR");
  ResolvedModel m = resolve_model_dir(a.model.empty() ? std::nullopt : std::optional<std::string>(a.model),
                                      env ? std::optional<std::string>(env) : std::nullopt, embedded_model_dir());
  model_dir_ = m.dir;
  DI_LOG_INFO("model resolved from {}: {}", m.source, m.dir);
  const int64_t budget = cache_budget_bytes(a, m.dir);
  backend_ = make_backend(a.device, a.threads);
  DI_LOG_INFO("device: {}", a.device);

  // The family in config.json picks the forward and its runner: V3 (V3/R1/V3.1/V2-Lite) or V4/V4.1.
  if (load_model_config(m.dir + "/config.json").family == ModelFamily::kDeepseekV3) {
    v3_ = DeepseekV3Model::load(m.dir, *backend_);
    config_ = &v3_->config();
  } else {
    std::optional<std::vector<int64_t>> token_map;
    if (!a.engram_token_map_file.empty()) {
      auto f = SafetensorsFile::open(a.engram_token_map_file);
      Tensor t = f->tensor("engram.token_map");
      DI_CHECK(t.dtype() == DType::kI64) << a.engram_token_map_file << ": engram.token_map must be I64";
      token_map = std::vector<int64_t>(t.data_as<int64_t>(), t.data_as<int64_t>() + t.numel());
    }
    v4_ = DeepseekV4Model::load(m.dir, *backend_, std::move(token_map));
    config_ = &v4_->config();
  }
  if (std::filesystem::exists(m.dir + "/tokenizer.json"))
    tokenizer_ = tokenizer::Tokenizer::from_file(m.dir + "/tokenizer.json");

  max_model_len_ = a.max_model_len;
  if (config_->max_position_embeddings > 0 && max_model_len_ > config_->max_position_embeddings) {
    DI_LOG_INFO("max_model_len {} exceeds the model's max_position_embeddings {}: using {}", a.max_model_len,
                config_->max_position_embeddings, config_->max_position_embeddings);
    max_model_len_ = config_->max_position_embeddings;
  }
  layout_ = make_kv_layout(*config_);
  sizing_ = size_kv_cache(layout_, budget, a.max_num_seqs, max_model_len_);
  log_kv_sizing(layout_, sizing_, max_model_len_);

  EngineConfig ec;
  ec.scheduler.max_num_seqs = a.max_num_seqs;
  ec.scheduler.max_model_len = max_model_len_;
  ec.scheduler.max_num_batched_tokens = a.max_num_batched_tokens;
  ec.seed = a.seed;
  ec.async_scheduling = a.async_scheduling;
  for (int64_t e : config_->eos_token_ids) ec.eos_token_ids.push_back(static_cast<TokenId>(e));
  if (tokenizer_) ec.detokenize = [tok = tokenizer_.get()](std::span<const TokenId> ids) { return tok->decode(ids); };
  // Structured output needs token bytes that concatenate (ByteLevel); without it constrained requests are refused.
  if (tokenizer_ && tokenizer_->token_separator().empty())
    ec.grammar_compiler = std::make_shared<structured::GrammarCompiler>(
        make_structured_tokenizer_info(*tokenizer_, ec.eos_token_ids, config_->vocab_size));
  ModelRunnerOptions ro;
  ro.exact_prefill = a.exact_prefill;
  if (v3_) {
    runner_ = std::make_unique<V3ModelRunner>(*v3_, sizing_.num_state_slots, ro);
  } else {
    runner_ = std::make_unique<V4ModelRunner>(*v4_, sizing_.num_state_slots, ro);
    log_prefill_mode(*v4_, a.exact_prefill);
  }
  // Prefix reuse when the runner's caches are paged; its replay (if any) rebuilds per-sequence state exactly.
  ec.kv = make_kv_cache_config(layout_, sizing_, runner_->prefix_cache_supported(), /*allow_bounded_replay=*/true);
  ec.kv.prefix_replay_tokens = runner_->prefix_replay_tokens();
  engine_ = std::make_unique<Engine>(ec, *runner_, std::move(on_delta));
  DI_LOG_INFO("scheduling: {} (max_num_seqs {}, max_num_batched_tokens {}, max_model_len {})",
              a.async_scheduling ? "asynchronous (step N+1 planned while step N runs)" : "synchronous", a.max_num_seqs,
              a.max_num_batched_tokens, max_model_len_);
}

EngineSetup::~EngineSetup() = default;

std::vector<TokenId> EngineSetup::encode(const std::string& text, const std::string& what) const {
  DI_CHECK_CODE(tokenizer_ != nullptr, ErrorCode::kInvalidArgument)
      << what << ": text prompts need " << model_dir_ << "/tokenizer.json; pass token ids (--prompt-ids) instead";
  std::vector<TokenId> ids = tokenizer_->encode(text);
  DI_CHECK(!ids.empty()) << what << ": '" << text << "' encodes to no tokens";
  return ids;
}

std::string EngineSetup::decode(std::span<const TokenId> ids) const {
  return tokenizer_ ? tokenizer_->decode(ids) : std::string();
}

std::string prefill_work_line(const EngineStats& st) {
  const int64_t all = st.model.layer_tokens + st.model.layer_tokens_skipped;
  return fmt::format("prefill work: {} layer-tokens run, {} skipped by bounded replay ({:.1f}% saved)",
                     st.model.layer_tokens, st.model.layer_tokens_skipped,
                     all ? 100.0 * static_cast<double>(st.model.layer_tokens_skipped) / all : 0.0);
}

std::vector<TokenId> parse_token_ids(const std::string& text, int64_t vocab, const std::string& flag) {
  std::vector<TokenId> ids;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const size_t b = item.find_first_not_of(" \t");
    if (b == std::string::npos) continue;
    const size_t e = item.find_last_not_of(" \t");
    const std::string v = item.substr(b, e - b + 1);
    char* end = nullptr;
    errno = 0;
    const long long id = std::strtoll(v.c_str(), &end, 10);
    DI_CHECK(end != v.c_str() && *end == '\0' && errno == 0) << flag << ": '" << v << "' is not an integer";
    DI_CHECK(id >= 0 && id < vocab) << flag << ": token id " << id << " outside the vocabulary [0, " << vocab << ")";
    ids.push_back(static_cast<TokenId>(id));
  }
  DI_CHECK(!ids.empty()) << flag << ": at least one token id is required";
  return ids;
}

std::vector<std::string> read_prompts_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  DI_CHECK_CODE(in.good(), ErrorCode::kNotFound) << "--prompts-file: cannot read '" << path << "'";
  std::vector<std::string> prompts;
  std::string line;
  int64_t n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    DI_CHECK(!line.empty()) << "--prompts-file " << path << ": line " << n
                            << " is empty (one prompt per line; outputs follow the line order)";
    prompts.push_back(std::move(line));
  }
  DI_CHECK(!prompts.empty()) << "--prompts-file " << path << ": no prompts in the file";
  return prompts;
}

double decode_perplexity(const std::vector<SampleResult>& logprobs) {
  if (logprobs.empty()) return 0.0;
  double nll = 0;
  for (const auto& lp : logprobs) nll -= lp.logprob;
  return std::exp(nll / static_cast<double>(logprobs.size()));
}

std::string quote_for_display(const std::string& s) {
  std::string out = "\"";
  for (unsigned char ch : s) {
    if (ch == '\n') {
      out += "\\n";
    } else if (ch == '\t') {
      out += "\\t";
    } else if (ch == '"' || ch == '\\') {
      out += '\\';
      out += static_cast<char>(ch);
    } else if (ch < 0x20 || ch == 0x7f) {
      out += fmt::format("\\x{:02x}", ch);
    } else {
      out += static_cast<char>(ch);
    }
  }
  return out + "\"";
}

}  // namespace deepinfer::cli
