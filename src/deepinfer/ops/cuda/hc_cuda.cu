// mHC on the GPU: site coefficients (norm + small projection + sigmoid gates + Sinkhorn), the V4 head's
// collapse weights, collapse and expand. The coefficients are a GEMV per token, (2+hc)·hc rows of length hc·D
// (1.5 MB of fn for V4-Flash): split over hc·D in 512-element chunks so ~32 blocks stream fn at once (one block
// per token walked it alone: ~0.65 ms a site), then the splits are summed in fixed order and the gates and the
// Sinkhorn iterations run in the CPU op's order. For decode-sized calls (p.arrivals set) the last partial block of a
// token tile to finish runs that step itself, so a site is one launch instead of two (decode is launch-bound); the
// finish is the same code either way, so both forms give the same bits. Long calls (prefill) take the staged partial
// kernel: the streams through a cp.async ring, the same partial bits (hc_mix_partial_staged_kernel).
#include <algorithm>
#include <cstdint>

#include "deepinfer/ops/cuda/device_math.cuh"
#include "deepinfer/ops/cuda/gemm_decode.cuh"  // cp_async16 / cp_async_commit / cp_async_wait
#include "deepinfer/ops/cuda/hc_common.cuh"
#include "deepinfer/ops/cuda/kernels.h"

