// The block-dequantizing GEMM: C = A · dequant(B)ᵀ with B in any QuantFormat (f32, FP8 e4m3 with UE8M0/f32
// block scales of any block shape, MXFP4, FP8 per-32 rows), dense or grouped by expert (MoE). The kernels:
// - the SIMT tile (128x128x16, fp32 FMA chains in k order): f32 weights with more than a few rows and every
//   many-row GEMM of batch-invariant mode take it;
// - weight streaming for few rows per group (decode, MoE at small batch): block formats with UE8M0 scales stream
//   through the tensor cores (gemm_stream_mma_cuda.cu, up to kGemmStreamMmaMaxRows rows, A in bf16); the rest
//   with fp32 products (exact like the SIMT tile): the column-group kernel for the block formats with 16-byte
//   chunks (f32 scales: V3 checkpoints; a block owns 4-8 columns, its warps split K, every activation chunk serves
//   all the block's columns), and the older one-column-per-warp kernel for f32 weights and for shapes without
//   16-byte chunks;
// - a bf16 tensor-core tile (WMMA 16x16x16 on 64x128x32 tiles, gemm_tc_cuda.cu) for many rows: weights are
//   dequantized into shared memory as bf16 (exact for e4m3/e2m1 with UE8M0 scales), A is rounded to bf16, fp32
//   accumulation.
// Large dense M goes through cuBLASLt instead (cuda_backend_impl.cc: weights dequantized to a bf16 scratch).
// Batch-invariant mode (GemmKernelParams::batch_invariant): UE8M0 block formats take the tensor-core sequence of
// gemm_invariant_mma.h (the streaming kernel for few rows, a tile kernel with the identical per-output mma sequence
// for many); small dense f32 weights (routers) K-sliced fp32 chains (gemm_invariant_f32.h); other f32 weights and f32
// scales the SIMT tile and a few-row kernel with the identical arithmetic (the column chain, gemm_chain_cuda.cu), as
// every format did before the tensor-core sequence. This file: the SIMT tile, the few-row streaming kernels and the
// dispatch (run_gemm).
#include "deepinfer/ops/cuda/device_math.cuh"
#include "deepinfer/ops/cuda/gemm_common.cuh"
#include "deepinfer/ops/cuda/gemm_decode.cuh"
#include "deepinfer/ops/cuda/gemm_invariant_f32.h"
#include "deepinfer/ops/cuda/gemm_invariant_mma.h"
#include "deepinfer/ops/cuda/gemm_mma.h"
#include "deepinfer/ops/cuda/gemm_rows_mma.h"
#include "deepinfer/ops/cuda/gemm_stream_mma.h"
#include "deepinfer/ops/cuda/gemm_wgmma.h"
#include "deepinfer/ops/cuda/kernels.h"

#include <algorithm>

