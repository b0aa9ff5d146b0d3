// The FP8 expert GEMM (gemm_wgmma_fp8.h): C = A · dequant(B)ᵀ for --activation-quant mxfp8 over MXFP4 weights, both
// operands as e4m3 on the FP8 tensor cores (wgmma m64nNk32 e4m3, sm_90a: Hopper runs e4m3 at the FP8 rate only there).
//
// Why: the bf16 wgmma kernel (gemm_wgmma_cuda.cu) runs the MXFP4 experts at ~35% of the bf16 rate (V4-Flash prefill,
// H200), and the mode's activations are e4m3 values anyway, so the same products go at twice the tensor rate from
// half the A bytes, and the weights widen to one byte instead of two (~13 integer ops for 8 codes, half the stores).
//
//   block = 3 warpgroups (384 threads), tile 128 token rows x 128 weight rows, K in steps of 128 (one 128-byte
//   swizzle row of one-byte codes: the bf16 kernel's layout, swz()). kF8Stages stages of (A 16 KiB, B 16 KiB, the
//   weight rows' raw e2m1 codes 8 KiB, the A rows' and weight rows' scales 2 x 512 bytes). Barriers as in the bf16
//   kernel: full / empty named barriers of 384 threads, step G of a block in stage G % kF8Stages.
//   warpgroup 0 (producer), per step: by cp.async one step ahead, the A codes (gathered rows, 16 bytes a copy) and
//     the rows' 4 scale bytes, and thread tid's weight row n0 + tid: its 64 code bytes and 4 scale bytes into the
//     stage's raw area; once they land, the thread widens its row into the B tile (fp8::e2m1x8_to_e4m3x8) with each
//     block's scale folded into the codes (below). Staging the raw codes in shared memory instead of registers (the
//     bf16 kernel's way) leaves no global load in flight at the step's proxy fence, which waits for them (the
//     suspected cause of the bf16 kernel's ~2 us steps: docs/PERF.md).
//   warpgroups 1, 2 (consumers): rows 0-63 / 64-127 of the tile. Per k32 slice and 64-column half h, one
//     wgmma m64n64k32 into a temporary (scale-d = 0), which is added into the fp32 accumulator times the row's
//     activation scale of that block (the scale varies per row and 32 values, so the tensor core cannot carry it):
//     two halves in flight, each promoted while the other runs. Registers: 64 accumulators + 64 temporaries.
//
// Weight fold: a row's UE8M0 block scales S_b become shifts of its e2m1 codes into e4m3 (exact: every e2m1 value times
// 2^d is an e4m3 value for d in [-8, 6]) relative to the row's fold exponent E (run_mxfp4_fold: the largest scale of a
// nonzero block), d_b = S_b - E + 6; the row's factor 2^(E - 133) multiplies its outputs once. A row whose nonzero
// blocks span more than 14 binades is not exact so: the caller runs the bf16 kernel for such weights (the fold kernel
// counts them). The 15 shifted tables (fp8::e2m1_e4m3_table) sit in shared memory; a block's table is one lookup.
//
// FP8-block weights (the dense projections, 128 x 128 blocks with UE8M0 scales): the producer copies the codes into
// the B tile as they are (the tile's 128 columns and a step's 128 K are one weight block), and the block's scale
// multiplies the activation scale in the promotion.
//
// Status (session 29): CudaGemmWgmmaFp8Test passes on the H200 and the H100; the backend's default under
// --activation-quant mxfp8 (GemmChoices::wgmma_fp8 = never opts out). ~35% of the FP8 rate (481 TFLOP/s, V4-Flash
// shared gate at 8192 rows): MXFP8's per-32 activation scales cost one FMA per accumulator per k32 slice, as many
// issue slots as the tensor work takes at the FP8 rate, so on Hopper it cannot pass ~the bf16 rate (docs/PERF.md).
// Session 32 (H100): the per-128 form in the wide 128 x 256 tile (the default) gives the same bytes as 128 x 128 and
// runs the V3 slice's prefill FFN at ~45% of the FP8 rate (33% in 128 x 128).
#include "deepinfer/ops/cuda/gemm_wgmma_fp8.h"

#include <algorithm>

