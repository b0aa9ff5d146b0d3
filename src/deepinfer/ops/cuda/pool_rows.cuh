// Paged pool rows as the kernels read them (pool_format.h): f32, bf16 widened exactly (--kv-cache-dtype bf16), or
// V4.1's quantized records decoded exactly (--kv-cache-dtype fp8, kv_record.cuh). A kernel over any of them computes
// what it computes over an f32 pool holding the same values.
#pragma once

#include <cstdint>

#include "deepinfer/ops/cuda/device_math.cuh"
#include "deepinfer/ops/cuda/kv_record.cuh"
#include "deepinfer/ops/cuda/pool_format.h"

namespace deepinfer::cuda {

// Row `row` of a pool of rows of `width` values.
__device__ __forceinline__ const void* pool_row(const void* pool, int64_t row, int64_t width, PoolFormat f) {
  return static_cast<const char*>(pool) + row * pool_row_bytes(f, width);
}
// Values 4·i .. 4·i + 3 of a row of `width` values as loaded, not yet widened or decoded: f32 bits, 4 bf16 in x / y, or
// a record's codes in x and scale byte in y (one 16-, 8-, 4- or 2-byte load, and a record's scale byte). A kernel that
// keeps loads in flight while it computes fetches first and decodes when it needs the values: a conversion right
// after each load would wait for that load there.
__device__ __forceinline__ uint4 pool_fetch4(const void* row, int64_t i, PoolFormat f, int64_t width) {
  if (f == PoolFormat::kF32) return __ldg(static_cast<const uint4*>(row) + i);
  if (f == PoolFormat::kBf16) {
    const uint2 u = __ldg(static_cast<const uint2*>(row) + i);
    return make_uint4(u.x, u.y, 0u, 0u);
  }
  const RecordQuad q = record_fetch4(row, i, f, width);
  return make_uint4(q.codes, q.scale, 0u, 0u);
}
__device__ __forceinline__ float4 pool_decode4(uint4 raw, PoolFormat f) {
  if (f == PoolFormat::kF32)
    return make_float4(f32_of_bits(raw.x), f32_of_bits(raw.y), f32_of_bits(raw.z), f32_of_bits(raw.w));
  if (f == PoolFormat::kBf16)
    return make_float4(f32_of_bits(raw.x << 16), f32_of_bits(raw.x & 0xFFFF0000u), f32_of_bits(raw.y << 16),
                       f32_of_bits(raw.y & 0xFFFF0000u));
  return record_decode4(RecordQuad{raw.x, raw.y}, f);
}
__device__ __forceinline__ float4 pool_load4(const void* row, int64_t i, PoolFormat f, int64_t width) {
  return pool_decode4(pool_fetch4(row, i, f, width), f);
}
__device__ __forceinline__ float pool_load1(const void* row, int64_t i, PoolFormat f, int64_t width) {
  if (f == PoolFormat::kF32) return __ldg(static_cast<const float*>(row) + i);
  if (f == PoolFormat::kBf16) return bf16_bits_to_f32(__ldg(static_cast<const uint16_t*>(row) + i));
  return record_load1(row, i, f, width);
}

}  // namespace deepinfer::cuda
