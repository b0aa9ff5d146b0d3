// The block-dequantizing GEMM: C = A · dequant(B)ᵀ with B in any QuantFormat (f32, FP8 e4m3 with UE8M0/f32
// block scales of any block shape, MXFP4, FP8 per-32 rows), dense or grouped by expert (MoE).
//
// This is the correct-first version: a 64x64x16 SIMT tile with fp32 FMAs, weights dequantized while they
// are staged into shared memory. It is exact against the CPU up to summation order, which makes it the
// reference for faster variants. Where cuBLASLt covers the format (f32, bf16) the backend uses cuBLASLt
// instead; a wgmma (sm_90a) FP8 variant with the same params is the next step (docs/PERF.md).
#include "deepinfer/ops/cuda/device_math.cuh"
#include "deepinfer/ops/cuda/kernels.h"

namespace deepinfer::cuda {
namespace {

constexpr int kBM = kGemmTileM, kBN = 64, kBK = 16, kThreads = 256;

template <QuantFormat F>
__device__ __forceinline__ float load_weight(const void* b, const void* s, const GemmKernelParams& p, int64_t n,
                                             int64_t k) {
  if constexpr (F == QuantFormat::kFloat) {
    return static_cast<const float*>(b)[n * p.k + k];
  } else if constexpr (F == QuantFormat::kMXFP4) {
    const uint8_t byte = static_cast<const uint8_t*>(b)[n * (p.k / 2) + k / 2];
    return e2m1_to_f32_dev((k & 1) ? (byte >> 4) : (byte & 0xF)) *
           e8m0_to_f32_dev(static_cast<const uint8_t*>(s)[n * (p.k / 32) + k / 32]);
  } else {
    const int64_t si = F == QuantFormat::kFP8Block ? (n / p.block_n) * p.scale_cols + k / p.block_k
                                                   : n * p.scale_cols + k / 32;
    const float scale = p.scale_e8m0 ? e8m0_to_f32_dev(static_cast<const uint8_t*>(s)[si])
                                     : static_cast<const float*>(s)[si];
    return e4m3_to_f32_dev(static_cast<const uint8_t*>(b)[n * p.k + k]) * scale;
  }
}

template <QuantFormat F>
__global__ void __launch_bounds__(kThreads) gemm_kernel(GemmKernelParams p) {
  __shared__ float as[kBK][kBM + 4];
  __shared__ float bs[kBK][kBN + 4];
  __shared__ int64_t a_row[kBM], c_row[kBM];

  // Which rows this block owns: a plain M tile, or a tile of one expert's gathered rows.
  const int64_t tile_m = blockIdx.x;
  int g = 0;
  int64_t row_begin, row_end;
  if (p.group_offsets) {
    if (tile_m >= p.tile_offsets[p.groups]) return;
    int lo = 0, hi = p.groups;  // largest g with tile_offsets[g] <= tile_m (its group has tiles left)
    while (hi - lo > 1) {
      const int mid = (lo + hi) / 2;
      if (p.tile_offsets[mid] <= tile_m) lo = mid;
      else hi = mid;
    }
    g = lo;
    row_begin = p.group_offsets[g] + (tile_m - p.tile_offsets[g]) * kBM;
    row_end = p.group_offsets[g + 1];
  } else {
    row_begin = tile_m * kBM;
    row_end = p.m;
  }
  const void* b = p.b_table ? p.b_table[g] : p.b;
  const void* s = p.b_scale_table ? p.b_scale_table[g] : p.b_scale;
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * kBN;

  const int tid = threadIdx.x;
  if (tid < kBM) {
    const int64_t i = row_begin + tid;
    const bool valid = i < row_end;
    a_row[tid] = !valid ? -1 : (p.a_rows ? p.a_rows[i] / p.a_row_div : i);
    c_row[tid] = !valid ? -1 : (p.c_rows ? p.c_rows[i] : i);
  }
  __syncthreads();

  const int tx = tid % 16, ty = tid / 16;
  float acc[4][4] = {};
  for (int64_t k0 = 0; k0 < p.k; k0 += kBK) {
#pragma unroll
    for (int e = 0; e < (kBM * kBK) / kThreads; ++e) {
      const int idx = tid + e * kThreads, r = idx / kBK, kk = idx % kBK;
      const int64_t k = k0 + kk;
      const int64_t ar = a_row[r];
      as[kk][r] = (ar >= 0 && k < p.k) ? p.a[ar * p.lda + k] : 0.0f;
      const int64_t n = n0 + r;  // kBN == kBM: the same mapping stages B
      bs[kk][r] = (n < p.n && k < p.k) ? load_weight<F>(b, s, p, n, k) : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kBK; ++kk) {
      float av[4], bv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) av[i] = as[kk][ty * 4 + i];
#pragma unroll
      for (int j = 0; j < 4; ++j) bv[j] = bs[kk][tx * 4 + j];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t cr = c_row[ty * 4 + i];
    if (cr < 0) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t n = n0 + tx * 4 + j;
      if (n < p.n) p.c[cr * p.ldc + n] = acc[i][j];
    }
  }
}

}  // namespace

void run_gemm(const GemmKernelParams& p, cudaStream_t stream) {
  static_assert(kBN == kBM, "the staging loop maps A rows and B rows the same way");
  const int64_t tiles_m = p.group_offsets ? p.max_tiles_m : ceil_div(p.m, kBM);
  const int64_t tiles_n = ceil_div(p.n, kBN);
  if (tiles_m == 0 || tiles_n == 0) return;
  DI_CHECK(tiles_n <= 65535) << "gemm: n = " << p.n << " is too large for one launch";
  const dim3 grid(static_cast<unsigned>(tiles_m), static_cast<unsigned>(tiles_n));
  switch (p.format) {
    case QuantFormat::kFloat: gemm_kernel<QuantFormat::kFloat><<<grid, kThreads, 0, stream>>>(p); break;
    case QuantFormat::kFP8Block: gemm_kernel<QuantFormat::kFP8Block><<<grid, kThreads, 0, stream>>>(p); break;
    case QuantFormat::kMXFP4: gemm_kernel<QuantFormat::kMXFP4><<<grid, kThreads, 0, stream>>>(p); break;
    case QuantFormat::kFP8Row32: gemm_kernel<QuantFormat::kFP8Row32><<<grid, kThreads, 0, stream>>>(p); break;
  }
  DI_CUDA_CHECK_LAUNCH();
}

}  // namespace deepinfer::cuda
