// The greedy fast path (ModelRunner::execute_argmax): which rows qualify, and the host reduction of a logits row
// that a device runner does on the device instead.
#pragma once

#include <cstdint>
#include <span>

#include "deepinfer/sampling/sampling_params.h"

namespace deepinfer {

// Whether a row's token is the plain argmax of its raw logits: greedy, and none of the processors that need the
// host are active — no structured-output mask, no top-N logprobs (a log_softmax over the raw row), no penalties
// (the history), min_tokens already reached (`outputs` tokens sampled before this one; it would suppress EOS and
// stop tokens). The chosen token's logprob alone (logprobs = 0, offline's decode perplexity) qualifies: it is one
// more reduction of the same raw row (greedy_row_wants_logprob). Speculative verification is the executor's own
// exclusion (it needs every processed row).
bool greedy_fast_path_row(const SamplingParams& p, int64_t outputs);
// A fast-path row that also wants its chosen token's logprob.
inline bool greedy_row_wants_logprob(const SamplingParams& p) { return p.logprobs.has_value(); }

// One row's reduction: sampling/sampler.h argmax (lowest id on ties, -inf and NaN skipped, -1 if nothing is
// left) and whether it holds NaN or +inf (StepExecutor's kNonFinite: such a row is never sampled).
// No NaN and no +inf (-inf is a masked-out token, not an error): a row the executor may sample.
bool finite_row(std::span<const float> row);

struct RowArgmax {
  TokenId token = -1;
  bool non_finite = false;
  // With `logprob` asked: the chosen token's logprob, sampling/sampler.h token_logprob (bit-identical to the general
  // path's); 0 when the row gives no token or is non-finite (the executor samples neither).
  float logprob = 0.0f;
};
RowArgmax host_row_argmax(std::span<const float> row, bool logprob = false);

// execute_argmax's outputs, by logits row: the token, 1 where the row holds NaN or +inf, and, when `logprobs` is
// not empty, the chosen token's logprob (RowArgmax::logprob; on a device within rounding of the host's, see
// ops/cuda/argmax_cuda.h).
struct ArgmaxRows {
  std::span<TokenId> tokens;
  std::span<uint8_t> non_finite;
  std::span<float> logprobs;  // empty: not wanted
  bool wants_logprobs() const { return !logprobs.empty(); }
  // The host reduction of `logits` into row `row`.
  void put(int64_t row, std::span<const float> logits) const;
  // Every span holds at least `rows` entries (logprobs only when wanted); Internal error otherwise.
  void check_room(int64_t rows) const;
};

}  // namespace deepinfer