#include "deepinfer/ops/cuda/cuda_check.h"
#include "deepinfer/ops/cuda/device_math.cuh"
#include "deepinfer/ops/cuda/fp8_codes.cuh"
#include "deepinfer/ops/cuda/gemm_decode.cuh"
#include "deepinfer/ops/cuda/gemm_wgmma.h"
#include "deepinfer/ops/cuda/gemm_wgmma_device.cuh"

namespace deepinfer::cuda {
namespace {

using namespace wgmma;

constexpr int kF8K = 128;  // K values a step: one 128-byte swizzle row of one-byte codes
constexpr int kF8M = 128, kF8Threads = 384;
constexpr int kF8Tile = 128 * kRowBytes;     // an A tile: 16 KiB
constexpr int kF8RawBytes = 128 * kF8K / 2;  // a step's e2m1 codes of the tile's 128 weight rows: 8 KiB
constexpr int kF8ScaleBytes = 128 * 4;       // a step's scales of 128 rows: four blocks a row
constexpr int kF8Tables = fp8::kFoldShiftMax - fp8::kFoldShiftMin + 1;
static_assert(kF8K == kRowBytes, "a step is one swizzle row of one-byte codes");

// The block tile's weight rows kN (128, or 256 for the per-128 form's wide tile) and what follows from it: a stage is
// the A tile, the B tile (kN rows), the MXFP4 raw codes (kN = 128 only) and the activation and weight scales.
template <int kN>
struct F8Shape {
  static constexpr int kStages = kN == 128 ? 5 : 4;
  static constexpr int kStageBytes = kF8Tile + kN * kRowBytes;
  static constexpr int kRawBytes = kN == 128 ? kF8RawBytes : 0;
  static constexpr int kBarFull = 1, kBarEmpty = 1 + kStages;
  static constexpr size_t kSmem = 1024 + kStages * (kStageBytes + kRawBytes + 2 * kF8ScaleBytes);
  static_assert(kBarEmpty + kStages <= 16, "named barriers");
  static_assert(kSmem <= 227 * 1024, "shared memory");
};

// A step of one weight row: its 128 e2m1 codes (64 bytes, K ascending) and its four blocks' UE8M0 scales.
struct F8Row {
  uint32_t w[16];
  uint32_t s;
};

// Where a weight row's codes, scales and fold exponent are (a row past N reads row N - 1: its column is never written).
struct F8RowSrc {
  const uint8_t* codes;
  const uint8_t* scales;
  int e;

  __device__ __forceinline__ F8RowSrc(const GemmKernelParams& p, int g, int64_t row) {
    const int64_t n = min(row, p.n - 1);
    codes = static_cast<const uint8_t*>(p.b_table ? p.b_table[g] : p.b) + n * (p.k / 2);
    scales = static_cast<const uint8_t*>(p.b_scale_table ? p.b_scale_table[g] : p.b_scale) + n * (p.k / 32);
    e = p.b_fold ? p.b_fold[g * p.n + n] : 0;  // FP8 weights: no fold
  }
};

// Byte offset of 16-byte chunk v (codes 32v .. 32v + 31) of weight row r in a stage's raw code area (64 bytes a row):
// rotated by r / 2, so that eight consecutive rows' chunk v fall on eight distinct 16-byte bank groups.
__device__ __forceinline__ uint32_t raw_offset(int r, int v) { return 64 * r + 16 * ((v + (r >> 1)) & 3); }

// A step of weight row r widened into the B tile at `tile` (shared address): chunk c (16 bytes = K 16c .. 16c + 15)
// from code words 2c, 2c + 1 through block c / 2's folded table.
__device__ __forceinline__ void widen_row(const F8Row& u, int e, const uint2* tables, uint32_t tile, int r) {
#pragma unroll
  for (int b = 0; b < 4; ++b) {
    const uint2 t = tables[fp8::fold_shift(static_cast<int>((u.s >> (8 * b)) & 0xFF), e) - fp8::kFoldShiftMin];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int c = 2 * b + h;
      uint32_t o0, o1, o2, o3;
      fp8::e2m1x8_to_e4m3x8(u.w[2 * c], o0, o1, t.x, t.y);
      fp8::e2m1x8_to_e4m3x8(u.w[2 * c + 1], o2, o3, t.x, t.y);
      asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(tile + swz(r, c)), "r"(o0), "r"(o1), "r"(o2),
                   "r"(o3)
                   : "memory");
    }
  }
}

