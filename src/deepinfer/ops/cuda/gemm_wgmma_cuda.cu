// The Hopper GEMM for block-format weights and many rows (prefill: the MoE experts' grouped GEMMs, ~200 rows per
// expert at 8192 tokens): C = A · dequant(B)ᵀ with A as bf16 (p.a_bf16), weights FP8 / MXFP4 decoded exactly to bf16,
// fp32 accumulation in wgmma.mma_async (sm_90a). The same contract and numerics as gemm_mma_cuda.cu (the same bf16
// operands; only the order of the fp32 sums differs).
//
// Why: gemm_mma ran ~167 TFLOP/s (21% of the measured 790 bf16 rate) on the V4-Flash prefill experts, latency-bound
// with issue slots 44% busy: its warps both decode the weights and feed mma.sync through ldmatrix. Here the tensor
// cores run asynchronously (wgmma reads both operands from shared memory) while other warps decode:
//
//   block = 3 warpgroups (384 threads), tile 128 (rows) x 256 (weight rows = output columns), K in steps of 64.
//   warpgroup 0 (producer): per step, copies the A tile (gathered rows, cp.async 16 bytes at a time), loads its two
//     weight rows' codes and scales into registers one step ahead, decodes them to bf16 (exact: e4m3 / e2m1 times a
//     power of two) straight into the swizzled layout below, and signals the stage "full".
//   warpgroups 1, 2 (consumers): rows 0-63 / 64-127 of the tile; per step 4 x wgmma m64n256k16 (A and B from shared
//     memory by descriptor), one commit group per step, one group kept in flight; when a step's group has retired
//     they signal its stage "empty". Accumulators: 128 f32 a thread. For MXFP4 (default) the consumers also decode
//     weight rows 128-255 of the next step (half a row a thread) while their products run, the producer rows 0-127.
// Measured (H200, V4-Flash expert calls, same run as gemm_mma; docs/PERF.md): MXFP4 gate at 8192 tokens 5.24 ms ->
// 3.49 (producer decode) -> 3.01 (split decode), down 5.10 -> 3.27 -> 2.94; the FP8 shared expert 0.95 -> 0.44 ms.
// ~2 µs a block step: the producer is latency-bound, not issue-bound (see PERF.md for the suspected fence wait).
//   A 4-stage ring of (A tile 16 KiB, B tile 32 KiB); full / empty are named barriers (bar.arrive by the signalling
//     side, bar.sync by the waiting side, 384 threads each), ids 1-4 and 5-8 (0 is __syncthreads). Step G of a block
//     (counted over all its tiles) uses stage G % 4. The consumers release every step once; the producer waits for
//     the release of step G - 4 before it writes step G, and for the last releases before it exits, so every
//     barrier instance completes and none is reused before it did (the producer's arrival at full(G + 4) follows
//     its wait on empty(G), which follows both consumers' passing full(G)).
//   One block per tile (one block an SM walking tiles blockIdx.x + i·gridDim.x measured slower: static tile
//     striding; the kernel's tile loop still takes any grid).
//   The 256 x 128 tile (wgmma_tile(): groups of >= 120 rows, dense calls of > 128 rows): the decode bounds the step
//     whatever the number of token rows, and with ~192 rows an expert (V4-Flash at 8192 tokens) every expert took two
//     128-row tiles, decoding its weights twice. Here each consumer warpgroup owns 128 rows as two m64 halves (two
//     wgmma m64n128k16 a k16 slice, the same 128 accumulators), a step decodes 128 weight rows (A 32 KiB, B 16 KiB:
//     the same 48 KiB stage), so an expert of <= 256 rows decodes each weight row once: the same block steps, half
//     the decode each. Decode placement: DecodePlan (the split gives the producer rows 0-63 half a row a thread and
//     the consumers rows 64-127 a quarter row each). Grouped tiles come from scan_group_tile (no block per plan
//     tile). Every output sees the same k16 products in the same order as in the 128 x 256 tile: the same bytes.
//     Measured, one launch of either tile: 256 x 128 1.16x faster at ~192 rows an expert, slower at ~128 (1.18x) and
//     ~96 (1.6x). Hence the default for grouped calls (wgmma_tile): mixed, two launches — each pair of a group's
//     128-row blocks as a 256-row tile (kPlanPairs), its unpaired last block as a 128-row tile (kPlanLeftover).
//   The decoding threads load a step's weight codes into registers one (producer) / two (consumers) steps ahead, and
//     their proxy fence each step (MEMBAR.ALL.CTA + FENCE.VIEW.ASYNC.S in SASS) waits for those loads in flight: the
//     suspected reason for ~2 µs a step (PERF.md). Prefetching each row's codes into L2 four steps before their
//     register load (prefetch.global.L2) made no difference on the H200 (slice prefill 8192 64.77 vs 64.88 ms) and
//     was removed. WgmmaDecode::kProducerStaged (session 27; the MXFP4 default since session 29, up to 9% faster) tests
//     that: the producer stages MXFP4 codes in shared memory by cp.async with the A copies (StagedCodes) and decodes
//     from there, so that nothing is in flight in registers at its fence (the FP8 GEMM, gemm_wgmma_fp8_cuda.cu, is
//     built that way).
//
// Shared-memory layout (both operands "K-major", 128-byte swizzle, the wgmma canonical layout): a tile row holds the
// 64 K values of one row (A: a token row, B: a weight row) = 128 bytes = 8 chunks of 16 bytes. Row r's chunk c
// lives at byte r·128 + ((c ^ (r % 8)) · 16) from a 1024-byte aligned tile base (the XOR uses address bits 7-9,
// which is why the base must be 1024-aligned). Eight rows form a 1024-byte swizzle atom; atoms follow each other
// along M / N. Descriptor (PTX "matrix descriptor"): bits 0-13 start address >> 4, bits 16-29 leading byte offset
// >> 4 (unused for swizzled K-major; 1), bits 32-45 stride byte offset >> 4 = 1024 >> 4 (atom to atom), bits 49-51
// base offset 0, bits 62-63 swizzle mode 1 = 128 bytes. The k16 slice kk of a step starts kk·32 bytes into the row:
// the descriptor's start address advances by 32 bytes (the hardware applies the XOR to the final address). The
// second consumer's A rows start 64·128 = 8192 bytes in (a whole number of atoms).
//
// Accumulator layout (m64nNk16, f32): thread = 32·w + lane of the warpgroup owns rows 16w + lane/4 (+8) and columns
// 8j + 2(lane%4) + {0,1}: d[4j + 0/1] row lane/4, d[4j + 2/3] row lane/4 + 8, for n8 tile j = 0..31.
//
// Weight decode (producer). Default: integer bf16x2 construction plus one bf16x2 multiply by the power-of-two scale,
// exact whenever the scale is a normal bf16:
//   e4m3: the hardware e4m3x2 -> f16x2 convert (exact; e4m3 subnormals become f16 normals), then the f16 bits shifted
//     right by 3 are a bf16 of the same sign and mantissa with the exponent still biased by 15: value · 2^-112 (zero
//     stays zero, no subnormal arises), times scale · 2^112 (UE8M0 scales up to 2^15).
//   e2m1: magnitudes through two byte lookups (prmt) of the bf16 high and low bytes of {0, .5, 1, 1.5, 2, 3, 4, 6},
//     interleaved into bf16x2, the sign bits moved in by a third prmt; times the scale. No subnormal inputs.
// GemmChoices::wgmma_exact (and f32 scales, always) decodes through f32 as gemm_mma does (bf16(code · scale)).
// bf16 weights (GemmKernelParams::b_bf16, grouped: a bf16 checkpoint's experts): the producer copies the weight rows
// into the B tile by cp.async as it does A's, with nothing to decode; with A's lo terms (a_lo_bf16) a tile runs K
// twice, lo·W steps first, then hi·W, the weight re-read from L2.
// The constants, wgmma wrappers, weight decode and tile scan the kernel uses: gemm_wgmma_device.cuh.
#include "deepinfer/ops/cuda/gemm_wgmma.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <type_traits>

