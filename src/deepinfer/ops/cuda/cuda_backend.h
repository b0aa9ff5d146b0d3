// CudaBackend: the Backend interface (ops.h) on one CUDA device (Hopper, sm_90a). Its linear_quant / moe_quant
// read BF16, FP8 e4m3 block-scaled (UE8M0 or f32 scales, 128x128 / 32x32 / any block) and MXFP4 weights
// directly (the Backend defaults dequantize to f32 first).
//
// Every tensor passed to an op must live on the CUDA device (Device::cuda), except MoeParams' expert list,
// which is a host vector of device tensors. Ops are asynchronous: they enqueue work on the backend's stream
// and return. synchronize() waits for it and raises the errors kernels report through the device status word
// (bad token / expert ids), which the CPU op would have thrown at once.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "deepinfer/ops/cuda/cuda_runtime.h"
#include "deepinfer/ops/cuda/kernel_choices.h"
#include "deepinfer/ops/memory.h"
#include "deepinfer/ops/ops.h"

namespace deepinfer {

// Random contents for synthetic runs (`deepinfer bench`): f32 uniform in [-range, range), bf16 finite in
// ±[2^-7, 2), e4m3 codes without NaN, E8M0 scales in [e8m0_low, e8m0_low + e8m0_span), any other dtype uniform bytes.
struct RandomFillParams {
  Tensor out;  // contiguous, on the device
  uint64_t seed = 1;
  float range = 1.0f;
  int e8m0_low = 117;
  int e8m0_span = 4;
};

// A plain cuBLASLt GEMM, out[M, N] = x[M, K] · w[N, K]ᵀ with x and w both bf16 or both FP8 e4m3 (unit scales),
// f32 output: the dense-rate ceilings that `deepinfer bench` measures in the same run.
struct LtGemmParams {
  Tensor x;    // bf16 / f8_e4m3 [M, K]
  Tensor w;    // same dtype [N, K]
  Tensor out;  // f32 [M, N]
};

// Sampling on the device, one row per sequence: the CPU Sampler (sampling/sampler.h) from the token mask on —
// mask → temperature → top-k → top-p → min-p, then the inverse-CDF draw with the same counter-based uniform
// (rng_uniform(RngKey{seed, stream}, position)), or argmax when the temperature is 0 — so a seeded row gives the
// CPU's token whenever the logits agree (up to a cumulative mass within double rounding of a threshold).
// Penalties and min-tokens need the sequence's history and stay on the host (fold min-tokens into `allowed`).
// Every tensor on the device; the per-row params are device tensors so that a captured step can rewrite them.
struct DeviceSampleParams {
  Tensor logits;       // f32 [R, V]
  Tensor temperature;  // f32 [R]; 0 = greedy
  Tensor top_k;        // i32 [R]; <= 0 or >= V: off
  Tensor top_p;        // f32 [R]; >= 1: off
  Tensor min_p;        // f32 [R]; <= 0: off
  Tensor rng;          // i64 [R, 3]: RngKey seed, RngKey stream (bit patterns), position in [0, 2^32)
  Tensor allowed;      // optional i32 [R, W >= ceil(V/32)]: bit t of word t/32 set = token t allowed
  Tensor out;          // i32 [R]: the token; -1 where the row has NaN/+inf logits or nothing allowed to sample
};

// A CUDA graph of backend work, replayed on the backend stream. It keeps the device addresses it was captured
// with: the tensors it reads and writes must stay alive (and in place) while it is replayed.
class CudaGraph {
 public:
  CudaGraph(cudaGraphExec_t exec, cudaStream_t stream) : exec_(exec), stream_(stream) {}
  ~CudaGraph();
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;
  void replay();

