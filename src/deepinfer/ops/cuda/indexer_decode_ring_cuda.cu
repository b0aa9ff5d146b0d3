// The tensor-core indexer's decode form over f32 and bf16 key pools (bf16: --kv-cache-dtype bf16, V4.1's default on
// CUDA; f32: V4's), with the key tiles copied into a ring of shared-memory stages by cp.async (indexer_mma.h says when
// it is chosen).
//
// Why: the decode form of indexer_mma_cuda.cu holds the queries of 8 tokens (hi + lo, 139 KB at dim 128), so one
// block fits an SM, and each thread keeps one tile's share of loads in flight in registers (16 KB an SM from a bf16
// pool). At decode every token's keys are its own sequence's, so the 8 tokens share nothing and the block walks them
// one after another; the kernel was latency-bound (session 42, H100, V4.1 slice b64 at 64k: 2.2 ms a step where the
// keys' bytes take ~0.5). Here a block is one token and a range of its key tiles: the queries take 17 KB (32 heads;
// 35 KB at 64) and the ring kStages tiles, so each block keeps kStages - 1 tiles in flight without registers. A bf16
// stage is 17 KB (two blocks an SM) and its rows are already the split's hi parts (lo zero): the warps ldmatrix them.
// An f32 stage is 35 KB (one block an SM, 96 KB in flight) and each lane splits the values of its own B fragments.
//
// The scores are those of the decode form, bit for bit (the tests compare them): the same warp tiles (m-tile w % kMt
// against key slice w / kMt), the same hi / lo split and mma sequence (a cross term whose lo parts are all zero adds
// exact zeros, so it is left out where they are), the same head sums and the same m-tile order
// (indexer_mma_common.cuh). Visibility, bad pages (the key's score NaN, the status bit), bad rows (NaN) and the −inf
// tails are as there.
#include <cuda_bf16.h>

#include <algorithm>

#include "deepinfer/ops/cuda/cuda_runtime.h"
#include "deepinfer/ops/cuda/device_math.cuh"
#include "deepinfer/ops/cuda/gemm_decode.cuh"
#include "deepinfer/ops/cuda/indexer_entries.cuh"
#include "deepinfer/ops/cuda/indexer_mma.h"
#include "deepinfer/ops/cuda/indexer_mma_common.cuh"

