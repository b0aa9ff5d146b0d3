// DeepSeek-V3 family forward pass (V3, R1, V3.1: transformers deepseek_v3; V2-Lite: deepseek_v2), exact
// against transformers' fp32 eager path (MODELS.md Part B). Weights, activations and the MLA cache live in the
// backend's memory (host for the CPU reference, device memory for CUDA); only the logits come back. One `forward` call
// appends a chunk of tokens to a sequence; the per-sequence MLA cache below is all that carries across calls, so
// one-shot prefill, chunked prefill and token-by-token decode give the same logits. The state is plain data so that a
// paged cache manager can own it later.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "deepinfer/core/tensor.h"
#include "deepinfer/model/decode_graphs.h"
#include "deepinfer/model/deepseek_v3_weights.h"
#include "deepinfer/model/model_config.h"
#include "deepinfer/model/paged_rows.h"
#include "deepinfer/ops/ops.h"
#include "deepinfer/parallel/context_parallel.h"
#include "deepinfer/parallel/expert_parallel.h"

namespace deepinfer {

// Per token and layer the MLA cache keeps one row of kv_lora_rank + qk_rope_head_dim values: the normalised
// latent ĉ followed by the RoPE'd shared rope key (576 values for V3: 1152 B in bf16).
// The engine runner's paged MLA cache: per layer one row per token slot of the block pool.
struct V3KvPages {
  std::vector<PagedRows> layers;
  int64_t bytes_per_block(int block_size) const;
  int64_t bytes_allocated() const;
  void set_max_blocks(int64_t blocks);
};

struct V3SequenceState {
  int64_t num_tokens = 0;     // tokens already cached = position of the next token
  std::vector<RowBuffer> kv;  // per layer: [num_tokens, kv_lora_rank + qk_rope_head_dim] on the model's device
  // Paged mode (the engine's runner): rows live in `pages` at `ref`'s block table instead of `kv`. A row
  // depends on its token's prefix only, so a sequence may start at any cached position (exact prefix reuse).
  V3KvPages* pages = nullptr;
  PageRef ref;
  // MlaForm::kAuto, set by the engine's runner: query rows at positions below this use the naive form, the rest
  // the absorbed one. The two forms round differently, so the form must be a function of the row's position, not
  // of the chunk it arrives in (a prefix hit or a recompute after preemption changes the chunks); -1: choose per
  // call from the chunk's op counts (standalone forward).
  int64_t mla_naive_until = -1;
  // Unpaged only: the first position `kv` holds (an MTP cache that starts at a prefix-cache hit has no rows for
  // the skipped positions; attention then covers [kv_base, num_tokens)).
  int64_t kv_base = 0;
};

// Optional per-call record of intermediates (tests, debugging).
struct V3ForwardTrace {
  bool want_layer_outputs = true;
  std::vector<HostTensor> layer_outputs;  // per layer: residual stream after the layer [T, D]
  HostTensor final_hidden;                // after the final norm [T, D]
};

// Which MLA form attention uses. kAuto picks the cheaper one per call from the op counts (naive for long
// prefill chunks, absorbed for decode); the others force one (tests, benchmarks).
enum class MlaForm { kAuto, kNaive, kAbsorbed };

class DeepseekV3Model {
 public:
  // Loads config.json and the safetensors of `dir` (model_type deepseek_v3 or deepseek_v2). FP8 block-scaled
  // projections and experts stay in their format on a device backend (storage kAuto).
  static std::unique_ptr<DeepseekV3Model> load(const std::string& dir, Backend& backend,
                                               V3WeightStorage storage = V3WeightStorage::kAuto,
                                               const ExpertFilter& resident = {});

  DeepseekV3Model(ModelConfig config, V3Weights weights, Backend& backend);

