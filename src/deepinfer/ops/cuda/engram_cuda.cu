// Engram: n-gram hash ids (exact 64-bit integer arithmetic, one thread per token) and the gated stream update
// (one block per (token, stream): three reductions over D, then X += g·V).
#include "deepinfer/ops/cuda/device_math.cuh"
#include "deepinfer/ops/cuda/kernels.h"

namespace deepinfer::cuda {
namespace {

__global__ void engram_hash_kernel(EngramHashKernelParams p) {
  const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (t >= p.count) return;
  const int64_t* tok = p.tokens + t * p.n;
  const int64_t cols = (p.n - 1) * p.heads;
  // Unsigned wrap-around of the products is what the CPU op computes (the reference keeps them in range).
  uint64_t rolling = static_cast<uint64_t>(tok[0]) * static_cast<uint64_t>(p.multipliers[0]);
  for (int64_t s = 1; s < p.n; ++s) {
    rolling ^= static_cast<uint64_t>(tok[s]) * static_cast<uint64_t>(p.multipliers[s]);
    for (int64_t h = 0; h < p.heads; ++h) {
      const int64_t c = (s - 1) * p.heads + h;
      p.out[t * cols + c] = static_cast<int64_t>(rolling % static_cast<uint64_t>(p.primes[c])) + p.offsets[c];
    }
  }
}

__global__ void engram_gate_kernel(EngramGateKernelParams p) {
  __shared__ float red[32];
  const int64_t t = blockIdx.x / p.hc, k = blockIdx.x % p.hc;
  float* x = p.streams + (t * p.hc + k) * p.d;
  const float* key = p.key + (t * p.hc + k) * p.d;
  const float* w = p.weight + k * p.d;
  const float* v = p.value + t * p.d;
  float dot = 0.0f, xx = 0.0f, kk = 0.0f;
  for (int64_t i = threadIdx.x; i < p.d; i += blockDim.x) {
    dot = fmaf(__fmul_rn(x[i], w[i]), key[i], dot);
    xx = fmaf(x[i], x[i], xx);
    kk = fmaf(key[i], key[i], kk);
  }
  dot = block_sum(dot, red);
  xx = block_sum(xx, red);
  kk = block_sum(kk, red);
  const float d = static_cast<float>(p.d);
  const float rstd = (1.0f / sqrtf(xx / d + p.eps)) * (1.0f / sqrtf(kk / d + p.eps));
  dot = dot * rstd * (1.0f / sqrtf(d));
  const float g = 1.0f / (1.0f + expf(-copysignf(sqrtf(fmaxf(fabsf(dot), 1e-6f)), dot)));
  // Every thread has finished reading x (the reductions above synchronise) before anyone writes it.
  for (int64_t i = threadIdx.x; i < p.d; i += blockDim.x) x[i] = fmaf(g, v[i], x[i]);
}

}  // namespace

void run_engram_hash(const EngramHashKernelParams& p, cudaStream_t stream) {
  if (p.count == 0) return;
  engram_hash_kernel<<<grid_1d(p.count, 128), 128, 0, stream>>>(p);
  DI_CUDA_CHECK_LAUNCH();
}

void run_engram_gate(const EngramGateKernelParams& p, cudaStream_t stream) {
  if (p.tokens * p.hc == 0) return;
  engram_gate_kernel<<<static_cast<unsigned>(p.tokens * p.hc), 256, 0, stream>>>(p);
  DI_CUDA_CHECK_LAUNCH();
}

}  // namespace deepinfer::cuda
