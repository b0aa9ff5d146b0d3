// run_cast_f32_to_bf16 (linear_cuda.cu): the 8-values-a-thread kernel against the grid-stride one (the same values
// read from an input 4 bytes off a 16-byte boundary, which the vector kernel does not take) byte for byte, and
// against the host's round-to-nearest-even f32_to_bf16 for every non-NaN value (the device writes its canonical NaN):
// random values over many magnitudes plus zeros of both signs, infinities, NaN, subnormals, the largest floats and
// exact ties between two bf16 values; sizes past the vector kernel's conditions (n % 8 != 0, unaligned input or
// output) take the grid-stride kernel both ways.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>

#include "cuda/cuda_test_util.h"
#include "deepinfer/core/dtype.h"
#include "deepinfer/ops/cuda/kernels.h"

namespace deepinfer {
namespace {

using testing::CudaOpTest;
using testing::DeviceTensor;

TEST_F(CudaOpTest, CastF32ToBf16VecMatchesScalarBitwise) {
  std::vector<float> specials = testing::f32_rounding_specials();
  specials.push_back(1.00390625f);  // 1 + 2^-8: a tie, rounds down to the even 1.0
  specials.push_back(1.01171875f);  // 1 + 3·2^-8: a tie, rounds up to the even 1 + 2^-6
  specials.push_back(-2.0078125f);  // -(2 + 2^-7): a tie
                                    // -(2 + 2^-7): a tie
  std::uniform_real_distribution<float> mant(-1.0f, 1.0f);
  std::uniform_int_distribution<int> expo(-60, 60);
  for (auto [n, in_off, out_off] : {std::tuple<int64_t, int64_t, int64_t>{8, 0, 0},
                                    {4096 * 7, 0, 0},
                                    {3000 * 4096 + 8, 0, 0},
                                    {12, 0, 0},
                                    {4096, 1, 0},
                                    {4096, 0, 4}}) {
    HostTensor x(DType::kF32, {n + in_off});
    float* xv = x.data<float>();
    for (int64_t i = 0; i < n + in_off; ++i) xv[i] = std::ldexp(mant(rng()), expo(rng()));
    for (size_t s = 0; s < specials.size() && s < static_cast<size_t>(n); ++s)
      xv[in_off + static_cast<int64_t>(s) * (n / 12 > 0 ? n / 12 : 1) % n] = specials[s];
    // The same n values one float after the start of a 16-byte-aligned buffer: the grid-stride kernel.
    HostTensor x_off(DType::kF32, {n + 1});
    std::memcpy(x_off.data<float>() + 1, xv + in_off, sizeof(float) * n);
    x_off.data<float>()[0] = 0.0f;
    DeviceTensor dx = up(x), dx_off = up(x_off);
    HostTensor out[2];
    for (int vec = 0; vec < 2; ++vec) {
      DeviceTensor dy = poisoned_bytes(DType::kBF16, {n + out_off});
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const float* in =
          vec ? static_cast<const float*>(dx.data()) + in_off : static_cast<const float*>(dx_off.data()) + 1;
      cuda::run_cast_f32_to_bf16(in, static_cast<uint16_t*>(dy.data()) + out_off, n, nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      out[vec] = down(dy);
    }
    const std::string what =
        "cast f32->bf16 n" + std::to_string(n) + (in_off ? " in+1" : "") + (out_off ? " out+4" : "");
    expect_same_bytes(what.c_str(), out[1], out[0]);
    int64_t wrong = 0;
    const auto* got = static_cast<const uint16_t*>(out[1].view().data()) + out_off;
    for (int64_t i = 0; i < n; ++i) {
      const float v = xv[in_off + i];
      if (std::isnan(v))
        wrong += !std::isnan(bf16_to_f32(got[i]));
      else
        wrong += got[i] != f32_to_bf16(v);
    }
    EXPECT_EQ(wrong, 0) << what << ": values not rounded to nearest even (seed " << seed_ << ")";
  }
}

}  // namespace
}  // namespace deepinfer
