// Kernel choices that are not a function of the call's shape: which of two kept kernels an op takes, and the wgmma
// GEMM's tile and weight-decode placement. The defaults are the measured choices (docs/PERF.md). Tests set others to
// reach the alternatives on shapes the defaults send elsewhere; the CUDA micro-benchmarks compare them in one process.
// A CudaBackend holds one set (set_kernel_choices) for the ops it enqueues from then on, and its launchers see them in
// their parameter structs. (They replaced the DEEPINFER_AB_* environment switches, read on every call, in session 19.)
#pragma once

#include <cstdint>

namespace deepinfer::cuda {

// kAuto: the op's shape rule; kNever: the other kernel; kAlways: this one for every call it supports.
enum class KernelPick : uint8_t { kAuto, kNever, kAlways };

// The wgmma GEMM's block tile (gemm_wgmma.h); kByRows only as a choice: the rule by rows a group.
enum class WgmmaTile : uint8_t { kByRows, k128x256, k256x128, kMixed };
// Who decodes the wgmma GEMM's weights: the producer warpgroup, half the producer and half the consumers (one step
// ahead of their products), or the consumers; kByFormat: MXFP4 staged (split where staging does not apply), FP8 split
// in the 256 x 128 tile and on the producer in 128 x 256 (measured: gemm_wgmma_cuda.cu). kProducerStaged: the
// producer, from codes it stages in shared memory by cp.async instead of registers (MXFP4 with K % 128 == 0, else
// kProducer; gemm_wgmma_device.cuh StagedCodes).
enum class WgmmaDecode : int8_t { kByFormat = -1, kProducer = 0, kSplit = 1, kConsumers = 2, kProducerStaged = 3 };

struct GemmChoices {
  // The wgmma GEMM: kNever falls back to gemm_mma; kAlways takes it below kGemmWgmmaMinRows rows a group too.
  KernelPick wgmma = KernelPick::kAuto;
  // Decode the wgmma GEMM's weights through f32 as gemm_mma does instead of the bf16x2 integer decode (the same
  // values for UE8M0 scales; f32 scales always take it).
  bool wgmma_exact = false;
  WgmmaDecode wgmma_decode = WgmmaDecode::kByFormat;
  WgmmaTile wgmma_tile = WgmmaTile::kByRows;
  // The FP8 GEMM (gemm_wgmma_fp8.h) under --activation-quant mxfp8, for MXFP4 routed experts (with their folds) and
  // 128 x 128 FP8-block weights of many rows: e4m3 activations and weights on the FP8 tensor cores instead of both as
  // bf16. kAuto and kAlways: the backend takes it wherever its rules admit a call (measured faster on the V4-Flash
  // slice's prefill: docs/PERF.md, session 29); kNever: the bf16 kernels on the rounded values. The kernel's own rule
  // admits only kAlways (the backend's choices pass that).
  KernelPick wgmma_fp8 = KernelPick::kAuto;
  // The FP8 GEMM's per-128 form (--activation-quant fp8, the V3 family's experts) in a 128 x 256 tile (gemm_wgmma_fp8_
  // cuda.cu: half the L2 reads per product and A read from shared memory once per 128 columns) instead of 128 x 128:
  // 1 a block per tile (the default since session 32: the same bytes as 128 x 128, V3 slice prefill 8192 experts 44.7
  // -> 33.6 ms on the H100), 2 persistent blocks (one per SM, walking the tiles: 39.4 ms), 0: 128 x 128.
  int wgmma_fp8_wide = 1;
  // Under --activation-quant fp8 (V3 family), dense linears over 128 x 128 FP8 weights with f32 scales on cuBLASLt's
  // block-scaled FP8 GEMM (CudaBackend's fp8_block_linear): kAuto where quant_linear would take its cuBLASLt bf16
  // scratch (many rows), kAlways from one row, kNever: the own kernels on the rounded values.
  KernelPick lt_fp8_block = KernelPick::kAuto;
  // The most rows a group (rows_hint) that take the streaming tensor-core kernel (gemm_stream_mma.h); 0 never (the
  // fp32 streaming kernels), -1 kGemmStreamMmaMaxRows. Above kGemmStreamMmaMaxRows the dense UE8M0 linears of up to
  // that many rows take it too (in 8-row passes) instead of the cuBLASLt scratch (CudaBackend's quant_linear).
  int64_t stream_mma_max_rows = -1;
  // One-row calls (decode batch 1) take the streaming tensor-core kernel from this many 16-row tiles (N / 16 x group
  // slots) and the fp32 column-group kernel below it (gemm_stream_mma_takes_shape); -1: kOneRowMinTiles (768).
  int64_t stream_mma_one_row_tiles = -1;
  // FP8 blocks with f32 scales (V3 / R1 checkpoints) on the tensor-core decode kernels as well, instead of the fp32
  // streaming kernels (up to 4 rows) and the cuBLASLt bf16 scratch (5-64 rows): up to 8 rows a group the streaming
  // kernel (gemm_stream_mma_takes_f32_scales: the codes exact, each 128-K block's sums scaled in fp32; under
  // --activation-quant fp8 the rows' e4m3 codes and scales too, so nothing is rounded: session 35), 9-64 dense rows
  // the rows kernel (gemm_rows_mma.h: each weight scaled in fp32 and rounded to bf16 in registers, the values the bf16
  // scratch holds). On since session 32 (H100, V3 slice under --activation-quant fp8: decode b16 13.05 -> 11.33 ms,
  // b64 37.88 -> 32.47; docs/PERF.md); false keeps the fp32 streaming kernels and the scratch.
  bool f32_scale_mma = true;
  // The most rows of a dense block-format linear that the own tensor-core kernels take from the stored codes once their
  // tiles fill the device (CudaBackend's quant_linear); past it, and below the fill, cuBLASLt over a bf16 scratch of
  // the dequantized weight. -1: kDecodeDirectMaxRows (128); 0: never.
  int64_t decode_direct_max_rows = -1;
  // Dense wgmma calls whose tiles fill less than a wave split K over more blocks (gemm_wgmma.h): kAlways only (when
  // the caller gives the partials' scratch; quant_linear and the shared expert do up to decode_direct_max_rows). The
  // rule (kAuto) is never: on the H200 the split ran slower than the cuBLASLt scratch path it replaces (ncu, V4-Flash
  // b64 step: 1.91 ms of split GEMMs, reduces and casts against 1.60 ms of dequant, cuBLASLt and casts).
  KernelPick wgmma_split_k = KernelPick::kAuto;
  // Dense block-format calls of 9-64 rows through the rows kernel (gemm_rows_mma.h: the weights read once, all rows
  // in one pass) instead of the cuBLASLt scratch path or the wgmma / mma.sync tiles; kAuto: up to
  // kGemmRowsMmaAutoRows (64 since session 23, measured: gemm_rows_mma.h); kAlways: up to 64.
  KernelPick rows_mma = KernelPick::kAuto;
  // The backend hands the rows kernel a bf16 copy of A (a cast kernel a call) instead of the f32 rows, which the
  // kernel rounds to bf16 as it stages them (the same bits either way).
  bool rows_mma_bf16_a = false;
  // bf16 routed experts (a bf16 checkpoint's, CudaBackend::moe_quant) on the mma.sync kernel with A as hi + lo bf16
  // terms (two products, ~2^-16 of fp32, as linear_quant's split_in); false rounds A to bf16 (one product, ~2^-9).
  bool bf16_split_a = true;
  // Launch the rows kernel with programmatic stream serialization: its blocks may start while the previous kernel
  // finishes and send their first weight loads (the weights do not depend on it) before they wait for its memory
  // (griddepcontrol.wait); the arithmetic is unchanged. H200, session 23 (docs/PERF.md), V4-Flash slice: eager steps
  // 2.65 -> 2.38-2.41 ms at b16, 3.47-3.49 -> 3.34-3.36 at b32; as CUDA graphs (the decode default) even: 2.32 vs
  // 2.30-2.31, 3.24 vs 3.24-3.25. Off by default: its weight loads before the wait read memory that a kernel right
  // before it could still be writing (weights made on the device).
  bool rows_mma_pdl = false;
  // The rows kernel's warpgroup form (gemm_rows_mma_cuda.cu, where the launch shape has warps / kw a multiple of 4):
  // each warpgroup's 64 decoded weight rows times all the call's rows in one register-A wgmma a k16 slice instead of
  // one mma.sync per 8 rows and a shared-memory load each. kAuto: calls of more than kGemmRowsWgmmaAutoRows rows
  // (gemm_rows_mma.h: the op bench's same-run A/B on the H100, session 43, faster at 64 rows, slower at 16).
  KernelPick rows_mma_wgmma = KernelPick::kAuto;
  // The rows kernel's rule counts waves of clusters (gemm_rows_mma_shape's cluster_slots: clusters share a GPC, 15 of
  // 8 blocks fit the H100 at once) and takes fewer, longer splits where its shape would need two; false keeps the
  // shape of tiles and shared memory alone.
  bool rows_mma_waves = true;
  // The rows kernel's launch shape instead of its rule's (gemm_rows_mma_shape), 0 = the rule's: warps a block (4,
  // 8 or 16), warps along K a block (1, 2, 4 or 8, dividing the warps), K splits a cluster (1-8; with a chosen count a
  // K range past the shared memory declines the call instead of splitting further).
  int rows_mma_warps = 0;
  int rows_mma_kw = 0;
  int rows_mma_splits = 0;
  // Blocks of a cluster along N (1, 2, 4 or 8; share x splits <= 8) that stage A together: each block loads 1/share of
  // the K range's rows from L2 and stores them into every block's shared memory (A read once a cluster). 0 = the
  // rule's (2 for 16-warp blocks of at most 4 splits, else 1).
  int rows_mma_share = 0;
};

struct KernelChoices {
  GemmChoices gemm;
  KernelPick attn_mma = KernelPick::kAuto;     // paged sink attention on the tensor cores (attention_paged_mma.h)
  KernelPick indexer_mma = KernelPick::kAuto;  // indexer scores on the tensor cores (indexer_mma.h)
  // The tensor-core indexer's decode form for paged calls of fewer than 4 tokens a sequence: every warp of a block on
  // one token's key tile (its heads' m-tiles x key slices, summed over the m-tiles in shared memory) instead of the
  // warps of that token only (1 of 8 at 32 heads, 2 at 64). indexer_mma.h; 0 keeps one pass a sequence's tokens.
  // On since session 42 (H100, V4.1 slice decode b64 at 64k over bf16 pools, same run: indexer 3.33 -> 2.23 ms, step
  // 15.97 -> 14.86 ms).
  bool indexer_mma_decode = true;
  // The decode form over f32 / bf16 key pools and FP4 key records as the ring kernel (indexer_mma.h: a block a token,
  // its key tiles copied into shared-memory stages by cp.async; the same scores bit for bit). 0: the decode form's
  // own loop.
  bool indexer_mma_ring = true;
  // Top-k blocks of 256 / 512 threads by row length (kAuto: from kTopkRowsMinTokens rows; kNever: always 1024, the
  // decode shape).
  KernelPick topk_small_blocks = KernelPick::kAuto;
  // The V3 family's prefill MLA on GEMMs (CudaBackend::mla_attention_naive) with TF32 tensor-core products instead of
  // full fp32 (inputs rounded to 10 mantissa bits: off the golden tests' 1e-6 level, so an A/B only).
  bool mla_tf32 = false;
  // The same GEMMs on bf16 tensor cores in three products (bf16x3): each f32 operand split into bf16 hi + lo, the sum
  // hi·hi + hi·lo + lo·hi in fp32 (within ~2^-16 of the fp32 product where TF32 is 2^-11 off). Takes precedence over
  // mla_tf32. On by default since session 34, with mla_flash (false: cuBLASLt's full fp32 GEMMs).
  bool mla_bf16x3 = true;
  // The naive form's logits, softmax and P·V in one flash kernel (mla_flash_cuda.cu: online softmax, bf16x3 products,
  // no logit buffer) instead of the three GEMM steps; the expansion GEMM keeps mla_bf16x3 / mla_tf32. ~5e-6 from the
  // fp32 op, the numerics of the paged decode's attend step (paged_mla_mma), so prefill and decode agree. The default
  // since session 34 (H100, V3 slice prefill 8192, same run: attention 294.7 ms on the fp32 GEMMs, 131.7 with this
  // kernel over a bf16x3 expansion; docs/PERF.md); false keeps the fp32 GEMMs.
  bool mla_flash = true;
  // Queries a block of the flash kernel: 64 (4 warps, two blocks an SM) or 128 (8 warps, one block an SM, each key
  // tile read once per 128 queries and copied by cp.async under the previous tile's products); 0: the rule's, 64 (H100,
  // session 34, V3 slice prefill 8192 A/B/A/B in one run: attention 131.7 / 132.4 / 131.1 / 133.0 ms; after the
  // staging change 124.7 / 130.9 / 127.1 ms for 64 / 128 / 64).
  int mla_flash_rows = 0;
  // The paged absorbed MLA's attend step (V3-family decode: run_paged_mla_attention's middle kernel) on bf16x3
  // tensor-core products (mla_paged_mma.h: 32 heads x 16-key tiles a step, ~2^-16 a product; 3.2-4.3e-6 from the CPU
  // op where the fp32 kernel is 2-15e-7) instead of fp32 CUDA cores. kAuto / kAlways: every shape it has (latent 512,
  // rope 64); kNever: the fp32 kernel. kAuto since session 33 (H200, V3 slice at context 4096: decode attention b16
  // 7.47 -> 1.40 ms, b64 23.92 -> 4.48; docs/PERF.md).
  KernelPick paged_mla_mma = KernelPick::kAuto;
  // The MLA flash kernel and paged_mla_mma skip the output's per-tile rescale by exp(m_old - m_new) when it is 1 for
  // every row a warp holds (no row's running max grew: most tiles after the first few), instead of multiplying by 1:
  // the same bits. On since session 35 (H100, V3 slice, same run: prefill 8192 attention 133.2-133.9 -> 128.6 ms alone,
  // 125.5 with mla_flash_split_s; decode attention within the spread; docs/PERF.md).
  bool mla_lazy_rescale = true;
  // paged_mla_mma in 16-head blocks for models with at most 16 heads (V2-Lite): the S phase's 8 warps split the key
  // tile instead of two head groups, so no mma runs on padding heads; the same sums in the same order (bit-identical
  // to the 32-head block). false: 32-head blocks, the second group all padding. On since session 38 (H100, V2-Lite
  // slice at context 4096, same run: decode attention b64 14.20 -> 12.10 ms, b256 42.51 -> 35.58; docs/PERF.md).
  bool paged_mla_16 = true;
  // With 16-head blocks, the producers load tile i + 1's rows before they store tile i (two tiles in flight a thread,
  // the same bytes stored in the same order: the same bits). On since session 38 (same run: b64 12.10 -> 11.90 ms,
  // b256 35.58 -> 34.95).
  bool paged_mla_ahead = true;
  // With a bf16 pool (--kv-cache-dtype bf16) and 16-head blocks: two blocks an SM instead of one. The key buffers hold
  // no lo planes (99 KB a block instead of 154), the kernel is built for 80 registers (its producers one tile at a
  // time) and the splits double to fill both. ncu (H100, session 38, V2-Lite b64 with a bf16 pool): one 12-warp block
  // an SM, 18.6% achieved occupancy, no eligible warp 76% of the cycles, 1.88 TB/s. On since session 43 (H100, V2-Lite
  // slice decode at 4k with a bf16 pool, two sets each, same run: attention b64 10.34 / 10.30 -> 9.48 / 9.72 ms, b256
  // 27.93 / 27.83 -> 24.93 / 24.92; steps b256 53.07 / 53.02 -> 50.18).
  bool paged_mla_two_blocks = true;
  // The MLA flash kernel sums S's hi·hi products and its cross terms in separate accumulators (8 independent mma chains
  // a warp instead of 4): another fp32 order within the same 3e-5. On since session 35 (H100, same run: prefill 8192
  // attention 133.2-133.9 -> 130.0 ms alone, 125.5 with mla_lazy_rescale; fixed-latency waits on the HMMAs were the
  // flash kernel's largest stall).
  bool mla_flash_split_s = true;
  // The MLA flash kernel on warpgroup MMAs (mla_flash_wgmma_cuda.cu, sm_90a: 128 queries a block, Q's fragments in
  // registers, 64-key tiles read by the tensor cores from shared memory, V transposed once a head group) instead of
  // mma.sync; the same bf16x3 numerics in another fp32 order (3e-5). The default on sm_90a since session 35 (H100,
  // V3 slice prefill 8192, same run A/B/A/B: attention 127.6-129.0 -> 93.6-93.7 ms; docs/PERF.md); false, or another
  // device, keeps the mma.sync kernel.
  bool mla_flash_wgmma = true;
  // Rows a group up to which a grouped_linear call (default mode) is one grouped launch (grouped_linear.h); -1:
  // kGemmStreamMmaMaxRows. 0 runs every call per group.
  int64_t grouped_one_launch_rows = -1;
  // moe_quant's shared expert on a second stream, forked after x's copies and joined before the combine, so that its
  // GEMMs (up to 64 tokens: the streaming and rows kernels) run beside the routed experts' instead of after them
  // (CudaBackend::Impl::on_side_stream). Shared experts on cuBLASLt (its one workspace) stay on the stream. H100,
  // session 46, same run: graph steps V4-Flash b16 2.43 -> 2.35 ms, V4.1 b1 1.47 -> 1.42, b16 5.41 -> 5.29, V4-Flash b1
  // even (docs/PERF.md). On by default since session 47: every GPU test that reaches a MoE passed with it on (105 of
  // 105, H100), graph steps V4-Flash b64 4.651 -> 4.549 ms, V4.1 b64 11.998 -> 11.806, b256 within 0.7% either way.
  bool moe_shared_stream = true;
  // CudaBackend::grouped_linear_quant (the engine's V4 grouped output projection, wo_a kept quantized) as one grouped
  // launch over a plan made on the call's first eager use (grouped_linear.h: the bench slices' form) instead of
  // linear_quant per group (8 launches a layer); the same kernel and arithmetic per group. Off until GPU-run.
  bool grouped_output_one_launch = false;
};

}  // namespace deepinfer::cuda
