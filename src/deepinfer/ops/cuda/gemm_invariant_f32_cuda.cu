// Batch-invariant GEMMs of small f32 weights as K-sliced fp32 chains (gemm_invariant_f32.h).
//
// Why: the unsliced chain of batch-invariant mode is K dependent FMAs per output (~4 cycles each), and a router's
// few hundred columns give the column-chain kernel 8-12 blocks and the SIMT tile one or two: the V4-Flash slice's
// router took 0.245 ms a decode step at batch 1 (0.037 default) and 1.64 ms at batch 64 (0.07). Slicing K into
// fixed pieces (by K alone) keeps each output's arithmetic independent of the call and puts one warp on each slice.
#include "deepinfer/ops/cuda/gemm_invariant_f32.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "deepinfer/ops/cuda/cuda_check.h"
#include "deepinfer/ops/cuda/device_math.cuh"

namespace deepinfer::cuda {
namespace {

constexpr int kSpCols = 32, kSpMaxSlices = 8, kSpRows = 8;  // columns a block (a lane each), slices, rows a pass

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
  const int64_t k4 = p.k / 4, kb = k4 * warp / slices * 4, ke = k4 * (warp + 1) / slices * 4;
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
#pragma unroll 4
    for (int64_t k = kb; k < ke; k += 4) {
      const float4 wv = __ldg(reinterpret_cast<const float4*>(w + k));
#pragma unroll
      for (int i = 0; i < kR; ++i) {
        float4 av;
        if constexpr (kVecA) {
          av = __ldg(reinterpret_cast<const float4*>(a[i] + k));
        } else {
          av = make_float4(__ldg(a[i] + k), __ldg(a[i] + k + 1), __ldg(a[i] + k + 2), __ldg(a[i] + k + 3));
        }
        acc[i] = fmaf(av.x, wv.x, acc[i]);
        acc[i] = fmaf(av.y, wv.y, acc[i]);
        acc[i] = fmaf(av.z, wv.z, acc[i]);
        acc[i] = fmaf(av.w, wv.w, acc[i]);
      }
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

bool ab_bi_fp32() {
  const char* v = std::getenv("DEEPINFER_AB_BI_FP32");
  return v && std::strcmp(v, "1") == 0;
}

}  // namespace

int gemm_invariant_f32_slices(int64_t k) { return static_cast<int>(std::clamp<int64_t>(k / 512, 1, kSpMaxSlices)); }

bool gemm_invariant_f32_split_takes(int64_t n, int64_t k) {
  return !ab_bi_fp32() && n > 0 && n <= kInvariantF32SplitMaxN && k > 0 && k % 4 == 0;
}

bool run_gemm_invariant_f32_split(const GemmKernelParams& p, cudaStream_t stream) {
  if (!p.batch_invariant || p.format != QuantFormat::kFloat || p.group_offsets || p.b_table) return false;
  if (!gemm_invariant_f32_split_takes(p.n, p.k) || reinterpret_cast<uintptr_t>(p.b) % 16 != 0) return false;
  if (p.m == 0) return true;
  const int slices = gemm_invariant_f32_slices(p.k);
  // Rows: one pass a block, so that calls of a few tens of rows still spread over the device; launches of at most
  // 65535 row blocks.
  const int64_t rows_per_block = p.m == 1 ? 1 : kSpRows, max_rows = 65535 * rows_per_block;
  const bool vec_a = p.lda % 4 == 0 && reinterpret_cast<uintptr_t>(p.a) % 16 == 0;
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
