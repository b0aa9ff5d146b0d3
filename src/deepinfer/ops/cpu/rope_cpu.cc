// Interleaved-pair RoPE on the trailing rope slice of every head (in place), fp32 angles.
#include <cmath>

#include "deepinfer/ops/cpu/cpu_backend.h"

namespace deepinfer {

void CpuBackend::rope(const RopeParams& p) {
  validate(p);
  const int64_t t_count = p.x.dim(0), heads = p.x.dim(1), hd = p.x.dim(2), half = p.inv_freq.dim(0);
  const float* inv_freq = p.inv_freq.data_as<float>();
  const int64_t* pos = p.positions.data_as<int64_t>();
  for (int64_t t = 0; t < t_count; ++t) {
    const float fpos = static_cast<float>(pos[t]);
    for (int64_t i = 0; i < half; ++i) {
      // The angle is rounded to fp32 before cos/sin, as transformers computes `inv_freq @ positions`.
      const float theta = inv_freq[i] * fpos;
      const float c = static_cast<float>(std::cos(static_cast<double>(theta)));
      float s = static_cast<float>(std::sin(static_cast<double>(theta)));
      if (p.inverse) s = -s;
      for (int64_t h = 0; h < heads; ++h) {
        float* v = p.x.data_as<float>() + (t * heads + h) * hd + (hd - 2 * half) + 2 * i;
        const float a = v[0], b = v[1];
        v[0] = a * c - b * s;
        v[1] = a * s + b * c;
      }
    }
  }
}

}  // namespace deepinfer
