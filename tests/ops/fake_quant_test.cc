// Fake quantization: every output is the nearest grid point (ties to the even code) times the block scale,
// with scales from the reference's rules, checked by brute force over the code grids.
#include <gtest/gtest.h>

#include "deepinfer/core/dtype.h"
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

}  // namespace
}  // namespace deepinfer
