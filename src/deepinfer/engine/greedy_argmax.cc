#include "deepinfer/engine/greedy_argmax.h"

#include <algorithm>
#include <cmath>

#include "deepinfer/core/error.h"
#include "deepinfer/sampling/sampler.h"

namespace deepinfer {

bool greedy_fast_path_row(const SamplingParams& p, int64_t outputs) {
  return p.greedy() && !p.structured.active() && !p.logprobs && p.repetition_penalty == 1.0f &&
         p.presence_penalty == 0.0f && p.frequency_penalty == 0.0f && outputs >= p.min_tokens;
}

bool finite_row(std::span<const float> row) {
  return std::all_of(row.begin(), row.end(), [](float v) { return std::isfinite(v) || v == -INFINITY; });
}

RowArgmax host_row_argmax(std::span<const float> row) {
  RowArgmax r;
  r.non_finite = !finite_row(row);
  r.token = argmax(row);
  return r;
}

void check_argmax_room(int64_t rows, std::span<TokenId> tokens, std::span<uint8_t> non_finite) {
  DI_CHECK_INTERNAL(static_cast<int64_t>(tokens.size()) >= rows && static_cast<int64_t>(non_finite.size()) >= rows)
      << "execute_argmax: room for " << tokens.size() << " tokens, " << rows << " rows";
}

}  // namespace deepinfer
