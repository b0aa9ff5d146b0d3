#include "deepinfer/cli/engine_setup.h"

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <type_traits>

#include <fmt/format.h>

#include "deepinfer/cli/commands.h"
#include "deepinfer/cli/process_world.h"
#include "deepinfer/core/error.h"
#include "deepinfer/core/logging.h"
#include "deepinfer/io/safetensors.h"
#include "deepinfer/model/deepseek_v3.h"
#include "deepinfer/model/deepseek_v4.h"
#include "deepinfer/parallel/cp_process_runner.h"
#include "deepinfer/parallel/parallel_model_runner.h"
#ifdef DEEPINFER_WITH_CUDA
#include "deepinfer/ops/cuda/cuda_backend.h"
#endif

namespace deepinfer::cli {
namespace {

// One rank's backend in a process per GPU: CUDA device `gpu`.
std::unique_ptr<Backend> make_rank_cuda_backend([[maybe_unused]] int gpu, [[maybe_unused]] bool batch_invariant,
                                                [[maybe_unused]] const cuda::KernelChoices& choices) {
#ifdef DEEPINFER_WITH_CUDA
  auto backend = make_cuda_backend(gpu);
  backend->set_batch_invariant(batch_invariant);
  backend->set_kernel_choices(choices);
  return backend;
#else
  DI_FAIL(ErrorCode::kUnsupported) << "--device cuda: this deepinfer was built without CUDA (configure with "
                                      "-DDEEPINFER_ACCELERATOR=nvidia)";
#endif
}

// The V4.1 Engram token map from --engram-token-map (nullopt: the model builds it from tokenizer.json).
std::optional<std::vector<int64_t>> read_token_map(const std::string& file) {
  if (file.empty()) return std::nullopt;
  auto f = SafetensorsFile::open(file);
  Tensor t = f->tensor("engram.token_map");
  DI_CHECK(t.dtype() == DType::kI64) << file << ": engram.token_map must be I64";
  return std::vector<int64_t>(t.data_as<int64_t>(), t.data_as<int64_t>() + t.numel());
}

// Loads the model of one rank on its backend: its resident routed experts only, block-format weights kept quantized
// when keep_quant (--weight-format), GEMM inputs rounded as act_quant asks (--activation-quant), its paged caches in
// kv_dtype (--kv-cache-dtype).
template <typename Model>
std::function<std::unique_ptr<Model>(Backend&, const ExpertFilter&)> model_loader(
    const std::string& dir, std::optional<std::vector<int64_t>> token_map, bool keep_quant, ActQuant act_quant,
    DType kv_dtype) {
  if constexpr (std::is_same_v<Model, DeepseekV3Model>) {
    return [dir, keep_quant, act_quant, kv_dtype](Backend& b, const ExpertFilter& resident) {
      auto model = DeepseekV3Model::load(dir, b, keep_quant ? V3WeightStorage::kFP8 : V3WeightStorage::kF32, resident);
      model->set_activation_quant(act_quant);
      model->set_kv_cache_dtype(kv_dtype);
      return model;
    };
  } else {
    return [dir, token_map, keep_quant, act_quant, kv_dtype](Backend& b, const ExpertFilter& resident) {
      auto model = DeepseekV4Model::load(dir, b, token_map, keep_quant, resident);
      model->set_activation_quant(act_quant);
      model->set_kv_cache_dtype(kv_dtype);
      return model;
    };
  }
}

}  // namespace

void add_device_execution_flags(CLI::App* sub, std::string& weight_format, std::string& activation_quant,
                                bool& enforce_eager, bool& batch_invariant, std::vector<std::string>& kernel_choices,
                                std::string& kv_cache_dtype) {
  sub->add_option("--kv-cache-dtype", kv_cache_dtype,
                  "the paged attention caches: f32 (the rows as computed), bf16 (rounded to bf16 as written, as "
                  "vLLM keeps them in the model's dtype: half the bytes a decode step reads, twice the cached tokens; "
                  "lossless for V4.1, whose cached rows are fake-quantized), fp8 (V4.1: the rows' FP8 / FP4 "
                  "records with their block scales, as the reference stores them: lossless, ~a quarter of bf16) or "
                  "auto (bf16 for V4.1 on the CPU, f32 otherwise)")
      ->check(CLI::IsMember({"auto", "f32", "bf16", "fp8"}))
      ->capture_default_str();
  sub->add_option(
         "--weight-format", weight_format,
         "how a checkpoint's block-format weights (V3 FP8; V4/V4.1 FP8 projections and MXFP4 experts) are held: auto "
         "(kept quantized on CUDA, also under ep/dp/cp; f32 on the CPU), f32 (dequantized: exact against "
         "the f32 reference) or fp8 (kept quantized)")
      ->check(CLI::IsMember({"auto", "f32", "fp8"}))
      ->capture_default_str();
  sub->add_option("--activation-quant", activation_quant,
                  "how the inputs of GEMMs over block-format weights are rounded: none (transformers' numerics, "
                  "the default), mxfp8 (V4/V4.1, the reference's and vLLM's: e4m3 per 32 values with a "
                  "power-of-two scale) or fp8 (the V3 family, the reference's gemm_impl fp8, vLLM's and SGLang's: "
                  "e4m3 per 128 values with an f32 scale, power-of-two under scale_fmt ue8m0)")
      ->check(CLI::IsMember({"none", "mxfp8", "fp8"}))
      ->capture_default_str();
  sub->add_flag("--enforce-eager", enforce_eager,
                "CUDA: launch every decode step op by op (default: batched decode steps recorded as CUDA graphs)");
  sub->add_flag("--batch-invariant", batch_invariant,
                "a request's output is bit-identical whatever else is in the batch (CUDA: fixed-order GEMMs and "
                "attention splits, slower; the CPU backend always is)");
  sub->add_option("--kernel-choice", kernel_choices,
                  "CUDA: KEY=VALUE, repeatable: run under a kept or opt-in kernel of the CUDA backend instead of the "
                  "default, for an A/B on this checkpoint (the keys of `deepinfer bench --kernel-choice`: README, "
                  "docs/ENGINE.md); every rank takes them");
}

EngineSetup::EngineSetup(const EngineSetupArgs& a, StreamCallback on_delta) {
  DI_CHECK(a.kv_budget_mb >= 1) << "kv_budget_mb must be >= 1, got " << a.kv_budget_mb;
  const char* env = std::getenv("DEEPINFER_HF_MODEL_DIR");
  ResolvedModel m = resolve_model_dir(a.model.empty() ? std::nullopt : std::optional<std::string>(a.model),
                                      env ? std::optional<std::string>(env) : std::nullopt, embedded_model_dir());
  DI_LOG_INFO("model resolved from {}: {}", m.source, m.dir);
  EngineStackOptions o;
  o.model_dir = m.dir;
  o.device = a.device;
  o.threads = a.threads;
  o.engram_token_map_file = a.engram_token_map_file;
  o.max_num_seqs = a.max_num_seqs;
  o.max_model_len = a.max_model_len;
  o.max_num_batched_tokens = a.max_num_batched_tokens;
  o.gpu_memory_utilization = a.gpu_memory_utilization;
  o.host_kv_budget_bytes = a.kv_budget_mb * 1000 * 1000;
  o.seed = a.seed;
  o.exact_prefill = a.exact_prefill;
  o.decode_graphs = !a.enforce_eager;
  o.batch_invariant = a.batch_invariant;
  o.async_scheduling = a.async_scheduling;
  o.batch_decode = a.batch_decode;
  o.device_argmax = a.device_argmax;
  o.weight_format = a.weight_format;
  o.activation_quant = a.activation_quant;
  o.kv_cache_dtype = a.kv_cache_dtype;
  o.kernel_choices = a.kernel_choices;
  o.scheduling_policy = parse_scheduling_policy(a.scheduling_policy);
  o.ep = a.ep;
  o.dp = a.dp;
  o.eplb_interval = a.eplb_interval;
  o.eplb_slots = a.eplb_slots;
  o.ep_fp8_dispatch = a.ep_fp8_dispatch;
  o.cp = a.cp;
  o.speculative = a.speculative;
  o.num_draft_tokens = a.num_draft_tokens;
  o.draft_sampling = a.draft_sampling;
  o.draft_confidence_threshold = a.draft_confidence_threshold;
  o.draft_token_budget = a.draft_token_budget;
  keep_quantized_weights(o);  // a bad --weight-format or --activation-quant fails here, before any rank process starts
  const ModelConfig file_config = load_model_config(m.dir + "/config.json");
  const ActQuant act_quant = activation_quant_of(o, file_config);
  const DType kv_dtype = kv_cache_dtype_of(o, file_config);
  const bool ep_dp = ParallelLayout::make(a.ep, a.dp).world > 1;
  const ParallelLayout playout = ParallelLayout::make(a.ep, a.dp, 0, ep_dp ? a.cp : 1);
  const bool v3_family = file_config.family == ModelFamily::kDeepseekV3;
  if (playout.world > 1 && a.device == "cuda") {
    // One process per GPU, joined before anything touches a device (DistributedModelRunner; with --cp each DP
    // shard's ranks are its CP group).
    process_world_ = ProcessWorld::start(playout);
    DI_LOG_INFO("parallel layout: {} (one process per GPU, NCCL)", playout.str());
    if (v3_family)
      start_expert_parallel<DeepseekV3Model>(a, m.dir, playout, o, act_quant, kv_dtype);
    else
      start_expert_parallel<DeepseekV4Model>(a, m.dir, playout, o, act_quant, kv_dtype);
    if (worker_) return;
  } else if (a.cp > 1 && a.device == "cuda") {
    // Context parallelism across GPUs: one process per CP rank; rank 0 runs the engine (CpDriverRunner).
    process_world_ = ProcessWorld::start(ParallelLayout::make(1, 1, a.cp));
    DI_LOG_INFO("context parallel: {} processes (one per GPU, NCCL)", a.cp);
    if (!process_world_->is_driver()) {
      if (v3_family)
        follow_context_parallel<DeepseekV3Model>(a, m.dir, keep_quantized_weights(o), act_quant, kv_dtype,
                                                 kernel_choices_of(o));
      else
        follow_context_parallel<DeepseekV4Model>(a, m.dir, keep_quantized_weights(o), act_quant, kv_dtype,
                                                 kernel_choices_of(o));
      worker_ = true;
      return;
    }
    o.cp_world = &process_world_->comm();
  }
  stack_ = load_engine_stack(o);
  engine_ = stack_->make_engine(std::move(on_delta));
}

template <typename Model>
void EngineSetup::start_expert_parallel(const EngineSetupArgs& a, const std::string& dir, const ParallelLayout& layout,
                                        EngineStackOptions& o, ActQuant act_quant, DType kv_dtype) {
  const int gpu = process_world_->env().local_rank;
  const bool invariant = a.batch_invariant;
  const cuda::KernelChoices choices = kernel_choices_of(o);
  auto make_rank_backend = [gpu, invariant, choices](int) { return make_rank_cuda_backend(gpu, invariant, choices); };
  if (!process_world_->is_driver()) {
    // A worker: serve rank 0's jobs until it stops, then the command ends (no engine here). The options match
    // the driver's (load_engine_stack: one state slot per max_num_seqs).
    ParallelRunnerOptions po;
    po.layout = layout;
    po.num_slots = a.max_num_seqs;
    po.runner.exact_prefill = a.exact_prefill;
    po.runner.decode_graphs = !a.enforce_eager;
    po.model_dir = dir;
    po.eplb_interval = a.eplb_interval;
    po.eplb_slots = a.eplb_slots;
    po.fp8_dispatch = a.ep_fp8_dispatch;
    po.keep_quant = keep_quantized_weights(o);  // as load_engine_stack resolves them on rank 0
    po.act_quant = act_quant;
    po.kv_cache_dtype = kv_dtype;
    run_parallel_worker<Model>(process_world_->comm(), po, make_rank_backend,
                               model_loader<Model>(dir, read_token_map(a.engram_token_map_file), po.keep_quant,
                                                   po.act_quant, po.kv_cache_dtype));
    worker_ = true;
    return;
  }
  o.make_parallel_runner = [this, make_rank_backend, dir](const ParallelRunnerOptions& po,
                                                          std::optional<std::vector<int64_t>> token_map) {
    return std::unique_ptr<ModelRunner>(std::make_unique<DistributedModelRunner<Model>>(
        process_world_->comm(), po, make_rank_backend,
        model_loader<Model>(dir, std::move(token_map), po.keep_quant, po.act_quant, po.kv_cache_dtype)));
  };
}

template <typename Model>
void EngineSetup::follow_context_parallel(const EngineSetupArgs& a, const std::string& dir, bool keep_quant,
                                          ActQuant act_quant, DType kv_dtype, const cuda::KernelChoices& choices) {
  Communicator& world = process_world_->comm();
  std::unique_ptr<Backend> backend =
      make_rank_cuda_backend(process_world_->env().local_rank, a.batch_invariant, choices);
  // The same weights as the driver computes with (block formats kept or dequantized alike).
  std::unique_ptr<Model> model =
      model_loader<Model>(dir, read_token_map(a.engram_token_map_file), keep_quant, act_quant, kv_dtype)(*backend, {});
  // The driver's runner options (load_engine_stack: one state slot per max_num_seqs).
  ModelRunnerOptions ro;
  ro.exact_prefill = a.exact_prefill;
  ro.decode_graphs = !a.enforce_eager;
  SlotModelRunner<Model> follower(*model, a.max_num_seqs, ro);
  follower.set_context_parallel(world.size(), make_communicator_cp_launcher(world), /*follower=*/true);
  run_cp_follower(world, follower);
  DI_LOG_INFO("context-parallel follower: rank {} ran {} prompt chunk(s)", world.rank(), follower.cp_chunks());
}

EngineSetup::~EngineSetup() {
  engine_.reset();  // before the runner it drives
}

std::vector<TokenId> EngineSetup::encode(const std::string& text, const std::string& what) const {
  DI_CHECK_CODE(tokenizer() != nullptr, ErrorCode::kInvalidArgument)
      << what << ": text prompts need " << model_dir() << "/tokenizer.json; pass token ids (--prompt-ids) instead";
  std::vector<TokenId> ids = tokenizer()->encode(text);
  DI_CHECK(!ids.empty()) << what << ": '" << text << "' encodes to no tokens";
  return ids;
}

std::string EngineSetup::decode(std::span<const TokenId> ids) const {
  return tokenizer() ? tokenizer()->decode(ids) : std::string();
}

std::string prefill_work_line(const EngineStats& st) {
  const int64_t all = st.model.layer_tokens + st.model.layer_tokens_skipped;
  return fmt::format("prefill work: {} layer-tokens run, {} skipped by bounded replay ({:.1f}% saved)",
                     st.model.layer_tokens, st.model.layer_tokens_skipped,
                     all ? 100.0 * static_cast<double>(st.model.layer_tokens_skipped) / all : 0.0) +
         (st.model.decode_graph_recordings > 0
              ? fmt::format("\ndecode graphs: {} recorded, {} steps replayed, {} batched steps eager",
                            st.model.decode_graph_recordings, st.model.decode_graph_replays,
                            st.model.decode_steps_eager)
              : std::string());
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
