// gemm_wgmma_cuda.cu's device side below the kernel: the tile and stage constants, the wgmma / barrier / proxy-fence
// wrappers, the producer's weight decode into the swizzled layout, and the grouped tiles' scan. Internal to the wgmma
// kernels: gemm_wgmma_cuda.cu (the layout, barrier protocol and decode are described at the top of that file), the
// flash MLA and the rows kernel's warpgroup form (register-A wgmma).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "deepinfer/ops/cuda/device_math.cuh"
#include "deepinfer/ops/cuda/gemm_decode.cuh"
#include "deepinfer/ops/cuda/gemm_mma.h"
#include "deepinfer/ops/cuda/gemm_wgmma.h"

namespace deepinfer::cuda::wgmma {

constexpr int kWgK = 64, kWgStages = 4, kWgThreads = 384;
// Split-K: at least this many k-steps a split (a block's pipeline fill is ~2 steps), at most this many splits.
constexpr int kWgSplitMinSteps = 4, kWgMaxSplits = 16;
constexpr int kRowBytes = kWgK * 2;           // one 128-byte swizzle row
constexpr int kStageBytes = 384 * kRowBytes;  // one stage: A and B tiles, 48 KiB for both shapes
constexpr int kBarFull = 1, kBarEmpty = 1 + kWgStages;
constexpr size_t kWgSmem = 1024 + kWgStages * kStageBytes;
static_assert(kWgThreads == 3 * 128, "one producer and two consumer warpgroups");
static_assert(kBarEmpty + kWgStages <= 16, "named barriers");

// The block tile: kTall = 256 token rows x 128 weight rows (each consumer warpgroup 128 rows as two m64 halves, two
// wgmma m64n128k16 a k16 slice), else 128 x 256 (each consumer 64 rows, one m64n256k16). Same accumulators (128 f32
// a thread), same stage size; the tall tile decodes half the weight rows a step and copies twice the A rows.
template <bool kTall>
struct WgTile {
  static constexpr int kM = kTall ? 4 * kGemmTileM : 2 * kGemmTileM, kN = kTall ? 128 : 256;
  static constexpr int kABytes = kM * kRowBytes, kBBytes = kN * kRowBytes;
  static constexpr int kHalves = kM / 128;  // m64 halves a consumer warpgroup
  static constexpr int kARowsT = kM / 16;   // A rows a producer thread copies a step (8 threads a row)
  static_assert(kABytes + kBBytes == kStageBytes && kM % kGemmTileM == 0, "tile shape");
};

template <QuantFormat F>
constexpr int kCodeWords = F == QuantFormat::kMXFP4 ? kWgK / 8 : kWgK / 4;  // 32-bit words of a row's step

// Shared-memory loads at a shared address (the staged codes and scales the producer reads back).
__device__ __forceinline__ uint32_t lds_u32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(addr) : "memory");
  return v;
}
__device__ __forceinline__ uint4 lds_u128(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(addr)
               : "memory");
  return v;
}

// Output columns col, col + 1 (col even) of a C row: one 8-byte store when vec2 (rows 8-byte aligned) and both are
// inside N, else each one that is.
__device__ __forceinline__ void store_pair(float* crow, int64_t col, int64_t n, float v0, float v1, bool vec2) {
  if (vec2 && col + 1 < n) {
    *reinterpret_cast<float2*>(crow + col) = make_float2(v0, v1);
  } else {
    if (col < n) crow[col] = v0;
    if (col + 1 < n) crow[col + 1] = v1;
  }
}

// Byte offset of 16-byte chunk c (K values 8c..8c+7) of row r in a tile: the 128B-swizzled layout (row r is 128
// contiguous bytes, chunk c at position c ^ (r % 8)). (A no-swizzle layout of 8 x 16-byte core matrices measured
// 1.1x slower on the H200 and was removed.)
__device__ __forceinline__ uint32_t swz(int r, int c) { return r * kRowBytes + ((c ^ (r & 7)) << 4); }
// Byte offset of the k16 slice kk (chunks 2kk, 2kk+1) from the tile's start, as the descriptor's start address.
__device__ __forceinline__ constexpr uint32_t k16_offset(int kk) { return 32 * kk; }

