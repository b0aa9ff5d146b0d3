// A Backend that forwards every op to another one, except that linear() first rounds its input and weight to
// bf16 (RNE) and runs the inner linear on the rounded copies in fp32: the CPU reference of
// CudaBackend::set_linear_precision(LinearPrecision::kBF16) (bf16 products are exact in fp32, so only the
// summation order differs). Host memory only.
#pragma once

#include <memory>

#include "deepinfer/core/dtype.h"
#include "deepinfer/core/error.h"
#include "deepinfer/core/tensor.h"
#include "deepinfer/ops/ops.h"

namespace deepinfer::testing {

class Bf16LinearBackend final : public Backend {
 public:
  explicit Bf16LinearBackend(std::unique_ptr<Backend> inner) : inner_(std::move(inner)) {}

  void linear(const LinearParams& p) override {
    auto rounded = [](const Tensor& t) {
      HostTensor h(DType::kF32, t.shape());
      const float* src = t.data_as<float>();
      for (int64_t i = 0; i < t.numel(); ++i) h.data<float>()[i] = round_bf16(src[i]);
      return h;
    };
    DI_CHECK(p.in.is_contiguous() && p.weight.is_contiguous()) << "bf16 linear: contiguous in and weight only";
    HostTensor in = rounded(p.in), w = rounded(p.weight);
    inner_->linear({in, w, p.out});
  }
  void dequantize(const DequantizeParams& p) override { inner_->dequantize(p); }
  void embedding(const EmbeddingParams& p) override { inner_->embedding(p); }
  void rms_norm(const RmsNormParams& p) override { inner_->rms_norm(p); }
  void rope(const RopeParams& p) override { inner_->rope(p); }
  void fake_quant(const FakeQuantParams& p) override { inner_->fake_quant(p); }
  void hc_mix(const HcMixParams& p) override { inner_->hc_mix(p); }
  void hc_head(const HcHeadParams& p) override { inner_->hc_head(p); }
  void hc_collapse(const HcCollapseParams& p) override { inner_->hc_collapse(p); }
  void hc_expand(const HcExpandParams& p) override { inner_->hc_expand(p); }
  void compress_pool(const CompressPoolParams& p) override { inner_->compress_pool(p); }
  void indexer_scores(const IndexerScoreParams& p) override { inner_->indexer_scores(p); }
  void candidate_blocks(const CandidateBlocksParams& p) override { inner_->candidate_blocks(p); }
  void topk_mask(const TopKMaskParams& p) override { inner_->topk_mask(p); }
  void sink_attention(const SinkAttentionParams& p) override { inner_->sink_attention(p); }
  void paged_sink_attention(const PagedSinkAttentionParams& p) override { inner_->paged_sink_attention(p); }
  void router(const RouterParams& p) override { inner_->router(p); }
  void moe(const MoeParams& p) override { inner_->moe(p); }
  void engram_hash(const EngramHashParams& p) override { inner_->engram_hash(p); }
  void engram_gate(const EngramGateParams& p) override { inner_->engram_gate(p); }
  void mla_attention_naive(const MlaAttentionParams& p) override { inner_->mla_attention_naive(p); }
  void mla_attention_absorbed(const MlaAttentionParams& p) override { inner_->mla_attention_absorbed(p); }
  void paged_mla_attention(const PagedMlaAttentionParams& p) override { inner_->paged_mla_attention(p); }

 private:
  std::unique_ptr<Backend> inner_;
};

}  // namespace deepinfer::testing