 private:
  cudaGraphExec_t exec_;
  cudaStream_t stream_;
};

// GEMM precision of CudaBackend::linear (f32 weights): kF32 = cuBLASLt in fp32 without TF32 (the default, exact
// against the CPU reference); kBF16 = input and weight rounded to bf16 (RNE; lossless for weights stored as bf16),
// fp32 accumulation and output: the dense GEMMs of a bf16 deployment, for measuring its error on the golden models.
enum class LinearPrecision : uint8_t { kF32, kBF16 };

class CudaBackend final : public Backend, public HasTensorMemory {
 public:
  explicit CudaBackend(int device = 0);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  void dequantize(const DequantizeParams& p) override;
  void linear(const LinearParams& p) override;
  void embedding(const EmbeddingParams& p) override;
  void rms_norm(const RmsNormParams& p) override;
  void rope(const RopeParams& p) override;
  void fake_quant(const FakeQuantParams& p) override;
  void hc_mix(const HcMixParams& p) override;
  void hc_head(const HcHeadParams& p) override;
  void hc_collapse(const HcCollapseParams& p) override;
  void hc_expand(const HcExpandParams& p) override;
  void compress_pool(const CompressPoolParams& p) override;
  void indexer_scores(const IndexerScoreParams& p) override;
  void paged_indexer_scores(const PagedIndexerScoreParams& p) override;
  void candidate_blocks(const CandidateBlocksParams& p) override;
  void topk_mask(const TopKMaskParams& p) override;
  void sink_attention(const SinkAttentionParams& p) override;
  void paged_sink_attention(const PagedSinkAttentionParams& p) override;
  void router(const RouterParams& p) override;
  void moe(const MoeParams& p) override;
  void engram_hash(const EngramHashParams& p) override;
  void engram_gate(const EngramGateParams& p) override;
  // Both MLA forms run the absorbed kernels on CUDA (the same function; the naive form's expansion only pays
  // off on the CPU for long prefill chunks).
  void mla_attention_naive(const MlaAttentionParams& p) override;
  void mla_attention_absorbed(const MlaAttentionParams& p) override;
  void paged_mla_attention(const PagedMlaAttentionParams& p) override;
  void scatter_rows(const ScatterRowsParams& p) override;
  void hc_collapse_norm(const HcCollapseNormParams& p) override;
  void norm_rope(const NormRopeParams& p) override;
  void hc_expand_mix(const HcExpandMixParams& p) override;
  // Recording = a CUDA graph whose temporaries live in the pool's own allocator blocks and workspace arena.
  std::unique_ptr<RecordingPool> new_recording_pool() override;
  std::unique_ptr<RecordedWork> record(const std::function<void()>& enqueue, RecordingPool& pool) override;

  // Device memory through the caching allocator, copies on the backend stream. Tensors it hands out must
  // not outlive the backend.
  TensorMemory& memory() override;

  // Quantized weights read in place (no f32 copy).
  void linear_quant(const QuantLinearParams& p) override;
  // grouped_output_one_launch: one grouped launch over a cached plan (grouped_linear.h); else, and inside a capture
  // before the plan exists, the default (linear_quant per group).
  void grouped_linear_quant(const GroupedQuantLinearParams& p) override;
  void moe_quant(const QuantMoeParams& p) override;
  void fill_random(const RandomFillParams& p);
  void lt_gemm(const LtGemmParams& p);
  // Raises (at synchronize) InvalidArgument for a position outside [0, 2^32).
  void sample(const DeviceSampleParams& p);
  // Applies to linear() calls enqueued from now on (a casting scratch copy of the weight per call: a test mode).
  void set_linear_precision(LinearPrecision p);
  // Batch-invariant mode (`--batch-invariant`), for ops enqueued from now on: a row's (token's) result is bit-identical
  // whatever else shares the call — every GEMM (linear, linear_quant, the router, MoE experts) is the same
  // fp32 FMA chain over K for any row count (no cuBLASLt, no bf16 tensor-core tiles, no M-dependent kernel
  // choice), attention splits a query's keys at fixed boundaries (256 slots) and always merges the splits in
  // order. Norms, mHC, RoPE, the indexer and the samplers are per row already. Slower (docs/PERF.md); not with
  // LinearPrecision::kBF16.
  void set_batch_invariant(bool on);
  bool batch_invariant() const;
  // Which kernel ops take where more than one is kept (kernel_choices.h), for ops enqueued from now on: the defaults
  // are the measured choices; tests and benches set others to reach or compare the alternatives.
  void set_kernel_choices(const cuda::KernelChoices& choices);
  const cuda::KernelChoices& kernel_choices() const;

  // Captures the work `enqueue` puts on the backend stream into a graph (decode steps are launch-bound). Run it
  // once eagerly first: inside the capture nothing may synchronise, upload through the staging ring, or take
  // new device memory (allocator or workspace growth), since a graph replays fixed addresses; any of these
  // ends the capture with an InvalidArgument error naming it.
  std::unique_ptr<CudaGraph> capture_graph(const std::function<void()>& enqueue);

  // Waits for all enqueued work; throws InvalidArgument for bad inputs reported by kernels.
  void synchronize();
  cudaStream_t stream() const;
  cuda::DeviceAllocator& allocator();
  cuda::WorkspaceArena& workspace();
  const cuda::DeviceInfo& device_info() const;
  Device device() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Throws NotFound when the device does not exist (cuda::device_count() says how many do).
std::unique_ptr<CudaBackend> make_cuda_backend(int device = 0);

}  // namespace deepinfer