namespace deepinfer::cuda {
namespace {

using hc_common::expand_value;
using hc_common::kMaxHc;
constexpr int kMaxMixRows = (2 + kMaxHc) * kMaxHc;

__device__ __forceinline__ float sigmoid_dev(float x) { return 1.0f / (1.0f + expf(-x)); }

// Split-K partial sums: block (split, token tile) reads its fn chunk once into registers (each warp owns rows
// warp, warp + 8, ...) and dots it with the chunk of every token of the tile; it also sums the chunk's f².
// part[(split·tokens + t)·(rows + 1) + r] = Σ_chunk fn[r]·f, and [.. + rows] = Σ_chunk f².
constexpr int kMixThreads = 256;
constexpr int kMixWarps = kMixThreads / 32;
constexpr int kMixChunk = 512;  // elements of hc·D per split: 16 per lane
// Tokens a block dots its fn chunk with: 8 for decode batches (more blocks in flight), 32 in long prefills, where
// re-reading each fn chunk (24 rows x 512) for every 8 tokens tripled the L2 traffic of the streams themselves.
constexpr int kMixTokensPerBlock = 8, kMixTokensPerBlockLong = 32, kMixLongTokens = 2048;
// Shared memory of the one-launch partial kernel's finish (finish_if_last's staged partials): 8 tokens x 25 rows x 40
// splits fit (V4.1's hc = 4, D = 5120).
constexpr int kMixStageFloats = 8192;

// hc = 4, not the head: lane j*4 + k of the token's warp owns c[j][k] (lanes 0-3 also pre[k] / post[k]), so the
// 20 Sinkhorn iterations' divisions run 16 at a time instead of one after another on one lane (27 µs a call at
// batch 1, ncu). Every value is the same operations in the same order as the one-lane form: a row's or a
// column's sum gathers its four entries by shuffles and adds them in index order.
__device__ __forceinline__ void finish_sinkhorn4(const HcMixKernelParams& p, const float* m, int64_t rows, int64_t n,
                                                 int64_t t, int lane) {
  constexpr int kHc = 4;
  const float inv = 1.0f / sqrtf(m[rows] / static_cast<float>(n) + p.norm_eps);
  const int j = (lane >> 2) & 3, k = lane & 3;
  if (lane < kHc) {
    p.pre[t * kHc + k] = sigmoid_dev((m[k] * inv) * p.scale[0] + p.base[k]) + p.hc_eps;
    p.post[t * kHc + k] = 2.0f * sigmoid_dev((m[kHc + k] * inv) * p.scale[1] + p.base[kHc + k]);
  }
  const int e = 2 * kHc + j * kHc + k;
  float c = (m[e] * inv) * p.scale[2] + p.base[e];
  const auto row_at = [&](float v, int kk) { return __shfl_sync(0xffffffffu, v, (lane & ~3) + kk); };
  const auto col_at = [&](float v, int jj) { return __shfl_sync(0xffffffffu, v, (lane & 16) + jj * kHc + k); };
  float mx = -INFINITY;
#pragma unroll
  for (int kk = 0; kk < kHc; ++kk) mx = fmaxf(mx, row_at(c, kk));
  c = expf(c - mx);
  float sum = 0.0f;
#pragma unroll
  for (int kk = 0; kk < kHc; ++kk) sum += row_at(c, kk);
  c = c / sum + p.hc_eps;
  for (int it = 0; it < p.sinkhorn_iters; ++it) {
    if (it > 0) {
      sum = 0.0f;
#pragma unroll
      for (int kk = 0; kk < kHc; ++kk) sum += row_at(c, kk);
      c /= sum + p.hc_eps;
    }
    sum = 0.0f;
#pragma unroll
    for (int jj = 0; jj < kHc; ++jj) sum += col_at(c, jj);
    c /= sum + p.hc_eps;
  }
  if (lane < kHc * kHc) p.comb[t * kHc * kHc + lane] = c;
}

// One warp per token: sums the splits' partials in split order, then the gates and Sinkhorn in the CPU op's order.
// kHc = 4 (V4 / V4.1) hands the non-head finish to finish_sinkhorn4 (16 lanes); every other case — the head's
// gates, or hc unknown at compile time (kHc = 0) — runs on lane 0 with the matrix in shared memory (~55 µs a call
// for a non-head hc = 4 on the H200: ~2,000 dependent shared-memory accesses and divisions; docs/PERF.md).
// m: rows + 1 floats, c: hc² floats of the warp's shared memory. The partials are read through L2 (__ldcg): in the
// fused form other blocks of the same launch wrote them.
// staged (optional): the partials of the token tile [t0, t0 + staged_tokens) copied to shared memory by the whole
// block, [split][token - t0][rows + 1] (one round trip for all of them instead of a chain of L2 loads per lane); the
// sums are the same, in the same split order.
template <int kHc>
__device__ void finish_token(const HcMixKernelParams& p, float* m, float* c, int64_t t, int lane,
                             const float* staged = nullptr, int64_t t0 = 0, int64_t staged_tokens = 0) {
  const int64_t hc = kHc > 0 ? kHc : p.hc, n = hc * p.d, rows = p.head ? hc : (2 + hc) * hc;
  __syncwarp();  // a warp finishing several tokens: lane 0 may still read m / c of the previous one
  for (int64_t r = lane; r <= rows; r += 32) {
    float acc = 0.0f;
    if (staged) {
      const float* src = staged + (t - t0) * (rows + 1) + r;
      const int64_t stride = staged_tokens * (rows + 1);
#pragma unroll 8
      for (int s = 0; s < p.splits; ++s) acc += src[s * stride];
    } else {
      // Unrolled so that several partials are in flight; still summed in split order.
#pragma unroll 8
      for (int s = 0; s < p.splits; ++s) acc += __ldcg(p.partial + (s * p.tokens + t) * (rows + 1) + r);
    }
    m[r] = acc;
  }
  __syncwarp();
  if constexpr (kHc == 4) {
    if (!p.head) {
      finish_sinkhorn4(p, m, rows, n, t, lane);
      return;
    }
  }
  if (lane != 0) return;
  // m·rsqrt(mean f² + eps): the norm folded in after the dot (f̂ = f·inv, so fn·f̂ = inv·(fn·f)).
  const float inv = 1.0f / sqrtf(m[rows] / static_cast<float>(n) + p.norm_eps);
  for (int64_t r = 0; r < rows; ++r) m[r] *= inv;
  float* pre = p.pre + t * hc;
  if (p.head) {
#pragma unroll
    for (int64_t k = 0; k < hc; ++k) pre[k] = sigmoid_dev(m[k] * p.scale[0] + p.base[k]) + p.hc_eps;
    return;
  }
  float* post = p.post + t * hc;
#pragma unroll
  for (int64_t k = 0; k < hc; ++k) {
    pre[k] = sigmoid_dev(m[k] * p.scale[0] + p.base[k]) + p.hc_eps;
    post[k] = 2.0f * sigmoid_dev(m[hc + k] * p.scale[1] + p.base[hc + k]);
  }
// c[j*hc + k]: row softmax + eps, one column normalisation, then (row, column) pairs; denominators + eps.
#pragma unroll
  for (int64_t j = 0; j < hc; ++j) {
    float mx = -INFINITY;
#pragma unroll
    for (int64_t k = 0; k < hc; ++k) {
      c[j * hc + k] = m[2 * hc + j * hc + k] * p.scale[2] + p.base[2 * hc + j * hc + k];
      mx = fmaxf(mx, c[j * hc + k]);
    }
    float sum = 0.0f;
#pragma unroll
    for (int64_t k = 0; k < hc; ++k) sum += (c[j * hc + k] = expf(c[j * hc + k] - mx));
#pragma unroll
    for (int64_t k = 0; k < hc; ++k) c[j * hc + k] = c[j * hc + k] / sum + p.hc_eps;
  }
  for (int it = 0; it < p.sinkhorn_iters; ++it) {
    if (it > 0) {
#pragma unroll
      for (int64_t j = 0; j < hc; ++j) {
        float sum = 0.0f;
#pragma unroll
        for (int64_t k = 0; k < hc; ++k) sum += c[j * hc + k];
#pragma unroll
        for (int64_t k = 0; k < hc; ++k) c[j * hc + k] /= sum + p.hc_eps;
      }
    }
#pragma unroll
    for (int64_t k = 0; k < hc; ++k) {
      float sum = 0.0f;
#pragma unroll
      for (int64_t j = 0; j < hc; ++j) sum += c[j * hc + k];
#pragma unroll
      for (int64_t j = 0; j < hc; ++j) c[j * hc + k] /= sum + p.hc_eps;
    }
  }
  float* comb = p.comb + t * hc * hc;
#pragma unroll
  for (int64_t i = 0; i < hc * hc; ++i) comb[i] = c[i];
}

template <int kHc>
__global__ void hc_mix_finish_kernel(HcMixKernelParams p) {
  __shared__ float m_all[4][kMaxMixRows + 1];
  __shared__ float c_all[4][kMaxHc * kMaxHc];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * 4 + warp;
  if (t >= p.tokens) return;
  finish_token<kHc>(p, m_all[warp], c_all[warp], t, lane);
}

// One token's partials of one split: warp w dots its fn rows w, w + 8, ... (in registers, w[j][e] = fn[r, c0 + lane +
// 32e]) with the chunk f[e] in e order, then a warp sum; the last warp also sums f². Shared by the partial kernel and
// the fused expand + mix kernel, so both give the same bits.
template <int kMixRowsPerWarp>
__device__ __forceinline__ void write_partials(const float (&w)[kMixRowsPerWarp][kMixChunk / 32],
                                               const float (&f)[kMixChunk / 32], float* out, int64_t rows, int warp,
                                               int lane) {
  constexpr int kPer = kMixChunk / 32;
#pragma unroll
  for (int j = 0; j < kMixRowsPerWarp; ++j) {
    const int64_t r = warp + j * kMixWarps;
    if (r >= rows) break;
    float acc = 0.0f;
#pragma unroll
    for (int e = 0; e < kPer; ++e) acc = fmaf(w[j][e], f[e], acc);
    acc = warp_sum(acc);
    if (lane == 0) out[r] = acc;
  }
  if (warp == kMixWarps - 1) {
    float ss = 0.0f;
#pragma unroll
    for (int e = 0; e < kPer; ++e) ss = fmaf(f[e], f[e], ss);
    ss = warp_sum(ss);
    if (lane == 0) out[rows] = ss;
  }
}

// The fn chunk of split `split` into registers (zero past the rows / columns): warp w of kWarps holds rows w,
// w + kWarps, ...
template <int kMixRowsPerWarp, int kWarps = kMixWarps>
__device__ __forceinline__ void load_fn_chunk(const HcMixKernelParams& p, int64_t split, int64_t rows,
                                              float (&w)[kMixRowsPerWarp][kMixChunk / 32], int warp, int lane) {
  const int64_t n = p.hc * p.d, c0 = split * kMixChunk;
#pragma unroll
  for (int j = 0; j < kMixRowsPerWarp; ++j) {
    const int64_t r = warp + j * kWarps;
#pragma unroll
    for (int e = 0; e < kMixChunk / 32; ++e) {
      const int64_t i = c0 + lane + 32 * e;
      w[j][e] = r < rows && i < n ? __ldg(p.fn + r * n + i) : 0.0f;
    }
  }
}

// The one-launch tail: once this block's partials are written, the last block of the token tile [t0, t1) to arrive
// runs finish_token<kFinishHc> for the tile's tokens (one warp per token); the tile's arrival counter `counter` counts
// the `blocks` blocks of the tile and is left at 0 for the next call. stage (optional, shared memory of stage_cap
// floats that the block no longer needs): where the tile's partials fit, the block copies them there first.
template <int kFinishHc>
__device__ __forceinline__ void finish_if_last(const HcMixKernelParams& p, unsigned* counter, unsigned blocks,
                                               int64_t t0, int64_t t1, int warp, int lane, float* stage = nullptr,
                                               int stage_cap = 0) {
  __shared__ bool last;
  __shared__ float m_all[kMixWarps][kMaxMixRows + 1];
  __shared__ float c_all[kMixWarps][kMaxHc * kMaxHc];
  __threadfence();  // this block's partials reach L2 before its arrival is counted
  __syncthreads();
  if (threadIdx.x == 0) {
    last = atomicAdd(counter, 1u) == blocks - 1;
    if (last) atomicExch(counter, 0u);
  }
  __syncthreads();
  if (!last) return;
  __threadfence();  // every split's partials counted before are read after this point
  const int rows1 = static_cast<int>(p.head ? p.hc : (2 + p.hc) * p.hc) + 1;
  const int per_split = static_cast<int>(t1 - t0) * rows1, total = p.splits * per_split;
  const float* staged = nullptr;
  if (stage && total <= stage_cap) {
    // The tile's rows of split s are contiguous: partial[(s·tokens + t0)·(rows + 1) ...].
    for (int idx = threadIdx.x; idx < total; idx += blockDim.x) {
      const int s = idx / per_split;
      stage[idx] = __ldcg(p.partial + (s * p.tokens + t0) * rows1 + (idx - s * per_split));
    }
    __syncthreads();
    staged = stage;
  }
  for (int64_t t = t0 + warp; t < t1; t += kMixWarps)
    finish_token<kFinishHc>(p, m_all[warp], c_all[warp], t, lane, staged, t0, t1 - t0);
}

// kMixRowsPerWarp: fn rows a warp keeps in registers (3 covers hc <= 4: 24 rows over 8 warps). kFinishHc >= 0: the
// one-launch form (finish_if_last).
template <int kMixRowsPerWarp, int kFinishHc>
__global__ void __launch_bounds__(kMixThreads) hc_mix_partial_kernel(HcMixKernelParams p) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t n = p.hc * p.d, rows = p.head ? p.hc : (2 + p.hc) * p.hc;
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kMixChunk;
  const int64_t per_block = (p.tokens + gridDim.y - 1) / gridDim.y;
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * per_block;
  const int64_t t1 = min(p.tokens, t0 + per_block);
  constexpr int kPer = kMixChunk / 32;
  float w[kMixRowsPerWarp][kPer];
  load_fn_chunk<kMixRowsPerWarp>(p, blockIdx.x, rows, w, warp, lane);
  for (int64_t t = t0; t < t1; ++t) {
    float f[kPer];
#pragma unroll
    for (int e = 0; e < kPer; ++e) {
      const int64_t i = c0 + lane + 32 * e;
      f[e] = i < n ? __ldg(p.streams + t * n + i) : 0.0f;
    }
    write_partials<kMixRowsPerWarp>(w, f, p.partial + (blockIdx.x * p.tokens + t) * (rows + 1), rows, warp, lane);
  }
  if constexpr (kFinishHc >= 0) {
    __shared__ float stage[kMixStageFloats];
    finish_if_last<kFinishHc>(p, p.arrivals + blockIdx.y, gridDim.x, t0, t1, warp, lane, stage, kMixStageFloats);
  }
}

// Long prefills (the two-launch form): the partial kernel above holds its fn chunk in registers and walks its tokens
// one after another, each token's chunk loaded only once the previous token's dots are done, and all 8 warps load
// the same chunk: ~2 KB of x in flight a block, latency-bound at ~1/8 of HBM (1.03 ms a V4-Flash site at 8192
// tokens, ncu). Here a block streams its tokens' chunks into a ring of shared-memory slots with cp.async
// (kStageSlots - 1 slots of kStageTokens tokens in flight while one is used) and walks many tokens with one fn chunk
// (the grid is about one wave, fn read once a block). 4 warps of kStageRows rows each (half the shared-memory reads
// of 8 warps x 3 rows). The partials are the same bits as write_partials': each row's chain over the lane's 16
// elements (the same fmaf order, from 0), and the same butterfly of warp_sum — the rows of a warp are reduced
// together by exchanging at each level the half a lane does not keep (stage_reduce), so each add has the same two
// operands in the same order as warp_sum's, with 9 shuffles for 8 values instead of 40.
constexpr int kStageThreads = 128, kStageWarps = kStageThreads / 32;
constexpr int kStageTokens = 8, kStageSlots = 4;
constexpr int kStageSlotFloats = kStageTokens * kMixChunk;  // 16 KB
constexpr size_t kStageSmemBytes = sizeof(float) * kStageSlots * kStageSlotFloats;

// v[i] of every lane, summed over the warp as warp_sum would sum each: level o (16, 8, ...) while more than one value
// is left pairs v[2i], v[2i+1]; a lane with bit o set keeps the odd one, the other the even one, and it adds the
// partner's copy of the one it keeps (v_own + v_partner, warp_sum's operands and order); then the remaining levels
// on the one value. Returns the sum of v[stage_reduce_index(lane)].
template <int kN>
__device__ __forceinline__ float stage_reduce(float (&v)[kN], int lane) {
  static_assert(kN >= 1 && kN <= 32 && (kN & (kN - 1)) == 0, "a power of two up to 32");
  int o = 16;
#pragma unroll
  for (int cnt = kN; cnt > 1; cnt >>= 1, o >>= 1) {
    const bool odd = (lane & o) != 0;
#pragma unroll
    for (int i = 0; i < cnt / 2; ++i) {
      const float keep = odd ? v[2 * i + 1] : v[2 * i], give = odd ? v[2 * i] : v[2 * i + 1];
      v[i] = keep + __shfl_xor_sync(0xffffffffu, give, o);
    }
  }
  float s = v[0];
#pragma unroll
  for (; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  return s;
}
// Which v index lane holds after stage_reduce<kN>: bit k of it is lane bit 4 - k.
template <int kN>
__device__ __forceinline__ int stage_reduce_index(int lane) {
  int idx = 0;
#pragma unroll
  for (int k = 0, cnt = kN; cnt > 1; ++k, cnt >>= 1) idx |= ((lane >> (4 - k)) & 1) << k;
  return idx;
}
// Lanes holding a full sum after stage_reduce<kN>: those with the bits below the last paired level clear.
template <int kN>
__device__ __forceinline__ bool stage_reduce_writer(int lane) {
  return (lane & (32 / kN - 1)) == 0;
}

__host__ __device__ constexpr int stage_pad(int n) { return n <= 1 ? 1 : 2 * stage_pad((n + 1) / 2); }

// Block (split, range): tokens [t0, t1) of split blockIdx.x. Needs hc·d % 4 == 0 and 16-byte aligned streams.
// kTokenWarps = false: warp w holds rows w, w + 4, ... (kStageRows each) and dots them with every token; true (rows
// <= kStageRows, the head): every warp holds all the rows and takes tokens w, w + 4, ... of each group, so one warp
// per token reads the chunk and the 4 warps' chains run side by side. kTokPer tokens a warp at once (their
// chains and shuffle trees are independent: each hides the other's latency). ss: the token's warp (kTokenWarps)
// or the last warp.
template <int kStageRows, bool kTokenWarps, int kTokPer>
__global__ void __launch_bounds__(kStageThreads, 3) hc_mix_partial_staged_kernel(HcMixKernelParams p) {
  extern __shared__ __align__(16) float slots[];  // [kStageSlots][kStageTokens][kMixChunk]
  constexpr int kPer = kMixChunk / 32, kVals = stage_pad(kStageRows + 1);
  constexpr int kTokStep = kTokenWarps ? kStageWarps : 1;  // tokens between a warp's consecutive tokens
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const bool ss_warp = kTokenWarps || warp == kStageWarps - 1;
  const int64_t n = p.hc * p.d, rows = p.head ? p.hc : (2 + p.hc) * p.hc;
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kMixChunk;
  const int64_t per_block = (p.tokens + gridDim.y - 1) / gridDim.y;
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * per_block;
  const int64_t t1 = min(p.tokens, t0 + per_block);
  const int groups = t1 > t0 ? static_cast<int>((t1 - t0 + kStageTokens - 1) / kStageTokens) : 0;
  // Group g (tokens t0 + 8g ...) into slot g % kStageSlots: thread x copies columns [4x, 4x + 4) of the chunk of each
  // token, zero past n (as the old kernel's f).
  static_assert(kMixChunk / 4 == kStageThreads, "one 16-byte piece of each token's chunk a thread");
  const int64_t col = c0 + 4 * threadIdx.x;
  const bool col_ok = col < n;
  const float* col_src = p.streams + (col_ok ? col : 0);
  const auto issue = [&](int g) {
    if (g < groups) {
      float* dst = slots + (g % kStageSlots) * kStageSlotFloats + 4 * threadIdx.x;
      const int64_t tg = t0 + static_cast<int64_t>(g) * kStageTokens;
      const float* src = col_src + (col_ok ? tg * n : 0);
      const int64_t step = col_ok ? n : 0;
      const int64_t count = min(static_cast<int64_t>(kStageTokens), t1 - tg);
#pragma unroll
      for (int k = 0; k < kStageTokens; ++k)
        if (k < count) cp_async16(dst + k * kMixChunk, src + k * step, col_ok);
    }
    cp_async_commit();  // an empty group past the end keeps the wait count uniform
  };
#pragma unroll
  for (int g = 0; g < kStageSlots - 1; ++g) issue(g);
  float w[kStageRows][kPer];
  // from L2 while x streams in
  if constexpr (kTokenWarps)
    load_fn_chunk<kStageRows, 1>(p, blockIdx.x, rows, w, 0, lane);
  else
    load_fn_chunk<kStageRows, kStageWarps>(p, blockIdx.x, rows, w, warp, lane);
  const int idx = stage_reduce_index<kVals>(lane);
  const bool writer = stage_reduce_writer<kVals>(lane);
  const int64_t out_row = kTokenWarps ? idx : warp + static_cast<int64_t>(idx) * kStageWarps;
  const bool writes_row = writer && idx < kStageRows && out_row < rows;
  const bool writes_ss = writer && idx == kStageRows && ss_warp;
  for (int g = 0; g < groups; ++g) {
    issue(g + kStageSlots - 1);  // into the slot read in step g - 1 (released by its trailing barrier)
    cp_async_wait<kStageSlots - 1>();
    __syncthreads();  // every thread's pieces of group g have landed
    const float* slot = slots + (g % kStageSlots) * kStageSlotFloats;
    const int64_t tg = t0 + static_cast<int64_t>(g) * kStageTokens;
    const int count = static_cast<int>(min(static_cast<int64_t>(kStageTokens), t1 - tg));
    for (int tl = kTokenWarps ? warp : 0; tl < count; tl += kTokStep * kTokPer) {
      float v[kTokPer][kVals];
#pragma unroll
      for (int i = 0; i < kTokPer; ++i) {
        // A token past the group's end repeats the first one (same slot data, nothing written).
        const int ti = tl + i * kTokStep < count ? tl + i * kTokStep : tl;
        const float* fs = slot + ti * kMixChunk + lane;
        float f[kPer];
#pragma unroll
        for (int e = 0; e < kPer; ++e) f[e] = fs[32 * e];
#pragma unroll
        for (int j = 0; j < kStageRows; ++j) {
          float acc = 0.0f;
#pragma unroll
          for (int e = 0; e < kPer; ++e) acc = fmaf(w[j][e], f[e], acc);
          v[i][j] = acc;
        }
        float ss = 0.0f;
        if (ss_warp) {
#pragma unroll
          for (int e = 0; e < kPer; ++e) ss = fmaf(f[e], f[e], ss);
        }
        v[i][kStageRows] = ss;
#pragma unroll
        for (int j = kStageRows + 1; j < kVals; ++j) v[i][j] = 0.0f;
      }
      float sum[kTokPer];
#pragma unroll
      for (int i = 0; i < kTokPer; ++i) sum[i] = stage_reduce<kVals>(v[i], lane);
#pragma unroll
      for (int i = 0; i < kTokPer; ++i) {
        const int ti = tl + i * kTokStep;
        if (ti >= count) break;
        float* out = p.partial + (blockIdx.x * p.tokens + tg + ti) * (rows + 1);
        if (writes_row) out[out_row] = sum[i];
        if (writes_ss) out[rows] = sum[i];
      }
    }
    __syncthreads();  // slot g % kStageSlots is free for the issue of step g + 1
  }
  cp_async_wait<0>();  // no copy left in flight (the trailing groups are empty)
}

// hc_expand then hc_mix in one launch, for hc <= kExpandMixMaxHc and D a multiple of kMixChunk. Block (c, tile) owns
// columns [c·512, (c+1)·512) of every stream for the tile's tokens: it expands them in place (no other block reads
// them: the in-place update needs no grid-wide order) with hc_expand_kernel's arithmetic, keeps the new values in
// shared memory, and writes the partials of the hc splits those columns are (split k·D/512 + c: the same chunks,
// values and order as the partial kernel over the expanded streams), then finish_if_last.
constexpr int kExpandMixMaxHc = 4, kExpandMixTokens = 4;

// The block's phases are chains of round trips (ncu, H200, session 24: 12% occupancy, a warp issues every 7 cycles),
// so each phase keeps more of them in flight: the tile's comb / post go to shared memory first; the expand loads
// kExpandBatch elements' old values before it stores any (through one pointer the compiler cannot hoist a load above
// the previous element's store); the fn chunks after the first are prefetched into L2 a chunk ahead; the dot products
// and warp sums of two tokens run as 8 independent chains (3 rows and the square sum each) instead of one token's
// rows after another. Every value is the same operations in the same order as before: the same bits. H200, session 25
// (docs/PERF.md), D = 5120: 30.8 -> 24.3 µs at 16 tokens, 34.8 -> 29.8 at 64.
constexpr int kExpandBatch = 4;

template <int kFinishHc>
__global__ void __launch_bounds__(kMixThreads) hc_expand_mix_kernel(HcMixKernelParams p) {
  constexpr int kHc = kExpandMixMaxHc, kTok = kExpandMixTokens, kPer = kMixChunk / 32;
  __shared__ float fresh[kTok][kHc][kMixChunk];
  __shared__ float comb_s[kTok][kHc * kHc], post_s[kTok][kHc];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  // (kFinishHc = 4 is launched for hc = 4 only: a constant lets the chunk loop unroll.)
  const int64_t hc = kFinishHc == 4 ? 4 : p.hc, n = hc * p.d, rows = (2 + hc) * hc, col_splits = p.d / kMixChunk;
  const int64_t d0 = static_cast<int64_t>(blockIdx.x) * kMixChunk;
  const int64_t per_block = (p.tokens + gridDim.y - 1) / gridDim.y;
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * per_block;
  const int64_t t1 = min(p.tokens, t0 + per_block);
  const int tiles_tokens = static_cast<int>(t1 - t0);
  // The first fn chunk goes out before anything else: in flight during the expand. The next chunk's lines are
  // prefetched into L2 while a chunk is used (a second register copy of it took the kernel past 128 registers).
  float w[3][kPer];
  load_fn_chunk<3>(p, blockIdx.x, rows, w, warp, lane);
  const auto prefetch_chunk = [&](int64_t split) {
    for (int line = threadIdx.x; line < rows * (kMixChunk / 32); line += blockDim.x) {
      const float* a = p.fn + (line / (kMixChunk / 32)) * n + split * kMixChunk + (line % (kMixChunk / 32)) * 32;
      asm volatile("prefetch.global.L2 [%0];" ::"l"(a));
    }
  };
  if (hc > 1) prefetch_chunk(col_splits + blockIdx.x);
  for (int i = threadIdx.x; i < tiles_tokens * kHc * kHc; i += blockDim.x) {
    const int tl = i / (kHc * kHc), e = i % (kHc * kHc);
    if (e < hc * hc) comb_s[tl][e] = p.expand_comb[(t0 + tl) * hc * hc + e];
    if (e < hc) post_s[tl][e] = p.expand_post[(t0 + tl) * hc + e];
  }
  __syncthreads();
  const int total = tiles_tokens * kMixChunk;
  for (int base = threadIdx.x; base < total; base += kExpandBatch * blockDim.x) {
    float old[kExpandBatch][kHc], y[kExpandBatch];
#pragma unroll
    for (int b = 0; b < kExpandBatch; ++b) {
      const int idx = base + b * blockDim.x;
      if (idx >= total) break;
      const int64_t t = t0 + idx / kMixChunk, i = idx % kMixChunk;
      const float* x = p.expand_streams + t * n + d0 + i;
      y[b] = p.expand_x[t * p.d + d0 + i];
#pragma unroll
      for (int j = 0; j < kHc; ++j) old[b][j] = j < hc ? x[j * p.d] : 0.0f;
    }
#pragma unroll
    for (int b = 0; b < kExpandBatch; ++b) {
      const int idx = base + b * blockDim.x;
      if (idx >= total) break;
      const int tl = idx / kMixChunk, i = idx % kMixChunk;
      float* x = p.expand_streams + (t0 + tl) * n + d0 + i;
#pragma unroll
      for (int k = 0; k < kHc; ++k) {
        if (k >= hc) break;
        const float v = expand_value(comb_s[tl], hc, old[b], post_s[tl][k], y[b], k);
        x[k * p.d] = v;
        fresh[tl][k][i] = v;
      }
    }
  }
  __syncthreads();
  // Two tokens a pass: sum 4·token + j is row warp + 8j (j < 3) of that token or (j = 3, the last warp) its Σ f²;
  // lane i < 8 writes sum i (every lane holds every sum after the butterfly). (Four tokens a pass took 190 registers,
  // one block an SM: 160 blocks at 64 tokens would take two waves.)
  constexpr int kPass = 2, kSums = 4 * kPass;
  static_assert(kTok % kPass == 0 && kSums <= 32, "whole passes; a lane per sum");
  const int held_j = lane & 3;
  const int64_t held_row = held_j < 3 ? warp + held_j * kMixWarps : rows;
  const bool held_ok = lane < kSums && (held_j < 3 ? held_row < rows : warp == kMixWarps - 1);
#pragma unroll
  for (int k = 0; k < kHc; ++k) {
    if (k >= hc) break;
    if (k > 0) load_fn_chunk<3>(p, k * col_splits + blockIdx.x, rows, w, warp, lane);
    if (k + 2 <= hc - 1) prefetch_chunk((k + 2) * col_splits + blockIdx.x);
    const int64_t split = k * col_splits + blockIdx.x;
#pragma unroll
    for (int tp = 0; tp < kTok; tp += kPass) {
      if (tp >= tiles_tokens) break;
      float v[kSums];
#pragma unroll
      for (int q = 0; q < kPass; ++q) {
        const int tl = tp + q;
        float acc[3] = {0.0f, 0.0f, 0.0f}, ss = 0.0f;
        if (tl < tiles_tokens) {
#pragma unroll
          for (int e = 0; e < kPer; ++e) {
            const float f = fresh[tl][k][lane + 32 * e];
#pragma unroll
            for (int j = 0; j < 3; ++j) acc[j] = fmaf(w[j][e], f, acc[j]);
            ss = fmaf(f, f, ss);
          }
        }
#pragma unroll
        for (int j = 0; j < 3; ++j) v[4 * q + j] = acc[j];
        v[4 * q + 3] = ss;
      }
      // warp_sum of each, side by side (its operands and order: the same bits).
#pragma unroll
      for (int o = 16; o > 0; o >>= 1)
#pragma unroll
        for (int i = 0; i < kSums; ++i) v[i] += __shfl_xor_sync(0xffffffffu, v[i], o);
      float sum = v[0];
#pragma unroll
      for (int i = 1; i < kSums; ++i) sum = lane == i ? v[i] : sum;
      const int tl = tp + (lane >> 2);
      if (held_ok && tl < tiles_tokens) p.partial[(split * p.tokens + t0 + tl) * (rows + 1) + held_row] = sum;
    }
  }
  finish_if_last<kFinishHc>(p, p.arrivals + blockIdx.y, gridDim.x, t0, t1, warp, lane, &fresh[0][0][0],
                            kTok * kHc * kMixChunk);
}

// hc_expand_mix with the work of a column block spread over its hc splits: block (c, k, tile) writes the partials
// of split k·D/512 + c only (one fn chunk, 40 blocks for V4.1's hc = 4, D = 5120 at batch 1 where
// hc_expand_mix_kernel's 10 blocks each walked 4 chunks one after another: 16.9 µs a call, ncu). Every block of
// column c computes the expanded values of all hc streams (hc_expand_kernel's arithmetic) into shared memory, and
// the streams are updated in place by the last of the hc blocks of the column to have read the old values (a
// per-(tile, column) arrival counter), so no block reads a value another one already overwrote. The partials and
// the finish are hc_expand_mix_kernel's (same chunks, values and order: the same bits). Counters: the tile's at
// arrivals[tile], the columns' at arrivals[tiles + tile·D/512 + c] (tiles·(1 + D/512) <= kHcMixArrivalSlots).
template <int kFinishHc>
__global__ void __launch_bounds__(kMixThreads) hc_expand_mix_split_kernel(HcMixKernelParams p) {
  __shared__ float fresh[kExpandMixTokens][kExpandMixMaxHc][kMixChunk];
  __shared__ bool writer;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t hc = p.hc, n = hc * p.d, rows = (2 + hc) * hc, col_splits = p.d / kMixChunk;
  const int64_t d0 = static_cast<int64_t>(blockIdx.x) * kMixChunk, k = blockIdx.y;
  const int64_t per_block = (p.tokens + gridDim.z - 1) / gridDim.z;
  const int64_t t0 = static_cast<int64_t>(blockIdx.z) * per_block;
  const int64_t t1 = min(p.tokens, t0 + per_block);
  const int64_t split = k * col_splits + blockIdx.x;
  constexpr int kPer = kMixChunk / 32;
  float w[3][kPer];
  load_fn_chunk<3>(p, split, rows, w, warp, lane);  // first: in flight during the expand
  // The expand in one round of loads (hc_expand_mix_kernel's form, 2 elements a thread: a batch 1 block's 512; 4
  // spilled at the 128 registers): the tile's comb / post go to shared memory while each thread's first elements' old
  // values load, then one barrier. (One element at a time, with comb and post read at their use, was two or three round
  // trips one after another at batch 1.)
  __shared__ float comb_s[kExpandMixTokens][kExpandMixMaxHc * kExpandMixMaxHc],
      post_s[kExpandMixTokens][kExpandMixMaxHc];
  constexpr int kSplitBatch = 2;
  const int64_t total = (t1 - t0) * kMixChunk;
  float old[kSplitBatch][kExpandMixMaxHc], y[kSplitBatch];
  const auto load_batch = [&](int64_t base) {
#pragma unroll
    for (int b = 0; b < kSplitBatch; ++b) {
      const int64_t idx = base + b * blockDim.x;
      if (idx >= total) break;
      const int64_t t = t0 + idx / kMixChunk, i = idx % kMixChunk;
      const float* x = p.expand_streams + t * n + d0 + i;
      y[b] = p.expand_x[t * p.d + d0 + i];
#pragma unroll
      for (int j = 0; j < kExpandMixMaxHc; ++j) old[b][j] = j < hc ? x[j * p.d] : 0.0f;
    }
  };
  load_batch(threadIdx.x);
  for (int64_t e = threadIdx.x; e < (t1 - t0) * kExpandMixMaxHc * kExpandMixMaxHc; e += blockDim.x) {
    const int64_t tl = e / (kExpandMixMaxHc * kExpandMixMaxHc), j = e % (kExpandMixMaxHc * kExpandMixMaxHc);
    if (j < hc * hc) comb_s[tl][j] = p.expand_comb[(t0 + tl) * hc * hc + j];
    if (j < hc) post_s[tl][j] = p.expand_post[(t0 + tl) * hc + j];
  }
  __syncthreads();
  for (int64_t base = threadIdx.x; base < total; base += kSplitBatch * blockDim.x) {
    if (base != threadIdx.x) load_batch(base);
#pragma unroll
    for (int b = 0; b < kSplitBatch; ++b) {
      const int64_t idx = base + b * blockDim.x;
      if (idx >= total) break;
      const int64_t tl = idx / kMixChunk, i = idx % kMixChunk;
#pragma unroll
      for (int kk = 0; kk < kExpandMixMaxHc; ++kk) {
        if (kk >= hc) break;
        fresh[tl][kk][i] = expand_value(comb_s[tl], hc, old[b], post_s[tl][kk], y[b], kk);
      }
    }
  }
  __threadfence();
  __syncthreads();  // every old value this block needs is read
  if (threadIdx.x == 0) {
    unsigned* column = p.arrivals + gridDim.z + blockIdx.z * gridDim.x + blockIdx.x;
    writer = atomicAdd(column, 1u) == gridDim.y - 1;
    if (writer) atomicExch(column, 0u);
  }
  __syncthreads();
  if (writer) {
    for (int64_t idx = threadIdx.x; idx < (t1 - t0) * hc * kMixChunk; idx += blockDim.x) {
      const int64_t tl = idx / (hc * kMixChunk), kk = (idx / kMixChunk) % hc, i = idx % kMixChunk;
      p.expand_streams[(t0 + tl) * n + kk * p.d + d0 + i] = fresh[tl][kk][i];
    }
  }
  for (int64_t t = t0; t < t1; ++t) {
    float f[kPer];
#pragma unroll
    for (int e = 0; e < kPer; ++e) f[e] = fresh[t - t0][k][lane + 32 * e];
    write_partials<3>(w, f, p.partial + (split * p.tokens + t) * (rows + 1), rows, warp, lane);
  }
  finish_if_last<kFinishHc>(p, p.arrivals + blockIdx.z, gridDim.x * gridDim.y, t0, t1, warp, lane, &fresh[0][0][0],
                            kExpandMixTokens * kExpandMixMaxHc * kMixChunk);
}

// The staged partial kernel over about one wave: as many token ranges per split as fit on the device at once
// (rounded down: a second partial wave of long blocks would cost more than a few idle block slots).
constexpr int kStageRowsWide = 6;  // 24 rows over 4 warps: a site at hc <= 4

template <int kStageRows, bool kTokenWarps, int kTokPer>
void launch_mix_staged(const HcMixKernelParams& p, cudaStream_t stream) {
  const auto kernel = hc_mix_partial_staged_kernel<kStageRows, kTokenWarps, kTokPer>;
  DI_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kStageSmemBytes)));
  int dev = 0, sms = 0, per_sm = 0;
  DI_CUDA_CHECK(cudaGetDevice(&dev));
  DI_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  DI_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kStageThreads, kStageSmemBytes));
  const int64_t resident = static_cast<int64_t>(std::max(per_sm, 1)) * sms;
  const int64_t ranges =
      std::clamp<int64_t>(resident / p.splits, 1, std::max<int64_t>(1, ceil_div(p.tokens, kStageTokens)));
  const dim3 grid(static_cast<unsigned>(p.splits), static_cast<unsigned>(ranges));
  kernel<<<grid, kStageThreads, kStageSmemBytes, stream>>>(p);
}

}  // namespace

