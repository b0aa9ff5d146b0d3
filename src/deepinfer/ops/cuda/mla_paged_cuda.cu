// Paged MLA decode (PagedMlaAttentionParams): the absorbed form for every sequence of a step in one set of
// launches, cache rows read in place from the paged pool through the block tables. Three kernels:
//   1. absorb: q̃[t, h] = [W_UK,hᵀ·q_nope | q_pe]; a block per (head, 128 latent channels) walks all the tokens
//      (32 at a time), so each head's W_UK is read once per 32 tokens rather than once per token;
//   2. attend (flash-decoding, the structure FlashMLA's decode uses: split-K over the keys, partials merged by
//      their log-sum-exp): a block per (32-head group, query token, key split) stages 32-key tiles of 576-value
//      rows in shared memory (cp.async, double-buffered) and uses each tile for all 32 heads — the cache is read
//      once per head group, not once per head. Scores are a [32 heads × 32 keys] register-tiled product, the online
//      softmax runs per head, and the tile's latents (the first r values of each row) are the values:
//      ō += P·ĉ with the [32 heads × r] accumulator spread over the block's registers. Writes the unnormalised
//      partial (ō, running max, running sum) of its split.
//   3. combine + project: a block per (head, 32 tokens) merges the splits in split order (deterministic) and
//      applies W_UV,h, read once per 32 tokens.
// fp32 CUDA cores throughout (fp32 like every other CUDA op of the V3 path: golden tolerance 1e-4 of the largest
// logit). MLA decode at 128 heads does ~120 FLOP per cache byte, above the fp32 ridge: by default (KernelChoices::
// paged_mla_mma) step 2 runs on the tensor cores instead (mla_paged_mma_cuda.cu, bf16x3: 5.3x on the H200, ~4e-6
// from the CPU op); this attend kernel stays for the shapes it lacks and for paged_mla_mma=never.
#include <algorithm>

#include "deepinfer/ops/cuda/cuda_runtime.h"
#include "deepinfer/ops/cuda/device_math.cuh"
#include "deepinfer/ops/cuda/kernels.h"
#include "deepinfer/ops/cuda/mla_paged_keys.cuh"
#include "deepinfer/ops/cuda/mla_paged_mma.h"

