// Device pieces shared by the tensor-core indexer's kernels (indexer_mma_cuda.cu, indexer_decode_ring_cuda.cu): the
// hi / lo bf16 split of fp32 operands, and the decode form's per-warp S tile and head sums. Both kernels' decode
// paths go through the same functions so that they compute every score with the same operations in the same order
// (their tests compare them for equality).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <cstring>

#include "deepinfer/ops/cuda/gemm_decode.cuh"

namespace deepinfer::cuda::indexer_mma {

constexpr int kTile = 64;  // keys a tile
constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;

__device__ __forceinline__ uint32_t pack_split(float a, float b, uint32_t& lo) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  const float2 hf = __bfloat1622float2(h);
  const __nv_bfloat162 l = __floats2bfloat162_rn(a - hf.x, b - hf.y);
  uint32_t hi;
  std::memcpy(&hi, &h, 4);
  std::memcpy(&lo, &l, 4);
  return hi;
}

// Stores v split into hi / lo bf16 at hi[0..3] / lo[0..3]; true when a lo part is nonzero (±0 count as zero:
// a product with ±0 adds exactly nothing).
__device__ __forceinline__ bool store_split4(const float4 v, __nv_bfloat16* hi, __nv_bfloat16* lo) {
  uint2 h, l;
  h.x = pack_split(v.x, v.y, l.x);
  h.y = pack_split(v.z, v.w, l.y);
  *reinterpret_cast<uint2*>(hi) = h;
  *reinterpret_cast<uint2*>(lo) = l;
  return ((l.x | l.y) & 0x7fff7fffu) != 0;
}

// The decode form: a pass is one token, and every warp works on its key tile — warp w takes m-tile w % kMt of the
// token's heads against key slice w / kMt of the tile (32 keys at 64 heads, 16 at 32). The slices' head sums meet in
// shared memory ([kMt][kTile] a tile) and are added in m-tile order once the tile's barrier has passed.
template <int kMt>
struct DecShape {
  static constexpr int kParts = kWarps / kMt;
  static constexpr int kNt = kTile / 8 / kParts;
  static_assert(kNt % 2 == 0, "n-tiles in ldmatrix pairs");
};

// The decode form's S tile: the warp's 16 heads (A fragments held in registers for the pass) x its kNt·8 keys (rows
// kLd bf16 apart). kQLo / kKLo: the lo parts of the queries / keys may be nonzero, and their cross terms run (lo·lo
// never does), in the order hi·lo, lo·hi, hi·hi; a key lo part that is zero adds exact zeros, so kKLo = false gives
// the kKLo = true sums whenever the keys' lo parts are zero.
template <int kDim, int kMt, int kLd, bool kQLo, bool kKLo>
__device__ __forceinline__ void warp_scores_dec(const uint32_t (&ah)[kDim / 16][4], const uint32_t (&al)[kDim / 16][4],
                                                const __nv_bfloat16* kh, const __nv_bfloat16* kl, int lane,
                                                float (&acc)[DecShape<kMt>::kNt][4]) {
  constexpr int kNt = DecShape<kMt>::kNt;
  const int b_row = (lane & 7) + ((lane >> 4) << 3), b_col = ((lane >> 3) & 1) * 8;
#pragma unroll
  for (int nt = 0; nt < kNt; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
#pragma unroll
  for (int s = 0; s < kDim / 16; ++s) {
    uint32_t bh[kNt / 2][4], bl[kNt / 2][4];
#pragma unroll
    for (int i = 0; i < kNt / 2; ++i) {
      ldmatrix_x4(bh[i], kh + (i * 16 + b_row) * kLd + s * 16 + b_col);
      if constexpr (kKLo) ldmatrix_x4(bl[i], kl + (i * 16 + b_row) * kLd + s * 16 + b_col);
    }
#pragma unroll
    for (int nt = 0; nt < kNt; ++nt) {
      const uint32_t b0 = bh[nt >> 1][(nt & 1) * 2], b1 = bh[nt >> 1][(nt & 1) * 2 + 1];
      if constexpr (kKLo) mma_bf16(acc[nt], ah[s], bl[nt >> 1][(nt & 1) * 2], bl[nt >> 1][(nt & 1) * 2 + 1]);
      if constexpr (kQLo) mma_bf16(acc[nt], al[s], b0, b1);
      mma_bf16(acc[nt], ah[s], b0, b1);
    }
  }
}

// The warp's relu-weighted sums over its 16 heads (lane (g, tq): heads g and g + 8, weights w0 / w1) for keys
// 2·tq, 2·tq + 1 of n-tile g, valid in lanes g < kNt: the heads' terms in registers, then over the 8 lanes g.
template <int kMt>
__device__ __forceinline__ void dec_head_sums(const float (&acc)[DecShape<kMt>::kNt][4], float w0, float w1,
                                              float score_scale, int g, float& v0, float& v1) {
  v0 = v1 = 0.0f;
#pragma unroll
  for (int nt = 0; nt < DecShape<kMt>::kNt; ++nt) {
    float s0 = fmaf(fmaxf(acc[nt][0], 0.0f) * score_scale, w0, 0.0f);
    float s1 = fmaf(fmaxf(acc[nt][1], 0.0f) * score_scale, w0, 0.0f);
    s0 = fmaf(fmaxf(acc[nt][2], 0.0f) * score_scale, w1, s0);
    s1 = fmaf(fmaxf(acc[nt][3], 0.0f) * score_scale, w1, s1);
#pragma unroll
    for (int o = 4; o < 32; o <<= 1) {
      s0 += __shfl_xor_sync(0xffffffffu, s0, o);
      s1 += __shfl_xor_sync(0xffffffffu, s1, o);
    }
    if (g == nt) {
      v0 = s0;
      v1 = s1;
    }
  }
}

// Lanes g < kNt store their head sums v0 / v1 (keys 2·tq, 2·tq + 1 of n-tile g of the warp's slice, which starts at
// key `slice0` of the tile) as m-tile dmt's sums: red[dmt · kTile + key]. A bad page's key (bad[key]) is NaN, through
// m-tile 0's sum, which carries it into the total.
template <int kMt>
__device__ __forceinline__ void dec_store_sums(float* red, const uint8_t* bad, int dmt, int slice0, int lane, float v0,
                                               float v1) {
  const int g = lane >> 2;
  if (g >= DecShape<kMt>::kNt) return;
  const int k = slice0 + g * 8 + 2 * (lane & 3);
  float* r = red + dmt * kTile + k;
  r[0] = dmt == 0 && bad[k] ? NAN : v0;
  r[1] = dmt == 0 && bad[k + 1] ? NAN : v1;
}

// A tile's score of key k (< kTile) from its m-tiles' sums red[mt · kTile + k], added in m-tile order.
template <int kMt>
__device__ __forceinline__ float dec_key_score(const float* red, int k) {
  float v = red[k];
#pragma unroll
  for (int mt = 1; mt < kMt; ++mt) v += red[mt * kTile + k];
  return v;
}

}  // namespace deepinfer::cuda::indexer_mma
