// The FP8 GEMM (gemm_wgmma_fp8_cuda.cu): MXFP4 or FP8-block weights times MXFP8 activations on Hopper's FP8 tensor
// cores, for --activation-quant mxfp8 (the reference's numerics: every GEMM input over such a weight rounded to e4m3
// per 32 values with a UE8M0 scale). The bf16 paths run the same products from bf16 copies at half the rate or less.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "deepinfer/ops/cuda/kernels.h"

namespace deepinfer::cuda {

// C = A · dequant(B)ᵀ with A = p.a_e4m3 · 2^(p.a_scale - 127) per 32 values and B either MXFP4 (p.b / p.b_table)
// folded by p.b_fold, or FP8 blocks of 128 x 128 with UE8M0 scales: what run_gemm takes for those formats, dense or
// grouped, with K % 128 == 0, lda % 128 == 0, 16-byte aligned codes and weights, 4-byte aligned activation scales, not
// batch-invariant, on sm_90, when p.choices.wgmma_fp8 is kAlways (opt-in for now). Returns false, enqueuing nothing,
// otherwise.
//
// With p.a_scale_block128 (--activation-quant fp8, the V3 family): A's scales are f32 per 128 values and the weights
// FP8 blocks of 128 x 128 with f32 scales; a step's 128 products are summed by the tensor core and promoted once.
//
// Numerics: each k32 block's 32 products summed by the tensor core (e4m3 x e4m3 products are exact; the hardware's
// sum keeps fewer bits than fp32: measured by CudaOpTest.WgmmaE4m3TileMatchesExactSums), then added into fp32 times
// the row's activation scale, the weight row's factor applied once at the end (exact: a power of two).
bool gemm_wgmma_fp8_takes(const GemmKernelParams& p);
// The weight half of that rule, for a dense FP8-block weight of K columns (block n x k, UE8M0 scales or not): what a
// caller can decide before its activation codes exist.
bool gemm_wgmma_fp8_block_weight_takes(QuantFormat format, bool scale_e8m0, int64_t block_n, int64_t block_k,
                                       int64_t k);
// The same for the V3 family's form (p.a_scale_block128): FP8 blocks of 128 x 128 with f32 scales.
bool gemm_wgmma_fp8_block128_weight_takes(QuantFormat format, bool scale_e8m0, int64_t block_n, int64_t block_k,
                                          int64_t k);
bool run_gemm_wgmma_fp8(const GemmKernelParams& p, cudaStream_t stream);

// The fold exponents of MXFP4 weights for the FP8 GEMM (fp8::fold_row, one warp a row): refs[g·n + r] = row r of
// group g's E; rows whose nonzero blocks span more than fp8::kFoldSpan binades (not exact in e4m3) are counted into
// *misfits (added to: zero it first). Weights of `groups` matrices [n, k] (k % 32 == 0, rows 16-byte aligned).
struct Mxfp4FoldKernelParams {
  const void* const* codes = nullptr;   // [groups] device pointers to [n, k / 2] e2m1 bytes
  const void* const* scales = nullptr;  // [groups] device pointers to [n, k / 32] UE8M0 bytes
  int groups = 0;
  int64_t n = 0, k = 0;
  uint8_t* refs = nullptr;      // [groups, n]
  unsigned* misfits = nullptr;  // one counter
};
void run_mxfp4_fold(const Mxfp4FoldKernelParams& p, cudaStream_t stream);

}  // namespace deepinfer::cuda
