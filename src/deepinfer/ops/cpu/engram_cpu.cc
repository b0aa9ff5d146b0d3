// Engram on the CPU: n-gram hash ids (integer arithmetic, exact) and the gated stream update (fp32).
#include <cmath>

#include "deepinfer/ops/cpu/cpu_backend.h"

namespace deepinfer {

void CpuBackend::engram_hash(const EngramHashParams& p) {
  validate(p);
  const int64_t tokens = p.tokens.dim(0), n = p.tokens.dim(1), heads = p.primes.dim(1);
  const int64_t* tok = p.tokens.data_as<int64_t>();
  const int64_t* mult = p.multipliers.data_as<int64_t>();
  const int64_t* primes = p.primes.data_as<int64_t>();
  const int64_t* offsets = p.offsets.data_as<int64_t>();
  int64_t* out = p.out.data_as<int64_t>();
  const int64_t cols = (n - 1) * heads;
  for (int64_t t = 0; t < tokens; ++t) {
    // Multipliers are bounded so that id · m never overflows int64 (the reference guarantees it).
    uint64_t rolling = static_cast<uint64_t>(tok[t * n] * mult[0]);
    for (int64_t s = 1; s < n; ++s) {
      rolling ^= static_cast<uint64_t>(tok[t * n + s] * mult[s]);
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t c = (s - 1) * heads + h;
        const int64_t prime = primes[(s - 1) * heads + h];
        // Python's % on a non-negative hash: the value is non-negative since ids and multipliers are.
        out[t * cols + c] = static_cast<int64_t>(rolling % static_cast<uint64_t>(prime)) + offsets[c];
      }
    }
  }
}

void CpuBackend::engram_gate(const EngramGateParams& p) {
  validate(p);
  const int64_t tokens = p.streams.dim(0), hc = p.streams.dim(1), d = p.streams.dim(2);
  const float inv_sqrt_d = 1.0f / std::sqrt(static_cast<float>(d));
  for (int64_t t = 0; t < tokens; ++t) {
    const float* v = p.value.data_as<float>() + t * d;
    for (int64_t k = 0; k < hc; ++k) {
      float* x = p.streams.data_as<float>() + (t * hc + k) * d;
      const float* key = p.key.data_as<float>() + (t * hc + k) * d;
      const float* w = p.weight.data_as<float>() + k * d;
      float dot = 0.0f;
      for (int64_t i = 0; i < d; ++i) dot += x[i] * w[i] * key[i];
      const float rstd =
          (1.0f / std::sqrt(dot_f32(x, x, d) / d + p.eps)) * (1.0f / std::sqrt(dot_f32(key, key, d) / d + p.eps));
      dot = dot * rstd * inv_sqrt_d;
      const float g = 1.0f / (1.0f + std::exp(-std::copysign(std::sqrt(std::max(std::fabs(dot), 1e-6f)), dot)));
      for (int64_t i = 0; i < d; ++i) x[i] += g * v[i];
    }
  }
}

}  // namespace deepinfer