// acc += tmp times the row factors of a fragment of kC columns: f0 for its rows r0 (entries 4j, 4j + 1), f1 for
// r0 + 8 (4j + 2, 4j + 3).
template <int kC>
__device__ __forceinline__ void promote(float (&acc)[kC / 2], const float (&tmp)[kC / 2], float f0, float f1) {
#pragma unroll
  for (int j = 0; j < kC / 8; ++j) {
    acc[4 * j] = fmaf(tmp[4 * j], f0, acc[4 * j]);
    acc[4 * j + 1] = fmaf(tmp[4 * j + 1], f0, acc[4 * j + 1]);
    acc[4 * j + 2] = fmaf(tmp[4 * j + 2], f1, acc[4 * j + 2]);
    acc[4 * j + 3] = fmaf(tmp[4 * j + 3], f1, acc[4 * j + 3]);
  }
}

// The f32 of UE8M0 byte e (the quantizer writes e >= 1; a zero-filled row past the tile's end gives 0, times zeros).
__device__ __forceinline__ float ue8m0_f32(uint32_t e) { return __uint_as_float(e << 23); }

// Hopper's per-warpgroup register budget (sm_90a): the producer gives registers back so that the consumers of the
// wide tile can hold 128 accumulators and a 64-entry product (launch_bounds alone caps a thread at 168).
template <int kRegs>
__device__ __forceinline__ void regs_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void regs_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