// Descriptor of a K-major operand starting at shared address addr (see the header comment): 128B swizzle (LBO
// unused: 1, SBO 1024, mode 1).
__device__ __forceinline__ uint64_t smem_desc(uint32_t addr) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>(1) << 16) |
         (static_cast<uint64_t>(1024 >> 4) << 32) | (static_cast<uint64_t>(1) << 62);
}

// Generic-proxy shared stores (and cp.async) made visible to the async proxy that wgmma reads through.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
// Keeps the compiler from moving accumulator reads / writes across a wgmma fence or wait.
template <int kN>
__device__ __forceinline__ void pin(float (&d)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// D(64 x 256, f32) += A(64 x 16, bf16, K-major smem) · B(256 x 16, bf16, K-major smem)ᵀ.
__device__ __forceinline__ void wgmma_m64n256k16(float (&d)[128], uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "
      "%128, %129, p, 1, 1, 0, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),
        "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),
        "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
        "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]),
        "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]),
        "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]),
        "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]),
        "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]),
        "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]),
        "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]),
        "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]),
        "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(desc_a), "l"(desc_b), "r"(1));
}
// D(64 x 128, f32: d[kOff .. kOff + 63]) += A(64 x 16) · B(128 x 16)ᵀ, both bf16 K-major in shared memory.
template <int kOff>
__device__ __forceinline__ void wgmma_m64n128k16(float (&d)[128], uint64_t desc_a, uint64_t desc_b) {
  static_assert(kOff == 0 || kOff == 64, "an accumulator half");
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "%64, %65, p, 1, 1, 0, 0;\n"
      "}\n"
      : "+f"(d[kOff + 0]), "+f"(d[kOff + 1]), "+f"(d[kOff + 2]), "+f"(d[kOff + 3]), "+f"(d[kOff + 4]),
        "+f"(d[kOff + 5]), "+f"(d[kOff + 6]), "+f"(d[kOff + 7]), "+f"(d[kOff + 8]), "+f"(d[kOff + 9]),
        "+f"(d[kOff + 10]), "+f"(d[kOff + 11]), "+f"(d[kOff + 12]), "+f"(d[kOff + 13]), "+f"(d[kOff + 14]),
        "+f"(d[kOff + 15]), "+f"(d[kOff + 16]), "+f"(d[kOff + 17]), "+f"(d[kOff + 18]), "+f"(d[kOff + 19]),
        "+f"(d[kOff + 20]), "+f"(d[kOff + 21]), "+f"(d[kOff + 22]), "+f"(d[kOff + 23]), "+f"(d[kOff + 24]),
        "+f"(d[kOff + 25]), "+f"(d[kOff + 26]), "+f"(d[kOff + 27]), "+f"(d[kOff + 28]), "+f"(d[kOff + 29]),
        "+f"(d[kOff + 30]), "+f"(d[kOff + 31]), "+f"(d[kOff + 32]), "+f"(d[kOff + 33]), "+f"(d[kOff + 34]),
        "+f"(d[kOff + 35]), "+f"(d[kOff + 36]), "+f"(d[kOff + 37]), "+f"(d[kOff + 38]), "+f"(d[kOff + 39]),
        "+f"(d[kOff + 40]), "+f"(d[kOff + 41]), "+f"(d[kOff + 42]), "+f"(d[kOff + 43]), "+f"(d[kOff + 44]),
        "+f"(d[kOff + 45]), "+f"(d[kOff + 46]), "+f"(d[kOff + 47]), "+f"(d[kOff + 48]), "+f"(d[kOff + 49]),
        "+f"(d[kOff + 50]), "+f"(d[kOff + 51]), "+f"(d[kOff + 52]), "+f"(d[kOff + 53]), "+f"(d[kOff + 54]),
        "+f"(d[kOff + 55]), "+f"(d[kOff + 56]), "+f"(d[kOff + 57]), "+f"(d[kOff + 58]), "+f"(d[kOff + 59]),
        "+f"(d[kOff + 60]), "+f"(d[kOff + 61]), "+f"(d[kOff + 62]), "+f"(d[kOff + 63])
      : "l"(desc_a), "l"(desc_b), "r"(1));
}
#endif

