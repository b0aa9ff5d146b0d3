#include "deepinfer/engine/engine_factory.h"

#include <algorithm>
#include <filesystem>
#include <optional>
#include <vector>

#include "deepinfer/core/error.h"
#include "deepinfer/core/logging.h"
#include "deepinfer/engine/structured_output.h"
#include "deepinfer/engine/v3_model_runner.h"
#include "deepinfer/engine/v4_model_runner.h"
#include "deepinfer/io/safetensors.h"
#include "deepinfer/model/deepseek_v3.h"
#include "deepinfer/model/deepseek_v4.h"
#include "deepinfer/model/dspark_draft.h"
#include "deepinfer/ops/kernel_choice_args.h"
#include "deepinfer/parallel/cp_process_runner.h"
#include "deepinfer/parallel/parallel_model_runner.h"
#include "deepinfer/spec/dspark_proposer.h"
#include "deepinfer/spec/mtp_proposer.h"
#include "deepinfer/structured/grammar_compiler.h"
#ifdef DEEPINFER_WITH_CUDA
#include "deepinfer/ops/cuda/cuda_backend.h"
#include "deepinfer/ops/cuda/cuda_runtime.h"
#include "deepinfer/ops/cuda/cuda_step_hooks.h"
#endif

namespace deepinfer {
namespace {

// "--device cuda" or "device='cuda'".
std::string option(const EngineStackOptions& o, const std::string& name, const std::string& value) {
  if (o.spelling == OptionSpelling::kKeyword) return name + "='" + value + "'";
  std::string flag = "--" + name;
  for (char& c : flag)
    if (c == '_') c = '-';
  return flag + " " + value;
}

// The runner's device hooks on CUDA (GPU timeline, greedy fast path on the device); none on the CPU.
template <typename Runner>
void set_device_hooks(Runner& r, Backend& backend, const EngineStackOptions& o) {
#ifdef DEEPINFER_WITH_CUDA
  if (o.device == "cuda") r.set_device_hooks(make_cuda_step_hooks(static_cast<CudaBackend&>(backend)));
#else
  (void)r, (void)backend, (void)o;
#endif
}

spec::MtpDraftSampling mtp_draft_sampling(const EngineStackOptions& o) {
  return o.draft_sampling == "sampled" ? spec::MtpDraftSampling::kSampled : spec::MtpDraftSampling::kGreedy;
}

// The CPU reference, or CUDA device 0 (weights, activations and caches in device memory; only the logits come
// back to the host for sampling), under `choices` (kernel_choices_of(o)).
std::unique_ptr<Backend> make_backend(const EngineStackOptions& o,
                                      [[maybe_unused]] const cuda::KernelChoices& choices) {
  if (o.device == "cpu") return make_cpu_backend(o.threads);
  DI_CHECK(o.device == "cuda") << (o.spelling == OptionSpelling::kKeyword ? "device must be 'cpu' or 'cuda', got '"
                                                                          : "--device must be cpu or cuda, got '")
                               << o.device << "'";
  const std::string dev = option(o, "device", o.device);
#ifdef DEEPINFER_WITH_CUDA
  DI_CHECK_CODE(cuda::device_count() > 0, ErrorCode::kNotFound)
      << dev << ": no CUDA device is visible (check nvidia-smi and CUDA_VISIBLE_DEVICES)";
  auto backend = make_cuda_backend(0);
  backend->set_batch_invariant(o.batch_invariant);
  backend->set_kernel_choices(choices);
  return backend;
#else
  DI_FAIL(ErrorCode::kUnsupported) << dev
                                   << ": this deepinfer was built without CUDA (configure with "
                                      "-DDEEPINFER_ACCELERATOR=nvidia)";
#endif
}

// The CP ranks' host: this process's rank of a process world, or in-process threads.
CpLauncher cp_launcher(const EngineStackOptions& o) {
  return o.cp_world ? make_communicator_cp_launcher(*o.cp_world) : make_in_process_cp_launcher(o.cp);
}

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

// Config vocabularies are padded past the tokenizer's: ids that name no token add no text (never throw).
std::vector<TokenId> known_ids(const tokenizer::Tokenizer& tok, std::span<const TokenId> ids) {
  std::vector<TokenId> out;
  out.reserve(ids.size());
  for (TokenId t : ids)
    if (tok.is_valid_id(t)) out.push_back(t);
  return out;
}

}  // namespace

EngineStack::~EngineStack() = default;

int64_t device_weight_bytes(const EngineStackOptions& o) {
  const bool ep = o.ep > 1;
  ModelConfig c;
  if (ep) c = load_model_config(o.model_dir + "/config.json");
  // A main layer's routed expert (V4 "layers.N.ffn.experts.", V3 "model.layers.N.mlp.experts."); draft / MTP
  // blocks ("mtp.", V3 layers past num_hidden_layers) keep every expert on every rank.
  auto placed = [&](const std::string& name) {
    if (name.find(".experts.") == std::string::npos || name.rfind("mtp.", 0) == 0) return false;
    const std::string v3 = "model.layers.";
    if (name.rfind(v3, 0) != 0) return true;
    return std::stoi(name.substr(v3.size())) < c.num_layers;
  };
  int64_t total = 0, routed = 0;
  for (const auto& e : std::filesystem::directory_iterator(o.model_dir)) {
    if (!e.is_regular_file() || e.path().extension() != ".safetensors") continue;
    total += static_cast<int64_t>(e.file_size());
    if (!ep) continue;
    auto f = SafetensorsFile::open(e.path().string());
    for (const SafetensorsEntry& t : f->entries())
      if (placed(t.name)) routed += static_cast<int64_t>(t.end - t.begin);
  }
  if (!ep || routed == 0) return total;
  const int E = std::max(1, c.moe.n_routed_experts);
  const int slots =
      o.eplb_interval > 0 ? (o.eplb_slots > 0 ? o.eplb_slots : default_eplb_slots(c, o.ep)) : (E + o.ep - 1) / o.ep;
  return total - routed + routed * std::min(slots, E) / E;
}

std::unique_ptr<Engine> EngineStack::make_engine(StreamCallback on_delta) {
  return std::make_unique<Engine>(engine_config, *runner, std::move(on_delta));
}

int64_t kv_cache_budget_bytes(const EngineStackOptions& o) {
  DI_CHECK(o.gpu_memory_utilization > 0.0 && o.gpu_memory_utilization <= 1.0)
      << "gpu_memory_utilization must be in (0, 1], got " << o.gpu_memory_utilization;
  DI_CHECK(o.host_kv_budget_bytes > 0) << "the host KV cache budget must be positive, got " << o.host_kv_budget_bytes
                                       << " bytes";
#ifdef DEEPINFER_WITH_CUDA
  if (o.device == "cuda") {
    const int64_t weight_bytes = device_weight_bytes(o);
    const cuda::DeviceInfo info = cuda::select_device(0);
    // Activations of the reference forward are small next to the weights at these batch sizes; keep 5% of the
    // device for them and the allocator's slack.
    const int64_t total = static_cast<int64_t>(info.total_memory);
    const int64_t budget = kv_budget_bytes(total, o.gpu_memory_utilization, weight_bytes, total / 20);
    DI_LOG_INFO("cache budget: {:.2f} * {:.1f} GiB ({}) - weights - activations = {:.1f} MiB", o.gpu_memory_utilization,
                static_cast<double>(total) / (1 << 30), info.name, static_cast<double>(budget) / (1 << 20));
    return budget;
  }
#endif
  DI_LOG_INFO("cache budget: {:.1f} MB of host memory (gpu_memory_utilization applies to devices)",
              static_cast<double>(o.host_kv_budget_bytes) / 1e6);
  return o.host_kv_budget_bytes;
}

bool keep_quantized_weights(const EngineStackOptions& o) {
  DI_CHECK(o.weight_format == "auto" || o.weight_format == "f32" || o.weight_format == "fp8")
      << option(o, "weight_format", o.weight_format) << ": must be auto, f32 or fp8";
  // Every layout keeps the same format on every rank: expert-parallel ranks their routed experts (ExpertParallel runs
  // moe_quant on the received rows; EPLB moves the codes and scales), context-parallel followers (in-process or one
  // process per GPU) the whole model, as the driver does.
  if (o.weight_format == "auto") return o.device == "cuda";
  return o.weight_format == "fp8";
}

ActQuant activation_quant_of(const EngineStackOptions& o, const ModelConfig& config) {
  DI_CHECK(o.activation_quant == "none" || o.activation_quant == "mxfp8" || o.activation_quant == "fp8")
      << option(o, "activation_quant", o.activation_quant) << ": must be none, mxfp8 or fp8";
  if (o.activation_quant == "none") return ActQuant::kNone;
  // Each family's reference: V4 per 32 values with power-of-two scales, the V3 family per 128 with f32 scales
  // (power-of-two ones where its config says scale_fmt ue8m0, V3.1).
  if (o.activation_quant == "mxfp8") {
    DI_CHECK_CODE(config.is_v4_family(), ErrorCode::kUnsupported)
        << option(o, "activation_quant", o.activation_quant) << ": mxfp8 is DeepSeek-V4 / V4.1's rounding; "
        << family_name(config.family) << " rounds per 128 values (fp8)";
    return ActQuant::kMxfp8;
  }
  DI_CHECK_CODE(!config.is_v4_family(), ErrorCode::kUnsupported)
      << option(o, "activation_quant", o.activation_quant) << ": fp8 is the DeepSeek-V3 family's rounding; "
      << family_name(config.family) << " rounds per 32 values (mxfp8)";
  return config.quant.scale_ue8m0 ? ActQuant::kFp8Block128Ue8m0 : ActQuant::kFp8Block128;
}

DType kv_cache_dtype_of(const EngineStackOptions& o, const ModelConfig& config) {
  DI_CHECK(o.kv_cache_dtype == "auto" || o.kv_cache_dtype == "f32" || o.kv_cache_dtype == "bf16" ||
           o.kv_cache_dtype == "fp8")
      << option(o, "kv_cache_dtype", o.kv_cache_dtype) << ": must be auto, f32, bf16 or fp8";
  // auto: bf16 only where it changes no value (V4.1's rows are already FP8 / FP4): half the bytes, and on an H200 a
  // decode step as fast as over f32 pools (docs/PERF.md, session 42); the fp8 records are slower to decode there.
  if (o.kv_cache_dtype == "auto") return cached_rows_quantized(config) ? DType::kBF16 : DType::kF32;
  if (o.kv_cache_dtype == "fp8") {
    DI_CHECK_CODE(cached_rows_quantized(config), ErrorCode::kUnsupported)
        << option(o, "kv_cache_dtype", o.kv_cache_dtype)
        << ": fp8 keeps the FP8 / FP4 records of the rows V4.1 fake-quantizes; " << family_name(config.family)
        << (config.family == ModelFamily::kDeepseekV41 ? " with head or indexer widths outside whole 32-value blocks"
                                                       : "")
        << " caches unquantized rows (bf16 halves them)";
    return DType::kF8E4M3;
  }
  return o.kv_cache_dtype == "bf16" ? DType::kBF16 : DType::kF32;
}

cuda::KernelChoices kernel_choices_of(const EngineStackOptions& o) {
  DI_CHECK(o.kernel_choices.empty() || o.device != "cpu")
      << option(o, "kernel_choice", o.kernel_choices.front())
      << ": kernel choices are the CUDA backend's (device cuda); the CPU backend has none";
  return parse_kernel_choices(o.kernel_choices);
}

std::unique_ptr<EngineStack> load_engine_stack(const EngineStackOptions& o) {
  namespace fs = std::filesystem;
  DI_CHECK(o.max_num_seqs > 0) << "max_num_seqs must be positive, got " << o.max_num_seqs;
  DI_CHECK(o.max_model_len > 0) << "max_model_len must be positive, got " << o.max_model_len;
  DI_CHECK(o.max_num_batched_tokens > 0) << "max_num_batched_tokens must be positive, got " << o.max_num_batched_tokens;
  const std::string cfg_path = o.model_dir + "/config.json";
  DI_CHECK_CODE(fs::exists(cfg_path), ErrorCode::kNotFound)
      << "model directory '" << o.model_dir << "' has no config.json";
  DI_CHECK(o.speculative == "off" || o.speculative == "mtp" || o.speculative == "dspark")
      << (o.spelling == OptionSpelling::kKeyword ? "speculative must be 'off', 'mtp' or 'dspark', got '"
                                                 : "--speculative must be off, mtp or dspark, got '")
      << o.speculative << "'";
  DI_CHECK(o.num_draft_tokens >= 1 && o.num_draft_tokens <= 16)
      << option(o, "num_draft_tokens", std::to_string(o.num_draft_tokens)) << ": must be in [1, 16]";
  DI_CHECK(o.draft_sampling == "greedy" || o.draft_sampling == "sampled")
      << option(o, "draft_sampling", o.draft_sampling) << ": must be greedy or sampled";
  DI_CHECK(o.draft_sampling == "greedy" || o.speculative == "mtp")
      << option(o, "draft_sampling", o.draft_sampling) << ": sampled drafts are for --speculative mtp (DSpark drafts "
      << "greedily from its Markov head)";
  DI_CHECK(o.draft_confidence_threshold >= 0.0 && o.draft_confidence_threshold <= 1.0)
      << option(o, "draft_confidence_threshold", std::to_string(o.draft_confidence_threshold)) << ": must be in [0, 1]";
  DI_CHECK(o.draft_token_budget >= 0) << option(o, "draft_token_budget", std::to_string(o.draft_token_budget))
                                      << ": must be >= 0 (0: no cap)";
  auto st = std::make_unique<EngineStack>();
  EngineStack& s = *st;
  s.model_dir = o.model_dir;
  DI_CHECK(o.cp >= 1) << option(o, "cp", std::to_string(o.cp)) << ": must be >= 1";
  // EP/DP runners (ep·dp > 1) host CP themselves: each DP shard's ranks are its CP group.
  const bool parallel = ParallelLayout::make(o.ep, o.dp).world > 1;
  const ParallelLayout playout = ParallelLayout::make(o.ep, o.dp, 0, parallel ? o.cp : 1);
  DI_CHECK_CODE(!parallel || o.speculative == "off", ErrorCode::kUnsupported)
      << option(o, "speculative", o.speculative) << " with ep*dp > 1: speculative decoding runs on one rank only";
  DI_CHECK_CODE(!parallel || o.device == "cpu" || o.make_parallel_runner, ErrorCode::kUnsupported)
      << option(o, "device", o.device) << " with ep*dp > 1: the in-process ranks run on the CPU backend";
  // The MTP proposer needs the target's hidden state of every prompt position on one rank.
  DI_CHECK_CODE(o.cp == 1 || o.speculative == "off", ErrorCode::kUnsupported)
      << option(o, "speculative", o.speculative) << " together with " << option(o, "cp", std::to_string(o.cp))
      << " is not supported yet";
  DI_CHECK_CODE(o.cp == 1 || parallel || o.device == "cpu" || o.cp_world, ErrorCode::kUnsupported)
      << option(o, "cp", std::to_string(o.cp)) << " on " << option(o, "device", o.device)
      << ": in-process context-parallel ranks run on the CPU backend; across GPUs they run one process per GPU "
         "over NCCL (the deepinfer CLI; docs/CONTEXT_PARALLEL.md)";
  DI_CHECK_INTERNAL(!o.cp_world || o.cp_world->size() == o.cp)
      << "cp " << o.cp << " with a process world of " << o.cp_world->size();
  const bool keep_fp8 = keep_quantized_weights(o);
  const cuda::KernelChoices choices = kernel_choices_of(o);  // a bad spec fails before anything loads
  if (const std::string d = describe_kernel_choices(choices); !d.empty())
    DI_LOG_INFO("kernel choices: {} (kernel_choice)", d);
  const ModelConfig file_config = load_model_config(cfg_path);
  const ActQuant act_quant = activation_quant_of(o, file_config);
  const DType kv_dtype = kv_cache_dtype_of(o, file_config);
  if (act_quant != ActQuant::kNone && !file_config.quant.fp8 && !file_config.quant.experts_fp4)
    DI_LOG_WARN("activations: {} asked, but {} stores no FP8 / MXFP4 weights: nothing is rounded (--activation-quant)",
                act_quant_name(act_quant), o.model_dir);
  else if (act_quant != ActQuant::kNone)
    DI_LOG_INFO("activations: {} before every GEMM over block-format weights (--activation-quant)",
                act_quant_name(act_quant));
  const int64_t budget = kv_cache_budget_bytes(o);
  if (!parallel) s.backend = make_backend(o, choices);  // parallel: every rank makes its own
  DI_LOG_INFO("device: {}", o.device);

  std::optional<std::vector<int64_t>> token_map;
  if (!o.engram_token_map_file.empty()) {
    auto f = SafetensorsFile::open(o.engram_token_map_file);
    Tensor t = f->tensor("engram.token_map");
    DI_CHECK(t.dtype() == DType::kI64) << o.engram_token_map_file << ": engram.token_map must be I64";
    token_map = std::vector<int64_t>(t.data_as<int64_t>(), t.data_as<int64_t>() + t.numel());
  }
  if (parallel) {
    DI_LOG_INFO("weights: {}", keep_fp8 ? "block-format matrices (FP8, MXFP4) kept quantized on every rank, each "
                                          "loading only its routed experts (--weight-format)"
                                        : "f32 on every rank, block-format matrices dequantized at load "
                                          "(--weight-format)");
    s.parallel_config = file_config;
    s.config = &s.parallel_config;
    DI_CHECK(s.parallel_config.moe.n_routed_experts >= o.ep)
        << option(o, "ep", std::to_string(o.ep)) << ": the model has only " << s.parallel_config.moe.n_routed_experts
        << " routed experts per layer (each EP rank needs at least one)";
  } else if (file_config.family == ModelFamily::kDeepseekV3) {
    // The family in config.json picks the forward and its runner: V3 (V3/R1/V3.1/V2-Lite) or V4/V4.1.
    // auto on CUDA in one process also keeps a bf16 FFN (V2-Lite's experts) as stored: half f32's bytes, the expert
    // GEMMs on the tensor cores (outside batch-invariant mode, which has no bf16 expert kernel; not with --cp, whose
    // followers load as the parallel layouts do).
    const bool stored = keep_fp8 && o.weight_format == "auto" && !o.batch_invariant && o.cp == 1;
    s.v3 = DeepseekV3Model::load(
        o.model_dir, *s.backend,
        stored ? V3WeightStorage::kStored : (keep_fp8 ? V3WeightStorage::kFP8 : V3WeightStorage::kF32));
    s.v3->set_activation_quant(act_quant);
    s.v3->set_kv_cache_dtype(kv_dtype);
    if (kv_dtype == DType::kBF16) DI_LOG_INFO("KV cache: bf16, rows rounded as written (--kv-cache-dtype)");
    DI_LOG_INFO("weights: {}", stored
                                   ? "FP8 block-scaled matrices kept quantized, a bf16 FFN as stored (--weight-format)"
                               : keep_fp8 ? "FP8 block-scaled matrices kept quantized (--weight-format)"
                                          : "f32, FP8 block-scaled matrices dequantized at load (--weight-format)");
    s.config = &s.v3->config();
  } else {
    // The same resolution as V3: block-format matrices (FP8 projections and shared expert, MXFP4 routed experts)
    // stay quantized on CUDA by default (every layout), f32 on the CPU and with --weight-format f32.
    s.v4 = DeepseekV4Model::load(o.model_dir, *s.backend, token_map, keep_fp8);
    s.v4->set_activation_quant(act_quant);
    s.v4->set_kv_cache_dtype(kv_dtype);
    if (kv_dtype == DType::kF8E4M3)
      DI_LOG_INFO(
          "KV cache: fp8 records (lossless: FP8 window rows, FP4 entries and indexer keys with their block "
          "scales, as the reference stores them) (--kv-cache-dtype)");
    if (kv_dtype == DType::kBF16)
      DI_LOG_INFO("KV cache: bf16 ({}) (--kv-cache-dtype)",
                  cached_rows_quantized(file_config)
                      ? "lossless: V4.1 caches FP8 / FP4 fake-quantized rows, each a bf16 value"
                      : "rows rounded as written");
    DI_LOG_INFO("weights: {}", keep_fp8 ? "block-format matrices (FP8, MXFP4) kept quantized (--weight-format)"
                                        : "f32, block-format matrices dequantized at load (--weight-format)");
    const OwnedTensor& head = s.v4->weights().head;
    DI_LOG_INFO("output head: {}, {:.2f} GB", head.dtype() == DType::kBF16 ? "bf16 as stored" : "f32",
                static_cast<double>(owned_bytes(head)) / 1e9);
    s.config = &s.v4->config();
  }
  const ModelConfig& cfg = *s.config;
  if (fs::exists(o.model_dir + "/tokenizer.json"))
    s.tokenizer = tokenizer::Tokenizer::from_file(o.model_dir + "/tokenizer.json");
  else
    DI_LOG_WARN("{} has no tokenizer.json: only token-id prompts are accepted", o.model_dir);

  s.max_model_len = o.max_model_len;
  if (cfg.max_position_embeddings > 0 && s.max_model_len > cfg.max_position_embeddings) {
    DI_LOG_INFO("max_model_len {} exceeds the model's max_position_embeddings {}: using {}", o.max_model_len,
                cfg.max_position_embeddings, cfg.max_position_embeddings);
    s.max_model_len = cfg.max_position_embeddings;
  }

  // The runner first: the cache is sized from what it really stores per block and per slot.
  ModelRunnerOptions ro;
  ro.exact_prefill = o.exact_prefill;
  ro.decode_graphs = o.decode_graphs;
  ro.batch_decode = o.batch_decode;
  ro.device_argmax = o.device_argmax;
  if (parallel) {
    ParallelRunnerOptions po;
    po.layout = playout;
    po.num_slots = o.max_num_seqs;
    po.runner = ro;
    po.model_dir = o.model_dir;
    po.eplb_interval = o.eplb_interval;
    po.eplb_slots = o.eplb_slots;
    po.fp8_dispatch = o.ep_fp8_dispatch;
    po.keep_quant = keep_fp8;
    po.act_quant = act_quant;
    po.kv_cache_dtype = kv_dtype;
    if (o.make_parallel_runner) {
      s.runner = o.make_parallel_runner(po, token_map);
    } else {
      s.runner = make_parallel_runner(po, o.threads, token_map);
      DI_LOG_INFO("parallel layout: {} (in-process ranks)", playout.str());
    }
  } else if (s.v3) {
    auto r = std::make_unique<V3ModelRunner>(*s.v3, o.max_num_seqs, ro);
    set_device_hooks(*r, *s.backend, o);
    if (o.cp > 1) r->set_context_parallel(o.cp, cp_launcher(o));
    if (o.speculative == "mtp")
      r->set_proposer(std::make_unique<spec::MtpProposer>(*s.v3, o.max_num_seqs, mtp_draft_sampling(o)));
    DI_CHECK_CODE(o.speculative != "dspark", ErrorCode::kUnsupported)
        << option(o, "speculative", o.speculative)
        << ": DSpark drafting needs a DeepSeek-V4.1 or V4-Flash-0731 checkpoint with DSpark draft weights (this is "
           "a DeepSeek-V3 family model; its MTP layer drafts with --speculative mtp)";
    s.runner = std::move(r);
  } else {
    auto r = std::make_unique<V4ModelRunner>(*s.v4, o.max_num_seqs, ro);
    set_device_hooks(*r, *s.backend, o);
    if (o.cp > 1) r->set_context_parallel(o.cp, cp_launcher(o));
    if (o.speculative == "mtp") {
      const std::string why = V4MtpDraft::unavailable_reason(*s.v4);
      DI_CHECK_CODE(why.empty(), ErrorCode::kUnsupported)
          << option(o, "speculative", o.speculative) << ": " << why
          << (s.v4->config().draft.kind == DraftKind::kDSpark ? " (this checkpoint drafts with --speculative dspark)"
                                                              : "");
      r->set_proposer(std::make_unique<spec::V4MtpProposer>(*s.v4, o.max_num_seqs, mtp_draft_sampling(o)));
    }
    if (o.speculative == "dspark") {
      const std::string why = DsparkDraft::unavailable_reason(*s.v4);
      DI_CHECK_CODE(why.empty(), ErrorCode::kUnsupported) << option(o, "speculative", o.speculative) << ": " << why;
      r->set_proposer(std::make_unique<spec::DsparkProposer>(*s.v4, o.max_num_seqs));
    }
    s.runner = std::move(r);
    log_prefill_mode(*s.v4, o.exact_prefill);
  }
  if (o.cp_world) s.runner = std::make_unique<CpDriverRunner>(*o.cp_world, std::move(s.runner));
  if (o.cp > 1)
    DI_LOG_INFO("context parallel: prompt chunks of >= {} tokens split zig-zag over {} {}", 2 * o.cp, o.cp,
                parallel     ? "ranks of each DP shard"
                : o.cp_world ? "processes (one per GPU)"
                             : "in-process ranks");
  s.layout = make_kv_layout(cfg);
  // The parallel runners' caches live in their ranks: the design formats size the cache.
  if (!parallel) s.layout.storage = s.runner->kv_footprint(s.layout.block_size);
  s.sizing = size_kv_cache(s.layout, budget, o.max_num_seqs, s.max_model_len);
  log_kv_sizing(s.layout, s.sizing, s.max_model_len);

  EngineConfig& ec = s.engine_config;
  ec.scheduler.max_num_seqs = o.max_num_seqs;
  ec.scheduler.max_model_len = s.max_model_len;
  ec.scheduler.max_num_batched_tokens = o.max_num_batched_tokens;
  ec.scheduler.policy = o.scheduling_policy;
  ec.seed = o.seed;
  ec.async_scheduling = o.async_scheduling;
  for (int64_t e : cfg.eos_token_ids) ec.eos_token_ids.push_back(static_cast<TokenId>(e));
  if (s.tokenizer) {
    const tokenizer::Tokenizer* tok = s.tokenizer.get();
    ec.detokenize = [tok](std::span<const TokenId> ids) { return tok->decode(known_ids(*tok, ids)); };
    // Structured output needs each token's bytes on their own; a tokenizer with separators cannot give them, and
    // constrained requests then fail naming the reason.
    try {
      ec.grammar_compiler = std::make_shared<structured::GrammarCompiler>(
          make_structured_tokenizer_info(*tok, ec.eos_token_ids, cfg.vocab_size));
    } catch (const Error& e) {
      s.structured_unavailable = e.message();
      DI_LOG_WARN("structured output disabled: {}", e.message());
    }
  } else {
    s.structured_unavailable = o.model_dir + " has no tokenizer.json";
  }
  // Prefix reuse when the runner's caches are paged; its replay (if any) rebuilds per-sequence state exactly.
  ec.kv = make_kv_cache_config(s.layout, s.sizing, s.runner->prefix_cache_supported(), /*allow_bounded_replay=*/true);
  ec.kv.prefix_replay_tokens = s.runner->prefix_replay_tokens();
  if (o.speculative != "off") {
    ec.num_draft_tokens = o.num_draft_tokens;
    if (o.speculative == "dspark") {
      ec.draft_confidence_threshold = o.draft_confidence_threshold;
      ec.draft_token_budget = o.draft_token_budget;
      DI_LOG_INFO(
          "DSpark: blocks of {} drafts, verification length from the confidence head (survival >= {}), per-step "
          "draft token budget {} (0: no cap)",
          s.v4->config().draft.block_size, o.draft_confidence_threshold, o.draft_token_budget);
    }
    DI_LOG_INFO("speculative decoding: {} with {} draft token(s) per step (synchronous scheduling)", o.speculative,
                o.num_draft_tokens);
  }
  DI_LOG_INFO("scheduling: {}, policy {} (max_num_seqs {}, max_num_batched_tokens {}, max_model_len {})",
              o.async_scheduling ? "asynchronous (step N+1 planned while step N runs)" : "synchronous",
              scheduling_policy_name(o.scheduling_policy), o.max_num_seqs, o.max_num_batched_tokens, s.max_model_len);
  return st;
}

}  // namespace deepinfer