// kE4m3W: FP8-block weights (e4m3 codes, 128 x 128 blocks, UE8M0 scales): the B tile copied as is, the weight block's
// scale joins the activation scale in the promotion (a power of two: exact); else MXFP4 weights widened and folded.
// k128 (with kE4m3W; the V3 family's --activation-quant fp8): one f32 activation scale a row and step (the same 4
// bytes a row and step as four UE8M0 ones) and f32 weight block scales, so a step's four k32 products of a 64-column
// half accumulate in the tensor core (scale-d) and are promoted once, times both scales: a quarter of the FMAs, as
// DeepGEMM does for this recipe.
// kN = 256 (k128 only; GemmChoices::wgmma_fp8_wide): a 128 x 256 tile, each consumer's 64 rows x 256 columns as two
// 128-column halves, each half's four k32 products one m64n128k32 chain into a 64-entry product that is promoted while
// the other consumer's chain runs. Why: the 128 x 128 tile reads 32 KiB from L2 a step for 4.2 MFLOP (~16.7 TB/s
// at the FP8 rate over the device) and its n64 products read A from shared memory twice a k32 slice; the wide tile
// reads 48 KiB for twice the work and A once a half. The producer returns registers to the consumers (setmaxnreg).
template <bool kE4m3W, bool k128 = false, int kN = 128>
__global__ void __launch_bounds__(kF8Threads, 1) gemm_wgmma_fp8_kernel(GemmKernelParams p, int tiles_n, int64_t tiles) {
  static_assert(!k128 || kE4m3W, "per-128 scales: FP8-block weights");
  static_assert(kN == 128 || (kN == 256 && k128), "the wide tile: the per-128 form only");
  using S = F8Shape<kN>;
  constexpr int kStages = S::kStages;
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ uint8_t smem_raw[];
  __shared__ uint2 tables[kF8Tables];
  const int tid = threadIdx.x;
  if (!kE4m3W && tid < kF8Tables) {
    uint32_t lo, hi;
    fp8::e2m1_e4m3_table(tid + fp8::kFoldShiftMin, lo, hi);
    tables[tid] = make_uint2(lo, hi);
  }
  __syncthreads();
  // 1024-byte aligned base (128B swizzle): the stages' A and B tiles, then their raw weight codes, then their
  // activation scales and weight scales.
  const uint32_t smem_addr0 = smem_addr(smem_raw);
  const uint32_t base = smem_addr0 + ((1024 - (smem_addr0 & 1023)) & 1023);
  const uint32_t raw_base = base + kStages * S::kStageBytes, scale_base = raw_base + kStages * S::kRawBytes;
  auto a_tile = [&](int st) { return base + st * S::kStageBytes; };
  auto b_tile = [&](int st) { return base + st * S::kStageBytes + kF8Tile; };
  auto raw_tile = [&](int st) { return raw_base + st * S::kRawBytes; };
  auto s_tile = [&](int st) { return scale_base + st * 2 * kF8ScaleBytes; };  // activation scales
  auto w_scales = [&](int st) { return s_tile(st) + kF8ScaleBytes; };         // weight scales
  const int ksteps = static_cast<int>(p.k / kF8K);
  // Tiles t = blockIdx.x, blockIdx.x + gridDim.x, ..., column tile fastest; both roles walk the same ones: a grouped
  // plan tile that starts no 128-row tile is skipped by both.
  auto tile_at = [&](int64_t t, int& g, int64_t& row_begin, int64_t& row_end, int64_t& n0) {
    n0 = (t % tiles_n) * kN;
    return gemm_tile_rows(p, t / tiles_n, kF8M / kGemmTileM, g, row_begin, row_end);
  };
  const int64_t lds = p.lda / 32;  // activation scales a row

  if (tid < 128) {
    // ------------------------------------------------------------------ producer warpgroup
    if constexpr (kN == 256) regs_dec<104>();
    const int ac = tid & 7;  // A: chunk tid % 8 of tile rows tid / 8 + 16 j
    int64_t gs = 0;
    for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
      int g;
      int64_t row_begin, row_end, n0;
      if (!tile_at(t, g, row_begin, row_end, n0)) continue;
      auto a_row_of = [&](int64_t i) -> int64_t {
        return i < row_end ? (p.a_rows ? p.a_rows[i] / p.a_row_div : i) : -1;
      };
      // Rows past the tile's end copy nothing and zero-fill (their source, A's row 0, is a valid address).
      const uint8_t* a_src[8];
      uint32_t a_ok = 0;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int64_t ar = a_row_of(row_begin + (tid >> 3) + 16 * j);
        a_src[j] = p.a_e4m3 + (ar < 0 ? 0 : ar) * p.lda + ac * 16;
        if (ar >= 0) a_ok |= 1u << j;
      }
      const int64_t sr = a_row_of(row_begin + tid);
      const uint8_t* s_src = p.a_scale + (sr < 0 ? 0 : sr) * lds;
      const F8RowSrc src(p, g, n0 + tid);
      // FP8 weights: this thread copies chunk tid % 8 of weight rows tid / 8 + 16 j, as for A (a row past N reads
      // row N - 1: its column is never written). The wide tile's 16 rows are addressed as they go (its producer keeps
      // 40 registers).
      const uint8_t* b_codes = static_cast<const uint8_t*>(p.b_table ? p.b_table[g] : p.b);
      const uint8_t* b_src[kE4m3W && kN == 128 ? 8 : 1];
      if constexpr (kE4m3W && kN == 128) {
#pragma unroll
        for (int j = 0; j < 8; ++j) b_src[j] = b_codes + min(n0 + (tid >> 3) + 16 * j, p.n - 1) * p.k + ac * 16;
      }
      // Step kt's copies into stage st: the A tile and its rows' scales, and the weights: FP8 codes straight into the
      // B tile, or this thread's MXFP4 row's codes and scales (raw: widened from shared memory once they land, so that
      // no global load is in flight in registers when the step's proxy fence runs).
      auto issue = [&](int kt, int st) {
#pragma unroll
        for (int j = 0; j < 8; ++j)
          asm volatile(
              "cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(a_tile(st) + swz((tid >> 3) + 16 * j, ac)),
              "l"(a_src[j] + static_cast<int64_t>(kt) * kF8K), "r"((a_ok >> j) & 1 ? 16 : 0)
              : "memory");
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(s_tile(st) + 4 * tid),
                     "l"(s_src + static_cast<int64_t>(kt) * (kF8K / 32)), "r"(sr >= 0 ? 4 : 0)
                     : "memory");
        if constexpr (kE4m3W && kN == 256) {
          const uint8_t* b = b_codes + ac * 16 + static_cast<int64_t>(kt) * kF8K;
#pragma unroll
          for (int j = 0; j < 16; ++j)
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(b_tile(st) + swz((tid >> 3) + 16 * j, ac)),
                         "l"(b + min(n0 + (tid >> 3) + 16 * j, p.n - 1) * p.k)
                         : "memory");
          return;
        } else if constexpr (kE4m3W) {
#pragma unroll
          for (int j = 0; j < 8; ++j)
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(b_tile(st) + swz((tid >> 3) + 16 * j, ac)),
                         "l"(b_src[j] + static_cast<int64_t>(kt) * kF8K)
                         : "memory");
          return;
        }
        const uint8_t* q = src.codes + static_cast<int64_t>(kt) * (kF8K / 2);