__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
}
__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.bf16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

// Two e4m3 codes (low byte = lower K) -> bf16x2 of value · 2^-112 (see the header comment).
__device__ __forceinline__ uint32_t e4m3x2_to_bf16x2_shifted(uint32_t pair16) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair16), __NV_E4M3);
  const uint32_t x = static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
  return ((x >> 3) & 0x0FFF0FFFu) | (x & 0x80008000u);
}
// Eight e2m1 codes of one word (code i in bits 4i..4i+3, i = lower K first) -> four bf16x2 (codes 2j, 2j+1).
__device__ __forceinline__ void e2m1x8_to_bf16x2(uint32_t x, uint32_t (&o)[4]) {
  // bf16 of {0, .5, 1, 1.5, 2, 3, 4, 6}: high bytes 00 3F 3F 3F 40 40 40 40, low bytes 00 00 80 C0 00 40 80 C0.
  constexpr uint32_t kHi03 = 0x3F3F3F00u, kHi47 = 0x40404040u, kLo03 = 0xC0800000u, kLo47 = 0xC0804000u;
  const uint32_t mag = x & 0x77777777u;  // selector nibbles 0-7 (bit 3 of a prmt selector means sign replication)
  const uint32_t hi0 = prmt(kHi03, kHi47, mag), lo0 = prmt(kLo03, kLo47, mag);              // bytes for codes 0-3
  const uint32_t hi1 = prmt(kHi03, kHi47, mag >> 16), lo1 = prmt(kLo03, kLo47, mag >> 16);  // codes 4-7
  // Signs: code 2j's sign is bit 3 of byte j (bit 7 of byte j of x << 4), code 2j+1's is bit 7 of byte j: placed in
  // bytes 1 and 3 they land on bits 15 and 31.
  const uint32_t x4 = x << 4;
  o[0] = prmt(lo0, hi0, 0x5140) | (prmt(x4, x, 0x4000) & 0x80008000u);
  o[1] = prmt(lo0, hi0, 0x7362) | (prmt(x4, x, 0x5010) & 0x80008000u);
  o[2] = prmt(lo1, hi1, 0x5140) | (prmt(x4, x, 0x6020) & 0x80008000u);
  o[3] = prmt(lo1, hi1, 0x7362) | (prmt(x4, x, 0x7030) & 0x80008000u);
}

// Codes per 16-byte chunk (8 K values): one word of e2m1, two of e4m3.
template <QuantFormat F>
constexpr int kChunkWords = F == QuantFormat::kMXFP4 ? 1 : 2;

// A decode unit's step: kChunks consecutive chunks of one weight row (8 = the whole row's 64 K values, 4 = a 32-wide
// K half, 2 = a quarter), its code words (K ascending) and the raw scales of the 32-wide halves it touches (UE8M0
// exponent byte, or f32 bits).
template <QuantFormat F, int kChunks>
struct Part {
  static_assert(kChunks == 8 || kChunks == 4 || kChunks == 2, "whole, half or quarter rows");
  uint32_t w[kChunkWords<F> * kChunks];
  uint32_t s[kChunks == 8 ? 2 : 1];
};

// Where a decode unit's codes and scales are: weight row n (a column past N reads row N - 1 instead: no branch, its
// output column is never written), chunks c0 .. c0 + kChunks - 1 of every step. Block sizes are powers of two
// (run_gemm_wgmma checks), so scale columns come from shifts.
template <QuantFormat F, int kChunks>
struct PartSrc {
  const uint8_t* codes;  // the unit's first code byte of step 0
  const uint8_t* sc;     // the scale matrix
  int64_t s_base;        // the row's first scale
  int k0;                // the unit's first K within a step
  int bk_shift;
  bool s8;  // UE8M0 scales

