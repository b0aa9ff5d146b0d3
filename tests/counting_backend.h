// A Backend that counts what a model asks of it and runs it on another: every op call and every data move of its
// memory (copies, fills, casts, uploads) is one "launch", as each is one kernel or copy on a device backend, and every
// allocation is counted apart. Tests use it to show how the work a model enqueues grows (or does not) with the batch.
#pragma once

#include <cstdint>

#include "deepinfer/ops/memory.h"
#include "deepinfer/ops/ops.h"

namespace deepinfer::testing {

struct LaunchCounts {
  int64_t ops = 0;     // Backend op calls
  int64_t moves = 0;   // copies, casts, record conversions, fills, adds (zeros() counts an allocation and a fill)
  int64_t allocs = 0;  // zeros / empty
  int64_t launches() const { return ops + moves; }
};

class CountingMemory : public TensorMemory {
 public:
  CountingMemory(TensorMemory& inner, LaunchCounts& c) : inner_(inner), c_(c) {}
  Device device() const override { return inner_.device(); }
  OwnedTensor zeros(DType dtype, Shape shape) override {
    ++c_.allocs;
    ++c_.moves;
    return inner_.zeros(dtype, std::move(shape));
  }
  OwnedTensor empty(DType dtype, Shape shape) override {
    ++c_.allocs;
    return inner_.empty(dtype, std::move(shape));
  }
  void copy(const Tensor& dst, const Tensor& src) override {
    ++c_.moves;
    inner_.copy(dst, src);
  }
  void cast(const Tensor& dst, const Tensor& src) override {
    ++c_.moves;
    inner_.cast(dst, src);
  }
  void convert_records(const Tensor& dst, const Tensor& src, FakeQuantKind record) override {
    ++c_.moves;
    inner_.convert_records(dst, src, record);
  }
  void fill(const Tensor& dst, float value) override {
    ++c_.moves;
    inner_.fill(dst, value);
  }
  void add(const Tensor& dst, const Tensor& src) override {
    ++c_.moves;
    inner_.add(dst, src);
  }
  void synchronize() override { inner_.synchronize(); }

 private:
  TensorMemory& inner_;
  LaunchCounts& c_;
};

class CountingBackend : public Backend, public HasTensorMemory {
 public:
  explicit CountingBackend(Backend& inner) : inner_(inner), memory_(backend_memory(inner), counts) {}
  TensorMemory& memory() override { return memory_; }
  LaunchCounts counts;

#define DI_COUNTED(name, Params)        \
  void name(const Params& p) override { \
    ++counts.ops;                       \
    inner_.name(p);                     \
  }
  DI_COUNTED(dequantize, DequantizeParams)
  DI_COUNTED(linear, LinearParams)
  DI_COUNTED(linear_quant, QuantLinearParams)
  DI_COUNTED(grouped_linear_quant, GroupedQuantLinearParams)
  DI_COUNTED(embedding, EmbeddingParams)
  DI_COUNTED(rms_norm, RmsNormParams)
  DI_COUNTED(rope, RopeParams)
  DI_COUNTED(fake_quant, FakeQuantParams)
  DI_COUNTED(hc_mix, HcMixParams)
  DI_COUNTED(hc_head, HcHeadParams)
  DI_COUNTED(hc_collapse, HcCollapseParams)
  DI_COUNTED(hc_expand, HcExpandParams)
  DI_COUNTED(compress_pool, CompressPoolParams)
  DI_COUNTED(indexer_scores, IndexerScoreParams)
  DI_COUNTED(paged_indexer_scores, PagedIndexerScoreParams)
  DI_COUNTED(candidate_blocks, CandidateBlocksParams)
  DI_COUNTED(topk_mask, TopKMaskParams)
  DI_COUNTED(sink_attention, SinkAttentionParams)
  DI_COUNTED(paged_sink_attention, PagedSinkAttentionParams)
  DI_COUNTED(router, RouterParams)
  DI_COUNTED(moe, MoeParams)
  DI_COUNTED(moe_quant, QuantMoeParams)
  DI_COUNTED(engram_hash, EngramHashParams)
  DI_COUNTED(engram_gate, EngramGateParams)
  DI_COUNTED(mla_attention_naive, MlaAttentionParams)
  DI_COUNTED(mla_attention_absorbed, MlaAttentionParams)
  DI_COUNTED(paged_mla_attention, PagedMlaAttentionParams)
  DI_COUNTED(scatter_rows, ScatterRowsParams)
  DI_COUNTED(hc_collapse_norm, HcCollapseNormParams)
  DI_COUNTED(norm_rope, NormRopeParams)
  DI_COUNTED(hc_expand_mix, HcExpandMixParams)
#undef DI_COUNTED

 private:
  Backend& inner_;
  CountingMemory memory_;
};

}  // namespace deepinfer::testing
