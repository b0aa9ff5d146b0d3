// The pipelined tensor-core GEMM for block-format weights and many rows (prefill: the MoE experts' grouped GEMMs,
// tens to hundreds of rows per expert). C = A · dequant(B)ᵀ with A given as bf16 (p.a_bf16), weights FP8 / MXFP4,
// fp32 accumulation in mma.sync m16n8k16 bf16.
//
// Why this shape: the WMMA tile of gemm_tc_cuda.cu ran at ~12% of the bf16 rate on a V4-Flash prefill (ncu: L1-bound
// on f32 A staging and fragment loads, 25% occupancy, one k-step in flight). Here a 64 x 256 block tile walks K in
// steps of 32 through a 4-stage cp.async ring (A rows gathered through a_rows as 16-byte copies, the weight rows
// as raw bytes); each thread decodes its own weight row of a step into a bf16 tile (double-buffered, so one
// barrier per step), and 8 warps (2 x 4, 32 x 64 each) feed mma.sync from ldmatrix. ncu on a V4-Flash prefill
// (8192 tokens, MXFP4 gate/up calls): 4.23 ms a call with the WMMA tile -> 2.57 ms here. A 128 x 128 tile with two
// decoding threads per weight row (half the decodes per product) measured 2.72 ms: the kernel is latency-bound
// (issue slots 44% busy, ~9 cycles between a warp's instructions at 4 warps a scheduler), not decode-bound. Weights are
// exact in bf16 (e4m3 / e2m1 times a UE8M0 scale), A is the caller's bf16 rounding: the same products as the WMMA tile.
#include "deepinfer/ops/cuda/gemm_mma.h"

#include <cuda_bf16.h>

#include "deepinfer/ops/cuda/cuda_check.h"
#include "deepinfer/ops/cuda/device_math.cuh"
#include "deepinfer/ops/cuda/gemm_decode.cuh"

namespace deepinfer::cuda {
namespace {

constexpr int kMmaM = kGemmTileM, kMmaN = 256, kMmaK = 32, kMmaThreads = 256, kMmaStages = 4;
// 40 bf16 (80 bytes) per smem row: the 8 row addresses of an ldmatrix phase fall in distinct 16-byte bank groups.
constexpr int kMmaLd = kMmaK + 8;
static_assert(kMmaM == 64 && kMmaThreads == 4 * kMmaM, "A staging: one 16-byte chunk per thread");
static_assert(kMmaN == kMmaThreads, "weight staging and decoding: one weight row per thread");

template <QuantFormat F>
constexpr int kRawBytes = F == QuantFormat::kMXFP4 ? kMmaK / 2 : kMmaK;  // one row's codes of a k-step

template <QuantFormat F>
struct MmaSmem {
  __nv_bfloat16 a[kMmaStages][kMmaM][kMmaLd];
  uint8_t raw[kMmaStages][kMmaN][kRawBytes<F>];
  __nv_bfloat16 b[2][kMmaN][kMmaLd];
  int64_t a_row[kMmaM], c_row[kMmaM];
};

// 8 decoded weights times the row's scale -> one 16-byte bf16 store.
__device__ __forceinline__ void store8(const float* w, float sc, __nv_bfloat16* dst) {
  *reinterpret_cast<uint4*>(dst) = make_uint4(pack_bf16x2(w[0] * sc, w[1] * sc), pack_bf16x2(w[2] * sc, w[3] * sc),
                                              pack_bf16x2(w[4] * sc, w[5] * sc), pack_bf16x2(w[6] * sc, w[7] * sc));
}

// How the 8 warps split the 64 x 256 block tile: 2 along M (32 rows x 64 columns a warp). A warp skips its m16 tiles
// past the tile's rows (block-uniform). Session 37's 1 x 8 layout (every warp over all 64 rows, a quarter of the mmas
// for a 6-row group) measured the same on V2-Lite decode (H100, session 38: experts 21.27 vs 21.30 ms at b64, 23.74
// vs 23.97 at b256): the kernel is not bound by its mmas there, so it was removed.
struct WarpTile {
  static constexpr int kWm = 2, kWn = 4;
  static constexpr int kRows = kMmaM / kWm, kTm = kRows / 16;
  static constexpr int kCols = kMmaN / kWn, kTn = kCols / 8;
  __device__ static int wm() { return (threadIdx.x >> 5) / kWn; }
  __device__ static int wn() { return (threadIdx.x >> 5) % kWn; }
  // Whether the warp's m16 tile i holds any of the tile's `rows` rows.
  __device__ static bool live(int i, int rows) { return wm() * kRows + i * 16 < rows; }
};
using W = WarpTile;

// Accumulator (i, j) of the warp: rows lane / 4 and + 8 of its m16-tile i, columns 2 (lane % 4) + {0, 1} of n8-tile
// j, to the rows c_row names (-1: past the tile's rows).
__device__ __forceinline__ void store_acc(const GemmKernelParams& p, const int64_t* c_row, int64_t n0,
                                          const float (&acc)[W::kTm][W::kTn][4]) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int i = 0; i < W::kTm; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = W::wm() * W::kRows + i * 16 + (lane >> 2) + 8 * h;
      const int64_t cr = c_row[r];
      if (cr < 0) continue;
      float* crow = p.c + cr * p.ldc;
#pragma unroll
      for (int j = 0; j < W::kTn; ++j) {
        const int64_t col = n0 + W::wn() * W::kCols + j * 8 + (lane & 3) * 2;
        if (col < p.n) crow[col] = acc[i][j][2 * h];
        if (col + 1 < p.n) crow[col + 1] = acc[i][j][2 * h + 1];
      }
    }
}