namespace deepinfer::cuda {
namespace {

using namespace indexer_mma;

constexpr int kStages = 4;  // ring stages: kStages - 1 tiles in flight while one is multiplied
// Blocks an SM the shared memory below allows at dim 128 and 64 heads: two over bf16 pools, one over f32 pools (a stage
// of f32 rows is twice the bytes; one block still has 96 KB in flight).
template <bool kF32>
constexpr int kBlocksPerSm = kF32 ? 1 : 2;

template <int kDim, int kMt, bool kF32>
struct RingLayout {
  static constexpr int kRows = 16 * kMt;  // the token's heads, padded with zero rows
  static constexpr int kLd = kDim + 8;    // +16 bytes a bf16 row: an ldmatrix phase's 8 rows in distinct bank groups
  // f32 stage rows: +32 bytes, so that a half-warp's 8-byte loads of 4 rows x 4 column pairs hit 32 distinct banks.
  static constexpr int kLdF = kDim + 8;
  static constexpr size_t kQBytes = size_t{2} * kRows * kLd;
  static constexpr size_t kKBytes = kF32 ? size_t{4} * kTile * kLdF : size_t{2} * kTile * kLd;
  static constexpr size_t q_hi = 0;
  static constexpr size_t q_lo = q_hi + kQBytes;
  static constexpr size_t keys = q_lo + kQBytes;             // [kStages][kTile][kLd] bf16 or [kStages][kTile][kLdF] f32
  static constexpr size_t ws = keys + kStages * kKBytes;     // [kRows] w·weight_scale
  static constexpr size_t red = ws + sizeof(float) * kRows;  // [2][kMt][kTile] the m-tiles' sums
  static constexpr size_t bad = red + sizeof(float) * 2 * kMt * kTile;  // [kStages][kTile] a key's page is bad
  static constexpr size_t bytes = bad + kStages * kTile;
  static_assert(kDim % 64 == 0, "4 copier threads a row, 16-byte chunks, 16-dim mma steps");
  static_assert(keys % 16 == 0 && (kLd * 2) % 16 == 0 && (kLdF * 4) % 16 == 0 && ws % 16 == 0, "aligned stages, rows");
};

// The decode form's S tile (warp_scores_dec) from a stage of f32 key rows: each lane splits the values of its B
// fragments itself (the pairs store_split4 makes: dims 2·tq, 2·tq + 1 and 2·tq + 8, 2·tq + 9 of key g), so the
// fragments are the decode form's bits. The key cross term runs where a key lo part of the warp's k step is nonzero;
// where all are zero it would add exact zeros, as in the decode form's hi-only path.
template <int kDim, int kMt, int kLdF, bool kQLo>
__device__ __forceinline__ void warp_scores_dec_f32(const uint32_t (&ah)[kDim / 16][4],
                                                    const uint32_t (&al)[kDim / 16][4], const float* kf, int lane,
                                                    float (&acc)[DecShape<kMt>::kNt][4]) {
  constexpr int kNt = DecShape<kMt>::kNt;
  const int g = lane >> 2, tq = lane & 3;
#pragma unroll
  for (int nt = 0; nt < kNt; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
#pragma unroll
  for (int s = 0; s < kDim / 16; ++s) {
    uint32_t bh[kNt][2], bl[kNt][2];
    uint32_t lo_any = 0;
#pragma unroll
    for (int nt = 0; nt < kNt; ++nt) {
      const float* row = kf + (nt * 8 + g) * kLdF + s * 16 + 2 * tq;
      const float2 v0 = *reinterpret_cast<const float2*>(row), v1 = *reinterpret_cast<const float2*>(row + 8);
      bh[nt][0] = pack_split(v0.x, v0.y, bl[nt][0]);
      bh[nt][1] = pack_split(v1.x, v1.y, bl[nt][1]);
      lo_any |= (bl[nt][0] | bl[nt][1]) & 0x7fff7fffu;
    }
    const bool k_lo = __any_sync(0xffffffffu, lo_any != 0);
#pragma unroll
    for (int nt = 0; nt < kNt; ++nt) {
      if (k_lo) mma_bf16(acc[nt], ah[s], bl[nt][0], bl[nt][1]);
      if constexpr (kQLo) mma_bf16(acc[nt], al[s], bh[nt][0], bh[nt][1]);
      mma_bf16(acc[nt], ah[s], bh[nt][0], bh[nt][1]);
    }
  }
}

template <int kDim, int kMt, bool kF32>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm<kF32>)
    indexer_decode_ring_kernel(IndexerScoresKernelParams p, int tiles_per_split) {
  using L = RingLayout<kDim, kMt, kF32>;
  constexpr int kLd = L::kLd, kLdF = L::kLdF, kRows = L::kRows, kNt = DecShape<kMt>::kNt, kWk = kNt * 8;
  constexpr int kChunks = kDim * (kF32 ? 4 : 2) / 16 / 4;  // 16-byte chunks of a key row a copier thread takes
  extern __shared__ __align__(16) uint8_t smem[];
  auto* q_hi = reinterpret_cast<__nv_bfloat16*>(smem + L::q_hi);
  auto* q_lo = reinterpret_cast<__nv_bfloat16*>(smem + L::q_lo);
  auto* ws_s = reinterpret_cast<float*>(smem + L::ws);
  auto* red_s = reinterpret_cast<float*>(smem + L::red);
  auto* bad_s = reinterpret_cast<uint8_t*>(smem + L::bad);
  const auto stage_keys = [&](int st) { return smem + L::keys + st * L::kKBytes; };
  __shared__ int64_t count_sh;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2;
  const int64_t t = blockIdx.x;
  const int split = static_cast<int>(blockIdx.y);
  if (tid == 0) {
    const int64_t c = scored_entries(p, t, split == 0);
    count_sh = c < 0 ? -1 : (c < p.n ? c : p.n);
  }
  // The token's queries split once (zero rows past the last head), and its weights.
  constexpr int kRowVecs = kDim / 4;
  bool q_lo_any = false;
  for (int i = tid; i < kRows * kRowVecs; i += kThreads) {
    const int r = i / kRowVecs, c = (i % kRowVecs) * 4;
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (r < p.heads) v = __ldg(reinterpret_cast<const float4*>(p.q + (t * p.heads + r) * kDim + c));
    q_lo_any |= store_split4(v, q_hi + r * kLd + c, q_lo + r * kLd + c);
  }
  for (int r = tid; r < kRows; r += kThreads)
    ws_s[r] = r < p.heads ? p.weights[t * p.heads + r] * p.weight_scale : 0.0f;
  const bool q_split = __syncthreads_or(q_lo_any) != 0;

  const int64_t cnt = count_sh;
  float* out = p.out + t * p.n;
  const int ntiles = cnt < 0 ? 0 : static_cast<int>((cnt + kTile - 1) / kTile);
  // Past the tiles: −inf (not visible), or NaN for a row with a bad q_seq / n_entries (split 0 writes them).
  if (split == 0) {
    const float fill = cnt < 0 ? NAN : -INFINITY;
    for (int64_t e = min(p.n, static_cast<int64_t>(ntiles) * kTile) + tid; e < p.n; e += kThreads) out[e] = fill;
  }
  const int it0 = min(ntiles, split * tiles_per_split), it1 = min(ntiles, it0 + tiles_per_split);
  if (it0 >= it1) return;

  // Copier: thread tid takes row tid / 4 of a tile, chunks tid % 4 + 4·j. A row's page is looked up one tile before
  // its copy is issued, so the block-table load is in flight during a tile's mmas rather than before each copy.
  const int lr = tid >> 2, lp = tid & 3;
  const auto resolve = [&](int tile, bool& bad) -> const void* {
    const int64_t e = static_cast<int64_t>(tile) * kTile + lr;
    const void* row = tile < it1 && e < cnt ? entry_key(p, t, e) : nullptr;
    bad = tile < it1 && e < cnt && row == nullptr;
    return row;
  };
  const auto issue = [&](int tile, const void* row, bool bad) {
    if (tile < it1) {
      const int st = (tile - it0) % kStages;
      uint8_t* dst = stage_keys(st) + lr * (kF32 ? kLdF * 4 : kLd * 2);
      const auto* src = static_cast<const uint4*>(row ? row : p.keys);
#pragma unroll
      for (int j = 0; j < kChunks; ++j) cp_async16(dst + (lp + 4 * j) * 16, src + lp + 4 * j, row != nullptr);
      if (lp == 0) bad_s[st * kTile + lr] = bad;
    }
    cp_async_commit();  // one group a tile, empty past the range, so the wait below counts tiles
  };
  bool next_bad = false;
  const void* next_row = resolve(it0, next_bad);
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    issue(it0 + s, next_row, next_bad);
    next_row = resolve(it0 + s + 1, next_bad);
  }

