// The Hopper warpgroup-MMA GEMM for block-format weights and many rows (gemm_wgmma_cuda.cu), behind run_gemm ahead
// of the mma.sync kernel (gemm_mma.h), with the same contract and numerics.
#pragma once

#include <cuda_runtime.h>

#include "deepinfer/ops/cuda/kernels.h"

namespace deepinfer::cuda {

// C = A · dequant(B)ᵀ through wgmma.mma_async (sm_90a) when p allows it: what run_gemm_mma takes, with K % 64 == 0,
// and (grouped) at least kGemmWgmmaMinRows rows per group by rows_hint. Returns false, enqueuing nothing, otherwise
// (and always when the A/B switch below turns it off).
bool run_gemm_wgmma(const GemmKernelParams& p, cudaStream_t stream);

// Rows per group (rows_hint) from which grouped GEMMs take this kernel: its tiles are 128 rows, twice gemm_mma's.
constexpr int64_t kGemmWgmmaMinRows = 32;

// Temporary A/B switch DEEPINFER_AB_WGMMA (read per call, so one process can compare), comma-separated words: "0" =
// never (run_gemm falls back to gemm_mma in the same build); "exact" = decode the weights through f32 like gemm_mma
// instead of the bf16x2 integer decode (same values for UE8M0 scales; the f32 path is always used for f32 scales);
// "all" = also below kGemmWgmmaMinRows rows per group; "noswz" = the no-swizzle shared-memory layout instead of the
// 128-byte swizzle (a diagnostic); "persist" = one block per SM walking the tiles instead of one block per tile;
// "nosplit" / "split" / "cdec" = the weights decoded by the producer warpgroup / half by the producer and half by the
// consumer warpgroups (one step ahead of their products) / all by the consumers (default: split for MXFP4, the
// producer for FP8; bf16x2 decode only). Unset or other words: the defaults.
struct WgmmaMode {
  bool on = true, exact = false, all_rows = false, no_swizzle = false, persistent = false;
  int decode = -1;  // -1: by format
};
WgmmaMode wgmma_mode();

}  // namespace deepinfer::cuda
