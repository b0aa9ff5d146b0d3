#include "deepinfer/engine/greedy_argmax.h"

#include <algorithm>
#include <cmath>

#include "deepinfer/sampling/sampler.h"

namespace deepinfer {

bool greedy_fast_path_row(const SamplingParams& p, int64_t outputs) {
  return p.greedy() && !p.structured.active() && !p.logprobs && p.repetition_penalty == 1.0f &&
         p.presence_penalty == 0.0f && p.frequency_penalty == 0.0f && outputs >= p.min_tokens;
}

RowArgmax host_row_argmax(std::span<const float> row) {
  RowArgmax r;
  r.non_finite = !std::all_of(row.begin(), row.end(), [](float v) { return std::isfinite(v) || v == -INFINITY; });
  r.token = argmax(row);
  return r;
}

}  // namespace deepinfer
