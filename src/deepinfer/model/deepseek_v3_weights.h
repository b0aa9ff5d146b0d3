// Weights of a DeepSeek-V3-family model (V3, R1, V3.1, V2-Lite). The CPU reference keeps every tensor in fp32 (FP8
// 128×128 blocks with F32 weight_scale_inv are expanded exactly at load); a device model keeps the FP8 block-scaled
// projections and experts in their stored format (read in place by linear_quant / moe_quant, 1 B a weight instead
// of 4) and uploads everything once. Names are transformers' (the released checkpoints use them too); the schema is
// model/weight_schema.h.
#pragma once

#include <functional>
#include <vector>

#include "deepinfer/core/tensor.h"
#include "deepinfer/io/checkpoint.h"
#include "deepinfer/model/kept_matrix.h"
#include "deepinfer/model/model_config.h"
#include "deepinfer/ops/memory.h"
#include "deepinfer/ops/ops.h"

namespace deepinfer {

// How FP8 block-scaled matrices are kept. kAuto: f32 (FP8-native on devices is opt-in: bf16-level accuracy in
// prefill, no expert parallelism; see deepseek_v3.cc); kF32: always f32; kFP8: in their format on any backend (the CPU
// then dequantizes per call: tests).
// kStored: as kFP8, and an FFN stored in bf16 stays bf16 (load_v3_weights' keep_bf16_experts): half f32's bytes, the
// expert GEMMs on CUDA's tensor cores with split activations (~2^-16 of fp32; CudaBackend::moe_quant). Not for
// batch-invariant mode (no bf16 expert kernel there) nor expert parallelism (EPLB moves FP8 codes only).
enum class V3WeightStorage { kAuto, kF32, kFP8, kStored };

// A projection matrix [N, K] as the model keeps it: f32, or the checkpoint's e4m3 codes + block scales.
using V3Matrix = KeptMatrix;

struct V3AttentionWeights {
  V3Matrix q_a;           // q_lora_rank set: [rq, D]
  OwnedTensor q_a_norm;   // [rq]
  V3Matrix q_b;           // [H·(dn+dr), rq]
  V3Matrix q;             // q_lora_rank null: [H·(dn+dr), D]
  V3Matrix kv_a;          // [r + dr, D]
  OwnedTensor kv_a_norm;  // [r]
  OwnedTensor kv_b;       // [H·(dn+dv), r], f32 always (the MLA ops read it as such)
  V3Matrix o;             // [D, H·dv]
};

struct V3LayerWeights {
  OwnedTensor input_norm, post_attention_norm;  // [D]
  V3AttentionWeights attn;
  bool moe = false;
  // Dense layers: experts = {the SwiGLU of width intermediate_size}, run as one expert of weight 1.
  // MoE layers: router gate [E, D], bias [E] (noaux_tc only), the E routed experts and the shared expert
  // (width moe_intermediate_size · n_shared_experts).
  OwnedTensor gate, gate_bias;
  std::vector<OwnedTensor> expert_storage;  // w1/w3/w2 of every expert, then the shared one
  std::vector<ExpertWeights> experts;       // views into expert_storage
  ExpertWeights shared;
  bool has_shared = false;
  // FP8 experts kept quantized (quant_experts): the same experts as QuantMatrix views into quant_storage (codes,
  // scales per matrix); `experts` and `expert_storage` then stay empty.
  bool quant_experts = false;
  std::vector<OwnedTensor> quant_storage;
  std::vector<QuantExpertWeights> qexperts;
  QuantExpertWeights qshared;
  // What the FFN's GEMMs round their inputs to (DeepseekV3Model::set_activation_quant): the checkpoint's FP8 experts
  // and dense SwiGLU, kept quantized or not.
  ActQuant moe_act_quant = ActQuant::kNone;
};

// One MTP module (MODELS.md Part B §5): z = eh_proj([enorm(embed(t_{i+1})) ; hnorm(h_i)]), one decoder block,
// then shared_head.norm and the main head (the module's embedding and head copies are the main ones).
struct V3MtpWeights {
  OwnedTensor enorm, hnorm;  // [D]
  OwnedTensor eh_proj;       // [D, 2D]
  OwnedTensor head_norm;     // [D] shared_head.norm
  V3LayerWeights block;
};

struct V3Weights {
  OwnedTensor embed;  // [V, D]
  OwnedTensor norm;   // [D]
  OwnedTensor head;   // [V, D] (a copy of embed when tied)
  std::vector<V3LayerWeights> layers;
  // The checkpoint's MTP modules; empty when the config has none or the checkpoint lacks them (optional).
  std::vector<V3MtpWeights> mtp;
};

// Validates the checkpoint against the schema of `config` (every problem listed) and loads it; `keep_fp8`: FP8
// block-scaled matrices stay in their format (host copies of codes and scales), the rest is f32.
// `resident` (expert parallelism): (layer index in config.layers, expert id) -> load that routed expert; the others
// stay empty (not resident). Empty: every expert. The MTP block loads every expert.
// `keep_bf16_experts`: a layer's FFN stored in bf16 (dense MLP, routed and shared experts: V2-Lite, the V3 golden)
// stays bf16 as quant_experts (kFloat bf16 QuantMatrix, no scales), for moe_quant (V3WeightStorage::kStored).
V3Weights load_v3_weights(const ModelConfig& config, const Checkpoint& ckpt, Backend& backend, bool keep_fp8 = false,
                          const std::function<bool(int layer, int expert)>& resident = {},
                          bool keep_bf16_experts = false);
// Bytes of every weight tensor (the memory the weights take on their device).
int64_t v3_weight_bytes(const V3Weights& w);

}  // namespace deepinfer
