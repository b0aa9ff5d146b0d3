// The tensor-core indexer's decode form over f32 and bf16 key pools (bf16: --kv-cache-dtype bf16, V4.1's default on
// CUDA; f32: V4's) and FP4 key records (--kv-cache-dtype fp8), with the key tiles copied into a ring of shared-memory
// stages by cp.async (indexer_mma.h says when it is chosen).
//
// Why: the decode form of indexer_mma_cuda.cu holds the queries of 8 tokens (hi + lo, 139 KB at dim 128), so one
// block fits an SM, and each thread keeps one tile's share of loads in flight in registers (16 KB an SM from a bf16
// pool). At decode every token's keys are its own sequence's, so the 8 tokens share nothing and the block walks them
// one after another; the kernel was latency-bound (session 42, H100, V4.1 slice b64 at 64k: 2.2 ms a step where the
// keys' bytes take ~0.5). Here a block is one token and a range of its key tiles: the queries take 17 KB (32 heads;
// 35 KB at 64) and the ring kStages tiles, so each block keeps kStages - 1 tiles in flight without registers. A bf16
// stage is 17 KB (two blocks an SM) and its rows are already the split's hi parts (lo zero): the warps ldmatrix them.
// An f32 stage is 35 KB (one block an SM, 96 KB in flight) and each lane splits the values of its own B fragments.
// A record row (dim 128: 64 bytes of e2m1 codes, 4 UE8M0 scale bytes) is 68 bytes, 4-byte aligned only, so records
// come by 4-byte copies into raw stages of 80 bytes a row (8 of them: 7 tiles in flight), and after its wait each
// thread decodes the words it copied itself into one of two bf16 tile buffers; one barrier a tile, as over bf16 pools.
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
#include "deepinfer/ops/cuda/format_math.cuh"
#include "deepinfer/ops/cuda/gemm_decode.cuh"
#include "deepinfer/ops/cuda/indexer_entries.cuh"
#include "deepinfer/ops/cuda/indexer_mma.h"
#include "deepinfer/ops/cuda/indexer_mma_common.cuh"

