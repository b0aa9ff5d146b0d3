// QAT fake quantization on the CPU (MODELS.md §3.3): block-wise quantize to FP8 e4m3 or FP4 e2m1 and
// dequantize again, with the reference's scale rules. The scale of the FP8 and FP4-index variants is a power
// of two, so x / s is exact; the FP4 main-KV scale is an e4m3 value and the division rounds like PyTorch's.
#include <algorithm>
#include <cmath>

#include "deepinfer/core/dtype.h"
#include "deepinfer/ops/cpu/cpu_backend.h"

namespace deepinfer {
namespace {

constexpr float kFp4Max = 6.0f;

// 2^ceil(log2(v)) for positive normal v via the exponent bits (biased exponent − 127 + (mantissa != 0)).
float pow2_ceil(float v) { return e8m0_to_f32(f32_to_e8m0_ceil(v)); }

}  // namespace

// The reference's act_quant scale of a 128-value block: amax / 448 (no power of two: x / s rounds once more than the
// MXFP8 kinds, the same IEEE division everywhere), or its power-of-two ceiling (scale_fmt ue8m0).
float fp8_block128_scale(float amax, bool ue8m0) {
  const float s = std::max(amax, 1e-4f) / 448.0f;
  return ue8m0 ? pow2_ceil(s) : s;
}

namespace {

void quant_block(float* x, int64_t n, FakeQuantKind kind) {
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  switch (kind) {
    case FakeQuantKind::kFP8E4M3Ue8m0Block32: {
      const float s = pow2_ceil(std::max(amax, 1e-4f) * static_cast<float>(1.0 / 448.0));
      for (int64_t i = 0; i < n; ++i) x[i] = e4m3_to_f32(f32_to_e4m3(std::clamp(x[i] / s, -kE4M3Max, kE4M3Max))) * s;
      break;
    }
    case FakeQuantKind::kFP4Ue8m0Block32: {
      const float s = pow2_ceil(std::max(amax, 6.0f * std::ldexp(1.0f, -126)) * static_cast<float>(1.0 / 6.0));
      for (int64_t i = 0; i < n; ++i) x[i] = e2m1_to_f32(f32_to_e2m1(std::clamp(x[i] / s, -kFp4Max, kFp4Max))) * s;
      break;
    }
    case FakeQuantKind::kFP4E4m3Block16: {
      const float s = e4m3_to_f32(f32_to_e4m3(std::max(amax, 6.0f * std::ldexp(1.0f, -9)) / kFp4Max));
      for (int64_t i = 0; i < n; ++i) x[i] = e2m1_to_f32(f32_to_e2m1(std::clamp(x[i] / s, -kFp4Max, kFp4Max))) * s;
      break;
    }
    case FakeQuantKind::kFP8E4M3Block128:
    case FakeQuantKind::kFP8E4M3Ue8m0Block128: {
      const float s = fp8_block128_scale(amax, kind == FakeQuantKind::kFP8E4M3Ue8m0Block128);
      for (int64_t i = 0; i < n; ++i) x[i] = e4m3_to_f32(f32_to_e4m3(std::clamp(x[i] / s, -kE4M3Max, kE4M3Max))) * s;
      break;
    }
  }
}

}  // namespace

void fake_quant_rows(float* x, int64_t rows, int64_t cols, FakeQuantKind kind) {
  const int64_t block = fake_quant_block_len(kind);
  if (cols % block != 0) return;  // the reference leaves unblockable shapes (tiny configs) unquantized
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < cols; b += block) quant_block(x + r * cols + b, block, kind);
}

std::vector<float> act_quant_copy(const float* x, int64_t rows, int64_t cols, ActQuant q) {
  std::vector<float> out(x, x + rows * cols);
  if (q != ActQuant::kNone) fake_quant_rows(out.data(), rows, cols, act_quant_kind(q));
  return out;
}

void fp8_block128_quantize_rows(const float* x, int64_t rows, int64_t cols, bool ue8m0, uint8_t* codes, float* scales,
                                int64_t scale_row_stride, int64_t scale_block_stride) {
  DI_CHECK(cols % 128 == 0) << "fp8 block quantize: " << cols << " columns are not whole blocks of 128";
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < cols / 128; ++b) {
      const float* v = x + r * cols + b * 128;
      float amax = 0.0f;
      for (int i = 0; i < 128; ++i) amax = std::max(amax, std::fabs(v[i]));
      // quant_block's kFP8E4M3(Ue8m0)Block128 case.
      const float s = fp8_block128_scale(amax, ue8m0);
      scales[r * scale_row_stride + b * scale_block_stride] = s;
      for (int i = 0; i < 128; ++i)
        codes[r * cols + b * 128 + i] = f32_to_e4m3(std::clamp(v[i] / s, -kE4M3Max, kE4M3Max));
    }
}

void mxfp8_quantize_rows(const float* x, int64_t rows, int64_t cols, uint8_t* codes, uint8_t* scales) {
  DI_CHECK(cols % 32 == 0) << "mxfp8 quantize: " << cols << " columns are not whole blocks of 32";
  for (int64_t b = 0; b < rows * cols / 32; ++b) {
    const float* v = x + b * 32;
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(v[i]));
    // The scale and codes of quant_block's kFP8E4M3Ue8m0Block32 case.
    scales[b] = f32_to_e8m0_ceil(std::max(amax, 1e-4f) * static_cast<float>(1.0 / 448.0));
    const float s = e8m0_to_f32(scales[b]);
    for (int i = 0; i < 32; ++i) codes[b * 32 + i] = f32_to_e4m3(std::clamp(v[i] / s, -kE4M3Max, kE4M3Max));
  }
}

void CpuBackend::fake_quant(const FakeQuantParams& p) {
  validate(p);
  fake_quant_rows(p.x.data_as<float>(), p.x.dim(0), p.x.dim(1), p.kind);
}

}  // namespace deepinfer
