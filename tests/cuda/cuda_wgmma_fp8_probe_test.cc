// The e4m3 wgmma probe (wgmma_fp8_probe.cu) against exact sums: random e4m3 codes (no NaN), 64 x 128 x 128, the
// hardware's own accumulation over the four k32 products and the per-block promotion with power-of-two row factors.
// The tolerance is loose on purpose (2^-10 of the largest |c|): the measured error is printed, since Hopper's FP8
// accumulation keeps fewer mantissa bits than fp32 and the FP8 GEMM's promotion interval depends on how many.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>

#include "cuda/cuda_test_util.h"
#include "cuda/wgmma_fp8_probe.h"
#include "deepinfer/core/dtype.h"

namespace deepinfer {
namespace {

using testing::CudaOpTest;
using testing::DeviceTensor;

TEST_F(CudaOpTest, WgmmaE4m3TileMatchesExactSums) {
  std::mt19937 rng(7);
  auto codes = [&](int64_t rows) {
    HostTensor t(DType::kU8, {rows, 128});
    for (int64_t i = 0; i < t.numel(); ++i) {
      uint8_t c = static_cast<uint8_t>(rng());
      if ((c & 0x7F) == 0x7F) c ^= 0x01;  // no NaN codes
      t.data<uint8_t>()[i] = c;
    }
    return t;
  };
  const HostTensor a = codes(64), b = codes(128);
  HostTensor scale(DType::kF32, {64, 4});
  for (int64_t i = 0; i < scale.numel(); ++i)
    scale.data<float>()[i] = std::ldexp(1.0f, static_cast<int>(rng() % 9) - 4);
  const DeviceTensor da = up(a), db = up(b), ds = up(scale);
  for (bool promote : {false, true}) {
    DeviceTensor dc = poisoned({64, 128});
    testing::Fp8ProbeParams p;
    p.a = da.view().data_as<uint8_t>();
    p.b = db.view().data_as<uint8_t>();
    p.a_scale = ds.view().data_as<float>();
    p.c = dc.view().data_as<float>();
    p.promote = promote;
    testing::run_wgmma_fp8_probe(p, gpu().stream());
    const HostTensor c = down(dc);
    double err = 0, top = 0;
    for (int m = 0; m < 64; ++m)
      for (int n = 0; n < 128; ++n) {
        double want = 0;
        for (int ks = 0; ks < 4; ++ks) {
          double part = 0;
          for (int k = 32 * ks; k < 32 * ks + 32; ++k)
            part += double(e4m3_to_f32(a.data<uint8_t>()[m * 128 + k])) * e4m3_to_f32(b.data<uint8_t>()[n * 128 + k]);
          want += part * (promote ? scale.data<float>()[m * 4 + ks] : 1.0f);
        }
        const double got = c.data<float>()[m * 128 + n];
        ASSERT_TRUE(std::isfinite(got)) << "m " << m << " n " << n;
        err = std::max(err, std::fabs(got - want));
        top = std::max(top, std::fabs(want));
      }
    std::printf("[wgmma e4m3 %s] max |c - exact| = %.3g of max |c| %.3g (%.3g relative)\n",
                promote ? "promoted per k32" : "hardware-accumulated", err, top, err / top);
    EXPECT_LE(err, top * std::ldexp(1.0, -10)) << (promote ? "promoted" : "accumulated");
  }
}

}  // namespace
}  // namespace deepinfer
