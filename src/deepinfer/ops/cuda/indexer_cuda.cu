// Indexer family: lightning-indexer scores with causal visibility (over contiguous keys, or paged keys for a
// batch of sequences: one launch for a decode step's rows), V4.1 candidate blocks, and the top-k selection mask
// (block radix select, topk.cuh).
#include <cstdint>

#include "deepinfer/ops/cuda/cuda_runtime.h"
#include "deepinfer/ops/cuda/device_math.cuh"
#include "deepinfer/ops/cuda/indexer_entries.cuh"
#include "deepinfer/ops/cuda/kernels.h"
#include "deepinfer/ops/cuda/topk.cuh"

namespace deepinfer::cuda {
namespace {

// Top-k rows: one block per row. 1024 threads with 16 keys each hold a row of up to 16384 entries (a 64k
// context at ratio 4) in registers; longer rows re-read their scores once per radix pass. That shape is for
// latency (decode: a few rows, each alone on an SM; at 57-64 registers a 1024-thread block fills an SM's register
// file). Prefill has thousands of rows: there the block is the smallest of 256 / 512 / 1024 threads that holds the
// row at 16 keys a thread (V4's 2048 entries and V4.1's 4096: 256 threads, 4 blocks an SM; V4.1's ratio-1 8192:
// 512), so the SM's 32 warps run several rows whose barriers and 256-bin scans interleave instead of one row whose
// 32 warps wait for each other (the bin scan runs on 8 of them). The selection is blockDim-independent (radix
// select, ties by index): the same bytes either way.
constexpr int kTopkThreads = 1024;
constexpr int kTopkItems = 16;
// Fewest rows for the smaller blocks: about 4 waves of 1024-thread blocks (an estimate, not measured).
constexpr int64_t kTopkRowsMinTokens = 512;

// One warp per (token, entry). Entries the query cannot see yet are −inf and never read (their cache slots
// may hold anything).
__global__ void indexer_scores_kernel(IndexerScoresKernelParams p) {
  const int64_t warp_id = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (warp_id >= p.tokens * p.n) return;
  const int64_t t = warp_id / p.n, e = warp_id % p.n;
  const int64_t count = scored_entries(p, t, e == 0 && lane == 0);
  if (e >= count) {
    if (lane == 0) p.out[warp_id] = count < 0 ? NAN : -INFINITY;
    return;
  }
  const void* key = lane == 0 ? entry_key(p, t, e) : nullptr;
  key = reinterpret_cast<const void*>(__shfl_sync(0xffffffffu, reinterpret_cast<unsigned long long>(key), 0));
  if (key == nullptr) {
    if (lane == 0) p.out[warp_id] = NAN;
    return;
  }
  float acc = 0.0f;
  for (int64_t h = 0; h < p.heads; ++h) {
    const float* q = p.q + (t * p.heads + h) * p.dim;
    float dot = 0.0f;
    for (int64_t i = lane; i < p.dim; i += 32) dot = fmaf(q[i], pool_load1(key, i, p.keys_format, p.dim), dot);
    dot = warp_sum(dot);
    const float s = fmaxf(dot, 0.0f) * p.score_scale;
    acc = fmaf(s, p.weights[t * p.heads + h] * p.weight_scale, acc);
  }
  if (lane == 0) p.out[warp_id] = acc;
}

// The shared-memory form: a block stages its token's queries [heads, dim + 1] (padded: lane h reads row h
// without bank conflicts) and head weights once, then each warp scores entries: the key goes to shared memory,
// lane h takes head h (and h + 32, ...) with the whole dot product in order over dim, and one warp sum adds the
// heads' weighted scores. The one-warp-per-entry kernel above re-read the token's queries for every entry and
// reduced every head across the warp (24 µs for one token over ~1k entries on the H200, ncu).
constexpr int kIdxWarps = 8;
__global__ void __launch_bounds__(kIdxWarps * 32)
    indexer_scores_smem_kernel(IndexerScoresKernelParams p, int64_t per_block) {
  extern __shared__ float sm[];
  const int64_t t = blockIdx.y, dp = p.dim + 1;
  float* qs = sm;                 // [heads][dim + 1]
  float* ws = qs + p.heads * dp;  // [heads]
  float* ks = ws + p.heads;       // [kIdxWarps][dim]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t count = scored_entries(p, t, blockIdx.x == 0 && threadIdx.x == 0);
  const int64_t e0 = static_cast<int64_t>(blockIdx.x) * per_block, e1 = min(p.n, e0 + per_block);
  if (e0 >= count) {
    // Nothing to score (a batched call's padding past a short sequence): skip staging the queries.
    for (int64_t e = e0 + threadIdx.x; e < e1; e += blockDim.x) p.out[t * p.n + e] = count < 0 ? NAN : -INFINITY;
    return;
  }
  const float* q = p.q + t * p.heads * p.dim;
  for (int64_t i = threadIdx.x; i < p.heads * p.dim; i += blockDim.x) qs[(i / p.dim) * dp + i % p.dim] = q[i];
  for (int64_t h = threadIdx.x; h < p.heads; h += blockDim.x) ws[h] = p.weights[t * p.heads + h] * p.weight_scale;
  __syncthreads();
  float* key = ks + warp * p.dim;
  for (int64_t e = e0 + warp; e < e1; e += kIdxWarps) {
    if (e >= count) {
      if (lane == 0) p.out[t * p.n + e] = count < 0 ? NAN : -INFINITY;
      continue;
    }
    const void* src = lane == 0 ? entry_key(p, t, e) : nullptr;
    src = reinterpret_cast<const void*>(__shfl_sync(0xffffffffu, reinterpret_cast<unsigned long long>(src), 0));
    if (src == nullptr) {
      if (lane == 0) p.out[t * p.n + e] = NAN;
      continue;
    }
    for (int64_t i = lane; i < p.dim; i += 32) key[i] = pool_load1(src, i, p.keys_format, p.dim);
    __syncwarp();
    float acc = 0.0f;
    for (int64_t h = lane; h < p.heads; h += 32) {
      const float* qh = qs + h * dp;
      float dot = 0.0f;
      for (int64_t i = 0; i < p.dim; ++i) dot = fmaf(qh[i], key[i], dot);
      acc = fmaf(fmaxf(dot, 0.0f) * p.score_scale, ws[h], acc);
    }
    acc = warp_sum(acc);
    if (lane == 0) p.out[t * p.n + e] = acc;
    __syncwarp();  // the key slot is rewritten for the warp's next entry
  }
}

// indexer_scores_smem_kernel with its serial chains shortened (dim % 4 == 0): the queries staged with float4 loads
// all issued before the shared-memory stores (the loop above did 64-bit index math and a load per element, a few
// L2 round trips a thread), and a warp scores kIdxEntries entries at once — their key pointers resolved by
// kIdxEntries lanes together, the keys loaded together, and each lane's dot products of those entries interleaved
// (independent fmaf chains) instead of one entry's page lookup, key load and 128-long chain after another (17.7 µs
// a call at batch 1, ncu). A warp takes entries e0 + warp + kIdxWarps·j as before; every (head, entry) dot, the
// per-lane head order and the warp sum are the ones above: the same bits.
constexpr int kIdxEntries = 2;
// Shared-memory layout of indexer_scores_smem2_kernel: queries [heads][dim + 1], weights [heads], then the key slots
// at the next multiple of 4 floats.
__host__ __device__ constexpr int64_t kIdxKeysOffset(int64_t heads, int64_t dim) {
  return (heads * (dim + 1) + heads + 3) / 4 * 4;
}
__global__ void __launch_bounds__(kIdxWarps * 32)
    indexer_scores_smem2_kernel(IndexerScoresKernelParams p, int64_t per_block) {
  extern __shared__ float sm[];
  const int64_t t = blockIdx.y;
  const int dim = static_cast<int>(p.dim), heads = static_cast<int>(p.heads), dp = dim + 1;
  float* qs = sm;                               // [heads][dim + 1]
  float* ws = qs + heads * dp;                  // [heads]
  float* ks = sm + kIdxKeysOffset(heads, dim);  // [kIdxWarps][kIdxEntries][dim], 16-byte aligned (float4 stores)
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  constexpr int kBatch = 8;
  const float4* q4 = reinterpret_cast<const float4*>(p.q + t * p.heads * p.dim);
  const int n4 = heads * dim / 4, dim4 = dim / 4;
  // The first kBatch float4 of the thread's share of the queries are requested before anything else (V4's 64 x 128
  // is exactly that at 256 threads): their latency overlaps the entry count's loads and the first page lookups.
  float4 qv[kBatch];
  const auto load_q = [&](int b) {
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int i = b + j * static_cast<int>(blockDim.x);
      qv[j] = i < n4 ? __ldg(q4 + i) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
  };
  const auto store_q = [&](int b) {
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int i = b + j * static_cast<int>(blockDim.x);
      if (i >= n4) break;
      const int h = i / dim4;
      float* dst = qs + h * dp + 4 * (i - h * dim4);
      dst[0] = qv[j].x;
      dst[1] = qv[j].y;
      dst[2] = qv[j].z;
      dst[3] = qv[j].w;
    }
  };
  load_q(threadIdx.x);
  const int64_t count = scored_entries(p, t, blockIdx.x == 0 && threadIdx.x == 0);
  const int64_t e0 = static_cast<int64_t>(blockIdx.x) * per_block, e1 = min(p.n, e0 + per_block);
  if (e0 >= count) {
    for (int64_t e = e0 + threadIdx.x; e < e1; e += blockDim.x) p.out[t * p.n + e] = count < 0 ? NAN : -INFINITY;
    return;
  }
  // Entries eb + kIdxWarps·j (j < kIdxEntries) of a warp: lane j resolves its page (writing −inf / NaN outputs for
  // entries it cannot score), then every lane requests its part of the live keys.
  unsigned live = 0;
  const void* srcs[kIdxEntries];
  uint4 kv[kIdxEntries][4];  // as loaded (pool_fetch4): all of them in flight before the first is decoded
  const auto fetch = [&](int64_t eb) {
    const int64_t mine = eb + static_cast<int64_t>(kIdxWarps) * lane;
    const void* src = nullptr;
    bool scored = false;
    if (lane < kIdxEntries && mine < e1) {
      if (mine >= count) {
        p.out[t * p.n + mine] = count < 0 ? NAN : -INFINITY;
      } else {
        src = entry_key(p, t, mine);
        if (src == nullptr)
          p.out[t * p.n + mine] = NAN;
        else
          scored = true;
      }
    }
    live = __ballot_sync(0xffffffffu, scored);
#pragma unroll
    for (int j = 0; j < kIdxEntries; ++j)
      srcs[j] = reinterpret_cast<const void*>(__shfl_sync(0xffffffffu, reinterpret_cast<unsigned long long>(src), j));
#pragma unroll
    for (int j = 0; j < kIdxEntries; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int i4 = lane + 32 * r;
        kv[j][r] = (live >> j & 1u) && i4 < dim4 ? pool_fetch4(srcs[j], i4, p.keys_format, p.dim)
                                                 : make_uint4(0u, 0u, 0u, 0u);
      }
  };
  int64_t eb = e0 + warp;
  if (eb < e1) fetch(eb);
  store_q(threadIdx.x);
  for (int b = threadIdx.x + kBatch * blockDim.x; b < n4; b += kBatch * blockDim.x) {
    load_q(b);
    store_q(b);
  }
  for (int h = threadIdx.x; h < heads; h += blockDim.x) ws[h] = p.weights[t * p.heads + h] * p.weight_scale;
  __syncthreads();
  float* key = ks + warp * kIdxEntries * dim;
  for (; eb < e1; eb += kIdxWarps * kIdxEntries) {
    if (eb != e0 + warp) fetch(eb);
    if (live == 0) continue;
#pragma unroll
    for (int j = 0; j < kIdxEntries; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int i4 = lane + 32 * r;
        if (i4 < dim4) reinterpret_cast<float4*>(key + j * dim)[i4] = pool_decode4(kv[j][r], p.keys_format);
      }
    // Rows past 512 dims (not V4's 128): the rest, an element at a time.
    for (int j = 0; j < kIdxEntries; ++j)
      if (live >> j & 1u)
        for (int i = 512 + lane; i < dim; i += 32) key[j * dim + i] = pool_load1(srcs[j], i, p.keys_format, p.dim);
    __syncwarp();
    float acc[kIdxEntries];
#pragma unroll
    for (int j = 0; j < kIdxEntries; ++j) acc[j] = 0.0f;
    for (int h = lane; h < heads; h += 32) {
      const float* qh = qs + h * dp;
      float dot[kIdxEntries];
#pragma unroll
      for (int j = 0; j < kIdxEntries; ++j) dot[j] = 0.0f;
#pragma unroll 4
      for (int i = 0; i < dim; ++i) {
        const float qv1 = qh[i];
#pragma unroll
        for (int j = 0; j < kIdxEntries; ++j) dot[j] = fmaf(qv1, key[j * dim + i], dot[j]);
      }
#pragma unroll
      for (int j = 0; j < kIdxEntries; ++j) acc[j] = fmaf(fmaxf(dot[j], 0.0f) * p.score_scale, ws[h], acc[j]);
    }
#pragma unroll
    for (int j = 0; j < kIdxEntries; ++j) {
      const float a = warp_sum(acc[j]);
      if (lane == 0 && (live >> j & 1u)) p.out[t * p.n + eb + static_cast<int64_t>(kIdxWarps) * j] = a;
    }
    __syncwarp();  // the key slots are rewritten for the warp's next entries
  }
}

// At most 64 registers a thread (launch bounds): 1024 threads of them fill the register file.
template <int kThreads, int kItems>
__global__ void __launch_bounds__(kThreads, kTopkThreads / kThreads) topk_mask_kernel(TopKMaskKernelParams p) {
  __shared__ TopkSmem sm;
  const int64_t t = blockIdx.x;
  const float* s = p.scores + t * p.n;
  const uint8_t* allowed = p.allowed ? p.allowed + t * p.n : nullptr;
  auto value = [&](int64_t i) { return (allowed && !allowed[i]) ? -INFINITY : s[i]; };
  block_topk_mask<kItems>(value, p.n, p.k, p.out + t * p.n, sm);
}

template <int kThreads, int kItems>
__global__ void __launch_bounds__(kThreads, kTopkThreads / kThreads)
    candidate_blocks_kernel(CandidateBlocksKernelParams p) {
  __shared__ TopkSmem sm;
  const int64_t t = blockIdx.x, bs = p.block_size;
  const int64_t blocks = (p.n + bs - 1) / bs;
  const float* s = p.scores + t * p.n;
  float* block_score = p.block_scores + t * blocks;
  uint8_t* block_keep = p.block_keep + t * blocks;
  // The block holding the newest visible entry is only partly filled; it is always kept.
  const int64_t visible = (p.positions[t] + 1) / p.ratio;
  const int64_t forced = visible > 0 ? (visible - 1) / bs : -1;
  if (bs >= 32) {
    // A warp per block: coalesced loads, one warp max.
    const int lane = threadIdx.x & 31;
    for (int64_t b = threadIdx.x >> 5; b < blocks; b += blockDim.x >> 5) {
      float mx = -INFINITY;
      const int64_t end = (b + 1) * bs < p.n ? (b + 1) * bs : p.n;
      for (int64_t e = b * bs + lane; e < end; e += 32) mx = fmaxf(mx, s[e]);
      mx = warp_max(mx);
      if (lane == 0) block_score[b] = b == forced ? INFINITY : mx;
    }
  } else {
    for (int64_t b = threadIdx.x; b < blocks; b += blockDim.x) {
      float mx = -INFINITY;
      const int64_t end = (b + 1) * bs < p.n ? (b + 1) * bs : p.n;
      for (int64_t e = b * bs; e < end; ++e) mx = fmaxf(mx, s[e]);
      block_score[b] = b == forced ? INFINITY : mx;
    }
  }
  __syncthreads();
  auto value = [&](int64_t i) { return block_score[i]; };
  block_topk_mask<kItems>(value, blocks, p.topk_blocks, block_keep, sm);
  __syncthreads();
  uint8_t* keep = p.keep + t * p.n;
  for (int64_t e = threadIdx.x; e < p.n; e += blockDim.x) keep[e] = block_keep[e / bs];
}

// Threads of a block for `rows` top-k rows of `n` keys: the smaller blocks from kTopkRowsMinTokens rows (kAuto), at
// any row count (kAlways) or never (kNever: always 1024, the decode shape).
int topk_block_threads(int64_t rows, int64_t n, KernelPick small_blocks) {
  if (small_blocks == KernelPick::kNever) return kTopkThreads;
  if (small_blocks == KernelPick::kAuto && rows < kTopkRowsMinTokens) return kTopkThreads;
  for (int threads = 256; threads < kTopkThreads; threads *= 2)
    if (n <= static_cast<int64_t>(threads) * kTopkItems) return threads;
  return kTopkThreads;
}

}  // namespace