namespace deepinfer::cuda {
namespace {

constexpr int kThreads = 256;

// The SIMT tile: 128 x 128 outputs per block, 8 x 8 per thread (rows ty·4 + {0..3} and 64 + ty·4 + {0..3}, the
// same for columns: float4 shared loads without bank conflicts), K in steps of kBK with the next step's global
// loads in registers while the current one computes (double-buffered shared memory, one barrier a step). Every
// output is fmaf(a_k, w_k, acc) for k = 0, 1, ... over K rounded up to kBK (zeros past K), from acc = 0: the
// column-chain kernel's chain, so batch-invariant mode may mix the two (tests compare them bit for bit). The
// previous 64 x 64 tile with 4 x 4 per thread and per-element staging ran the batch-invariant prefill at ~6x the
// default mode's time (docs/PERF.md).
constexpr int kSmPad = kSm + 4;
// Grouped tiles come from the plan in kGemmTileM rows: a 128-row tile starts at every other one.
static_assert(kSm == 2 * kGemmTileM, "SIMT tile = two plan tiles");

// One k-step's global data of a thread: vector path (K % 16 == 0 and aligned rows): 2 A chunks of 4 k each and
// 2 weight chunks of 4 k each (decoded with their scale); scalar path: 8 A and 8 weight elements.
struct SmStage {
  float a[8], w[8];
};

template <QuantFormat F, bool kVec>
__device__ __forceinline__ void sm_load(const GemmKernelParams& p, const void* b, const void* s, const int64_t* a_row,
                                        int64_t n0, int64_t k0, SmStage& st) {
  const int tid = threadIdx.x;
#pragma unroll
  for (int e = 0; e < 2 * (1 + !kVec * 3); ++e) {
    if constexpr (kVec) {
      const int c = tid + e * kThreads, r = c / 4;
      const int64_t k = k0 + (c % 4) * 4, ar = a_row[r], n = n0 + r;
      float4 av = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (ar >= 0 && k < p.k) av = __ldg(reinterpret_cast<const float4*>(p.a + ar * p.lda + k));
      st.a[4 * e] = av.x;
      st.a[4 * e + 1] = av.y;
      st.a[4 * e + 2] = av.z;
      st.a[4 * e + 3] = av.w;
      float w[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      if (n < p.n && k < p.k) {
        if constexpr (F == QuantFormat::kFloat) {
          const float4 wv = __ldg(reinterpret_cast<const float4*>(static_cast<const float*>(b) + n * p.k + k));
          w[0] = wv.x;
          w[1] = wv.y;
          w[2] = wv.z;
          w[3] = wv.w;
        } else if constexpr (F == QuantFormat::kMXFP4) {
          const uint32_t word =
              __ldg(reinterpret_cast<const uint16_t*>(static_cast<const uint8_t*>(b) + n * (p.k / 2) + k / 2));
          float d[4];
          decode_fp4<2>(&word, d);
          // (v·2^-14)·2^14 is v exactly; times the scale it is load_weight's product, whatever the scale's size.
          const float sc = block_scale(s, p, F, n, k);
#pragma unroll
          for (int j = 0; j < 4; ++j) w[j] = (d[j] * kFp4Unscale) * sc;
        } else {
          const uint32_t word = __ldg(reinterpret_cast<const uint32_t*>(static_cast<const uint8_t*>(b) + n * p.k + k));
          float d[8];
          decode_fp8x8(word, 0u, d);
          const float sc = block_scale(s, p, F, n, k);
#pragma unroll
          for (int j = 0; j < 4; ++j) w[j] = d[j] * sc;
        }
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) st.w[4 * e + j] = w[j];
    } else {
      const int idx = tid + e * kThreads, r = idx / kBK, kk = idx % kBK;
      const int64_t k = k0 + kk, ar = a_row[r], n = n0 + r;
      st.a[e] = (ar >= 0 && k < p.k) ? p.a[ar * p.lda + k] : 0.0f;
      st.w[e] = (n < p.n && k < p.k) ? load_weight<F>(b, s, p, n, k) : 0.0f;
    }
  }
}

template <bool kVec>
__device__ __forceinline__ void sm_store(const SmStage& st, float (*as)[kSmPad], float (*bs)[kSmPad]) {
  const int tid = threadIdx.x;
#pragma unroll
  for (int e = 0; e < 2 * (1 + !kVec * 3); ++e) {
    if constexpr (kVec) {
      const int c = tid + e * kThreads, r = c / 4, kq = (c % 4) * 4;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        as[kq + j][r] = st.a[4 * e + j];
        bs[kq + j][r] = st.w[4 * e + j];
      }
    } else {
      const int idx = tid + e * kThreads, r = idx / kBK, kk = idx % kBK;
      as[kk][r] = st.a[e];
      bs[kk][r] = st.w[e];
    }
  }
}

template <QuantFormat F, bool kVec>
__global__ void __launch_bounds__(kThreads, 1) gemm_kernel(GemmKernelParams p) {
  __shared__ __align__(16) float as[2][kBK][kSmPad];
  __shared__ __align__(16) float bs[2][kBK][kSmPad];
  __shared__ int64_t a_row[kSm], c_row[kSm];

  // Which rows this block owns: a plain M tile, or a tile of one expert's gathered rows (every other plan tile).
  int g;
  int64_t row_begin, row_end;
  if (!gemm_tile_rows(p, blockIdx.x, kSm / kGemmTileM, g, row_begin, row_end)) return;
  const void* b = p.b_table ? p.b_table[g] : p.b;
  const void* s = p.b_scale_table ? p.b_scale_table[g] : p.b_scale;
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * kSm;

  const int tid = threadIdx.x;
  if (tid < kSm) {
    const int64_t i = row_begin + tid;
    const bool valid = i < row_end;
    a_row[tid] = !valid ? -1 : (p.a_rows ? p.a_rows[i] / p.a_row_div : i);
    c_row[tid] = !valid ? -1 : (p.c_rows ? p.c_rows[i] : i);
  }
  __syncthreads();

  const int tx = tid % 16, ty = tid / 16;
  float acc[8][8];
#pragma unroll
  for (int i = 0; i < 8; ++i)
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[i][j] = 0.0f;
  SmStage st;
  sm_load<F, kVec>(p, b, s, a_row, n0, 0, st);
  sm_store<kVec>(st, as[0], bs[0]);
  __syncthreads();
  int buf = 0;
  for (int64_t k0 = 0; k0 < p.k; k0 += kBK) {
    const bool more = k0 + kBK < p.k;
    if (more) sm_load<F, kVec>(p, b, s, a_row, n0, k0 + kBK, st);  // in flight during the FMAs
#pragma unroll
    for (int kk = 0; kk < kBK; ++kk) {
      const float4 a0 = *reinterpret_cast<const float4*>(&as[buf][kk][ty * 4]);
      const float4 a1 = *reinterpret_cast<const float4*>(&as[buf][kk][64 + ty * 4]);
      const float4 b0 = *reinterpret_cast<const float4*>(&bs[buf][kk][tx * 4]);
      const float4 b1 = *reinterpret_cast<const float4*>(&bs[buf][kk][64 + tx * 4]);
      const float av[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
      const float bv[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
      for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
    }
    if (more) sm_store<kVec>(st, as[buf ^ 1], bs[buf ^ 1]);
    __syncthreads();
    buf ^= 1;
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int64_t cr = c_row[(i < 4 ? 0 : 64) + ty * 4 + i % 4];
    if (cr < 0) continue;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int64_t n = n0 + (j < 4 ? 0 : 64) + tx * 4 + j % 4;
      if (n < p.n) p.c[cr * p.ldc + n] = acc[i][j];
    }
  }
}

// Launches the SIMT tile over m rows (dense) or the plan's tiles (grouped).
template <QuantFormat F>
void launch_simt(const GemmKernelParams& p, bool vec, cudaStream_t stream) {
  const int64_t tiles_m = p.group_offsets ? p.max_tiles_m : ceil_div(p.m, kSm);
  const int64_t tiles_n = ceil_div(p.n, kSm);
  if (tiles_m == 0 || tiles_n == 0) return;
  DI_CHECK(tiles_n <= 65535) << "gemm: n = " << p.n << " is too large for one launch";
  const dim3 grid(static_cast<unsigned>(tiles_m), static_cast<unsigned>(tiles_n));
  if (vec)
    gemm_kernel<F, true><<<grid, kThreads, 0, stream>>>(p);
  else
    gemm_kernel<F, false><<<grid, kThreads, 0, stream>>>(p);
}

// ---------------------------------------------------------------------------- weight-streaming kernel
constexpr int kSkWarps = 8;
// Rows per pass: 8, or 2 for groups of one or two rows (decode: every dense projection at batch 1-2 and the MoE
// experts up to batch ~64), whose smaller register file lets 3 blocks share an SM instead of 2 — the kernel is
// latency-bound (ncu: 22% achieved occupancy at 123 registers, DRAM 16.5%), so occupancy is what it needs.
constexpr int kSkRowsWide = 8, kSkRowsNarrow = 2;

// Grid: x = ceil(n / kSkWarps) column blocks, y = group slots. Each warp owns output column n of its group
// and walks the group's rows kSkRows at a time (the weight row is re-read from L1/L2 after the first pass).
// kVec: 16-byte weight loads and float4 A loads (the host checked sizes and alignment).
template <QuantFormat F, bool kVec, int kSkRows>
__global__ void __launch_bounds__(kSkWarps * 32, kSkRows == kSkRowsNarrow ? 3 : 0)
    gemm_skinny_kernel(GemmKernelParams p) {
  GroupSpan span;
  if (!active_group(p, blockIdx.y, span)) return;
  const int lane = threadIdx.x % 32;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kSkWarps + threadIdx.x / 32;
  if (n >= p.n) return;
  const void* b = p.b_table ? p.b_table[span.g] : p.b;
  const void* s = p.b_scale_table ? p.b_scale_table[span.g] : p.b_scale;
  for (int64_t r0 = span.begin; r0 < span.end; r0 += kSkRows) {
    const float* arow[kSkRows];
#pragma unroll
    for (int i = 0; i < kSkRows; ++i) {
      const int64_t r = r0 + i;
      arow[i] = r < span.end ? p.a + (p.a_rows ? p.a_rows[r] / p.a_row_div : r) * p.lda : nullptr;
    }
    float acc[kSkRows] = {};
    if constexpr (kVec && F == QuantFormat::kMXFP4) {
      const uint4* wrow = reinterpret_cast<const uint4*>(static_cast<const uint8_t*>(b) + n * (p.k / 2));
      const uint8_t* srow = static_cast<const uint8_t*>(s) + n * (p.k / 32);
#pragma unroll 4
      for (int64_t c = lane; c < p.k / 32; c += 32) {
        const uint4 q = __ldg(wrow + c);
        const float sc = e8m0_to_f32_dev(srow[c]);
        const uint32_t words[4] = {q.x, q.y, q.z, q.w};
        float w[32];
        decode_fp4<16>(words, w);
#pragma unroll
        for (int i = 0; i < kSkRows; ++i) {
          if (!arow[i]) continue;
          const float4* a4 = reinterpret_cast<const float4*>(arow[i] + c * 32);
          float d = 0.0f;
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            const float4 av = a4[j];
            d = fmaf(av.x, w[4 * j], fmaf(av.y, w[4 * j + 1], fmaf(av.z, w[4 * j + 2], fmaf(av.w, w[4 * j + 3], d))));
          }
          acc[i] = fmaf(d * kFp4Unscale, sc, acc[i]);
        }
      }
    } else if constexpr (kVec && F == QuantFormat::kFloat) {
      if (p.b_bf16) {  // 8 weights a 16-byte load, widened exactly
        const uint4* wrow = reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(b) + n * p.k);
#pragma unroll 4
        for (int64_t c = lane; c < p.k / 8; c += 32) {
          const uint4 q = __ldg(wrow + c);
          const uint32_t words[4] = {q.x, q.y, q.z, q.w};
          float w[8];
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            w[2 * j] = __uint_as_float(words[j] << 16);
            w[2 * j + 1] = __uint_as_float(words[j] & 0xFFFF0000u);
          }
#pragma unroll
          for (int i = 0; i < kSkRows; ++i) {
            if (!arow[i]) continue;
            const float4* a4 = reinterpret_cast<const float4*>(arow[i] + c * 8);
            const float4 v0 = a4[0], v1 = a4[1];
            acc[i] = fmaf(v0.x, w[0], fmaf(v0.y, w[1], fmaf(v0.z, w[2], fmaf(v0.w, w[3], acc[i]))));
            acc[i] = fmaf(v1.x, w[4], fmaf(v1.y, w[5], fmaf(v1.z, w[6], fmaf(v1.w, w[7], acc[i]))));
          }
        }
      } else {
        const float4* wrow = reinterpret_cast<const float4*>(static_cast<const float*>(b) + n * p.k);
#pragma unroll 4
        for (int64_t c = lane; c < p.k / 4; c += 32) {
          const float4 w = __ldg(wrow + c);
#pragma unroll
          for (int i = 0; i < kSkRows; ++i) {
            if (!arow[i]) continue;
            const float4 av = reinterpret_cast<const float4*>(arow[i])[c];
            acc[i] = fmaf(av.x, w.x, fmaf(av.y, w.y, fmaf(av.z, w.z, fmaf(av.w, w.w, acc[i]))));
          }
        }
      }
    } else if constexpr (kVec) {  // FP8 block / row32
      const uint4* wrow = reinterpret_cast<const uint4*>(static_cast<const uint8_t*>(b) + n * p.k);
#pragma unroll 4
      for (int64_t c = lane; c < p.k / 16; c += 32) {
        const uint4 q = __ldg(wrow + c);
        const float sc = block_scale(s, p, F, n, c * 16);
        float w[16];
        decode_fp8x16(q, w);
#pragma unroll
        for (int i = 0; i < kSkRows; ++i) {
          if (!arow[i]) continue;
          const float4* a4 = reinterpret_cast<const float4*>(arow[i] + c * 16);
          float d = 0.0f;
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const float4 av = a4[j];
            d = fmaf(av.x, w[4 * j], fmaf(av.y, w[4 * j + 1], fmaf(av.z, w[4 * j + 2], fmaf(av.w, w[4 * j + 3], d))));
          }
          acc[i] = fmaf(d, sc, acc[i]);
        }
      }
    } else {
      for (int64_t k = lane; k < p.k; k += 32) {
        const float w = load_weight<F>(b, s, p, n, k);
#pragma unroll
        for (int i = 0; i < kSkRows; ++i)
          if (arow[i]) acc[i] = fmaf(arow[i][k], w, acc[i]);
      }
    }
#pragma unroll
    for (int i = 0; i < kSkRows; ++i) {
      const int64_t r = r0 + i;
      if (r >= span.end) break;  // warp-uniform: decode usually has one row
      const float v = warp_sum(acc[i]);
      if (lane == 0) p.c[(p.c_rows ? p.c_rows[r] : r) * p.ldc + n] = v;
    }
  }
}

