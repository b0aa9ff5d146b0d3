// QAT fake quantization (quantize + dequantize in place), block-wise along rows, with the CPU op's scale
// rules and RNE conversions (device_math.cuh mirrors core/dtype.h), so results match the CPU bit for bit.
// One thread per block of 16/32 values: the op is tiny next to the GEMMs around it.
#include "deepinfer/ops/cuda/device_math.cuh"
#include "deepinfer/ops/cuda/kernels.h"

namespace deepinfer::cuda {
namespace {

constexpr float kFp4Max = 6.0f;
constexpr float kE4M3MaxDev = 448.0f;

template <FakeQuantKind K>
__global__ void fake_quant_kernel(float* x, int64_t blocks) {
  constexpr int kBlock = K == FakeQuantKind::kFP4E4m3Block16 ? 16 : 32;
  const int64_t b = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (b >= blocks) return;
  float* v = x + b * kBlock;
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

}  // namespace

void run_fake_quant(const FakeQuantKernelParams& p, cudaStream_t stream) {
  const int64_t block = p.kind == FakeQuantKind::kFP4E4m3Block16 ? 16 : 32;
  if (p.cols % block != 0 || p.rows * p.cols == 0) return;  // as the CPU op: unblockable rows pass through
  const int64_t blocks = p.rows * p.cols / block;
  const unsigned grid = grid_1d(blocks, 128);
  switch (p.kind) {
    case FakeQuantKind::kFP8E4M3Ue8m0Block32:
      fake_quant_kernel<FakeQuantKind::kFP8E4M3Ue8m0Block32><<<grid, 128, 0, stream>>>(p.x, blocks);
      break;
    case FakeQuantKind::kFP4Ue8m0Block32:
      fake_quant_kernel<FakeQuantKind::kFP4Ue8m0Block32><<<grid, 128, 0, stream>>>(p.x, blocks);
      break;
    case FakeQuantKind::kFP4E4m3Block16:
      fake_quant_kernel<FakeQuantKind::kFP4E4m3Block16><<<grid, 128, 0, stream>>>(p.x, blocks);
      break;
  }
  DI_CUDA_CHECK_LAUNCH();
}

}  // namespace deepinfer::cuda
