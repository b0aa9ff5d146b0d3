// The model side of `deepinfer bench` for the MLA family (DeepSeek-V3/R1/V3.1, V2-Lite): layers on the real
// dimensions and the FLOPs and bytes one step must move, counted from the dimensions (never measured).
//
// What a layer covers: the attention site (q projection, or q_a → norm → q_b with a query LoRA; kv_a; RoPE;
// MLA attention over the sequence's cached 576-value rows; the output projection) and the FFN site (router +
// routed experts + shared experts on MoE layers, one SwiGLU on dense layers). It leaves out the embedding, the
// head, the residual adds and the cache append (elementwise or per-token, < 1% of the bytes and FLOPs).
#pragma once

#include <cstdint>
#include <string>

#include "deepinfer/bench/bench_model.h"

namespace deepinfer::bench {

struct MlaBenchModel {
  std::string name;
  int64_t hidden = 0, heads = 0;
  int64_t q_lora = 0;  // 0: a single q_proj [H·(dn+dr), D] (V2-Lite)
  int64_t kv_lora = 0, rope_dim = 0, nope_dim = 0, v_dim = 0;
  int64_t experts = 0, topk = 0, moe_inter = 0, shared_experts = 0, dense_inter = 0;
  int n_group = 1, topk_group = 1;  // group-limited routing (V3: 8 / 4)
  bool sigmoid_router = true;       // V3 noaux_tc (sigmoid + bias); V2-Lite: softmax greedy
  float route_scale = 1.0f;
  int64_t dense_layers = 0, moe_layers = 0;          // the dense layers come first
  BenchFormat proj_format = BenchFormat::kFP8Block;  // q/kv_a/o projections
  BenchFormat ffn_format = BenchFormat::kFP8Block;   // dense SwiGLU, routed and shared experts
  int block = 128;                                   // FP8 block tile (square)
  // Bytes a decode step's paged cache holds a value in: 4 (f32) or 2 (bf16, --kv-cache-dtype bf16). Prefill reads
  // f32 rows either way (the engine's prefill gathers its pages to f32).
  int kv_value_bytes = 4;
  int64_t layers() const { return dense_layers + moe_layers; }
  int64_t row() const { return kv_lora + rope_dim; }  // cache row: latent | rope key
};

// DeepSeek-V3 671B dims (MODELS.md Part B; V3/R1/V3.1 share them): one dense layer and `moe_layers` MoE layers of
// the 61, FP8 128×128 everywhere.
MlaBenchModel v3_slice(int moe_layers = 2);
// DeepSeek-V2-Lite, all 27 layers (1 dense + 26 MoE). Projections bf16 as released; the FFN (dense MLP, routed and
// shared experts) bf16 as released, or f32 (`ffn`: what the engine computes with --weight-format f32).
MlaBenchModel v2_lite_model(BenchFormat ffn = BenchFormat::kBF16);
// CPU plumbing: small dims, q LoRA, one dense + two MoE layers.
MlaBenchModel tiny_mla();

// Multiply-adds of MLA attention for `queries` queries that together see `key_visits` (query, key) pairs over
// `rows` expanded cache rows per sequence and `seqs` sequences, in each form (ops.h "MLA"):
//   naive:    expand every row into per-head K and V, seqs·rows·H·(dn+dv)·r, then attend, visits·H·(dn+dr+dv);
//   absorbed: fold queries and outputs, queries·H·(dn+dv)·r, then attend in the latent, visits·H·(2r+dr).
double mla_naive_macs(const MlaBenchModel& m, int64_t seqs, int64_t rows, int64_t queries, double key_visits);
double mla_absorbed_macs(const MlaBenchModel& m, int64_t queries, double key_visits);

// One step (StepShape as for the V4 slices). flops: 2 × the multiply-adds of every projection, the router, the
// experts (k routed + the shared ones per token) and attention in its cheaper form (causal: the query at
// position p sees p + 1 rows). bytes: every weight the step touches once in its format (kv_b f32, read by the
// MLA ops as such; router f32; routed experts: the expected distinct ones under uniform routing), plus each
// sequence's f32 cache rows read once (attention_bytes).
StepCost count_mla_step(const MlaBenchModel& m, const StepShape& s);

}  // namespace deepinfer::bench