namespace deepinfer::cuda {
namespace {

constexpr int kHeads = 32;        // heads per attend block
constexpr int kKeys = 32;         // keys per tile
constexpr int kThreads = 256;     // attend block
constexpr int kMaxR = 512;        // latent channels an attend thread group covers (16 threads × 4 × 8)
constexpr int kTokGroup = 32;     // tokens per absorb / project block
constexpr int kWChunk = 32;       // absorb: weight loads in flight per thread
constexpr int kProjectParts = 8;  // project: blocks per (head, token group) for a few tokens, each a slice of dv

// Shared-memory row stride of a 576-value row: a multiple of 4 (16-byte cp.async) plus 4, so rows start 4 banks
// apart and a quarter-warp's 16-byte loads of 8 consecutive rows hit distinct banks.
__host__ __device__ inline int64_t smem_stride(int64_t row) { return (row + 3) / 4 * 4 + 4; }

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ float dot4(const float4 a, const float4 b, float acc) {
  acc = fmaf(a.x, b.x, acc);
  acc = fmaf(a.y, b.y, acc);
  acc = fmaf(a.z, b.z, acc);
  return fmaf(a.w, b.w, acc);
}

// ---- 1. absorb: block (head, 128-channel chunk), threads over the chunk's channels; tokens 32 at a time.
__global__ void __launch_bounds__(128) paged_mla_absorb_kernel(PagedMlaKernelParams p) {
  extern __shared__ float qs[];  // [kTokGroup, dn]
  const int64_t h = blockIdx.x, c = static_cast<int64_t>(blockIdx.y) * 128 + threadIdx.x;
  const int64_t qk = p.dn + p.dr, row = p.r + p.dr;
  const float* w_uk = p.kv_b + h * (p.dn + p.dv) * p.r;  // [dn, r]
  for (int64_t t0 = 0; t0 < p.tokens; t0 += kTokGroup) {
    const int nt = static_cast<int>(min(int64_t{kTokGroup}, p.tokens - t0));
    __syncthreads();  // the previous group's reads of qs
    for (int64_t i = threadIdx.x; i < kTokGroup * p.dn; i += blockDim.x) {
      const int64_t tt = i / p.dn;
      qs[i] = tt < nt ? p.q[((t0 + tt) * p.heads + h) * qk + i % p.dn] : 0.0f;
    }
    __syncthreads();
    if (c < p.r) {
      float acc[kTokGroup];
#pragma unroll
      for (int tt = 0; tt < kTokGroup; ++tt) acc[tt] = 0.0f;
      // kWChunk weight loads issued before their FMAs: one load in flight per thread made this kernel a chain of
      // dn DRAM latencies (69 us per layer at decode on the H200). Same summation order as one at a time.
      for (int64_t i0 = 0; i0 < p.dn; i0 += kWChunk) {
        float w[kWChunk];
#pragma unroll
        for (int e = 0; e < kWChunk; ++e) w[e] = i0 + e < p.dn ? __ldg(w_uk + (i0 + e) * p.r + c) : 0.0f;
#pragma unroll
        for (int e = 0; e < kWChunk; ++e) {
          if (i0 + e >= p.dn) break;
#pragma unroll
          for (int tt = 0; tt < kTokGroup; ++tt) acc[tt] = fmaf(qs[tt * p.dn + i0 + e], w[e], acc[tt]);
        }
      }
#pragma unroll
      for (int tt = 0; tt < kTokGroup; ++tt)
        if (tt < nt) p.q_full[((t0 + tt) * p.heads + h) * row + c] = acc[tt];
    }
    if (blockIdx.y == 0)
      for (int64_t i = threadIdx.x; i < nt * p.dr; i += blockDim.x) {
        const int64_t t = t0 + i / p.dr;
        p.q_full[(t * p.heads + h) * row + p.r + i % p.dr] = p.q[(t * p.heads + h) * qk + p.dn + i % p.dr];
      }
  }
}

// ---- 2. attend.
struct AttendSmem {
  float* q;     // [kHeads, stride]
  float* kv;    // [2][kKeys, stride]
  float* ss;    // [kHeads, kKeys + 1]: scores, then probabilities
  float* corr;  // [kHeads]
};

__device__ __forceinline__ AttendSmem attend_smem(float* base, int64_t stride) {
  AttendSmem s;
  s.q = base;
  s.kv = s.q + kHeads * stride;
  s.ss = s.kv + 2 * kKeys * stride;
  s.corr = s.ss + kHeads * (kKeys + 1);
  return s;
}

// Stages keys [k0, k0 + n) of the query's sequence (positions) into a tile; rows past n are zeros (their
// probability is 0, and 0·0 keeps the accumulators finite), a bad page is NaN (and raises the status word). An f32
// pool's rows go by cp.async in 16-byte chunks, a bf16 pool's are loaded 8 values at a time and widened (exact).
__device__ __forceinline__ void load_tile(const PagedMlaKernelParams& p, const int32_t* table, int64_t k0, int n,
                                          float* tile, int64_t stride) {
  const int64_t row = p.r + p.dr, vals = p.kv_bf16 ? 8 : 4, chunks = row / vals;
  int64_t last_j = -1, at = 0;
  bool zero = true, bad = false;
  for (int64_t i = threadIdx.x; i < kKeys * chunks; i += kThreads) {
    const int64_t j = i / chunks, c = i % chunks;
    if (j != last_j) {
      last_j = j;
      zero = j >= n;
      bad = false;
      if (!zero) {
        const int64_t pos = k0 + j, blk = pos / p.block_size;
        const int64_t id = blk < p.max_blocks ? table[blk] : -1;
        at = id * p.block_size + pos % p.block_size;
        bad = id < 0 || at >= p.pool_rows;
        if (bad) atomicOr(p.status, kStatusPagedAttentionRange);
      }
    }
    float* dst = tile + j * stride + vals * c;
    const float v = bad ? __int_as_float(0x7fc00000) : 0.0f;
    if (p.kv_bf16) {
      float4 lo = make_float4(v, v, v, v), hi = lo;
      if (!zero && !bad) {
        const uint4 w = __ldg(reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(p.kv_pool) + at * row) + c);
        const uint16_t* h = reinterpret_cast<const uint16_t*>(&w);
        lo =
            make_float4(bf16_bits_to_f32(h[0]), bf16_bits_to_f32(h[1]), bf16_bits_to_f32(h[2]), bf16_bits_to_f32(h[3]));
        hi =
            make_float4(bf16_bits_to_f32(h[4]), bf16_bits_to_f32(h[5]), bf16_bits_to_f32(h[6]), bf16_bits_to_f32(h[7]));
      }
      reinterpret_cast<float4*>(dst)[0] = lo;
      reinterpret_cast<float4*>(dst)[1] = hi;
    } else if (zero || bad) {
      *reinterpret_cast<float4*>(dst) = make_float4(v, v, v, v);
    } else {
      cp_async16(dst, static_cast<const float*>(p.kv_pool) + at * row + 4 * c);
    }
  }
}

__global__ void __launch_bounds__(kThreads, 1) paged_mla_attend_kernel(PagedMlaKernelParams p) {
  extern __shared__ __align__(16) float smem[];
  const int64_t row = p.r + p.dr, stride = smem_stride(row);
  const AttendSmem sm = attend_smem(smem, stride);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t h_base = static_cast<int64_t>(blockIdx.x) * kHeads, t = blockIdx.y;
  const int split = blockIdx.z;

  // This split's keys: positions [k_begin, k_end) of the query's sequence, in whole tiles.
  static_assert(kKeys == kPagedMlaSplitKeys, "split boundaries at whole tiles");
  const PagedMlaSplitKeys keys = paged_mla_split_keys(p, t, split, split == 0 && tid == 0);
  const int32_t* table = keys.table;
  const int64_t k_begin = keys.begin, k_end = keys.end;
  const int64_t n_tiles = (k_end - k_begin + kKeys - 1) / kKeys;
  const bool bad_query = table == nullptr;

  if (n_tiles > 0) load_tile(p, table, k_begin, static_cast<int>(min(int64_t{kKeys}, k_end - k_begin)), sm.kv, stride);
  cp_async_commit();
  // The group's absorbed queries (heads past H are zeros).
  for (int64_t i = tid; i < kHeads * (row / 4); i += kThreads) {
    const int64_t hh = i / (row / 4), c4 = i % (row / 4), h = h_base + hh;
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (h < p.heads) v = *reinterpret_cast<const float4*>(p.q_full + (t * p.heads + h) * row + 4 * c4);
    *reinterpret_cast<float4*>(sm.q + hh * stride + 4 * c4) = v;
  }

  // Thread roles. Scores: heads (hp, hp + 16) × keys (kq, kq + 16). Values: the same two heads × channels
  // 4·cl + 64·j (j < 8). Softmax: warp w owns heads 4w .. 4w + 3 (m, l uniform over its lanes).
  const int hp = tid >> 4, kq = tid & 15, cl = tid & 15;
  float4 acc[2][kMaxR / 64];
#pragma unroll
  for (int a = 0; a < 2; ++a)
#pragma unroll
    for (int j = 0; j < kMaxR / 64; ++j) acc[a][j] = make_float4(0.f, 0.f, 0.f, 0.f);
  float m[4], l[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.0f;
  }

  for (int64_t it = 0; it < n_tiles; ++it) {
    const int64_t k0 = k_begin + it * kKeys;
    const int n_valid = static_cast<int>(min(int64_t{kKeys}, k_end - k0));
    if (it + 1 < n_tiles) {
      const int64_t k1 = k0 + kKeys;
      load_tile(p, table, k1, static_cast<int>(min(int64_t{kKeys}, k_end - k1)),
                sm.kv + ((it + 1) & 1) * kKeys * stride, stride);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const float* tile = sm.kv + (it & 1) * kKeys * stride;

    // Scores [32 heads × 32 keys]: 2 × 2 per thread over the whole row (latent + rope).
    {
      const float* q0 = sm.q + hp * stride;
      const float* q1 = sm.q + (hp + 16) * stride;
      const float* k0r = tile + kq * stride;
      const float* k1r = tile + (kq + 16) * stride;
      float s00 = 0.f, s01 = 0.f, s10 = 0.f, s11 = 0.f;
      for (int64_t c = 0; c < row; c += 4) {
        const float4 a0 = *reinterpret_cast<const float4*>(q0 + c), a1 = *reinterpret_cast<const float4*>(q1 + c);
        const float4 x0 = *reinterpret_cast<const float4*>(k0r + c), x1 = *reinterpret_cast<const float4*>(k1r + c);
        s00 = dot4(a0, x0, s00);
        s01 = dot4(a0, x1, s01);
        s10 = dot4(a1, x0, s10);
        s11 = dot4(a1, x1, s11);
      }
      sm.ss[hp * (kKeys + 1) + kq] = s00;
      sm.ss[hp * (kKeys + 1) + kq + 16] = s01;
      sm.ss[(hp + 16) * (kKeys + 1) + kq] = s10;
      sm.ss[(hp + 16) * (kKeys + 1) + kq + 16] = s11;
    }
    __syncthreads();

    // Online softmax per head: lane = key of the tile.
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int hh = warp * 4 + i;
      const float x = lane < n_valid ? sm.ss[hh * (kKeys + 1) + lane] * p.scale : -INFINITY;
      const float m_new = fmaxf(m[i], warp_max(x));  // finite: every tile has a valid key
      const float corr = expf(m[i] - m_new);         // 0 on the first tile (m = −inf)
      const float e = lane < n_valid ? expf(x - m_new) : 0.0f;
      l[i] = l[i] * corr + warp_sum(e);
      m[i] = m_new;
      sm.ss[hh * (kKeys + 1) + lane] = e;
      if (lane == 0) sm.corr[hh] = corr;
    }
    __syncthreads();

    // ō = ō·corr + P·ĉ over the tile's latents.
    {
      const float c0 = sm.corr[hp], c1 = sm.corr[hp + 16];
#pragma unroll
      for (int j = 0; j < kMaxR / 64; ++j) {
        acc[0][j].x *= c0, acc[0][j].y *= c0, acc[0][j].z *= c0, acc[0][j].w *= c0;
        acc[1][j].x *= c1, acc[1][j].y *= c1, acc[1][j].z *= c1, acc[1][j].w *= c1;
      }
      const float* p0 = sm.ss + hp * (kKeys + 1);
      const float* p1 = sm.ss + (hp + 16) * (kKeys + 1);
      for (int k = 0; k < n_valid; ++k) {
        const float w0 = p0[k], w1 = p1[k];
        const float* v = tile + k * stride + 4 * cl;
#pragma unroll
        for (int j = 0; j < kMaxR / 64; ++j) {
          if (4 * cl + 64 * j < p.r) {
            const float4 x = *reinterpret_cast<const float4*>(v + 64 * j);
            acc[0][j].x = fmaf(w0, x.x, acc[0][j].x);
            acc[0][j].y = fmaf(w0, x.y, acc[0][j].y);
            acc[0][j].z = fmaf(w0, x.z, acc[0][j].z);
            acc[0][j].w = fmaf(w0, x.w, acc[0][j].w);
            acc[1][j].x = fmaf(w1, x.x, acc[1][j].x);
            acc[1][j].y = fmaf(w1, x.y, acc[1][j].y);
            acc[1][j].z = fmaf(w1, x.z, acc[1][j].z);
            acc[1][j].w = fmaf(w1, x.w, acc[1][j].w);
          }
        }
      }
    }
    __syncthreads();  // the tile buffer and ss are rewritten next
  }

  // Partials of this split: ō (unnormalised), m, l. A query with a bad sequence or position gets NaN.
  const float poison = bad_query ? __int_as_float(0x7fc00000) : 0.0f;
#pragma unroll
  for (int a = 0; a < 2; ++a) {
    const int64_t h = h_base + hp + 16 * a;
    if (h >= p.heads) continue;
    float* po = p.part_o + ((t * p.heads + h) * p.splits + split) * p.r;
#pragma unroll
    for (int j = 0; j < kMaxR / 64; ++j) {
      const int64_t c = 4 * cl + 64 * j;
      if (c < p.r) {
        float4 v = acc[a][j];
        if (bad_query) v = make_float4(poison, poison, poison, poison);
        *reinterpret_cast<float4*>(po + c) = v;
      }
    }
  }
  if (lane == 0) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t h = h_base + warp * 4 + i;
      if (h >= p.heads) continue;
      const int64_t at = (t * p.heads + h) * p.splits + split;
      p.part_m[at] = m[i];
      p.part_l[at] = bad_query ? poison : l[i];
    }
  }
}

