// Device helpers shared by the kernels: block/warp reductions and the number-format conversions of
// core/dtype.h, written to give the same bits as the host versions (RNE, the same saturation rules).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "deepinfer/ops/cuda/cuda_check.h"

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

// ---- formats (see core/dtype.h) ----
__device__ __forceinline__ float e8m0_to_f32_dev(uint8_t e) {
  if (e == 0xFF) return __uint_as_float(0x7FC00000u);
  if (e == 0) return __uint_as_float(0x00400000u);
  return __uint_as_float(static_cast<uint32_t>(e) << 23);
}

// f32_to_e8m0_ceil: the smallest UE8M0 power of two >= f (2^-127 below the range, 2^127 above it; NaN 0xFF).
__device__ __forceinline__ uint8_t f32_to_e8m0_ceil_dev(float f) {
  if (isnan(f)) return 0xFF;
  if (!(f > 0.0f)) return 0;
  const uint32_t b = __float_as_uint(f);
  const int e = static_cast<int>(b >> 23);
  const uint32_t m = b & 0x7FFFFFu;
  if (e == 0) return 0;
  const int out = e + (m != 0 ? 1 : 0);
  return static_cast<uint8_t>(out > 254 ? 254 : out);
}
// Smallest power of two >= f, as f32_to_e8m0_ceil followed by e8m0_to_f32.
__device__ __forceinline__ float pow2_ceil_dev(float f) { return e8m0_to_f32_dev(f32_to_e8m0_ceil_dev(f)); }

__device__ __forceinline__ float e4m3_to_f32_dev(uint8_t v) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(v), __NV_E4M3)));
}
// RNE; callers clamp to ±448 first (where the host rounds an overflow to NaN, this saturates).
__device__ __forceinline__ uint8_t f32_to_e4m3_dev(float f) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E4M3));
}

__device__ __forceinline__ float e2m1_to_f32_dev(uint8_t nibble) {
  // Arithmetic decode (a table indexed at run time would live in local memory).
  const uint32_t e = (nibble >> 1) & 3u, m = nibble & 1u;
  const float v =
      e == 0 ? 0.5f * static_cast<float>(m) : (1.0f + 0.5f * static_cast<float>(m)) * static_cast<float>(1u << (e - 1));
  return (nibble & 8) ? -v : v;
}
// RNE onto {0, .5, 1, 1.5, 2, 3, 4, 6}, saturating at 6; at a midpoint the even code wins.
__device__ __forceinline__ uint8_t f32_to_e2m1_dev(float f) {
  if (isnan(f)) return 0;
  const uint8_t sign = signbit(f) ? 0x8 : 0x0;
  const float a = fminf(fabsf(f), 6.0f);
  uint8_t c;
  if (a <= 0.25f)
    c = 0;
  else if (a < 0.75f)
    c = 1;
  else if (a <= 1.25f)
    c = 2;
  else if (a < 1.75f)
    c = 3;
  else if (a <= 2.5f)
    c = 4;
  else if (a < 3.5f)
    c = 5;
  else if (a <= 5.0f)
    c = 6;
  else
    c = 7;
  return sign | c;
}

__device__ __forceinline__ float bf16_bits_to_f32(uint16_t h) {
  return __uint_as_float(static_cast<uint32_t>(h) << 16);
}

// f32 -> bf16 bits rounded to nearest even, a NaN kept with its payload's top bits and made quiet: the host's
// f32_to_bf16 bit for bit (cvt.rn.bf16.f32 would give every NaN the canonical 0x7fff), so caches written on either
// backend hold the same bytes.
__device__ __forceinline__ uint16_t f32_to_bf16_bits(float f) {
  uint32_t b = __float_as_uint(f);
  if ((b & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((b >> 16) | 0x0040u);
  b += 0x7fffu + ((b >> 16) & 1u);
  return static_cast<uint16_t>(b >> 16);
}

}  // namespace deepinfer::cuda
