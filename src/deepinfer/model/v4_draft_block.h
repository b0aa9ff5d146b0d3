// Pieces of the SWA-only V4 blocks that draft models run outside the target's forward (the DSpark draft,
// model/dspark_draft.h, and the V4 MTP module, model/v4_mtp_draft.h): the window attention's projections and output,
// and the top-k routed MoE. They run on the target's backend with its main RoPE table and follow the target's
// layer math (DeepseekV4Model) exactly.
#pragma once

#include "deepinfer/model/deepseek_v4.h"

namespace deepinfer {

// x · wᵀ in the target's memory: [rows, w.rows].
OwnedTensor v4_draft_linear(const DeepseekV4Model& target, const Tensor& x, const OwnedTensor& w);
OwnedTensor v4_draft_linear(const DeepseekV4Model& target, const Tensor& x, const KeptMatrix& w);

// The K=V rows of `x` at `positions`: kv_norm(wkv·x), main RoPE, V4.1 FP8 fake-quant. [B, hd].
OwnedTensor v4_draft_kv(const DeepseekV4Model& target, const V4AttentionWeights& a, const Tensor& x,
                        const OwnedTensor& positions);
// The rotated queries [B, H, hd] (V4: per-head unweighted RMSNorm before RoPE).
OwnedTensor v4_draft_queries(const DeepseekV4Model& target, const V4AttentionWeights& a, const Tensor& x,
                             const OwnedTensor& positions);
// Inverse RoPE of the attention output `attn` [B, H, hd] (in place) and the grouped output projection: [B, D].
OwnedTensor v4_draft_output(const DeepseekV4Model& target, const V4AttentionWeights& a, OwnedTensor& attn,
                            const OwnedTensor& positions);
// The block's MoE with score-and-bias top-`top_k` routing (never hash routing).
OwnedTensor v4_draft_moe(const DeepseekV4Model& target, const V4LayerWeights& lw, const Tensor& x, int top_k);

}  // namespace deepinfer