// ---------------------------------------------------------------------------- column-group streaming kernel
// Few-row GEMMs of the block formats that the tensor-core streaming kernel does not take (f32 block scales: V3
// checkpoints; unaligned shapes) are a stream of weight bytes with fp32 products. The one-column-per-warp kernel above
// re-reads the activation row from L1 for every column and keeps few loads in flight (ncu: latency-bound, 22%
// occupancy, L1 89% hits). Here a block owns CB adjacent columns and its warps split K: per step a lane loads one
// 16-byte chunk of each of the CB weight rows (CB independent loads in flight, a warp reading 512 contiguous bytes of a
// row) and one activation chunk per row that serves all CB columns. Lane partial sums are reduced by a reduce-scatter
// butterfly (a lane ends with one of the R x CB sums), warps sharing a column group through shared memory.
// Products are fp32 like the other kernels (exact up to summation order).
template <QuantFormat F>
constexpr int kStChunk = F == QuantFormat::kMXFP4 ? 32 : 16;  // weights per 16-byte chunk
constexpr int kStWarps = 8;

// v[0..V) of every lane -> the lane's return value is the sum over the warp of v[idx], idx = (lane >> (5 - log2 V))
// ... spelled out: each halving step with xor mask m keeps the upper half on lanes with (lane & m).
template <int V>
__device__ __forceinline__ float reduce_scatter(float (&v)[V], int lane) {
  static_assert(V >= 1 && V <= 32 && (V & (V - 1)) == 0, "V must be a power of two <= 32");
  int m = 16;
#pragma unroll
  for (int h = V / 2; h >= 1; h /= 2, m >>= 1) {
    const bool upper = lane & m;
#pragma unroll
    for (int i = 0; i < h; ++i) {
      const float send = upper ? v[i] : v[i + h];
      const float keep = upper ? v[i + h] : v[i];
      v[i] = keep + __shfl_xor_sync(0xffffffffu, send, m);
    }
  }
  float r = v[0];
#pragma unroll
  for (; m >= 1; m >>= 1) r += __shfl_xor_sync(0xffffffffu, r, m);
  return r;
}
// Which of the V sums lane `lane` holds after reduce_scatter<V>.
template <int V>
__device__ __forceinline__ int reduce_scatter_index(int lane) {
  int idx = 0, m = 16;
#pragma unroll
  for (int h = V / 2; h >= 1; h /= 2, m >>= 1)
    if (lane & m) idx += h;
  return idx;
}

