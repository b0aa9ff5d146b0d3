// QAT fake quantization (quantize + dequantize in place), block-wise along rows, with the CPU op's scale
// rules and RNE conversions (device_math.cuh mirrors core/dtype.h; the block itself is fake_quant.cuh's), so results
// match the CPU bit for bit.
// One thread per block of 16/32 values: the op is tiny next to the GEMMs around it.
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
