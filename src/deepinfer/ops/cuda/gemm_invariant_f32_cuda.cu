// Batch-invariant GEMMs of small f32 weights as K-sliced fp32 chains (gemm_invariant_f32.h).
//
// Why: the unsliced chain of batch-invariant mode is K dependent FMAs per output (~4 cycles each), and a router's
// few hundred columns give the column-chain kernel 8-12 blocks and the SIMT tile one or two: the V4-Flash slice's
// router took 0.245 ms a decode step at batch 1 (0.037 default) and 1.64 ms at batch 64 (0.07). Slicing K into
// fixed pieces (by K alone) keeps each output's arithmetic independent of the call and puts one warp on each slice.
#include "deepinfer/ops/cuda/gemm_invariant_f32.h"

#include <algorithm>

#include "deepinfer/ops/cuda/cuda_check.h"
#include "deepinfer/ops/cuda/device_math.cuh"

namespace deepinfer::cuda {
namespace {

constexpr int kSpCols = 32, kSpMaxSlices = 8, kSpRows = 8;  // columns a block (a lane each), slices, rows a pass

// Where slice w of `slices` ends: k = 4 · floor(K/4 · (w + 1) / slices) (slice w begins where w - 1 ends, slice 0 at
// 0, the last ends at K).
__device__ __forceinline__ int64_t slice_end(int64_t k4, int w, int slices) { return k4 * (w + 1) / slices * 4; }

// Grid: x = column blocks of kSpCols, y = blocks of rows_per_block rows; block = `slices` warps (warp w: slice w).
// Each lane runs its column's chain over its warp's slice for up to kSpRows rows at once (the weight float4 read
// once for all of them), the partials meet in shared memory and are added in slice order.
// kR rows a pass (1 for one-row calls, else kSpRows).
template <bool kVecA, int kR>
__global__ void __launch_bounds__(kSpMaxSlices * 32)
    gemm_f32_split_kernel(GemmKernelParams p, int slices, int64_t rows_per_block, int64_t row_base) {
  __shared__ float part[kSpMaxSlices][kSpRows][kSpCols];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kSpCols + lane, nc = n < p.n ? n : p.n - 1;
  const int64_t k4 = p.k / 4, kb = warp == 0 ? 0 : slice_end(k4, warp - 1, slices), ke = slice_end(k4, warp, slices);
  const float* w = static_cast<const float*>(p.b) + nc * p.k;
  const int64_t r_begin = row_base + static_cast<int64_t>(blockIdx.y) * rows_per_block;
  const int64_t r_end = r_begin + rows_per_block < p.m ? r_begin + rows_per_block : p.m;
  for (int64_t r0 = r_begin; r0 < r_end; r0 += kR) {
    const float* a[kR];
#pragma unroll
    for (int i = 0; i < kR; ++i) {
      const int64_t r = r0 + i < r_end ? r0 + i : r0;  // rows past the block repeat r0 (never written)
      a[i] = p.a + (p.a_rows ? p.a_rows[r] / p.a_row_div : r) * p.lda;
    }
    float acc[kR];
#pragma unroll
    for (int i = 0; i < kR; ++i) acc[i] = 0.0f;
    // Loads of kU quads first, then their FMAs (each row's chain in k order): kU quads of loads in flight a lane
    // (each lane reads its own weight row; one quad at a time, the one-row call was latency-bound).
    constexpr int kU = kR == 1 ? 16 : 2;
    auto quad = [&](const float4& wv, const float4& av, float& acc_i) {
      acc_i = fmaf(av.x, wv.x, acc_i);
      acc_i = fmaf(av.y, wv.y, acc_i);
      acc_i = fmaf(av.z, wv.z, acc_i);
      acc_i = fmaf(av.w, wv.w, acc_i);
    };
    auto load_a = [&](int i, int64_t k) {
      if constexpr (kVecA)
        return __ldg(reinterpret_cast<const float4*>(a[i] + k));
      else
        return make_float4(__ldg(a[i] + k), __ldg(a[i] + k + 1), __ldg(a[i] + k + 2), __ldg(a[i] + k + 3));
    };
    int64_t k = kb;
    for (; k + 4 * kU <= ke; k += 4 * kU) {
      float4 wv[kU], av[kR][kU];
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        wv[u] = __ldg(reinterpret_cast<const float4*>(w + k + 4 * u));
#pragma unroll
        for (int i = 0; i < kR; ++i) av[i][u] = load_a(i, k + 4 * u);
      }
#pragma unroll
      for (int u = 0; u < kU; ++u)
#pragma unroll
        for (int i = 0; i < kR; ++i) quad(wv[u], av[i][u], acc[i]);
    }
    for (; k < ke; k += 4) {
      const float4 wv = __ldg(reinterpret_cast<const float4*>(w + k));
#pragma unroll
      for (int i = 0; i < kR; ++i) quad(wv, load_a(i, k), acc[i]);
    }
#pragma unroll
    for (int i = 0; i < kR; ++i) part[warp][i][lane] = acc[i];
    __syncthreads();
    for (int i = warp; i < kR; i += slices) {
      const int64_t r = r0 + i;
      if (r >= r_end || n >= p.n) continue;
      float sum = part[0][i][lane];
      for (int s = 1; s < slices; ++s) sum += part[s][i][lane];
      p.c[(p.c_rows ? p.c_rows[r] : r) * p.ldc + n] = sum;
    }
    __syncthreads();  // part is rewritten by the next pass
  }
}

// The same outputs for calls of many rows (the router in prefill: the kernel above reads the weight once per 8
// rows): a 64 x 64 SIMT tile, 4 x 4 outputs a thread, K in steps of 16 through shared memory with the next step's
// loads in registers; each thread walks the slices in turn (the chain of slice w from 0, added into the running sum
// at the slice's end: the kernel above's sum in slice order). Slice ends are multiples of 4: checked every 4 k.
constexpr int kStT = 64, kStK = 16, kStLd = kStT + 4;

template <bool kVecA>
__global__ void __launch_bounds__(256) gemm_f32_split_tile_kernel(GemmKernelParams p, int slices, int64_t row_base) {
  __shared__ __align__(16) float as[2][kStK][kStLd];
  __shared__ __align__(16) float ws[2][kStK][kStLd];
  const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
  const int64_t m0 = row_base + static_cast<int64_t>(blockIdx.y) * kStT, n0 = static_cast<int64_t>(blockIdx.x) * kStT;
  // This thread's staging: row / column tid / 4 of the tile, k quad (tid % 4) · 4 of the step.
  const int sr = tid >> 2, sq = (tid & 3) * 4;
  const int64_t ar = m0 + sr, wn = n0 + sr;
  const float* a_src = ar < p.m ? p.a + (p.a_rows ? p.a_rows[ar] / p.a_row_div : ar) * p.lda : nullptr;
  const float* w_src = wn < p.n ? static_cast<const float*>(p.b) + wn * p.k : nullptr;
  float4 av, wv;
  auto load = [&](int64_t k0) {
    const int64_t k = k0 + sq;
    av = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    wv = av;
    if (k < p.k) {  // K % 4 == 0: a quad is all in or all out
      if (a_src) {
        if constexpr (kVecA)
          av = __ldg(reinterpret_cast<const float4*>(a_src + k));
        else
          av = make_float4(__ldg(a_src + k), __ldg(a_src + k + 1), __ldg(a_src + k + 2), __ldg(a_src + k + 3));
      }
      if (w_src) wv = __ldg(reinterpret_cast<const float4*>(w_src + k));
    }
  };
  auto store = [&](int buf) {
    as[buf][sq][sr] = av.x;
    as[buf][sq + 1][sr] = av.y;
    as[buf][sq + 2][sr] = av.z;
    as[buf][sq + 3][sr] = av.w;
    ws[buf][sq][sr] = wv.x;
    ws[buf][sq + 1][sr] = wv.y;
    ws[buf][sq + 2][sr] = wv.z;
    ws[buf][sq + 3][sr] = wv.w;
  };
  float acc[4][4], sum[4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j] = sum[i][j] = 0.0f;
  const int64_t k4 = p.k / 4;
  int w = 0;
  int64_t bound = slice_end(k4, 0, slices);
  auto fold = [&]() {
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        sum[i][j] = w == 0 ? acc[i][j] : sum[i][j] + acc[i][j];
        acc[i][j] = 0.0f;
      }
    ++w;
    bound = w < slices ? slice_end(k4, w, slices) : -1;
  };