// The rows of this block's M tile (the plan's tiles per group, or plain row tiles) into a_row / c_row and their
// count into rows; false when the block has nothing to do.
__device__ __forceinline__ bool tile_rows(const GemmKernelParams& p, int& g, int64_t* a_row, int64_t* c_row,
                                          int& rows) {
  int64_t row_begin, row_end;
  if (!gemm_tile_rows(p, blockIdx.y, 1, g, row_begin, row_end)) return false;
  rows = static_cast<int>(min(int64_t{kMmaM}, row_end - row_begin));
  const int tid = threadIdx.x;
  if (tid < kMmaM) {
    const int64_t i = row_begin + tid;
    const bool valid = i < row_end;
    a_row[tid] = !valid ? -1 : (p.a_rows ? p.a_rows[i] / p.a_row_div : i);
    c_row[tid] = !valid ? -1 : (p.c_rows ? p.c_rows[i] : i);
  }
  __syncthreads();
  return true;
}

// Fragments of a 16-wide half kk of a k-step: A for the warp's live m16 tiles, B for its n8 tiles (as pairs).
__device__ __forceinline__ void load_a_frags(uint32_t (&af)[W::kTm][4], const __nv_bfloat16 (*as)[kMmaLd], int kk,
                                             int rows) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int i = 0; i < W::kTm; ++i)
    if (W::live(i, rows)) ldmatrix_x4(af[i], &as[W::wm() * W::kRows + i * 16 + (lane & 15)][kk + (lane >> 4) * 8]);
}
__device__ __forceinline__ void load_b_frags(uint32_t (&bf)[W::kTn / 2][4], const __nv_bfloat16 (*bs)[kMmaLd], int kk) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int j = 0; j < W::kTn / 2; ++j)  // n-tiles 2j and 2j + 1: (k 0-7, k 8-15) each
    ldmatrix_x4(bf[j], &bs[W::wn() * W::kCols + j * 16 + (lane & 7) + ((lane >> 4) << 3)][kk + ((lane >> 3) & 1) * 8]);
}
__device__ __forceinline__ void mma_tile(float (&acc)[W::kTm][W::kTn][4], const uint32_t (&af)[W::kTm][4],
                                         const uint32_t (&bf)[W::kTn / 2][4], int rows) {
#pragma unroll
  for (int j = 0; j < W::kTn / 2; ++j)
#pragma unroll
    for (int i = 0; i < W::kTm; ++i) {
      if (!W::live(i, rows)) continue;
      mma_bf16(acc[i][2 * j], af[i], bf[j][0], bf[j][1]);
      mma_bf16(acc[i][2 * j + 1], af[i], bf[j][2], bf[j][3]);
    }
}

