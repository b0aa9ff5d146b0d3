// The tensor-core weight-streaming GEMM for few rows per group (decode), behind run_gemm.
#pragma once

#include <cuda_runtime.h>

#include "deepinfer/ops/cuda/kernels.h"

namespace deepinfer::cuda {

// The most rows per weight that take this kernel (run_gemm; dense linear_quant hands UE8M0 block formats up to
// here to run_gemm instead of cuBLASLt). H200, same-run slice bench: V4-Flash decode at batch 256 (3 layers) 17.6
// -> 14.0 ms with 8 instead of 4; docs/PERF.md.
constexpr int64_t kGemmStreamMmaMaxRows = 8;

// Grouped calls of at least this many rows (token x expert slots: decode batches from ~11 tokens at top-6) stage 8
// activation rows a pass whatever the mean rows per group, so groups above the mean stream their weights once.
constexpr int64_t kGroupedFullPassSlots = 64;

// C = A · dequant(B)ᵀ for `rows` rows per group (1..8 in one pass; more rows loop over the weights again) through
// mma.sync with tiles of 8 or 16 weight rows as one operand and up to 8 activation rows as the other. Weights stream
// from HBM once, decoded in registers to bf16 with their UE8M0 scale applied exactly; A is rounded to bf16 (the
// precision of the prefill tensor-core path), fp32 accumulation. Takes MXFP4, FP8 blocks with power-of-two block
// shapes and FP8 per-32 rows, all with UE8M0 scales and 16-byte aligned weight rows; with
// GemmChoices::f32_scale_mma also FP8 blocks with f32 scales (gemm_stream_mma_takes_f32_scales). Returns
// false, enqueuing nothing, for anything else (unaligned weights, K that does not fit its shared-memory stage).
bool run_gemm_stream_mma(const GemmKernelParams& p, int64_t rows, cudaStream_t stream);

// Whether the kernel takes FP8 blocks with f32 scales (V3 / R1 checkpoints): the choice set, blocks of >= 16 rows and
// >= 128 along K (powers of two; V3's are 128 x 128). The codes go into the products exact and each 128-K block's
// sums are scaled once in fp32 (A rounded to bf16 as with UE8M0 scales); default mode only (batch-invariant mode keeps
// the fp32 kernels for f32 scales). With p.a_e4m3, p.a_scale and p.a_scale_block128 (--activation-quant fp8: A's e4m3
// codes, row stride lda, and one f32 scale a row and 128 values, [rows, lda / 128]; lda % 128 == 0, 16-byte aligned)
// it stages the codes instead of rounding p.a, and each block's sums are scaled by the weight's scale times the row's:
// no operand rounded. Other kernels that take the call instead read p.a (the caller gives both).
bool gemm_stream_mma_takes_f32_scales(QuantFormat format, int block_n, int block_k, int64_t k,
                                      const GemmChoices& choices);

// Batch-invariant mode (gemm_invariant_mma.h): the same kernel with its configuration fixed by the weight alone —
// 16-row weight tiles (the weights are the mma's m16 operand, the activation rows the n8 one), kw K slices (kw from
// gemm_invariant_mma_slices: N, K and the format, never the rows or group slots of the call)
// and kInvariantMmaAcc accumulator chains per slice — so an output's mma sequence and additions do not depend on the
// call; any row count (passes of up to 8 rows). Returns false, enqueuing nothing, when the weights do not fit it
// (as run_gemm_stream_mma) or K does not fit its activation stage.
constexpr int kInvariantMmaAcc = 1;
bool run_gemm_stream_mma_invariant(const GemmKernelParams& p, int64_t rows, int kw, cudaStream_t stream);

// Whether a call of `rows` rows per weight, n outputs and `slots` group slots (1 when dense) is one this kernel
// takes by shape: one-row calls with fewer 16-row tiles than choices.stream_mma_one_row_tiles decline (the fp32
// column-group kernel, exact in A). Tests use it to pick their reference (A rounded to bf16 or not).
bool gemm_stream_mma_takes_shape(int64_t rows, int64_t n, int64_t slots, const GemmChoices& choices = {});

}  // namespace deepinfer::cuda
