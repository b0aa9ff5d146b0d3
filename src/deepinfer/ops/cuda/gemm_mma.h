// The pipelined tensor-core GEMM for block-format weights and many rows (gemm_mma_cuda.cu), behind run_gemm.
#pragma once

#include <cuda_runtime.h>

#include "deepinfer/ops/cuda/kernels.h"

namespace deepinfer::cuda {

// C = A · dequant(B)ᵀ through mma.sync bf16 with a cp.async pipeline, when p allows it: a block format with
// 32-value K steps (K % 32 == 0; FP8 block scales at least 32 wide in K), the bf16 copy of A (p.a_bf16, 16-byte
// aligned rows) and 16-byte aligned weights. Returns false, enqueuing nothing, otherwise.
bool run_gemm_mma(const GemmKernelParams& p, cudaStream_t stream);

}  // namespace deepinfer::cuda
