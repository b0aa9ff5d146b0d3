// Compressor pooling on the CPU: per group and channel, a softmax over the group's slots weights the slots'
// KV projections (fp32). The caller lays out the slots and adds position biases to the gate.
#include <cmath>

#include "deepinfer/ops/cpu/cpu_backend.h"

namespace deepinfer {

void CpuBackend::compress_pool(const CompressPoolParams& p) {
  validate(p);
  const int64_t groups = p.kv.dim(0), slots = p.kv.dim(1), ch = p.kv.dim(2);
  const float* kv = p.kv.data_as<float>();
  const float* gate = p.gate.data_as<float>();
  float* out = p.out.data_as<float>();
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t c = 0; c < ch; ++c) {
      const int64_t at = g * slots * ch + c;
      float mx = -INFINITY;
      for (int64_t s = 0; s < slots; ++s) mx = std::max(mx, gate[at + s * ch]);
      float sum = 0.0f;
      for (int64_t s = 0; s < slots; ++s) sum += std::exp(gate[at + s * ch] - mx);
      float acc = 0.0f;
      for (int64_t s = 0; s < slots; ++s) acc += kv[at + s * ch] * (std::exp(gate[at + s * ch] - mx) / sum);
      out[g * ch + c] = acc;
    }
}

}  // namespace deepinfer
