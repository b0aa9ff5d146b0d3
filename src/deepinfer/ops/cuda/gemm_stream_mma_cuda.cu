// Decode GEMMs of the block formats as a weight stream through the tensor cores.
//
// Why: at decode every projection and the MoE experts see 1-8 rows per weight, so the GEMM is a stream of weight
// bytes. The fp32 column-group kernel of gemm_cuda.cu moved them at ~0.85 TB/s (MXFP4 experts, V4.1 batch 1)
// and 9.4 us per 2.5 MB FP8 projection: each warp issued one round of loads, waited for it, computed, and was done
// (latency-bound), and its FMAs scale with the rows (4 rows cost 4x). Here:
// - each warp owns a tile of 8 or 16 weight rows (an operand of mma.sync m16n8k16; see the kernel for when which)
//   and a contiguous slice of K, and keeps 128 bytes a lane of weight loads in flight in registers while it
//   computes, so a long-lived warp streams instead of waiting once per block;
// - the codes are placed into bf16 bit patterns (e4m3 / e2m1 are a sub-range of bf16's exponent and mantissa: the
//   placement is the exact value times 2^-120 / 2^-126, subnormal codes included) and one bf16x2 multiply applies
//   the UE8M0 scale and the 2^120 / 2^126 back exactly: ~2.5 instructions a weight, whatever the row count;
// - the up to 8 activation rows are the other operand, staged once per block in shared memory as bf16 in the order
//   the fragments need (one conflict-free 8-byte load per mma and lane).
// K order inside an mma is free as long as A and B agree, so a lane's fragment pairs are the codes that share a
// word's bit positions (e2m1 codes i and i + 4, e4m3 bytes 0 and 2 / 1 and 3).
#include "deepinfer/ops/cuda/gemm_stream_mma.h"

#include <cuda_bf16.h>

#include <algorithm>

#include "deepinfer/ops/cuda/cuda_check.h"
#include "deepinfer/ops/cuda/device_math.cuh"
#include "deepinfer/ops/cuda/gemm_decode.cuh"
#include "deepinfer/ops/cuda/gemm_stream_decode.cuh"