  // The warp's m-tile of the token's queries, as A fragments for the whole range.
  const int dmt = warp % kMt, dpart = warp / kMt;
  uint32_t qah[kDim / 16][4], qal[kDim / 16][4];
  const int qo = (dmt * 16 + (lane & 15)) * kLd + (lane >> 4) * 8;
#pragma unroll
  for (int st = 0; st < kDim / 16; ++st) {
    ldmatrix_x4(qah[st], q_hi + qo + st * 16);
    ldmatrix_x4(qal[st], q_lo + qo + st * 16);
  }
  const float w0 = ws_s[dmt * 16 + g], w1 = ws_s[dmt * 16 + g + 8];
  const auto finalize = [&](int tile) {
    const int64_t e = static_cast<int64_t>(tile) * kTile + tid;
    if (tid < kTile && e < p.n)
      out[e] = e < cnt ? dec_key_score<kMt>(red_s + ((tile - it0) & 1) * kMt * kTile, tid) : -INFINITY;
  };

  for (int it = it0; it < it1; ++it) {
    cp_async_wait<kStages - 2>();  // this thread's copies of tile it have landed ...
    __syncthreads();               // ... and everyone's; the stage of tile it - 1 and red of tile it - 2 are free
    issue(it + kStages - 1, next_row, next_bad);
    next_row = resolve(it + kStages, next_bad);
    const int st = (it - it0) % kStages, rb = (it - it0) & 1;
    const int64_t col0 = static_cast<int64_t>(it) * kTile + dpart * kWk;
    if (col0 < p.n && col0 < cnt) {
      float acc[kNt][4];
      if constexpr (kF32) {
        const float* kf = reinterpret_cast<const float*>(stage_keys(st)) + dpart * kWk * kLdF;
        if (q_split)
          warp_scores_dec_f32<kDim, kMt, kLdF, true>(qah, qal, kf, lane, acc);
        else
          warp_scores_dec_f32<kDim, kMt, kLdF, false>(qah, qal, kf, lane, acc);
      } else {
        const auto* kh = reinterpret_cast<const __nv_bfloat16*>(stage_keys(st)) + dpart * kWk * kLd;
        if (q_split)
          warp_scores_dec<kDim, kMt, kLd, true, false>(qah, qal, kh, kh, lane, acc);
        else
          warp_scores_dec<kDim, kMt, kLd, false, false>(qah, qal, kh, kh, lane, acc);
      }
      float v0, v1;
      dec_head_sums<kMt>(acc, w0, w1, p.score_scale, g, v0, v1);
      dec_store_sums<kMt>(red_s + rb * kMt * kTile, bad_s + st * kTile, dmt, dpart * kWk, lane, v0, v1);
    }
    if (it > it0) finalize(it - 1);
  }
  __syncthreads();
  finalize(it1 - 1);
}

template <int kDim, int kMt, bool kF32>
void launch(const IndexerScoresKernelParams& p, cudaStream_t stream) {
  constexpr size_t smem = RingLayout<kDim, kMt, kF32>::bytes;
  const auto kernel = indexer_decode_ring_kernel<kDim, kMt, kF32>;
  DI_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  const int64_t tiles = ceil_div(p.n, kTile),
                splits = indexer_decode_ring_splits(p.tokens, tiles,
                                                    kBlocksPerSm<kF32> * static_cast<int64_t>(device_sm_count()));
  const int64_t per_split = ceil_div(tiles, splits);
  const dim3 grid(static_cast<unsigned>(p.tokens), static_cast<unsigned>(splits));
  kernel<<<grid, kThreads, smem, stream>>>(p, static_cast<int>(per_split));
  DI_CUDA_CHECK_LAUNCH();
}

template <bool kF32>
size_t ring_smem_bytes(int64_t dim, int64_t heads) {
  const bool small = heads <= 32;
  switch (dim) {
    case 128:
      return small ? RingLayout<128, 2, kF32>::bytes : RingLayout<128, 4, kF32>::bytes;
    case 64:
      return small ? RingLayout<64, 2, kF32>::bytes : RingLayout<64, 4, kF32>::bytes;
    default:
      return 0;
  }
}

template <bool kF32>
void launch_format(const IndexerScoresKernelParams& p, cudaStream_t stream) {
  const bool small = p.heads <= 32;
  if (p.dim == 128)
    small ? launch<128, 2, kF32>(p, stream) : launch<128, 4, kF32>(p, stream);
  else if (p.dim == 64)
    small ? launch<64, 2, kF32>(p, stream) : launch<64, 4, kF32>(p, stream);
  else
    DI_CHECK_INTERNAL(false) << "indexer_decode_ring: no kernel for dim " << p.dim;
}

}  // namespace

