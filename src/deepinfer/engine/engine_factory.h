// load_engine_stack: a checkpoint directory → everything an Engine needs (backend, the forward of the family
// config.json names, tokenizer, model runner, cache sizing, EngineConfig). The one setup path behind
// `deepinfer generate/offline` (cli/engine_setup), the Python binding (api/llm) and the server
// (server/model_host); each adds only its own front-end concerns.
//
// Cache sizing counts what the runner really allocates (ModelRunner::kv_footprint: f32 page rows of every paged
// kind and layer, the per-slot state), not the design formats, so the memory budget admits exactly the blocks
// that fit; the startup log shows both.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "deepinfer/engine/engine.h"
#include "deepinfer/engine/model_runner.h"
#include "deepinfer/kv/kv_layout.h"
#include "deepinfer/model/model_config.h"
#include "deepinfer/ops/cuda/kernel_choices.h"
#include "deepinfer/ops/ops.h"
#include "deepinfer/tokenizer/tokenizer.h"

namespace deepinfer {

class Backend;
class Communicator;
class DeepseekV3Model;
class DeepseekV4Model;
struct ParallelRunnerOptions;

// How error messages name an option: "--device cuda" (command line, server) or "device='cuda'" (Python).
enum class OptionSpelling { kFlag, kKeyword };

struct EngineStackOptions {
  std::string model_dir;              // config.json + safetensors (tokenizer.json optional)
  std::string device = "cpu";         // cpu | cuda (device 0)
  int threads = 0;                    // CPU threads (0: all cores)
  std::string engram_token_map_file;  // V4.1 Engram token map (default: built from tokenizer.json)
  int max_num_seqs = 4;
  int64_t max_model_len = 32768;  // capped at the model's max_position_embeddings (logged)
  int64_t max_num_batched_tokens = 2048;
  SchedulingPolicyKind scheduling_policy = SchedulingPolicyKind::kFcfs;
  // Cache memory: on CUDA gpu_memory_utilization of the device minus the weights and 5% for activations; on the
  // CPU backend host_kv_budget_bytes (gpu_memory_utilization is validated but does not apply there).
  double gpu_memory_utilization = 0.85;
  int64_t host_kv_budget_bytes = 1000 * 1000 * 1000;
  uint64_t seed = 0;
  // V4.1: every layer on every prompt token (transformers parity) instead of decoder SWA bounded replay.
  bool exact_prefill = false;
  bool batch_decode = true;  // ModelRunnerOptions::batch_decode
  bool async_scheduling = true;
  bool decode_graphs = true;  // ModelRunnerOptions::decode_graphs
  bool device_argmax = true;  // ModelRunnerOptions::device_argmax (the greedy fast path's argmax on the device)
  // CUDA: CudaBackend::set_batch_invariant (a request's output independent of the rest of the batch). The CPU
  // reference is batch-invariant by construction (every row the same sequential arithmetic), so it ignores this.
  bool batch_invariant = false;
  // How a V3-family checkpoint's FP8 block-scaled weights are held: "auto" keeps them FP8 on CUDA in one process
  // (the GEMMs dequantize in the kernel: a quarter of f32's bytes per decode step) and dequantizes them to f32 on
  // the CPU reference and under expert parallelism (which moves f32 experts); "f32" always dequantizes (exact
  // against the f32 reference); "fp8" always keeps them. V4/V4.1 weights are f32 on every backend for now.
  std::string weight_format = "auto";
  // The numerics of the GEMMs over block-format weights: "none" (transformers', the default: the golden fixtures),
  // "mxfp8" (V4 / V4.1, the reference's and vLLM's: each GEMM input rounded to e4m3 per 32 values with a power-of-two
  // scale; DeepseekV4Model::set_activation_quant) or "fp8" (the V3 family, the reference's gemm_impl "fp8", vLLM's
  // and SGLang's: e4m3 per 128 values with an f32 scale, a power of two under scale_fmt ue8m0;
  // DeepseekV3Model::set_activation_quant).
  std::string activation_quant = "none";
  // The paged attention caches' element type: "f32" (the rows as computed; the golden fixtures), "bf16" (each row
  // rounded to bf16 as written, as vLLM's --kv-cache-dtype auto keeps it in the model's dtype: half the bytes a decode
  // step reads, twice the blocks; DeepseekV3Model / DeepseekV4Model::set_kv_cache_dtype), "fp8" (V4.1 on the CPU: the
  // rows' FP8 / FP4 records with their block scales, ops/kv_record.h: lossless, ~a quarter of bf16's bytes) or "auto"
  // (bf16 for V4.1 on the CPU, f32 otherwise: the CUDA kernels over bf16 V4 pools wait for a GPU run). Lossless for V4.1, whose cached rows are FP8 / FP4 fake-quantized; rounding for the
  // V3 family and V4. Every EP / DP / CP rank's model takes it.
  std::string kv_cache_dtype = "auto";
  // CUDA: the backend's kernel choices as KEY=VALUE specs (the keys of `deepinfer bench --kernel-choice`,
  // ops/kernel_choice_args.h; later specs of a key win), for A/Bs of kept or opt-in kernels on a real checkpoint;
  // empty: the defaults. Every rank's backend takes them. Refused on the CPU backend (its kernels have no choices).
  std::vector<std::string> kernel_choices;
  OptionSpelling spelling = OptionSpelling::kFlag;
  // Expert / attention data parallel sizes (docs/PARALLEL.md). ep * dp > 1: the ranks load their own models and
  // the stack holds only the config; by default they are threads of this process on CPU backends
  // (parallel/parallel_model_runner.h). EPLB every eplb_interval steps (0: off) with eplb_slots slots per EP rank.
  int ep = 1, dp = 1;
  int eplb_interval = 0, eplb_slots = 0;
  bool ep_fp8_dispatch = false;  // MoE token dispatch in FP8 (lossy; ParallelRunnerOptions::fp8_dispatch)
  // Context-parallel size for prefill (docs/CONTEXT_PARALLEL.md): prompt chunks of >= 2·cp tokens run zig-zag over
  // cp ranks: in-process ranks that share the model (CPU backend), or with cp_world one process per rank; with
  // ep·dp > 1 the EP/DP runner hosts it (each DP shard's ranks are its CP group, world = dp·cp).
  int cp = 1;
  // cp > 1 with one process per rank (the CLI's --device cuda --cp N over NCCL): this process is rank 0 of cp_world,
  // whose other ranks run run_cp_follower (parallel/cp_process_runner.h). Must outlive the stack.
  Communicator* cp_world = nullptr;
  // Speculative decoding (docs/SPECULATIVE.md): off | mtp (V3 family or V4-Flash base with MTP weights) | dspark;
  // num_draft_tokens drafts verified per decode step (synchronous scheduling then).
  std::string speculative = "off";
  int num_draft_tokens = 1;
  // mtp: greedy (argmax point masses) or sampled (drawn from the module's softmax at the request's temperature,
  // verified with that q; greedy requests keep argmax drafts); see spec/mtp_proposer.h.
  std::string draft_sampling = "greedy";
  // dspark: per request the longest draft prefix whose confidence survival stays >= the threshold is verified (0:
  // every draft), and at most draft_token_budget draft tokens per step across the batch (0: no cap beyond the
  // scheduler's reservation of num_draft_tokens per decode); see spec/dspark_policy.h.
  double draft_confidence_threshold = 0.3;
  int64_t draft_token_budget = 0;
  // ep * dp > 1: makes the runner instead of the in-process ranks (the CLI's one process per GPU over NCCL).
  std::function<std::unique_ptr<ModelRunner>(const ParallelRunnerOptions&, std::optional<std::vector<int64_t>>)>
      make_parallel_runner;
};

// Owns the parts; make_engine() builds an Engine over them (the stack must outlive it).
struct EngineStack {
  ~EngineStack();
  std::string model_dir;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<DeepseekV3Model> v3;
  std::unique_ptr<DeepseekV4Model> v4;
  const ModelConfig* config = nullptr;
  ModelConfig parallel_config;                      // ep * dp > 1: the ranks own the models, config points here
  std::unique_ptr<tokenizer::Tokenizer> tokenizer;  // null without tokenizer.json
  std::string structured_unavailable;               // why structured output is off ("" = available)
  int64_t max_model_len = 0;
  KvLayout layout;  // layout.storage = the runner's footprint
  KvSizing sizing;
  std::unique_ptr<ModelRunner> runner;
  EngineConfig engine_config;

