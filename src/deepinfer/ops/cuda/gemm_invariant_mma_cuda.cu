// Batch-invariant block-format GEMMs on the tensor cores: the dispatch between the streaming kernel (few rows) and
// a tile kernel (many rows) that repeat one per-output instruction sequence (gemm_invariant_mma.h).
//
// Why: batch-invariant mode ran every GEMM as fp32 FMA chains (SIMT tile, column-chain kernel), +79% at V4-Flash
// decode batch 1 and +447..653% in prefill (docs/PERF.md). Invariance only needs a fixed arithmetic per output.
// The streaming kernel (gemm_stream_mma_cuda.cu) already computes each row's outputs from that row alone; fixing
// its configuration by the weight (16-row tiles, kw K slices, one accumulator chain) makes it invariant, and the
// tile kernel here issues, for every output, the same mma.sync instructions with the same operands in the same
// order:
// - a warp owns 16 weight rows (n0 + g and n0 + g + 8 in lane g's fragments, the streaming kernel's W16 tile) and
//   decodes its lane's 16-byte chunk 4·step + t of each with the same functions (gemm_stream_decode.cuh);
// - the block's 64 rows are staged per step as bf16 fragment pairs in the streaming kernel's layout ([mma][row]
//   [lane % 4]: the same pairs of the same chunk at the same logical k slots), 8 n8 tiles a warp;
// - per output: for each K slice w (steps [steps·w/kw, steps·(w+1)/kw)) one accumulator chain from 0 over the
//   slice's steps and, within a step, mmas 0..kMmas-1; the slices' sums added in slice order from slice 0 — the
//   streaming kernel's part[] sum over its kw warps. Padding (chunks past K) is zero codes and zero activations in
//   both. Rows and weight rows past the call's are computed and never written.
// What the tile kernel gives up against the default mode's prefill kernels (gemm_mma, wgmma): weights are decoded
// per warp from L2 for every 64-row tile, one step of loads in flight, one barrier per step. A comes as the
// caller's bf16 copy when there is one (the backend makes it in batch-invariant mode for calls of more than 8 rows
// a group), else in f32, rounded per block.
#include "deepinfer/ops/cuda/gemm_invariant_mma.h"

#include <cuda_bf16.h>

#include <algorithm>

#include "deepinfer/ops/cuda/cuda_check.h"
#include "deepinfer/ops/cuda/device_math.cuh"
#include "deepinfer/ops/cuda/gemm_decode.cuh"
#include "deepinfer/ops/cuda/gemm_stream_decode.cuh"
#include "deepinfer/ops/cuda/gemm_stream_mma.h"

namespace deepinfer::cuda {
namespace {

using namespace stream_decode;

static_assert(kInvariantMmaAcc == 1, "the tile kernel keeps one chain per slice and output");

constexpr int kTiWarps = 8, kTiThreads = 32 * kTiWarps;
constexpr int kTiN = 16 * kTiWarps;  // weight rows per block: a 16-row mma tile per warp
constexpr int kTiM = kGemmTileM;     // activation rows per block: one tile of the MoE plan
constexpr int kTiTiles = kTiM / 8;   // n8 tiles per warp
static_assert(kTiThreads == 4 * kTiM, "activation staging: a thread per (row, chunk) of a step");

// A warp's outputs in the tile kernel (16 weight rows x kTiM rows) and the per-output sequence it shares with the
// streaming kernel: per step kMmas mma.sync into one chain per slice (acc), the slices added in order (sum).
template <QuantFormat F>
struct TileOutputs {
  float acc[kTiTiles][4], sum[kTiTiles][4];
  int folded = 0;  // slices added into sum