void run_indexer_scores(const IndexerScoresKernelParams& p, cudaStream_t stream) {
  if (p.tokens * p.n == 0) return;
  const size_t smem = sizeof(float) * static_cast<size_t>(p.heads * (p.dim + 1) + p.heads + kIdxWarps * p.dim);
  if (smem <= 48 * 1024 && p.tokens <= 65535) {
    // Few tokens (decode: one per sequence) spread over more blocks; many tokens (prefill) stage the queries
    // for more entries each.
    const int64_t per_block = p.tokens <= 16 ? 16 : 128;
    const dim3 grid(static_cast<unsigned>(ceil_div(p.n, per_block)), static_cast<unsigned>(p.tokens));
    const size_t smem2 =
        sizeof(float) * static_cast<size_t>(kIdxKeysOffset(p.heads, p.dim) + kIdxEntries * kIdxWarps * p.dim);
    // The float4 paths need 16-byte rows: dim % 4 == 0 and 16-byte aligned bases.
    const bool aligned =
        p.dim % 4 == 0 && (reinterpret_cast<uintptr_t>(p.q) | reinterpret_cast<uintptr_t>(p.keys)) % 16 == 0;
    if (aligned && smem2 <= 48 * 1024)
      indexer_scores_smem2_kernel<<<grid, kIdxWarps * 32, smem2, stream>>>(p, per_block);
    else
      indexer_scores_smem_kernel<<<grid, kIdxWarps * 32, smem, stream>>>(p, per_block);
  } else {
    indexer_scores_kernel<<<grid_1d(p.tokens * p.n * 32, 256), 256, 0, stream>>>(p);
  }
  DI_CUDA_CHECK_LAUNCH();
}