  std::unique_ptr<Engine> make_engine(StreamCallback on_delta = {});
};

// Throws NotFound (no config.json, no CUDA device), Unsupported (CUDA without a CUDA build, V3 on CUDA),
// InvalidArgument naming the option, ResourceExhausted when one max_model_len sequence does not fit the budget.
std::unique_ptr<EngineStack> load_engine_stack(const EngineStackOptions& options);

// Whether a model keeps its block-format weights quantized under these options (weight_format resolved against
// the device; V3 FP8 matrices, V4 FP8 projections and MXFP4 experts; the same on every rank of any layout);
// InvalidArgument for a weight_format that does not exist.
bool keep_quantized_weights(const EngineStackOptions& options);

// options.activation_quant as the model takes it; InvalidArgument for a value that does not exist, Unsupported for
// another family's rounding (mxfp8 with a V3-family config, fp8 with a V4 one).
ActQuant activation_quant_of(const EngineStackOptions& options, const ModelConfig& config);

// options.kv_cache_dtype as the model takes it (kF32, kBF16 or kF8E4M3 for fp8; auto: bf16 for V4.1 on the CPU, whose
// cached rows bf16 holds exactly, f32 otherwise); InvalidArgument for a value that does not exist, Unsupported for fp8 where the
// rows are not quantized (cached_rows_quantized) or off the CPU. bf16 runs with every layout.
DType kv_cache_dtype_of(const EngineStackOptions& options, const ModelConfig& config);

// options.kernel_choices parsed (the defaults when empty); InvalidArgument for a spec that does not parse and for any
// on the CPU device.
cuda::KernelChoices kernel_choices_of(const EngineStackOptions& options);

// The bytes the KV cache may use for `options` (logged): see EngineStackOptions.
int64_t kv_cache_budget_bytes(const EngineStackOptions& options);

// The weights' footprint on one device of `options.model_dir` as the checkpoint stores them: every safetensors file,
// less the routed experts an expert-parallel rank does not load (it holds ceil(E / ep) of E, or the EPLB slots when
// EPLB runs). What kv_cache_budget_bytes takes off a device.
int64_t device_weight_bytes(const EngineStackOptions& options);

}  // namespace deepinfer
