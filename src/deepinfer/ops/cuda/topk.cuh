// Block-wide top-k selection mask by radix select: four 8-bit histogram passes find the key of the k-th
// largest value, then everything above it is selected plus the first (in index order) of the values equal
// to it, so ties go to the lower index exactly like the CPU op's partial_sort. −inf picks are dropped
// afterwards (they are not selections). O(n) per row, one block per row, no sort.
#pragma once

#include "deepinfer/ops/cuda/device_math.cuh"

namespace deepinfer::cuda {

// Monotone map of a float to an unsigned key: a > b  <=>  key(a) > key(b) (NaN aside).
__device__ __forceinline__ uint32_t float_key(float f) {
  const uint32_t b = __float_as_uint(f);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

struct TopkSmem {
  uint32_t hist[256];
  uint32_t warp_counts[32];
  uint32_t select_digit, remaining;
};

// value(i) gives the score of element i (−inf = not selectable); out[i] <- 1 if selected else 0.
// All threads of the block must call it; blockDim.x is a multiple of 32.
template <typename ValueFn>
__device__ void block_topk_mask(ValueFn value, int64_t n, int64_t k, uint8_t* out, TopkSmem& sm) {
  const int64_t k_eff = k < n ? k : n;
  if (k_eff <= 0) {
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) out[i] = 0;
    return;
  }
  uint32_t prefix = 0, prefix_mask = 0;
  if (threadIdx.x == 0) sm.remaining = static_cast<uint32_t>(k_eff);
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += blockDim.x) sm.hist[i] = 0;
    __syncthreads();
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const uint32_t key = float_key(value(i));
      if ((key & prefix_mask) == prefix) atomicAdd(&sm.hist[(key >> shift) & 255u], 1u);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      uint32_t cum = 0, rem = sm.remaining;
      for (int d = 255; d >= 0; --d) {
        if (cum + sm.hist[d] >= rem) {
          sm.select_digit = static_cast<uint32_t>(d);
          sm.remaining = rem - cum;
          break;
        }
        cum += sm.hist[d];
      }
    }
    __syncthreads();
    prefix |= sm.select_digit << shift;
    prefix_mask |= 255u << shift;
  }
  const uint32_t threshold = prefix, take_equal = sm.remaining;
  // Index-ordered rank among the values equal to the threshold, chunk by chunk.
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  uint32_t taken_before = 0;
  for (int64_t base = 0; base < n; base += blockDim.x) {
    const int64_t i = base + threadIdx.x;
    float v = -INFINITY;
    uint32_t key = 0;
    if (i < n) {
      v = value(i);
      key = float_key(v);
    }
    const bool eq = i < n && key == threshold;
    const uint32_t ballot = __ballot_sync(0xffffffffu, eq);
    __syncthreads();  // warp_counts of the previous chunk have been read
    if (lane == 0) sm.warp_counts[warp] = __popc(ballot);
    __syncthreads();
    uint32_t before = taken_before + __popc(ballot & ((1u << lane) - 1u));
    uint32_t chunk_total = 0;
    for (int w = 0; w < warps; ++w) {
      if (w < warp) before += sm.warp_counts[w];
      chunk_total += sm.warp_counts[w];
    }
    if (i < n) {
      const bool sel = (key > threshold || (eq && before < take_equal)) && v != -INFINITY;
      out[i] = sel ? 1 : 0;
    }
    taken_before += chunk_total;
  }
}

}  // namespace deepinfer::cuda