int hc_mix_splits(int64_t hc, int64_t d) { return static_cast<int>(ceil_div(hc * d, kMixChunk)); }

void run_hc_mix(const HcMixKernelParams& p, cudaStream_t stream) {
  DI_CHECK(p.hc >= 1 && p.hc <= kMaxHc) << "hc_mix: hc = " << p.hc << " (the CUDA kernel supports 1.." << kMaxHc << ")";
  DI_CHECK_INTERNAL(p.partial && p.splits == hc_mix_splits(p.hc, p.d)) << "hc_mix: partial buffer / splits";
  if (p.tokens == 0) return;
  const int64_t per_block = p.tokens >= kMixLongTokens ? kMixTokensPerBlockLong : kMixTokensPerBlock;
  const dim3 grid(static_cast<unsigned>(p.splits), static_cast<unsigned>(ceil_div(p.tokens, per_block)));
  const int64_t rows = p.head ? p.hc : (2 + p.hc) * p.hc;
  constexpr int kWide = (kMaxMixRows + kMixWarps - 1) / kMixWarps;
  // Decode-sized calls only: a long prefill's finish is better spread over its own grid than run by one block per tile.
  if (p.arrivals && p.tokens <= static_cast<int64_t>(kHcMixArrivalSlots) * kMixTokensPerBlock) {
    if (rows <= 3 * kMixWarps && p.hc == 4)
      hc_mix_partial_kernel<3, 4><<<grid, kMixThreads, 0, stream>>>(p);
    else if (rows <= 3 * kMixWarps)
      hc_mix_partial_kernel<3, 0><<<grid, kMixThreads, 0, stream>>>(p);
    else
      hc_mix_partial_kernel<kWide, 0><<<grid, kMixThreads, 0, stream>>>(p);
    DI_CUDA_CHECK_LAUNCH();
    return;
  }
  // The staged kernel, two tokens a warp at once (H200, 8192 tokens: hc_mix 3.12x, hc_head 4.12x the unstaged
  // kernel's time, the same bits); the unstaged kernel for the shapes it does not take.
  if (rows <= kStageWarps * kStageRowsWide && (p.hc * p.d) % 4 == 0 &&
      reinterpret_cast<uintptr_t>(p.streams) % 16 == 0) {
    if (rows <= kStageWarps)
      launch_mix_staged<kStageWarps, true, 2>(p, stream);  // the head at hc <= 4: a warp per token
    else
      launch_mix_staged<kStageRowsWide, false, 2>(p, stream);
  } else if (rows <= 3 * kMixWarps) {
    hc_mix_partial_kernel<3, -1><<<grid, kMixThreads, 0, stream>>>(p);
  } else {
    hc_mix_partial_kernel<kWide, -1><<<grid, kMixThreads, 0, stream>>>(p);
  }
  DI_CUDA_CHECK_LAUNCH();
  const unsigned blocks = static_cast<unsigned>(ceil_div(p.tokens, 4));
  if (p.hc == 4)  // V4 / V4.1
    hc_mix_finish_kernel<4><<<blocks, 128, 0, stream>>>(p);
  else
    hc_mix_finish_kernel<0><<<blocks, 128, 0, stream>>>(p);
  DI_CUDA_CHECK_LAUNCH();
}

