// Batch-invariant mode's few-row GEMMs with the SIMT tile's per-output arithmetic (gemm_common.cuh: run_gemm_chains):
// the column-chain kernels, and the dispatch between them and the SIMT tile.
#include "deepinfer/ops/cuda/gemm_common.cuh"
#include "deepinfer/ops/cuda/gemm_decode.cuh"

#include <algorithm>

namespace deepinfer::cuda {
namespace {

// ---------------------------------------------------------------------------- column-chain kernels
// Batch-invariant few-row GEMM: the SIMT tile's per-output arithmetic — acc = fmaf(a[k], w[k], acc) for k = 0, 1,
// ... over K rounded up to kBK with zeros past K, from acc = 0, w being load_weight's f32 value — so a row's output
// is bit-identical here and in a 128-row tile. K is never split (that would change the chain), so the parallelism
// is columns x rows only, and a chain is K dependent FMAs (~4 cycles each): the kernels keep many chains per SM and
// the weight stream ahead of them.

// Scalar fallback for shapes without 16-byte chunks (FP8 with K % 16 != 0, MXFP4 with K % 32 != 0, unaligned rows
// or tables): a block stages a [kChCols × kChK] weight slice through load_weight, warp w runs row w of the pass,
// lane c the chain of column c.
constexpr int kChWarps = 8, kChCols = 32, kChK = 256;
static_assert(kChK % kBK == 0, "a chain stage must end on a SIMT k-step");

template <QuantFormat F>
__global__ void __launch_bounds__(kChWarps * 32) gemm_chain_kernel(GemmKernelParams p) {
  __shared__ float ws[kChCols][kChK + 1];
  __shared__ float as[kChWarps][kChK];
  GroupSpan span;
  if (!active_group(p, blockIdx.y, span)) return;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kChCols;
  const void* b = p.b_table ? p.b_table[span.g] : p.b;
  const void* s = p.b_scale_table ? p.b_scale_table[span.g] : p.b_scale;
  const int64_t k_pad = (p.k + kBK - 1) / kBK * kBK;
  for (int64_t r0 = span.begin; r0 < span.end; r0 += kChWarps) {
    const int64_t r = r0 + warp;
    const bool has_row = r < span.end;
    const int64_t a_row = has_row ? (p.a_rows ? p.a_rows[r] / p.a_row_div : r) : -1;
    float acc = 0.0f;
    for (int64_t k0 = 0; k0 < k_pad; k0 += kChK) {
#pragma unroll 4
      for (int idx = tid; idx < kChCols * kChK; idx += kChWarps * 32) {
        const int c = idx / kChK, kk = idx % kChK;
        const int64_t n = n0 + c, k = k0 + kk;
        ws[c][kk] = (n < p.n && k < p.k) ? load_weight<F>(b, s, p, n, k) : 0.0f;
      }
      for (int kk = lane; kk < kChK; kk += 32) {
        const int64_t k = k0 + kk;
        as[warp][kk] = (a_row >= 0 && k < p.k) ? p.a[a_row * p.lda + k] : 0.0f;
      }
      __syncthreads();
      const int steps = static_cast<int>(min(int64_t{kChK}, k_pad - k0));
      if (has_row)
        for (int kk = 0; kk < steps; ++kk) acc = fmaf(as[warp][kk], ws[lane][kk], acc);
      __syncthreads();
    }
    const int64_t n = n0 + lane;
    if (has_row && n < p.n) p.c[(p.c_rows ? p.c_rows[r] : r) * p.ldc + n] = acc;
  }
}

// The vector kernel. Lane c of every warp owns column n0 + c; warp g owns rows g·R .. g·R + R - 1 of each pass of
// R × warps rows. The block streams its 32 weight rows and the pass's A rows through a cp.async ring of NS
// stages in 16-byte chunks (8 lanes copy a column's 128 contiguous bytes; the bytes in flight sit in shared memory,
// not in registers), and each thread decodes its own column's chunks with the shared decoders, one multiply by the
// scale per weight. More rows per thread (R = 2) share that decode; more warps per block (rows split across warps)
// put more chains on the SMs — the launch picks by how many warps the device can hold.
template <QuantFormat F>
struct ChainVec {
  static constexpr int kWeights = F == QuantFormat::kMXFP4 ? 32 : F == QuantFormat::kFloat ? 4 : 16;  // a chunk's
  static constexpr int kChunks = F == QuantFormat::kFloat ? 16 : 8;  // a column's chunks per stage
  static constexpr int kStageK = kWeights * kChunks;
  // 16 bytes of padding per column: the LDS.128 of 8 consecutive lanes (one phase) hit 8 distinct bank quads.
  static constexpr int kColBytes = kChunks * 16 + 16;
};
constexpr int kCvCols = 32, kCvMaxRows = 8, kCvMaxWarps = 8;

// Ring depths: deep (5 stages in flight) when the grid leaves most of each SM's shared memory free — few blocks
// per SM must keep enough bytes in flight on their own — and shallow (2 in flight) when more blocks must fit.
constexpr int kCvDeep = 6, kCvShallow = 3;

template <QuantFormat F>
constexpr size_t chain_vec_smem(int stages, int rows_pass) {
  using C = ChainVec<F>;
  return sizeof(int64_t) * kCvMaxRows + size_t(stages) * kCvCols * C::kColBytes +
         size_t(stages) * static_cast<size_t>(rows_pass) * C::kStageK * sizeof(float);
}

// Where the scale of weight (n, k) lives (load_weight's index), and its value.
template <QuantFormat F>
__device__ __forceinline__ const uint8_t* cv_scale_ptr(const GemmKernelParams& p, const void* s, int64_t n, int64_t k) {
  return static_cast<const uint8_t*>(s) +
         block_scale_index(p, F, n, k) * (F == QuantFormat::kMXFP4 || p.scale_e8m0 ? 1 : 4);
}
template <QuantFormat F>
__device__ __forceinline__ float cv_scale(const GemmKernelParams& p, const uint8_t* at) {
  if (F == QuantFormat::kMXFP4 || p.scale_e8m0) return e8m0_to_f32_dev(__ldg(at));
  return __ldg(reinterpret_cast<const float*>(at));
}

// acc[i] = fmaf(a_i[j], w[j], acc[i]) for j = 0 .. kN-1 in order; row i's activations at a + i·kStride.
template <int R, int kN, int kStride>
__device__ __forceinline__ void cv_fma(const float* a, const float* w, float (&acc)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i)
#pragma unroll
    for (int j = 0; j < kN; j += 4) {
      const float4 av = *reinterpret_cast<const float4*>(a + i * kStride + j);
      acc[i] = fmaf(av.x, w[j], acc[i]);
      acc[i] = fmaf(av.y, w[j + 1], acc[i]);
      acc[i] = fmaf(av.z, w[j + 2], acc[i]);
      acc[i] = fmaf(av.w, w[j + 3], acc[i]);
    }
}

// One MXFP4 chunk (32 weights). decode_fp4x8_pairs gives code·2^-14 exactly; kFold: times scale·2^14, which is
// exact (a power of two times 2^14, finite below 2^114), so one rounding of code·scale — load_weight's product and
// the SIMT tile's (code·2^-14·2^14)·scale; larger scales take that two-multiply form (!kFold).
template <int R, int kStride, bool kFold>
__device__ __forceinline__ void cv_mxfp4_chunk(const uint4 q, float sc, const float* a, float (&acc)[R]) {
  const uint32_t words[4] = {q.x, q.y, q.z, q.w};
  const float sc2 = sc * kFp4Unscale;
#pragma unroll
  for (int h = 0; h < 4; ++h) {
    float w[8];
    decode_fp4x8_pairs(words[h], w);
#pragma unroll
    for (int j = 0; j < 8; ++j) w[j] = kFold ? w[j] * sc2 : (w[j] * kFp4Unscale) * sc;
    cv_fma<R, 8, kStride>(a + 8 * h, w, acc);
  }
}

// The first `valid` chunks of one stage of the thread's column (wcol: its bytes in the ring) against its R rows.
template <QuantFormat F, int R>
__device__ __forceinline__ void cv_stage(const uint8_t* wcol, const float* a, const float (&sc)[ChainVec<F>::kChunks],
                                         int valid, float (&acc)[R]) {
  using C = ChainVec<F>;
#pragma unroll
  for (int c = 0; c < C::kChunks; ++c) {
    if (c >= valid) break;
    const uint4 q = *reinterpret_cast<const uint4*>(wcol + 16 * c);
    const float* ac = a + c * C::kWeights;
    if constexpr (F == QuantFormat::kFloat) {
      const float w[4] = {__uint_as_float(q.x), __uint_as_float(q.y), __uint_as_float(q.z), __uint_as_float(q.w)};
      cv_fma<R, 4, C::kStageK>(ac, w, acc);
    } else if constexpr (F == QuantFormat::kMXFP4) {
      if (!isinf(sc[c] * kFp4Unscale))
        cv_mxfp4_chunk<R, C::kStageK, true>(q, sc[c], ac, acc);
      else
        cv_mxfp4_chunk<R, C::kStageK, false>(q, sc[c], ac, acc);
    } else {
      // decode_fp8x16 is the exact e4m3 value (every e4m3 is an f16); times the scale: load_weight's product.
      float w[16];
      decode_fp8x16(q, w);
#pragma unroll
      for (int j = 0; j < 16; ++j) w[j] *= sc[c];
      cv_fma<R, 16, C::kStageK>(ac, w, acc);
    }
  }
}

// Grid: x = column blocks of kCvCols, y = group slots, or for a dense call with rows_per_block > 0 blocks of that
// many rows (more chains at once for a call of many rows and few columns); block = warps × 32 threads, dynamic
// shared memory chain_vec_smem<F>(NS, R × warps). The host checked 16-byte chunks (chain_vec_ok).
template <QuantFormat F, int R, int NS>
__global__ void __launch_bounds__(kCvMaxWarps * 32, 1) gemm_chain_vec_kernel(GemmKernelParams p, int rows_per_block) {
  using C = ChainVec<F>;
  constexpr int kC = C::kChunks, kK = C::kStageK, kNs = NS, kCol = C::kColBytes;
  extern __shared__ __align__(16) uint8_t cv_smem[];
  GroupSpan span;
  if (rows_per_block > 0 && !p.group_offsets) {
    const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rows_per_block;
    span = {0, r0, min(p.m, r0 + rows_per_block)};
  } else if (!active_group(p, blockIdx.y, span)) {
    return;
  }
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nthr = static_cast<int>(blockDim.x);
  const int rows_pass = R * (nthr >> 5);
  int64_t* a_off = reinterpret_cast<int64_t*>(cv_smem);  // element offset of each pass row in A; -1: none
  uint8_t* wring = cv_smem + sizeof(int64_t) * kCvMaxRows;
  float* aring = reinterpret_cast<float*>(wring + kNs * kCvCols * kCol);
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kCvCols, n = n0 + lane, nc = min(n, p.n - 1);
  const uint8_t* b = static_cast<const uint8_t*>(p.b_table ? p.b_table[span.g] : p.b);
  const void* s = p.b_scale_table ? p.b_scale_table[span.g] : p.b_scale;
  const int64_t row_bytes = F == QuantFormat::kMXFP4 ? p.k / 2 : (F == QuantFormat::kFloat ? 4 : 1) * p.k;
  const int64_t row_chunks = row_bytes / 16;
  // Chunks over K rounded up to kBK: f32 rows may end on 4 (the chunks past K are zeros, as in the SIMT tile's
  // last k-step); the block formats' K is a multiple of the chunk.
  const int64_t k_pad = (p.k + kBK - 1) / kBK * kBK, chunks = (k_pad + C::kWeights - 1) / C::kWeights;
  const int64_t stages = (chunks + kC - 1) / kC;
  // FP8 blocks at least a stage long (128 x 128): one scale per column and stage.
  bool stage_scale = false;
  if constexpr (F == QuantFormat::kFP8Block) stage_scale = (p.block_k & (p.block_k - 1)) == 0 && p.block_k % kK == 0;

  // A thread copies chunk `wc` of columns wcol0, wcol0 + wcol_step, ... of every stage (nthr is a multiple of 32,
  // so of kC): one pointer walk per stage instead of index arithmetic per chunk.
  const int wc = tid % kC, wcol0 = tid / kC, wcol_step = nthr / kC;
  const uint8_t* wsrc = b + (n0 + wcol0) * row_bytes + 16 * wc;
  auto issue = [&](int64_t st, int buf) {
    if (st < stages) {
      uint8_t* wdst = wring + buf * (kCvCols * kCol) + wcol0 * kCol + 16 * wc;
      const uint8_t* src = wsrc + st * (16 * kC);
      const bool k_ok = st * kC + wc < row_chunks;
      // Invalid chunks are zero-filled (k past K, columns past N, rows past the group read as 0).
      for (int col = wcol0; col < kCvCols; col += wcol_step) {
        const bool ok = k_ok && n0 + col < p.n;
        cp_async16(wdst, ok ? src : b, ok);
        wdst += wcol_step * kCol;
        src += wcol_step * row_bytes;
      }
      float* ab = aring + buf * rows_pass * kK;
      for (int id = tid; id < rows_pass * (kK / 4); id += nthr) {
        const int r = id / (kK / 4), c4 = id % (kK / 4);
        const int64_t k = st * kK + 4 * c4, off = a_off[r];
        const bool ok = off >= 0 && k < p.k;
        cp_async16(ab + r * kK + 4 * c4, ok ? p.a + off + k : p.a, ok);
      }
      if constexpr (F != QuantFormat::kFloat) {
        // The stage's scales towards L2 now: their register loads go out one stage ahead of use.
        if (warp == 0 && st * kC < row_chunks)
          asm volatile("prefetch.global.L2 [%0];" ::"l"(cv_scale_ptr<F>(p, s, nc, st * kK)));
      }
    }
    cp_async_commit();
  };
  auto load_scales = [&](int64_t st, float(&sc)[kC]) {
    if constexpr (F != QuantFormat::kFloat) {
      if (stage_scale) {
        const float v = cv_scale<F>(p, cv_scale_ptr<F>(p, s, nc, st * kK));
#pragma unroll
        for (int c = 0; c < kC; ++c) sc[c] = v;
      } else {
#pragma unroll
        for (int c = 0; c < kC; ++c) {
          const int64_t kc = st * kC + c;
          sc[c] = kc < row_chunks ? cv_scale<F>(p, cv_scale_ptr<F>(p, s, nc, kc * C::kWeights)) : 0.0f;
        }
      }
    }
  };

  for (int64_t r0 = span.begin; r0 < span.end; r0 += rows_pass) {
    if (tid < rows_pass) {
      const int64_t r = r0 + tid;
      a_off[tid] = r < span.end ? (p.a_rows ? p.a_rows[r] / p.a_row_div : r) * p.lda : -1;
    }
    __syncthreads();
#pragma unroll 1
    for (int j = 0; j < kNs - 1; ++j) issue(j, j);
    const bool active = r0 + warp * R < span.end;  // warp-uniform: warps past the group's rows only copy
    float acc[R];
#pragma unroll
    for (int i = 0; i < R; ++i) acc[i] = 0.0f;
    float sc[kC] = {}, sc_next[kC] = {};
    load_scales(0, sc);
    int buf = 0, fill = kNs - 1;
    for (int64_t st = 0; st < stages; ++st) {
      cp_async_wait<kNs - 2>();
      __syncthreads();  // stage st landed for every thread; stage st - 1's buffer is free for st + kNs - 1
      issue(st + kNs - 1, fill);
      fill = fill + 1 == kNs ? 0 : fill + 1;
      if (st + 1 < stages) load_scales(st + 1, sc_next);
      if (active)
        cv_stage<F, R>(wring + buf * (kCvCols * kCol) + lane * kCol, aring + (buf * rows_pass + warp * R) * kK, sc,
                       static_cast<int>(min(int64_t{kC}, chunks - st * kC)), acc);
#pragma unroll
      for (int c = 0; c < kC; ++c) sc[c] = sc_next[c];
      buf = buf + 1 == kNs ? 0 : buf + 1;
    }
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const int64_t r = r0 + warp * R + i;
      if (r < span.end && n < p.n) p.c[(p.c_rows ? p.c_rows[r] : r) * p.ldc + n] = acc[i];
    }
    cp_async_wait<0>();
    __syncthreads();  // the next pass refills the ring and a_off
  }
}