__device__ __forceinline__ void zero_acc(float (&acc)[W::kTm][W::kTn][4]) {
#pragma unroll
  for (int i = 0; i < W::kTm; ++i)
#pragma unroll
    for (int j = 0; j < W::kTn; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;
}

template <QuantFormat F>
__global__ void __launch_bounds__(kMmaThreads, 2) gemm_mma_kernel(GemmKernelParams p) {
  extern __shared__ __align__(128) uint8_t smem_bytes[];
  MmaSmem<F>& sm = *reinterpret_cast<MmaSmem<F>*>(smem_bytes);

  int g, rows;
  if (!tile_rows(p, g, sm.a_row, sm.c_row, rows)) return;
  const uint8_t* b = static_cast<const uint8_t*>(p.b_table ? p.b_table[g] : p.b);
  const void* s = p.b_scale_table ? p.b_scale_table[g] : p.b_scale;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kMmaN;
  const int tid = threadIdx.x;

  // This thread's copies of a k-step: A row tid / 4, its 16-byte chunk tid % 4; weight row n0 + tid (all of it).
  const int a_r = tid >> 2, a_c = (tid & 3) * 8;
  const int64_t a_src_row = sm.a_row[a_r];
  const __nv_bfloat16* a_src =
      static_cast<const __nv_bfloat16*>(p.a_bf16) + (a_src_row >= 0 ? a_src_row * p.lda : 0) + a_c;
  const int64_t n = n0 + tid;
  const bool n_ok = n < p.n;
  const uint8_t* b_src = b + (n_ok ? n : 0) * (F == QuantFormat::kMXFP4 ? p.k / 2 : p.k);
  const int ktiles = static_cast<int>(p.k / kMmaK);

  auto issue = [&](int kt) {
    if (kt < ktiles) {
      const int st = kt % kMmaStages;
      cp_async16(&sm.a[st][a_r][a_c], a_src + static_cast<int64_t>(kt) * kMmaK, a_src_row >= 0);
      const uint8_t* src = b_src + static_cast<int64_t>(kt) * kRawBytes<F>;
#pragma unroll
      for (int c = 0; c < kRawBytes<F> / 16; ++c) cp_async16(&sm.raw[st][tid][16 * c], src + 16 * c, n_ok);
    }
    cp_async_commit();
  };
  auto scale_of = [&](int kt) -> float {
    if (!n_ok || kt >= ktiles) return 0.0f;
    const float sc = block_scale(s, p, F, n, static_cast<int64_t>(kt) * kMmaK);
    return F == QuantFormat::kMXFP4 ? sc * kFp4Unscale : sc;
  };
  // This thread's weight row of step kt, decoded and scaled, into the bf16 tile kt % 2.
  auto decode = [&](int kt, float sc) {
    const uint4 q0 = *reinterpret_cast<const uint4*>(&sm.raw[kt % kMmaStages][tid][0]);
    __nv_bfloat16* dst = &sm.b[kt & 1][tid][0];
    float w[8];
    if constexpr (F == QuantFormat::kMXFP4) {
      const uint32_t words[4] = {q0.x, q0.y, q0.z, q0.w};
#pragma unroll
      for (int v = 0; v < 4; ++v) {
        decode_fp4x8_pairs(words[v], w);  // the streaming kernels' decode: half the integer work
        store8(w, sc, dst + 8 * v);
      }
    } else {
      const uint4 q1 = *reinterpret_cast<const uint4*>(&sm.raw[kt % kMmaStages][tid][16]);
      const uint32_t words[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
#pragma unroll
      for (int v = 0; v < 4; ++v) {
        decode_fp8x8(words[2 * v], words[2 * v + 1], w);
        store8(w, sc, dst + 8 * v);
      }
    }
  };

  float acc[W::kTm][W::kTn][4];
  zero_acc(acc);

#pragma unroll
  for (int st = 0; st < kMmaStages - 1; ++st) issue(st);
  float sc_next = scale_of(1);
  {
    const float sc0 = scale_of(0);
    cp_async_wait<kMmaStages - 2>();  // step 0: this thread's own weight row is all decode(0) reads
    decode(0, sc0);
  }

  for (int kt = 0; kt < ktiles; ++kt) {
    // Step kt + 1 has landed (this thread's copies); the barrier publishes everyone's, the bf16 tile of step kt,
    // and that every warp is done with step kt - 1's slots, which the next issue and decode overwrite.
    cp_async_wait<kMmaStages - 3>();
    __syncthreads();
    issue(kt + kMmaStages - 1);
    const __nv_bfloat16(*as)[kMmaLd] = sm.a[kt % kMmaStages];
    const __nv_bfloat16(*bs)[kMmaLd] = sm.b[kt & 1];
    uint32_t af[W::kTm][4], bf[W::kTn / 2][4];
    auto load_frags = [&](int kk) {
      load_a_frags(af, as, kk, rows);
      load_b_frags(bf, bs, kk);
    };
    auto mmas = [&]() { mma_tile(acc, af, bf, rows); };
    // The first half's fragments are requested before the next step is decoded, so their latency hides behind
    // the decoding (ncu: the kernel was latency-bound, ~9 cycles between a warp's instructions).
    load_frags(0);
    if (kt + 1 < ktiles) {
      const float sc = sc_next;
      sc_next = scale_of(kt + 2);
      decode(kt + 1, sc);
    }
    mmas();
    load_frags(16);
    mmas();
  }

  store_acc(p, sm.c_row, n0, acc);
}

// bf16 weights (GemmKernelParams::b_bf16): nothing to decode, so the weight rows go straight into a ring of bf16
// tiles beside A's (kLo: and A's lo terms, a second product a tile with the same weight fragments). 3 stages with
// lo terms, 4 without, keep two blocks an SM (90 / 100 KB).
template <bool kLo>
constexpr int kBf16Stages = kLo ? 3 : 4;
template <bool kLo>
struct MmaBf16Smem {
  __nv_bfloat16 a[kBf16Stages<kLo>][kMmaM][kMmaLd];
  __nv_bfloat16 a_lo[kLo ? kBf16Stages<kLo> : 1][kMmaM][kMmaLd];
  __nv_bfloat16 b[kBf16Stages<kLo>][kMmaN][kMmaLd];
  int64_t a_row[kMmaM], c_row[kMmaM];
};

template <bool kLo>
__global__ void __launch_bounds__(kMmaThreads, 2) gemm_mma_bf16w_kernel(GemmKernelParams p) {
  constexpr int kStages = kBf16Stages<kLo>;
  extern __shared__ __align__(128) uint8_t smem_bytes[];
  MmaBf16Smem<kLo>& sm = *reinterpret_cast<MmaBf16Smem<kLo>*>(smem_bytes);
  int g, rows;
  if (!tile_rows(p, g, sm.a_row, sm.c_row, rows)) return;
  const auto* b = static_cast<const __nv_bfloat16*>(p.b_table ? p.b_table[g] : p.b);
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kMmaN;
  const int tid = threadIdx.x;

  // This thread's copies of a k-step: A (and lo) row tid / 4, its 16-byte chunk tid % 4; the same chunk of weight
  // rows n0 + tid / 4 + 64 c.
  const int a_r = tid >> 2, a_c = (tid & 3) * 8;
  const int64_t a_src_row = sm.a_row[a_r], a_off = (a_src_row >= 0 ? a_src_row * p.lda : 0) + a_c;
  const __nv_bfloat16* a_src = static_cast<const __nv_bfloat16*>(p.a_bf16) + a_off;
  const __nv_bfloat16* lo_src = kLo ? static_cast<const __nv_bfloat16*>(p.a_lo_bf16) + a_off : nullptr;
  const int ktiles = static_cast<int>(p.k / kMmaK);
  // Weight copies 4 threads a row: a k-step's 64 bytes of a row (two whole sectors) in one instruction, 8 rows an
  // instruction, rows tid / 4 + 64 c. One thread a row (16 bytes of each of 32 rows 4 KB apart an instruction, half
  // sectors) measured 3-4% slower on the experts (H100, session 38: V2-Lite b64 21.50 -> 20.72 ms, b256 23.89
  // -> 23.07).
  const int b_r0 = tid >> 2, b_c0 = (tid & 3) * 8;
  const __nv_bfloat16* b_src = b + (n0 + b_r0) * p.k + b_c0;

  auto issue = [&](int kt) {
    if (kt < ktiles) {
      const int st = kt % kStages;
      const int64_t k0 = static_cast<int64_t>(kt) * kMmaK;
      cp_async16(&sm.a[st][a_r][a_c], a_src + k0, a_src_row >= 0);
      if constexpr (kLo) cp_async16(&sm.a_lo[st][a_r][a_c], lo_src + k0, a_src_row >= 0);
#pragma unroll
      for (int c = 0; c < kMmaK / 8; ++c) {
        const int r = b_r0 + (kMmaThreads / 4) * c;
        const bool ok = n0 + r < p.n;
        cp_async16(&sm.b[st][r][b_c0], ok ? b_src + int64_t{kMmaThreads / 4} * c * p.k + k0 : b, ok);
      }
    }
    cp_async_commit();
  };

  float acc[W::kTm][W::kTn][4];
  zero_acc(acc);

#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) issue(st);
  for (int kt = 0; kt < ktiles; ++kt) {
    // Step kt has landed (this thread's copies); the barrier publishes everyone's and that every warp is done with
    // step kt - 1's slot, which the next issue overwrites.
    cp_async_wait<kStages - 2>();
    __syncthreads();
    issue(kt + kStages - 1);
    const int st = kt % kStages;
#pragma unroll
    for (int kk = 0; kk < kMmaK; kk += 16) {
      uint32_t af[W::kTm][4], bf[W::kTn / 2][4];
      load_b_frags(bf, sm.b[st], kk);
      if constexpr (kLo) {  // the small terms first
        load_a_frags(af, sm.a_lo[st], kk, rows);
        mma_tile(acc, af, bf, rows);
      }
      load_a_frags(af, sm.a[st], kk, rows);
      mma_tile(acc, af, bf, rows);
    }
  }
  store_acc(p, sm.c_row, n0, acc);
}

// One block a (column tile, M tile), x = column tiles (fastest): the blocks running together share an A tile and sweep
// one expert's weight.
void launch_tiles(void (*kernel)(GemmKernelParams), size_t smem, const GemmKernelParams& p, cudaStream_t stream) {
  const int64_t tiles_m = p.group_offsets ? p.max_tiles_m : ceil_div(p.m, kMmaM);
  const int64_t tiles_n = ceil_div(p.n, kMmaN);
  if (tiles_m == 0 || tiles_n == 0) return;
  DI_CHECK(tiles_m <= 65535) << "gemm: " << tiles_m << " row tiles are too many for one launch";
  DI_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  kernel<<<dim3(static_cast<unsigned>(tiles_n), static_cast<unsigned>(tiles_m)), kMmaThreads, smem, stream>>>(p);
  DI_CUDA_CHECK_LAUNCH();
}

template <QuantFormat F>
void launch(const GemmKernelParams& p, cudaStream_t stream) {
  launch_tiles(gemm_mma_kernel<F>, sizeof(MmaSmem<F>), p, stream);
}

template <bool kLo>
void launch_bf16w(const GemmKernelParams& p, cudaStream_t stream) {
  launch_tiles(gemm_mma_bf16w_kernel<kLo>, sizeof(MmaBf16Smem<kLo>), p, stream);
}

bool aligned(const void* q, uintptr_t a) { return reinterpret_cast<uintptr_t>(q) % a == 0; }

}  // namespace

bool gemm_mma_dense_fills(int64_t m, int64_t n) { return ceil_div(m, kMmaM) * ceil_div(n, kMmaN) >= 128; }

bool run_gemm_mma(const GemmKernelParams& p, cudaStream_t stream) {
  if (!p.a_bf16 || p.batch_invariant || (p.format == QuantFormat::kFloat && !p.b_bf16)) return false;
  if (p.k <= 0 || p.k % kMmaK != 0) return false;
  if (p.format == QuantFormat::kFP8Block && p.block_k % kMmaK != 0) return false;
  if (p.lda % 8 != 0 || !aligned(p.a_bf16, 16)) return false;
  if (p.a_lo_bf16 && !aligned(p.a_lo_bf16, 16)) return false;
  if (p.b_table ? !p.tables_aligned16 : !aligned(p.b, 16)) return false;
  if (!p.group_offsets && !gemm_mma_dense_fills(p.m, p.n)) return false;
  if (p.m == 0 || p.n == 0) return true;
  switch (p.format) {
    case QuantFormat::kFloat:  // bf16 weights
      if (p.a_lo_bf16)
        launch_bf16w<true>(p, stream);
      else
        launch_bf16w<false>(p, stream);
      return true;
    case QuantFormat::kFP8Block:
      launch<QuantFormat::kFP8Block>(p, stream);
      return true;
    case QuantFormat::kMXFP4:
      launch<QuantFormat::kMXFP4>(p, stream);
      return true;
    case QuantFormat::kFP8Row32:
      launch<QuantFormat::kFP8Row32>(p, stream);
      return true;
    default:
      return false;
  }
}

}  // namespace deepinfer::cuda
