// mHC on the GPU: site coefficients (norm + small projection + sigmoid gates + Sinkhorn), the V4 head's
// collapse weights, collapse and expand. The coefficients are a GEMV per token, (2+hc)·hc rows of length hc·D
// (1.5 MB of fn for V4-Flash): split over hc·D in 512-element chunks so ~32 blocks stream fn at once (one block
// per token walked it alone: ~0.65 ms a site), then the splits are summed in fixed order and the gates and the
// Sinkhorn iterations run in the CPU op's order. For decode-sized calls (p.arrivals set) the last partial block of a
// token tile to finish runs that step itself, so a site is one launch instead of two (decode is launch-bound); the
// finish is the same code either way, so both forms give the same bits.
#include "deepinfer/ops/cuda/device_math.cuh"
#include "deepinfer/ops/cuda/kernels.h"

namespace deepinfer::cuda {
namespace {

constexpr int kMaxHc = 8;
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
template <int kHc>
__device__ void finish_token(const HcMixKernelParams& p, float* m, float* c, int64_t t, int lane) {
  const int64_t hc = kHc > 0 ? kHc : p.hc, n = hc * p.d, rows = p.head ? hc : (2 + hc) * hc;
  __syncwarp();  // a warp finishing several tokens: lane 0 may still read m / c of the previous one
  for (int64_t r = lane; r <= rows; r += 32) {
    float acc = 0.0f;
    // Unrolled so that several partials are in flight; still summed in split order.
#pragma unroll 8
    for (int s = 0; s < p.splits; ++s) acc += __ldcg(p.partial + (s * p.tokens + t) * (rows + 1) + r);
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

// kMixRowsPerWarp: fn rows a warp keeps in registers (3 covers hc <= 4: 24 rows over 8 warps). kFinishHc >= 0: the
// fused form — the last block of a token tile to write its partials runs finish_token<kFinishHc> for the tile's
// tokens (one warp per token), the arrival counter of the tile counting the splits and left at 0 for the next call.
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
#pragma unroll
  for (int j = 0; j < kMixRowsPerWarp; ++j) {
    const int64_t r = warp + j * kMixWarps;
#pragma unroll
    for (int e = 0; e < kPer; ++e) {
      const int64_t i = c0 + lane + 32 * e;
      w[j][e] = r < rows && i < n ? __ldg(p.fn + r * n + i) : 0.0f;
    }
  }
  for (int64_t t = t0; t < t1; ++t) {
    float f[kPer];
#pragma unroll
    for (int e = 0; e < kPer; ++e) {
      const int64_t i = c0 + lane + 32 * e;
      f[e] = i < n ? __ldg(p.streams + t * n + i) : 0.0f;
    }
    float* out = p.partial + (blockIdx.x * p.tokens + t) * (rows + 1);
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
  if constexpr (kFinishHc >= 0) {
    __shared__ bool last;
    __shared__ float m_all[kMixWarps][kMaxMixRows + 1];
    __shared__ float c_all[kMixWarps][kMaxHc * kMaxHc];
    __threadfence();  // this block's partials reach L2 before its arrival is counted
    __syncthreads();
    if (threadIdx.x == 0) {
      last = atomicAdd(p.arrivals + blockIdx.y, 1u) == gridDim.x - 1;
      if (last) atomicExch(p.arrivals + blockIdx.y, 0u);
    }
    __syncthreads();
    if (!last) return;
    __threadfence();  // every split's partials counted before are read after this point
    for (int64_t t = t0 + warp; t < t1; t += kMixWarps) finish_token<kFinishHc>(p, m_all[warp], c_all[warp], t, lane);
  }
}

__global__ void hc_collapse_kernel(HcCollapseKernelParams p) {
  const int64_t total = p.tokens * p.d;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = idx / p.d, i = idx % p.d;
    const float* x = p.streams + t * p.hc * p.d + i;
    float acc = 0.0f;
    for (int64_t k = 0; k < p.hc; ++k) acc = __fadd_rn(acc, __fmul_rn(p.pre[t * p.hc + k], x[k * p.d]));
    p.out[idx] = acc;
  }
}

// One thread per (token, channel) owns that channel of every stream, so the in-place update needs no sync.
__global__ void hc_expand_kernel(HcExpandKernelParams p) {
  const int64_t total = p.tokens * p.d;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = idx / p.d, i = idx % p.d;
    float* x = p.streams + t * p.hc * p.d + i;
    const float* c = p.comb + t * p.hc * p.hc;
    const float y = p.x[idx];
    float old[kMaxHc];
#pragma unroll
    for (int j = 0; j < kMaxHc; ++j) old[j] = j < p.hc ? x[j * p.d] : 0.0f;
#pragma unroll
    for (int k = 0; k < kMaxHc; ++k) {
      if (k >= p.hc) break;
      float acc = 0.0f;
#pragma unroll
      for (int j = 0; j < kMaxHc; ++j)
        if (j < p.hc) acc = __fadd_rn(acc, __fmul_rn(c[j * p.hc + k], old[j]));
      x[k * p.d] = __fadd_rn(__fmul_rn(p.post[t * p.hc + k], y), acc);
    }
  }
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
  if (rows <= 3 * kMixWarps)
    hc_mix_partial_kernel<3, -1><<<grid, kMixThreads, 0, stream>>>(p);
  else
    hc_mix_partial_kernel<kWide, -1><<<grid, kMixThreads, 0, stream>>>(p);
  DI_CUDA_CHECK_LAUNCH();
  const unsigned blocks = static_cast<unsigned>(ceil_div(p.tokens, 4));
  if (p.hc == 4)  // V4 / V4.1
    hc_mix_finish_kernel<4><<<blocks, 128, 0, stream>>>(p);
  else
    hc_mix_finish_kernel<0><<<blocks, 128, 0, stream>>>(p);
  DI_CUDA_CHECK_LAUNCH();
}

void run_hc_collapse(const HcCollapseKernelParams& p, cudaStream_t stream) {
  if (p.tokens * p.d == 0) return;
  hc_collapse_kernel<<<grid_1d(p.tokens * p.d, 256), 256, 0, stream>>>(p);
  DI_CUDA_CHECK_LAUNCH();
}

void run_hc_expand(const HcExpandKernelParams& p, cudaStream_t stream) {
  DI_CHECK(p.hc >= 1 && p.hc <= kMaxHc) << "hc_expand: hc = " << p.hc << " (the CUDA kernel supports 1.." << kMaxHc
                                        << ")";
  if (p.tokens * p.d == 0) return;
  hc_expand_kernel<<<grid_1d(p.tokens * p.d, 256), 256, 0, stream>>>(p);
  DI_CUDA_CHECK_LAUNCH();
}

}  // namespace deepinfer::cuda
