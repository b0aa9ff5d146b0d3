#include "deepinfer/model/deepseek_v4_weights.h"

#include <cstring>
#include <map>
#include <optional>
#include <sstream>

#include "deepinfer/model/output_head.h"
#include "deepinfer/model/weight_loader.h"

namespace deepinfer {
namespace {

ExpertWeights expert_views(std::vector<OwnedTensor>& storage, size_t first) {
  return {storage[first].view(), storage[first + 1].view(), storage[first + 2].view()};
}

int64_t block_bytes(const V4LayerWeights& lw) {
  const V4AttentionWeights& a = lw.attn;
  int64_t b = 0;
  for (const OwnedTensor* t : {&lw.attn_norm,     &lw.ffn_norm,      &lw.hc_attn_fn,  &lw.hc_attn_base,
                               &lw.hc_attn_scale, &lw.hc_ffn_fn,     &lw.hc_ffn_base, &lw.hc_ffn_scale,
                               &a.q_norm,         &a.kv_norm,        &a.sinks,        &a.comp_wkv,
                               &a.comp_wgate,     &a.comp_ape,       &a.comp_norm,    &a.idx_weights_proj,
                               &a.idx_comp_wkv,   &a.idx_comp_wgate, &a.idx_comp_ape, &a.idx_comp_norm,
                               &a.idx_wk,         &a.idx_k_norm,     &lw.gate,        &lw.gate_bias,
                               &lw.tid2eid,       &lw.engram.table,  &lw.engram.wkv,  &lw.engram.gate_weight})
    b += owned_bytes(*t);
  for (const OwnedTensor* t : {&a.comp_wkv_bf16, &a.comp_wgate_bf16, &a.idx_comp_wkv_bf16, &a.idx_comp_wgate_bf16})
    b += owned_bytes(*t);
  for (const KeptMatrix* m : a.kept()) b += m->bytes();
  for (const OwnedTensor& t : lw.expert_storage) b += owned_bytes(t);
  for (const KeptMatrix& m : lw.quant_storage) b += m.bytes();
  return b;
}

bool keeps_quantized(const V4LayerWeights& lw) {
  const V4AttentionWeights& a = lw.attn;
  bool any = lw.quant_experts;
  for (const KeptMatrix* m : a.kept()) any = any || m->quantized();
  return any;
}

}  // namespace

std::vector<V4LayerWeights*> v4_blocks(V4Weights& w) {
  std::vector<V4LayerWeights*> blocks;
  for (V4LayerWeights& lw : w.layers) blocks.push_back(&lw);
  if (w.dspark)
    for (V4LayerWeights& lw : w.dspark->layers) blocks.push_back(&lw);
  if (w.mtp) blocks.push_back(&w.mtp->block);
  return blocks;
}

int64_t v4_weight_bytes(const V4Weights& w) {
  int64_t b = 0;
  for (const OwnedTensor* t : {&w.embed, &w.norm, &w.head, &w.hc_head_fn, &w.hc_head_base, &w.hc_head_scale})
    b += owned_bytes(*t);
  for (const V4LayerWeights& lw : w.layers) b += block_bytes(lw);
  if (w.dspark) {
    const V4DsparkWeights& d = *w.dspark;
    b += d.main_proj.bytes();
    for (const OwnedTensor* t : {&d.main_norm, &d.norm, &d.markov_embed, &d.markov_head, &d.confidence, &d.hc_head_fn,
                                 &d.hc_head_base, &d.hc_head_scale})
      b += owned_bytes(*t);
    for (const V4LayerWeights& lw : d.layers) b += block_bytes(lw);
  }
  if (w.mtp) {
    const V4MtpWeights& m = *w.mtp;
    b += m.e_proj.bytes() + m.h_proj.bytes();
    for (const OwnedTensor* t : {&m.enorm, &m.hnorm, &m.norm, &m.hc_head_fn, &m.hc_head_base, &m.hc_head_scale})
      b += owned_bytes(*t);
    b += block_bytes(m.block);
  }
  return b;
}

V4Weights load_v4_weights(const ModelConfig& c, const Checkpoint& ck, Backend& backend, bool keep_quant,
                          const std::function<bool(int layer, int expert)>& resident) {
  DI_CHECK(c.is_v4_family()) << "load_v4_weights: " << family_name(c.family) << " is not a V4 family model";
  const WeightLoader ld(c, ck, backend);
  V4Weights w;
  w.embed = ld.f32("embed.weight");
  w.norm = ld.f32("norm.weight");
  if (ld.has("hc_head_fn")) {
    w.hc_head_fn = ld.f32("hc_head_fn");
    w.hc_head_base = ld.f32("hc_head_base");
    w.hc_head_scale = ld.f32("hc_head_scale");
  }
  // One block under prefix L: `plan` null for a DSpark draft block (SWA only, top-k routing, no Engram).
  auto load_block = [&](const std::string& L, const LayerPlan* plan, int n_experts) {
    const std::string A = L + "attn.";
    V4LayerWeights lw;
    lw.attn_norm = ld.f32(L + "attn_norm.weight");
    lw.ffn_norm = ld.f32(L + "ffn_norm.weight");
    lw.hc_attn_fn = ld.f32(L + "hc_attn_fn");
    lw.hc_attn_base = ld.f32(L + "hc_attn_base");
    lw.hc_attn_scale = ld.f32(L + "hc_attn_scale");
    lw.hc_ffn_fn = ld.f32(L + "hc_ffn_fn");
    lw.hc_ffn_base = ld.f32(L + "hc_ffn_base");
    lw.hc_ffn_scale = ld.f32(L + "hc_ffn_scale");
    auto& a = lw.attn;
    a.wq_a = load_kept(ld, A + "wq_a.weight", keep_quant);
    a.q_norm = ld.f32(A + "q_norm.weight");
    a.wq_b = load_kept(ld, A + "wq_b.weight", keep_quant);
    a.wkv = load_kept(ld, A + "wkv.weight", keep_quant);
    a.kv_norm = ld.f32(A + "kv_norm.weight");
    // wo_a runs per head group: kept quantized only when a group's rows are whole scale blocks.
    a.wo_a = load_kept(ld, A + "wo_a.weight", keep_quant && c.attn.o_lora_rank % c.quant.block_n == 0);
    a.wo_b = load_kept(ld, A + "wo_b.weight", keep_quant);
    a.sinks = ld.f32(A + "attn_sink");
    auto opt = [&](OwnedTensor& dst, const std::string& name) {
      if (plan && ld.has(name)) dst = ld.f32(name);
    };
    opt(a.comp_wkv, A + "compressor.wkv.weight");
    opt(a.comp_wgate, A + "compressor.wgate.weight");
    opt(a.comp_ape, A + "compressor.ape");
    opt(a.comp_norm, A + "compressor.norm.weight");
    if (plan && ld.has(A + "indexer.wq_b.weight")) a.idx_wq_b = load_kept(ld, A + "indexer.wq_b.weight", keep_quant);
    opt(a.idx_weights_proj, A + "indexer.weights_proj.weight");
    opt(a.idx_comp_wkv, A + "indexer.compressor.wkv.weight");
    opt(a.idx_comp_wgate, A + "indexer.compressor.wgate.weight");
    opt(a.idx_comp_ape, A + "indexer.compressor.ape");
    opt(a.idx_comp_norm, A + "indexer.compressor.norm.weight");
    opt(a.idx_wk, A + "indexer.wk.weight");
    opt(a.idx_k_norm, A + "indexer.k_norm.weight");
    if (plan && plan->engram) {
      lw.has_engram = true;
      lw.engram.table = ld.f32(L + "engram.embed.weight");
      lw.engram.wkv = ld.f32(L + "engram.wkv.weight");
      QuantMatrix stored;
      lw.engram.wkv_block_format = ld.stored_quant(L + "engram.wkv.weight", &stored);
      HostTensor q = ld.f32(L + "engram.q_weight"), k = ld.f32(L + "engram.k_weight");
      lw.engram.gate_weight = HostTensor(DType::kF32, q.shape());
      for (int64_t i = 0; i < q.numel(); ++i)
        lw.engram.gate_weight.data<float>()[i] = q.data<float>()[i] * k.data<float>()[i];
    }
    const std::string F = L + "ffn.";
    lw.gate = ld.f32(F + "gate.weight");
    if (plan && plan->routing == RoutingKind::kHash) {
      lw.tid2eid = ld.i64(F + "gate.tid2eid");
    } else {
      lw.gate_bias = ld.f32(F + "gate.bias");
    }
    // Routed experts stay quantized when every one is stored in the same block format (moe_quant takes one
    // format for them); the shared expert then keeps its own format or f32.
    // `plan` points into c.layers (main layers only): its position is the expert-parallel layer index.
    auto here = [&](int e) { return !resident || !plan || resident(static_cast<int>(plan - c.layers.data()), e); };
    std::vector<std::string> routed;
    for (int e = 0; e < n_experts; ++e)
      for (const char* m : {"w1", "w3", "w2"})
        routed.push_back(F + "experts." + std::to_string(e) + "." + m + ".weight");
    QuantMatrix first;
    lw.experts_block_format = n_experts > 0 && ld.stored_quant(routed[0], &first);
    bool quant = keep_quant && n_experts > 0;
    std::optional<QuantFormat> format;
    for (const std::string& name : routed) {
      QuantMatrix q;
      if (!quant) break;
      quant = ld.stored_quant(name, &q) && (!format || *format == q.format);
      format = q.format;
    }
    if (quant) {
      lw.quant_experts = true;
      for (size_t i = 0; i < routed.size(); ++i)
        lw.quant_storage.push_back(here(static_cast<int>(i / 3)) ? load_kept(ld, routed[i], true) : KeptMatrix{});
      if (c.moe.n_shared_experts > 0)
        for (const char* m : {"w1", "w3", "w2"})
          lw.quant_storage.push_back(load_kept(ld, F + "shared_experts." + m + ".weight", true));
      auto views = [&lw](size_t first) {
        return QuantExpertWeights{lw.quant_storage[first].as_quant(), lw.quant_storage[first + 1].as_quant(),
                                  lw.quant_storage[first + 2].as_quant()};
      };
      for (int e = 0; e < n_experts; ++e) lw.qexperts.push_back(views(3 * e));
      if (c.moe.n_shared_experts > 0) {
        lw.qshared = views(3 * n_experts);
        lw.has_shared = true;
      }
      return lw;
    }
    for (int e = 0; e < n_experts; ++e) {
      const std::string X = F + "experts." + std::to_string(e) + ".";
      if (!here(e)) {
        lw.expert_storage.resize(lw.expert_storage.size() + 3);
        continue;
      }
      lw.expert_storage.push_back(ld.f32(X + "w1.weight"));
      lw.expert_storage.push_back(ld.f32(X + "w3.weight"));
      lw.expert_storage.push_back(ld.f32(X + "w2.weight"));
    }
    if (c.moe.n_shared_experts > 0) {
      lw.expert_storage.push_back(ld.f32(F + "shared_experts.w1.weight"));
      lw.expert_storage.push_back(ld.f32(F + "shared_experts.w3.weight"));
      lw.expert_storage.push_back(ld.f32(F + "shared_experts.w2.weight"));
    }
    // Views are taken once storage has stopped growing (OwnedTensor views point at owned buffers, which
    // move with the vector's elements, so they stay valid).
    for (int e = 0; e < n_experts; ++e) lw.experts.push_back(expert_views(lw.expert_storage, 3 * e));
    if (c.moe.n_shared_experts > 0) {
      lw.shared = expert_views(lw.expert_storage, 3 * n_experts);
      lw.has_shared = true;
    }
    return lw;
  };
  for (const auto& plan : c.layers)
    w.layers.push_back(load_block("layers." + std::to_string(plan.index) + ".", &plan, c.moe.n_routed_experts));
  if (c.draft.kind == DraftKind::kDSpark && ld.has_draft()) {
    V4DsparkWeights d;
    const std::string first = "mtp.0.", last = "mtp." + std::to_string(c.draft.num_layers - 1) + ".";
    for (int i = 0; i < c.draft.num_layers; ++i)
      d.layers.push_back(load_block("mtp." + std::to_string(i) + ".", nullptr, c.draft.n_routed_experts));
    d.main_proj = load_kept(ld, first + "main_proj.weight", false);
    d.main_norm = ld.f32(first + "main_norm.weight");
    d.norm = ld.f32(last + "norm.weight");
    d.markov_embed = ld.f32(last + "markov_head.embed.weight");
    d.markov_head = ld.f32(last + "markov_head.head.weight");
    d.confidence = ld.f32(last + "confidence_head.proj.weight");
    if (c.family != ModelFamily::kDeepseekV41) {
      d.hc_head_fn = ld.f32(last + "hc_head_fn");
      d.hc_head_base = ld.f32(last + "hc_head_base");
      d.hc_head_scale = ld.f32(last + "hc_head_scale");
    }
    w.dspark = std::move(d);
  }
  if (c.draft.kind == DraftKind::kMTP && ld.has_draft()) {
    // Only the first MTP module drafts (V4-Flash has one).
    V4MtpWeights m;
    const std::string M = "mtp.0.";
    m.block = load_block(M, nullptr, c.moe.n_routed_experts);
    m.enorm = ld.f32(M + "enorm.weight");
    m.hnorm = ld.f32(M + "hnorm.weight");
    m.e_proj = load_kept(ld, M + "e_proj.weight", false);
    m.h_proj = load_kept(ld, M + "h_proj.weight", false);
    m.norm = ld.f32(M + "norm.weight");
    m.hc_head_fn = ld.f32(M + "hc_head_fn");
    m.hc_head_base = ld.f32(M + "hc_head_base");
    m.hc_head_scale = ld.f32(M + "hc_head_scale");
    w.mtp = std::move(m);
  }
  // The head stays in bf16 as stored when block-format weights are kept (model/output_head.h): only when the checkpoint
  // has some, so that a bf16 checkpoint's device run keeps computing in f32 as the CPU reference does. The
  // compressor projections' bf16 copies follow the same rule.
  bool any_kept = false;
  for (const V4LayerWeights& lw : w.layers) any_kept = any_kept || keeps_quantized(lw);
  w.head = load_output_head(ld, "head.weight", keep_quant && any_kept);
  if (keep_quant && any_kept) {
    for (size_t l = 0; l < w.layers.size(); ++l) {
      V4AttentionWeights& a = w.layers[l].attn;
      const std::string A = "layers." + std::to_string(c.layers[l].index) + ".attn.";
      // Beside an f32 copy only (a projection the layer has), and only where stored in bf16 (exact there).
      auto keep_bf16 = [&](OwnedTensor& dst, const OwnedTensor& f32, const std::string& name) {
        if (f32.view().data() != nullptr) dst = ld.bf16_copy(name);
      };
      keep_bf16(a.comp_wkv_bf16, a.comp_wkv, A + "compressor.wkv.weight");
      keep_bf16(a.comp_wgate_bf16, a.comp_wgate, A + "compressor.wgate.weight");
      keep_bf16(a.idx_comp_wkv_bf16, a.idx_comp_wkv, A + "indexer.compressor.wkv.weight");
      keep_bf16(a.idx_comp_wgate_bf16, a.idx_comp_wgate, A + "indexer.compressor.wgate.weight");
    }
  }
  return w;
}

}  // namespace deepinfer
