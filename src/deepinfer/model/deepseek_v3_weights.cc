#include "deepinfer/model/deepseek_v3_weights.h"

#include <optional>

#include "deepinfer/model/weight_loader.h"

namespace deepinfer {

int64_t v3_weight_bytes(const V3Weights& w) {
  int64_t b = owned_bytes(w.embed) + owned_bytes(w.norm) + owned_bytes(w.head);
  std::vector<const V3LayerWeights*> blocks;
  for (const V3LayerWeights& lw : w.layers) blocks.push_back(&lw);
  for (const V3MtpWeights& m : w.mtp) {
    b += owned_bytes(m.enorm) + owned_bytes(m.hnorm) + owned_bytes(m.eh_proj) + owned_bytes(m.head_norm);
    blocks.push_back(&m.block);
  }
  for (const V3LayerWeights* block : blocks) {
    const V3LayerWeights& lw = *block;
    const V3AttentionWeights& a = lw.attn;
    b += owned_bytes(lw.input_norm) + owned_bytes(lw.post_attention_norm) + owned_bytes(lw.gate) +
         owned_bytes(lw.gate_bias);
    b += a.q_a.bytes() + a.q_b.bytes() + a.q.bytes() + a.kv_a.bytes() + a.o.bytes();
    b += owned_bytes(a.q_a_norm) + owned_bytes(a.kv_a_norm) + owned_bytes(a.kv_b);
    for (const OwnedTensor& t : lw.expert_storage) b += owned_bytes(t);
    for (const OwnedTensor& t : lw.quant_storage) b += owned_bytes(t);
  }
  return b;
}

V3Weights load_v3_weights(const ModelConfig& c, const Checkpoint& ck, Backend& backend, bool keep_fp8,
                          const std::function<bool(int layer, int expert)>& resident, bool keep_bf16_experts) {
  DI_CHECK(c.family == ModelFamily::kDeepseekV3)
      << "load_v3_weights: " << family_name(c.family) << " is not a DeepSeek-V3 family model";
  WeightLoader ld(c, ck, backend);
  // A matrix in its stored FP8 format when asked and stored so, else f32.
  auto quant = [&](const std::string& name, std::vector<OwnedTensor>& storage) -> std::optional<QuantMatrix> {
    if (!keep_fp8 || !ld.is_fp8_block(name)) return std::nullopt;
    KeptMatrix m = load_kept(ld, name, true);
    const QuantMatrix q = m.quant;  // views into the buffers, which move with their owners
    storage.push_back(std::move(m.codes));
    storage.push_back(std::move(m.scales));
    return q;
  };
  auto mat = [&](const std::string& name) { return load_kept(ld, name, keep_fp8); };
  V3Weights w;
  w.embed = ld.f32("model.embed_tokens.weight");
  w.norm = ld.f32("model.norm.weight");
  w.head = ld.f32(c.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight");
  // `layer`: the position in c.layers (-1: the MTP block, which keeps every expert).
  auto load_layer = [&](const LayerPlan& plan, int layer) {
    auto here = [&](int e) { return !resident || layer < 0 || resident(layer, e); };
    const std::string L = "model.layers." + std::to_string(plan.index) + ".";
    const std::string A = L + "self_attn.";
    V3LayerWeights lw;
    lw.input_norm = ld.f32(L + "input_layernorm.weight");
    lw.post_attention_norm = ld.f32(L + "post_attention_layernorm.weight");
    V3AttentionWeights& a = lw.attn;
    if (c.mla.q_lora_rank > 0) {
      a.q_a = mat(A + "q_a_proj.weight");
      a.q_a_norm = ld.f32(A + "q_a_layernorm.weight");
      a.q_b = mat(A + "q_b_proj.weight");
    } else {
      a.q = mat(A + "q_proj.weight");
    }
    a.kv_a = mat(A + "kv_a_proj_with_mqa.weight");
    a.kv_a_norm = ld.f32(A + "kv_a_layernorm.weight");
    a.kv_b = ld.f32(A + "kv_b_proj.weight");
    a.o = mat(A + "o_proj.weight");

    const std::string M = L + "mlp.";
    // Quantized experts: every expert of the layer (and the dense MLP) must be stored FP8, or all go f32. With
    // keep_bf16_experts, bf16-stored ones stay bf16 the same way (a QuantMatrix of kFloat bf16 and no scale).
    const std::string first = M + (plan.routing == RoutingKind::kTopK ? "experts.0." : "") + "gate_proj.weight";
    Tensor stored;
    const bool bf16_experts = keep_bf16_experts && !ld.is_fp8_block(first) && ld.stored_bf16(first, &stored);
    lw.quant_experts = (keep_fp8 && ld.is_fp8_block(first)) || bf16_experts;
    auto kept_bf16 = [&](const std::string& name) -> std::optional<QuantMatrix> {
      HostTensor h = ld.bf16_copy(name);
      if (!h.view().data()) return std::nullopt;
      lw.quant_storage.push_back(std::move(h));
      lw.quant_storage.emplace_back();  // no scales: 2 entries a matrix, as the FP8 ones
      return QuantMatrix{lw.quant_storage[lw.quant_storage.size() - 2].view(), Tensor{}, QuantFormat::kFloat};
    };
    auto quant_mlp = [&](const std::string& prefix) {
      QuantExpertWeights e;
      for (auto [dst, name] :
           {std::pair{&e.w1, "gate_proj.weight"}, {&e.w3, "up_proj.weight"}, {&e.w2, "down_proj.weight"}}) {
        auto q = bf16_experts ? kept_bf16(prefix + name) : quant(prefix + name, lw.quant_storage);
        DI_CHECK(q.has_value()) << prefix << name << ": expected " << (bf16_experts ? "bf16" : "FP8 block-scaled")
                                << " like the layer's other experts";
        *dst = *q;
      }
      return e;
    };
    auto push_mlp = [&](const std::string& prefix) {
      lw.expert_storage.push_back(ld.f32(prefix + "gate_proj.weight"));
      lw.expert_storage.push_back(ld.f32(prefix + "up_proj.weight"));
      lw.expert_storage.push_back(ld.f32(prefix + "down_proj.weight"));
    };
    auto views = [&](size_t first) -> ExpertWeights {
      return {lw.expert_storage[first].view(), lw.expert_storage[first + 1].view(),
              lw.expert_storage[first + 2].view()};
    };
    lw.moe = plan.routing == RoutingKind::kTopK;
    if (lw.quant_experts) {
      // Device tensors do not move with their OwnedTensor, nor host buffers: views stay valid as storage grows.
      if (!lw.moe) {
        lw.qexperts.push_back(quant_mlp(M));
      } else {
        lw.gate = ld.f32(M + "gate.weight");
        if (c.moe.has_bias) lw.gate_bias = ld.f32(M + "gate.e_score_correction_bias");
        for (int e = 0; e < c.moe.n_routed_experts; ++e) {
          if (here(e)) {
            lw.qexperts.push_back(quant_mlp(M + "experts." + std::to_string(e) + "."));
          } else {  // not resident: empty codes and scales keep quant_storage at 6 entries per expert
            lw.quant_storage.resize(lw.quant_storage.size() + 6);
            lw.qexperts.push_back(QuantExpertWeights{});
          }
        }
        if (c.moe.n_shared_experts > 0) {
          lw.qshared = quant_mlp(M + "shared_experts.");
          lw.has_shared = true;
        }
      }
    } else if (!lw.moe) {
      push_mlp(M);
      lw.experts.push_back(views(0));
    } else {
      lw.gate = ld.f32(M + "gate.weight");
      if (c.moe.has_bias) lw.gate_bias = ld.f32(M + "gate.e_score_correction_bias");
      const int n = c.moe.n_routed_experts;
      for (int e = 0; e < n; ++e) {
        if (here(e))
          push_mlp(M + "experts." + std::to_string(e) + ".");
        else
          lw.expert_storage.resize(lw.expert_storage.size() + 3);  // not resident
      }
      if (c.moe.n_shared_experts > 0) push_mlp(M + "shared_experts.");
      // Views only once storage has stopped growing (a HostTensor's buffer moves with it, so they stay valid).
      for (int e = 0; e < n; ++e) lw.experts.push_back(views(3 * static_cast<size_t>(e)));
      if (c.moe.n_shared_experts > 0) {
        lw.shared = views(3 * static_cast<size_t>(n));
        lw.has_shared = true;
      }
    }
    return lw;
  };
  for (size_t l = 0; l < c.layers.size(); ++l) w.layers.push_back(load_layer(c.layers[l], static_cast<int>(l)));
  if (c.draft.kind == DraftKind::kMTP) {
    for (int k = 0; k < c.draft.num_layers; ++k) {
      const LayerPlan plan = mtp_layer_plan(c, k);
      const std::string L = "model.layers." + std::to_string(plan.index) + ".";
      if (!ld.has(L + "eh_proj.weight")) break;  // optional: the checkpoint carries no MTP weights
      V3MtpWeights m;
      m.enorm = ld.f32(L + "enorm.weight");
      m.hnorm = ld.f32(L + "hnorm.weight");
      m.eh_proj = ld.f32(L + "eh_proj.weight");
      m.head_norm = ld.f32(L + "shared_head.norm.weight");
      m.block = load_layer(plan, -1);
      w.mtp.push_back(std::move(m));
    }
  }
  return w;
}

}  // namespace deepinfer