// 16-byte chunks that never straddle a row, a scale or K (f32 rows only need K % 4: the chunks past K are zeros).
template <QuantFormat F>
bool chain_vec_ok(const GemmKernelParams& p) {
  const auto aligned = [](const void* q) { return reinterpret_cast<uintptr_t>(q) % 16 == 0; };
  if (p.lda % 4 != 0 || !aligned(p.a) || !(p.b_table ? p.tables_aligned16 : aligned(p.b))) return false;
  if constexpr (F == QuantFormat::kFloat) return p.k % 4 == 0;
  if constexpr (F == QuantFormat::kMXFP4) return p.k % 32 == 0;
  return p.k % 16 == 0 && (F != QuantFormat::kFP8Block || p.block_k % 16 == 0);
}

// slots: grid y (group slots, or row blocks of rows_per_block rows for a dense call).
template <QuantFormat F, int R, int NS>
void launch_chain_ring(const GemmKernelParams& p, int warps, int64_t slots, int rows_per_block, cudaStream_t stream) {
  const size_t smem = chain_vec_smem<F>(NS, R * warps);
  DI_CUDA_CHECK(cudaFuncSetAttribute(gemm_chain_vec_kernel<F, R, NS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(smem)));
  DI_CHECK(slots <= 65535) << "gemm: " << slots << " chain row blocks are too many for one launch";
  const dim3 grid(static_cast<unsigned>(ceil_div(p.n, kCvCols)), static_cast<unsigned>(slots));
  gemm_chain_vec_kernel<F, R, NS><<<grid, warps * 32, smem, stream>>>(p, rows_per_block);
}