void run_hc_expand_mix(const HcMixKernelParams& p, cudaStream_t stream) {
  DI_CHECK_INTERNAL(!p.head && p.expand_streams == p.streams && p.expand_x && p.expand_post && p.expand_comb)
      << "hc_expand_mix: expand fields";
  const int64_t tiles = ceil_div(p.tokens, kExpandMixTokens);
  if (p.arrivals && p.hc <= kExpandMixMaxHc && p.d % kMixChunk == 0 && tiles <= kHcMixArrivalSlots) {
    DI_CHECK_INTERNAL(p.partial && p.splits == hc_mix_splits(p.hc, p.d)) << "hc_expand_mix: partial buffer / splits";
    if (p.tokens == 0) return;
    const int64_t col_splits = p.d / kMixChunk;
    // The split kernel for one token tile only (up to 4 tokens): with the inputs in L2 (a CUDA graph of 20 calls on the
    // H200) it was even at batch 1 (14.04 against 14.12 µs) and 2% slower at 16 (31.9 against 31.4 µs); what it
    // shortens is the fn stream of a block (4 chunks one after another before), which the ncu profile's flushed L2
    // (16.9 µs a call at batch 1) and a real decode step, where fn comes from HBM, pay and the warm bench does not.
    if (tiles == 1 && 1 + col_splits <= kHcMixArrivalSlots) {
      const dim3 grid(static_cast<unsigned>(col_splits), static_cast<unsigned>(p.hc), static_cast<unsigned>(tiles));
      if (p.hc == 4)
        hc_expand_mix_split_kernel<4><<<grid, kMixThreads, 0, stream>>>(p);
      else
        hc_expand_mix_split_kernel<0><<<grid, kMixThreads, 0, stream>>>(p);
      DI_CUDA_CHECK_LAUNCH();
      return;
    }
    const dim3 grid(static_cast<unsigned>(col_splits), static_cast<unsigned>(tiles));
    if (p.hc == 4)
      hc_expand_mix_kernel<4><<<grid, kMixThreads, 0, stream>>>(p);
    else
      hc_expand_mix_kernel<0><<<grid, kMixThreads, 0, stream>>>(p);
    DI_CUDA_CHECK_LAUNCH();
    return;
  }
  HcExpandKernelParams e;
  e.streams = p.expand_streams;
  e.x = p.expand_x;
  e.post = p.expand_post;
  e.comb = p.expand_comb;
  e.tokens = p.tokens;
  e.hc = p.hc;
  e.d = p.d;
  run_hc_expand(e, stream);
  run_hc_mix(p, stream);
}

}  // namespace deepinfer::cuda
