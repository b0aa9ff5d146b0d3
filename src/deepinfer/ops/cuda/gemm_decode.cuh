// Shared by the GEMM kernels (gemm_cuda.cu, gemm_chain_cuda.cu, gemm_tc_cuda.cu, gemm_mma_cuda.cu,
// gemm_stream_mma_cuda.cu): the rows of an M tile (the MoE plan's tiles), block scales, e4m3 / e2m1 codes to f32
// through the hardware f16 paths, and the bf16 mma.sync.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstring>

#include "deepinfer/ops/cuda/device_math.cuh"
#include "deepinfer/ops/cuda/kernels.h"

namespace deepinfer::cuda {

// The rows [begin, end) and the group g of M tile `tile`, for a kernel whose tiles span `span` of the plan's
// kGemmTileM-row tiles. Grouped (MoE): every span-th plan tile of a group starts a kernel tile; false for the others
// and past the plan's tiles (the block has nothing to do). Dense: rows tile·span·kGemmTileM .. of [0, m).
__device__ __forceinline__ bool gemm_tile_rows(const GemmKernelParams& p, int64_t tile, int span, int& g,
                                               int64_t& begin, int64_t& end) {
  g = 0;
  if (!p.group_offsets) {
    begin = tile * span * kGemmTileM;
    end = p.m;
    return true;
  }
  if (tile >= p.tile_offsets[p.groups]) return false;
  int lo = 0, hi = p.groups;  // the largest g with tile_offsets[g] <= tile (its group has tiles left)
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (p.tile_offsets[mid] <= tile)
      lo = mid;
    else
      hi = mid;
  }
  g = lo;
  const int64_t local = tile - p.tile_offsets[g];
  if (local % span) return false;
  begin = p.group_offsets[g] + local * kGemmTileM;
  end = p.group_offsets[g + 1];
  return true;
}

// Index of the scale of weight (n, k) in its scale matrix.
__device__ __forceinline__ int64_t block_scale_index(const GemmKernelParams& p, QuantFormat f, int64_t n, int64_t k) {
  if (f == QuantFormat::kMXFP4) return n * (p.k / 32) + k / 32;
  // Power-of-two blocks (all checkpoints: 128, 32) index with shifts: 64-bit division is ~100 instructions.
  int64_t bn, bk;
  if ((p.block_n & (p.block_n - 1)) == 0 && (p.block_k & (p.block_k - 1)) == 0) {
    bn = n >> (__ffs(p.block_n) - 1);
    bk = k >> (__ffs(p.block_k) - 1);
  } else {
    bn = n / p.block_n;
    bk = k / p.block_k;
  }
  return f == QuantFormat::kFP8Block ? bn * p.scale_cols + bk : n * p.scale_cols + (k >> 5);
}
__device__ __forceinline__ float block_scale(const void* s, const GemmKernelParams& p, QuantFormat f, int64_t n,
                                             int64_t k) {
  const int64_t si = block_scale_index(p, f, n, k);
  if (f == QuantFormat::kMXFP4 || p.scale_e8m0) return e8m0_to_f32_dev(static_cast<const uint8_t*>(s)[si]);
  return static_cast<const float*>(s)[si];
}

// 8 e4m3 codes (two words, little-endian) -> f32, two at a time through the hardware fp8x2 -> f16x2 convert.
__device__ __forceinline__ void decode_fp8x8(uint32_t lo, uint32_t hi, float* w) {
  const uint32_t words[2] = {lo, hi};
#pragma unroll
  for (int j = 0; j < 2; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const auto pair = static_cast<__nv_fp8x2_storage_t>((words[j] >> (16 * h)) & 0xFFFFu);
      const float2 f = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3)));
      w[j * 4 + h * 2] = f.x;
      w[j * 4 + h * 2 + 1] = f.y;
    }
}
// 16 e4m3 codes (little-endian bytes of q) -> f32.
__device__ __forceinline__ void decode_fp8x16(const uint4 q, float* w) {
  decode_fp8x8(q.x, q.y, w);
  decode_fp8x8(q.z, q.w, w + 8);
}
// 2·kBytes e2m1 codes, low nibble first (even column), decoded 2^-14 times too small (callers fold
// kFp4Unscale into the block scale): a nibble s|e1 e0|m placed as f16 bits s<<15 | (e1 e0 m)<<9 is exactly
// 2^-14 · e2m1 (normal for e > 0, subnormal for e = 0), so decoding is bit placement plus one f16x2 -> f32x2.
constexpr float kFp4Unscale = 16384.0f;
template <int kBytes>
__device__ __forceinline__ void decode_fp4(const uint32_t* words, float* w) {
#pragma unroll
  for (int i = 0; i < kBytes; ++i) {
    const uint32_t b = words[i / 4] >> (8 * (i % 4));
    const uint32_t h = ((b & 0x8u) << 12) | ((b & 0x7u) << 9) | ((b & 0x80u) << 24) | ((b & 0x70u) << 21);
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
    w[2 * i] = f.x;
    w[2 * i + 1] = f.y;
  }
}

