// Speculative decoding: the draft proposer interface (docs/SPECULATIVE.md).
//
// A step of a speculating decode sequence, on the executing thread:
//   1. the proposer drafts up to k tokens continuing the sequence (Proposer::propose);
//   2. the policy (policy.h) picks how many of them the target verifies, within the step's token budget;
//   3. the target runs [last token, d_1 .. d_n] as one chunk (n + 1 logits rows), the verifier (verifier.h)
//      accepts a prefix d_1 .. d_a and samples one more token (the correction on a rejection, the bonus when all
//      n were accepted), and the target truncates its caches to the a + 1 positions it keeps;
//   4. the proposer is told what the target kept (Proposer::observe), with the target's features of those
//      positions, and rolls its own caches back to match.
// Prefill chunks (prompt, chunked prefill, recompute after preemption) go through observe too, so a proposer
// that keeps a cache over the whole sequence (MTP, DSpark's context KV) sees every verified position.
//
// Ownership and threading: one Proposer per engine, used only by the executing thread (like ModelRunner). Per
// sequence state lives in state slots, the same slots the target runner uses (BatchEntry::state_slot).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "deepinfer/sampling/rng.h"
#include "deepinfer/sampling/sampling_params.h"

namespace deepinfer::spec {

enum class SpecMethod { kOff, kMtp, kDSpark };

// The verified positions of one sequence that the target ran in the last step.
struct TargetChunk {
  int32_t slot = -1;
  // The slot's sequence (re)starts at `start`: admission, prefix hit, recompute after preemption. The proposer
  // drops whatever the slot held; `prefix_ids` are the tokens before `start` (a prefix-cache hit skips them,
  // so the target has no features for them).
  bool reset = false;
  std::span<const TokenId> prefix_ids;
  int64_t start = 0;             // position of ids[0]
  std::span<const TokenId> ids;  // the kept tokens the target consumed, positions [start, start + ids.size())
  // Row i (of feature_dim floats, row-major) is the target's feature at position start + i: whatever the
  // proposer asked the target model for (MTP: the final hidden state after the last norm; DSpark: its context
  // stream). Only valid during the call.
  std::span<const float> features;
  int64_t feature_dim = 0;
  // The token at position start + ids.size() when it is known (the one sampled from the chunk's last row);
  // absent for a prefill chunk that does not end the prompt.
  std::optional<TokenId> next_token;
};

struct DraftRequest {
  int32_t slot = -1;
  int max_tokens = 0;                      // propose at most this many (>= 1)
  int64_t position = 0;                    // position of the first draft token (the sequence length after next_token)
  const SamplingParams* params = nullptr;  // the request's sampling params (temperature for sampled drafts)
  RngKey key;                              // the sequence's random stream; drafts must use draws >= kDraftRngDrawBase
};

// Draft draws use their own RNG draw indices (rng_uniform's `draw`) so they never collide with the verifier's.
inline constexpr uint32_t kDraftRngDrawBase = 16;

struct Draft {
  std::vector<TokenId> tokens;  // d_1 .. d_n, n <= max_tokens (may be empty: verify nothing this step)
  // Lossless sampling needs the draft distribution q_i each d_i was drawn from: probs[i] has vocab_size entries
  // summing to 1. Empty: every d_i is a point mass (greedy draft), q_i(d_i) = 1.
  std::vector<std::vector<float>> probs;
  // Optional per position estimate of P(d_i accepted | d_1 .. d_{i-1} accepted) (DSpark's confidence head);
  // the confidence policy uses the prefix-survival product. Empty when the proposer has none.
  std::vector<float> confidence;
};

class Proposer {
 public:
  virtual ~Proposer() = default;
  virtual std::string_view name() const = 0;
  // Width of TargetChunk::features this proposer needs from the target (0: none).
  virtual int64_t feature_dim() const = 0;
  // Absorbs verified positions. Called for every chunk the target ran for a speculating sequence, in step order;
  // after it, the proposer's caches must hold exactly the verified positions (everything it appended while
  // proposing beyond them is rolled back here at the latest).
  virtual void observe(const TargetChunk& chunk) = 0;
  // Drafts continuing the sequence of `req.slot` after its last observe (whose next_token was set).
  virtual Draft propose(const DraftRequest& req) = 0;
  // The slot's sequence finished or was preempted.
  virtual void release_slot(int32_t slot) {}
};

}  // namespace deepinfer::spec