template <QuantFormat F, int R>
void launch_chain_vec(const GemmKernelParams& p, int warps, int64_t blocks, int64_t slots, cudaStream_t stream,
                      int rows_per_block = 0) {
  // Deep ring if every block still fits on the device at once with it (227 KB of shared memory per SM).
  const int64_t per_sm = ceil_div(blocks, device_sm_count());
  if (per_sm * static_cast<int64_t>(chain_vec_smem<F>(kCvDeep, R * warps)) <= 227 * 1024)
    launch_chain_ring<F, R, kCvDeep>(p, warps, slots, rows_per_block, stream);
  else
    launch_chain_ring<F, R, kCvShallow>(p, warps, slots, rows_per_block, stream);
}

template <QuantFormat F>
void launch_invariant(const GemmKernelParams& p, bool vec, cudaStream_t stream) {
  const int64_t rows = p.rows_hint > 0 ? p.rows_hint : p.m;
  if (rows > kCvMaxRows) {
    // A dense call whose SIMT tiles leave most of the device idle (a few hundred columns at tens of rows: the f32
    // router of N = 256 at 64 rows was two 128 x 128 tiles, 1.6 ms a decode step of the V4-Flash slice, before it
    // took the sliced chains of gemm_invariant_f32.h) runs the chain kernel over blocks of kCvMaxRows rows instead:
    // every output is the same chain either way.
    const int64_t simt_blocks = ceil_div(p.m, kSm) * ceil_div(p.n, kSm);
    if (!p.group_offsets && chain_vec_ok<F>(p) && simt_blocks * 4 < device_sm_count() &&
        ceil_div(p.m, kCvMaxRows) <= 65535) {
      const int64_t row_blocks = ceil_div(p.m, kCvMaxRows), blocks = ceil_div(p.n, kCvCols) * row_blocks;
      if (blocks * kCvMaxRows > 8ll * device_sm_count())
        launch_chain_vec<F, 2>(p, kCvMaxRows / 2, blocks, row_blocks, stream, kCvMaxRows);
      else
        launch_chain_vec<F, 1>(p, kCvMaxRows, blocks, row_blocks, stream, kCvMaxRows);
      return;
    }
    run_gemm_simt(p, vec, stream);
    return;
  }
  const int64_t slots = std::max<int64_t>(p.group_offsets ? std::min<int64_t>(p.groups, p.m) : 1, 1);
  DI_CHECK(!p.group_offsets || p.active_groups) << "gemm: grouped chain launch needs active_groups";
  if (!chain_vec_ok<F>(p)) {
    const dim3 grid(static_cast<unsigned>(ceil_div(p.n, kChCols)), static_cast<unsigned>(slots));
    gemm_chain_kernel<F><<<grid, kChWarps * 32, 0, stream>>>(p);
    return;
  }
  // A warp per row while the device holds them (a chain's time is fixed by K, so more chains in parallel is what
  // shortens the call); past ~8 warps per SM, two rows per thread halve the decoding work per product. Either
  // way every output is the same chain: the choice never changes a bit.
  const int64_t used_groups = p.group_offsets ? std::min<int64_t>(slots, ceil_div(p.m, rows)) : 1;
  const int64_t blocks = ceil_div(p.n, kCvCols) * std::max<int64_t>(used_groups, 1);
  if (rows >= 2 && blocks * rows > 8ll * device_sm_count())
    launch_chain_vec<F, 2>(p, static_cast<int>(ceil_div(rows, 2)), blocks, slots, stream);
  else
    launch_chain_vec<F, 1>(p, static_cast<int>(rows), blocks, slots, stream);
}

}  // namespace

void run_gemm_chains(const GemmKernelParams& p, bool vec, cudaStream_t stream) {
  with_format(p.format, [&](auto f) { launch_invariant<decltype(f)::value>(p, vec, stream); });
}

}  // namespace deepinfer::cuda