#include "deepinfer/ops/cuda/cuda_check.h"
#include "deepinfer/ops/cuda/device_math.cuh"
#include "deepinfer/ops/cuda/gemm_decode.cuh"
#include "deepinfer/ops/cuda/gemm_mma.h"
#include "deepinfer/ops/cuda/gemm_wgmma_device.cuh"

namespace deepinfer::cuda {
namespace {

using namespace wgmma;

template <QuantFormat F, bool kExact, int kDec, bool kTall, bool kSplitK = false>
__global__ void __launch_bounds__(kWgThreads, 1)
    gemm_wgmma_kernel(GemmKernelParams p, int tiles_n, int64_t tiles, int plan, int splits) {
  static_assert(!kSplitK || !kTall, "split-K runs the dense 128 x 256 tile");
  // kDec 3 (WgmmaDecode::kProducerStaged): the producer decodes every row, as kDec 0, from codes it stages in shared
  // memory by cp.async (MXFP4, K % 128 == 0) instead of loading them into registers (StagedCodes).
  constexpr bool kStaged = kDec == 3;
  static_assert(!kStaged || (F == QuantFormat::kMXFP4 && !kExact && !kSplitK), "staged codes: MXFP4, bf16x2 decode");
  using T = WgTile<kTall>;
  using D = DecodePlan<kTall, kStaged ? 0 : kDec>;
  constexpr int kUnitsA = D::kUnitsP > 0 ? D::kUnitsP : 1;  // arrays of at least one
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ uint8_t smem_raw[];
  // 1024-byte aligned base (128B swizzle): A stages, then B stages.
  const uint32_t raw_addr = smem_addr(smem_raw);
  const uint32_t a_base = raw_addr + ((1024 - (raw_addr & 1023)) & 1023), b_base = a_base + kWgStages * T::kABytes;
  const int tid = threadIdx.x;
  // bf16 weights with A's lo terms: K twice, the lo·W steps first (the small terms), then hi·W (kFloat below).
  constexpr bool kBf16W = F == QuantFormat::kFloat;
  const int kw_steps = static_cast<int>(p.k / kWgK);
  const int ksteps = kw_steps * (kBf16W && p.a_lo_bf16 ? 2 : 1);
  // This tile's output tile, its first k-step and its count (all of K unless split).
  auto tile_of = [&](int64_t t, int64_t& tmn, int& split, int& kb, int& nk) {
    tmn = t, split = 0, kb = 0, nk = ksteps;
    if constexpr (kSplitK) {
      tmn = t / splits;
      split = static_cast<int>(t % splits);
      split_steps(ksteps, splits, split, kb, nk);
    }
  };
  // Tiles t = blockIdx.x, blockIdx.x + gridDim.x, ... (one per block as launched), column tile fastest:
  // the blocks running together share an A tile and sweep one expert's weight. Both roles walk the same tiles and
  // skip the same ones (a grouped plan tile that does not start a kernel tile); `gs` counts this block's steps over
  // all its tiles, which fixes every step's stage (gs % S) and barrier instance.

  if (tid < 128) {
    // ------------------------------------------------------------------ producer warpgroup
    const bool s8 = F == QuantFormat::kMXFP4 || p.scale_e8m0;
    const int ac = tid & 7;  // A: this thread copies chunk tid % 8 of tile rows tid / 8 + 16 j, j < kM / 16
    int64_t gs = 0;
    for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
      int g, split, kb, ktiles;
      int64_t row_begin, row_end, tmn;
      tile_of(t, tmn, split, kb, ktiles);
      if (!wg_tile_rows<kTall>(p, tmn / tiles_n, plan, g, row_begin, row_end)) {
        if (scan_mapped<kTall>(p, plan)) break;  // past the last tile: so is every later t
        continue;
      }
      const int64_t n0 = (tmn % tiles_n) * T::kN;
      // Rows past the tile's end (bit j of a_ok clear) copy nothing and zero-fill; their source is A's row 0, a valid
      // address for every step (K <= lda), so that the copy needs no pointer select.
      const __nv_bfloat16* a_src[T::kARowsT];
      uint32_t a_ok = 0;
#pragma unroll
      for (int j = 0; j < T::kARowsT; ++j) {
        const int64_t i = row_begin + (tid >> 3) + 16 * j;
        const int64_t ar = i < row_end ? (p.a_rows ? p.a_rows[i] / p.a_row_div : i) : -1;
        a_src[j] = static_cast<const __nv_bfloat16*>(p.a_bf16) + (ar < 0 ? 0 : ar) * p.lda + ac * 8;
        if (ar >= 0) a_ok |= 1u << j;
      }
      // A tile of k-step kt into stage `st`; from A's lo terms (the same rows of p.a_lo_bf16) when `lo`.
      auto issue_a = [&](int kt, int st, bool lo = false) {
        const uint32_t dst = a_base + st * T::kABytes;
#pragma unroll
        for (int j = 0; j < T::kARowsT; ++j) {
          const int r = (tid >> 3) + 16 * j;
          const __nv_bfloat16* row = lo ? static_cast<const __nv_bfloat16*>(p.a_lo_bf16) +
                                              (a_src[j] - static_cast<const __nv_bfloat16*>(p.a_bf16))
                                        : a_src[j];
          asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst + swz(r, ac)),
                       "l"(row + static_cast<int64_t>(kb + kt) * kWgK), "r"((a_ok >> j) & 1 ? 16 : 0)
                       : "memory");
        }
      };
      // Stage of this block's step G, once the consumers released its previous use (step G - S).
      auto acquire = [&](int64_t G) {
        if (G >= kWgStages) bar_sync(kBarEmpty + static_cast<int>((G - kWgStages) % kWgStages), kWgThreads);
        return static_cast<int>(G % kWgStages);
      };
      if constexpr (kBf16W) {
        // bf16 weights (b_bf16): the weight rows are copied as A's are, 16 bytes a cp.async straight into the swizzled
        // layout (this thread: chunk tid % 8 of tile rows tid / 8 + 16 j); nothing to decode. Step kt reads K step kt
        // % kw_steps, of A's lo terms while kt < kw_steps when there are lo terms.
        const auto* w = static_cast<const __nv_bfloat16*>(p.b_table ? p.b_table[g] : p.b);
        const __nv_bfloat16* w_src[T::kN / 16];
        uint32_t w_ok = 0;
#pragma unroll
        for (int j = 0; j < T::kN / 16; ++j) {
          const int64_t n = n0 + (tid >> 3) + 16 * j;
          w_src[j] = w + (n < p.n ? n : 0) * p.k + ac * 8;
          if (n < p.n) w_ok |= 1u << j;
        }
        auto issue = [&](int kt, int st) {
          const int kw = kt < kw_steps ? kt : kt - kw_steps;  // the weight's K step
          issue_a(kw, st, p.a_lo_bf16 && kt < kw_steps);
          const int64_t k0 = static_cast<int64_t>(kb + kw) * kWgK;
          const uint32_t db = b_base + st * T::kBBytes;
#pragma unroll
          for (int j = 0; j < T::kN / 16; ++j)
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(db + swz((tid >> 3) + 16 * j, ac)),
                         "l"(w_src[j] + k0), "r"((w_ok >> j) & 1 ? 16 : 0)
                         : "memory");
        };
        issue(0, acquire(gs));
        cp_async_commit();
        for (int kt = 0; kt < ktiles; ++kt) {
          const int64_t G = gs + kt;
          if (kt + 1 < ktiles) issue(kt + 1, acquire(G + 1));
          cp_async_commit();
          cp_async_wait<1>();  // this thread's copies of step kt have landed
          fence_proxy_async();
          bar_arrive(kBarFull + static_cast<int>(G % kWgStages), kWgThreads);
        }
        gs += ktiles;
      } else {
        // Weights: this thread's decode units (DecodePlan), tile row prow(i), chunks from pc0 (output column n0 + row).
        using Unit = Part<F, D::kChunksP>;
        const int pc0 = (tid % D::kPartsP) * D::kChunksP;
        auto prow = [&](int i) { return tid / D::kPartsP + i * (128 / D::kPartsP); };
        if constexpr (kSplitK) prefetch_split_codes<F>(p, n0, kb, ktiles, tid);
        const PartSrc<F, D::kChunksP> src0(p, g, n0 + prow(0), pc0);
        const PartSrc<F, D::kChunksP> src1(p, g, n0 + prow(kUnitsA - 1), pc0);
        auto load_step = [&](int kt, Unit(&rs)[kUnitsA]) {
          if constexpr (kStaged) return;  // staged: the codes come by cp.async (issue_a)
          if constexpr (D::kUnitsP > 0) src0.load(kb + kt, rs[0]);
          if constexpr (D::kUnitsP > 1) src1.load(kb + kt, rs[1]);
        };
        const StagedCodes<kTall> staged(b_base + kWgStages * T::kBBytes);
        // One step: load step kt + 1's codes (first: registers need no free stage, and the longer they fly the
        // better), acquire step kt + 1's stage and copy its A tile, decode step kt into its stage's B tile, publish.
        // Staged: step kt + 1's codes go with its A copies; step kt's have landed once its copies have.
        auto step = [&](int kt, Unit(&cur)[kUnitsA], Unit(&nxt)[kUnitsA]) {
          const int64_t G = gs + kt;
          if (kt + 1 < ktiles) {
            load_step(kt + 1, nxt);
            issue_a(kt + 1, acquire(G + 1));
            if constexpr (kStaged) {
#pragma unroll
              for (int i = 0; i < D::kUnitsP; ++i)
                staged.issue(i == 0 ? src0 : src1, kb + kt + 1, static_cast<int>((G + 1) & 1), prow(i));
            }
          }
          cp_async_commit();
          const int st = static_cast<int>(G % kWgStages);
          const uint32_t bt = b_base + st * T::kBBytes;
          if constexpr (kStaged) {
            cp_async_wait<1>();  // this thread's copies of step kt (A and codes) have landed
#pragma unroll
            for (int i = 0; i < D::kUnitsP; ++i) {
              staged.read(static_cast<int>(G & 1), prow(i), kb + kt, cur[i]);
              decode_part<F, kExact, D::kChunksP>(cur[i], bt, prow(i), pc0, s8);
            }
          } else {
#pragma unroll
            for (int i = 0; i < D::kUnitsP; ++i) decode_part<F, kExact, D::kChunksP>(cur[i], bt, prow(i), pc0, s8);
            cp_async_wait<1>();  // this thread's A copies of step kt have landed
          }
          fence_proxy_async();
          bar_arrive(kBarFull + st, kWgThreads);
        };
        Unit r0[kUnitsA], r1[kUnitsA];  // ping-pong: no register copies between steps
        load_step(0, r0);
        issue_a(0, acquire(gs));
        if constexpr (kStaged) {
#pragma unroll
          for (int i = 0; i < D::kUnitsP; ++i)
            staged.issue(i == 0 ? src0 : src1, kb, static_cast<int>(gs & 1), prow(i));
        }
        cp_async_commit();
        int kt = 0;
        for (; kt + 1 < ktiles; kt += 2) {
          step(kt, r0, r1);
          step(kt + 1, r1, r0);
        }
        if (kt < ktiles) step(kt, r0, r1);
        gs += ktiles;
      }
    }
    cp_async_wait<0>();
    // The consumers release every step; the loop waited for the releases of steps [0, gs - S): take the rest, so
    // that no barrier is left with arrivals at exit.
    for (int64_t G = gs > kWgStages ? gs - kWgStages : 0; G < gs; ++G)
      bar_sync(kBarEmpty + static_cast<int>(G % kWgStages), kWgThreads);
  } else {
    // ------------------------------------------------------------------ consumer warpgroups
    const int cw = (tid >> 7) - 1;  // rows cw·kM/2 .. of the tile (kHalves m64 halves)
    const int lane = tid & 31, wq = (tid >> 5) & 3;
    // Column pairs as one 8-byte store when every row start is 8-byte aligned. Split-K: rows of the split's slice.
    float* const c_base = kSplitK ? p.split_part : p.c;
    const int64_t ldc = kSplitK ? p.n : p.ldc;
    const bool vec2 = ldc % 2 == 0 && reinterpret_cast<uintptr_t>(c_base) % 8 == 0;
    int64_t gs = 0;
    for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
      int g, split, kb, ktiles;
      int64_t row_begin, row_end, tmn;
      tile_of(t, tmn, split, kb, ktiles);
      if (!wg_tile_rows<kTall>(p, tmn / tiles_n, plan, g, row_begin, row_end)) {
        if (scan_mapped<kTall>(p, plan)) break;  // past the last tile: so is every later t
        continue;
      }
      const int64_t n0 = (tmn % tiles_n) * T::kN;
      // 128 x 256: acc[0..127] = rows 0-63 of this warpgroup x 256 columns. 256 x 128: acc[64h .. 64h + 63] = rows
      // 64h .. 64h + 63 of this warpgroup's 128 x 128 columns.
      float acc[128];
#pragma unroll
      for (int i = 0; i < 128; ++i) acc[i] = 0.0f;
      pin(acc);
      auto mma_step = [&](int kt) {
        const int64_t G = gs + kt;
        const int st = static_cast<int>(G % kWgStages);
        bar_sync(kBarFull + st, kWgThreads);
        const uint32_t at = a_base + st * T::kABytes + cw * (T::kM / 2) * kRowBytes, bt = b_base + st * T::kBBytes;
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kWgK / 16; ++kk) {
          const uint64_t db = smem_desc(bt + k16_offset(kk));
          if constexpr (kTall) {
            // The second half's rows start 64 rows = 8 swizzle atoms later.
            wgmma_m64n128k16<0>(acc, smem_desc(at + k16_offset(kk)), db);
            wgmma_m64n128k16<64>(acc, smem_desc(at + 64 * kRowBytes + k16_offset(kk)), db);
          } else {
            wgmma_m64n256k16(acc, smem_desc(at + k16_offset(kk)), db);
          }
        }
        wgmma_commit();
        wgmma_wait<1>();  // step G - 1's products have read their stage: release it
        if (kt >= 1) bar_arrive(kBarEmpty + static_cast<int>((G - 1) % kWgStages), kWgThreads);
      };
      if constexpr (D::kChunksC > 0) {
        // This thread's unit of each step (DecodePlan). Step X is decoded after this warpgroup passed full(X - 1):
        // the other warpgroup had then retired its products of step X - 4 (the producer's arrival at full(X - 1)
        // follows its wait on empty(X - 4)), so stage X % 4 (last read at step X - 4) is free; the producer's rows of
        // that stage are other rows. Both consumer warpgroups arrive at full(X) only after decoding their rows of X.
        using Unit = Part<F, D::kChunksC>;
        const int u = tid - 128, hrow = D::kRowsP + u / D::kPartsC, hc0 = (u % D::kPartsC) * D::kChunksC;
        const bool s8 = F == QuantFormat::kMXFP4 || p.scale_e8m0;
        const PartSrc<F, D::kChunksC> src(p, g, n0 + hrow, hc0);
        auto decode = [&](int kt, const Unit& un) {
          const uint32_t tile = b_base + static_cast<int>((gs + kt) % kWgStages) * T::kBBytes;
          decode_part<F, kExact, D::kChunksC>(un, tile, hrow, hc0, s8);
          fence_proxy_async();
        };
        // Step kt's products, then step kt + 1's unit (codes in `next`), then the load of step kt + 2's codes into
        // `spare` (after decode's proxy fence, which may wait for this thread's loads in flight).
        auto split_step = [&](int kt, Unit& next, Unit& spare) {
          mma_step(kt);
          if (kt + 1 < ktiles) {
            decode(kt + 1, next);
            if (kt + 2 < ktiles) src.load(kb + kt + 2, spare);
          }
        };
        Unit h0, h1;
        src.load(kb, h0);
        if (ktiles > 1) src.load(kb + 1, h1);
        decode(0, h0);
        int kt = 0;
        for (; kt + 1 < ktiles; kt += 2) {
          split_step(kt, h1, h0);
          split_step(kt + 1, h0, h1);
        }
        if (kt < ktiles) split_step(kt, h1, h0);
      } else {
        for (int kt = 0; kt < ktiles; ++kt) mma_step(kt);
      }
      wgmma_wait<0>();
      bar_arrive(kBarEmpty + static_cast<int>((gs + ktiles - 1) % kWgStages), kWgThreads);
      pin(acc);
      gs += ktiles;

      // Accumulator (half hm, n8 tile j, row half h): row cw·kM/2 + 64 hm + wq·16 + lane/4 + 8h of the tile, columns
      // 8j + 2(lane%4) + 0/1: acc[64 hm + 4j + 2h + 0/1] (128 x 256: hm = 0, j < 32; 256 x 128: hm < 2, j < 16).
