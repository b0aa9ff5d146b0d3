// The K walk and weight decoding of the tensor-core streaming GEMM (gemm_stream_mma_cuda.cu), shared with the
// batch-invariant tile kernel (gemm_invariant_mma_cuda.cu), which must issue the identical mma.sync sequence per
// output: the same 16-byte chunks of codes per lane, the same placement of the codes into bf16 fragment pairs
// (k order inside an mma), the same exact scale multiply.
//
// K is walked in steps of 4 chunks of 16 code bytes (16 e4m3 or 32 e2m1 values each); lane t of a quad owns chunk
// 4·step + t, and an mma covers kMmas<F>-th of every chunk of the step: its logical k slots 2t, 2t + 1 hold pair P
// of chunk t, slots 2t + 8, 2t + 9 pair Q (pair_k / kPairGap give their positions inside the chunk).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "deepinfer/ops/cuda/gemm_decode.cuh"
#include "deepinfer/ops/cuda/kernels.h"

namespace deepinfer::cuda {
namespace stream_decode {

template <QuantFormat F>
constexpr int kChunkK = F == QuantFormat::kMXFP4 ? 32 : 16;  // k values per 16-byte chunk
template <QuantFormat F>
constexpr int kMmas = kChunkK<F> / 4;  // mmas per chunk: 4 k of weight row g per lane and mma

// Codes i and i + 4 of an e2m1 word (code c in bits 4c..4c+3) as bf16x2, each 2^-126 times its value: e1 e0 m go to
// bf16 bits 6..8 (exponent 0..3 with bias 127, the mantissa's top bit), the sign to bit 15.
__device__ __forceinline__ uint32_t fp4_pair(uint32_t x, int i) {
  const uint32_t mag = (i < 2 ? x << (6 - 4 * i) : x >> (4 * i - 6)) & 0x01C001C0u;
  return mag | ((x << (12 - 4 * i)) & 0x80008000u);
}
// Bytes h and h + 2 of an e4m3 word as bf16x2, each 2^-120 times its value: e3..e0 m2..m0 go to bits 4..10.
__device__ __forceinline__ uint32_t fp8_pair(uint32_t x, int h) {
  const uint32_t y = h == 0 ? x << 4 : x >> 4;
  return (y & 0x07F007F0u) | ((h == 0 ? x << 8 : x) & 0x80008000u);
}
__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
  __nv_bfloat162 r =
      __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&a), *reinterpret_cast<const __nv_bfloat162*>(&b));
  return *reinterpret_cast<const uint32_t*>(&r);
}
__device__ __forceinline__ uint32_t bf16x2_splat_pow2(int e) {  // 2^e in both halves, -126 <= e <= 127
  const uint32_t h = static_cast<uint32_t>(e + 127) << 7;
  return h | (h << 16);
}
// The placed codes times the UE8M0 scale 2^(e - 127): one multiply by 2^(e - 127 + bias) while that fits bf16's
// normal range (e <= 128 for e2m1, 134 for e4m3: any realistic weight scale), else two (exact either way).
template <int kBias>
struct ScaleMul {
  uint32_t m = 0;
  bool two = false;
  __device__ __forceinline__ void set(uint32_t e) {
    two = static_cast<int>(e) - 127 + kBias > 127;
    m = bf16x2_splat_pow2(two ? static_cast<int>(e) - 127 : static_cast<int>(e) - 127 + kBias);
  }
  // kMaybeTwo = false: the caller knows `two` is false (the streaming kernel votes per step: the predicated second
  // multiply still took an issue slot per pair, ~1 in 6 of the decode's instructions); the same bits either way.
  template <bool kMaybeTwo = true>
  __device__ __forceinline__ uint32_t apply(uint32_t w) const {
    if (kMaybeTwo && two) w = bf16x2_mul(w, bf16x2_splat_pow2(kBias));
    return bf16x2_mul(w, m);
  }
};
template <QuantFormat F>
using FormatScale = ScaleMul<F == QuantFormat::kMXFP4 ? 126 : 120>;

// Physical k offsets (within a chunk) of mma `mi`'s two fragment pairs: pair P = (ka, ka + d), Q = (ka + 1, ka + 1 +
// d).
template <QuantFormat F>
__device__ __forceinline__ int pair_k(int mi) {
  return F == QuantFormat::kMXFP4 ? 8 * (mi >> 1) + 2 * (mi & 1) : 4 * mi;
}
template <QuantFormat F>
constexpr int kPairGap = F == QuantFormat::kMXFP4 ? 4 : 2;

// Offset of chunk c's scale byte (16 bytes of codes lie inside one scale block: blocks are >= 16 wide) from its
// weight row's first scale byte.
template <QuantFormat F>
__device__ __forceinline__ int scale_offset(int c, int lbk) {
  if constexpr (F == QuantFormat::kMXFP4) return c;
  if constexpr (F == QuantFormat::kFP8Row32) return c >> 1;
  return (c * 16) >> lbk;
}
// Weight row n's first scale byte.
template <QuantFormat F>
__device__ __forceinline__ const uint8_t* scale_row(const GemmKernelParams& p, const uint8_t* s, int64_t n, int lbn) {
  if constexpr (F == QuantFormat::kMXFP4) return s + n * (p.k / 32);
  if constexpr (F == QuantFormat::kFP8Row32) return s + n * p.scale_cols;
  return s + (n >> lbn) * p.scale_cols;
}