#pragma unroll
        for (int v = 0; v < 4; ++v)
          asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(raw_tile(st) + raw_offset(tid, v)),
                       "l"(q + 16 * v)
                       : "memory");
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(w_scales(st) + 4 * tid),
                     "l"(src.scales + static_cast<int64_t>(kt) * (kF8K / 32))
                     : "memory");
      };
      auto acquire = [&](int64_t G) {
        if (G >= kStages) bar_sync(S::kBarEmpty + static_cast<int>((G - kStages) % kStages), kF8Threads);
        return static_cast<int>(G % kStages);
      };
      // One step: acquire step kt + 1's stage and issue its copies; once step kt's have landed, widen its weight row
      // into the B tile and publish the stage.
      auto step = [&](int kt) {
        const int64_t G = gs + kt;
        if (kt + 1 < ksteps) issue(kt + 1, acquire(G + 1));
        cp_async_commit();
        cp_async_wait<1>();  // this thread's copies of step kt have landed
        const int st = static_cast<int>(G % kStages);
        if constexpr (!kE4m3W) {
          F8Row u;
#pragma unroll
          for (int v = 0; v < 4; ++v) {
            const uint4 x = lds_u128(raw_tile(st) + raw_offset(tid, v));
            u.w[4 * v] = x.x;
            u.w[4 * v + 1] = x.y;
            u.w[4 * v + 2] = x.z;
            u.w[4 * v + 3] = x.w;
          }
          u.s = lds_u32(w_scales(st) + 4 * tid);
          widen_row(u, src.e, tables, b_tile(st), tid);
        }
        fence_proxy_async();  // the copies and the widened weights, for wgmma's async proxy
        bar_arrive(S::kBarFull + st, kF8Threads);
      };
      issue(0, acquire(gs));
      cp_async_commit();
      for (int kt = 0; kt < ksteps; ++kt) step(kt);
      gs += ksteps;
    }
    cp_async_wait<0>();
    // Take the releases not yet waited for, so that no barrier is left with arrivals at exit.
    for (int64_t G = gs > kStages ? gs - kStages : 0; G < gs; ++G)
      bar_sync(S::kBarEmpty + static_cast<int>(G % kStages), kF8Threads);
  } else {
    // ------------------------------------------------------------------ consumer warpgroups
    if constexpr (kN == 256) regs_inc<200>();
    const int cw = (tid >> 7) - 1;  // tile rows 64 cw ..
    const int lane = tid & 31, wq = (tid >> 5) & 3;
    const int r0 = 64 * cw + 16 * wq + (lane >> 2);  // this thread's rows: r0 (d[4j + 0/1]) and r0 + 8 (d[4j + 2/3])
    const bool vec2 = p.ldc % 2 == 0 && reinterpret_cast<uintptr_t>(p.c) % 8 == 0;
    // The tile's columns as kHalves fragments of kC columns: acc[h] holds columns kC h .. kC h + kC - 1.
    constexpr int kC = kN == 256 ? 128 : 64, kHalves = 2, kAcc = kC / 2;
    int64_t gs = 0;
    for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
      int g;
      int64_t row_begin, row_end, n0;
      if (!tile_at(t, g, row_begin, row_end, n0)) continue;
      // tmp[h]: the product in flight for acc[h] (the wide tile: one, tmp[0], for both halves in turn).
      constexpr int kTmps = kN == 256 ? 1 : 2;
      float acc[kHalves][kAcc], tmp[kTmps][kAcc];
#pragma unroll
      for (int i = 0; i < kAcc; ++i) {
#pragma unroll
        for (int h = 0; h < kHalves; ++h) acc[h][i] = 0.0f;
#pragma unroll
        for (int h = 0; h < kTmps; ++h) tmp[h][i] = 0.0f;
      }
      pin(acc[0]);
      pin(acc[1]);
      // FP8 weights: the tile's weight block scale of each step and half (block_n = block_k = 128: one a step and 128
      // columns), loaded a step ahead; 1 for MXFP4 (folded into the codes). The wide tile's second half past N reads
      // the first half's block (its columns are never written).
      const int64_t ws_row = (n0 >> 7) * p.scale_cols;
      const int64_t ws_row1 = (kN == 256 && n0 + 128 < p.n ? (n0 >> 7) + 1 : (n0 >> 7)) * p.scale_cols;
      const void* ws = p.b_scale_table ? p.b_scale_table[g] : p.b_scale;
      auto weight_scale = [&](int64_t row, int kt) {
        if constexpr (!kE4m3W) return 1.0f;
        if constexpr (k128) return __ldg(static_cast<const float*>(ws) + row + kt);
        return e8m0_to_f32_dev(__ldg(static_cast<const uint8_t*>(ws) + row + kt));
      };
      float sb = weight_scale(ws_row, 0), sb1 = kN == 256 ? weight_scale(ws_row1, 0) : 1.0f;
      for (int kt = 0; kt < ksteps; ++kt) {
        const float sb_next = kt + 1 < ksteps ? weight_scale(ws_row, kt + 1) : 1.0f;
        const float sb1_next = kN == 256 && kt + 1 < ksteps ? weight_scale(ws_row1, kt + 1) : 1.0f;
        const int64_t G = gs + kt;
        const int st = static_cast<int>(G % kStages);
        bar_sync(S::kBarFull + st, kF8Threads);
        const uint32_t at = a_tile(st) + 64 * cw * kRowBytes, bt = b_tile(st);
        const uint32_t sa0 = lds_u32(s_tile(st) + 4 * r0), sa1 = lds_u32(s_tile(st) + 4 * (r0 + 8));
        if constexpr (kN == 256) {
          // Half h's four k32 products chained by the tensor core into tmp, then promoted; the other consumer's chain
          // keeps the tensor cores busy meanwhile. The stage is released once the second chain has retired.
          const float a0 = __uint_as_float(sa0), a1 = __uint_as_float(sa1);
#pragma unroll
          for (int h = 0; h < kHalves; ++h) {
            pin(tmp[0]);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < 4; ++kk)
              wgmma_m64n128k32_e4m3(tmp[0], smem_desc(at + 32 * kk), smem_desc(bt + h * 128 * kRowBytes + 32 * kk),
                                    kk > 0);
            wgmma_commit();
            wgmma_wait<0>();
            pin(tmp[0]);
            if (h == kHalves - 1) bar_arrive(S::kBarEmpty + st, kF8Threads);
            const float s = h == 0 ? sb : sb1;
            promote<kC>(acc[h], tmp[0], a0 * s, a1 * s);
          }
          sb = sb_next;
          sb1 = sb1_next;
          continue;
        } else if constexpr (k128) {
          // Half h's four k32 products summed by the tensor core (one commit group a half), then promoted: half 0
          // while half 1 runs.
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            pin(tmp[h]);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < 4; ++kk)
              wgmma_m64n64k32_e4m3(tmp[h], smem_desc(at + 32 * kk), smem_desc(bt + h * 64 * kRowBytes + 32 * kk),
                                   kk > 0 ? 1 : 0);
            wgmma_commit();
          }
          const float f0 = __uint_as_float(sa0) * sb, f1 = __uint_as_float(sa1) * sb;
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            if (h == 0)
              wgmma_wait<1>();
            else
              wgmma_wait<0>();
            pin(tmp[h]);
            promote<kC>(acc[h], tmp[h], f0, f1);
          }
          bar_arrive(S::kBarEmpty + st, kF8Threads);
          sb = sb_next;
          continue;
        }
        if constexpr (!k128) {
          // Product u = 2 kk + h: k32 slice kk (bytes 32 kk of every row), weight rows 64 h .. (8 swizzle atoms a
          // half).
          auto issue = [&](int u) {
            const int kk = u >> 1, h = u & 1;
            pin(tmp[h]);
            wgmma_fence();
            wgmma_m64n64k32_e4m3(tmp[h], smem_desc(at + 32 * kk), smem_desc(bt + h * 64 * kRowBytes + 32 * kk));
            wgmma_commit();
          };
          issue(0);
          issue(1);
#pragma unroll
          for (int u = 0; u < 8; ++u) {
            if (u < 7)
              wgmma_wait<1>();  // product u has landed, u + 1 may still run
            else
              wgmma_wait<0>();
            const int kk = u >> 1, h = u & 1;
            pin(tmp[h]);
            // Exact: powers of two times the weight scale (FP8 weights; 1 for MXFP4).
            const float f0 = ue8m0_f32((sa0 >> (8 * kk)) & 0xFF) * sb, f1 = ue8m0_f32((sa1 >> (8 * kk)) & 0xFF) * sb;
            promote<kC>(acc[h], tmp[h], f0, f1);
            if (u + 2 < 8) issue(u + 2);
          }
          bar_arrive(S::kBarEmpty + st, kF8Threads);  // every product of the stage has retired
          sb = sb_next;
        }
      }
      gs += ksteps;

      // Epilogue: row r0 + 8 rh, columns n0 + kC h + 8 j + 2 (lane % 4) + 0/1 = acc[h][4 j + 2 rh + 0/1], times each
      // weight row's fold factor (MXFP4).
      float factor[kHalves][kC / 8][2];  // this thread's columns