#pragma unroll
      for (int hm = 0; hm < T::kHalves; ++hm)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int64_t i = row_begin + cw * (T::kM / 2) + hm * 64 + wq * 16 + (lane >> 2) + 8 * h;
          if (i >= row_end) continue;
          const int64_t cr = kSplitK ? split * p.m + i : (p.c_rows ? p.c_rows[i] : i);
          float* crow = c_base + cr * ldc;
#pragma unroll
          for (int j = 0; j < T::kN / 8; ++j) {
            const int64_t col = n0 + j * 8 + (lane & 3) * 2;  // even
            store_pair(crow, col, p.n, acc[64 * hm + 4 * j + 2 * h], acc[64 * hm + 4 * j + 2 * h + 1], vec2);
          }
        }
    }
  }
#else
  __trap();  // built without sm_90a: run_gemm_wgmma never launches it (device_is_sm90)
#endif
}

bool aligned(const void* q, uintptr_t a) { return reinterpret_cast<uintptr_t>(q) % a == 0; }

template <QuantFormat F, bool kExact, int kDec, bool kTall>
void launch(const GemmKernelParams& p, int plan, cudaStream_t stream) {
  using T = WgTile<kTall>;
  if (p.group_offsets && p.max_tiles_m == 0) return;
  // Grouped: the plan's tiles (128 x 256: a block per plan tile, every other one starting a tile), or a bound of the
  // scan-mapped tiles (Σ T_g <= max_tiles_m, c_g = ceil(T_g / 2) <= (T_g + 1) / 2): all 256-row tiles Σ ceil(c_g / 2)
  // <= (max_tiles_m + 3·groups) / 4, pairs Σ floor(c_g / 2) <= (max_tiles_m + groups) / 4, leftovers <= groups.
  const int64_t groups = p.groups;
  const int64_t tiles_m = !p.group_offsets        ? ceil_div(p.m, T::kM)
                          : plan == kPlanLeftover ? groups
                          : !kTall                ? p.max_tiles_m
                          : plan == kPlanPairs    ? ceil_div(p.max_tiles_m + groups, 4)
                                                  : ceil_div(p.max_tiles_m + 3 * groups, 4);
  const int64_t tiles_n = ceil_div(p.n, T::kN);
  if (tiles_m == 0 || tiles_n == 0) return;
  const int64_t tiles = tiles_m * tiles_n;
  DI_CHECK(tiles < (int64_t{1} << 31) && tiles_n < (int64_t{1} << 31)) << "gemm: " << tiles << " tiles are too many";
  auto* kernel = gemm_wgmma_kernel<F, kExact, kDec, kTall>;
  const size_t smem = kWgSmem + (kDec == 3 ? StagedCodes<kTall>::kBytes : 0);
  DI_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  kernel<<<static_cast<unsigned>(tiles), kWgThreads, smem, stream>>>(p, static_cast<int>(tiles_n), tiles, plan, 1);
  DI_CUDA_CHECK_LAUNCH();
}