// ---- 3. combine the splits, then o = W_UV,h·ō: block (head, 32 tokens, slice z of the dv outputs), 8 warps.
// Decode has one token group, so slicing dv over gridDim.z blocks is what spreads the weight reads over the
// SMs (16 blocks for 16 heads otherwise); each slice recombines the token's splits (a few KiB).
__global__ void __launch_bounds__(256) paged_mla_project_kernel(PagedMlaKernelParams p) {
  extern __shared__ float ol[];                         // [kTokGroup, r]
  __shared__ float wts[kTokGroup][kPagedMlaMaxSplits];  // per token and split: exp(m_s − M) / Σ l·exp(m − M)
  const int64_t h = blockIdx.x, t0 = static_cast<int64_t>(blockIdx.y) * kTokGroup;
  const int nt = static_cast<int>(min(int64_t{kTokGroup}, p.tokens - t0));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int tt = warp; tt < nt; tt += 8) {
    const int64_t th = (t0 + tt) * p.heads + h;
    const float* pm = p.part_m + th * p.splits;
    const float* pl = p.part_l + th * p.splits;
    float mx = -INFINITY;
    for (int s = lane; s < p.splits; s += 32) mx = fmaxf(mx, pm[s]);
    mx = warp_max(mx);
    // In split order on one lane: deterministic.
    if (lane == 0) {
      float denom = 0.0f;
      if (mx > -INFINITY)
        for (int s = 0; s < p.splits; ++s) denom += pl[s] * expf(pm[s] - mx);
      // Nothing visible: zeros (as the CPU op). A bad query's NaN partials stay NaN (NaN·0).
      const float inv = denom > 0.0f ? 1.0f / denom : 0.0f;
      for (int s = 0; s < p.splits; ++s) wts[tt][s] = mx > -INFINITY ? expf(pm[s] - mx) * inv : 0.0f;
    }
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < nt * p.r; i += blockDim.x) {
    const int tt = static_cast<int>(i / p.r);
    const int64_t c = i % p.r, th = (t0 + tt) * p.heads + h;
    const float* po = p.part_o + th * p.splits * p.r + c;
    float acc = 0.0f;
    for (int s = 0; s < p.splits; ++s) acc = fmaf(po[s * p.r], wts[tt][s], acc);
    ol[tt * p.r + c] = acc;
  }
  __syncthreads();
  const float* w_uv = p.kv_b + (h * (p.dn + p.dv) + p.dn) * p.r;  // [dv, r]
  constexpr int kPer = kMaxR / 32;
  const int64_t part = blockIdx.z, per_part = (p.dv + gridDim.z - 1) / gridDim.z;
  const int64_t j_end = min(p.dv, (part + 1) * per_part);
  for (int64_t j = part * per_part + warp; j < j_end; j += 8) {
    float w[kPer];
#pragma unroll
    for (int e = 0; e < kPer; ++e) {
      const int64_t c = lane + 32 * e;
      w[e] = c < p.r ? __ldg(w_uv + j * p.r + c) : 0.0f;
    }
    for (int tt = 0; tt < nt; ++tt) {
      float acc = 0.0f;
#pragma unroll
      for (int e = 0; e < kPer; ++e) {
        const int64_t c = lane + 32 * e;
        if (c < p.r) acc = fmaf(w[e], ol[tt * p.r + c], acc);
      }
      acc = warp_sum(acc);
      if (lane == 0) p.out[((t0 + tt) * p.heads + h) * p.dv + j] = acc;
    }
  }
}

