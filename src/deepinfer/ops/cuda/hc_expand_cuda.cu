// mHC collapse (x = Σ_k pre_k · X_k) and expand (X_k <- post_k · y + Σ_j comb[j][k] · X_j, in place) on the GPU:
// elementwise over tokens x channels, with the CPU op's operations in its order. The coefficients and the one-launch
// expand + mix of decode are in hc_cuda.cu.
#include <cstdint>

#include "deepinfer/ops/cuda/device_math.cuh"
#include "deepinfer/ops/cuda/hc_common.cuh"
#include "deepinfer/ops/cuda/kernels.h"

namespace deepinfer::cuda {
namespace {

using hc_common::expand_value;
using hc_common::kMaxHc;

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
      x[k * p.d] = expand_value(c, p.hc, old, p.post[t * p.hc + k], y, k);
    }
  }
}

// hc_expand_kernel with a float4 of 4 channels a thread (d % 4 == 0, 16-byte aligned streams and x): 5 loads of 16
// bytes in flight a thread instead of 5 of 4 (the scalar kernel ran at ~60% of the copy rate at V4-Flash's prefill
// shape, ncu); each element is computed with the scalar kernel's operations in its order.
// kHc > 0: hc known at compile time (V4's 4: 4 float4 of old values instead of kMaxHc, ~half the registers); 0: any
// hc <= kMaxHc.
template <int kHc>
__global__ void hc_expand_vec_kernel(HcExpandKernelParams p) {
  constexpr int kMax = kHc > 0 ? kHc : kMaxHc;
  const int64_t hc = kHc > 0 ? kHc : p.hc, d4 = p.d / 4, total = p.tokens * d4;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = idx / d4, i = (idx % d4) * 4;
    float* x = p.streams + t * hc * p.d + i;
    const float* c = p.comb + t * hc * hc;
    const float4 y = *reinterpret_cast<const float4*>(p.x + t * p.d + i);
    float4 old[kMax];
#pragma unroll
    for (int j = 0; j < kMax; ++j)
      old[j] = j < hc ? *reinterpret_cast<const float4*>(x + j * p.d) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int k = 0; k < kMax; ++k) {
      if (k >= hc) break;
      float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
      for (int j = 0; j < kMax; ++j)
        if (j < hc) {
          const float cj = c[j * hc + k];
          acc.x = __fadd_rn(acc.x, __fmul_rn(cj, old[j].x));
          acc.y = __fadd_rn(acc.y, __fmul_rn(cj, old[j].y));
          acc.z = __fadd_rn(acc.z, __fmul_rn(cj, old[j].z));
          acc.w = __fadd_rn(acc.w, __fmul_rn(cj, old[j].w));
        }
      const float pk = p.post[t * hc + k];
      float4 v;
      v.x = __fadd_rn(__fmul_rn(pk, y.x), acc.x);
      v.y = __fadd_rn(__fmul_rn(pk, y.y), acc.y);
      v.z = __fadd_rn(__fmul_rn(pk, y.z), acc.z);
      v.w = __fadd_rn(__fmul_rn(pk, y.w), acc.w);
      *reinterpret_cast<float4*>(x + k * p.d) = v;
    }
  }
}

}  // namespace

void run_hc_collapse(const HcCollapseKernelParams& p, cudaStream_t stream) {
  if (p.tokens * p.d == 0) return;
  hc_collapse_kernel<<<grid_1d(p.tokens * p.d, 256), 256, 0, stream>>>(p);
  DI_CUDA_CHECK_LAUNCH();
}

void run_hc_expand(const HcExpandKernelParams& p, cudaStream_t stream) {
  DI_CHECK(p.hc >= 1 && p.hc <= kMaxHc) << "hc_expand: hc = " << p.hc << " (the CUDA kernel supports 1.." << kMaxHc
                                        << ")";
  if (p.tokens * p.d == 0) return;
  const auto aligned16 = [](const void* q) { return reinterpret_cast<uintptr_t>(q) % 16 == 0; };
  if (p.d % 4 == 0 && aligned16(p.streams) && aligned16(p.x)) {  // 1.79x the scalar kernel at 8192 x 4096
    if (p.hc == 4)
      hc_expand_vec_kernel<4><<<grid_1d(p.tokens * p.d / 4, 256), 256, 0, stream>>>(p);
    else
      hc_expand_vec_kernel<0><<<grid_1d(p.tokens * p.d / 4, 256), 256, 0, stream>>>(p);
    DI_CUDA_CHECK_LAUNCH();
    return;
  }
  hc_expand_kernel<<<grid_1d(p.tokens * p.d, 256), 256, 0, stream>>>(p);
  DI_CUDA_CHECK_LAUNCH();
}

}  // namespace deepinfer::cuda
