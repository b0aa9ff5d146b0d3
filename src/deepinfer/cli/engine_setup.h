// What `deepinfer generate` and `deepinfer offline` share: resolve the model directory, load the model of the
// family config.json names on the chosen backend, size the KV cache, and build the Engine with its runner. Also
// the small text helpers both commands use to read prompts and print results.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "deepinfer/engine/engine.h"
#include "deepinfer/engine/engine_factory.h"
#include "deepinfer/kv/kv_layout.h"
#include "deepinfer/model/model_config.h"
#include "deepinfer/parallel/communicator.h"
#include "deepinfer/tokenizer/tokenizer.h"

namespace deepinfer::cli {

class ProcessWorld;

struct EngineSetupArgs {
  std::string model;                  // empty: DEEPINFER_HF_MODEL_DIR, then the embedded default model
  std::string device = "cpu";         // cpu | cuda
  int threads = 0;                    // CPU threads (0: all cores)
  std::string engram_token_map_file;  // V4.1 Engram token map (default: built from tokenizer.json)
  int max_num_seqs = 4;
  int64_t max_model_len = 32768;  // clamped to the model's max_position_embeddings (logged)
  int64_t max_num_batched_tokens = 2048;
  // Cache memory: on CUDA, gpu_memory_utilization of the device's memory minus the weights; on the CPU
  // backend a host budget of kv_budget_mb (gpu_memory_utilization does not apply there).
  double gpu_memory_utilization = 0.85;
  int64_t kv_budget_mb = 1024;
  uint64_t seed = 0;
  // V4.1: every layer on every prompt token (transformers parity) instead of decoder SWA bounded replay.
  bool exact_prefill = false;
  bool async_scheduling = true;           // plan step N+1 while step N runs (--no-async-scheduling turns it off)
  bool enforce_eager = false;             // --enforce-eager: no decode graphs (ModelRunnerOptions::decode_graphs)
  bool batch_invariant = false;           // --batch-invariant (EngineStackOptions::batch_invariant)
  bool device_argmax = true;              // --no-device-argmax: ModelRunnerOptions::device_argmax off
  bool batch_decode = true;               // one decode_batch per step for the decodes (--no-batch-decode: per sequence)
  std::string weight_format = "auto";     // --weight-format auto|f32|fp8 (EngineStackOptions::weight_format)
  std::string activation_quant = "none";  // --activation-quant none|mxfp8 (EngineStackOptions::activation_quant)
  std::vector<std::string> kernel_choices;  // --kernel-choice KEY=VALUE... (EngineStackOptions::kernel_choices)
  std::string kv_cache_dtype = "auto";      // --kv-cache-dtype auto|f32|bf16 (EngineStackOptions::kv_cache_dtype)
  std::string scheduling_policy = "fcfs";   // fcfs | priority
  // Expert / attention data parallel sizes (docs/PARALLEL.md). > 1 on the CPU backend: ranks are threads of this
  // process; with --device cuda one process per GPU over NCCL (ProcessWorld). EPLB every eplb_interval steps (0: off)
  // with eplb_slots slots per EP rank.
  int ep = 1, dp = 1;
  int eplb_interval = 0, eplb_slots = 0;
  bool ep_fp8_dispatch = false;  // MoE token dispatch in FP8 (lossy, fewer bytes between ranks)
  int cp = 1;  // context-parallel prefill: cp in-process ranks (CPU backend) or cp processes (--device cuda)
  // Speculative decoding (--speculative off|mtp|dspark, --num-draft-tokens N): see docs/SPECULATIVE.md.
  std::string speculative = "off";
  int num_draft_tokens = 1;
  std::string draft_sampling = "greedy";    // mtp (--draft-sampling greedy|sampled)
  double draft_confidence_threshold = 0.3;  // dspark (--draft-confidence-threshold)
  int64_t draft_token_budget = 0;           // dspark (--draft-token-budget, 0: no cap)
};

// Owns everything behind an Engine (engine/engine_factory.h's EngineStack). Construction logs where the model came
// from, the cache sizing (tokens that fit, maximum concurrency) and the device.
class EngineSetup {
 public:
  explicit EngineSetup(const EngineSetupArgs& args, StreamCallback on_delta = {});
  ~EngineSetup();

  // A multi-process worker (rank > 0 of --device cuda --ep/--dp/--cp): it already served rank 0 until it stopped;
  // there is no engine, and the command should just exit.
  bool is_worker() const { return worker_; }
  Engine& engine() { return *engine_; }
  const ModelConfig& config() const { return *stack_->config; }
  // nullptr when the model directory has no tokenizer.json.
  const tokenizer::Tokenizer* tokenizer() const { return stack_->tokenizer.get(); }
  const std::string& model_dir() const { return stack_->model_dir; }
  int64_t max_model_len() const { return stack_->max_model_len; }
  const KvSizing& kv_sizing() const { return stack_->sizing; }

  // Text → token ids; InvalidArgument naming `what` when there is no tokenizer or the text encodes to nothing.
  std::vector<TokenId> encode(const std::string& text, const std::string& what) const;
  // Output ids → text ("" without a tokenizer).
  std::string decode(std::span<const TokenId> ids) const;

 private:
  // --device cuda with ep/dp > 1: this process's rank. Declared first so it is destroyed last: the runner's stop
  // reaches the workers before ~ProcessWorld waits for them.
  std::unique_ptr<ProcessWorld> process_world_;
  std::unique_ptr<EngineStack> stack_;
  std::unique_ptr<Engine> engine_;
  bool worker_ = false;

  // --device cuda --ep/--dp: rank 0 gets a DistributedModelRunner factory in `o`; other ranks serve until stopped.
  template <typename Model>
  void start_expert_parallel(const EngineSetupArgs& a, const std::string& dir, const ParallelLayout& layout,
                             EngineStackOptions& o, ActQuant act_quant, DType kv_dtype);
  // --device cuda --cp N, ranks > 0: a CP follower over this process's GPU until rank 0 stops, its weights in the
  // format rank 0 keeps (keep_quant: keep_quantized_weights).
  template <typename Model>
  void follow_context_parallel(const EngineSetupArgs& a, const std::string& dir, bool keep_quant, ActQuant act_quant,
                               DType kv_dtype, const cuda::KernelChoices& choices);
};

// "layer-tokens run, skipped by bounded replay (% saved)" from the engine's stats.
std::string prefill_work_line(const EngineStats& st);
// "1,2,3" → ids; InvalidArgument naming `flag` for a non-integer, an id outside [0, vocab) or an empty list.
std::vector<TokenId> parse_token_ids(const std::string& text, int64_t vocab, const std::string& flag);
// One prompt per line ('\r\n' accepted). NotFound if unreadable; InvalidArgument for an empty line (it would
// shift the correspondence between input lines and output records) or a file with no prompts.
std::vector<std::string> read_prompts_file(const std::string& path);
// exp(mean negative log-likelihood) of the chosen tokens' logprobs; 0 when there are none.
double decode_perplexity(const std::vector<SampleResult>& logprobs);
// Escapes quotes, backslashes and control characters for a one-line quoted display.
std::string quote_for_display(const std::string& s);

}  // namespace deepinfer::cli
