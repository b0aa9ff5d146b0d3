// Tensor-core lightning-indexer scores for prefill and batched decode calls (indexer_mma.h says when it is chosen).
//
// score(t, e) = Σ_h w[t,h]·weight_scale · relu(q[t,h,:]·key[e,:]) · score_scale is, per token, a GEMM
// S = Q_t[heads x dim] · Kᵀ[dim x entries] followed by a weighted relu-sum over the heads (the M dimension). A block
// takes consecutive tokens (4 at 64 heads, 8 at 32: 256 head rows) and walks the entries in tiles of 64 keys: each
// key tile is read from global memory once for the block's tokens x all heads and multiplied on the tensor cores
// (mma.sync m16n8k16 bf16, fp32 accumulation); the SIMT kernels read it once per token and run the products on the
// fp32 pipes.
//
// Precision, from the data the models feed it (src/deepinfer/model/deepseek_v4_attention.cc, MODELS.md):
// - V4.1: the indexer queries and keys are both FP4-fake-quantized (kFP4Ue8m0Block32: an e2m1 value, at most 2
//   significant bits, times a power-of-two scale) before scoring. Such a value is exactly a bf16 (8 significant
//   bits, fp32's exponent range) unless it falls below bf16's normal range; one bf16 mma per product is then exact
//   and only the order of the fp32 sums differs from the CPU op.
// - V4: neither the queries (RoPE without fake-quant) nor the keys (the indexer compressor's norm + RoPE output)
//   are quantized: arbitrary fp32. Each operand is then split x = hi + lo, both bf16 (hi = RN(x), lo = RN(x − hi),
//   |x − hi − lo| <= 2^-16 |x|) and each product is hi·hi + hi·lo + lo·hi in fp32 (lo·lo, <= 2^-16 |xy|, dropped),
//   as in attention_paged_mma_cuda.cu: off by at most 3·2^-16 ≈ 4.6e-5 of |q||k| per product, random in sign.
// The kernel does not trust the caller to say which case it is in: it splits every operand and checks whether any
// lo part is nonzero (once for the block's queries, once per key tile: a block-wide OR in the barrier it needs
// anyway). Where all are zero every operand equals its hi part, the cross terms would add exact zeros, and the
// kernel runs hi·hi alone: the split form's result at a third of the mma work. So V4.1 data takes the exact
// single-mma path and V4 data the split path, decided by the values themselves (a block whose FP4 values fall below
// bf16's normal range simply takes the split path).
// Emulated on the CPU (torch: the bf16 parts' exact products, fp32-rounded dot products, fp64 head sums; uniform
// (-1, 1) data, 16-64 heads, dim 64 / 128, 65-2048 entries; tools/indexer_mma_emulate.py too): the split form's
// norm-relative error against fp64 is 3.5e-6 to 4.7e-6 (the weighted head sum of mixed-sign weights cancels, which
// magnifies it), fp32 gives 2e-7, and hi·hi alone on fp32 data 2.2e-3. The GPU tests hold the kernel to 2e-5 against
// the CPU op and the SIMT kernel on fp32 data and to 2e-6 on bf16-exact data (the sums' order only).
//
// Block: 8 warps; kTokens tokens t0 .. (blocks run the latest tokens, which see the most entries, first). Warp w
// scores token w % kTokens against 8·kNt keys of each 64-key tile (Shape below: 4 x 32 keys at 64 heads, 8 x 64 at
// 32): for every 16-dim k step it loads its n-tiles of keys (ldmatrix.x4 pairs, hi and lo) and, per 16-head m-tile,
// the query fragment (ldmatrix.x4), and runs 1 or 3 mmas per (m-tile, n-tile): 16 independent accumulator tiles
// (64 fp32 registers). The epilogue adds relu(s)·score_scale·w_h over the lane's heads and then over the 8 lanes
// of a column (3 shuffles). Keys flow through two shared buffers: while the warps multiply tile i, every thread
// has its share of tile i + 1 (a quarter of a key row) in flight in registers, then splits it into the other
// buffer; one barrier a tile. Shared memory at dim 128: queries hi + lo 136 KB, two key buffers hi + lo 68 KB: one
// block an SM. A call of few tokens (a chunk or a continuation against a long context) would be few blocks each
// walking all of its tokens' entries (0.145 ms at 16-512 tokens over 2048 entries, measured): the key tiles are then
// split over up to ~2 waves of blocks (grid.y; split 0 writes the −inf / NaN tails and reports the row status).
//
// A bf16 key pool (--kv-cache-dtype bf16) or key records (fp8) are widened or decoded as each thread stages its share
// of a tile, not as it loads it (pool_fetch4 / pool_decode4): a conversion right after the load would wait for the
// load there, and the loads of tile i + 1 would no longer overlap tile i's mmas (ncu, H100, session 42, V4.1 slice
// decode b64 at 64k: 2.26 / 2.19 ms a launch over bf16 / record pools against 1.43 over f32 pools). Their lo parts
// are zero, so they take the split or the hi-only path exactly as the f32 pool holding the same values would.
//
// Decode form (kDec; indexer_mma.h, KernelChoices::indexer_mma_decode): in a decode call every token of a block is
// another sequence's, so the sequence passes above score one token each, with only that token's warps (1 of 8 at
// V4.1's 32 heads, 2 at 64) — the same ncu: 1.43 ms a launch for ~26 GFLOP, ~18 TFLOP/s. In the decode form a pass is
// one token and warp w scores its heads' m-tile w % kMt against key slice w / kMt of the tile (A fragments held in
// registers for the pass); the m-tiles' relu-weighted sums go to shared memory and are added in m-tile order after
// the tile's barrier, one thread a key (the tile before, during the next tile's mmas). Another order of the same
// fp32 sums than the pass form's (a lane's sum over its m-tiles first): within the same tolerances. One block an SM
// (the queries of 8 or 4 tokens, hi + lo, take 139 KB at dim 128) keeps one tile's loads in flight a thread (16 KB an
// SM from a bf16 pool): latency-bound (session 42: 2.23 ms at 64k where the bf16 keys' bytes take ~0.5). Two tiles in
// flight a thread (a second register set, 241 / 228 registers) was slower: 2.37 against 2.19 ms (session 43, H100).
// The ring kernel (indexer_decode_ring_cuda.cu) takes the decode form's calls over f32 and bf16 pools and FP4 key
// records: a block a token, the key tiles copied into shared-memory stages by cp.async; the same scores bit for bit.
//
// Visibility: token t scores the entries below scored_entries(t) (indexer_entries.cuh); the block loads the rows
// below the largest such count among its tokens of one sequence, so a row is read only when some token of the
// block may see it, and column e of token t (an independent column of S) is written −inf whenever e >= its count.
// Rows past what the block loads are never read. Paged keys: the block's tokens are grouped by sequence (q_seq) and
// each group is one pass over that sequence's pages (a batched call's tokens of one sequence are consecutive, so
// usually one pass, two where a block straddles sequences). A bad page makes its entry NaN for the tokens that see
// it and sets the status bit; a bad q_seq / n_entries makes the whole row NaN, exactly as the SIMT kernels.
// A NaN or inf in a visible key or query gives what the SIMT kernel gives for NaN (relu(NaN) = 0 by fmaxf), but an
// inf becomes NaN in the split (inf − inf) and so contributes 0 where the SIMT kernel may give inf.
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
static_assert(kThreads == 4 * kTile, "4 loader threads a key row");

