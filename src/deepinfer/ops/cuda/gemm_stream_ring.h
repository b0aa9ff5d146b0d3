// The streaming tensor-core GEMM's ring form for MXFP4 weights (gemm_stream_ring_cuda.cu), behind
// run_gemm_stream_mma.
#pragma once

#include <cuda_runtime.h>

#include "deepinfer/ops/cuda/kernels.h"

namespace deepinfer::cuda {

// Whether a call that the streaming kernel runs in 16-row tiles with one K slice a warp (calls of many tiles: the
// decode MoE from ~64 tokens) can take the ring form: GemmChoices::stream_mma_ring, MXFP4 with UE8M0 scales, default
// mode, K % 256 == 0, the caller's bf16 copy of A with 16-byte rows, 16-byte aligned weights and 8-byte aligned scales.
bool gemm_stream_ring_takes(const GemmKernelParams& p);

// The streaming kernel's product (the same mma sequence a tile, so the same bits) with its weights, scales and
// activations copied by cp.async into a ring of shared-memory stages instead of held in registers: more weight bytes
// in flight an SM. rows: the pass's rows (1-8; a block loops over a group's passes unless the plan's pass table
// gives each its own block), slots: grid y (group slots or the table's passes), tile_groups: groups of 8 tiles a block.
void run_gemm_stream_ring(const GemmKernelParams& p, int rows, int64_t slots, int tile_groups, cudaStream_t stream);

}  // namespace deepinfer::cuda