  __device__ __forceinline__ PartSrc(const GemmKernelParams& p, int g, int64_t n0_row, int c0) {
    const int64_t n = min(n0_row, p.n - 1);
    const int64_t row_bytes = F == QuantFormat::kMXFP4 ? p.k / 2 : p.k;
    codes = static_cast<const uint8_t*>(p.b_table ? p.b_table[g] : p.b) + n * row_bytes + c0 * 4 * kChunkWords<F>;
    sc = static_cast<const uint8_t*>(p.b_scale_table ? p.b_scale_table[g] : p.b_scale);
    s_base = F == QuantFormat::kMXFP4      ? n * (p.k / 32)
             : F == QuantFormat::kFP8Row32 ? n * p.scale_cols
                                           : (n >> (__ffs(p.block_n) - 1)) * p.scale_cols;
    k0 = 8 * c0;
    bk_shift = __ffs(p.block_k) - 1;
    s8 = F == QuantFormat::kMXFP4 || p.scale_e8m0;
  }
  // Step kt's codes and scales into u.
  __device__ __forceinline__ void load(int kt, Part<F, kChunks>& u) const {
    constexpr int kBytes = 4 * kChunkWords<F> * kChunks, kStepBytes = kCodeWords<F> * 4;
    const uint8_t* q = codes + static_cast<int64_t>(kt) * kStepBytes;
    if constexpr (kBytes % 16 == 0) {
#pragma unroll
      for (int v = 0; v < kBytes / 16; ++v) {
        const uint4 x = __ldg(reinterpret_cast<const uint4*>(q) + v);
        u.w[4 * v] = x.x;
        u.w[4 * v + 1] = x.y;
        u.w[4 * v + 2] = x.z;
        u.w[4 * v + 3] = x.w;
      }
    } else {
      static_assert(kBytes == 8, "a quarter row of e2m1 codes");
      const uint2 x = __ldg(reinterpret_cast<const uint2*>(q));
      u.w[0] = x.x;
      u.w[1] = x.y;
    }
#pragma unroll
    for (int h = 0; h < (kChunks == 8 ? 2 : 1); ++h) {
      const int k = kt * kWgK + k0 + 32 * h;
      const int64_t si = s_base + (F == QuantFormat::kFP8Block ? (k >> bk_shift) : (k >> 5));
      u.s[h] =
          s8 ? static_cast<uint32_t>(__ldg(sc + si)) : __float_as_uint(__ldg(reinterpret_cast<const float*>(sc) + si));
    }
  }
};

// Decodes chunk c (K values 8c..8c+7 of the step) of tile row r from its code words (MXFP4: w[0]; FP8: w[0], w[1])
// and its half's raw scale into the swizzled tile at `tile` (shared address). s8: UE8M0 scales.
template <QuantFormat F, bool kExact>
__device__ __forceinline__ void decode_chunk(const uint32_t* w, uint32_t sraw, uint32_t tile, int r, int c, bool s8) {
  uint32_t o[4];
  if constexpr (kExact) {
    const float sc = s8 ? e8m0_to_f32_dev(static_cast<uint8_t>(sraw)) : __uint_as_float(sraw);
    float v[8];
    if constexpr (F == QuantFormat::kMXFP4) {
      decode_fp4x8_pairs(w[0], v);
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] *= sc * kFp4Unscale;
    } else {
      decode_fp8x8(w[0], w[1], v);
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] *= sc;
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) o[j] = pack_bf16x2(v[2 * j], v[2 * j + 1]);
  } else if constexpr (F == QuantFormat::kMXFP4) {
    // bf16x2 of the scale 2^(S - 127): exponent field S in both halves (exact for S = 1..254).
    const uint32_t m2 = sraw * 0x00800080u;
    e2m1x8_to_bf16x2(w[0], o);
#pragma unroll
    for (int j = 0; j < 4; ++j) o[j] = bf16x2_mul(o[j], m2);
  } else {
    // bf16x2 of scale · 2^112 = 2^(S - 15): exponent field S - 15 + 127 = S + 112 (exact for S <= 142: scales up to
    // 2^15).
    const uint32_t m2 = (sraw + 112u) * 0x00800080u;
#pragma unroll
    for (int j = 0; j < 4; ++j) o[j] = bf16x2_mul(e4m3x2_to_bf16x2_shifted(w[j / 2] >> (16 * (j & 1))), m2);
  }
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(tile + swz(r, c)), "r"(o[0]), "r"(o[1]), "r"(o[2]),
               "r"(o[3])
               : "memory");
}
// A decode unit's step into tile row r, chunks c0.. (s8: UE8M0 scales).
template <QuantFormat F, bool kExact, int kChunks>
__device__ __forceinline__ void decode_part(const Part<F, kChunks>& u, uint32_t tile, int r, int c0, bool s8) {
#pragma unroll
  for (int c = 0; c < kChunks; ++c)
    decode_chunk<F, kExact>(&u.w[kChunkWords<F> * c], u.s[kChunks == 8 ? c >> 2 : 0], tile, r, c0 + c, s8);
}

