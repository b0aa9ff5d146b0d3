// Partial attention with log-sum-exp, and the exact merge of partials: the building block of ring-style context
// parallelism, where a rank attends its queries to one block of keys at a time (its own, then blocks received from
// other ranks) and combines the results, instead of holding every key at once.
//
// For one query row and head over key subset K_i: lse_i = log Σ_{j∈K_i} exp(s_j), out_i = Σ_{j∈K_i} exp(s_j −
// lse_i)·v_j. Over the union of disjoint subsets: lse = log Σ_i exp(lse_i), out = Σ_i exp(lse_i − lse)·out_i, which is
// the softmax over all keys. A subset with no visible key has lse = −inf and out = 0 and drops out. A V4 attention sink
// (a per-head logit that joins the denominator only) is one more subset with lse = sink and out = 0; it must be merged
// exactly once per row, not once per partial.
//
// This is host (CPU reference) code; the model's CP prefill uses the all-gather form (context_parallel.h), which
// is bit-identical to one rank, so no merge is needed there.
#pragma once

#include <cstdint>
#include <vector>

#include "deepinfer/core/tensor.h"

namespace deepinfer {

struct AttentionPartial {
  HostTensor out;  // f32 [T, H, d]
  HostTensor lse;  // f32 [T, H], natural log; −inf where no key was visible
};

// Shared-KV (K = V, one KV head, as V4 and MLA's absorbed form) attention of q [T, H, d] at q_positions [T] over
// the keys kv [S, d] at kv_positions [S]: key s is visible iff q_pos − window < kv_pos <= q_pos (window <= 0: no
// window, causal only). Logits q·k·scale in fp32.
AttentionPartial partial_attention(const Tensor& q, const Tensor& q_positions, const Tensor& kv,
                                   const Tensor& kv_positions, int64_t window, float scale);

// Merges partials over disjoint key subsets of the same queries; `sinks` f32 [H] (optional: undefined Tensor{} or
// data() == nullptr) joins once per row. Returns out [T, H, d].
HostTensor merge_attention_partials(const std::vector<AttentionPartial>& partials, const Tensor& sinks);

}  // namespace deepinfer