// One lane's 16-byte chunk `kc` of the CB weight rows starting at `wcol` (row stride `row_chunks`), and its scales.
template <QuantFormat F, int CB>
struct StreamChunk {
  static constexpr int kScales = F == QuantFormat::kFP8Block ? 1 : CB;
  uint4 q[CB];
  float sc[kScales];

  __device__ __forceinline__ void load(const GemmKernelParams& p, const uint4* wcol, const void* s, int64_t n0,
                                       int64_t row_chunks, int64_t chunks, int64_t kc) {
#pragma unroll
    for (int c = 0; c < CB; ++c) q[c] = n0 + c < p.n ? __ldg(wcol + c * row_chunks + kc) : make_uint4(0, 0, 0, 0);
    if constexpr (F == QuantFormat::kFP8Block) {
      // FP8 128x128 / 32x32 blocks: the CB columns share one scale block (the host checked block_n % CB == 0).
      sc[0] = block_scale(s, p, F, min(n0, p.n - 1), kc * kStChunk<F>);
    } else {
#pragma unroll
      for (int c = 0; c < CB; ++c) {
        const int64_t n = n0 + c;
        if constexpr (F == QuantFormat::kMXFP4)
          sc[c] = n < p.n ? e8m0_to_f32_dev(static_cast<const uint8_t*>(s)[n * chunks + kc]) * kFp4Unscale : 0.0f;
        else
          sc[c] = n < p.n ? block_scale(s, p, F, n, kc * kStChunk<F>) : 0.0f;
      }
    }
  }
};