// The staged producer decode (WgmmaDecode::kProducerStaged, MXFP4 with K % 128 == 0): each weight row's codes of a
// step (32 bytes) and the aligned word holding its two block scales, copied by cp.async one step ahead (with the A
// copies) into one of two buffers after the stages (step parity), and read back by the producer once its copies of
// the step have landed: no global load in flight in registers when the step's proxy fence runs (which waits for them:
// the suspected cause of ~2 us steps). Only the producer thread of a row touches its slots, so two buffers suffice
// (buffer b is rewritten at step G + 2, after this thread read it at step G). A row's two 16-byte chunks swap places
// every four rows, so that the eight rows of a quarter warp read distinct bank groups.
template <bool kTall>
struct StagedCodes {
  static constexpr int kRows = WgTile<kTall>::kN;
  static constexpr int kCodeBytes = kRows * 32, kBufBytes = kCodeBytes + kRows * 4;
  static constexpr size_t kBytes = 2 * kBufBytes;
  uint32_t base;  // shared address

  __device__ __forceinline__ explicit StagedCodes(uint32_t b) : base(b) {}
  __device__ __forceinline__ uint32_t chunk(int buf, int r, int v) const {
    return base + buf * kBufBytes + 32 * r + 16 * (v ^ ((r >> 2) & 1));
  }
  __device__ __forceinline__ uint32_t scale(int buf, int r) const {
    return base + buf * kBufBytes + kCodeBytes + 4 * r;
  }
  // Step kt's codes and scale word of the row `src` reads, into buffer buf, tile row r.
  template <int kChunks>
  __device__ __forceinline__ void issue(const PartSrc<QuantFormat::kMXFP4, kChunks>& src, int kt, int buf,
                                        int r) const {
    static_assert(kChunks == 8, "whole rows");
    const uint8_t* q = src.codes + static_cast<int64_t>(kt) * 32;
#pragma unroll
    for (int v = 0; v < 2; ++v)
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(chunk(buf, r, v)), "l"(q + 16 * v) : "memory");
    const uint8_t* w = src.sc + src.s_base + ((2 * kt) & ~3);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(scale(buf, r)), "l"(w) : "memory");
  }
  // Back into a decode unit: the eight code words and the scales of blocks 2kt, 2kt + 1 (bytes 2 (kt & 1) and 2 (kt &
  // 1)
  // + 1 of the word).
  template <int kChunks>
  __device__ __forceinline__ void read(int buf, int r, int kt, Part<QuantFormat::kMXFP4, kChunks>& u) const {
#pragma unroll
    for (int v = 0; v < 2; ++v) {
      const uint4 x = lds_u128(chunk(buf, r, v));
      u.w[4 * v] = x.x;
      u.w[4 * v + 1] = x.y;
      u.w[4 * v + 2] = x.z;
      u.w[4 * v + 3] = x.w;
    }
    const uint32_t word = lds_u32(scale(buf, r));
    const int sh = 16 * (kt & 1);
    u.s[0] = (word >> sh) & 0xFF;
    u.s[1] = (word >> (sh + 8)) & 0xFF;
  }
};

