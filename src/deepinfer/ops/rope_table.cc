#include "deepinfer/ops/rope_table.h"

#include <algorithm>
#include <cmath>

#include "deepinfer/core/error.h"

namespace deepinfer {

std::vector<float> rope_inv_freq(const RopeConfig& rope) {
  const int dim = rope.dim;
  DI_CHECK(dim > 0 && dim % 2 == 0) << "rope dim must be even and positive, got " << dim;
  const int half = dim / 2;
  std::vector<float> inv(half);
  const float base = static_cast<float>(rope.theta);
  for (int i = 0; i < half; ++i) {
    // base ** (2i / dim) in fp32, then its reciprocal: transformers' default table.
    const float pos_freq = std::pow(base, static_cast<float>(2 * i) / static_cast<float>(dim));
    inv[i] = 1.0f / pos_freq;
  }
  if (!rope.yarn) return inv;
  // YaRN: blend interpolated (÷factor) and extrapolated frequencies with a linear ramp over the pair index
  // between the correction dims of beta_fast and beta_slow rotations (truncated to integers).
  auto correction_dim = [&](double rotations) {
    return dim * std::log(static_cast<double>(rope.original_max_position) / (rotations * 2 * M_PI)) /
           (2 * std::log(rope.theta));
  };
  double low = std::max(std::floor(correction_dim(rope.beta_fast)), 0.0);
  double high = std::min(std::ceil(correction_dim(rope.beta_slow)), static_cast<double>(dim - 1));
  if (low == high) high += 0.001;
  const float factor = static_cast<float>(rope.factor);
  for (int i = 0; i < half; ++i) {
    const float pos_freq = std::pow(base, static_cast<float>(2 * i) / static_cast<float>(dim));
    const float extrapolation = 1.0f / pos_freq;
    const float interpolation = 1.0f / (factor * pos_freq);
    float ramp = (static_cast<float>(i) - static_cast<float>(low)) / static_cast<float>(high - low);
    ramp = std::clamp(ramp, 0.0f, 1.0f);
    const float extrapolation_factor = 1.0f - ramp;
    inv[i] = interpolation * (1.0f - extrapolation_factor) + extrapolation * extrapolation_factor;
  }
  return inv;
}

double yarn_attention_factor(const RopeConfig& rope) {
  if (!rope.yarn) return 1.0;
  if (rope.attention_factor != 1.0) return rope.attention_factor;
  auto mscale = [&](double m) { return rope.factor <= 1.0 ? 1.0 : 0.1 * m * std::log(rope.factor) + 1.0; };
  if (rope.mscale != 0.0 && rope.mscale_all_dim != 0.0) return mscale(rope.mscale) / mscale(rope.mscale_all_dim);
  return mscale(1.0);
}

}  // namespace deepinfer
