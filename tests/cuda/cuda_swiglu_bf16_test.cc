// run_swiglu_bf16 (moe_cuda.cu: the MoE SwiGLU writing its bf16 copy in the same pass) against run_swiglu then
// run_cast_f32_to_bf16, byte for byte on h and h16: routed-expert form (weights before w2 through the slot
// permutation, a device row count below the buffer's rows) and shared-expert form, with and without the clamp, at
// prefill sizes; inter % 4 != 0 and an unaligned h16 take the two-launch path.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cuda/cuda_test_util.h"
#include "deepinfer/ops/cuda/kernels.h"
#include "deepinfer/ops/cuda/swiglu_bf16.h"

namespace deepinfer {
namespace {

using testing::CudaOpTest;
using testing::DeviceTensor;

TEST_F(CudaOpTest, SwigluBf16MatchesSwigluThenCastBitwise) {
  struct Case {
    int64_t rows, inter;
    bool routed;
    float limit;
    int64_t h16_offset;  // bf16 elements
  };
  for (const Case& c :
       {Case{4100, 2048, true, 10.0f, 0}, Case{4100, 2048, true, 0.0f, 0}, Case{700, 2304, false, 10.0f, 0},
        Case{9, 2304, false, 0.0f, 0}, Case{33, 6, true, 7.0f, 0}, Case{40, 256, false, 0.0f, 1}}) {
    // Gate / up values wide enough that the clamp and the sigmoid's tails are hit.
    HostTensor gu = rand({c.rows, 2 * c.inter}, -12.0f, 12.0f), weights = rand({c.rows}, 0.05f, 1.0f);
    std::vector<int32_t> perm(c.rows);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng());
    HostTensor hperm(DType::kI32, {c.rows});
    for (int64_t i = 0; i < c.rows; ++i) hperm.data<int32_t>()[i] = perm[i];
    const int64_t used = c.routed ? c.rows - c.rows / 7 : c.rows;  // routed: slots of unknown experts left out
    HostTensor hused(DType::kI32, {1});
    hused.data<int32_t>()[0] = static_cast<int32_t>(used);
    DeviceTensor dgu = up(gu), dw = up(weights), dperm = up(hperm), dused = up(hused);
    HostTensor h[2], h16[2];
    for (int fused = 0; fused < 2; ++fused) {
      DeviceTensor dh = poisoned({c.rows, c.inter});
      DeviceTensor dh16 = poisoned_bytes(DType::kBF16, {c.rows * c.inter + c.h16_offset});
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      cuda::SwigluKernelParams p;
      p.gu = static_cast<const float*>(dgu.data());
      p.h = static_cast<float*>(dh.data());
      p.rows = c.rows;
      p.inter = c.inter;
      p.limit = c.limit;
      if (c.routed) {
        p.weights = static_cast<const float*>(dw.data());
        p.weight_rows = static_cast<const int32_t*>(dperm.data());
        p.rows_used = static_cast<const int32_t*>(dused.data());
      }
      void* out16 = static_cast<uint16_t*>(dh16.data()) + c.h16_offset;
      if (fused) {
        cuda::run_swiglu_bf16(p, out16, nullptr);
      } else {
        cuda::run_swiglu(p, nullptr);
        cuda::run_cast_f32_to_bf16(p.h, out16, c.rows * c.inter, nullptr);
      }
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      h[fused] = down(dh);
      h16[fused] = down(dh16);
    }
    const std::string what = "swiglu_bf16 rows" + std::to_string(c.rows) + " inter" + std::to_string(c.inter) +
                             (c.routed ? " routed" : " shared") + (c.limit > 0 ? " clamped" : "") +
                             (c.h16_offset ? " unaligned" : "");
    // The rows SwiGLU writes (the first `used`; the cast of the rows past them copies whatever h held there).
    HostTensor h_used[2], h16_used[2];
    for (int f = 0; f < 2; ++f) {
      std::vector<int64_t> rows(used);
      std::iota(rows.begin(), rows.end(), 0);
      h_used[f] = take_rows(h[f], rows);
      HostTensor flat16(DType::kBF16, {used * c.inter});
      std::memcpy(flat16.view().data(), static_cast<const uint16_t*>(h16[f].view().data()) + c.h16_offset,
                  flat16.view().nbytes());
      h16_used[f] = std::move(flat16);
    }
    expect_same_bytes((what + " h").c_str(), h_used[1], h_used[0]);
    expect_same_bytes((what + " h16").c_str(), h16_used[1], h16_used[0]);
    int64_t nan = 0;
    for (int64_t i = 0; i < h_used[1].numel(); ++i) nan += std::isnan(h_used[1].data<float>()[i]);
    EXPECT_EQ(nan, 0) << what << ": unwritten outputs";
  }
}

}  // namespace
}  // namespace deepinfer