#pragma unroll
      for (int h = 0; h < kHalves; ++h)
#pragma unroll
        for (int j = 0; j < kC / 8; ++j)
#pragma unroll
          for (int x = 0; x < 2; ++x) {
            const int64_t col = n0 + kC * h + 8 * j + 2 * (lane & 3) + x;
            factor[h][j][x] = kE4m3W ? 1.0f
                                     : __uint_as_float(fp8::fold_factor_bits(__ldg(
                                           p.b_fold + static_cast<int64_t>(g) * p.n + (col < p.n ? col : p.n - 1))));
          }
#pragma unroll
      for (int rh = 0; rh < 2; ++rh) {
        const int64_t i = row_begin + r0 + 8 * rh;
        if (i >= row_end) continue;
        float* crow = p.c + (p.c_rows ? p.c_rows[i] : i) * p.ldc;
#pragma unroll
        for (int h = 0; h < kHalves; ++h)
#pragma unroll
          for (int j = 0; j < kC / 8; ++j) {
            const int64_t col = n0 + kC * h + 8 * j + 2 * (lane & 3);  // even
            store_pair(crow, col, p.n, acc[h][4 * j + 2 * rh] * factor[h][j][0],
                       acc[h][4 * j + 2 * rh + 1] * factor[h][j][1], vec2);
          }
      }
    }
  }