// Grid: x = column blocks of `groups` groups of CB columns, y = group slots; block = groups x wk warps, the wk
// warps of a group splitting K. A lane's step is KS chunks (kc, kc + 32 wk, ...) of its CB rows, all loads issued
// before any math; the first step's loads go out before anything that depends on other loads (the MoE's row
// offsets and gathered A rows), so they are in flight while those resolve. KS = 2 with CB = 4 keeps the bytes in
// flight of CB = 8 at fewer registers (3 blocks per SM instead of 2).
template <QuantFormat F, int R, int CB, int KS>
__global__ void __launch_bounds__(kStWarps * 32, KS == 2 ? 3 : 2) gemm_stream_kernel(GemmKernelParams p, int wk) {
  constexpr int V = R * CB, kChunk = kStChunk<F>;
  __shared__ float part[kStWarps][V];
  int g = 0;
  if (p.group_offsets) {
    if (static_cast<int>(blockIdx.y) >= p.active_groups[p.groups]) return;
    g = p.active_groups[blockIdx.y];
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int groups = static_cast<int>(blockDim.x) / (32 * wk), cg = warp / wk, kw = warp % wk;
  const int64_t n0 = (static_cast<int64_t>(blockIdx.x) * groups + cg) * CB;
  const void* b = p.b_table ? p.b_table[g] : p.b;
  const void* s = p.b_scale_table ? p.b_scale_table[g] : p.b_scale;
  const int64_t chunks = p.k / kChunk, row_chunks = (F == QuantFormat::kMXFP4 ? p.k / 2 : p.k) / 16;
  // Column n0's row; warps past the last column (last block) stay in bounds and never write their sums.
  const uint4* wcol = reinterpret_cast<const uint4*>(b) + min(n0, p.n - 1) * row_chunks;
  const int64_t kc0 = kw * 32 + lane, stride = wk * 32;
  // A step covers KS chunks per lane (kc, kc + stride, ...), all loads issued before any math.
  StreamChunk<F, CB> cur[KS];
#pragma unroll
  for (int j = 0; j < KS; ++j)
    if (kc0 + j * stride < chunks) cur[j].load(p, wcol, s, n0, row_chunks, chunks, kc0 + j * stride);
  const int64_t begin = p.group_offsets ? p.group_offsets[g] : 0, end = p.group_offsets ? p.group_offsets[g + 1] : p.m;
  for (int64_t r0 = begin; r0 < end; r0 += R) {
    const float* arow[R];
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const int64_t r = r0 + i;
      arow[i] = r < end ? p.a + (p.a_rows ? p.a_rows[r] / p.a_row_div : r) * p.lda : nullptr;
    }
    float acc[R][CB] = {};
    for (int64_t kc_step = kc0; kc_step < chunks; kc_step += KS * stride) {
      // Later steps (and further passes of rows) load here; prefetching them as well spills registers.
      if (kc_step != kc0 || r0 != begin) {
#pragma unroll
        for (int j = 0; j < KS; ++j)
          if (kc_step + j * stride < chunks) cur[j].load(p, wcol, s, n0, row_chunks, chunks, kc_step + j * stride);
      }
#pragma unroll
      for (int js = 0; js < KS; ++js) {
        const int64_t kc = kc_step + js * stride;
        if (kc >= chunks) break;
#pragma unroll
        for (int h = 0; h < kChunk / 8; ++h) {
          float4 a[R][2];
#pragma unroll
          for (int i = 0; i < R; ++i) {
            if (!arow[i]) continue;
            const float4* a4 = reinterpret_cast<const float4*>(arow[i] + kc * kChunk + h * 8);
            a[i][0] = a4[0];
            a[i][1] = a4[1];
          }
#pragma unroll
          for (int c = 0; c < CB; ++c) {
            float w[8];
            const uint32_t words[4] = {cur[js].q[c].x, cur[js].q[c].y, cur[js].q[c].z, cur[js].q[c].w};
            if constexpr (F == QuantFormat::kMXFP4)
              decode_fp4x8_pairs(words[h], w);
            else
              decode_fp8x8(words[2 * h], words[2 * h + 1], w);
#pragma unroll
            for (int i = 0; i < R; ++i) {
              if (!arow[i]) continue;
              float d = 0.0f;
#pragma unroll
              for (int j = 0; j < 2; ++j)
                d = fmaf(
                    a[i][j].x, w[4 * j],
                    fmaf(a[i][j].y, w[4 * j + 1], fmaf(a[i][j].z, w[4 * j + 2], fmaf(a[i][j].w, w[4 * j + 3], d))));
              acc[i][c] = fmaf(d, cur[js].sc[F == QuantFormat::kFP8Block ? 0 : c], acc[i][c]);
            }
          }
        }
      }
    }
    float flat[V];
#pragma unroll
    for (int i = 0; i < R; ++i)
#pragma unroll
      for (int c = 0; c < CB; ++c) flat[i * CB + c] = acc[i][c];
    const float sum = reduce_scatter<V>(flat, lane);
    const int idx = reduce_scatter_index<V>(lane);
    const bool owner = (lane & (32 / V - 1)) == 0;  // one lane per sum
    if (wk == 1) {
      const int64_t r = r0 + idx / CB, n = n0 + idx % CB;
      if (owner && r < end && n < p.n) p.c[(p.c_rows ? p.c_rows[r] : r) * p.ldc + n] = sum;
    } else {
      if (owner) part[warp][idx] = sum;
      __syncthreads();
      const int t = threadIdx.x;
      if (t < groups * V) {
        const int gi = t / V, j = t % V;
        float total = 0.0f;
        for (int w = 0; w < wk; ++w) total += part[gi * wk + w][j];
        const int64_t r = r0 + j / CB, n = (static_cast<int64_t>(blockIdx.x) * groups + gi) * CB + j % CB;
        if (r < end && n < p.n) p.c[(p.c_rows ? p.c_rows[r] : r) * p.ldc + n] = total;
      }
      __syncthreads();
    }
  }
}