// kMt 16-head m-tiles a token (heads padded with zero rows and weights): 4 at 64 heads, 2 at 32. The block's
// tokens x heads are 256 rows either way (the queries' shared memory), so a block takes 16 / kMt tokens; warp w
// scores token w % kTokens against kNt n-tiles (8 keys each) at kNt·8·(w / kTokens) of the tile, and every warp
// holds kMt x kNt = 16 accumulator tiles (64 fp32 registers).
template <int kMt>
struct Shape {
  static constexpr int kRows = 16 * kMt;
  static constexpr int kTokens = 16 / kMt;
  static constexpr int kWarpsPerToken = kWarps / kTokens;
  static constexpr int kNt = kTile / 8 / kWarpsPerToken;
  static_assert(kMt * kNt == 16 && kNt % 2 == 0, "16 accumulator tiles a warp, n-tiles in ldmatrix pairs");
};

template <int kDim, int kMt>
struct Layout {
  static constexpr int kRows = Shape<kMt>::kRows;
  static constexpr int kTokens = Shape<kMt>::kTokens;
  // +8 bf16 (16 bytes) a row: the 8 rows of an ldmatrix phase fall in distinct bank groups.
  static constexpr int kLd = kDim + 8;
  static constexpr size_t kQBytes = size_t{2} * kTokens * kRows * kLd;  // q hi (or lo) of the block's tokens
  static constexpr size_t kKBytes = size_t{2} * kTile * kLd;            // one key tile's hi (or lo)
  static constexpr size_t q_hi = 0;
  static constexpr size_t q_lo = q_hi + kQBytes;
  static constexpr size_t k_hi = q_lo + kQBytes;  // [2 buffers]
  static constexpr size_t k_lo = k_hi + 2 * kKBytes;
  static constexpr size_t ws = k_lo + 2 * kKBytes;                       // [kTokens][kRows] w·weight_scale
  static constexpr size_t count = ws + sizeof(float) * kTokens * kRows;  // [kTokens] int64 entries scored
  static constexpr size_t seq = count + sizeof(int64_t) * kTokens;       // [kTokens] int sequence
  static constexpr size_t bad = seq + sizeof(int) * kTokens;             // [2][kTile] a tile row's page is bad
  static constexpr size_t red = bad + 2 * kTile;                         // [2][kMt][kTile] decode form's sums
  static constexpr size_t bytes = red + sizeof(float) * 2 * kMt * kTile;
  static_assert(kDim % 64 == 0, "4 loader threads a row, float4 each, 16-dim mma steps");
  static_assert(k_hi % 16 == 0 && k_lo % 16 == 0 && ws % 16 == 0 && count % 8 == 0 && red % 4 == 0, "aligned regions");
};