// Who decodes which weight rows of a step's B tile (kDec: 0 = the producer, 1 = split, 2 = the consumers).
// Producer: kUnitsP units of kChunksP chunks a thread, unit i of thread tid = tile row tid / kPartsP + i·128 / kPartsP,
// chunks from (tid % kPartsP)·kChunksP: tile rows [0, kRowsP). Consumers: one unit of kChunksC chunks a thread (0 =
// none), u = tid - 128: tile row kRowsP + u / kPartsC, chunks from (u % kPartsC)·kChunksC: rows [kRowsP, kN).
//   128 x 256: 0 = two whole rows a producer thread; 1 = producer row tid, consumers rows 128-255 half a row each;
//              2 = consumers a whole row each.
//   256 x 128: 0 = one whole row a producer thread; 1 = producer rows 0-63 half a row each, consumers rows 64-127 a
//              quarter row each; 2 = consumers rows 0-127 half a row each.
template <bool kTall, int kDec>
struct DecodePlan {
  static constexpr int kUnitsP = kDec == 2 ? 0 : (kDec == 0 && !kTall ? 2 : 1);
  static constexpr int kChunksP = kDec == 1 && kTall ? 4 : 8, kPartsP = 8 / kChunksP;
  static constexpr int kRowsP = kUnitsP * 128 / kPartsP;
  static constexpr int kChunksC = kDec == 0 ? 0 : (kDec == 1 ? (kTall ? 2 : 4) : (kTall ? 4 : 8));
  static constexpr int kPartsC = kChunksC ? 8 / kChunksC : 1, kRowsC = kChunksC ? 256 / kPartsC : 0;
  static_assert(kRowsP + kRowsC == WgTile<kTall>::kN, "every weight row of the tile decoded once");
};

// Which tiles of a grouped call a launch covers (the `plan` kernel argument). kPlanAll: all of a group's rows, in
// 128-row tiles (the plan's tiles, every other one starting a tile) or 256-row tiles (scan_group_tile). Mixed (two
// launches): a group's rows in c = ceil(rows / 128) blocks of 128 go as floor(c / 2) 256-row tiles (kPlanPairs, the
// 256 x 128 launch) plus, when c is odd, one 128-row tile of the last <= 128 rows (kPlanLeftover, the 128 x 256
// launch): the tall tile costs ~0.86 of two 128-row tiles' steps (measured) but ~1.7 of one.
constexpr int kPlanAll = 0, kPlanPairs = 1, kPlanLeftover = 2;

// Scan-mapped tiles of a group of T plan tiles (T = ceil(rows / 64)), and the first row of its q-th tile (from the
// group's first row).
__device__ __forceinline__ int scan_tiles(int t, int plan) {
  const int c = (t + 1) >> 1;  // 128-row blocks
  return plan == kPlanAll ? (c + 1) >> 1 : plan == kPlanPairs ? c >> 1 : c & 1;
}
__device__ __forceinline__ int64_t scan_first_row(int t, int plan, int q) {
  return plan == kPlanLeftover ? static_cast<int64_t>((t + 1) >> 2) * 256 : static_cast<int64_t>(q) * 256;
}

