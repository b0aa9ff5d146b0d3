// Compressor pooling: per (group, channel) a softmax over the group's slots weights the slots' KV (fp32).
// One thread per (group, channel): adjacent threads read adjacent channels, so every slot read is coalesced.
#include "deepinfer/ops/cuda/device_math.cuh"
#include "deepinfer/ops/cuda/kernels.h"

namespace deepinfer::cuda {
namespace {

__global__ void compress_pool_kernel(CompressPoolKernelParams p) {
  const int64_t total = p.groups * p.ch;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t g = idx / p.ch, c = idx % p.ch;
    const int64_t at = g * p.slots * p.ch + c;
    float mx = -INFINITY;
    for (int64_t s = 0; s < p.slots; ++s) mx = fmaxf(mx, p.gate[at + s * p.ch]);
    float sum = 0.0f;
    for (int64_t s = 0; s < p.slots; ++s) sum += expf(p.gate[at + s * p.ch] - mx);
    float acc = 0.0f;
    for (int64_t s = 0; s < p.slots; ++s) {
      const float gate = p.gate[at + s * p.ch];
      // A −inf gate is weight 0: its slot (V4's missing predecessor window) is never read, so it may hold
      // anything, NaN included.
      if (gate == -INFINITY) continue;
      acc = __fadd_rn(acc, __fmul_rn(p.kv[at + s * p.ch], __fdiv_rn(expf(gate - mx), sum)));
    }
    p.out[idx] = acc;
  }
}

}  // namespace

void run_compress_pool(const CompressPoolKernelParams& p, cudaStream_t stream) {
  if (p.groups * p.ch == 0) return;
  compress_pool_kernel<<<grid_1d(p.groups * p.ch, 256), 256, 0, stream>>>(p);
  DI_CUDA_CHECK_LAUNCH();
}

}  // namespace deepinfer::cuda