// c[i, j] = Σ_s part[s][i, j] over s = 0, 1, ..., splits - 1 in that order (a fixed sum whatever the launch).
__global__ void wgmma_split_reduce_kernel(const float* part, int splits, int64_t m, int64_t n, float* c, int64_t ldc) {
  const int64_t total = m * n;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float sum = part[idx];
    for (int sp = 1; sp < splits; ++sp) sum += part[sp * total + idx];
    c[(idx / n) * ldc + idx % n] = sum;
  }
}

// A dense call split along K (the default decode placement, the 128 x 256 tile), then the reduce.
template <QuantFormat F>
void launch_split(const GemmKernelParams& p, int splits, cudaStream_t stream) {
  constexpr int kDec = F == QuantFormat::kMXFP4 ? 1 : 0;
  const int64_t tiles_n = ceil_div(p.n, WgTile<false>::kN), tiles = ceil_div(p.m, WgTile<false>::kM) * tiles_n * splits;
  auto* kernel = gemm_wgmma_kernel<F, false, kDec, false, true>;
  DI_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kWgSmem)));
  kernel<<<static_cast<unsigned>(tiles), kWgThreads, kWgSmem, stream>>>(p, static_cast<int>(tiles_n), tiles, kPlanAll,
                                                                        splits);
  DI_CUDA_CHECK_LAUNCH();
  const unsigned blocks = grid_1d(p.m * p.n, 256) > 4096 ? 4096 : grid_1d(p.m * p.n, 256);
  wgmma_split_reduce_kernel<<<blocks, 256, 0, stream>>>(p.split_part, splits, p.m, p.n, p.c, p.ldc);
  DI_CUDA_CHECK_LAUNCH();
}

