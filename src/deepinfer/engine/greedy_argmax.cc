#include "deepinfer/engine/greedy_argmax.h"

#include <algorithm>
#include <cmath>

#include "deepinfer/core/error.h"
#include "deepinfer/sampling/sampler.h"

namespace deepinfer {

bool greedy_fast_path_row(const SamplingParams& p, int64_t outputs) {
  return p.greedy() && !p.structured.active() && (!p.logprobs || *p.logprobs == 0) && p.repetition_penalty == 1.0f &&
         p.presence_penalty == 0.0f && p.frequency_penalty == 0.0f && outputs >= p.min_tokens;
}

bool finite_row(std::span<const float> row) {
  return std::all_of(row.begin(), row.end(), [](float v) { return std::isfinite(v) || v == -INFINITY; });
}

RowArgmax host_row_argmax(std::span<const float> row, bool logprob) {
  RowArgmax r;
  r.non_finite = !finite_row(row);
  r.token = argmax(row);
  if (logprob && !r.non_finite && r.token >= 0) r.logprob = token_logprob(row, r.token);
  return r;
}

void ArgmaxRows::put(int64_t row, std::span<const float> logits) const {
  const RowArgmax a = host_row_argmax(logits, wants_logprobs());
  tokens[row] = a.token;
  non_finite[row] = a.non_finite ? 1 : 0;
  if (wants_logprobs()) logprobs[row] = a.logprob;
}

void ArgmaxRows::check_room(int64_t rows) const {
  DI_CHECK_INTERNAL(static_cast<int64_t>(tokens.size()) >= rows && static_cast<int64_t>(non_finite.size()) >= rows &&
                    (!wants_logprobs() || static_cast<int64_t>(logprobs.size()) >= rows))
      << "execute_argmax: room for " << tokens.size() << " tokens, " << non_finite.size() << " flags, "
      << logprobs.size() << " logprobs, " << rows << " rows";
}

}  // namespace deepinfer
