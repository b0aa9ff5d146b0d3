#include "deepinfer/model/v4_draft_block.h"

#include "deepinfer/model/v4_grouped_output.h"

namespace deepinfer {

OwnedTensor v4_draft_linear(const DeepseekV4Model& target, const Tensor& x, const OwnedTensor& w) {
  OwnedTensor out = target.memory().empty(DType::kF32, {x.dim(0), w.shape()[0]});  // written in full
  target.backend().linear({x, w.view(), out.view()});
  return out;
}

OwnedTensor v4_draft_linear(const DeepseekV4Model& target, const Tensor& x, const KeptMatrix& w) {
  return kept_project(target.backend(), target.memory(), x, w);
}

OwnedTensor v4_draft_kv(const DeepseekV4Model& target, const V4AttentionWeights& a, const Tensor& x,
                        const OwnedTensor& positions) {
  const ModelConfig& c = target.config();
  Backend& b = target.backend();
  const int64_t B = x.dim(0), hd = c.attn.head_dim;
  OwnedTensor kv = v4_draft_linear(target, x, a.wkv);
  // Norm, RoPE and (V4.1) FP8 fake-quant of the window rows: one call.
  NormRopeParams p;
  p.parts[0] = {kv.view().reshape({B, 1, hd}),      a.kv_norm.view(), true, true, c.family == ModelFamily::kDeepseekV41,
                FakeQuantKind::kFP8E4M3Ue8m0Block32};
  p.positions = positions.view();
  p.inv_freq = target.main_inv_freq().view();
  p.eps = static_cast<float>(c.rms_norm_eps);
  b.norm_rope(p);
  return kv;
}

OwnedTensor v4_draft_queries(const DeepseekV4Model& target, const V4AttentionWeights& a, const Tensor& x,
                             const OwnedTensor& positions) {
  const ModelConfig& c = target.config();
  Backend& b = target.backend();
  const int64_t B = x.dim(0), H = c.num_heads, hd = c.attn.head_dim;
  const float eps = static_cast<float>(c.rms_norm_eps);
  OwnedTensor q_r = v4_draft_linear(target, x, a.wq_a);
  b.rms_norm({q_r.view(), a.q_norm.view(), q_r.view(), eps});
  OwnedTensor q = v4_draft_linear(target, q_r.view(), a.wq_b);
  NormRopeParams p;  // the head norm and RoPE: one call
  p.parts[0] = {q.view().reshape({B, H, hd}), Tensor{}, c.attn.q_head_norm, true};
  p.positions = positions.view();
  p.inv_freq = target.main_inv_freq().view();
  p.eps = eps;
  b.norm_rope(p);
  return q;
}

OwnedTensor v4_draft_output(const DeepseekV4Model& target, const V4AttentionWeights& a, OwnedTensor& attn,
                            const OwnedTensor& positions) {
  const ModelConfig& c = target.config();
  Backend& b = target.backend();
  const int64_t B = attn.shape()[0], H = c.num_heads, hd = c.attn.head_dim;
  b.rope({attn.view(), positions.view(), target.main_inv_freq().view(), true});
  return v4_grouped_output(b, target.memory(), attn.view().reshape({B, H * hd}), a.wo_a, a.wo_b, c.attn.o_groups,
                           c.attn.o_lora_rank);
}

OwnedTensor v4_draft_moe(const DeepseekV4Model& target, const V4LayerWeights& lw, const Tensor& x, int top_k) {
  const ModelConfig& c = target.config();
  const bool v41 = c.family == ModelFamily::kDeepseekV41;
  TensorMemory& mem = target.memory();
  const int64_t T = x.dim(0), k = top_k;
  OwnedTensor weights = mem.empty(DType::kF32, {T, k}), indices = mem.empty(DType::kI32, {T, k});  // the router's
  RouterParams r;
  r.x = x;
  r.weight = lw.gate.view();
  r.bias = lw.gate_bias.view();
  r.weights = weights.view();
  r.indices = indices.view();
  r.scoring = c.moe.scoring == ScoringFunc::kSigmoid   ? RouterScoring::kSigmoid
              : c.moe.scoring == ScoringFunc::kSoftmax ? RouterScoring::kSoftmax
                                                       : RouterScoring::kSqrtSoftplus;
  r.gate_temp = static_cast<float>(v41 ? c.moe.gate_temp : 1.0);
  r.route_scale = static_cast<float>(c.moe.routed_scaling_factor);
  // As the target: V4.1 normalises only with norm_topk_prob and top-k > 1; V4 always does.
  r.normalize = v41 ? (c.moe.norm_topk_prob && k > 1) : true;
  target.backend().router(r);
  OwnedTensor out = mem.empty(DType::kF32, {T, c.hidden_size});  // the MoE writes every output
  if (lw.quant_experts) {
    target.backend().moe_quant({x, weights.view(), indices.view(), &lw.qexperts, lw.has_shared ? &lw.qshared : nullptr,
                                out.view(), static_cast<float>(c.moe.swiglu_limit), v41, lw.moe_act_quant});
    return out;
  }
  MoeParams p;
  p.x = x;
  p.weights = weights.view();
  p.indices = indices.view();
  p.experts = &lw.experts;
  p.shared = lw.has_shared ? &lw.shared : nullptr;
  p.out = out.view();
  p.swiglu_limit = static_cast<float>(c.moe.swiglu_limit);
  p.weight_before_w2 = v41;
  p.act_quant = lw.moe_act_quant;
  target.backend().moe(p);
  return out;
}

}  // namespace deepinfer
