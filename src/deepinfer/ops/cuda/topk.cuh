// Block-wide top-k selection mask by radix select: 8-bit histogram passes (most significant byte first) find
// the key of the k-th largest value, then everything above it is selected plus the first (in index order) of
// the values equal to it, so ties go to the lower index exactly like the CPU op's partial_sort. −inf picks are
// dropped afterwards (they are not selections). O(n) per row, one block per row, no sort.
//
// Latency (decode runs one row per sequence, so a row is one block on one SM and nothing hides its latency):
// - each thread keeps its keys in registers when the row fits (kItems per thread), so the row is read from
//   memory once instead of once per pass;
// - the histogram adds are aggregated per warp (__match_any_sync): the first pass puts most keys of a row in a
//   few bins (the sign and top exponent bits), where one shared atomic per key serialised;
// - the digit search is a block scan over the 256 bins instead of one thread walking them;
// - the passes stop as soon as the chosen bin holds exactly the keys still to take (usual for distinct
//   scores after two or three passes), and the index-ordered tie ranking runs only when a tie straddles the
//   k-th place.
#pragma once

#include "deepinfer/ops/cuda/device_math.cuh"

namespace deepinfer::cuda {

// Monotone map of a float to an unsigned key: a > b  <=>  key(a) > key(b), a == b <=> key(a) == key(b)
// (NaN aside). −0 is keyed as +0: the CPU's comparisons see them equal, so they tie and go by index.
__device__ __forceinline__ uint32_t float_key(float f) {
  uint32_t b = __float_as_uint(f);
  if (b == 0x80000000u) b = 0u;
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
constexpr uint32_t kNegInfKey = 0x007FFFFFu;  // float_key(−inf)

struct TopkSmem {
  uint32_t hist[2][256];  // double-buffered: the next pass's bins are cleared while this pass scans
  uint32_t warp_sums[32];
  uint32_t select_digit, remaining, digit_count;
};

namespace topk_detail {

// Calls fn(r, i) for the thread's elements i = r·blockDim + threadIdx (r = the register slot when cached).
// Warp-uniform trip count: every lane runs every iteration (lanes past n get i >= n).
template <bool kCached, int kItems, typename Fn>
__device__ __forceinline__ void for_items(int64_t n, Fn&& fn) {
  if constexpr (kCached) {
#pragma unroll
    for (int r = 0; r < kItems; ++r) {
      const int64_t base = static_cast<int64_t>(r) * blockDim.x;
      if (base >= n) break;  // block-uniform: short rows skip the empty slots (and their barriers)
      fn(r, base + threadIdx.x);
    }
  } else {
    for (int64_t base = 0; base < n; base += blockDim.x) fn(0, base + threadIdx.x);
  }
}

// One shared atomic per distinct bin in the warp (bins < 256; inactive lanes pass active = false). After the
// first pass most keys fall outside the chosen prefix: a warp with no key in play skips the match.
__device__ __forceinline__ void warp_hist_add(uint32_t* hist, uint32_t bin, bool active) {
  if (!__any_sync(0xffffffffu, active)) return;
  const uint32_t peers = __match_any_sync(0xffffffffu, active ? bin : 0x100u);
  const int lane = threadIdx.x & 31;
  if (active && __ffs(peers) - 1 == lane) atomicAdd(&hist[bin], static_cast<uint32_t>(__popc(peers)));
}

template <bool kCached, int kItems, typename ValueFn>
__device__ __forceinline__ void block_topk_mask_impl(ValueFn& value, int64_t n, uint32_t k_eff, uint8_t* out,
                                                     TopkSmem& sm) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  uint32_t cache[kCached ? kItems : 1] = {};
  if constexpr (kCached) {
    for_items<true, kItems>(n, [&](int r, int64_t i) { cache[r] = i < n ? float_key(value(i)) : 0u; });
  }
  auto key_at = [&](int r, int64_t i) -> uint32_t {
    if constexpr (kCached)
      return cache[r];
    else
      return i < n ? float_key(value(i)) : 0u;
  };
  for (int i = threadIdx.x; i < 256; i += blockDim.x) sm.hist[0][i] = 0;
  __syncthreads();
  uint32_t prefix = 0, prefix_mask = 0, rem = k_eff, count = 0;
  int cur = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    uint32_t* hist = sm.hist[cur];
    for_items<kCached, kItems>(n, [&](int r, int64_t i) {
      const uint32_t key = key_at(r, i);
      warp_hist_add(hist, (key >> shift) & 255u, i < n && (key & prefix_mask) == prefix);
    });
    for (int i = threadIdx.x; i < 256; i += blockDim.x) sm.hist[cur ^ 1][i] = 0;
    __syncthreads();
    // Scan the bins from the top digit down: thread j takes digit 255 − j; the one whose range holds the
    // rem-th key is the digit of the k-th largest.
    uint32_t c = 0, incl = 0;
    if (threadIdx.x < 256) {
      c = hist[255 - threadIdx.x];
      incl = c;
      for (int o = 1; o < 32; o <<= 1) {
        const uint32_t up = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += up;
      }
      if (lane == 31) sm.warp_sums[warp] = incl;
    }
    __syncthreads();
    if (threadIdx.x < 256) {
      uint32_t before = incl - c;
      for (int w = 0; w < warp; ++w) before += sm.warp_sums[w];
      if (before < rem && before + c >= rem) {
        sm.select_digit = 255u - threadIdx.x;
        sm.remaining = rem - before;
        sm.digit_count = c;
      }
    }
    __syncthreads();
    prefix |= sm.select_digit << shift;
    prefix_mask |= 255u << shift;
    rem = sm.remaining;
    count = sm.digit_count;
    cur ^= 1;
    if (count == rem) break;  // every key under this prefix is taken: no finer digit changes the answer
  }
  if (count == rem) {
    for_items<kCached, kItems>(n, [&](int r, int64_t i) {
      if (i < n) {
        const uint32_t key = key_at(r, i);
        out[i] = ((key & prefix_mask) >= prefix && key != kNegInfKey) ? 1 : 0;
      }
    });
    return;
  }
  // A tie straddles the k-th place (prefix is the full threshold key): the first `rem` equal keys in index
  // order are taken, ranked chunk by chunk with warp ballots.
  const uint32_t threshold = prefix;
  uint32_t taken_before = 0;
  for_items<kCached, kItems>(n, [&](int r, int64_t i) {
    const uint32_t key = key_at(r, i);
    const bool eq = i < n && key == threshold;
    const uint32_t ballot = __ballot_sync(0xffffffffu, eq);
    __syncthreads();  // warp_sums of the previous chunk have been read
    if (lane == 0) sm.warp_sums[warp] = __popc(ballot);
    __syncthreads();
    uint32_t before = taken_before + __popc(ballot & ((1u << lane) - 1u));
    uint32_t chunk_total = 0;
    for (int w = 0; w < warps; ++w) {
      const uint32_t wc = sm.warp_sums[w];
      if (w < warp) before += wc;
      chunk_total += wc;
    }
    if (i < n) out[i] = ((key > threshold || (eq && before < rem)) && key != kNegInfKey) ? 1 : 0;
    taken_before += chunk_total;
  });
}

}  // namespace topk_detail

// value(i) gives the score of element i (−inf = not selectable); out[i] <- 1 if selected else 0.
// All threads of the block must call it; blockDim.x is a multiple of 32 and at least 256. Rows of up to
// kItems · blockDim elements are held in registers.
template <int kItems, typename ValueFn>
__device__ void block_topk_mask(ValueFn value, int64_t n, int64_t k, uint8_t* out, TopkSmem& sm) {
  const int64_t k_eff = k < n ? k : n;
  if (k_eff <= 0) {
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) out[i] = 0;
    return;
  }
  if (n <= static_cast<int64_t>(kItems) * blockDim.x)
    topk_detail::block_topk_mask_impl<true, kItems>(value, n, static_cast<uint32_t>(k_eff), out, sm);
  else
    topk_detail::block_topk_mask_impl<false, kItems>(value, n, static_cast<uint32_t>(k_eff), out, sm);
}

}  // namespace deepinfer::cuda