  load(0);
  store(0);
  __syncthreads();
  int buf = 0;
  for (int64_t k0 = 0; k0 < p.k; k0 += kStK) {
    const bool more = k0 + kStK < p.k;
    if (more) load(k0 + kStK);
    const int nk = static_cast<int>(p.k - k0 < kStK ? p.k - k0 : kStK);
    for (int q = 0; q < nk; q += 4) {
      while (k0 + q == bound) fold();  // slice ends at this k (never at k = 0: slices hold >= 128 quads)
#pragma unroll
      for (int kk = q; kk < q + 4; ++kk) {
        const float4 a = *reinterpret_cast<const float4*>(&as[buf][kk][ty * 4]);
        const float4 b = *reinterpret_cast<const float4*>(&ws[buf][kk][tx * 4]);
        const float ai[4] = {a.x, a.y, a.z, a.w}, bj[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(ai[i], bj[j], acc[i][j]);
      }
    }
    if (more) store(buf ^ 1);
    __syncthreads();
    buf ^= 1;
  }
  while (w < slices) fold();  // the last slice ends at K
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t r = m0 + ty * 4 + i;
    if (r >= p.m) continue;
    float* crow = p.c + (p.c_rows ? p.c_rows[r] : r) * p.ldc;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t n = n0 + tx * 4 + j;
      if (n < p.n) crow[n] = sum[i][j];
    }
  }
}

}  // namespace

