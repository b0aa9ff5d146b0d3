// A Backend that forwards every op to an inner one: the base of the test backends that change one or two ops
// (Bf16LinearBackend, Bf16GemmEmulationBackend) and leave the rest to the CPU reference.
#pragma once

#include <memory>

#include "deepinfer/ops/ops.h"

namespace deepinfer::testing {

class ForwardingBackend : public Backend {
 public:
  explicit ForwardingBackend(std::unique_ptr<Backend> inner) : inner_(std::move(inner)) {}

  void linear(const LinearParams& p) override { inner_->linear(p); }
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
  void paged_indexer_scores(const PagedIndexerScoreParams& p) override { inner_->paged_indexer_scores(p); }
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
  void scatter_rows(const ScatterRowsParams& p) override { inner_->scatter_rows(p); }
  void hc_collapse_norm(const HcCollapseNormParams& p) override { inner_->hc_collapse_norm(p); }
  void norm_rope(const NormRopeParams& p) override { inner_->norm_rope(p); }
  void hc_expand_mix(const HcExpandMixParams& p) override { inner_->hc_expand_mix(p); }

 protected:
  std::unique_ptr<Backend> inner_;
};

}  // namespace deepinfer::testing