int64_t indexer_decode_ring_splits(int64_t tokens, int64_t tiles, int64_t slots) {
  // Waves x (tiles a block + kBlockOverheadTiles) for each split count; the fewest splits of the least cost. (Two
  // waves' worth by count, the decode form's rule, gave V4.1 b64 at 64k 9 splits: 576 blocks = 2.2 waves of 264, the
  // third wave a fifth full.)
  constexpr int64_t kBlockOverheadTiles = 2;  // the block's queries and the ring's fill, about two tiles' time
  int64_t best = 1, best_cost = -1;
  for (int64_t s = 1; s <= tiles && s <= 4 * slots; ++s) {
    const int64_t per = ceil_div(tiles, s);
    if (s > 1 && ceil_div(tiles, s - 1) == per) continue;  // the same ranges as fewer splits
    const int64_t cost = ceil_div(tokens * ceil_div(tiles, per), slots) * (per + kBlockOverheadTiles);
    if (best_cost < 0 || cost < best_cost) {
      best = ceil_div(tiles, per);
      best_cost = cost;
    }
  }
  return best;
}

bool indexer_decode_ring_takes(const IndexerScoresKernelParams& p) {
  const bool f32 = p.keys_format == PoolFormat::kF32;
  if (!f32 && p.keys_format != PoolFormat::kBf16) return false;
  const size_t smem = f32 ? ring_smem_bytes<true>(p.dim, p.heads) : ring_smem_bytes<false>(p.dim, p.heads);
  return p.mma_ring && indexer_scores_decode_form(p) && smem > 0 && p.heads >= 1 && p.heads <= 64 && p.tokens > 0 &&
         p.tokens <= 0x7fffffff && reinterpret_cast<uintptr_t>(p.keys) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(p.q) % 16 == 0 && smem <= smem_optin_or_current(p.smem_optin);
}

void launch_indexer_decode_ring(const IndexerScoresKernelParams& p, cudaStream_t stream) {
  if (p.keys_format == PoolFormat::kF32)
    launch_format<true>(p, stream);
  else
    launch_format<false>(p, stream);
}

}  // namespace deepinfer::cuda