// Warps per column group: enough that one pass of 32 lanes per warp covers K (at most kStWarps); as many groups
// as fit kStWarps warps share a block.
inline int stream_warps_per_group(int64_t chunks, int ks) {
  return static_cast<int>(std::clamp<int64_t>(ceil_div(chunks, 32 * ks), 1, kStWarps));
}

template <QuantFormat F, int R, int CB, int KS = 1>
void launch_stream(const GemmKernelParams& p, int64_t slots, cudaStream_t stream) {
  const int wk = stream_warps_per_group(p.k / kStChunk<F>, KS), groups = kStWarps / wk;
  const dim3 grid(static_cast<unsigned>(ceil_div(p.n, static_cast<int64_t>(groups) * CB)),
                  static_cast<unsigned>(slots));
  gemm_stream_kernel<F, R, CB, KS><<<grid, groups * wk * 32, 0, stream>>>(p, wk);
}

// The most rows per group that take the tensor-core streaming kernel (GemmChoices::stream_mma_max_rows).
int64_t stream_mma_max_rows(const GemmKernelParams& p) {
  return p.choices.stream_mma_max_rows >= 0 ? p.choices.stream_mma_max_rows : kGemmStreamMmaMaxRows;
}

template <QuantFormat F>
void launch_fast(const GemmKernelParams& p, bool vec, cudaStream_t stream) {
  const int64_t rows = p.rows_hint > 0 ? p.rows_hint : p.m;
  if constexpr (F != QuantFormat::kFloat) {
    // Few rows per weight in a block format with UE8M0 scales: stream the weights through the tensor cores.
    if (rows <= stream_mma_max_rows(p) && run_gemm_stream_mma(p, rows, stream)) return;
    // Dense calls of 9-64 rows: all rows in one pass over the weights.
    if (run_gemm_rows_mma(p, stream)) return;
  }
  const bool mma_rows = p.a_bf16 && p.group_offsets && rows >= kGemmMmaMinRows;
  // bf16 weights: only the streaming kernel's vector path and the mma.sync kernel read them.
  DI_CHECK_INTERNAL(!p.b_bf16 || (F == QuantFormat::kFloat && vec && (rows <= kGemmSkinnyRows || p.a_bf16)))
      << "gemm: bf16 weights need vector-aligned rows, and a bf16 A past " << kGemmSkinnyRows << " rows a group";
  if (rows <= kGemmSkinnyRows && !mma_rows) {
    const int64_t slots = p.group_offsets ? std::min<int64_t>(p.groups, p.m) : 1;
    DI_CHECK(!p.group_offsets || p.active_groups) << "gemm: grouped skinny launch needs active_groups";
    if constexpr (F != QuantFormat::kFloat) {
      if (vec && (F != QuantFormat::kFP8Block ||
                  p.block_n % 8 == 0)) {  // block formats with 16-byte chunks: the column-group kernel
        const int64_t y = std::max<int64_t>(slots, 1);
        // One row: MXFP4 takes two chunks of 4 columns per lane at 80 registers (3 blocks per SM; ncu, same run:
        // 47.1 -> 41.5 us a V4.1 expert call), FP8 one chunk of 8 columns (9.4 us vs 9.8 the other way).
        if (rows <= 1 && F == QuantFormat::kMXFP4)
          launch_stream<F, 1, 4, 2>(p, y, stream);
        else if (rows <= 1)
          launch_stream<F, 1, 8>(p, y, stream);
        else if (rows <= 2)
          launch_stream<F, 2, 8>(p, y, stream);
        else
          launch_stream<F, 4, 4>(p, y, stream);
        return;
      }
    }
    const dim3 grid(static_cast<unsigned>(ceil_div(p.n, kSkWarps)), static_cast<unsigned>(std::max<int64_t>(slots, 1)));
    if (rows <= kSkRowsNarrow) {
      if (vec)
        gemm_skinny_kernel<F, true, kSkRowsNarrow><<<grid, kSkWarps * 32, 0, stream>>>(p);
      else
        gemm_skinny_kernel<F, false, kSkRowsNarrow><<<grid, kSkWarps * 32, 0, stream>>>(p);
    } else if (vec) {
      gemm_skinny_kernel<F, true, kSkRowsWide><<<grid, kSkWarps * 32, 0, stream>>>(p);
    } else {
      gemm_skinny_kernel<F, false, kSkRowsWide><<<grid, kSkWarps * 32, 0, stream>>>(p);
    }
  } else {
    if (run_gemm_wgmma(p, stream)) return;  // Hopper: warpgroup MMA with a decoding producer (gemm_wgmma.h)
    if (run_gemm_mma(p, stream)) return;    // with a bf16 A and 32-wide K steps: the pipelined mma.sync kernel
    DI_CHECK_INTERNAL(!p.b_bf16) << "gemm: bf16 weights of " << rows << " rows a group need K % 32 == 0";
    run_gemm_tc(p, vec, stream);
  }
}

}  // namespace

