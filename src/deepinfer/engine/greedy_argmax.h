// The greedy fast path (ModelRunner::execute_argmax): which rows qualify, and the host reduction of a logits row
// that a device runner does on the device instead.
#pragma once

#include <cstdint>
#include <span>

#include "deepinfer/sampling/sampling_params.h"

namespace deepinfer {

// Whether a row's token is the plain argmax of its raw logits: greedy, and none of the processors that need the
// host are active — no structured-output mask, no logprobs (a pass over the raw row), no penalties (the history),
// min_tokens already reached (`outputs` tokens sampled before this one; it would suppress EOS and stop tokens).
// Speculative verification is the executor's own exclusion (it needs every processed row).
bool greedy_fast_path_row(const SamplingParams& p, int64_t outputs);

// One row's reduction: sampling/sampler.h argmax (lowest id on ties, -inf and NaN skipped, -1 if nothing is
// left) and whether it holds NaN or +inf (StepExecutor's kNonFinite: such a row is never sampled).
// No NaN and no +inf (-inf is a masked-out token, not an error): a row the executor may sample.
bool finite_row(std::span<const float> row);

struct RowArgmax {
  TokenId token = -1;
  bool non_finite = false;
};
RowArgmax host_row_argmax(std::span<const float> row);

// execute_argmax's output spans hold at least `rows` entries (Internal error otherwise).
void check_argmax_room(int64_t rows, std::span<TokenId> tokens, std::span<uint8_t> non_finite);

}  // namespace deepinfer