// Decode placement (p.choices.wgmma_decode overrides; the f32 decode runs producer-decoded). MXFP4: the producer from
// staged codes (H200, session 29, PrefillExpertGemmTimings against the split at the same tile: V4-Flash at 4096
// tokens gate 1.544 -> 1.408 ms, down 1.559 -> 1.458; V4.1 at 8192 mixed gate 4.044 -> 3.778, down 4.217 -> 3.932;
// V4-Flash at 8192 within 1%), else (K % 128 != 0, unaligned scales) split between producer and consumers (session
// 14: gate at 8192 tokens 3.49 -> 3.01 ms against the producer). FP8: split in the 256 x 128 tile (session 29, V4-Flash
// shared expert at 8192 rows: gate 0.362 -> 0.304 ms, down 0.371 -> 0.314 against the producer), the producer in the
// 128 x 256 one (the split measured the same there: 0.436 vs 0.443 ms); FP8 rows of 32 (not measured tall): the
// producer.
template <QuantFormat F, bool kTall>
void launch(const GemmKernelParams& p, bool exact, int plan, cudaStream_t stream) {
  if constexpr (F == QuantFormat::kFloat) {  // bf16 weights: copied by the producer, nothing to decode
    launch<F, false, 0, kTall>(p, plan, stream);
  } else {
    const bool by_format = p.choices.wgmma_decode == WgmmaDecode::kByFormat;
    const WgmmaDecode format_pick = F == QuantFormat::kMXFP4               ? WgmmaDecode::kProducerStaged
                                    : F == QuantFormat::kFP8Block && kTall ? WgmmaDecode::kSplit
                                                                           : WgmmaDecode::kProducer;
    const int dec = static_cast<int>(by_format ? format_pick : p.choices.wgmma_decode);
    if (exact) {
      launch<F, true, 0, kTall>(p, plan, stream);
    } else if (dec == 3) {
      // Staged codes: MXFP4 with K % 128 (a row's scales of a step in one aligned word); else the register loads,
      // split when the format picked staging (its measured runner-up), else on the producer as asked.
      if constexpr (F == QuantFormat::kMXFP4) {
        if (p.k % 128 == 0 && (p.b_scale_table ? p.tables_aligned16 : aligned(p.b_scale, 4))) {
          launch<F, false, 3, kTall>(p, plan, stream);
          return;
        }
      }
      if (by_format)
        launch<F, false, 1, kTall>(p, plan, stream);
      else
        launch<F, false, 0, kTall>(p, plan, stream);
    } else if (dec == 2) {
      launch<F, false, 2, kTall>(p, plan, stream);
    } else if (dec == 1) {
      launch<F, false, 1, kTall>(p, plan, stream);
    } else {
      launch<F, false, 0, kTall>(p, plan, stream);
    }
  }
}
template <QuantFormat F>
void launch(const GemmKernelParams& p, bool exact, WgmmaTile tile, cudaStream_t stream) {
  if (tile == WgmmaTile::k256x128) {
    launch<F, true>(p, exact, kPlanAll, stream);
  } else if (tile == WgmmaTile::kMixed && p.group_offsets) {
    // Two launches on one stream, disjoint rows: each output is computed as in either single-tile launch.
    launch<F, true>(p, exact, kPlanPairs, stream);
    launch<F, false>(p, exact, kPlanLeftover, stream);
  } else {
    launch<F, false>(p, exact, kPlanAll, stream);
  }
}