// count_s of a token past the call's last one (writes nothing); a row that is all NaN is -1.
constexpr int64_t kAbsent = -2;

// S = Q_tok · Kᵀ over the warp's kNt·8 keys, all dims: acc[m-tile][n-tile]. kSplit: hi·lo + lo·hi + hi·hi per
// product (the small terms first); otherwise hi·hi alone (every lo part is zero).
template <int kDim, int kMt, bool kSplit>
__device__ __forceinline__ void warp_scores(const __nv_bfloat16* qh, const __nv_bfloat16* ql, const __nv_bfloat16* kh,
                                            const __nv_bfloat16* kl, int lane, float (&acc)[kMt][Shape<kMt>::kNt][4]) {
  constexpr int kLd = Layout<kDim, kMt>::kLd, kNt = Shape<kMt>::kNt;
  // ldmatrix lanes. B (keys [key][dim] = the col-major K x N operand): matrix l / 8 = (keys +8 for lanes 16-31,
  // dims +8 for lanes 8-15 / 24-31): registers 0-1 are n-tile 2i's b0 / b1, 2-3 n-tile 2i + 1's. A (queries
  // [head][dim], row-major): rows lane % 16, dims +8 for lanes 16-31: a0..a3 of the m16n8k16 A fragment.
  const int b_row = (lane & 7) + ((lane >> 4) << 3), b_col = ((lane >> 3) & 1) * 8;
  const int a_row = lane & 15, a_col = (lane >> 4) * 8;
#pragma unroll
  for (int mt = 0; mt < kMt; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNt; ++nt) acc[mt][nt][0] = acc[mt][nt][1] = acc[mt][nt][2] = acc[mt][nt][3] = 0.0f;
#pragma unroll 2
  for (int d = 0; d < kDim; d += 16) {
    uint32_t bh[kNt / 2][4], bl[kNt / 2][4];
#pragma unroll
    for (int i = 0; i < kNt / 2; ++i) {
      ldmatrix_x4(bh[i], kh + (i * 16 + b_row) * kLd + d + b_col);
      if constexpr (kSplit) ldmatrix_x4(bl[i], kl + (i * 16 + b_row) * kLd + d + b_col);
    }
#pragma unroll
    for (int mt = 0; mt < kMt; ++mt) {
      uint32_t ah[4], al[4];
      ldmatrix_x4(ah, qh + (mt * 16 + a_row) * kLd + d + a_col);
      if constexpr (kSplit) ldmatrix_x4(al, ql + (mt * 16 + a_row) * kLd + d + a_col);
#pragma unroll
      for (int nt = 0; nt < kNt; ++nt) {
        const uint32_t b0 = bh[nt >> 1][(nt & 1) * 2], b1 = bh[nt >> 1][(nt & 1) * 2 + 1];
        if constexpr (kSplit) {
          mma_bf16(acc[mt][nt], ah, bl[nt >> 1][(nt & 1) * 2], bl[nt >> 1][(nt & 1) * 2 + 1]);
          mma_bf16(acc[mt][nt], al, b0, b1);
        }
        mma_bf16(acc[mt][nt], ah, b0, b1);
      }
    }
  }
}