int64_t attend_smem_bytes(int64_t row) {
  return static_cast<int64_t>(sizeof(float)) *
         ((kHeads + 2 * kKeys) * smem_stride(row) + kHeads * (kKeys + 1) + kHeads);
}

}  // namespace

int paged_mla_splits(int64_t tokens, int64_t heads, int64_t max_keys, int sm_count) {
  const int64_t blocks = std::max<int64_t>(1, tokens * ceil_div(heads, kHeads));
  const int64_t want = ceil_div(2ll * sm_count, blocks);
  return static_cast<int>(
      std::max<int64_t>(1, std::min<int64_t>({want, ceil_div(max_keys, kKeys), kPagedMlaMaxSplits})));
}

std::pair<int, int64_t> paged_mla_invariant_splits(int64_t max_keys) {
  const int64_t tiles = std::max<int64_t>(1, ceil_div(max_keys, kKeys));
  const int64_t per_split = std::max<int64_t>(8, ceil_div(tiles, kPagedMlaMaxSplits));
  return {static_cast<int>(ceil_div(tiles, per_split)), per_split};
}

void run_paged_mla_attention(const PagedMlaKernelParams& p, cudaStream_t stream) {
  const int64_t row = p.r + p.dr;
  DI_CHECK_CODE(p.r <= kMaxR && row % 4 == 0 && p.dr % 4 == 0, ErrorCode::kUnsupported)
      << "paged_mla_attention: latent " << p.r << " + rope " << p.dr << " (CUDA: latent <= " << kMaxR
      << ", both multiples of 4)";
  DI_CHECK_CODE(reinterpret_cast<uintptr_t>(p.kv_pool) % 16 == 0 && reinterpret_cast<uintptr_t>(p.q_full) % 16 == 0,
                ErrorCode::kUnsupported)
      << "paged_mla_attention: kv_pool must be 16-byte aligned on CUDA";
  DI_CHECK_CODE(!p.kv_bf16 || row % 8 == 0, ErrorCode::kUnsupported)
      << "paged_mla_attention: a bf16 cache needs rows of a multiple of 8 values on CUDA, got " << row;
  DI_CHECK_CODE(p.splits >= 1 && p.splits <= kPagedMlaMaxSplits, ErrorCode::kInternal) << "paged_mla_attention: splits";
  const bool mma = p.mma == KernelPick::kAlways;
  const int64_t smem = attend_smem_bytes(row);
  DI_CHECK_CODE(mma || smem <= 227 * 1024, ErrorCode::kUnsupported)
      << "paged_mla_attention: cache rows of " << row << " values need " << smem << " B of shared memory";
  if (p.tokens == 0) return;
  const int64_t absorb_smem = kTokGroup * p.dn * static_cast<int64_t>(sizeof(float));
  const int64_t project_smem = kTokGroup * p.r * static_cast<int64_t>(sizeof(float));
  DI_CUDA_CHECK(cudaFuncSetAttribute(paged_mla_absorb_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(absorb_smem)));
  if (!mma)
    DI_CUDA_CHECK(cudaFuncSetAttribute(paged_mla_attend_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(smem)));
  DI_CUDA_CHECK(cudaFuncSetAttribute(paged_mla_project_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(project_smem)));
  paged_mla_absorb_kernel<<<dim3(static_cast<unsigned>(p.heads), static_cast<unsigned>(ceil_div(p.r, 128))), 128,
                            absorb_smem, stream>>>(p);
  DI_CUDA_CHECK_LAUNCH();
  if (mma) {
    launch_paged_mla_attend_mma(p, stream);
  } else {
    const dim3 grid(static_cast<unsigned>(ceil_div(p.heads, kHeads)), static_cast<unsigned>(p.tokens),
                    static_cast<unsigned>(p.splits));
    paged_mla_attend_kernel<<<grid, kThreads, smem, stream>>>(p);
    DI_CUDA_CHECK_LAUNCH();
  }
  const unsigned parts = p.tokens <= kTokGroup ? kProjectParts : 1;
  paged_mla_project_kernel<<<dim3(static_cast<unsigned>(p.heads), static_cast<unsigned>(ceil_div(p.tokens, kTokGroup)),
                                  parts),
                             256, project_smem, stream>>>(p);
  DI_CUDA_CHECK_LAUNCH();
}

}  // namespace deepinfer::cuda
