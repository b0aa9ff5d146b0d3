// The MTP module of DeepSeek-V4-Flash base (MODELS.md Part A §4; the wiring follows vLLM's deepseek_v4_mtp, as
// transformers' deepseek_v4 drops the `mtp.*` tensors on load): it drafts t_{i+2} from the target's streams at
// position i and the token t_{i+1}.
//
//   input:   X = the target's hc streams after its last layer (before hc_head), [hc, D] at position i;
//            e = enorm(embed(t_{i+1})) (zero at position 0, as vLLM); stream k of the block's input is
//            h_proj(hnorm(X_k)) + e_proj(e).
//   block:   one V4 decoder block at RoPE position i (SWA only with the main RoPE, top-k routed MoE), its queries
//            attending the module's own window of K=V rows (positions (i − window, i]).
//   output:  the block's output streams (what a chained draft feeds back as X) and the logits
//            head(norm(hc_head collapse(streams))) with the module's hc_head and norm and the target's head.
//
// Runs on the target's backend with the target's embedding, head and main RoPE table.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "deepinfer/core/tensor.h"
#include "deepinfer/model/deepseek_v4.h"

namespace deepinfer {

// Per-sequence cache of the module's window: the K=V rows of the positions it ran, in a ring of window + slack
// slots; a slot remembers its position (-1: none). Positions before `kv_base` were never run (a prefix-cache hit
// skips them): their keys are simply absent.
struct V4MtpCache {
  int64_t capacity = 0;
  OwnedTensor ring;                    // [capacity, hd]
  std::vector<int64_t> slot_position;  // [capacity]
  int64_t kv_base = 0;
  int64_t num_tokens = 0;  // the next position the module runs at
};

class V4MtpDraft {
 public:
  // Empty when `target` can draft with its MTP module, else why not.
  static std::string unavailable_reason(const DeepseekV4Model& target);
  // Throws Unsupported with unavailable_reason(). `rollback_slack`: how many of the newest positions truncate()
  // can drop with the window before them intact (a chained draft of k tokens writes k − 1 rows past the verified
  // ones).
  explicit V4MtpDraft(const DeepseekV4Model& target, int64_t rollback_slack = 32);

  int64_t feature_dim() const { return static_cast<int64_t>(config().hc.hc_mult) * config().hidden_size; }
  int64_t window() const { return config().attn.sliding_window; }

  V4MtpCache new_cache(int64_t base = 0) const;
  // Runs the module at positions [cache.num_tokens, + T): row t of `streams` [T, hc·D] is the target's (or the
  // previous chained step's) streams at that position, next_ids[t] the token that follows it. Returns the logits
  // [T, vocab] (of the token after next_ids[t]); `out_streams` (optional) gets the block's output streams [T, hc·D].
  HostTensor forward(V4MtpCache& cache, std::span<const float> streams, std::span<const int64_t> next_ids,
                     HostTensor* out_streams = nullptr) const;
  // Forgets positions >= num_tokens. Within the slack the module then computes exactly as if they had never run;
  // further back, the window keys before num_tokens are dropped too (the cache restarts there: drafts get worse,
  // never wrong).
  void truncate(V4MtpCache& cache, int64_t num_tokens) const;

 private:
  const ModelConfig& config() const { return target_.config(); }
  const V4MtpWeights& w() const { return *target_.weights().mtp; }
  OwnedTensor attention(const Tensor& x, V4MtpCache& cache, const OwnedTensor& positions, int64_t p0) const;

  const DeepseekV4Model& target_;
  int64_t slack_;
};

}  // namespace deepinfer
