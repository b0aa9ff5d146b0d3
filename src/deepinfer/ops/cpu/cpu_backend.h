// CpuBackend: the fp32 reference implementation of every op in ops.h. Each op family lives in its own file
// (linear_cpu.cc, norm_cpu.cc, ...); all of them accumulate in fp32 and split work over the backend's own
// thread pool where the work is large enough to matter.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "deepinfer/core/thread_pool.h"
#include "deepinfer/ops/memory.h"
#include "deepinfer/ops/ops.h"

namespace deepinfer {

class CpuBackend final : public Backend, public HasTensorMemory {
 public:
  // poison_empty: TensorMemory::empty fills with 0xFF bytes instead of zeros (poisoning_host_memory), for tests.
  explicit CpuBackend(int num_threads = 0, bool poison_empty = false);
  TensorMemory& memory() override { return poison_empty_ ? poisoning_host_memory() : host_memory(); }

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
  void mla_attention_naive(const MlaAttentionParams& p) override;
  void mla_attention_absorbed(const MlaAttentionParams& p) override;
  void paged_mla_attention(const PagedMlaAttentionParams& p) override;
  void scatter_rows(const ScatterRowsParams& p) override;

  // Runs fn(begin, end) over [0, n) on the pool when `work` (roughly multiply-adds) is large, inline otherwise.
  void parallel_for(int64_t n, int64_t work, const std::function<void(int64_t, int64_t)>& fn);

 private:
  std::unique_ptr<ThreadPool> pool_;
  bool poison_empty_ = false;
};

// fp32 dot product with a fixed, vectorisable summation order (shared by the op files).
float dot_f32(const float* a, const float* b, int64_t n);

// fake_quant over a row-major [rows, cols] buffer (the op's arithmetic, shared with the GEMMs' act_quant).
void fake_quant_rows(float* x, int64_t rows, int64_t cols, FakeQuantKind kind);
// A copy of the [rows, cols] rows at x, rounded as `q` asks (ActQuant): what a GEMM with act_quant multiplies.
std::vector<float> act_quant_copy(const float* x, int64_t rows, int64_t cols, ActQuant q);
// The same rounding (kMxfp8, cols % 32 == 0) as an FP8 operand: codes [rows, cols] e4m3 and scales [rows, cols / 32]
// e8m0, e4m3(codes) · 2^(scale − 127) being the rounded values bit for bit. The reference of the CUDA quantizer
// (run_mxfp8_quantize) that e4m3 tensor-core GEMMs will read.
void mxfp8_quantize_rows(const float* x, int64_t rows, int64_t cols, uint8_t* codes, uint8_t* scales);
// The kFP8E4M3(Ue8m0)Block128 rounding (cols % 128 == 0) as an FP8 operand: codes [rows, cols] e4m3 and f32 scales,
// block b of row r's at scales[r · scale_row_stride + b · scale_block_stride] (cuBLASLt's VEC128_32F operand is
// block-major: strides 1 and rows), e4m3(code) · scale being the rounded values bit for bit. The reference of the CUDA
// quantizer (run_fp8_block128_quantize).
void fp8_block128_quantize_rows(const float* x, int64_t rows, int64_t cols, bool ue8m0, uint8_t* codes, float* scales,
                                int64_t scale_row_stride, int64_t scale_block_stride);
// Its scale of a block whose largest magnitude is amax.
float fp8_block128_scale(float amax, bool ue8m0);

}  // namespace deepinfer