// Grouped tiles by a scan of the plan: kernel M tile j is the q-th tile of group g, the groups in order with
// scan_tiles(T_g) tiles each. The launch bounds their sum (launch()) instead of a block per plan tile, most of which
// would only find that they start no tile and exit. Every warp finds (g, q) on its own (the roles walk the tiles
// independently, so no block barrier): lane l sums the tiles of groups [l·per, (l+1)·per), a warp scan finds the
// lane whose range holds j, then the warp scans that range's groups 32 at a time. Rows [begin, end) as
// gemm_tile_rows (end: the group's end; the kernel takes at most its tile's rows); false past the last tile (and for
// every later j: callers stop there).
__device__ __forceinline__ bool scan_group_tile(const GemmKernelParams& p, int64_t tile, int plan, int& g,
                                                int64_t& begin, int64_t& end) {
  constexpr unsigned kAll = 0xFFFFFFFFu;
  const int lane = threadIdx.x & 31, groups = p.groups, per = (groups + 31) / 32;
  const int j = static_cast<int>(tile);
  // Level 1: this lane's groups' tiles (the plan's tile offsets of groups lane·per .. (lane + 1)·per, clamped).
  int cnt = 0;
  {
    const int x0 = min(lane * per, groups), x1 = min(lane * per + per, groups);
    int prev = p.tile_offsets[x0];
#pragma unroll 4
    for (int x = x0; x < x1; ++x) {
      const int next = p.tile_offsets[x + 1];
      cnt += scan_tiles(next - prev, plan);
      prev = next;
    }
  }
  int incl = cnt;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const int v = __shfl_up_sync(kAll, incl, off);
    if (lane >= off) incl += v;
  }
  if (j >= __shfl_sync(kAll, incl, 31)) return false;
  const int owner = __ffs(__ballot_sync(kAll, incl > j)) - 1;
  int base = __shfl_sync(kAll, incl - cnt, owner);  // tiles before the owner's first group
  const int r0 = owner * per, r1 = min(r0 + per, groups);
  // Level 2: the owner's groups, 32 at a time (one a lane); j is among them, so the loop returns.
  for (int x0 = r0; x0 < r1; x0 += 32) {
    const int x = x0 + lane;
    const int c = x < r1 ? scan_tiles(p.tile_offsets[x + 1] - p.tile_offsets[x], plan) : 0;
    int in2 = c;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const int v = __shfl_up_sync(kAll, in2, off);
      if (lane >= off) in2 += v;
    }
    const unsigned hit = __ballot_sync(kAll, base + in2 > j);
    if (hit) {
      const int l2 = __ffs(hit) - 1;
      g = x0 + l2;
      const int q = j - base - __shfl_sync(kAll, in2 - c, l2);
      begin = p.group_offsets[g] + scan_first_row(p.tile_offsets[g + 1] - p.tile_offsets[g], plan, q);
      end = p.group_offsets[g + 1];
      return true;
    }
    base += __shfl_sync(kAll, in2, 31);
  }
  return false;  // not reached for a consistent plan
}

// Whether this kernel maps grouped tiles by scan_group_tile (else gemm_tile_rows, dense calls too).
template <bool kTall>
__device__ __forceinline__ bool scan_mapped(const GemmKernelParams& p, int plan) {
  return p.group_offsets && (kTall || plan == kPlanLeftover);
}
// The rows and group of this kernel's M tile `tile`. False: no tile here (gemm_tile_rows: a plan tile that starts
// none; scan-mapped: past the last tile).
template <bool kTall>
__device__ __forceinline__ bool wg_tile_rows(const GemmKernelParams& p, int64_t tile, int plan, int& g, int64_t& begin,
                                             int64_t& end) {
  if (scan_mapped<kTall>(p, plan)) return scan_group_tile(p, tile, plan, g, begin, end);
  return gemm_tile_rows(p, tile, WgTile<kTall>::kM / kGemmTileM, g, begin, end);
}

// Split-K (kSplitK, dense 128 x 256 tiles only): kernel tile t is split t % splits of output tile t / splits; it runs
// that split's k-steps (split_steps) and writes its partial product to p.split_part's slice `split` ([m, n], row
// stride n), which wgmma_split_reduce_kernel sums in split order.
__device__ __forceinline__ void split_steps(int ksteps, int splits, int split, int& kb, int& nk) {
  const int per = ksteps / splits, rem = ksteps % splits;
  kb = split * per + min(split, rem);
  nk = per + (split < rem ? 1 : 0);
}

// Split-K: the codes of a split's k-steps of tile rows tid and tid + 128 (all 256 rows between the producer's 128
// threads) fetched into L2 at the tile's start, so that the decoding threads' one-step-ahead register loads wait on
// L2 rather than DRAM: a split is only 4-16 steps, too few for the pipeline alone to hide a DRAM round trip a step.
template <QuantFormat F>
__device__ __forceinline__ void prefetch_split_codes(const GemmKernelParams& p, int64_t n0, int kb, int nk, int tid) {
  constexpr int kStepBytes = kCodeWords<F> * 4;
  const int64_t row_bytes = F == QuantFormat::kMXFP4 ? p.k / 2 : p.k;
  const int bytes = nk * kStepBytes;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t n = min(n0 + tid + 128 * h, p.n - 1);
    const uint8_t* q = static_cast<const uint8_t*>(p.b) + n * row_bytes + static_cast<int64_t>(kb) * kStepBytes;
    for (int off = 0; off < bytes; off += 128) asm volatile("prefetch.global.L2 [%0];\n" ::"l"(q + off));
    asm volatile("prefetch.global.L2 [%0];\n" ::"l"(q + bytes - 1));  // the last line when q is not line-aligned
  }
}

