// mHC on the GPU: site coefficients (norm + small projection + sigmoid gates + Sinkhorn), the V4 head's
// collapse weights, collapse and expand. The coefficient kernel runs one block per token: the projection is
// (2+hc)·hc dot products of length hc·D, one warp per row; the Sinkhorn iterations on the hc×hc matrix are
// a handful of flops and run on one thread in the CPU op's order.
#include "deepinfer/ops/cuda/device_math.cuh"
#include "deepinfer/ops/cuda/kernels.h"

namespace deepinfer::cuda {
namespace {

constexpr int kMaxHc = 8;
constexpr int kMaxMixRows = (2 + kMaxHc) * kMaxHc;

__device__ __forceinline__ float sigmoid_dev(float x) { return 1.0f / (1.0f + expf(-x)); }

__global__ void hc_mix_kernel(HcMixKernelParams p) {
  __shared__ float red[32];
  __shared__ float m[kMaxMixRows];
  __shared__ float c[kMaxHc * kMaxHc];
  const int64_t t = blockIdx.x, hc = p.hc, n = hc * p.d;
  const int64_t rows = p.head ? hc : (2 + hc) * hc;
  const float* f = p.streams + t * n;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) ss = fmaf(f[i], f[i], ss);
  ss = block_sum(ss, red);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(n) + p.norm_eps);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int64_t r = warp; r < rows; r += warps) {
    const float* w = p.fn + r * n;
    float acc = 0.0f;
    for (int64_t i = lane; i < n; i += 32) acc = fmaf(w[i], __fmul_rn(f[i], inv), acc);
    acc = warp_sum(acc);
    if (lane == 0) m[r] = acc;
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  float* pre = p.pre + t * hc;
  if (p.head) {
    for (int64_t k = 0; k < hc; ++k) pre[k] = sigmoid_dev(m[k] * p.scale[0] + p.base[k]) + p.hc_eps;
    return;
  }
  float* post = p.post + t * hc;
  for (int64_t k = 0; k < hc; ++k) {
    pre[k] = sigmoid_dev(m[k] * p.scale[0] + p.base[k]) + p.hc_eps;
    post[k] = 2.0f * sigmoid_dev(m[hc + k] * p.scale[1] + p.base[hc + k]);
  }
  // c[j*hc + k]: row softmax + eps, one column normalisation, then (row, column) pairs; denominators + eps.
  for (int64_t j = 0; j < hc; ++j) {
    float mx = -INFINITY;
    for (int64_t k = 0; k < hc; ++k) {
      c[j * hc + k] = m[2 * hc + j * hc + k] * p.scale[2] + p.base[2 * hc + j * hc + k];
      mx = fmaxf(mx, c[j * hc + k]);
    }
    float sum = 0.0f;
    for (int64_t k = 0; k < hc; ++k) sum += (c[j * hc + k] = expf(c[j * hc + k] - mx));
    for (int64_t k = 0; k < hc; ++k) c[j * hc + k] = c[j * hc + k] / sum + p.hc_eps;
  }
  for (int it = 0; it < p.sinkhorn_iters; ++it) {
    if (it > 0) {
      for (int64_t j = 0; j < hc; ++j) {
        float sum = 0.0f;
        for (int64_t k = 0; k < hc; ++k) sum += c[j * hc + k];
        for (int64_t k = 0; k < hc; ++k) c[j * hc + k] /= sum + p.hc_eps;
      }
    }
    for (int64_t k = 0; k < hc; ++k) {
      float sum = 0.0f;
      for (int64_t j = 0; j < hc; ++j) sum += c[j * hc + k];
      for (int64_t j = 0; j < hc; ++j) c[j * hc + k] /= sum + p.hc_eps;
    }
  }
  float* comb = p.comb + t * hc * hc;
  for (int64_t i = 0; i < hc * hc; ++i) comb[i] = c[i];
}

__global__ void hc_collapse_kernel(HcCollapseKernelParams p) {
  const int64_t total = p.tokens * p.d;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = idx / p.d, i = idx % p.d;
    const float* x = p.streams + t * p.hc * p.d + i;
    float acc = 0.0f;
    for (int64_t k = 0; k < p.hc; ++k) acc = __fadd_rn(acc, __fmul_rn(p.pre[t * p.hc + k], x[k * p.d]));
    p.out[idx] = acc;
  }
}

// One thread per (token, channel) owns that channel of every stream, so the in-place update needs no sync.
__global__ void hc_expand_kernel(HcExpandKernelParams p) {
  const int64_t total = p.tokens * p.d;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = idx / p.d, i = idx % p.d;
    float* x = p.streams + t * p.hc * p.d + i;
    const float* c = p.comb + t * p.hc * p.hc;
    const float y = p.x[idx];
    float old[kMaxHc];
#pragma unroll
    for (int j = 0; j < kMaxHc; ++j) old[j] = j < p.hc ? x[j * p.d] : 0.0f;
#pragma unroll
    for (int k = 0; k < kMaxHc; ++k) {
      if (k >= p.hc) break;
      float acc = 0.0f;
#pragma unroll
      for (int j = 0; j < kMaxHc; ++j)
        if (j < p.hc) acc = __fadd_rn(acc, __fmul_rn(c[j * p.hc + k], old[j]));
      x[k * p.d] = __fadd_rn(__fmul_rn(p.post[t * p.hc + k], y), acc);
    }
  }
}

}  // namespace

void run_hc_mix(const HcMixKernelParams& p, cudaStream_t stream) {
  DI_CHECK(p.hc >= 1 && p.hc <= kMaxHc) << "hc_mix: hc = " << p.hc << " (the CUDA kernel supports 1.." << kMaxHc << ")";
  if (p.tokens == 0) return;
  hc_mix_kernel<<<static_cast<unsigned>(p.tokens), 256, 0, stream>>>(p);
  DI_CUDA_CHECK_LAUNCH();
}

void run_hc_collapse(const HcCollapseKernelParams& p, cudaStream_t stream) {
  if (p.tokens * p.d == 0) return;
  hc_collapse_kernel<<<grid_1d(p.tokens * p.d, 256), 256, 0, stream>>>(p);
  DI_CUDA_CHECK_LAUNCH();
}

void run_hc_expand(const HcExpandKernelParams& p, cudaStream_t stream) {
  DI_CHECK(p.hc >= 1 && p.hc <= kMaxHc) << "hc_expand: hc = " << p.hc << " (the CUDA kernel supports 1.." << kMaxHc << ")";
  if (p.tokens * p.d == 0) return;
  hc_expand_kernel<<<grid_1d(p.tokens * p.d, 256), 256, 0, stream>>>(p);
  DI_CUDA_CHECK_LAUNCH();
}

}  // namespace deepinfer::cuda