// What every wgmma call needs, whatever its rows: formats, K, block sizes, alignment, no batch-invariant mode.
bool wgmma_supports(const GemmKernelParams& p) {
  if (p.choices.wgmma == KernelPick::kNever || !p.a_bf16 || p.batch_invariant) return false;
  // bf16 weights (b_bf16): grouped calls only (the MoE experts), A's lo terms 16-byte aligned as A.
  const bool bf16w =
      p.format == QuantFormat::kFloat && p.b_bf16 && p.group_offsets && (!p.a_lo_bf16 || aligned(p.a_lo_bf16, 16));
  if (p.format != QuantFormat::kFP8Block && p.format != QuantFormat::kMXFP4 && p.format != QuantFormat::kFP8Row32 &&
      !bf16w)
    return false;
  if (p.k <= 0 || p.k % kWgK != 0) return false;
  // FP8 blocks: powers of two (the producer indexes scales with shifts), at least 32 wide in K (a scale per half
  // step); the checkpoints' are 128 and 32.
  const auto pow2 = [](int v) { return v > 0 && (v & (v - 1)) == 0; };
  if (p.format == QuantFormat::kFP8Block && (!pow2(p.block_n) || !pow2(p.block_k) || p.block_k < 32)) return false;
  if (p.lda % 8 != 0 || !aligned(p.a_bf16, 16)) return false;
  if (p.b_table ? !p.tables_aligned16 : !aligned(p.b, 16)) return false;
  return true;
}
// f32 scales are not powers of two: decode as gemm_mma does (bf16 of the f32 product).
bool wgmma_exact(const GemmKernelParams& p) {
  return p.choices.wgmma_exact || (p.format != QuantFormat::kMXFP4 && !p.scale_e8m0);
}

}  // namespace

