// Device helpers shared by the kernels: block/warp reductions, and (format_math.cuh) the number-format conversions of
// core/dtype.h, written to give the same bits as the host versions (RNE, the same saturation rules).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "deepinfer/ops/cuda/cuda_check.h"
#include "deepinfer/ops/cuda/format_math.cuh"

namespace deepinfer::cuda {

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline unsigned grid_1d(int64_t n, int threads) {
  const int64_t blocks = ceil_div(n, threads);
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > (1ll << 31) - 1 ? (1ll << 31) - 1 : blocks));
}

// x = hi + lo + O(2^-16·|x|): hi = bf16(x), lo = bf16(x − hi). A non-finite hi (x inf / NaN, or within half a bf16
// step of FLT_MAX, which rounds to inf) has no finite residual (inf − inf is NaN): lo = 0 leaves hi's value alone.
__device__ __forceinline__ void split_bf16(float x, __nv_bfloat16& hi, __nv_bfloat16& lo) {
  hi = __float2bfloat16_rn(x);
  const float h = __bfloat162float(hi);
  lo = __float2bfloat16_rn(isfinite(h) ? x - h : 0.0f);
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, <= 1024); every thread gets the result. `smem` holds
// 32 floats. Contains __syncthreads: call from all threads.
__device__ __forceinline__ float block_sum(float v, float* smem) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // smem may still be read by a previous call
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  v = lane < warps ? smem[lane] : 0.0f;
  return warp_sum(v);
}

__device__ __forceinline__ float block_max(float v, float* smem) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  v = lane < warps ? smem[lane] : -INFINITY;
  return warp_max(v);
}

}  // namespace deepinfer::cuda