// A pair of exact bf16 weight values (codes placed and multiplied by 2^bias) times an f32 scale, rounded to bf16: the
// bits of dequantize_bf16 (bf16(f32(code) · s)) for the kernels that take f32 block scales.
__device__ __forceinline__ uint32_t bf16x2_scaled(uint32_t w, float s) {
  return pack_bf16x2(__uint_as_float(w << 16) * s, __uint_as_float(w & 0xFFFF0000u) * s);
}

// Mma mi's weight fragment pairs P / Q of one 16-byte chunk q with its scale applied (exact bf16).
template <QuantFormat F, bool kMaybeTwo = true>
__device__ __forceinline__ void weight_pairs(const uint4& q, const FormatScale<F>& sc, int mi, uint32_t& wp,
                                             uint32_t& wq) {
  const uint32_t w[4] = {q.x, q.y, q.z, q.w};
  if constexpr (F == QuantFormat::kMXFP4) {
    const int j = mi >> 1, i = 2 * (mi & 1);
    wp = sc.template apply<kMaybeTwo>(fp4_pair(w[j], i));
    wq = sc.template apply<kMaybeTwo>(fp4_pair(w[j], i + 1));
  } else {
    wp = sc.template apply<kMaybeTwo>(fp8_pair(w[mi], 0));
    wq = sc.template apply<kMaybeTwo>(fp8_pair(w[mi], 1));
  }
}

// Chunk c (kChunkK<F> k values) of activation row `row` into registers, zeros for row < 0 or c past the chunks. `row`
// by reference (the callers' shared-memory slot, read where they read it): a by-value copy changed ptxas's unrolling of
// the streaming kernel's one-row staging loop (SASS, CUDA 13.0); by reference both kernels' SASS is unchanged.
// This one: from the caller's bf16 copy (16-byte loads, 2 values a word) ...
template <QuantFormat F>
__device__ __forceinline__ void load_chunk(const GemmKernelParams& p, const int64_t& row, int c, int chunks,
                                           uint32_t (&h)[kChunkK<F> / 2]) {
  constexpr int kC = kChunkK<F>;
  if (row >= 0 && c < chunks) {
    const uint4* x =
        reinterpret_cast<const uint4*>(static_cast<const __nv_bfloat16*>(p.a_bf16) + row * p.lda + int64_t{c} * kC);
#pragma unroll
    for (int i = 0; i < kC / 8; ++i) {
      const uint4 u = __ldg(x + i);
      h[4 * i] = u.x;
      h[4 * i + 1] = u.y;
      h[4 * i + 2] = u.z;
      h[4 * i + 3] = u.w;
    }
  } else {
#pragma unroll
    for (int i = 0; i < kC / 2; ++i) h[i] = 0u;
  }
}
// ... or from f32 rows (16-byte loads when `vec`: rows 16-byte aligned).
template <QuantFormat F>
__device__ __forceinline__ void load_chunk(const GemmKernelParams& p, const int64_t& row, int c, int chunks, bool vec,
                                           float (&v)[kChunkK<F>]) {
  constexpr int kC = kChunkK<F>;
  if (row >= 0 && c < chunks) {
    const float* x = p.a + row * p.lda + int64_t{c} * kC;
    if (vec) {
#pragma unroll
      for (int i = 0; i < kC / 4; ++i) {
        const float4 f = __ldg(reinterpret_cast<const float4*>(x) + i);
        v[4 * i] = f.x;
        v[4 * i + 1] = f.y;
        v[4 * i + 2] = f.z;
        v[4 * i + 3] = f.w;
      }
    } else {
#pragma unroll
      for (int i = 0; i < kC; ++i) v[i] = __ldg(x + i);
    }
  } else {
#pragma unroll
    for (int i = 0; i < kC; ++i) v[i] = 0.0f;
  }
}

// A chunk's activations placed as the fragment pairs of its kMmas mmas (dst[mi · stride]: pair P, pair Q), rounded
// to bf16 (RNE) from f32 values ...
template <QuantFormat F>
__device__ __forceinline__ void place_pairs(const float (&v)[kChunkK<F>], uint2* dst, int stride) {
#pragma unroll
  for (int mi = 0; mi < kMmas<F>; ++mi) {
    const int k0 = pair_k<F>(mi), gap = kPairGap<F>;
    dst[mi * stride] = make_uint2(pack_bf16x2(v[k0], v[k0 + gap]), pack_bf16x2(v[k0 + 1], v[k0 + 1 + gap]));
  }
}
// ... or from bf16 already (word i: k 2i low, 2i + 1 high; k0 and the gap are even, so P is the low halves of words
// k0 / 2 and (k0 + gap) / 2, Q their high halves): the same bits when the bf16 values are the RNE roundings.
template <QuantFormat F>
__device__ __forceinline__ void place_pairs(const uint32_t (&h)[kChunkK<F> / 2], uint2* dst, int stride) {
#pragma unroll
  for (int mi = 0; mi < kMmas<F>; ++mi) {
    const int k0 = pair_k<F>(mi), gap = kPairGap<F>;
    const uint32_t lo = h[k0 / 2], hi = h[(k0 + gap) / 2];
    dst[mi * stride] = make_uint2(__byte_perm(lo, hi, 0x5410), __byte_perm(lo, hi, 0x7632));
  }
}