template <int kDim, int kMt, bool kDec>
__global__ void __launch_bounds__(kThreads, 1)
    indexer_scores_mma_kernel(IndexerScoresKernelParams p, int tiles_per_split) {
  using L = Layout<kDim, kMt>;
  constexpr int kLd = L::kLd, kRows = L::kRows, kTokens = L::kTokens, kNt = Shape<kMt>::kNt;
  constexpr int kWarpKeys = kNt * 8;
  extern __shared__ __align__(16) uint8_t smem[];
  auto* q_hi = reinterpret_cast<__nv_bfloat16*>(smem + L::q_hi);
  auto* q_lo = reinterpret_cast<__nv_bfloat16*>(smem + L::q_lo);
  auto* ws_s = reinterpret_cast<float*>(smem + L::ws);
  auto* count_s = reinterpret_cast<int64_t*>(smem + L::count);
  auto* seq_s = reinterpret_cast<int*>(smem + L::seq);
  auto* bad_s = reinterpret_cast<uint8_t*>(smem + L::bad);
  auto* red_s = reinterpret_cast<float*>(smem + L::red);
  auto k_hi = [&](int b) { return reinterpret_cast<__nv_bfloat16*>(smem + L::k_hi + b * L::kKBytes); };
  auto k_lo = [&](int b) { return reinterpret_cast<__nv_bfloat16*>(smem + L::k_lo + b * L::kKBytes); };

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t t0 = static_cast<int64_t>(gridDim.x - 1 - blockIdx.x) * kTokens;
  const int split = static_cast<int>(blockIdx.y);  // key tiles split * tiles_per_split .. + tiles_per_split - 1

  if (tid < kTokens) {
    const int64_t t = t0 + tid;
    int64_t c = kAbsent;
    int s = 0;
    if (t < p.tokens) {
      c = scored_entries(p, t, split == 0);
      c = c < 0 ? -1 : (c < p.n ? c : p.n);
      if (c >= 0 && p.block_tables != nullptr) s = p.q_seq[t];
    }
    count_s[tid] = c;
    seq_s[tid] = s;
  }
  // Queries of the block's tokens, split once for every tile (zeros past the last head or token), and the weights.
  constexpr int kRowVecs = kDim / 4;
  bool q_lo_any = false;
  for (int i = tid; i < kTokens * kRows * kRowVecs; i += kThreads) {
    const int tok = i / (kRows * kRowVecs), r = (i / kRowVecs) % kRows, c = (i % kRowVecs) * 4;
    const int64_t t = t0 + tok;
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (t < p.tokens && r < p.heads) v = __ldg(reinterpret_cast<const float4*>(p.q + (t * p.heads + r) * kDim + c));
    const int at = (tok * kRows + r) * kLd + c;
    q_lo_any |= store_split4(v, q_hi + at, q_lo + at);
  }
  for (int i = tid; i < kTokens * kRows; i += kThreads) {
    const int tok = i / kRows, r = i % kRows;
    const int64_t t = t0 + tok;
    ws_s[i] = t < p.tokens && r < p.heads ? p.weights[t * p.heads + r] * p.weight_scale : 0.0f;
  }
  const bool q_split = __syncthreads_or(q_lo_any) != 0;

  // Every thread walks the same passes (one per sequence among the block's tokens) from the shared counts.
  unsigned pending = 0;
#pragma unroll
  for (int i = 0; i < kTokens; ++i) pending |= count_s[i] >= 0 ? 1u << i : 0u;
  int64_t upto[kTokens] = {};  // a token's entries below this are written by its warps' tiles
  const int tok = warp % kTokens, part = warp / kTokens;
  const int dmt = warp % kMt, dpart = warp / kMt;  // decode form: m-tile and key slice
  const int g = lane >> 2, tq = lane & 3;
  const int lr = tid >> 2, lp = tid & 3;  // loader: key row lr of a tile, float4s lp + 4·j of it
  constexpr int kLoads = kRowVecs / 4;
  while (pending != 0) {
    const int first = __ffs(static_cast<int>(pending)) - 1;
    unsigned active = 0;
    int64_t e_end = 0;
#pragma unroll
    for (int i = 0; i < kTokens; ++i)
      if ((pending >> i & 1u) && (kDec ? i == first : seq_s[i] == seq_s[first])) {
        active |= 1u << i;
        e_end = count_s[i] > e_end ? count_s[i] : e_end;
      }
    pending &= ~active;
    const int ntiles = static_cast<int>((e_end + kTile - 1) / kTile);
#pragma unroll
    for (int i = 0; i < kTokens; ++i)
      if (active >> i & 1u) upto[i] = min(p.n, static_cast<int64_t>(ntiles) * kTile);
    const int64_t tk = t0 + first;  // a token of the pass's sequence (entry_key reads its q_seq)

    // The loads stay raw (pool_fetch4) until stage() decodes them, after the tile's mmas: in flight meanwhile.
    uint4 v[kLoads];
    bool row_bad = false;
    // Issues the loads of this thread's share of tile `tile` (zeros for rows past e_end or on a bad page).
    auto fetch = [&](int tile) {
      const int64_t e = static_cast<int64_t>(tile) * kTile + lr;
      const void* row = e < e_end ? entry_key(p, tk, e) : nullptr;
      row_bad = e < e_end && row == nullptr;
#pragma unroll
      for (int j = 0; j < kLoads; ++j)
        v[j] = row ? pool_fetch4(row, lp + 4 * j, p.keys_format, p.dim) : make_uint4(0u, 0u, 0u, 0u);
    };
    // Splits the fetched share into buffer b; true when a lo part is nonzero.
    auto stage = [&](int b) {
      bool any = false;
      __nv_bfloat16 *kh = k_hi(b), *kl = k_lo(b);
#pragma unroll
      for (int j = 0; j < kLoads; ++j) {
        const int at = lr * kLd + (lp + 4 * j) * 4;
        any |= store_split4(pool_decode4(v[j], p.keys_format), kh + at, kl + at);
      }
      if (lp == 0) bad_s[b * kTile + lr] = row_bad;
      return any;
    };
    // This block's tiles of the pass (the other splits write the rest of [0, upto)).
    const int it0 = min(ntiles, split * tiles_per_split), it1 = min(ntiles, it0 + tiles_per_split);
    if (it0 >= it1) continue;
    fetch(it0);
    bool k_split = __syncthreads_or(stage(0)) != 0;  // also: the previous pass's warps are done with buffer 0
    const int ptok = kDec ? first : tok;             // the token this warp scores in the pass
    const bool mine = (active >> ptok & 1u) != 0;
    const int64_t cnt = mine ? count_s[ptok] : 0;
    float* out = p.out + (t0 + ptok) * p.n;
    // Decode form: the warp's m-tile of the token's queries, as A fragments for the whole pass.
    uint32_t qah[kDec ? kDim / 16 : 1][4], qal[kDec ? kDim / 16 : 1][4];
    if constexpr (kDec) {
      const int qo = (first * kRows + dmt * 16 + (lane & 15)) * kLd + (lane >> 4) * 8;
#pragma unroll
      for (int st = 0; st < kDim / 16; ++st) {
        ldmatrix_x4(qah[st], q_hi + qo + st * 16);
        ldmatrix_x4(qal[st], q_lo + qo + st * 16);
      }
    }
    // Decode form: tile `tile`'s scores from buffer fb's m-tile sums (every warp's written before the last barrier).
    auto finalize = [&](int tile, int fb) {
      const int64_t e = static_cast<int64_t>(tile) * kTile + tid;
      if (tid >= kTile || e >= p.n) return;
      out[e] = e < cnt ? dec_key_score<kMt>(red_s + fb * kMt * kTile, tid) : -INFINITY;
    };
    for (int it = it0; it < it1; ++it) {
      const int b = (it - it0) & 1;
      const bool more = it + 1 < it1;
      if (more) fetch(it + 1);
      if constexpr (kDec) {
        constexpr int kNtD = DecShape<kMt>::kNt, kWk = kNtD * 8;
        const int64_t col0 = static_cast<int64_t>(it) * kTile + dpart * kWk;
        if (col0 < p.n && col0 < cnt) {
          float acc[kNtD][4];
          const int ko = dpart * kWk * kLd;
          if (q_split || k_split)
            warp_scores_dec<kDim, kMt, kLd, true, true>(qah, qal, k_hi(b) + ko, k_lo(b) + ko, lane, acc);
          else
            warp_scores_dec<kDim, kMt, kLd, false, false>(qah, qal, k_hi(b) + ko, k_lo(b) + ko, lane, acc);
          // As below for the warp's 16 heads: the relu-weighted sum over heads g, g + 8, then over the lanes g.
          float v0, v1;
          dec_head_sums<kMt>(acc, ws_s[first * kRows + dmt * 16 + g], ws_s[first * kRows + dmt * 16 + g + 8],
                             p.score_scale, g, v0, v1);
          dec_store_sums<kMt>(red_s + b * kMt * kTile, bad_s + b * kTile, dmt, dpart * kWk, lane, v0, v1);
        }
        if (it > it0) finalize(it - 1, b ^ 1);
      }
      const int64_t col0 = static_cast<int64_t>(it) * kTile + part * kWarpKeys;
      if (!kDec && mine && col0 < p.n) {
        if (col0 >= cnt) {
          // The token sees none of the warp's keys (another token of the block does).
          for (int k = lane; k < kWarpKeys; k += 32)
            if (col0 + k < p.n) out[col0 + k] = -INFINITY;
        } else {
          float acc[kMt][kNt][4];
          const int qo = tok * kRows * kLd, ko = part * kWarpKeys * kLd;
          if (q_split || k_split)
            warp_scores<kDim, kMt, true>(q_hi + qo, q_lo + qo, k_hi(b) + ko, k_lo(b) + ko, lane, acc);
          else
            warp_scores<kDim, kMt, false>(q_hi + qo, q_lo + qo, k_hi(b) + ko, k_lo(b) + ko, lane, acc);
          // Lane (g, tq) holds heads g, g + 8 of each m-tile x keys 2·tq, 2·tq + 1 of each n-tile; the weighted
          // relu-sum over its heads, then over the 8 lanes g of the same keys.
          const float* w = ws_s + tok * kRows;
          float s0[kNt], s1[kNt];
#pragma unroll
          for (int nt = 0; nt < kNt; ++nt) {
            s0[nt] = s1[nt] = 0.0f;
#pragma unroll
            for (int mt = 0; mt < kMt; ++mt) {
              const float w0 = w[mt * 16 + g], w1 = w[mt * 16 + g + 8];
              s0[nt] = fmaf(fmaxf(acc[mt][nt][0], 0.0f) * p.score_scale, w0, s0[nt]);
              s1[nt] = fmaf(fmaxf(acc[mt][nt][1], 0.0f) * p.score_scale, w0, s1[nt]);
              s0[nt] = fmaf(fmaxf(acc[mt][nt][2], 0.0f) * p.score_scale, w1, s0[nt]);
              s1[nt] = fmaf(fmaxf(acc[mt][nt][3], 0.0f) * p.score_scale, w1, s1[nt]);
            }
#pragma unroll
            for (int o = 4; o < 32; o <<= 1) {
              s0[nt] += __shfl_xor_sync(0xffffffffu, s0[nt], o);
              s1[nt] += __shfl_xor_sync(0xffffffffu, s1[nt], o);
            }
          }
          // Lanes g < kNt write n-tile g: the warp's keys, consecutive.
          float v0 = s0[0], v1 = s1[0];
#pragma unroll
          for (int nt = 1; nt < kNt; ++nt)
            if (g == nt) {
              v0 = s0[nt];
              v1 = s1[nt];
            }
          if (g < kNt) {
            const int k = part * kWarpKeys + g * 8 + 2 * tq;  // key of the tile
#pragma unroll
            for (int j = 0; j < 2; ++j) {
              const int64_t e = col0 + g * 8 + 2 * tq + j;
              if (e < p.n) out[e] = e >= cnt ? -INFINITY : (bad_s[b * kTile + k + j] ? NAN : (j ? v1 : v0));
            }
          }
        }
      }
      // Buffer b^1 held tile it - 1, whose readers passed the previous barrier: refill it with tile it + 1.
      const bool any = more && stage(b ^ 1);
      k_split = __syncthreads_or(any) != 0;  // tile it + 1 staged; buffer b free again
    }
    if constexpr (kDec) finalize(it1 - 1, (it1 - 1 - it0) & 1);  // read before the next pass's first barrier
  }

  // Past the tiles: −inf (not visible), or NaN for a row with a bad q_seq / n_entries (split 0 writes them).
  if (split != 0) return;
#pragma unroll
  for (int i = 0; i < kTokens; ++i) {
    const int64_t c = count_s[i];
    if (c == kAbsent) continue;
    const float fill = c < 0 ? NAN : -INFINITY;
    float* out = p.out + (t0 + i) * p.n;
    for (int64_t e = (c < 0 ? 0 : upto[i]) + tid; e < p.n; e += kThreads) out[e] = fill;
  }
}