// 8 e2m1 codes of one word (code i in bits 4i..4i+3) -> w[i], 2^-14 times too small like decode_fp4: codes i and
// i + 4 sit 16 bits apart, so one pair of shifts and masks places both as the halves of an f16x2 (about half the
// integer work of decoding byte by byte).
__device__ __forceinline__ void decode_fp4x8_pairs(uint32_t x, float* w) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t mag = (i < 3 ? x << (9 - 4 * i) : x >> 3) & 0x0E000E00u;
    const uint32_t sign = (x << (12 - 4 * i)) & 0x80008000u;
    const uint32_t h = mag | sign;
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
    w[i] = f.x;
    w[i + 4] = f.y;
  }
}

// D += A·B for one m16n8k16 bf16 tile, fp32 accumulation (the PTX fragment layouts).
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// Which rows [begin, end) of A/C and which weight the y-th group slot covers. Dense: one slot, all rows.
struct GroupSpan {
  int g;
  int64_t begin, end;
};
__device__ __forceinline__ bool active_group(const GemmKernelParams& p, int slot, GroupSpan& span) {
  if (!p.group_offsets) {
    span = {0, 0, p.m};
    return slot == 0;
  }
  if (slot >= p.active_groups[p.groups]) return false;
  const int g = p.active_groups[slot];
  span = {g, p.group_offsets[g], p.group_offsets[g + 1]};
  return true;
}

__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
// Named barriers (id 0 is __syncthreads'): bar_sync waits for `threads` arrivals in all; bar_arrive orders this
// thread's earlier shared-memory accesses before the waiters' later ones, without waiting.
__device__ __forceinline__ void bar_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void bar_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// Four 8x8 b16 matrices from shared memory (volatile: kept between the barriers that guard the buffer). No "memory"
// clobber: a barrier always separates the stores to a tile from its ldmatrix reads, and without the
// clobber the compiler may interleave the next step's decoding (other buffers) with these loads.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* src) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(src)));
}
// Two 8x8 b16 matrices (lanes 0-15 give the row addresses), as ldmatrix_x4.
__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], const void* src) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(smem_addr(src)));
}
// bf16x3 products (the tensor-core paged attention, the MLA flash kernel): operands split into bf16 hi + lo terms,
// each product hi·hi + hi·lo + lo·hi in fp32 (~2^-16 relative; lo·lo dropped).
// (a, b) -> hi and lo bf16 pairs, a in the low half (the lower k or n index of an mma register).
__device__ __forceinline__ void split_pair(float a, float b, uint32_t& hi, uint32_t& lo) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  const float2 hf = __bfloat1622float2(h);
  const __nv_bfloat162 l = __floats2bfloat162_rn(a - hf.x, b - hf.y);
  std::memcpy(&hi, &h, 4);
  std::memcpy(&lo, &l, 4);
}

// Four values -> their hi and lo bf16 terms, as two pairs each.
__device__ __forceinline__ void split4(const float4 v, uint2& h, uint2& l) {
  split_pair(v.x, v.y, h.x, l.x);
  split_pair(v.z, v.w, h.y, l.y);
}

// hi·hi + hi·lo + lo·hi, the small terms first.
__device__ __forceinline__ void mma3(float (&c)[4], const uint32_t (&ah)[4], const uint32_t (&al)[4], uint32_t bh0,
                                     uint32_t bh1, uint32_t bl0, uint32_t bl1) {
  mma_bf16(c, ah, bl0, bl1);
  mma_bf16(c, al, bh0, bh1);
  mma_bf16(c, ah, bh0, bh1);
}

// hi·hi + lo·hi where b's lo terms are zero (b exact in bf16): mma3's sums without its zero products, the same bits.
__device__ __forceinline__ void mma2(float (&c)[4], const uint32_t (&ah)[4], const uint32_t (&al)[4], uint32_t bh0,
                                     uint32_t bh1) {
  mma_bf16(c, al, bh0, bh1);
  mma_bf16(c, ah, bh0, bh1);
}

// volatile keeps it between the same barriers (bar_sync is volatile asm too; the tile's plain C++ stores stay on
// their side through bar_sync's "memory" clobber); without a clobber of its own the compiler may still move the
// fragment loads and mmas around it.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* src) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(src));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// 16 bytes global -> shared, asynchronously; zero-filled when !valid (nothing is read then).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(valid ? 16 : 0)
               : "memory");
}
// 4 bytes global -> shared (both 4-byte aligned), through L1 (.ca: 4-byte copies have no .cg form); zero-filled when
// !valid.
__device__ __forceinline__ void cp_async4(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(valid ? 4 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

}  // namespace deepinfer::cuda