int gemm_invariant_f32_slices(int64_t k) { return static_cast<int>(std::clamp<int64_t>(k / 512, 1, kSpMaxSlices)); }

bool gemm_invariant_f32_split_takes(int64_t n, int64_t k) {
  return n > 0 && n <= kInvariantF32SplitMaxN && k > 0 && k % 4 == 0;
}

bool run_gemm_invariant_f32_split(const GemmKernelParams& p, cudaStream_t stream) {
  if (!p.batch_invariant || p.format != QuantFormat::kFloat || p.group_offsets || p.b_table) return false;
  if (!gemm_invariant_f32_split_takes(p.n, p.k) || reinterpret_cast<uintptr_t>(p.b) % 16 != 0) return false;
  if (p.m == 0) return true;
  const int slices = gemm_invariant_f32_slices(p.k);
  const bool vec_a = p.lda % 4 == 0 && reinterpret_cast<uintptr_t>(p.a) % 16 == 0;
  if (p.m >= kInvariantF32TileRows) {
    for (int64_t base = 0; base < p.m; base += 65535ll * kStT) {
      const dim3 grid(static_cast<unsigned>(ceil_div(p.n, kStT)),
                      static_cast<unsigned>(ceil_div(std::min<int64_t>(p.m - base, 65535ll * kStT), kStT)));
      if (vec_a)
        gemm_f32_split_tile_kernel<true><<<grid, 256, 0, stream>>>(p, slices, base);
      else
        gemm_f32_split_tile_kernel<false><<<grid, 256, 0, stream>>>(p, slices, base);
      DI_CUDA_CHECK_LAUNCH();
    }
    return true;
  }
  // Rows: one pass a block, so that calls of a few tens of rows still spread over the device; launches of at most
  // 65535 row blocks.
  const int64_t rows_per_block = p.m == 1 ? 1 : kSpRows, max_rows = 65535 * rows_per_block;
  for (int64_t base = 0; base < p.m; base += max_rows) {
    const int64_t row_blocks = ceil_div(std::min(p.m - base, max_rows), rows_per_block);
    const dim3 grid(static_cast<unsigned>(ceil_div(p.n, kSpCols)), static_cast<unsigned>(row_blocks));
    if (p.m == 1 && vec_a)
      gemm_f32_split_kernel<true, 1><<<grid, slices * 32, 0, stream>>>(p, slices, rows_per_block, base);
    else if (p.m == 1)
      gemm_f32_split_kernel<false, 1><<<grid, slices * 32, 0, stream>>>(p, slices, rows_per_block, base);
    else if (vec_a)
      gemm_f32_split_kernel<true, kSpRows><<<grid, slices * 32, 0, stream>>>(p, slices, rows_per_block, base);
    else
      gemm_f32_split_kernel<false, kSpRows><<<grid, slices * 32, 0, stream>>>(p, slices, rows_per_block, base);
    DI_CUDA_CHECK_LAUNCH();
  }
  return true;
}

}  // namespace deepinfer::cuda
