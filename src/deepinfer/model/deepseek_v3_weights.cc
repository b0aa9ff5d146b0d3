#include "deepinfer/model/deepseek_v3_weights.h"

#include "deepinfer/model/weight_loader.h"

namespace deepinfer {

V3Weights load_v3_weights(const ModelConfig& c, const Checkpoint& ck, Backend& backend) {
  DI_CHECK(c.family == ModelFamily::kDeepseekV3)
      << "load_v3_weights: " << family_name(c.family) << " is not a DeepSeek-V3 family model";
  WeightLoader ld(c, ck, backend);
  V3Weights w;
  w.embed = ld.f32("model.embed_tokens.weight");
  w.norm = ld.f32("model.norm.weight");
  w.head = ld.f32(c.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight");
  auto load_layer = [&](const LayerPlan& plan) {
    const std::string L = "model.layers." + std::to_string(plan.index) + ".";
    const std::string A = L + "self_attn.";
    V3LayerWeights lw;
    lw.input_norm = ld.f32(L + "input_layernorm.weight");
    lw.post_attention_norm = ld.f32(L + "post_attention_layernorm.weight");
    V3AttentionWeights& a = lw.attn;
    if (c.mla.q_lora_rank > 0) {
      a.q_a = ld.f32(A + "q_a_proj.weight");
      a.q_a_norm = ld.f32(A + "q_a_layernorm.weight");
      a.q_b = ld.f32(A + "q_b_proj.weight");
    } else {
      a.q = ld.f32(A + "q_proj.weight");
    }
    a.kv_a = ld.f32(A + "kv_a_proj_with_mqa.weight");
    a.kv_a_norm = ld.f32(A + "kv_a_layernorm.weight");
    a.kv_b = ld.f32(A + "kv_b_proj.weight");
    a.o = ld.f32(A + "o_proj.weight");

    const std::string M = L + "mlp.";
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
    if (!lw.moe) {
      push_mlp(M);
      lw.experts.push_back(views(0));
    } else {
      lw.gate = ld.f32(M + "gate.weight");
      if (c.moe.has_bias) lw.gate_bias = ld.f32(M + "gate.e_score_correction_bias");
      const int n = c.moe.n_routed_experts;
      for (int e = 0; e < n; ++e) push_mlp(M + "experts." + std::to_string(e) + ".");
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
  for (const auto& plan : c.layers) w.layers.push_back(load_layer(plan));
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
      m.block = load_layer(plan);
      w.mtp.push_back(std::move(m));
    }
  }
  return w;
}

}  // namespace deepinfer