bool device_is_sm90() {
  static const bool yes = [] {
    int dev = 0, major = 0, minor = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return false;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) return false;
    if (cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) return false;
    return major == 9 && minor == 0;
  }();
  return yes;
}

int wgmma_dense_splits(int64_t m, int64_t n, int64_t k, int sms) {
  const int64_t tiles = ceil_div(m, WgTile<false>::kM) * ceil_div(n, WgTile<false>::kN), steps = k / kWgK;
  if (tiles <= 0 || tiles >= sms) return 1;
  const int64_t splits = std::min<int64_t>({sms / tiles, steps / kWgSplitMinSteps, kWgMaxSplits});
  return splits >= 2 ? static_cast<int>(splits) : 1;
}

namespace {
// Whether a dense call may be split along K at all (gemm_wgmma_k_splits then counts the splits).
bool split_eligible(const GemmKernelParams& p) {
  // Opt-in (kAlways) until it wins: measured slower than the cuBLASLt scratch path (docs/PERF.md, session 21).
  if (p.group_offsets || p.c_rows || p.m <= 0 || p.n <= 0 || p.choices.wgmma_split_k != KernelPick::kAlways)
    return false;
  // The split runs the default decode placement and tile, and the bf16x2 decode only.
  if (p.choices.wgmma_decode != WgmmaDecode::kByFormat || wgmma_tile(p) != WgmmaTile::k128x256) return false;
  return wgmma_supports(p) && !wgmma_exact(p) && !gemm_mma_dense_fills(p.m, p.n) && device_is_sm90();
}

bool gemm_wgmma_takes(const GemmKernelParams& p) {
  if (!wgmma_supports(p)) return false;
  if (p.group_offsets) {
    if (p.choices.wgmma != KernelPick::kAlways && (p.rows_hint > 0 ? p.rows_hint : p.m) < kGemmWgmmaMinRows)
      return false;
  } else if (!gemm_mma_dense_fills(p.m, p.n)) {
    if (p.k_splits < 2 || !p.split_part || !split_eligible(p)) return false;
  }
  return device_is_sm90();
}
}  // namespace

