// Weights of a DeepSeek-V4 / V4.1 model, dequantized to fp32 host tensors per layer (the CPU reference
// keeps everything in fp32; FP8-block, MXFP4 and FP8 Engram tables are expanded exactly at load). A device
// model moves them into its backend's memory once (DeepseekV4Model's constructor).
// Names come from model/weight_schema.h, so both naming schemes (released checkpoint and transformers)
// load; a checkpoint with missing or malformed tensors fails with the complete list of problems.
#pragma once

#include <array>
#include <functional>
#include <optional>
#include <vector>

#include "deepinfer/core/tensor.h"
#include "deepinfer/io/checkpoint.h"
#include "deepinfer/model/kept_matrix.h"
#include "deepinfer/model/model_config.h"
#include "deepinfer/ops/memory.h"
#include "deepinfer/ops/ops.h"

namespace deepinfer {

// The projections kept in their stored block format on a device (KeptMatrix): wq_a, wq_b, wkv, wo_a, wo_b and the
// indexer's wq_b, plus the routed and shared experts; the rest (norms, compressor, indexer heads, mHC) is f32, and
// beside the f32 compressor projections (wkv / wgate, main and indexer) their bf16 values as stored (below).
struct V4AttentionWeights {
  KeptMatrix wq_a;        // [ql, D]
  OwnedTensor q_norm;     // [ql]
  KeptMatrix wq_b;        // [H·hd, ql]
  KeptMatrix wkv;         // [hd, D]
  OwnedTensor kv_norm;    // [hd]
  KeptMatrix wo_a, wo_b;  // [G·ol, H·hd/G] (kept f32 when ol cuts its scale blocks), [D, G·ol]
  OwnedTensor sinks;      // [H]
  // Compressor (V4 CSA/HCA layers; V4.1 kv-source layers). V4 CSA projects to 2·hd (two window series).
  OwnedTensor comp_wkv, comp_wgate, comp_ape, comp_norm;  // [w, D], [w, D] (V4.1 r=1: none), [r, w] (V4), [hd]
  // Indexer: query side (index sources) and key side (V4: own compressor; V4.1 kv sources: wk + k_norm).
  KeptMatrix idx_wq_b;                                                    // [IH·Id, ql]
  OwnedTensor idx_weights_proj;                                           // [IH, D]
  OwnedTensor idx_comp_wkv, idx_comp_wgate, idx_comp_ape, idx_comp_norm;  // V4: [2Id, D] ×2, [r, 2Id], [Id]
  OwnedTensor idx_wk, idx_k_norm;                                         // V4.1: [Id, hd], [Id]
  // The compressor projections above in bf16 as the checkpoint stores them (exact), kept with the block formats
  // (keep_quant, and only when the checkpoint has some, as the bf16 head): prefill's many-row projections read them
  // on bf16 tensor cores with the f32 activations split in two bf16 terms (linear_quant's split_in, near-f32);
  // decode's few rows and every other user read the f32 ones (a weight stream of f32 products). Empty otherwise.
  OwnedTensor comp_wkv_bf16, comp_wgate_bf16, idx_comp_wkv_bf16, idx_comp_wgate_bf16;

