// Batch-invariant block-format GEMMs on the tensor cores (gemm_invariant_mma_cuda.cu), behind run_gemm.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "deepinfer/ops/cuda/kernels.h"

namespace deepinfer::cuda {

// Batch-invariant mode needs each output's arithmetic to be independent of the other rows of the call (the row
// count, the grouping of MoE tokens, rows_hint), not fp32 FMA chains. For UE8M0-scaled block formats every output
// here is one fixed sequence: K in steps of 4 chunks of 16 code bytes, per step kMmas mma.sync m16n8k16 with the
// weights (decoded exactly to bf16) as the m16 operand and the activation rows (rounded to bf16) as the n8 one, the
// steps cut into gemm_invariant_mma_slices(...) K slices whose single accumulator chains are added in slice order.
// Up to kGemmStreamMmaMaxRows rows per group the streaming kernel runs it (run_gemm_stream_mma_invariant), more
// rows a tile kernel of 128 weight rows x 64 rows with the identical per-output sequence, so a row gives the same
// bits alone (decode) or among thousands (prefill). Precision class: A rounded to bf16, weights exact, fp32
// accumulation (the default mode's tensor-core class). Returns false, enqueuing nothing, for anything else (f32
// weights or scales, K not a multiple of the chunk, unaligned weights): run_gemm keeps the fp32 chain kernels there.
// (Against the fp32 chains for every format, H200, V4-Flash slice: prefill 4096 +156% vs +695% over the default
// mode, decode b1 +3% vs +81%, b64 +63% vs +225%; the switch back to them is removed.)
bool run_gemm_invariant_mma(const GemmKernelParams& p, cudaStream_t stream);

// Whether batch-invariant GEMMs of a weight in this format / scale type / block shape and K take the kernels
// above (A rounded to bf16), given 16-byte aligned weights. Tests use it to pick their reference.
bool gemm_invariant_mma_takes(QuantFormat format, bool scale_e8m0, int block_n, int block_k, int64_t k);

// The K slices of the batch-invariant sequence for a weight of n rows and k columns in `format` (dense, or one of a
// table): enough 16-row tiles x slices to stream at decode (the streaming kernel's rule at one group slot), at least
// 4 steps a slice. A property of the weight, never of the call. Expert tables take the dense rule too: their decode
// calls use 6 (batch 1) to hundreds of slots, and a rule at more slots (fewer slices) was a trade-off between batch
// sizes that measured no better (H200, V4-Flash slice, sessions 14-15: experts at decode batch 1 0.36 ms against the
// default mode's 0.63 with 8 slices, batch 64 8.96 against 5.71; the sweep's switch went in session 19).
int gemm_invariant_mma_slices(QuantFormat format, int64_t n, int64_t k);

}  // namespace deepinfer::cuda