template <int kDim, int kMt>
void launch(const IndexerScoresKernelParams& p, cudaStream_t stream) {
  constexpr size_t smem = Layout<kDim, kMt>::bytes;
  const auto kernel = indexer_scores_decode_form(p) ? indexer_scores_mma_kernel<kDim, kMt, true>
                                                    : indexer_scores_mma_kernel<kDim, kMt, false>;
  DI_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  // Few tokens (a chunk or a continuation against a long context) make few blocks, each walking all its tokens'
  // entries: split the key tiles over blocks until there are about two waves (one block an SM).
  const int64_t token_blocks = ceil_div(p.tokens, Shape<kMt>::kTokens), tiles = ceil_div(p.n, kTile);
  const int64_t want = 2 * static_cast<int64_t>(device_sm_count());
  int64_t splits = token_blocks >= want ? 1 : std::min(tiles, ceil_div(want, token_blocks));
  const int64_t per_split = ceil_div(tiles, splits);
  splits = ceil_div(tiles, per_split);
  const dim3 grid(static_cast<unsigned>(token_blocks), static_cast<unsigned>(splits));
  kernel<<<grid, kThreads, smem, stream>>>(p, static_cast<int>(per_split));
  DI_CUDA_CHECK_LAUNCH();
}

size_t smem_bytes(int64_t dim, int64_t heads) {
  const bool small = heads <= 32;
  switch (dim) {
    case 128:
      return small ? Layout<128, 2>::bytes : Layout<128, 4>::bytes;
    case 64:
      return small ? Layout<64, 2>::bytes : Layout<64, 4>::bytes;
    default:
      return 0;
  }
}

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

}  // namespace