  // The projections above that may be kept in their block format (every KeptMatrix field).
  std::array<KeptMatrix*, 6> kept() { return {&wq_a, &wq_b, &wkv, &wo_a, &wo_b, &idx_wq_b}; }
  std::array<const KeptMatrix*, 6> kept() const { return {&wq_a, &wq_b, &wkv, &wo_a, &wo_b, &idx_wq_b}; }
};

struct V4EngramWeights {
  OwnedTensor table;                         // [rows, engram_head_dim]
  OwnedTensor wkv;                           // [(hc+1)·D, cols·engram_head_dim]
  OwnedTensor gate_weight;                   // [hc, D] = q_weight ⊙ k_weight (only ever used as a product)
  bool wkv_block_format = false;             // stored FP8 block-scaled (kept f32)
  ActQuant wkv_act_quant = ActQuant::kNone;  // DeepseekV4Model::set_activation_quant
};

struct V4LayerWeights {
  OwnedTensor attn_norm, ffn_norm;                      // [D]
  OwnedTensor hc_attn_fn, hc_attn_base, hc_attn_scale;  // [(2+hc)hc, hc·D], [(2+hc)hc], [3]
  OwnedTensor hc_ffn_fn, hc_ffn_base, hc_ffn_scale;
  V4AttentionWeights attn;
  OwnedTensor gate, gate_bias, tid2eid;     // [E, D], [E] (top-k layers), i64 [V, k] (hash layers)
  std::vector<OwnedTensor> expert_storage;  // owns w1/w3/w2 of every routed expert, then the shared one
  std::vector<ExpertWeights> experts;       // views into expert_storage
  ExpertWeights shared;
  bool has_shared = false;
  // Experts kept in their stored format (quant_experts; every routed expert in one format, the shared one in its
  // own or f32): w1/w3/w2 of every routed expert, then the shared one; `experts` and `expert_storage` stay empty.
  bool quant_experts = false;
  std::vector<KeptMatrix> quant_storage;
  std::vector<QuantExpertWeights> qexperts;  // views into quant_storage
  QuantExpertWeights qshared;
  // The routed experts are stored in a block format (MXFP4 / FP8), kept so or not; moe_act_quant is what the MoE
  // calls round their inputs to (DeepseekV4Model::set_activation_quant), routed and shared experts alike.
  bool experts_block_format = false;
  ActQuant moe_act_quant = ActQuant::kNone;
  bool has_engram = false;
  V4EngramWeights engram;
};

// DSpark draft (`mtp.i.*`, MODELS.md Part A §4): SWA-only blocks with their own routed-expert count, the context
// projection (first block), the final norm and the Markov / confidence heads (last block). Embedding and head
// are the target's.
struct V4DsparkWeights {
  std::vector<V4LayerWeights> layers;
  KeptMatrix main_proj;                                 // [D, n_targets·D], f32 (block_format: its act_quant)
  OwnedTensor main_norm;                                // [D]
  OwnedTensor norm;                                     // [D]
  OwnedTensor markov_embed, markov_head;                // [V, r] each
  OwnedTensor confidence;                               // [1, D + r]
  OwnedTensor hc_head_fn, hc_head_base, hc_head_scale;  // V4-Flash-0731 only
};

// V4-Flash base MTP module (`mtp.0.*`, MODELS.md Part A §4; the wiring of vLLM's deepseek_v4_mtp): per stream k the
// block's input is h_proj(hnorm(X_k)) + e_proj(enorm(embed(next token))), X = the target's streams before hc_head;
// one V4 block (SWA only, main RoPE, top-k routing); its own hc_head → norm → the target's head. Embedding and
// head are the target's.
struct V4MtpWeights {
  V4LayerWeights block;
  OwnedTensor enorm, hnorm;                             // [D]
  KeptMatrix e_proj, h_proj;                            // [D, D], f32 (block_format: their act_quant)
  OwnedTensor norm;                                     // [D]
  OwnedTensor hc_head_fn, hc_head_base, hc_head_scale;  // [hc, hc·D], [hc], [1]
};

struct V4Weights {
  OwnedTensor embed;                                    // [V, D]
  OwnedTensor norm;                                     // [D]
  OwnedTensor head;                                     // [V, D]: f32, or bf16 as stored (keep_quant)
  OwnedTensor hc_head_fn, hc_head_base, hc_head_scale;  // V4 only: [hc, hc·D], [hc], [1]
  std::vector<V4LayerWeights> layers;
  std::optional<V4DsparkWeights> dspark;  // present when the config has a DSpark draft and the checkpoint its tensors
  std::optional<V4MtpWeights> mtp;        // present when the config has MTP layers and the checkpoint their tensors
};

// Validates the checkpoint against expected_weights(config) and loads everything (throws InvalidArgument
// listing every problem when the checkpoint is incomplete or malformed).
// `backend` dequantizes on the host (a CPU backend). keep_quant: block-format matrices stay in their stored format
// (the KeptMatrix fields and quantized experts above); otherwise everything is f32. `resident` (expert
// parallelism): (layer index in config.layers, expert id) -> load that routed expert; the others stay empty (not
// resident; never selected on this rank). Empty: every expert. Draft blocks load every expert.
V4Weights load_v4_weights(const ModelConfig& config, const Checkpoint& ckpt, Backend& backend, bool keep_quant = false,
                          const std::function<bool(int layer, int expert)>& resident = {});
// Bytes of every weight as kept (quantized matrices count their codes and scales).
int64_t v4_weight_bytes(const V4Weights& w);
// Every transformer block of w: the main layers, then the DSpark draft's blocks, then the MTP module's block.
std::vector<V4LayerWeights*> v4_blocks(V4Weights& w);

}  // namespace deepinfer
