// One block of QAT fake quantization (quantize + dequantize in place) with the CPU op's scale rules and RNE
// conversions: shared by the fake_quant kernel and the fused norm_rope kernel, so both give the same bits.
#pragma once

#include "deepinfer/ops/cuda/device_math.cuh"
#include "deepinfer/ops/ops.h"

namespace deepinfer::cuda {

template <FakeQuantKind K>
__host__ __device__ constexpr int fake_quant_block_size() {
  return K == FakeQuantKind::kFP4E4m3Block16                                                 ? 16
         : K == FakeQuantKind::kFP8E4M3Block128 || K == FakeQuantKind::kFP8E4M3Ue8m0Block128 ? 128
                                                                                             : 32;
}

// The 128-value kinds' scale (fp8_block128_scale on the CPU): max(amax, 1e-4) / 448, or its power-of-two ceiling.
__device__ __forceinline__ float fp8_block128_scale_dev(float amax, bool ue8m0) {
  const float s = __fdiv_rn(fmaxf(amax, 1e-4f), 448.0f);
  return ue8m0 ? pow2_ceil_dev(s) : s;
}
// One value of a 128-value block with scale s: its e4m3 code (x / s rounded, IEEE division).
__device__ __forceinline__ uint8_t fp8_block128_code(float x, float s) {
  return f32_to_e4m3_dev(fminf(fmaxf(__fdiv_rn(x, s), -448.0f), 448.0f));
}

// v: fake_quant_block_size<K>() consecutive values (the 16- and 32-value kinds: one thread a block; the 128-value
// kinds go a warp a block in fake_quant_cuda.cu).
template <FakeQuantKind K>
__device__ __forceinline__ void fake_quant_block(float* v) {
  constexpr int kBlock = fake_quant_block_size<K>();
  static_assert(kBlock <= 32, "128-value blocks: a warp a block (fake_quant_cuda.cu)");
  constexpr float kFp4Max = 6.0f;
  constexpr float kE4M3MaxDev = 448.0f;
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < kBlock; ++i) amax = fmaxf(amax, fabsf(v[i]));
  if constexpr (K == FakeQuantKind::kFP8E4M3Ue8m0Block32) {
    const float s = pow2_ceil_dev(__fmul_rn(fmaxf(amax, 1e-4f), static_cast<float>(1.0 / 448.0)));
#pragma unroll
    for (int i = 0; i < kBlock; ++i)
      v[i] =
          __fmul_rn(e4m3_to_f32_dev(f32_to_e4m3_dev(fminf(fmaxf(__fdiv_rn(v[i], s), -kE4M3MaxDev), kE4M3MaxDev))), s);
  } else if constexpr (K == FakeQuantKind::kFP4Ue8m0Block32) {
    const float s =
        pow2_ceil_dev(__fmul_rn(fmaxf(amax, 6.0f * 1.1754943508222875e-38f), static_cast<float>(1.0 / 6.0)));
#pragma unroll
    for (int i = 0; i < kBlock; ++i)
      v[i] = __fmul_rn(e2m1_to_f32_dev(f32_to_e2m1_dev(fminf(fmaxf(__fdiv_rn(v[i], s), -kFp4Max), kFp4Max))), s);
  } else {
    // s = e4m3(max(amax, 6·2^-9) / 6): a division rounded like PyTorch's, then an RNE cast.
    const float s = e4m3_to_f32_dev(f32_to_e4m3_dev(__fdiv_rn(fmaxf(amax, 6.0f * 0.001953125f), kFp4Max)));
#pragma unroll
    for (int i = 0; i < kBlock; ++i)
      v[i] = __fmul_rn(e2m1_to_f32_dev(f32_to_e2m1_dev(fminf(fmaxf(__fdiv_rn(v[i], s), -kFp4Max), kFp4Max))), s);
  }
}

}  // namespace deepinfer::cuda
