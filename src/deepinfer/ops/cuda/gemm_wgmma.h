// The Hopper warpgroup-MMA GEMM for block-format weights and many rows (gemm_wgmma_cuda.cu), behind run_gemm ahead
// of the mma.sync kernel (gemm_mma.h), with the same contract and numerics.
#pragma once

#include <cuda_runtime.h>

#include "deepinfer/ops/cuda/kernels.h"

namespace deepinfer::cuda {

// C = A · dequant(B)ᵀ through wgmma.mma_async (sm_90a) when p allows it (gemm_wgmma_takes): what run_gemm_mma takes,
// with K % 64 == 0, and (grouped) at least kGemmWgmmaMinRows rows per group by rows_hint; dense calls whose tiles do
// not fill the device only split along K, with p.split_part. Returns false, enqueuing nothing, otherwise (and always
// when p.choices.wgmma is kNever; kAlways also takes grouped calls below kGemmWgmmaMinRows rows). bf16 weights
// (p.b_bf16, grouped only) are copied rather than decoded, over A's hi and lo terms when p.a_lo_bf16 is given.
bool run_gemm_wgmma(const GemmKernelParams& p, cudaStream_t stream);

// Split-K for dense decode batches, opt-in (GemmChoices::wgmma_split_k = kAlways; quant_linear at 9-128 rows: the
// projections' weights read once, where the cuBLASLt path reads the FP8 weight, writes and reads back a bf16 copy).
// Measured slower than that path on the H200 (session 21: ~16 us a call, latency-bound, plus ~5 us of reduce). A dense
// call of T = ceil(m / 128) · ceil(n / 256) tiles below one wave of `sms` blocks runs each tile as S blocks over
// consecutive k-step ranges: S = min(sms / T, k-steps / 4, 16), 1 (no split) when that is below 2 or T >= sms. Each
// split writes its partial [m, n] product to p.split_part; a second kernel sums the S partials in split order into C
// (deterministic: the same sums for the same shape).
int wgmma_dense_splits(int64_t m, int64_t n, int64_t k, int sms);
// The splits S for a dense call p on a device of sm_count SMs when it does not fill the device and would be split
// (the caller then sets p.k_splits = S and p.split_part to S · m · n floats); 1 when run_gemm_wgmma does not split it
// (grouped, C rows scattered, f32 scales or wgmma_exact, a forced tile or decode placement, wgmma_split_k other than
// kAlways, or no sm_90 device).
int gemm_wgmma_k_splits(const GemmKernelParams& p, int sm_count);

// Whether the current device is sm_90 (the wgmma kernels are built for sm_90a; another device never takes them).
bool device_is_sm90();

// Rows per group (rows_hint) from which grouped GEMMs take this kernel: its tiles are 128 rows, twice gemm_mma's.
constexpr int64_t kGemmWgmmaMinRows = 32;

// The block tile: 128 token rows x 256 weight rows (output columns), or 256 x 128, which decodes each weight row
// once for up to 256 rows of an expert instead of once per 128 rows. Measured (H200, PrefillExpertGemmTimings, one
// launch of either): 256 x 128 1.16x faster at V4-Flash's ~192 rows an expert (8192 tokens), 1.18x slower at V4.1's
// ~128 and 1.6x slower at ~96: its step costs ~0.86 of two 128-row tiles' steps but ~1.7 of one. So grouped calls of
// at least kGemmWgmmaMixedRows rows per group (rows_hint) run mixed: per group, each pair of 128-row blocks as one
// 256-row tile and an unpaired last block (<= 128 rows) as a 128-row tile, in two launches (256 x 128, then 128 x 256
// for the leftovers); skewed groups (some < 128 or in 257-384 rows) no longer pay for the tall tile. Dense FP8-block
// calls of at least kGemmWgmmaDenseTallRows rows that fill the device take 256 x 128 (session 29, H200, the V4-Flash
// shared expert at 8192 rows: gate 0.439 -> 0.304 ms, down 0.442 -> 0.314 with the split decode the tall FP8 tile
// takes); other dense calls 128 x 256. The same bytes either way. Mixed won the slice prefill (H200,
// session 15, V4-Flash 8192 tokens: 64.9 ms against 67.5 with 128 x 256 only and 68.0 with 256 x 128 only; V4.1 158.0
// vs 163.3).
// p.choices.wgmma_tile other than kByRows forces a tile (kMixed: mixed for grouped calls, 128 x 256 for dense ones).
constexpr int64_t kGemmWgmmaMixedRows = 120;
// Up to 255 rows of the tall tile's last row block are idle: from 1024 rows at most a fifth of its rows (measured at
// 1024 on the H100, session 29: the shared gate 0.108 -> 0.074 ms, down 0.061 -> 0.045).
constexpr int64_t kGemmWgmmaDenseTallRows = 1024;
WgmmaTile wgmma_tile(const GemmKernelParams& p);

}  // namespace deepinfer::cuda
