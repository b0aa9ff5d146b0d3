// The pipelined tensor-core GEMM for block-format weights and many rows (gemm_mma_cuda.cu), behind run_gemm.
#pragma once

#include <cuda_runtime.h>

#include "deepinfer/ops/cuda/kernels.h"

namespace deepinfer::cuda {

// C = A · dequant(B)ᵀ through mma.sync bf16 with a cp.async pipeline, when p allows it: a block format with
// 32-value K steps (K % 32 == 0; FP8 block scales at least 32 wide in K), the bf16 copy of A (p.a_bf16, 16-byte
// aligned rows) and 16-byte aligned weights. Returns false, enqueuing nothing, otherwise.
bool run_gemm_mma(const GemmKernelParams& p, cudaStream_t stream);

// Rows per expert from which a grouped block-format GEMM with a bf16 A takes this kernel instead of the few-row
// streaming kernels: its 64-row tiles are mostly empty at 3-4 rows, but it moves the experts' weights faster than
// the 4-row streaming variant, which re-reads A per column (H200, V4-Flash decode at batch 128, 3 rows an expert:
// 8.6 ms a layer of experts, 0.37 TB/s).
constexpr int64_t kGemmMmaMinRows = 3;

// Whether a dense GEMM of m rows and n columns has enough of this kernel's tiles to fill the device; below that
// (decode batches of a shared expert: one row tile of 9 column tiles) the WMMA tile's narrower tiles do better.
bool gemm_mma_dense_fills(int64_t m, int64_t n);

}  // namespace deepinfer::cuda
