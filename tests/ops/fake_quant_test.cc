// Fake quantization: every output is the nearest grid point (ties to the even code) times the block scale,
// with scales from the reference's rules, checked by brute force over the code grids.
#include <gtest/gtest.h>

#include "deepinfer/core/dtype.h"
#include "deepinfer/core/error.h"
#include "deepinfer/ops/cpu/cpu_backend.h"
#include "op_test_util.h"

namespace deepinfer {
namespace {

// Nearest of grid[0..n) to |v| (ties to the even index), with v's sign.
double nearest_even(double v, const std::vector<double>& grid) {
  const double a = std::fabs(v);
  size_t best = 0;
  for (size_t i = 1; i < grid.size(); ++i) {
    const double d = std::fabs(grid[i] - a), db = std::fabs(grid[best] - a);
    if (d < db || (d == db && i % 2 == 0)) best = i;
  }
  return std::copysign(grid[best], v);
}

std::vector<double> e4m3_grid() {
  std::vector<double> g;
  for (int c = 0; c <= 0x7E; ++c) g.push_back(e4m3_to_f32(static_cast<uint8_t>(c)));
  return g;
}

double pow2_ceil(double v) { return std::ldexp(1.0, static_cast<int>(std::ceil(std::log2(v)))); }

TEST(FakeQuantOp, AllThreeKindsMatchBruteForce) {
  auto backend = make_cpu_backend(1);
  const std::vector<double> fp4{0, 0.5, 1, 1.5, 2, 3, 4, 6}, fp8 = e4m3_grid();
  for (FakeQuantKind kind :
       {FakeQuantKind::kFP8E4M3Ue8m0Block32, FakeQuantKind::kFP4Ue8m0Block32, FakeQuantKind::kFP4E4m3Block16}) {
    const int64_t block = kind == FakeQuantKind::kFP4E4m3Block16 ? 16 : 32, rows = 7, cols = 64;
    HostTensor x = testing::random_tensor({rows, cols}, 11, 0.001f, 3.0f), orig = testing::copy_of(x);
    backend->fake_quant({x.view(), kind});
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t b = 0; b < cols; b += block) {
        const float* in = orig.data<float>() + r * cols + b;
        float amax = 0;
        for (int64_t i = 0; i < block; ++i) amax = std::max(amax, std::fabs(in[i]));
        double s;
        if (kind == FakeQuantKind::kFP8E4M3Ue8m0Block32)
          s = pow2_ceil(std::max(amax, 1e-4f) * float(1.0 / 448));
        else if (kind == FakeQuantKind::kFP4Ue8m0Block32)
          s = pow2_ceil(std::max(amax, 6 * std::ldexp(1.f, -126)) * float(1.0 / 6));
        else
          s = nearest_even(std::max(amax, 6 * std::ldexp(1.f, -9)) / 6.0f, fp8);
        const auto& grid = kind == FakeQuantKind::kFP8E4M3Ue8m0Block32 ? fp8 : fp4;
        const double mx = grid.back();
        for (int64_t i = 0; i < block; ++i) {
          const double want = nearest_even(std::clamp(double(float(in[i] / float(s))), -mx, mx), grid) * s;
          ASSERT_EQ(x.data<float>()[r * cols + b + i], static_cast<float>(want))
              << "kind " << int(kind) << " row " << r;
        }
      }
  }
}

TEST(FakeQuantOp, UnblockableWidthPassesThrough) {
  auto backend = make_cpu_backend(1);
  HostTensor x = testing::random_tensor({2, 24}, 5), orig = testing::copy_of(x);
  backend->fake_quant({x.view(), FakeQuantKind::kFP8E4M3Ue8m0Block32});
  for (int64_t i = 0; i < x.numel(); ++i) EXPECT_EQ(x.data<float>()[i], orig.data<float>()[i]);
}

// mxfp8_quantize_rows (the FP8 operand form of act_quant): e4m3(code) · 2^(scale − 127) is fake_quant's value bit for
// bit, over rows of magnitudes 2^-30 .. 2^10 (the amax floor's rows included), and the scale is the smallest power of
// two that keeps the block's amax within e4m3's 448.
TEST(FakeQuantOp, Mxfp8QuantizeGivesTheRoundedValuesAsCodesAndScales) {
  auto backend = make_cpu_backend(1);
  const int64_t rows = 41, cols = 96;
  HostTensor x = testing::random_tensor({rows, cols}, 17, 0.001f, 2.0f);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) x.data<float>()[r * cols + c] *= std::ldexp(1.0f, static_cast<int>(r) - 30);
  HostTensor want = testing::copy_of(x);
  backend->fake_quant({want.view(), FakeQuantKind::kFP8E4M3Ue8m0Block32});
  std::vector<uint8_t> codes(rows * cols), scales(rows * cols / 32);
  mxfp8_quantize_rows(x.data<float>(), rows, cols, codes.data(), scales.data());
  for (int64_t i = 0; i < rows * cols; ++i) {
    const float got = e4m3_to_f32(codes[i]) * e8m0_to_f32(scales[i / 32]);
    ASSERT_EQ(got, want.data<float>()[i]) << "element " << i;
  }
  for (int64_t b = 0; b < rows * cols / 32; ++b) {
    float amax = 0;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x.data<float>()[b * 32 + i]));
    const double s = e8m0_to_f32(scales[b]);
    EXPECT_LE(std::max(amax, 1e-4f), 448.0 * s) << "block " << b;
    EXPECT_GT(std::max(amax, 1e-4f), 224.0 * s) << "block " << b;
  }
  EXPECT_THROW(mxfp8_quantize_rows(x.data<float>(), 1, 40, codes.data(), scales.data()), Error);
}

}  // namespace
}  // namespace deepinfer
