// QAT fake quantization (quantize + dequantize in place), block-wise along rows, with the CPU op's scale
// rules and RNE conversions (device_math.cuh mirrors core/dtype.h; the block itself is fake_quant.cuh's), so results
// match the CPU bit for bit.
// One thread per block of 16/32 values: the op is tiny next to the GEMMs around it.
#include <cstdint>

#include "deepinfer/core/error.h"
#include "deepinfer/ops/cuda/device_math.cuh"
#include "deepinfer/ops/cuda/fake_quant.cuh"
#include "deepinfer/ops/cuda/kernels.h"

namespace deepinfer::cuda {
namespace {

template <FakeQuantKind K>
__global__ void fake_quant_kernel(float* x, int64_t blocks) {
  const int64_t b = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (b >= blocks) return;
  fake_quant_block<K>(x + b * fake_quant_block_size<K>());
}

// The same blocks read from `in` and written to x (one pass instead of a copy and an in-place pass: act_quant's
// rounded copies of GEMM inputs). The block's values go through registers with the in-place kernel's arithmetic.
template <FakeQuantKind K>
__global__ void fake_quant_copy_kernel(const float* in, float* x, int64_t blocks) {
  constexpr int kBlock = fake_quant_block_size<K>();
  const int64_t b = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (b >= blocks) return;
  float v[kBlock];
  const float4* src = reinterpret_cast<const float4*>(in + b * kBlock);
#pragma unroll
  for (int i = 0; i < kBlock / 4; ++i) reinterpret_cast<float4*>(v)[i] = src[i];
  fake_quant_block<K>(v);
  float4* dst = reinterpret_cast<float4*>(x + b * kBlock);
#pragma unroll
  for (int i = 0; i < kBlock / 4; ++i) dst[i] = reinterpret_cast<const float4*>(v)[i];
}

template <FakeQuantKind K>
void launch(const FakeQuantKernelParams& p, int64_t blocks, cudaStream_t stream) {
  const unsigned grid = grid_1d(blocks, 128);
  if (p.in)
    fake_quant_copy_kernel<K><<<grid, 128, 0, stream>>>(p.in, p.x, blocks);
  else
    fake_quant_kernel<K><<<grid, 128, 0, stream>>>(p.x, blocks);
}

}  // namespace

void run_fake_quant(const FakeQuantKernelParams& p, cudaStream_t stream) {
  const int64_t block = p.kind == FakeQuantKind::kFP4E4m3Block16 ? 16 : 32;
  if (p.cols % block != 0 || p.rows * p.cols == 0) return;  // as the CPU op: unblockable rows pass through
  DI_CHECK(!p.in || (reinterpret_cast<uintptr_t>(p.in) % 16 == 0 && reinterpret_cast<uintptr_t>(p.x) % 16 == 0))
      << "fake_quant: a copying call needs 16-byte aligned rows";
  const int64_t blocks = p.rows * p.cols / block;
  switch (p.kind) {
    case FakeQuantKind::kFP8E4M3Ue8m0Block32:
      launch<FakeQuantKind::kFP8E4M3Ue8m0Block32>(p, blocks, stream);
      break;
    case FakeQuantKind::kFP4Ue8m0Block32:
      launch<FakeQuantKind::kFP4Ue8m0Block32>(p, blocks, stream);
      break;
    case FakeQuantKind::kFP4E4m3Block16:
      launch<FakeQuantKind::kFP4E4m3Block16>(p, blocks, stream);
      break;
  }
  DI_CUDA_CHECK_LAUNCH();
}

}  // namespace deepinfer::cuda
