// The dense decode GEMM of 9-64 rows for block-format weights (gemm_rows_mma_cuda.cu), behind run_gemm after the
// streaming kernel's few rows (gemm_stream_mma.h).
#pragma once

#include <cuda_runtime.h>

#include <functional>

#include "deepinfer/ops/cuda/kernels.h"

namespace deepinfer::cuda {

// Rows of a dense call that this kernel takes: above the streaming kernel's one pass (kGemmStreamMmaMaxRows) up to
// kGemmRowsMmaMaxRows, all rows in one pass over the weights.
constexpr int64_t kGemmRowsMmaMaxRows = 64;
// By default (GemmChoices::rows_mma = kAuto) up to kGemmRowsMmaAutoRows rows; kAlways up to kGemmRowsMmaMaxRows.
// H200: session 22 stopped the default at 32 rows (64 rows lost to the path it replaces: o_b 79.7 vs 60.0 us, one
// 8-warp block an SM at 128 KB of staged rows). Session 23's launch shapes (16-warp blocks for the wide weights,
// fewer splits; docs/PERF.md) win at 64 rows too: op bench o_b 59.3 vs 60.0 us, q_b 33.6 vs 40.8, q_a 15.6 vs 22.2;
// the slices' projections at b64 (the same run, the default then vs all 64 rows) V4-Flash 0.90-0.97 vs 0.82 ms,
// V4.1 1.65-1.66 vs 1.43.
constexpr int64_t kGemmRowsMmaAutoRows = 64;
// The warpgroup form (GemmChoices::rows_mma_wgmma = kAuto) above this many rows: one register-A wgmma m64 n64 k16 a
// warpgroup and k16 slice instead of 8 mma.sync. H100, session 43, op bench (V4-Flash FP8 projections, same run,
// mma.sync / warpgroup us): 64 rows o_b 60.1 / 53.1, q_b 34.1 / 32.6, shared gate 21.2 / 20.1, q_a 16.3 / 15.6-15.9, kv
// 14.4-14.8 / 15.3-15.4; 32 rows even (o_b 34.9 / 34.3, kv 11.2 / 12.2); 16 rows 3-12% slower (kv 9.6 / 10.8).
constexpr int64_t kGemmRowsWgmmaAutoRows = 32;

// C = A · dequant(B)ᵀ for a dense call of m rows (9..kGemmRowsMmaMaxRows): each weight byte is read from HBM once
// and decoded once in registers (the streaming kernel's exact bf16 placement and UE8M0 scale multiply), then feeds
// one mma.sync per 8 rows of A. A is rounded to bf16 (from p.a_bf16 when given), fp32 accumulation. A block holds its
// K range of all rows in shared memory; K splits over a thread-block cluster whose blocks sum their partial tiles
// through distributed shared memory in rank order (deterministic for a shape and device; no partials in global
// memory, no second kernel). Takes what run_gemm_stream_mma takes (UE8M0 MXFP4, FP8 blocks of power-of-two shape,
// FP8 per-32 rows, 16-byte aligned weights; with GemmChoices::f32_scale_mma FP8 blocks of those shapes with f32
// scales, each weight scaled in fp32 and rounded to bf16 as dequantize_bf16 does), dense only (no groups, gathered
// or scattered rows), and not in batch-invariant mode, not with p.choices.rows_mma == kNever nor past
// kGemmRowsMmaAutoRows rows with kAuto. Returns false, enqueuing nothing, otherwise.
bool run_gemm_rows_mma(const GemmKernelParams& p, cudaStream_t stream);

// Whether run_gemm_rows_mma takes a dense call of `rows` rows with these weights on the current device (pointers and
// alignment aside: 16-byte aligned weights and A are the caller's part). CudaBackend's quant_linear and shared expert
// ask it before they fall back to the cuBLASLt scratch path.
bool gemm_rows_mma_takes(QuantFormat format, bool scale_e8m0, int block_n, int block_k, int64_t n, int64_t k,
                         int64_t rows, const GemmChoices& choices);

// The launch shape: `warps` a block (4, 8 or 16) on warps / kw 16-row weight tiles, kw warps along K on each; `splits`
// blocks of a cluster along K (1..8: a power of two, or 3-7 where the wave rule below takes it), each over
// `split_steps` steps of 4 code chunks, warp_steps of them a warp. Exposed for the tests, which check its rules.
// GemmChoices' rows_mma_warps / _kw / _splits / _share replace the rule's values (the op bench's shape sweep);
// rows_mma_wgmma asks for the warpgroup form.
struct RowsMmaShape {
  int warps = 8;
  int kw = 1;
  int splits = 1;
  int split_steps = 0;
  int warp_steps = 0;
  int share = 1;    // blocks of a cluster along N staging A together
  bool wg = false;  // the warpgroup form (register-A wgmma; GemmChoices::rows_mma_wgmma where warps / kw % 4 == 0)
  size_t smem = 0;  // dynamic shared memory a block
};
// cluster_slots(c), when given: how many clusters of c one-block-an-SM blocks the device runs at once
// (gemm_rows_mma_cluster_slots; a cluster's blocks share one GPC, so fewer than sms / c fit, e.g. 15 of 8 on the
// H100). When the rule's clusters of such blocks (above sms / 2 blocks) need more than one wave, the rule takes the
// shape of fewest waves x (steps a block + a block's fixed cost) instead: 16-warp blocks, one a cluster along N, 2-8
// splits whose K range fits.
using ClusterSlots = std::function<int(int size)>;
RowsMmaShape gemm_rows_mma_shape(QuantFormat format, int64_t n, int64_t k, int64_t rows, int sms,
                                 const GemmChoices& pick = {}, const ClusterSlots& cluster_slots = nullptr);

// How many clusters of `size` (2..8) 16-warp rows-kernel blocks the current device runs at once
// (cudaOccupancyMaxActiveClusters), 0 when the runtime does not say. Kept per device after the first ask: a device
// constant, asked by CudaBackend when it starts (so never first inside a graph capture) and by every rows launch.
int gemm_rows_mma_cluster_slots(int size);

}  // namespace deepinfer::cuda
