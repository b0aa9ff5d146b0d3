// RMSNorm on the CPU: fp32 statistics, optional weight (the mHC input norm has none).
#include <cmath>

#include "deepinfer/ops/cpu/cpu_backend.h"

namespace deepinfer {

void CpuBackend::rms_norm(const RmsNormParams& p) {
  validate(p);
  const int64_t m = p.in.dim(0), d = p.in.dim(1);
  const float* w = p.weight.data() ? p.weight.data_as<float>() : nullptr;
  parallel_for(m, m * d, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* x = p.in.data_as<float>() + r * d;
      float* y = p.out.data_as<float>() + r * d;
      const float inv = 1.0f / std::sqrt(dot_f32(x, x, d) / static_cast<float>(d) + p.eps);
      for (int64_t i = 0; i < d; ++i) y[i] = w ? w[i] * (x[i] * inv) : x[i] * inv;
    }
  });
}

}  // namespace deepinfer
