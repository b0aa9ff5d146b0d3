// Weights of a DeepSeek-V3-family model (V3, R1, V3.1, V2-Lite), dequantized to fp32 tensors (FP8 128×128
// blocks with F32 weight_scale_inv are expanded exactly at load, on the host); a device model uploads them once. Names
// are transformers' (the released checkpoints use them too); the schema is model/weight_schema.h.
#pragma once

#include <vector>

#include "deepinfer/core/tensor.h"
#include "deepinfer/io/checkpoint.h"
#include "deepinfer/model/model_config.h"
#include "deepinfer/ops/memory.h"
#include "deepinfer/ops/ops.h"

namespace deepinfer {

struct V3AttentionWeights {
  OwnedTensor q_a, q_a_norm, q_b;  // q_lora_rank set: [rq, D], [rq], [H·(dn+dr), rq]
  OwnedTensor q;                   // q_lora_rank null: [H·(dn+dr), D]
  OwnedTensor kv_a, kv_a_norm;     // [r + dr, D], [r]
  OwnedTensor kv_b;                // [H·(dn+dv), r]
  OwnedTensor o;                   // [D, H·dv]
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

// Validates the checkpoint against the schema of `config` (every problem listed) and loads it.
V3Weights load_v3_weights(const ModelConfig& config, const Checkpoint& ckpt, Backend& backend);

}  // namespace deepinfer
