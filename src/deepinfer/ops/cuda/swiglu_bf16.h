// The MoE SwiGLU with the bf16 copy of its output written in the same pass (moe_cuda.cu), for the expert and shared
// down GEMMs that read bf16 (the mma.sync / wgmma kernels): one launch instead of SwiGLU then cast_f32_to_bf16, whose
// f32 read of h it saves.
#pragma once

#include <cuda_runtime.h>

#include "deepinfer/ops/cuda/kernels.h"

namespace deepinfer::cuda {

// run_swiglu(p), and h16[r, i] = __float2bfloat16_rn(p.h[r, i]) for the rows it writes (the bits of
// run_cast_f32_to_bf16 over them). p.h is still written: the GEMM reads it where its bf16 kernels do not apply.
// h16: [rows, inter] bf16. Inter % 4 != 0 or unaligned pointers: run_swiglu then run_cast_f32_to_bf16.
void run_swiglu_bf16(const SwigluKernelParams& p, void* h16, cudaStream_t stream);

}  // namespace deepinfer::cuda