bool indexer_scores_decode_form(const IndexerScoresKernelParams& p) {
  return p.mma_decode && p.block_tables != nullptr && p.tokens < 4 * p.seqs;
}

bool indexer_scores_use_mma(const IndexerScoresKernelParams& p, bool batch_invariant) {
  if (p.mma == KernelPick::kNever || batch_invariant) return false;
  const bool all = p.mma == KernelPick::kAlways;
  const bool decode_like = p.block_tables != nullptr && p.tokens < 4 * p.seqs;
  if (!all && p.tokens < (decode_like ? kIndexerMmaMinDecodeTokens : kIndexerMmaMinTokens)) return false;
  const size_t smem = smem_bytes(p.dim, p.heads);
  return smem > 0 && p.heads >= 1 && p.heads <= 64 && p.tokens * p.n > 0 && aligned16(p.q) && aligned16(p.keys) &&
         smem <= smem_optin_or_current(p.smem_optin);
}

void launch_indexer_scores_mma(const IndexerScoresKernelParams& p, cudaStream_t stream) {
  if (indexer_decode_ring_takes(p)) {
    launch_indexer_decode_ring(p, stream);
    return;
  }
  const bool small = p.heads <= 32;
  if (p.dim == 128)
    small ? launch<128, 2>(p, stream) : launch<128, 4>(p, stream);
  else if (p.dim == 64)
    small ? launch<64, 2>(p, stream) : launch<64, 4>(p, stream);
  else
    DI_CHECK_INTERNAL(false) << "indexer_scores: no tensor-core kernel for dim " << p.dim;
}

}  // namespace deepinfer::cuda
