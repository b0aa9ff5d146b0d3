// Interleaved-pair RoPE on the trailing rope slice of every head, in place. The angle is rounded to fp32 and
// cos/sin are taken in double and rounded, as the CPU op does, so the rotation factors match it bit for bit;
// the rotation itself is written without FMA contraction for the same reason.
#include "deepinfer/ops/cuda/device_math.cuh"
#include "deepinfer/ops/cuda/kernels.h"

namespace deepinfer::cuda {
namespace {

// One block per token; threads walk (head, pair) with the pair index fastest.
__global__ void rope_kernel(RopeKernelParams p) {
  const int64_t t = blockIdx.x;
  const float fpos = static_cast<float>(p.positions[t]);
  const int64_t offset = p.hd - 2 * p.half;
  for (int64_t idx = threadIdx.x; idx < p.heads * p.half; idx += blockDim.x) {
    const int64_t h = idx / p.half, i = idx % p.half;
    const float theta = __fmul_rn(p.inv_freq[i], fpos);
    const float c = static_cast<float>(cos(static_cast<double>(theta)));
    float s = static_cast<float>(sin(static_cast<double>(theta)));
    if (p.inverse) s = -s;
    float* v = p.x + (t * p.heads + h) * p.hd + offset + 2 * i;
    const float a = v[0], b = v[1];
    v[0] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
    v[1] = __fadd_rn(__fmul_rn(a, s), __fmul_rn(b, c));
  }
}

}  // namespace

void run_rope(const RopeKernelParams& p, cudaStream_t stream) {
  if (p.tokens == 0 || p.half == 0 || p.heads == 0) return;
  rope_kernel<<<static_cast<unsigned>(p.tokens), 256, 0, stream>>>(p);
  DI_CUDA_CHECK_LAUNCH();
}

}  // namespace deepinfer::cuda
