// RMSNorm: one block per row, fp32 statistics; y = w · (x · inv) with inv = 1 / sqrt(mean(x²) + eps), the
// CPU op's order of operations (the product x·inv is rounded before the weight multiplies it).
#include "deepinfer/ops/cuda/device_math.cuh"
#include "deepinfer/ops/cuda/kernels.h"

namespace deepinfer::cuda {
namespace {

__global__ void rms_norm_kernel(RmsNormKernelParams p) {
  __shared__ float red[32];
  const float* x = p.in + blockIdx.x * p.dim;
  float* y = p.out + blockIdx.x * p.dim;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < p.dim; i += blockDim.x) ss = fmaf(x[i], x[i], ss);
  ss = block_sum(ss, red);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(p.dim) + p.eps);
  // In place is safe: every element is read by the thread that writes it, after the reduction.
  for (int64_t i = threadIdx.x; i < p.dim; i += blockDim.x) {
    const float v = __fmul_rn(x[i], inv);
    y[i] = p.weight ? __fmul_rn(p.weight[i], v) : v;
  }
}

}  // namespace

void run_rms_norm(const RmsNormKernelParams& p, cudaStream_t stream) {
  if (p.rows == 0) return;
  const int threads = rms_norm_threads(p.dim);
  rms_norm_kernel<<<static_cast<unsigned>(p.rows), threads, 0, stream>>>(p);
  DI_CUDA_CHECK_LAUNCH();
}

}  // namespace deepinfer::cuda
