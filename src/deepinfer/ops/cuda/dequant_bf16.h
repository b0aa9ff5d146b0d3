// Weight dequantization to bf16 with 16-byte loads and stores (gemm_tc_cuda.cu), the first half of the
// large-M path for block formats: dequantized scratch + cuBLASLt bf16 (cuda_backend_impl.cc).
#pragma once

#include <cuda_runtime.h>

#include "deepinfer/ops/cuda/kernels.h"

namespace deepinfer::cuda {

// out[n, k] (bf16, 16-byte aligned) = dequant(p.b) for a dense block-format weight (the weight fields of p:
// format, b, b_scale, scale_e8m0, block_n/k, scale_cols, n, k). Returns false, enqueuing nothing, when the
// vector path does not apply (odd K, unaligned rows, kFloat): the caller then uses run_dequantize.
bool run_dequantize_bf16(const GemmKernelParams& p, void* out, cudaStream_t stream);

}  // namespace deepinfer::cuda