// Vector loads: 16-byte weight chunks never straddle a row or a scale block, A rows are float4-aligned.
bool gemm_vector_ok(const GemmKernelParams& p, bool check_a) {
  const auto aligned = [](const void* q, int64_t a) { return reinterpret_cast<uintptr_t>(q) % a == 0; };
  bool vec = (!check_a || (p.lda % 4 == 0 && aligned(p.a, 16))) && (p.b_table ? p.tables_aligned16 : aligned(p.b, 16));
  if (p.format == QuantFormat::kMXFP4) return vec && p.k % 32 == 0;
  return vec && p.k % 16 == 0 && (p.format != QuantFormat::kFP8Block || p.block_k % 16 == 0);
}

void run_gemm_simt(const GemmKernelParams& p, bool vec, cudaStream_t stream) {
  with_format(p.format, [&](auto f) { launch_simt<decltype(f)::value>(p, vec, stream); });
}

// Asked per launch (the runtime answers from its cached properties; no process-wide cache, so a process driving GPUs
// of different sizes gets each one's count).
int device_sm_count() {
  int dev = 0, v = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
    v = 0;
  return v > 0 ? v : 132;
}

void run_gemm(const GemmKernelParams& p, cudaStream_t stream) {
  if (p.m == 0 || p.n == 0) return;
  DI_CHECK_INTERNAL(!p.b_bf16 || (p.format == QuantFormat::kFloat && !p.batch_invariant))
      << "gemm: bf16 weights are kFloat, outside batch-invariant mode";
  if (p.batch_invariant) {
    if (run_gemm_invariant_mma(p, stream)) return;
    if (run_gemm_invariant_f32_split(p, stream)) return;
    run_gemm_chains(p, gemm_vector_ok(p, true), stream);
    DI_CUDA_CHECK_LAUNCH();
    return;
  }
  const bool vec = gemm_vector_ok(p, true);
  // Block formats, and f32 weights with few rows (decode, MoE at small batch: stream the f32 weight once; the SIMT
  // tile reads it at a tenth of the bandwidth, 64-row tiles with one row used: 296 us for a 4-expert decode GEMM on
  // the H200), take the fast kernels; f32 weights with many rows the SIMT tile.
  if (p.format != QuantFormat::kFloat || p.b_bf16 || (p.rows_hint > 0 ? p.rows_hint : p.m) <= kGemmSkinnyRows)
    with_format(p.format, [&](auto f) { launch_fast<decltype(f)::value>(p, vec, stream); });
  else
    launch_simt<QuantFormat::kFloat>(p, vec, stream);
  DI_CUDA_CHECK_LAUNCH();
}

}  // namespace deepinfer::cuda