#else
  __trap();  // built without sm_90a: run_gemm_wgmma_fp8 never launches it (device_is_sm90)
#endif
}

__global__ void mxfp4_fold_kernel(Mxfp4FoldKernelParams p) {
  const int64_t row = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (row >= p.groups * p.n) return;  // whole warps: a warp's lanes share the row
  const int g = static_cast<int>(row / p.n);
  const int64_t r = row % p.n;
  const uint4* codes = reinterpret_cast<const uint4*>(static_cast<const uint8_t*>(p.codes[g]) + r * (p.k / 2));
  const uint8_t* scales = static_cast<const uint8_t*>(p.scales[g]) + r * (p.k / 32);
  int hi = -1, lo = 256;
  for (int64_t b = lane; b < p.k / 32; b += 32) {
    const uint4 w = __ldg(codes + b);
    if (!fp8::e2m1_block_nonzero(w.x, w.y, w.z, w.w)) continue;
    const int s = __ldg(scales + b);
    hi = max(hi, s);
    lo = min(lo, s);
  }
  hi = __reduce_max_sync(0xFFFFFFFFu, hi);
  lo = __reduce_min_sync(0xFFFFFFFFu, lo);
  if (lane == 0) {
    p.refs[row] = static_cast<uint8_t>(hi >= 0 ? hi : fp8::kFoldEmpty);
    if (hi >= 0 && lo < hi - fp8::kFoldSpan) atomicAdd(p.misfits, 1u);
  }
}

bool aligned(const void* q, uintptr_t a) { return reinterpret_cast<uintptr_t>(q) % a == 0; }

