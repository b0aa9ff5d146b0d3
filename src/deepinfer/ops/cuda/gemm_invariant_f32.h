// Batch-invariant GEMMs of small f32 weights (the MoE routers) as K-sliced fp32 chains (gemm_invariant_f32_cuda.cu),
// behind run_gemm.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "deepinfer/ops/cuda/kernels.h"

namespace deepinfer::cuda {

// The most rows (N) of an f32 weight that takes the sliced chains.
constexpr int64_t kInvariantF32SplitMaxN = 512;
// Calls of at least this many rows run the sliced chains as a 64 x 64 SIMT tile (the same arithmetic per output).
constexpr int64_t kInvariantF32TileRows = 64;

// Batch-invariant mode's fp32 chain over all of K (the SIMT tile of gemm_cuda.cu / the column-chain kernels of
// gemm_chain_cuda.cu) keeps K dependent FMAs per output and, for a weight of a few hundred rows (a router: N = 256 /
// 384), a few blocks of the device busy: 70 µs a V4-Flash router call at one row, 0.5 ms at 64 (H200, first run of the
// tensor-core sequence). Here every output of a dense f32 weight with N <= kInvariantF32SplitMaxN and K % 4 == 0
// (16-byte aligned) is instead the sum, in slice order, of gemm_invariant_f32_slices(K) chains, each fmaf(a[k], w[k],
// acc) from 0 over its slice of K in k order (slice boundaries at multiples of 4): the same for every M, exact fp32
// products (another summation order than the unsliced chain). Up to kInvariantF32TileRows rows a block is 32 columns x
// one warp a slice x up to 8 rows a pass, rows in blocks over the grid; more rows a 64 x 64 tile whose threads walk the
// slices in turn (H200, V4-Flash prefill 4096: the 8-row blocks took the router to 4.0 ms a step, 0.6 default). Returns
// false, enqueuing nothing, for anything else.
bool run_gemm_invariant_f32_split(const GemmKernelParams& p, cudaStream_t stream);

// Whether a dense batch-invariant f32 GEMM with this weight takes the sliced chains (given 16-byte aligned weights).
bool gemm_invariant_f32_split_takes(int64_t n, int64_t k);

// The K slices of the sliced chains for K (1..8: about 512 k a slice).
int gemm_invariant_f32_slices(int64_t k);

}  // namespace deepinfer::cuda
