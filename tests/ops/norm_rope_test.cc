// Norm and RoPE families against naive double-precision references.
#include <gtest/gtest.h>

#include <complex>

#include "deepinfer/ops/rope_table.h"
#include "op_test_util.h"

namespace deepinfer {
namespace {

using testing::max_rel_error;
using testing::random_tensor;

TEST(RmsNormOp, WeightedUnweightedAndInPlace) {
  auto backend = make_cpu_backend(2);
  const int64_t m = 9, d = 96;
  HostTensor x = random_tensor({m, d}, 1), w = random_tensor({d}, 2), y(DType::kF32, {m, d});
  for (bool weighted : {true, false}) {
    backend->rms_norm({x.view(), weighted ? w.view() : Tensor{}, y.view(), 1e-6f});
    std::vector<double> ref(m * d);
    for (int64_t r = 0; r < m; ++r) {
      double ss = 0;
      for (int64_t i = 0; i < d; ++i) ss += double(x.data<float>()[r * d + i]) * x.data<float>()[r * d + i];
      const double inv = 1 / std::sqrt(ss / d + 1e-6);
      for (int64_t i = 0; i < d; ++i)
        ref[r * d + i] = x.data<float>()[r * d + i] * inv * (weighted ? w.data<float>()[i] : 1.0);
    }
    EXPECT_LT(max_rel_error(y.data<float>(), ref), 1e-6);
    HostTensor z = testing::copy_of(x);
    backend->rms_norm({z.view(), weighted ? w.view() : Tensor{}, z.view(), 1e-6f});
    EXPECT_LT(max_rel_error(z.data<float>(), ref), 1e-6);
  }
}

TEST(RopeOp, InterleavedPairsOnTrailingSliceAndInverse) {
  auto backend = make_cpu_backend(1);
  const int64_t t = 5, h = 3, hd = 24, rd = 8;
  HostTensor x = random_tensor({t, h, hd}, 3), orig = testing::copy_of(x);
  HostTensor inv_freq(DType::kF32, {rd / 2});
  for (int i = 0; i < rd / 2; ++i) inv_freq.data<float>()[i] = std::pow(10000.0f, -2.0f * i / rd);
  HostTensor pos = testing::positions_tensor({0, 1, 7, 100, 4096});
  backend->rope({x.view(), pos.view(), inv_freq.view(), false});
  std::vector<double> ref(t * h * hd);
  for (int64_t a = 0; a < t; ++a)
    for (int64_t b = 0; b < h; ++b)
      for (int64_t c = 0; c < hd; ++c) {
        const int64_t at = (a * h + b) * hd + c;
        ref[at] = orig.data<float>()[at];
        if (c < hd - rd) continue;
        const int64_t pair = (c - (hd - rd)) / 2;
        const double theta = double(float(inv_freq.data<float>()[pair] * float(pos.data<int64_t>()[a])));
        const std::complex<double> z(orig.data<float>()[at - (c - (hd - rd)) % 2],
                                     orig.data<float>()[at - (c - (hd - rd)) % 2 + 1]);
        const std::complex<double> r = z * std::polar(1.0, theta);
        ref[at] = (c - (hd - rd)) % 2 == 0 ? r.real() : r.imag();
      }
  EXPECT_LT(max_rel_error(x.data<float>(), ref), 1e-6);
  backend->rope({x.view(), pos.view(), inv_freq.view(), true});  // inverse restores the input
  std::vector<double> back(orig.data<float>(), orig.data<float>() + orig.numel());
  EXPECT_LT(max_rel_error(x.data<float>(), back), 1e-6);
}

TEST(RopeTable, DefaultAndYarnMatchTheFormulas) {
  RopeConfig plain;
  plain.theta = 10000;
  plain.dim = 16;
  std::vector<float> f = rope_inv_freq(plain);
  ASSERT_EQ(f.size(), 8u);
  for (int i = 0; i < 8; ++i)
    EXPECT_NEAR(f[i], std::pow(10000.0, -2.0 * i / 16), 1e-7 * std::pow(10000.0, -2.0 * i / 16));
  RopeConfig yarn = plain;
  yarn.theta = 160000;
  yarn.yarn = true;
  yarn.factor = 16;
  yarn.original_max_position = 65536;
  yarn.dim = 64;
  // MODELS.md §3.1: lo = floor(d(32)) = 15, hi = ceil(d(1)) = 25; inv' = inv·(1−ρ) + inv/16·ρ.
  std::vector<float> y = rope_inv_freq(yarn);
  for (int i = 0; i < 32; ++i) {
    const double inv = std::pow(160000.0, -2.0 * i / 64), rho = std::clamp((i - 15.0) / 10.0, 0.0, 1.0);
    EXPECT_NEAR(y[i], inv * (1 - rho) + inv / 16 * rho, 1e-6 * inv) << i;
  }
}

}  // namespace
}  // namespace deepinfer
