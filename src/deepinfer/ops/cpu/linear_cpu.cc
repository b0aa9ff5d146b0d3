// Linear family on the CPU: weight dequantization (float, FP8 block-scaled, MXFP4, FP8 per-32 rows), the
// fp32 GEMM y = x·Wᵀ, and embedding row gathers.
#include <cstring>
#include <vector>

#include "deepinfer/core/dtype.h"
#include "deepinfer/ops/cpu/cpu_backend.h"

namespace deepinfer {
namespace {

float scale_at(const Tensor& scale, int64_t i) {
  return scale.dtype() == DType::kE8M0 ? e8m0_to_f32(scale.data_as<uint8_t>()[i]) : scale.data_as<float>()[i];
}

}  // namespace

void CpuBackend::dequantize(const DequantizeParams& p) {
  validate(p);
  const int64_t n = p.out.dim(0), k = p.out.dim(1);
  float* out = p.out.data_as<float>();
  switch (p.format) {
    case QuantFormat::kFloat:
      for (int64_t i = 0; i < n * k; ++i) out[i] = load_as_f32(p.weight.data(), p.weight.dtype(), i);
      break;
    case QuantFormat::kFP8Block: {
      // W[i,j] = e4m3(q[i,j]) · S[i / block_n, j / block_k]; edge tiles share their tile's scale.
      const uint8_t* q = p.weight.data_as<uint8_t>();
      const int64_t scale_cols = p.scale.dim(1);
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < k; ++j)
          out[i * k + j] = e4m3_to_f32(q[i * k + j]) * scale_at(p.scale, (i / p.block_n) * scale_cols + j / p.block_k);
      break;
    }
    case QuantFormat::kMXFP4: {
      // Byte j of a row holds columns 2j (low nibble) and 2j+1 (high nibble); one E8M0 scale per 32 columns.
      const uint8_t* q = static_cast<const uint8_t*>(p.weight.data());
      const uint8_t* s = p.scale.data_as<uint8_t>();
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < k; ++j)
          out[i * k + j] = e2m1_to_f32(fp4_get(q + i * (k / 2), j)) * e8m0_to_f32(s[i * (k / 32) + j / 32]);
      break;
    }
    case QuantFormat::kFP8Row32: {
      const uint8_t* q = p.weight.data_as<uint8_t>();
      const int64_t scale_cols = p.scale.dim(1);
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < k; ++j)
          out[i * k + j] = e4m3_to_f32(q[i * k + j]) * scale_at(p.scale, i * scale_cols + j / 32);
      break;
    }
  }
}

void CpuBackend::linear(const LinearParams& p) {
  validate(p);
  const int64_t m = p.in.dim(0), k = p.in.dim(1), n = p.weight.dim(0);
  std::vector<float> rounded;
  if (p.act_quant != ActQuant::kNone) rounded = act_quant_copy(p.in.data_as<float>(), m, k, p.act_quant);
  const float* x = rounded.empty() ? p.in.data_as<float>() : rounded.data();
  const float* w = p.weight.data_as<float>();
  float* y = p.out.data_as<float>();
  // Split over output features: every thread streams its own slice of W once for all rows of x.
  parallel_for(n, m * n * k, [&](int64_t begin, int64_t end) {
    for (int64_t r = 0; r < m; ++r)
      for (int64_t c = begin; c < end; ++c) y[r * n + c] = dot_f32(x + r * k, w + c * k, k);
  });
}

void CpuBackend::embedding(const EmbeddingParams& p) {
  validate(p);
  const int64_t v = p.table.dim(0), d = p.table.dim(1);
  const int64_t* ids = p.ids.data_as<int64_t>();
  for (int64_t t = 0; t < p.ids.dim(0); ++t) {
    DI_CHECK(ids[t] >= 0 && ids[t] < v) << "embedding: token id " << ids[t] << " out of range [0, " << v << ")";
    std::memcpy(p.out.data_as<float>() + t * d, p.table.data_as<float>() + ids[t] * d, sizeof(float) * d);
  }
}

}  // namespace deepinfer