template <bool kE4m3W, bool k128, int kN>
void launch_fp8(const GemmKernelParams& p, int64_t tiles_m, int blocks_cap, cudaStream_t stream) {
  const int64_t tiles_n = ceil_div(p.n, kN), tiles = tiles_m * tiles_n;
  DI_CHECK(tiles < (int64_t{1} << 31)) << "gemm fp8: " << tiles << " tiles are too many";
  auto* kernel = gemm_wgmma_fp8_kernel<kE4m3W, k128, kN>;
  constexpr size_t smem = F8Shape<kN>::kSmem;
  DI_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  const int64_t blocks = blocks_cap > 0 ? std::min<int64_t>(tiles, blocks_cap) : tiles;
  kernel<<<static_cast<unsigned>(blocks), kF8Threads, smem, stream>>>(p, static_cast<int>(tiles_n), tiles);
  DI_CUDA_CHECK_LAUNCH();
}

}  // namespace

bool gemm_wgmma_fp8_block_weight_takes(QuantFormat format, bool scale_e8m0, int64_t block_n, int64_t block_k,
                                       int64_t k) {
  return format == QuantFormat::kFP8Block && block_n == 128 && block_k == 128 && scale_e8m0 && k % kF8K == 0;
}

bool gemm_wgmma_fp8_block128_weight_takes(QuantFormat format, bool scale_e8m0, int64_t block_n, int64_t block_k,
                                          int64_t k) {
  return format == QuantFormat::kFP8Block && block_n == 128 && block_k == 128 && !scale_e8m0 && k % kF8K == 0;
}

bool gemm_wgmma_fp8_takes(const GemmKernelParams& p) {
  if (p.choices.wgmma_fp8 != KernelPick::kAlways || p.batch_invariant) return false;
  const bool mxfp4 = p.format == QuantFormat::kMXFP4 && !p.a_scale_block128;
  const bool fp8 = p.a_scale_block128
                       ? gemm_wgmma_fp8_block128_weight_takes(p.format, p.scale_e8m0, p.block_n, p.block_k, p.k)
                       : gemm_wgmma_fp8_block_weight_takes(p.format, p.scale_e8m0, p.block_n, p.block_k, p.k);
  if (!(mxfp4 && p.b_fold) && !fp8) return false;
  if (!p.a_e4m3 || !p.a_scale || p.k <= 0 || p.k % kF8K != 0 || p.lda % 128 != 0 || p.lda < p.k) return false;
  if (!aligned(p.a_e4m3, 16) || !aligned(p.a_scale, 4)) return false;
  // Code rows 16-byte aligned (K % 128), scales 4-byte aligned (MXFP4's 4 a step, FP8's f32).
  if (p.b_table ? !p.tables_aligned16 : (!aligned(p.b, 16) || !aligned(p.b_scale, 4))) return false;
  return device_is_sm90();
}

bool run_gemm_wgmma_fp8(const GemmKernelParams& p, cudaStream_t stream) {
  if (!gemm_wgmma_fp8_takes(p)) return false;
  if (p.m == 0 || p.n == 0 || (p.group_offsets && p.max_tiles_m == 0)) return true;
  // Grouped: a block per plan tile (64 rows), every other one starting a 128-row tile (gemm_tile_rows).
  const int64_t tiles_m = p.group_offsets ? p.max_tiles_m : ceil_div(p.m, kF8M);
  if (p.a_scale_block128 && p.choices.wgmma_fp8_wide > 0)
    launch_fp8<true, true, 256>(p, tiles_m, p.choices.wgmma_fp8_wide == 2 ? device_sm_count() : 0, stream);
  else if (p.a_scale_block128)
    launch_fp8<true, true, 128>(p, tiles_m, 0, stream);
  else if (p.format == QuantFormat::kFP8Block)
    launch_fp8<true, false, 128>(p, tiles_m, 0, stream);
  else
    launch_fp8<false, false, 128>(p, tiles_m, 0, stream);
  return true;
}

void run_mxfp4_fold(const Mxfp4FoldKernelParams& p, cudaStream_t stream) {
  DI_CHECK(p.k % 32 == 0) << "mxfp4 fold: K = " << p.k << " is not whole blocks of 32";
  const int64_t rows = static_cast<int64_t>(p.groups) * p.n;
  if (rows == 0) return;
  mxfp4_fold_kernel<<<grid_1d(rows * 32, 256), 256, 0, stream>>>(p);
  DI_CUDA_CHECK_LAUNCH();
}

}  // namespace deepinfer::cuda