  const ModelConfig& config() const { return config_; }
  // Bytes the weights take in the backend's memory (FP8 kept quantized: about a quarter of f32).
  int64_t weight_bytes() const { return v3_weight_bytes(w_); }
  const V3Weights& weights() const { return w_; }
  V3SequenceState new_sequence() const;
  // Paged mode for the engine's runner (the argument, V4.1's bounded replay, does not apply to V3). A paged
  // sequence may start at any cached position: its rows need nothing but the pages, so no replay.
  V3KvPages new_kv_pages(bool bounded_decoder = false) const;
  int prefix_replay_tokens(bool /*bounded_decoder*/) const { return 0; }
  int prefix_replay_tokens_past_prompt(bool /*bounded_decoder*/) const { return 0; }
  // Per-slot state of a paged sequence: the position and the MLA form split only (the rows are paged).
  int64_t slot_bytes_bound(bool /*bounded_decoder*/) const { return 0; }
  int64_t slot_bytes(const V3SequenceState& s) const;
  void start_at(V3SequenceState& seq, int64_t start, std::span<const int64_t> /*prefix_ids*/) const {
    seq.num_tokens = start;
  }
  void set_mla_form(MlaForm form) { mla_form_ = form; }
  // The element type of the paged MLA cache (new_kv_pages): f32 (the default: the rows as computed) or bf16 (each
  // row rounded to nearest even as it is written: half the bytes a decode step reads, twice the blocks a budget holds;
  // vLLM's and SGLang's cache in the model's dtype). Every read widens the stored rows exactly, so prefill, prefix
  // hits and decode all attend the same values.
  void set_kv_cache_dtype(DType dtype);
  DType kv_cache_dtype() const { return kv_dtype_; }
  // How the GEMMs over the checkpoint's FP8 weights round their inputs: kNone (transformers', the default: the golden
  // fixtures) or kFp8Block128 / kFp8Block128Ue8m0 (the reference's gemm_impl "fp8", vLLM's and SGLang's block-FP8
  // GEMMs: e4m3 per 128 values with an f32 / power-of-two scale). Every projection and FFN stored FP8 (kv_b, which
  // the MLA ops read in f32 as the reference's absorbed attention does, and the bf16 router and head stay exact).
  void set_activation_quant(ActQuant q);
  ActQuant activation_quant() const { return act_quant_; }
  // V3SequenceState::mla_naive_until for a sequence whose prompt has `prompt_len` tokens: the form the op counts
  // pick for the whole prompt in one chunk applies to every prompt row (naive for long prompts), generated rows
  // use the absorbed form. Chunking then never changes a row's form, so prefix hits and recomputes are bitwise
  // equal to one-shot runs.
  int64_t mla_naive_until(int64_t prompt_len) const { return use_absorbed(prompt_len, 0) ? 0 : prompt_len; }
  // Expert parallelism: routed experts run across the EP group of `ep` (nullptr: all local). Every rank of the
  // group then makes the same sequence of forward()/idle_forward() calls; see parallel/expert_parallel.h.
  void set_expert_parallel(ExpertParallel* ep) { ep_ = ep; }
  ExpertParallel* expert_parallel() const { return ep_; }
  // A forward without tokens: takes part in every MoE layer's exchange (EP ranks with fewer sequences).
  void idle_forward() const;
  // Frees the routed experts of MoE layer `layer` that `keep` (by expert id) does not mark (EP: the rank holds
  // only its placement's experts).
  void retain_experts(int layer, const std::vector<bool>& keep);
  // Loads the listed routed experts of `layer` from `dir` again (EPLB moving an expert onto this rank).
  void load_experts(const std::string& dir, int layer, const std::vector<int>& experts);
  bool has_expert(int layer, int expert) const;
  // Routed experts of `layer` (resident or not; 0 on a dense layer).
  int routed_experts(int layer) const;

