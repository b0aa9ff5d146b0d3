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

// The V3 family's GEMM-input rounding (blocks of 128, f32 scale amax / 448 or its power-of-two ceiling): the nearest
// e4m3 value of x / s (ties to even) times s, with the amax floor of 1e-4, over rows of magnitudes 2^-20 .. 2^3.
TEST(FakeQuantOp, Block128KindsMatchBruteForce) {
  auto backend = make_cpu_backend(1);
  const std::vector<double> fp8 = e4m3_grid();
  for (FakeQuantKind kind : {FakeQuantKind::kFP8E4M3Block128, FakeQuantKind::kFP8E4M3Ue8m0Block128}) {
    const int64_t rows = 24, cols = 384;
    HostTensor x = testing::random_tensor({rows, cols}, 13, -2.0f, 2.0f);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) x.data<float>()[r * cols + c] *= std::ldexp(1.0f, static_cast<int>(r) - 20);
    HostTensor orig = testing::copy_of(x);
    backend->fake_quant({x.view(), kind});
    int64_t changed = 0;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t b = 0; b < cols; b += 128) {
        const float* in = orig.data<float>() + r * cols + b;
        float amax = 0;
        for (int64_t i = 0; i < 128; ++i) amax = std::max(amax, std::fabs(in[i]));
        const float s0 = std::max(amax, 1e-4f) / 448.0f;
        const double s = kind == FakeQuantKind::kFP8E4M3Block128 ? s0 : pow2_ceil(s0);
        EXPECT_EQ(fp8_block128_scale(amax, kind == FakeQuantKind::kFP8E4M3Ue8m0Block128), static_cast<float>(s));
        for (int64_t i = 0; i < 128; ++i) {
          const double want = nearest_even(std::clamp(double(in[i] / float(s)), -448.0, 448.0), fp8) * s;
          const float got = x.data<float>()[r * cols + b + i];
          ASSERT_EQ(got, static_cast<float>(want)) << "kind " << int(kind) << " row " << r << " value " << i;
          changed += got != in[i];
        }
      }
    EXPECT_GT(changed, rows * cols / 2) << "the rounding must change most values";
  }
  // A width that is not whole blocks of 128 passes through (as the reference leaves it).
  HostTensor y = testing::random_tensor({2, 96}, 5), orig = testing::copy_of(y);
  backend->fake_quant({y.view(), FakeQuantKind::kFP8E4M3Block128});
  for (int64_t i = 0; i < y.numel(); ++i) EXPECT_EQ(y.data<float>()[i], orig.data<float>()[i]);
}

// fp8_block128_quantize_rows (the operand form for cuBLASLt's block-scaled FP8 GEMM): e4m3(code) · scale is
// fake_quant's value bit for bit, each scale where the strides put it (block-major, as cuBLASLt's VEC128_32F reads,
// and row-major), and a width of partial blocks is refused.
TEST(FakeQuantOp, Fp8Block128QuantizeGivesTheRoundedValuesAsCodesAndScales) {
  auto backend = make_cpu_backend(1);
  const int64_t rows = 19, cols = 512, kb = cols / 128;
  HostTensor x = testing::random_tensor({rows, cols}, 23, -3.0f, 3.0f);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) x.data<float>()[r * cols + c] *= std::ldexp(1.0f, static_cast<int>(r) - 12);
  for (const bool ue8m0 : {false, true}) {
    HostTensor want = testing::copy_of(x);
    backend->fake_quant({want.view(), ue8m0 ? FakeQuantKind::kFP8E4M3Ue8m0Block128 : FakeQuantKind::kFP8E4M3Block128});
    std::vector<uint8_t> codes(rows * cols);
    std::vector<float> block_major(rows * kb), row_major(rows * kb);
    fp8_block128_quantize_rows(x.data<float>(), rows, cols, ue8m0, codes.data(), block_major.data(), 1, rows);
    std::vector<uint8_t> codes2(rows * cols);
    fp8_block128_quantize_rows(x.data<float>(), rows, cols, ue8m0, codes2.data(), row_major.data(), kb, 1);
    EXPECT_EQ(codes, codes2);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        const float s = block_major[(c / 128) * rows + r];
        ASSERT_EQ(s, row_major[r * kb + c / 128]);
        ASSERT_EQ(e4m3_to_f32(codes[r * cols + c]) * s, want.data<float>()[r * cols + c])
            << "ue8m0 " << ue8m0 << " row " << r << " col " << c;
      }
  }
  std::vector<uint8_t> codes(256);
  std::vector<float> scales(2);
  EXPECT_THROW(fp8_block128_quantize_rows(x.data<float>(), 1, 200, false, codes.data(), scales.data(), 1, 1), Error);
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