int gemm_wgmma_k_splits(const GemmKernelParams& p, int sm_count) {
  return split_eligible(p) ? wgmma_dense_splits(p.m, p.n, p.k, sm_count) : 1;
}

WgmmaTile wgmma_tile(const GemmKernelParams& p) {
  const WgmmaTile forced = p.choices.wgmma_tile;
  if (forced != WgmmaTile::kByRows)
    return forced == WgmmaTile::kMixed && !p.group_offsets ? WgmmaTile::k128x256 : forced;
  // Dense calls: 256 x 128 for FP8 blocks from kGemmWgmmaDenseTallRows rows (the split K path runs 128 x 256 only and
  // takes calls short of the device fill), else 128 x 256.
  if (!p.group_offsets)
    return p.format == QuantFormat::kFP8Block && p.m >= kGemmWgmmaDenseTallRows && gemm_mma_dense_fills(p.m, p.n)
               ? WgmmaTile::k256x128
               : WgmmaTile::k128x256;
  return (p.rows_hint > 0 ? p.rows_hint : p.m) >= kGemmWgmmaMixedRows ? WgmmaTile::kMixed : WgmmaTile::k128x256;
}

bool run_gemm_wgmma(const GemmKernelParams& p, cudaStream_t stream) {
  if (!gemm_wgmma_takes(p)) return false;
  if (p.m == 0 || p.n == 0) return true;
  if (!p.group_offsets && !gemm_mma_dense_fills(p.m, p.n)) {
    if (p.format == QuantFormat::kMXFP4)
      launch_split<QuantFormat::kMXFP4>(p, p.k_splits, stream);
    else if (p.format == QuantFormat::kFP8Block)
      launch_split<QuantFormat::kFP8Block>(p, p.k_splits, stream);
    else
      launch_split<QuantFormat::kFP8Row32>(p, p.k_splits, stream);
    return true;
  }
  const bool exact = wgmma_exact(p);
  const WgmmaTile tile = wgmma_tile(p);
  switch (p.format) {
    case QuantFormat::kFP8Block:
      launch<QuantFormat::kFP8Block>(p, exact, tile, stream);
      return true;
    case QuantFormat::kMXFP4:
      launch<QuantFormat::kMXFP4>(p, exact, tile, stream);
      return true;
    case QuantFormat::kFP8Row32:
      launch<QuantFormat::kFP8Row32>(p, exact, tile, stream);
      return true;
    case QuantFormat::kFloat:  // bf16 weights (wgmma_supports)
      launch<QuantFormat::kFloat>(p, false, tile, stream);
      return true;
    default:
      return false;
  }
}

}  // namespace deepinfer::cuda