  // Appends `ids` to the sequence and returns their logits, f32 [T, vocab].
  // Context parallel (`cp`, a prefill chunk split across a CP group): every rank passes the whole chunk `ids` and
  // the same starting state; the rank computes its own tokens (cp->local()) and returns their logits in that
  // order, [cp->local_tokens(), vocab], while its cache receives every token's rows (all-gathered), so afterwards
  // each rank's state equals the one-rank state and decode can continue on any of them.
  HostTensor forward(V3SequenceState& seq, std::span<const int64_t> ids, V3ForwardTrace* trace = nullptr,
                     const CpShard* cp = nullptr) const;
  // forward, also returning the final hidden state of every position ([T, D] row-major: the MTP's h_i).
  HostTensor forward_features(V3SequenceState& seq, std::span<const int64_t> ids, std::vector<float>* features) const;
  // One decode token for each of several paged sequences (the engine runner's decode entries), all layers run over
  // the B rows at once and attention is one paged_mla_attention call per layer (the pages read in place). Every
  // sequence must satisfy decode_batchable() and share the same pages. Returns f32 [B, vocab], row b the logits of
  // ids[b]; the same function as forward(*seqs[b], {ids[b]}) (bit-identical on the CPU backend).
  // With `graphs` (enabled on CUDA) the step is recorded per padded shape and replayed (model/decode_graphs.h); a
  // padded row computes the same as an unpadded one, so replays give the eager step's logits.
  // With `device_logits` the logits are handed to it on the device and the result is empty (no host copy).
  HostTensor decode_batch(std::span<V3SequenceState* const> seqs, std::span<const int64_t> ids,
                          DecodeGraphs* graphs = nullptr, const DeviceLogitsFn* device_logits = nullptr) const;
  // Whether decode_batch may run this sequence's next token: paged, the absorbed form at its position, no expert
  // parallelism (its ranks must make identical call sequences).
  bool decode_batchable(const V3SequenceState& seq) const;
  // Recorded decode steps for decode_batch (enabled() only on a backend that records: CUDA).
  std::unique_ptr<DecodeGraphs> new_decode_graphs() const { return std::make_unique<DecodeGraphs>(backend_); }
  // Speculative rollback: the sequence keeps its first n tokens, as if nothing after them had been run (a row
  // depends only on its prefix, so dropping the tail is exact). Paged rows past n are overwritten later.
  void truncate(V3SequenceState& seq, int64_t n) const;

  // MTP (MODELS.md Part B §5). num_mtp_layers() is 0 when the checkpoint has no MTP weights.
  int num_mtp_layers() const { return static_cast<int>(w_.mtp.size()); }
  // An MTP module's cache (unpaged), empty, first position `base`.
  V3SequenceState new_mtp_sequence(int64_t base = 0) const;
  // Runs MTP module 0 on positions [mtp.num_tokens, + T): row t of `hidden` [T, D] is the hidden state feeding
  // that position (the target's final hidden state h_i, or the module's own previous output when chaining) and
  // next_ids[t] is t_{i+1}. Appends to the module's cache; returns the logits for t_{i+2}, f32 [T, vocab], and
  // the block's output [T, D] (before shared_head.norm) in *out_hidden when given.
  HostTensor mtp_forward(V3SequenceState& mtp, std::span<const float> hidden, std::span<const int64_t> next_ids,
                         HostTensor* out_hidden = nullptr) const;

 private:
  struct Chunk;  // per-call positions
  // `layer` indexes the cache (the MTP module's cache slot is num_layers); `lw` are the block's weights.
  OwnedTensor attention(const Chunk& c, int layer, const V3LayerWeights& lw, const OwnedTensor& x,
                        V3SequenceState& seq) const;
  OwnedTensor ffn(const Chunk& c, int layer, const V3LayerWeights& lw, const OwnedTensor& x) const;
  Chunk make_chunk(int64_t p0, int64_t T, int64_t kv_base) const;
  // decode_batch's work from device inputs only (recordable): the layers over the step's rows, logits into
  // in.logits.
  void decode_step(const DecodeStepInputs& in, V3KvPages* pages, int block_size) const;
  bool use_absorbed(int64_t tokens, int64_t cached) const;
  // out = in · Wᵀ through linear or linear_quant, as the weight is kept.
  void linear(const Tensor& in, const V3Matrix& w, const Tensor& out) const;
  void upload_weights();
  // The backend's tensor memory (host for the CPU reference, device memory for CUDA); mutable state of the
  // backend, not of the model, so const forward calls may allocate through it.
  TensorMemory& memory() const { return memory_; }

  ModelConfig config_;
  V3Weights w_;
  Backend& backend_;
  TensorMemory& memory_;
  OwnedTensor inv_freq_;         // f32 [qk_rope_head_dim / 2], YaRN-blended
  float rope_magnitude_ = 1.0f;  // YaRN attention_factor on cos/sin (1 for every released config)
  float softmax_scale_ = 1.0f;   // qk_head_dim^-0.5 · m²
  MlaForm mla_form_ = MlaForm::kAuto;
  ActQuant act_quant_ = ActQuant::kNone;
  DType kv_dtype_ = DType::kF32;
  ExpertParallel* ep_ = nullptr;
};

}  // namespace deepinfer