// A weight chunk read once per block: no L1 allocation (the batch-invariant tile kernel's loads).
__device__ __forceinline__ uint4 ld_once(const uint4* p) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
}
// A weight chunk read once: no L1 allocation, a 256-byte L2 prefetch (the streaming and rows kernels' code loads).
__device__ __forceinline__ uint4 ld_stream(const uint4* p) {  // read once: no L1 allocation
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
}

// kRows weight rows a lane streams (1, or 2: rows g and g + 8 of a 16-row tile): one step's 16 code bytes and scale
// byte (f32 block scales: the scale's bits) of each.
template <int kRows>
struct StepData {
  uint4 q[kRows];
  uint32_t e[kRows];
};

// A lane's weight rows n0 + g + 8h (h < kRows) and their scale rows: the K walk's loads of the streaming, invariant
// and rows kernels. Rows past N read row 0 (in bounds) and contribute nothing: their outputs are never written.
// kF32S: FP8 blocks with f32 scales (the rows kernel under GemmChoices::f32_scale_mma).
template <QuantFormat F, int kRows, bool kL2Prefetch = true, bool kF32S = false>
struct WeightRows {
  const uint4* w[kRows];
  const uint8_t* s[kRows];
  __device__ __forceinline__ void set(const GemmKernelParams& p, const uint8_t* b, const uint8_t* sc, int64_t n0, int g,
                                      int t, int chunks, int lbn) {
#pragma unroll
    for (int h = 0; h < kRows; ++h) {
      const int64_t n = n0 + g + 8 * h;
      w[h] = reinterpret_cast<const uint4*>(b + (n < p.n ? n : 0) * chunks * 16) + t;
      if constexpr (kF32S)
        s[h] = sc + ((n < p.n ? n : 0) >> lbn) * p.scale_cols * int64_t{4};
      else
        s[h] = scale_row<F>(p, sc, n < p.n ? n : 0, lbn);
    }
  }
  // Step st's chunk 4·st + t of each row; steps from `end` on and chunks past K are zero codes with scale byte 127
  // (decoded to +0; f32 scales: 0).
  __device__ __forceinline__ void load(int st, int end, int chunks, int t, int lbk, StepData<kRows>& d) const {
    const int c = 4 * st + t;
    const bool ok = st < end && c < chunks;
#pragma unroll
    for (int h = 0; h < kRows; ++h) {
      d.q[h] = ok ? (kL2Prefetch ? ld_stream(w[h] + 4 * st) : ld_once(w[h] + 4 * st)) : make_uint4(0, 0, 0, 0);
      if constexpr (kF32S)
        d.e[h] = ok ? __ldg(reinterpret_cast<const uint32_t*>(s[h]) + scale_offset<F>(c, lbk)) : 0u;
      else
        d.e[h] = ok ? s[h][scale_offset<F>(c, lbk)] : 127u;
    }
  }
};

// log2 of a power of two, -1 for anything else (block shapes become shifts).
inline int log2_exact(int v) { return (v > 0 && (v & (v - 1)) == 0) ? __builtin_ctz(static_cast<unsigned>(v)) : -1; }

// Whether this decode takes a weight's layout, whatever its scales' type (host side, the kernels' launch checks):
// MXFP4 with K % 32 == 0, FP8 per-32 rows or FP8 blocks of power-of-two shapes (>= 16 along K) with K % 16 == 0.
inline bool decodes_layout(QuantFormat format, int block_n, int block_k, int64_t k) {
  if (k <= 0) return false;
  switch (format) {
    case QuantFormat::kMXFP4:
      return k % 32 == 0;
    case QuantFormat::kFP8Row32:
      return k % 16 == 0;
    case QuantFormat::kFP8Block:
      return k % 16 == 0 && log2_exact(block_n) >= 0 && log2_exact(block_k) >= 4;
    default:
      return false;
  }
}
// ... and with UE8M0 scales, which the decode applies exactly (f32 block scales take their own forms: the kernels'
// kF32S).
inline bool decodes_format(QuantFormat format, bool scale_e8m0, int block_n, int block_k, int64_t k) {
  return scale_e8m0 && decodes_layout(format, block_n, block_k, k);
}

}  // namespace stream_decode
}  // namespace deepinfer::cuda