// e4m3 operands (--activation-quant mxfp8's FP8 GEMM, next): d (+)= A · Bᵀ over one k32 slice, both K-major with
// one-byte codes (a 128-byte swizzle row holds 128 K values); accumulate = false starts from zero (scale-d = 0). Probed
// by tests/cuda/wgmma_fp8_probe.cu.
__device__ __forceinline__ void wgmma_m64n128k32_e4m3(float (&d)[64], uint64_t desc_a, uint64_t desc_b,
                                                      bool accumulate) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "
      "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, "
      "%46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "%64, %65, p, 1, 1;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),
        "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),
        "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
        "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b), "r"(accumulate ? 1 : 0));
#else
  __trap();
#endif
}

// d = A · Bᵀ over one k32 slice, 64 rows x 64 weight rows (scale-d = 0: d's old values are ignored), both e4m3 K-major
// in shared memory: the FP8 expert GEMM's unit (gemm_wgmma_fp8_cuda.cu), each product promoted into fp32 times its
// rows' activation scales while the next one runs.
// scale_d = 0: d = A·B; 1: d += A·B.
__device__ __forceinline__ void wgmma_m64n64k32_e4m3(float (&d)[32], uint64_t desc_a, uint64_t desc_b,
                                                     int scale_d = 0) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "
      "%24, %25, %26, %27, %28, %29, %30, %31}, "
      "%32, %33, p, 1, 1;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
#else
  __trap();
#endif
}

// Descriptor of a K-major operand in the no-swizzle layout: 8-row x 16-byte core matrices of 128 contiguous bytes,
// those adjacent in K lbo bytes apart, those adjacent in rows (M or N) sbo bytes apart (mode 0).
__device__ __forceinline__ uint64_t smem_desc_plain(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>(lbo >> 4) << 16) |
         (static_cast<uint64_t>(sbo >> 4) << 32);
}

// D(64 x kN, f32) += A(64 x 16, bf16) · B(kN x 16, bf16, K-major shared memory)ᵀ with A in registers: warp w of the
// warpgroup holds rows 16w..16w+15 as mma.m16n8k16's A fragment (a[0] row g, k 2t..2t+1; a[1] row g + 8; a[2] / a[3]
// the same at k + 8), and d holds its rows as mma.m16n8's C fragments, one per 8 columns (d[4j..4j+3]: columns 8j +
// 2t, 8j + 2t + 1 of rows g and g + 8). kN = 16, 32, 64 (the rows kernel's activation rows) or 128 (the flash MLA's
// P·V); B in either layout its descriptor names.
template <int kN>
__device__ __forceinline__ void wgmma_m64nNk16_reg_a(float (&d)[kN / 2], const uint32_t (&a)[4], uint64_t desc_b) {
  static_assert(kN == 16 || kN == 32 || kN == 64 || kN == 128, "n16, n32, n64 or n128");
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  if constexpr (kN == 16) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %13, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7}, "
        "{%8, %9, %10, %11}, %12, p, 1, 1, 0;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
  }
  if constexpr (kN == 32) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %21, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
        "{%16, %17, %18, %19}, %20, p, 1, 1, 0;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
          "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
  }
  if constexpr (kN == 64) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, "
        "%23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "{%32, %33, %34, %35}, %36, p, 1, 1, 0;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
          "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
          "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
          "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
  }
  if constexpr (kN == 128) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, "
        "%23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, "
        "%45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "{%64, %65, %66, %67}, %68, p, 1, 1, 0;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
          "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
          "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
          "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),
          "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),
          "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
          "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
          "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
  }
#else
  __trap();
#endif
}

}  // namespace deepinfer::cuda::wgmma