namespace deepinfer::cuda {
namespace {

using namespace stream_decode;

constexpr int kSmWarps = 8;
constexpr int kPrefetchBytes = 128;  // weight bytes in flight per lane
constexpr int kTargetWarps = 2048;   // ~16 streaming warps per SM on 132 SMs
// The activation stage, up to 96 KB (two blocks an SM still fit): at K = 8192 (V4 o_b) 48 KB held 2 rows, so
// 4-8 rows streamed the weights two to four times.
constexpr int64_t kStageBytes = 96 * 1024;
constexpr int64_t kDefaultSmemBytes = 48 * 1024;  // above it a kernel needs the opt-in attribute

// Two tile shapes. W16 = false: 8 weight rows per warp as the mma's B operand, the activation rows as A (rows 8..15
// unused): twice the warps of 16-row tiles for small N. W16 = true: 16 weight rows as A, the activations as B: half
// the mmas and activation fragment loads per weight, for calls with tiles enough to fill the device.
// Grid: x = n-tile blocks (groups_arg groups of nw tiles, one after another over the staged rows; 16-row tiles only),
// y = group slots (or the pass table's passes). Block: kSmWarps warps = nw n-tiles x kw K slices (kw = kSmWarps / nw,
// a runtime value); the kw partial sums of a tile add in warp order (deterministic).
// Dynamic shared memory: the pass's R activation rows as bf16 fragments, [step][mma][row][lane % 4] x 8 bytes.
// kAcc independent accumulator chains per warp (4; batch-invariant mode 1, the chain the tile kernel of
// gemm_invariant_mma_cuda.cu repeats: a warp's partial is the chain of its slice's mmas in step and mma order).
// kBf16A (batch-invariant mode): the activations come from the caller's bf16 copy p.a_bf16.
// kF32S: FP8 blocks with f32 scales (V3 / R1 checkpoints; blocks >= 16 rows and >= 128 along K, default mode only).
// An f32 scale times a code is not a bf16 value, so the codes go in unscaled (exact) and the scale multiplies the
// sums instead: a pair of steps (128 K, slices start on even steps) lies inside one K block and a tile's rows inside
// one row block, so one scale covers a pair's mma sums for the whole warp; they go into kChains block sums, then
// acc += scale · block sum. The weights stay exact, A is rounded to bf16 as for UE8M0 scales. Half the chains of
// the UE8M0 form, so the block sums take no more registers (the kernel sits at the 128 of its launch bounds).
// kCodes (with kF32S; --activation-quant fp8, the V3 family's reference numerics): A comes as its e4m3 codes
// (p.a_e4m3, exact in bf16) and one f32 scale a row and 128-K block (p.a_scale), staged beside the codes, and each
// output's pair sums are promoted by the weight's scale times its row's: acc += (w_scale · a_scale) · block sum. No
// operand is rounded (rounding code · a_scale to bf16 was ~1.5e-3 of the output: session 34's regression).
template <QuantFormat F, int R, bool W16, int kAcc, bool kBf16A = false, bool kF32S = false, bool kCodes = false>
__global__ void __launch_bounds__(32 * kSmWarps, 2)
    gemm_stream_mma_kernel(GemmKernelParams p, int kw, int lbn, int lbk, bool a_vec, int groups_arg) {
  static_assert(kAcc == 1 || kAcc == 4, "the partial sums below");
  static_assert(!kF32S || (F == QuantFormat::kFP8Block && kAcc == 4), "f32 scales: FP8 blocks, default mode");
  static_assert(!kCodes || (kF32S && !kBf16A), "A as codes: with f32 weight scales, from the codes");
  constexpr int kChains = kF32S ? 2 : kAcc;                 // accumulator chains (and, kF32S, block-sum chains)
  constexpr int kRows = W16 ? 2 : 1, kOut = W16 ? 4 : 2;    // weight rows a lane loads; outputs a lane holds
  constexpr int kPrefetch = kPrefetchBytes / (16 * kRows);  // steps in flight: the same bytes for both shapes
  static_assert(kPrefetch % 2 == 0, "refills go by pairs of steps");
  const int tile_groups = W16 ? groups_arg : 1;  // (launch_shape gives 8-row tiles one group)
  extern __shared__ __align__(16) uint2 xs[];
  __shared__ float part[kSmWarps][kOut][32];
  // kCodes: the activation scales after the staged codes (launch_shape sizes both).
  [[maybe_unused]] const int a_blocks = (p.k + 127) / 128;
  [[maybe_unused]] float* a_sc = reinterpret_cast<float*>(xs + ((p.k / kChunkK<F> + 3) / 4) * kMmas<F> * R * 4);
  __shared__ int64_t a_row[R], c_row[R];
  constexpr int kMi = kMmas<F>;
  // Grouped: the weights' address depends on the plan (an earlier kernel's output) through two loads; the slot's
  // entry is read together with the count (in bounds: slots <= groups) and the group's rows only after the first
  // weight loads are out, so one round trip separates the start from the weight stream instead of four.
  // With the plan's pass table (launch: R == p.pass_rows) the slot is one R-row pass of a group, not the group.
  int grp = 0, pass = -1;
  if (p.group_offsets) {
    if (p.active_passes) {
      const int count = p.active_passes[p.pass_capacity], entry = p.active_passes[blockIdx.y];
      if (static_cast<int>(blockIdx.y) >= count) return;
      grp = entry & 0xFFFF;
      pass = entry >> 16;
    } else {
      const int count = p.active_groups[p.groups], slot_group = p.active_groups[blockIdx.y];
      if (static_cast<int>(blockIdx.y) >= count) return;
      grp = slot_group;
    }
  }
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int nw = kSmWarps / kw, wn = warp / kw, wk = warp % kw;
  int64_t n0 = 0;
  const uint8_t* b = static_cast<const uint8_t*>(p.b_table ? p.b_table[grp] : p.b);
  const uint8_t* s = static_cast<const uint8_t*>(p.b_scale_table ? p.b_scale_table[grp] : p.b_scale);
  const int chunks = static_cast<int>(p.k / kChunkK<F>), steps = (chunks + 3) / 4;
  // Default mode: slices start on even steps, so the pairs of refills below are whole 128-byte lines. (The
  // batch-invariant chain keeps the tile kernel's slice bounds.)
  const auto s_bound = [&](int w) { return kAcc == 1 || w == kw ? steps * w / kw : (steps * w / kw) & ~1; };
  const int s_begin = s_bound(wk), s_end = s_bound(wk + 1);
  // Rows past N read row 0 (in bounds) and contribute nothing: their outputs are never written.
  // (Not WeightRows: through it ptxas allocated this kernel's registers differently; its SASS is the measured one.)
  const uint4* wrow[kRows];
  const uint8_t* srow[kRows];
  // Tile group f of the block's tile_groups: its warps' weight rows.
  const auto set_rows = [&](int f) {
    n0 = ((static_cast<int64_t>(blockIdx.x) * tile_groups + f) * nw + wn) * 8 * kRows;
#pragma unroll
    for (int h = 0; h < kRows; ++h) {
      const int64_t n = n0 + g + 8 * h;
      wrow[h] = reinterpret_cast<const uint4*>(b + (n < p.n ? n : 0) * chunks * 16) + t;
      if constexpr (kF32S)  // the tile's row block (every row of the tile is in it): f32 entries
        srow[h] = s + ((n0 < p.n ? n0 : 0) >> lbn) * p.scale_cols * int64_t{4};
      else
        srow[h] = scale_row<F>(p, s, n < p.n ? n : 0, lbn);
    }
  };
  set_rows(0);

  auto load = [&](int st, StepData<kRows>& d) {
    const int c = 4 * st + t;
    const bool ok = st < s_end && c < chunks;
#pragma unroll
    for (int h = 0; h < kRows; ++h) {
      d.q[h] = ok ? ld_stream(wrow[h] + 4 * st) : make_uint4(0, 0, 0, 0);
      if constexpr (kF32S) {
        // The step's K block for every lane (a lane past K still scales the sums its outputs hold), once a tile.
        if (h == 0)
          d.e[0] = st < s_end ? __ldg(reinterpret_cast<const uint32_t*>(srow[0]) + ((4 * st * 16) >> lbk)) : 0u;
      } else {
        d.e[h] = ok ? srow[h][scale_offset<F>(c, lbk)] : 127u;
      }
    }
  };

  // The first steps' weight loads go out before the activation stage is built, so they are in flight meanwhile.
  StepData<kRows> buf[kPrefetch];
#pragma unroll
  for (int u = 0; u < kPrefetch; ++u) load(s_begin + u, buf[u]);
  int64_t begin = p.group_offsets ? p.group_offsets[grp] : 0, end = p.group_offsets ? p.group_offsets[grp + 1] : p.m;
  if (pass >= 0) {
    begin += static_cast<int64_t>(pass) * R;
    end = end < begin + R ? end : begin + R;
  }
  for (int64_t r0 = begin; r0 < end; r0 += R) {
    if (r0 != begin) {  // a further pass over the weights for the next R rows
      set_rows(0);
#pragma unroll
      for (int u = 0; u < kPrefetch; ++u) load(s_begin + u, buf[u]);
    }
    if (tid < R) {
      const int64_t i = r0 + tid;
      a_row[tid] = i < end ? (p.a_rows ? p.a_rows[i] / p.a_row_div : i) : -1;
      c_row[tid] = i < end ? (p.c_rows ? p.c_rows[i] : i) : -1;
    }
    __syncthreads();
    // A thread per (row, chunk): the chunk's activations in one round of loads (16-byte ones when the rows are
    // aligned), then its kMi fragment entries. (Per-entry scalar loads made this a chain of dependent rounds.)
    constexpr int kC = kChunkK<F>;
    for (int q = tid; q < R * steps * 4; q += 32 * kSmWarps) {
      const int r = q % R, c = q / R;
      if constexpr (kCodes) {
        // 16 e4m3 codes a chunk (one 16-byte load), exact as f32 and so as bf16.
        float v[kC];
        uint4 u = make_uint4(0, 0, 0, 0);
        if (a_row[r] >= 0 && c < chunks)
          u = __ldg(reinterpret_cast<const uint4*>(p.a_e4m3 + a_row[r] * p.lda + int64_t{c} * kC));
        const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int i = 0; i < kC; ++i) v[i] = e4m3_to_f32_dev(static_cast<uint8_t>(w[i / 4] >> (8 * (i % 4))));
        place_pairs<F>(v, xs + ((c >> 2) * kMi * R + r) * 4 + (c & 3), R * 4);
        continue;
      }
      if constexpr (kBf16A) {
        // The caller's bf16 copy (RNE, the values the f32 path rounds to): half the bytes, no conversion.
        uint32_t h[kC / 2];
        load_chunk<F>(p, a_row[r], c, chunks, h);
        place_pairs<F>(h, xs + ((c >> 2) * kMi * R + r) * 4 + (c & 3), R * 4);
        continue;
      }
      float v[kC];
      load_chunk<F>(p, a_row[r], c, chunks, a_vec, v);
      place_pairs<F>(v, xs + ((c >> 2) * kMi * R + r) * 4 + (c & 3), R * 4);
    }
    if constexpr (kCodes) {
      // The rows' scales, [8][a_blocks] after the codes (rows past R or past the pass: 0, their outputs unwritten).
      const int64_t a_ld = p.lda / 128;
      for (int q = tid; q < 8 * a_blocks; q += 32 * kSmWarps) {
        const int r = q / a_blocks, kb = q % a_blocks;
        a_sc[q] = r < R && a_row[r] >= 0 ? reinterpret_cast<const float*>(p.a_scale)[a_row[r] * a_ld + kb] : 0.0f;
      }
    }
    __syncthreads();

    for (int f = 0; f < tile_groups; ++f) {
      // A group wholly past N (the grid's last block): nothing to do (the same for every warp of the block).
      if (f > 0 && (static_cast<int64_t>(blockIdx.x) * tile_groups + f) * nw * 8 * kRows >= p.n) break;
      if (f > 0) {  // the next tile group over the same staged rows
        set_rows(f);
#pragma unroll
        for (int u = 0; u < kPrefetch; ++u) load(s_begin + u, buf[u]);
      }
      // kAcc independent accumulators: one chain of dependent mmas per step was the critical path (ncu: ~8 cycles
      // per issued instruction at ~10 warps an SM on a 6.5 MB projection).
      float acc[kChains][4] = {};
      float blk[kChains][4];  // kF32S: the current pair of steps' sums, before its scale (else unused)
      for (int st0 = s_begin; st0 < s_end; st0 += kPrefetch) {
#pragma unroll
        for (int u = 0; u < kPrefetch; ++u) {
          const int st = st0 + u;
          if (st < s_end) {
            StepData<kRows>& d = buf[u];
            FormatScale<F> sc[kRows];
#pragma unroll
            for (int h = 0; h < kRows; ++h) sc[h].set(kF32S ? 127u : d.e[h]);  // kF32S: the codes' values (x 1)
            if constexpr (kF32S) {
              if ((u & 1) == 0) {
#pragma unroll
                for (int j = 0; j < kChains; ++j)
#pragma unroll
                  for (int i = 0; i < 4; ++i) blk[j][i] = 0.0f;
              }
            }
            const uint2* xrow = xs + st * (kMi * R * 4) + lane;
            const auto mmas = [&]<bool kMaybeTwo>() {
#pragma unroll
              for (int mi = 0; mi < kMi; ++mi) {
                uint32_t wp[kRows], wq[kRows];  // the P / Q fragment pairs of each row
#pragma unroll
                for (int h = 0; h < kRows; ++h) weight_pairs<F, kMaybeTwo>(d.q[h], sc[h], mi, wp[h], wq[h]);
                const uint2 x = g < R ? xrow[mi * R * 4] : make_uint2(0, 0);
                float(&sum)[4] = kF32S ? blk[mi % kChains] : acc[mi % kChains];
                if constexpr (W16) {
                  const uint32_t a[4] = {wp[0], wp[kRows - 1], wq[0], wq[kRows - 1]};
                  mma_bf16(sum, a, x.x, x.y);
                } else {
                  const uint32_t a[4] = {x.x, 0u, x.y, 0u};
                  mma_bf16(sum, a, wp[0], wq[0]);
                }
              }
            };
            // A scale past bf16's range for one multiply (2^129 and up: no realistic weight) takes the two-multiply
            // decode for the whole warp's step; the common step has no predicated second multiply per pair.
            bool two = false;
#pragma unroll
            for (int h = 0; h < kRows; ++h) two |= sc[h].two;
            if constexpr (kF32S)
              mmas.template operator()<false>();
            else if (__any_sync(0xffffffffu, two))
              mmas.template operator()<true>();
            else
              mmas.template operator()<false>();
            // kF32S: the pair's sums (or a slice's lone last step's) times their K block's scale.
            if constexpr (kF32S) {
              if ((u & 1) || st + 1 == s_end) {
                const float scale = __uint_as_float(d.e[0]);
                if constexpr (kCodes) {
                  // The activation row of output i: W16 rows 2t (i even) / 2t + 1 (odd); else row g (i 2-3 unused).
                  const float* sa = a_sc + (st >> 1);
                  const float f0 = scale * sa[(W16 ? 2 * t : g) * a_blocks];
                  const float f1 = W16 ? scale * sa[(2 * t + 1) * a_blocks] : f0;
#pragma unroll
                  for (int j = 0; j < kChains; ++j)
#pragma unroll
                    for (int i = 0; i < 4; ++i) acc[j][i] = fmaf(i & 1 ? f1 : f0, blk[j][i], acc[j][i]);
                } else {
#pragma unroll
                  for (int j = 0; j < kChains; ++j)
#pragma unroll
                    for (int i = 0; i < 4; ++i) acc[j][i] = fmaf(scale, blk[j][i], acc[j][i]);
                }
              }
            }
            // Refills after the math (the registers are free again), two steps at a time: a row's 64-byte halves of
            // one 128-byte line leave back to back. One refill a step let the halves reach L2 a step apart, and the
            // 256-byte prefetch hint then read 25% more than the weights from DRAM (ncu, V4-Flash b256 gate call,
            // H200, session 18: 1.38 -> 1.17 GB, 628 -> 578 us; V4.1 MoE layer T = 64-256 -10%; docs/PERF.md).
            // (A slice's last step when even needs no refill: the steps past it load nothing.)
            if (u & 1) {
              load(st - 1 + kPrefetch, buf[u - 1]);
              load(st + kPrefetch, d);
            }
          }
        }
      }
      // W16: acc 0 / 1 weight row g, activation rows 2t / 2t + 1; acc 2 / 3 the same for weight row g + 8.
      // Otherwise: acc 0 / 1 activation row g, weight rows 2t / 2t + 1 (acc 2 / 3: activation rows 8..15, empty).
#pragma unroll
      for (int i = 0; i < kOut; ++i) {
        if constexpr (kChains == 4)
          part[warp][i][lane] = (acc[0][i] + acc[1][i]) + (acc[2][i] + acc[3][i]);
        else if constexpr (kChains == 2)
          part[warp][i][lane] = acc[0][i] + acc[1][i];
        else
          part[warp][i][lane] = acc[0][i];
      }
      __syncthreads();
      if (wk == 0) {
#pragma unroll
        for (int i = 0; i < kOut; ++i) {
          float sum = part[warp][i][lane];
          for (int w = 1; w < kw; ++w) sum += part[warp + w][i][lane];
          const int r = W16 ? 2 * t + (i & 1) : g;
          const int64_t col = W16 ? n0 + g + (i >= 2 ? 8 : 0) : n0 + 2 * t + i;
          if (r < R && c_row[r] >= 0 && col < p.n) p.c[c_row[r] * p.ldc + col] = sum;
        }
      }
      __syncthreads();
    }
  }
}

// fixed_kw > 0 (batch-invariant mode): that many K slices, whatever the call's tiles and slots.
template <QuantFormat F, int R, bool W16, int kAcc = 4, bool kBf16A = false, bool kF32S = false, bool kCodes = false>
void launch_shape(const GemmKernelParams& p, int64_t slots, int lbn, int lbk, cudaStream_t stream, int fixed_kw = 0) {
  const int64_t chunks = p.k / kChunkK<F>, steps = ceil_div(chunks, 4), tiles = ceil_div(p.n, W16 ? 16 : 8);
  int kw = 1;  // K slices per tile: enough warps to stream, at least two steps each
  while (kw < kSmWarps && tiles * slots * kw < kTargetWarps && steps >= 4 * kw) kw *= 2;
  if (fixed_kw > 0) kw = fixed_kw;
  const int nw = kSmWarps / kw;
  // Calls of many blocks (decode batches from ~64 tokens: a block per 8-row pass of each expert) give a block up to
  // 4 groups of nw tiles over one staging of its rows while that leaves 4 device waves of warps: a pass's activations
  // (8 rows x K bf16, ~1/4 of the block's weight bytes) were staged once per nw tiles. H200, session 19, same call:
  // V4.1 MoE layer T = 64 / 128 / 256 -2 / -3 / -3%; slices decode b64-b256 -3.0 to -4.7% (docs/PERF.md).
  int tile_groups = 1;
  if (W16 && kw == 1 && fixed_kw == 0) {
    const int64_t active = p.group_offsets ? std::min<int64_t>(slots, std::max<int64_t>(p.m, 1)) : slots;
    while (tile_groups < 4 && ceil_div(tiles, int64_t{nw} * tile_groups * 2) * active * kSmWarps >= 4 * kTargetWarps)
      tile_groups *= 2;
  }
  const size_t smem = static_cast<size_t>(steps * kMmas<F> * R * 4) * sizeof(uint2) +
                      (kCodes ? sizeof(float) * 8 * static_cast<size_t>(ceil_div(p.k, int64_t{128})) : 0);
  if (smem > static_cast<size_t>(kDefaultSmemBytes))
    DI_CUDA_CHECK(cudaFuncSetAttribute(gemm_stream_mma_kernel<F, R, W16, kAcc, kBf16A, kF32S, kCodes>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  const dim3 grid(static_cast<unsigned>(ceil_div(tiles, nw * tile_groups)), static_cast<unsigned>(slots));
  const bool a_vec = p.lda % 4 == 0 && reinterpret_cast<uintptr_t>(p.a) % 16 == 0;
  // A plain launch: programmatic dependent launch measured slower (H200, V4.1 decode at batch 1, same call: 2.44 ms
  // without, 3.04 ms with; the grouped calls started early and waited for the plan while holding SM slots).
  gemm_stream_mma_kernel<F, R, W16, kAcc, kBf16A, kF32S, kCodes>
      <<<grid, 32 * kSmWarps, smem, stream>>>(p, kw, lbn, lbk, a_vec, tile_groups);
  DI_CUDA_CHECK_LAUNCH();
}

// Whether a call over f32-scaled FP8 blocks stages A from its e4m3 codes and per-128 f32 scales (the V3 family's
// --activation-quant fp8) rather than rounding p.a to bf16.
bool stream_codes(const GemmKernelParams& p) { return p.a_e4m3 && p.a_scale && p.a_scale_block128; }

// 16-row tiles from 80 of them (op micro-bench, H200, 08fddc7, M = 1, 8-row vs 16-row µs: q_a 1280x5120 10.7 vs
// 10.3, o_b 5120x8192 33.2 vs 28.7, q_b 32768x1280 24.5 vs 20.7, MoE T=1 (6 experts x 144 tiles) 145 vs 132, T=8
// 618 vs 534; 8-row wins below: kv 512x5120 8.4 vs 10.4, o_a 1024x4096 7.7 vs 8.8). The previous threshold, 1024,
// kept q_a, o_b and the T=1 experts on 8-row tiles. Not yet measured in the slices.
constexpr int64_t kW16MinTiles = 80;

template <QuantFormat F, int R, bool kF32S = false>
void launch(const GemmKernelParams& p, int64_t slots, int lbn, int lbk, cudaStream_t stream) {
  const bool w16 = ceil_div(p.n, 16) * slots >= kW16MinTiles;
  // The caller's bf16 copy of A when it made one (the MoE layer from ~3 rows an expert): the same staged bits as
  // rounding the f32 rows here, half the bytes (V4.1 MoE layer T = 256, H200, session 16: 4.28 vs 4.45 ms at 4 rows
  // a pass; docs/PERF.md).
  const bool a16 = p.a_bf16 && p.lda % 8 == 0 && reinterpret_cast<uintptr_t>(p.a_bf16) % 16 == 0;
  if constexpr (kF32S) {
    // A as e4m3 codes and f32 scales a 128-K block (run checked their alignment): the exact form.
    if (stream_codes(p)) {
      if (w16)
        launch_shape<F, R, true, 4, false, true, true>(p, slots, lbn, lbk, stream);
      else
        launch_shape<F, R, false, 4, false, true, true>(p, slots, lbn, lbk, stream);
      return;
    }
  }
  if (w16 && a16)
    launch_shape<F, R, true, 4, true, kF32S>(p, slots, lbn, lbk, stream);
  else if (w16)
    launch_shape<F, R, true, 4, false, kF32S>(p, slots, lbn, lbk, stream);
  else
    launch_shape<F, R, false, 4, false, kF32S>(p, slots, lbn, lbk, stream);
}

// One row a weight and fewer 16-row tiles than this: the fp32 column-group kernel (gemm_cuda.cu) is faster there
// (op micro-bench, H200, 45c8905, M = 1, fp32 vs stream-mma µs: q_a 1280x5120 9.1 vs 10.4, kv 512x5120 7.8 vs 8.4,
// o_a 8 x 1024x4096 grouped 6.9 vs 7.8, o_b 5120x8192 21.3 vs 27.9; q_b 32768x1280, 2048 tiles: 27.3 vs 20.2) and
// exact in A. 768 since session 46 (was 1024): the routed experts' gate and up at batch 1 (6 slots x 128 / 144 tiles)
// ran at 0.86 TB/s on the fp32 kernel (ncu, H100, V4-Flash: 31 us a call for 26.8 MB); on this kernel the slices'
// batch-1 graph steps went 0.731 -> 0.691-0.699 ms (V4-Flash) and 1.613-1.617 -> 1.481-1.484 (V4.1), same run, H100
// (docs/PERF.md). 512 (which also moves the 8-group o_a) was no better as a graph and slower eager.
constexpr int64_t kOneRowMinTiles = 768;

// Batch-invariant mode: 16-row tiles, kw K slices, one accumulator chain; the activations from the caller's bf16
// copy when there is one (16-byte rows). (16-warp blocks, whose staged rows served two tiles, measured slower at
// decode batch 64: H200, session 15, V4-Flash experts 8.34 vs 7.72 ms.)
template <QuantFormat F, int R>
void launch_invariant(const GemmKernelParams& p, int64_t slots, int lbn, int lbk, cudaStream_t stream, int kw) {
  const bool a16 = p.a_bf16 && p.lda % 8 == 0 && reinterpret_cast<uintptr_t>(p.a_bf16) % 16 == 0;
  if (a16)
    launch_shape<F, R, true, kInvariantMmaAcc, true>(p, slots, lbn, lbk, stream, kw);
  else
    launch_shape<F, R, true, kInvariantMmaAcc, false>(p, slots, lbn, lbk, stream, kw);
}

// invariant_kw > 0: batch-invariant mode (16-row tiles, that many K slices, one accumulator chain), any row count.
// kF32S: f32 block scales (default mode only).
template <QuantFormat F, bool kF32S = false>
bool dispatch(const GemmKernelParams& p, int64_t rows, int lbn, int lbk, cudaStream_t stream, int invariant_kw = 0) {
  int64_t slots = p.group_offsets ? std::max<int64_t>(std::min<int64_t>(p.groups, p.m), 1) : 1;
  if (!invariant_kw && !gemm_stream_mma_takes_shape(rows, p.n, slots, p.choices)) return false;
  const int64_t kpad = ceil_div(p.k / kChunkK<F>, 4) * 4 * kChunkK<F>;
  int r = 8;
  while (r > 1 && r / 2 >= rows) r /= 2;  // the smallest of 1, 2, 4, 8 covering rows
  // Grouped calls of many slots (decode batches from ~10 tokens): 8 rows a pass whatever the mean, so the experts
  // above the mean (Poisson-spread routing) stream their weights once instead of two or three times; the mma count
  // per weight is the same for 1-8 rows (the n8 operand). H200, session 16: V4-Flash slice decode b64 / b128
  // 7.86 / 8.82 -> 6.17 / 7.28 ms; V4.1 MoE layer T = 64 / 128 / 256: 3.53 / 4.22 / 4.45 -> 3.25 / 3.66 / 3.88 ms.
  if (p.group_offsets && !invariant_kw && p.m >= kGroupedFullPassSlots) r = 8;
  const int64_t stage = kStageBytes;
  while (r > 1 && 2 * kpad * r > stage) r /= 2;  // more rows than fit: passes
  if (2 * kpad * r > stage) return false;
  // The plan's pass table when its passes are this launch's: a block per pass (grid y = the table's capacity; the
  // blocks past its count return at once), so a group's passes run side by side and its later passes read the
  // weights from L2 instead of streaming them again from HBM after the earlier ones. H200, session 17 (skewed routing
  // of the slices' random routers): V4-Flash decode b256 experts 7.26 -> 6.82 ms, V4.1 19.34 -> 18.73; the same with
  // uniform routing (docs/PERF.md).
  GemmKernelParams q = p;
  const bool passes = p.active_passes && !invariant_kw && r == p.pass_rows;
  if (passes)
    slots = p.pass_capacity;
  else
    q.active_passes = nullptr;
  if (invariant_kw) {
    switch (r) {
      case 1:
        launch_invariant<F, 1>(q, slots, lbn, lbk, stream, invariant_kw);
        break;
      case 2:
        launch_invariant<F, 2>(q, slots, lbn, lbk, stream, invariant_kw);
        break;
      case 4:
        launch_invariant<F, 4>(q, slots, lbn, lbk, stream, invariant_kw);
        break;
      default:
        launch_invariant<F, 8>(q, slots, lbn, lbk, stream, invariant_kw);
        break;
    }
    return true;
  }
  switch (r) {
    case 1:
      launch<F, 1, kF32S>(q, slots, lbn, lbk, stream);
      break;
    case 2:
      launch<F, 2, kF32S>(q, slots, lbn, lbk, stream);
      break;
    case 4:
      launch<F, 4, kF32S>(q, slots, lbn, lbk, stream);
      break;
    default:
      launch<F, 8, kF32S>(q, slots, lbn, lbk, stream);
      break;
  }
  return true;
}

}  // namespace

bool gemm_stream_mma_takes_shape(int64_t rows, int64_t n, int64_t slots, const GemmChoices& choices) {
  const int64_t min_tiles = choices.stream_mma_one_row_tiles >= 0 ? choices.stream_mma_one_row_tiles : kOneRowMinTiles;
  return rows > 1 || ceil_div(n, 16) * slots >= min_tiles;
}

bool gemm_stream_mma_takes_f32_scales(QuantFormat format, int block_n, int block_k, int64_t k,
                                      const GemmChoices& choices) {
  // Blocks of >= 16 rows hold a whole tile, >= 128 along K a pair of steps.
  return choices.f32_scale_mma && format == QuantFormat::kFP8Block && decodes_layout(format, block_n, block_k, k) &&
         log2_exact(block_n) >= 4 && log2_exact(block_k) >= 7;
}

namespace {
bool run(const GemmKernelParams& p, int64_t rows, cudaStream_t stream, int invariant_kw) {
  if (p.m == 0 || p.n == 0) return false;
  if (p.group_offsets && !p.active_groups) return false;
  const auto aligned = [](const void* q) { return reinterpret_cast<uintptr_t>(q) % 16 == 0; };
  if (p.b_table ? !p.tables_aligned16 : !aligned(p.b)) return false;
  if (!p.scale_e8m0) {
    if (invariant_kw || !gemm_stream_mma_takes_f32_scales(p.format, p.block_n, p.block_k, p.k, p.choices)) return false;
    if (!p.b_scale_table && reinterpret_cast<uintptr_t>(p.b_scale) % 4 != 0) return false;
    // The codes' chunks are 16-byte loads; their scales one f32 a 128 values of a row.
    if (stream_codes(p) &&
        (!aligned(p.a_e4m3) || p.lda % 128 != 0 || p.lda < p.k || reinterpret_cast<uintptr_t>(p.a_scale) % 4 != 0))
      return false;
    return dispatch<QuantFormat::kFP8Block, true>(p, rows, log2_exact(p.block_n), log2_exact(p.block_k), stream);
  }
  switch (p.format) {
    case QuantFormat::kMXFP4:
      return p.k % 32 == 0 && dispatch<QuantFormat::kMXFP4>(p, rows, 0, 0, stream, invariant_kw);
    case QuantFormat::kFP8Row32:
      return p.k % 16 == 0 && dispatch<QuantFormat::kFP8Row32>(p, rows, 0, 0, stream, invariant_kw);
    case QuantFormat::kFP8Block: {
      const int lbn = log2_exact(p.block_n), lbk = log2_exact(p.block_k);
      if (p.k % 16 != 0 || lbn < 0 || lbk < 4) return false;
      return dispatch<QuantFormat::kFP8Block>(p, rows, lbn, lbk, stream, invariant_kw);
    }
    default:
      return false;
  }
}
}  // namespace

bool run_gemm_stream_mma(const GemmKernelParams& p, int64_t rows, cudaStream_t stream) {
  return !p.batch_invariant && run(p, rows, stream, 0);
}

bool run_gemm_stream_mma_invariant(const GemmKernelParams& p, int64_t rows, int kw, cudaStream_t stream) {
  DI_CHECK(kw == 1 || kw == 2 || kw == 4 || kw == 8) << "gemm_stream_mma: " << kw << " K slices";
  return p.batch_invariant && run(p, rows, stream, kw);
}

}  // namespace deepinfer::cuda