  __device__ __forceinline__ TileOutputs() {
#pragma unroll
    for (int j = 0; j < kTiTiles; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[j][i] = sum[j][i] = 0.0f;
  }
  // One step: the lane's weight chunks (rows g, g + 8) and scale bytes, the step's activation fragments from xrow
  // (the fragment buffer + lane).
  __device__ __forceinline__ void step(const uint4 (&q)[2], const uint32_t (&e)[2], const uint2* xrow) {
    FormatScale<F> sc[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) sc[h].set(e[h]);
#pragma unroll
    for (int mi = 0; mi < kMmas<F>; ++mi) {
      uint32_t wp[2], wq[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) weight_pairs<F>(q[h], sc[h], mi, wp[h], wq[h]);
      const uint32_t a[4] = {wp[0], wp[1], wq[0], wq[1]};
#pragma unroll
      for (int j = 0; j < kTiTiles; ++j) {
        const uint2 x = xrow[(mi * kTiM + 8 * j) * 4];
        mma_bf16(acc[j], a, x.x, x.y);
      }
    }
  }
  // Adds every slice that ends at `done` of `steps` steps into sum (empty slices too: a +0 partial, as the
  // streaming kernel adds).
  __device__ __forceinline__ void fold(int done, int steps, int kw) {
    while (folded < kw && steps * (folded + 1) / kw <= done) {
#pragma unroll
      for (int j = 0; j < kTiTiles; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          sum[j][i] = folded == 0 ? acc[j][i] : sum[j][i] + acc[j][i];
          acc[j][i] = 0.0f;
        }
      ++folded;
    }
  }
  // Accumulator i of n8 tile j: weight row n0 + g (+ 8 for i >= 2), activation row 8j + 2t + (i & 1).
  __device__ __forceinline__ void store(const GemmKernelParams& p, const int64_t* c_row, int64_t n0, int g,
                                        int t) const {
#pragma unroll
    for (int j = 0; j < kTiTiles; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int r = 8 * j + 2 * t + (i & 1);
        const int64_t col = n0 + g + (i >= 2 ? 8 : 0);
        const int64_t cr = c_row[r];
        if (cr >= 0 && col < p.n) p.c[cr * p.ldc + col] = sum[j][i];
      }
  }
};

// Grid: x = kTiN-row weight blocks, y = kTiM-row tiles (dense) or the plan's tiles (grouped). Static shared memory:
// two buffers of a step's activation fragments (FP8 16 KB, MXFP4 32 KB). kBf16A: the activations come from the
// caller's bf16 copy (p.a_bf16, RNE like the in-kernel rounding of p.a: the same bf16 values; half the bytes).
// kBlocks: blocks per SM the registers are bounded for (2: <= 128 registers, no spills with a bf16 A; an f32 A
// needs ~150-170).
template <QuantFormat F, bool kBf16A, int kBlocks>
__global__ void __launch_bounds__(kTiThreads, kBlocks)
    gemm_invariant_tile_kernel(GemmKernelParams p, int kw, int lbn, int lbk, bool a_vec) {
  constexpr int kMi = kMmas<F>, kC = kChunkK<F>;
  __shared__ __align__(16) uint2 xs[2][kMi * kTiM * 4];
  __shared__ int64_t a_row[kTiM], c_row[kTiM];

  int grp;
  int64_t row_begin, row_end;
  if (!gemm_tile_rows(p, blockIdx.y, 1, grp, row_begin, row_end)) return;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  if (tid < kTiM) {
    const int64_t i = row_begin + tid;
    const bool valid = i < row_end;
    a_row[tid] = !valid ? -1 : (p.a_rows ? p.a_rows[i] / p.a_row_div : i);
    c_row[tid] = !valid ? -1 : (p.c_rows ? p.c_rows[i] : i);
  }

  const int64_t n0 = (static_cast<int64_t>(blockIdx.x) * kTiWarps + warp) * 16;
  const uint8_t* b = static_cast<const uint8_t*>(p.b_table ? p.b_table[grp] : p.b);
  const uint8_t* s = static_cast<const uint8_t*>(p.b_scale_table ? p.b_scale_table[grp] : p.b_scale);
  const int chunks = static_cast<int>(p.k / kC), steps = (chunks + 3) / 4;
  WeightRows<F, 2, /*kL2Prefetch=*/false> wr;  // the streaming kernel's loads, without its L2 prefetch hint
  wr.set(p, b, s, n0, g, t, chunks, lbn);
  const auto load_w = [&](int st, StepData<2>& d) { wr.load(st, steps, chunks, t, lbk, d); };
  StepData<2> cur;
  load_w(0, cur);
  __syncthreads();  // a_row / c_row

  // This thread's activation chunk of a step: row tid / 4, chunk 4·step + tid % 4, as f32 or as bf16 pairs (k 2i,
  // 2i + 1 in word i); zeros past K / the rows.
  const int ar = tid >> 2, at = tid & 3;
  const int64_t a_src = a_row[ar];
  float v[kBf16A ? 1 : kC];
  uint32_t h[kBf16A ? kC / 2 : 1];
  auto load_a = [&](int st) {
    const int c = 4 * st + at;
    if constexpr (kBf16A)
      load_chunk<F>(p, a_src, c, chunks, h);
    else
      load_chunk<F>(p, a_src, c, chunks, a_vec, v);
  };
  // The fragment pairs of the chunk, as the streaming kernel stages them: [mma][row][chunk of the step].
  auto store_a = [&](int buf) {
    if constexpr (kBf16A)
      place_pairs<F>(h, xs[buf] + ar * 4 + at, kTiM * 4);
    else
      place_pairs<F>(v, xs[buf] + ar * 4 + at, kTiM * 4);
  };
  load_a(0);
  store_a(0);
  __syncthreads();

  TileOutputs<F> out;
  out.fold(0, steps, kw);
  for (int st = 0; st < steps; ++st) {
    const int buf = st & 1;
    // The next step's loads are in flight during this step's mmas.
    StepData<2> nxt;
    load_w(st + 1, nxt);
    const bool more = st + 1 < steps;
    if (more) load_a(st + 1);
    out.step(cur.q, cur.e, xs[buf] + lane);
    if (more) store_a(buf ^ 1);  // the buffer of step st - 1: every warp passed the barrier after using it
    __syncthreads();
    cur = nxt;
    out.fold(st + 1, steps, kw);
  }
  out.store(p, c_row, n0, g, t);
}

template <QuantFormat F>
void launch_tile(const GemmKernelParams& p, int kw, int lbn, int lbk, cudaStream_t stream) {
  const int64_t tiles_m = p.group_offsets ? p.max_tiles_m : ceil_div(p.m, kTiM);
  const int64_t tiles_n = ceil_div(p.n, kTiN);
  if (tiles_m == 0 || tiles_n == 0) return;
  DI_CHECK(tiles_m <= 65535) << "gemm: " << tiles_m << " row tiles are too many for one launch";
  const bool a_vec = p.lda % 4 == 0 && reinterpret_cast<uintptr_t>(p.a) % 16 == 0;
  const bool a16 = p.a_bf16 && p.lda % 8 == 0 && reinterpret_cast<uintptr_t>(p.a_bf16) % 16 == 0;
  // x = weight blocks (fastest): the blocks running together share an activation tile.
  const dim3 grid(static_cast<unsigned>(tiles_n), static_cast<unsigned>(tiles_m));
  if (a16)
    gemm_invariant_tile_kernel<F, true, 2><<<grid, kTiThreads, 0, stream>>>(p, kw, lbn, lbk, a_vec);
  else
    gemm_invariant_tile_kernel<F, false, 1><<<grid, kTiThreads, 0, stream>>>(p, kw, lbn, lbk, a_vec);
  DI_CUDA_CHECK_LAUNCH();
}

}  // namespace

bool gemm_invariant_mma_takes(QuantFormat format, bool scale_e8m0, int block_n, int block_k, int64_t k) {
  return stream_decode::decodes_format(format, scale_e8m0, block_n, block_k, k);
}

int gemm_invariant_mma_slices(QuantFormat format, int64_t n, int64_t k) {
  constexpr int64_t kMaxSlices = 8, kTargetWarps = 2048;  // the streaming kernel's block and device targets
  const int64_t chunk = format == QuantFormat::kMXFP4 ? 32 : 16;
  const int64_t steps = ceil_div(k / chunk, 4), tiles = ceil_div(n, 16);
  int kw = 1;
  while (kw < kMaxSlices && tiles * kw < kTargetWarps && steps >= 4 * kw) kw *= 2;
  return kw;
}

bool run_gemm_invariant_mma(const GemmKernelParams& p, cudaStream_t stream) {
  if (!p.batch_invariant || !gemm_invariant_mma_takes(p.format, p.scale_e8m0, p.block_n, p.block_k, p.k)) return false;
  if (p.group_offsets && (!p.active_groups || !p.tile_offsets)) return false;
  const auto aligned = [](const void* q) { return reinterpret_cast<uintptr_t>(q) % 16 == 0; };
  if (p.b_table ? !p.tables_aligned16 : !aligned(p.b)) return false;
  if (p.m == 0 || p.n == 0) return true;
  const int kw = gemm_invariant_mma_slices(p.format, p.n, p.k);
  const int64_t rows = p.rows_hint > 0 ? p.rows_hint : p.m;
  if (rows <= kGemmStreamMmaMaxRows && run_gemm_stream_mma_invariant(p, rows, kw, stream)) return true;
  const int lbn = p.format == QuantFormat::kFP8Block ? log2_exact(p.block_n) : 0;
  const int lbk = p.format == QuantFormat::kFP8Block ? log2_exact(p.block_k) : 0;
  switch (p.format) {
    case QuantFormat::kMXFP4:
      launch_tile<QuantFormat::kMXFP4>(p, kw, lbn, lbk, stream);
      return true;
    case QuantFormat::kFP8Row32:
      launch_tile<QuantFormat::kFP8Row32>(p, kw, lbn, lbk, stream);
      return true;
    case QuantFormat::kFP8Block:
      launch_tile<QuantFormat::kFP8Block>(p, kw, lbn, lbk, stream);
      return true;
    default:
      return false;
  }
}

}  // namespace deepinfer::cuda