void run_topk_mask(const TopKMaskKernelParams& p, cudaStream_t stream) {
  if (p.tokens == 0 || p.n == 0) return;
  const unsigned grid = static_cast<unsigned>(p.tokens);
  switch (topk_block_threads(p.tokens, p.n, p.small_blocks)) {
    case 256:
      topk_mask_kernel<256, kTopkItems><<<grid, 256, 0, stream>>>(p);
      break;
    case 512:
      topk_mask_kernel<512, kTopkItems><<<grid, 512, 0, stream>>>(p);
      break;
    default:
      topk_mask_kernel<kTopkThreads, kTopkItems><<<grid, kTopkThreads, 0, stream>>>(p);
  }
  DI_CUDA_CHECK_LAUNCH();
}

void run_candidate_blocks(const CandidateBlocksKernelParams& p, cudaStream_t stream) {
  if (p.tokens == 0 || p.n == 0) return;
  const unsigned grid = static_cast<unsigned>(p.tokens);
  switch (topk_block_threads(p.tokens, ceil_div(p.n, p.block_size), p.small_blocks)) {
    case 256:
      candidate_blocks_kernel<256, kTopkItems><<<grid, 256, 0, stream>>>(p);
      break;
    case 512:
      candidate_blocks_kernel<512, kTopkItems><<<grid, 512, 0, stream>>>(p);
      break;
    default:
      candidate_blocks_kernel<kTopkThreads, kTopkItems><<<grid, kTopkThreads, 0, stream>>>(p);
  }
  DI_CUDA_CHECK_LAUNCH();
}

}  // namespace deepinfer::cuda