namespace deepinfer::cuda {
namespace {

using namespace indexer_mma;

// The key pool's form: the stages hold bf16 rows (ldmatrix'd as they are), f32 rows (each lane splits its own
// fragments) or raw FP4 records (decoded by their copiers into bf16 tile buffers).
enum class RingKeys { kBf16, kF32, kFp4 };

// Ring stages: kStages - 1 tiles in flight while one is multiplied (a record tile is 5 KB, so eight).
template <RingKeys kForm>
constexpr int kStages = kForm == RingKeys::kFp4 ? 8 : 4;
// Blocks an SM the shared memory below allows at dim 128 and 64 heads: two over bf16 pools and records, one over f32
// pools (a stage of f32 rows is twice the bytes; one block still has 96 KB in flight).
template <RingKeys kForm>
constexpr int kBlocksPerSm = kForm == RingKeys::kF32 ? 1 : 2;

template <int kDim, int kMt, RingKeys kForm>
struct RingLayout {
  static constexpr bool kF32 = kForm == RingKeys::kF32, kRec = kForm == RingKeys::kFp4;
  static constexpr int kS = kStages<kForm>;
  static constexpr int kRows = 16 * kMt;  // the token's heads, padded with zero rows
  static constexpr int kLd = kDim + 8;    // +16 bytes a bf16 row: an ldmatrix phase's 8 rows in distinct bank groups
  // f32 stage rows: +32 bytes, so that a half-warp's 8-byte loads of 4 rows x 4 column pairs hit 32 distinct banks.
  static constexpr int kLdF = kDim + 8;
  // A record row's words: kCodeW of codes (8 e2m1 codes each), then its scale word (one UE8M0 byte a 32 values); a
  // raw stage row keeps the codes and a copy of the scale word for each of the row's 4 copier threads.
  static constexpr int kCodeW = kDim / 8, kRawW = kCodeW + 4;
  static constexpr size_t kQBytes = size_t{2} * kRows * kLd;
  static constexpr size_t kBf16TileBytes = size_t{2} * kTile * kLd;
  static constexpr size_t kKBytes = kF32 ? size_t{4} * kTile * kLdF : kRec ? size_t{4} * kTile * kRawW : kBf16TileBytes;
  static constexpr size_t q_hi = 0;
  static constexpr size_t q_lo = q_hi + kQBytes;
  // The stages: [kS][kTile][kLd] bf16, [kS][kTile][kLdF] f32 or [kS][kTile][kRawW] record words.
  static constexpr size_t keys = q_lo + kQBytes;
  static constexpr size_t dec = keys + kS * kKBytes;  // records: [2][kTile][kLd] bf16, the decoded tiles
  static constexpr size_t ws = dec + (kRec ? 2 * kBf16TileBytes : 0);   // [kRows] w·weight_scale
  static constexpr size_t red = ws + sizeof(float) * kRows;             // [2][kMt][kTile] the m-tiles' sums
  static constexpr size_t bad = red + sizeof(float) * 2 * kMt * kTile;  // [kS][kTile] a key's page is bad
  static constexpr size_t bytes = bad + kS * kTile;
  static_assert(kDim % 64 == 0, "4 copier threads a row, 16-byte chunks, 16-dim mma steps");
  static_assert(keys % 16 == 0 && dec % 16 == 0 && (kLd * 2) % 16 == 0 && (kLdF * 4) % 16 == 0 && ws % 16 == 0,
                "aligned stages, rows");
};

// Values 8·w .. 8·w + 7 of an FP4 record (code i of the word in bits 4i .. 4i + 3) times their block's UE8M0 scale
// byte e, as bf16 in value order: the bits of record_decode4's f32 values (e2m1 · 2^(e − 127), exact) rounded to
// bf16, which the decode form's loop stages. A code goes into f32 bits as its value times 2^-126 (e1 e0 m to bits
// 22..24, subnormal for e1 e0 = 0), so one exact multiply by 2^(e − 1) scales it while that is a normal f32 (e <= 128);
// above, 2^126 and then the scale itself (an overflow to inf, or NaN for e = 255, as there). Not record_decode4 itself:
// its per-code e2m1_to_f32_dev made the ring 1.60 ms against 1.18 (H100, session 45, V4.1 b64 at 64k, fp8 caches).
__device__ __forceinline__ uint4 fp4_word_bf16(uint32_t x, uint32_t e) {
  const bool one = e <= 128;
  const float s1 = one ? __uint_as_float((e + 126) << 23) : 0x1p126f, s2 = e8m0_to_f32_dev(static_cast<uint8_t>(e));
  float v[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const uint32_t bits = ((x >> (4 * i)) & 7u) << 22 | ((x >> (4 * i + 3)) & 1u) << 31;
    v[i] = __uint_as_float(bits) * s1;
    if (!one) v[i] *= s2;
  }
  return make_uint4(pack_bf16x2(v[0], v[1]), pack_bf16x2(v[2], v[3]), pack_bf16x2(v[4], v[5]), pack_bf16x2(v[6], v[7]));
}

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

template <int kDim, int kMt, RingKeys kForm>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm<kForm>)
    indexer_decode_ring_kernel(IndexerScoresKernelParams p, int tiles_per_split) {
  using L = RingLayout<kDim, kMt, kForm>;
  constexpr bool kF32 = L::kF32, kRec = L::kRec;
  constexpr int kS = L::kS, kLd = L::kLd, kLdF = L::kLdF, kRows = L::kRows, kNt = DecShape<kMt>::kNt, kWk = kNt * 8;
  constexpr int kChunks = kDim * (kF32 ? 4 : 2) / 16 / 4;  // 16-byte chunks of a key row a copier thread takes
  constexpr int kCodeW = L::kCodeW, kRawW = L::kRawW, kCw = kCodeW / 4;  // records: code words a copier thread takes
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

  // Copier: thread tid takes row tid / 4 of a tile, chunks tid % 4 + 4·j (records: code words kCw·(tid % 4) + j, a
  // whole scale block's, and the scale word). A row's page is looked up one tile before its copy is issued, so the
  // block-table load is in flight during a tile's mmas rather than before each copy.
  const int lr = tid >> 2, lp = tid & 3;
  const auto resolve = [&](int tile, bool& bad) -> const void* {
    const int64_t e = static_cast<int64_t>(tile) * kTile + lr;
    const void* row = tile < it1 && e < cnt ? entry_key(p, t, e) : nullptr;
    bad = tile < it1 && e < cnt && row == nullptr;
    return row;
  };
  const auto issue = [&](int tile, const void* row, bool bad) {
    if (tile < it1) {
      const int st = (tile - it0) % kS;
      if constexpr (kRec) {
        // Each word of the raw stage has one writer, its decoder: the thread's own wait covers what it decodes.
        auto* dst = reinterpret_cast<uint32_t*>(stage_keys(st)) + lr * kRawW;
        const auto* src = static_cast<const uint32_t*>(row ? row : p.keys);
#pragma unroll
        for (int j = 0; j < kCw; ++j) cp_async4(dst + kCw * lp + j, src + kCw * lp + j, row != nullptr);
        cp_async4(dst + kCodeW + lp, src + kCodeW, row != nullptr);
      } else {
        uint8_t* dst = stage_keys(st) + lr * (kF32 ? kLdF * 4 : kLd * 2);
        const auto* src = static_cast<const uint4*>(row ? row : p.keys);
#pragma unroll
        for (int j = 0; j < kChunks; ++j) cp_async16(dst + (lp + 4 * j) * 16, src + lp + 4 * j, row != nullptr);
      }
      if (lp == 0) bad_s[st * kTile + lr] = bad;
    }
    cp_async_commit();  // one group a tile, empty past the range, so the wait below counts tiles
  };
  bool next_bad = false;
  const void* next_row = resolve(it0, next_bad);
#pragma unroll
  for (int s = 0; s < kS - 1; ++s) {
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
    const int st = (it - it0) % kS, rb = (it - it0) & 1;
    cp_async_wait<kS - 2>();  // this thread's copies of tile it have landed ...
    if constexpr (kRec) {
      // ... and it decodes them (into the buffer tile it - 2's mmas read before the last barrier). The block's
      // scale byte: 32 values a block, kCw·lp·8 the thread's first value.
      const uint32_t* raw = reinterpret_cast<const uint32_t*>(stage_keys(st)) + lr * kRawW;
      const uint32_t e = (raw[kCodeW + lp] >> (8 * (kCw * lp / 4))) & 0xFFu;
      auto* dst = reinterpret_cast<__nv_bfloat16*>(smem + L::dec + rb * L::kBf16TileBytes) + lr * kLd;
#pragma unroll
      for (int j = 0; j < kCw; ++j)
        *reinterpret_cast<uint4*>(dst + 8 * (kCw * lp + j)) = fp4_word_bf16(raw[kCw * lp + j], e);
    }
    __syncthreads();  // ... and everyone's; the stage of tile it - 1 and red of tile it - 2 are free
    issue(it + kS - 1, next_row, next_bad);
    next_row = resolve(it + kS, next_bad);
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
        // Records: the decoded tile, bf16 values as a bf16 pool holds them (the loop's hi parts; lo zero).
        const uint8_t* tile = kRec ? smem + L::dec + rb * L::kBf16TileBytes : stage_keys(st);
        const auto* kh = reinterpret_cast<const __nv_bfloat16*>(tile) + dpart * kWk * kLd;
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

template <int kDim, int kMt, RingKeys kForm>
void launch(const IndexerScoresKernelParams& p, cudaStream_t stream) {
  constexpr size_t smem = RingLayout<kDim, kMt, kForm>::bytes;
  const auto kernel = indexer_decode_ring_kernel<kDim, kMt, kForm>;
  DI_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  const int64_t tiles = ceil_div(p.n, kTile),
                splits = indexer_decode_ring_splits(p.tokens, tiles,
                                                    kBlocksPerSm<kForm> * static_cast<int64_t>(device_sm_count()));
  const int64_t per_split = ceil_div(tiles, splits);
  const dim3 grid(static_cast<unsigned>(p.tokens), static_cast<unsigned>(splits));
  kernel<<<grid, kThreads, smem, stream>>>(p, static_cast<int>(per_split));
  DI_CUDA_CHECK_LAUNCH();
}

template <RingKeys kForm>
size_t ring_smem_bytes(int64_t dim, int64_t heads) {
  const bool small = heads <= 32;
  switch (dim) {
    case 128:
      return small ? RingLayout<128, 2, kForm>::bytes : RingLayout<128, 4, kForm>::bytes;
    case 64:
      return small ? RingLayout<64, 2, kForm>::bytes : RingLayout<64, 4, kForm>::bytes;
    default:
      return 0;
  }
}

template <RingKeys kForm>
void launch_format(const IndexerScoresKernelParams& p, cudaStream_t stream) {
  const bool small = p.heads <= 32;
  if (p.dim == 128)
    small ? launch<128, 2, kForm>(p, stream) : launch<128, 4, kForm>(p, stream);
  else if (p.dim == 64)
    small ? launch<64, 2, kForm>(p, stream) : launch<64, 4, kForm>(p, stream);
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

namespace {
// The ring's form for a pool format; false for formats it does not read (other record kinds: never index keys).
bool ring_form(PoolFormat f, RingKeys& form) {
  switch (f) {
    case PoolFormat::kF32:
      form = RingKeys::kF32;
      return true;
    case PoolFormat::kBf16:
      form = RingKeys::kBf16;
      return true;
    case PoolFormat::kFp4Ue8m0B32:
      form = RingKeys::kFp4;
      return true;
    default:
      return false;
  }
}
}  // namespace

bool indexer_decode_ring_takes(const IndexerScoresKernelParams& p) {
  RingKeys form{};
  if (!ring_form(p.keys_format, form)) return false;
  const size_t smem = form == RingKeys::kF32    ? ring_smem_bytes<RingKeys::kF32>(p.dim, p.heads)
                      : form == RingKeys::kBf16 ? ring_smem_bytes<RingKeys::kBf16>(p.dim, p.heads)
                                                : ring_smem_bytes<RingKeys::kFp4>(p.dim, p.heads);
  // Records are copied by 4-byte words; rows are whole words (pool_row_bytes) from a word-aligned pool.
  const uintptr_t key_align = form == RingKeys::kFp4 ? 4 : 16;
  return p.mma_ring && indexer_scores_decode_form(p) && smem > 0 && p.heads >= 1 && p.heads <= 64 && p.tokens > 0 &&
         p.tokens <= 0x7fffffff && reinterpret_cast<uintptr_t>(p.keys) % key_align == 0 &&
         reinterpret_cast<uintptr_t>(p.q) % 16 == 0 && smem <= smem_optin_or_current(p.smem_optin);
}

void launch_indexer_decode_ring(const IndexerScoresKernelParams& p, cudaStream_t stream) {
  RingKeys form{};
  DI_CHECK_INTERNAL(ring_form(p.keys_format, form)) << "indexer_decode_ring: a pool format it does not read";
  if (form == RingKeys::kF32)
    launch_format<RingKeys::kF32>(p, stream);
  else if (form == RingKeys::kBf16)
    launch_format<RingKeys::kBf16>(p, stream);
  else
    launch_format<RingKeys::kFp4>(p, stream);
}

}  // namespace deepinfer::cuda
