// DSpark draft model of DeepSeek-V4.1 / V4-Flash-0731 (MODELS.md Part A §4): a block drafter that reads the
// target's averaged attention-input streams at a few target layers and proposes up to `block_size` tokens at
// once, with a sequential low-rank Markov head and a per-token confidence head.
//
//   context:  main_x = main_norm(main_proj(concat_l mean_k X_l,k)) per target position; every draft layer
//             keeps its own window of K=V rows kv_norm(wkv·main_x) (RoPE, V4.1: FP8 fake-quant). The draft
//             layers never run on context tokens.
//   block:    ids [anchor, noise × (B−1)] at positions P .. P+B−1 (P = the anchor's position = the first
//             position not in the target's cache) → embed → hc copies → draft blocks whose queries attend the
//             window context plus all B block positions (non-causal within the block) → mHC collapse
//             (V4.1: the last FFN site's pre; V4-0731: hc_head) → norm → the target's head = base logits U_i.
//   Markov:   x_0 = anchor; logits_i = U_i + head_M·embed_M[x_i]; x_{i+1} is drawn from logits_i.
//   confidence c_i = σ(proj·[h_i ; embed_M[x_i]]): the estimated probability that x_{i+1} is accepted.
//
// The draft runs on the target's backend with the target's embedding, head and main RoPE.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "deepinfer/core/tensor.h"
#include "deepinfer/model/deepseek_v4.h"

namespace deepinfer {

// Per-sequence draft cache: one ring of context K=V rows per draft layer. A slot remembers the position it
// holds (-1: none), so gaps (positions whose target streams were never captured, e.g. before a bounded-replay
// segment) are simply absent. The ring keeps `slack` positions beyond the window so that a rollback of up to
// `slack` positions leaves the remaining window intact.
struct DsparkContext {
  int64_t capacity = 0;
  std::vector<OwnedTensor> rings;      // per draft layer: [capacity, hd]
  std::vector<int64_t> slot_position;  // [capacity]
  int64_t num_positions = 0;           // positions [0, num_positions) have been offered to the cache
};

struct DsparkBlockOutput {
  HostTensor hidden;       // [B, D]: h_i after the final norm
  HostTensor base_logits;  // [B, V]: U_i
};

struct DsparkProposal {
  std::vector<int64_t> tokens;    // x_1 .. x_n
  std::vector<float> confidence;  // c_0 .. c_{n-1}: P(tokens[i] accepted | tokens[<i] accepted), in (0, 1)
  HostTensor logits;              // [n, V]: the logits tokens[i] was drawn from (U_i + Markov bias of x_i)
};

class DsparkDraft {
 public:
  // Empty when `target` can draft with DSpark, else why not (config without a DSpark draft, checkpoint
  // without its `mtp.*` tensors, noise token outside the vocabulary).
  static std::string unavailable_reason(const DeepseekV4Model& target);
  // Throws Unsupported with unavailable_reason() when the target cannot draft. `rollback_slack`: how many of
  // the newest context positions truncate() may drop.
  explicit DsparkDraft(const DeepseekV4Model& target, int64_t rollback_slack = 16);

  int block_size() const { return config().draft.block_size; }
  const std::vector<int>& target_layers() const { return config().draft.target_layer_ids; }
  int64_t window() const { return config().attn.sliding_window; }
  // A V4StreamCapture for the target's forward that records what append_context() reads.
  V4StreamCapture make_capture() const { return V4StreamCapture{target_layers(), {}, 0}; }

  DsparkContext new_context() const;
  // Writes the context rows of positions first_position .. first_position + n - 1 from captured target streams
  // (`rows` [n, |targets|·D] in backend memory, e.g. V4StreamCapture::rows). first_position must not be below
  // ctx.num_positions (positions are written once; skipped positions stay absent).
  void append_context(DsparkContext& ctx, const Tensor& rows, int64_t first_position) const;
  void append_context(DsparkContext& ctx, const V4StreamCapture& capture) const {
    append_context(ctx, capture.rows.view(), capture.first_position);
  }
  // Rollback: forgets positions >= num_positions (at most rollback_slack of the newest). The cache then
  // drafts exactly as if those positions had never been appended.
  void truncate(DsparkContext& ctx, int64_t num_positions) const;

  // The parallel block pass for `anchor` at position ctx.num_positions.
  DsparkBlockOutput block(const DsparkContext& ctx, int64_t anchor) const;
  // The Markov bias head_M·embed_M[token] [V] and the confidence σ(proj·[hidden ; embed_M[token]]).
  std::vector<float> markov_bias(int64_t token) const;
  float confidence(std::span<const float> hidden, int64_t token) const;
  // Block pass + sequential Markov head: n <= block_size tokens; pick(i, logits_i) chooses x_{i+1} (greedy
  // argmax or a sample).
  using Pick = std::function<int64_t(int i, std::span<const float> logits)>;
  DsparkProposal propose(const DsparkContext& ctx, int64_t anchor, int n, const Pick& pick) const;

 private:
  const ModelConfig& config() const { return target_.config(); }
  const V4DsparkWeights& w() const { return *target_.weights().dspark; }
  OwnedTensor attention(int layer, const Tensor& x, const DsparkContext& ctx, const OwnedTensor& positions,
                        int64_t anchor_position) const;
  OwnedTensor moe(int layer, const Tensor& x) const;

  const DeepseekV4Model& target_;
  int64_t slack_;
};

}  // namespace deepinfer
