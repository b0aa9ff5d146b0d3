// The paged absorbed MLA's attend step on the tensor cores (mla_paged_mma.h says when it runs).
//
// Absorbed MLA decode is MQA-like: every head of a query scores the same 576-value cache rows (latent + rope), and
// the rows' first 512 values (the latent) are the values. A block takes one query token, 32 of its heads as the M
// dimension of mma.sync m16n8k16, and one split of its keys: S = Q̃[32 x 576] · K[16 keys x 576]ᵀ, online softmax,
// Ō += P · C[16 keys x 512], tile by tile — the structure of the V4 paged kernel (attention_paged_mma_cuda.cu) at
// MLA's widths. The fp32 SIMT kernel it replaces (mla_paged_cuda.cu) runs the same ~1,100 FLOP per key and head on
// the fp32 pipes: V3 decode at context 4096 measured ~9 TFLOP/s there (H100, docs/PERF.md session 32).
//
// Accuracy as the V4 kernel's: each operand split x = hi + lo (both bf16), each product hi·hi + hi·lo + lo·hi in
// fp32 (~2^-16 of |x||y| a product; the GPU tests hold it to 3e-5 of the CPU op, as the flash MLA kernel).
//
// Block: 12 warps.
// - Warps 8-11 produce, up to kStages tiles ahead, into kStages key buffers: per 16-key tile each producer thread
//   resolves its row's page through the block table (8 threads a row), loads 18 float4 of it (one memory round
//   trip), waits for the consumers to release the buffer, and stores them split into hi / lo bf16. Rows past the
//   split's end are zeros (P is 0 there; 0 · NaN would poison Ō); a bad page is a NaN row and raises the status word.
// - Warps 0-7 consume: (head group hg = warp % 2) x (quarter qd = warp / 2 of the 576 dims, 9 k-steps). Per tile:
//   (1) the S partial of 16 heads x 16 keys over the warp's quarter -> shared memory; (2) softmax, 8 threads a head
//   row and 2 keys each: the four partials summed in a fixed order, fp32 online max / sum, P split into hi / lo, the
//   row's rescale factor; (3) Ō += P · C for all 32 heads x 64 latent dims a warp (each C fragment, transposed by
//   ldmatrix.trans, feeds both head tiles).
// - Models of at most 16 heads (V2-Lite) take 16-head blocks (kHg = 1, KernelChoices::paged_mla_16): in (1) warp % 2
//   picks the tile's key half instead of a head group (16 heads x 8 keys a warp), (2) uses warps 0-3, (3) one head
//   tile. Each S value, P and Ō sees the same operations in the same order as in a 32-head block, so the results are
//   the same bits, without the padding group's mmas.
// Why 16-key tiles and 32 heads: Q̃'s hi / lo planes of 32 heads take 73 KB, a 16-key buffer 36.5 KB, so three
// buffers fit beside Q̃ in the 227 KB of shared memory (32-key buffers would fit one: no overlap of loads and math).
// Each cache row is read once per 32 heads (four times at V3's 128 heads; the grid puts a token's head groups next to
// each other, so the repeats come from L2).
// The end writes the split's unnormalised partial (Ō, m, l) where the SIMT attend writes it; the combine + project
// kernel merges the splits as before.
#include <cuda_bf16.h>

#include <algorithm>
#include <type_traits>

#include "deepinfer/ops/cuda/cuda_runtime.h"
#include "deepinfer/ops/cuda/device_math.cuh"
#include "deepinfer/ops/cuda/gemm_decode.cuh"
#include "deepinfer/ops/cuda/mla_paged_keys.cuh"
#include "deepinfer/ops/cuda/mla_paged_mma.h"

namespace deepinfer::cuda {
namespace {

constexpr int kQuarters = 4;  // consumer warps per head group in the S phase, each a quarter of the row
constexpr int kTile = 16;     // keys a tile
constexpr int kStages = 3;    // key buffers
constexpr int kConsumers = 256;
constexpr int kProducers = 128;  // 8 threads a key row
constexpr int kThreads = kConsumers + kProducers;
// Named barriers: kFull + b / kEmpty + b hand key buffer b between the sides, kCons orders the consumers' own
// shared memory (S partials, P, the rescale factors).
constexpr int kBarFull = 1, kBarEmpty = kBarFull + kStages, kBarCons = kBarEmpty + kStages;
static_assert(kBarCons < 16, "16 named barriers");

// kHg head groups of 16 (the mma M dimension) a block: 2 for V3's 128 heads, 1 for models of at most 16 (V2-Lite),
// whose second group would be all padding.
template <int kR, int kDr, int kHg, bool kBf16 = false>
struct Layout {
  static constexpr int kBlockHeads = 16 * kHg;
  static constexpr int kRow = kR + kDr;
  // +8 bf16 (16 bytes) a row: 1,168-byte rows put the 8 rows of an ldmatrix phase in distinct 16-byte bank groups.
  static constexpr int kLd = kRow + 8;
  // S partials: 24 floats a row (24 mod 32 words) make a half-warp's float2 stores (rows g, words 2·tq) cover the
  // 32 banks once.
  static constexpr int kSLd = kTile + 8;
  static constexpr int kPLd = kTile + 8;  // 48-byte rows: an ldmatrix phase's 8 rows in distinct bank groups
  static constexpr size_t kKeyBuf = size_t{2} * kTile * kLd;  // bytes of one hi or lo key tile
  static constexpr size_t q_hi = 0;
  static constexpr size_t q_lo = q_hi + size_t{2} * kBlockHeads * kLd;
  static constexpr size_t k_hi = q_lo + size_t{2} * kBlockHeads * kLd;  // [kStages]
  static constexpr size_t k_lo = k_hi + kStages * kKeyBuf;              // [kStages]
  static constexpr size_t s = k_lo + (kBf16 ? 0 : kStages * kKeyBuf);   // [quarter][head][key] fp32 partials
  static constexpr size_t p_hi = s + size_t{4} * kQuarters * kBlockHeads * kSLd;
  static constexpr size_t p_lo = p_hi + size_t{2} * kBlockHeads * kPLd;
  static constexpr size_t corr = p_lo + size_t{2} * kBlockHeads * kPLd;
  static constexpr size_t fin_m = corr + size_t{4} * kBlockHeads;
  static constexpr size_t fin_l = fin_m + size_t{4} * kBlockHeads;
  static constexpr size_t bytes = fin_l + size_t{4} * kBlockHeads;
  static_assert(kRow % (16 * kQuarters) == 0, "whole k-steps a quarter");
  static_assert(kR % (8 * 16) == 0, "whole ldmatrix pairs of latent dims a consumer warp");
  static_assert(kRow % 32 == 0, "8 producer threads x float4 a row");
  static_assert(k_hi % 16 == 0 && s % 16 == 0 && p_hi % 16 == 0 && p_lo % 16 == 0 && corr % 16 == 0,
                "16-byte aligned regions");
  static_assert(bytes <= 227 * 1024, "sm_90's opt-in shared memory a block");
};

// Barrier id + b with the id a constant on each path (a register id makes ptxas reserve all 16).
__device__ __forceinline__ void bar_sync_stage(int id, int b) {
  static_assert(kStages == 3, "the cases below");
  if (b == 0)
    bar_sync(id, kThreads);
  else if (b == 1)
    bar_sync(id + 1, kThreads);
  else
    bar_sync(id + 2, kThreads);
}
__device__ __forceinline__ void bar_arrive_stage(int id, int b) {
  if (b == 0)
    bar_arrive(id, kThreads);
  else if (b == 1)
    bar_arrive(id + 1, kThreads);
  else
    bar_arrive(id + 2, kThreads);
}

// kBf16: a bf16 pool (no lo planes in the key buffers); kMinBlocks 2: built for two blocks an SM (80 registers).
template <int kR, int kDr, int kHg, bool kAhead, bool kBf16, int kMinBlocks = 1>
__global__ void __launch_bounds__(kThreads, kMinBlocks) paged_mla_attend_mma_kernel(PagedMlaKernelParams p) {
  using L = Layout<kR, kDr, kHg, kBf16>;
  constexpr int kBlockHeads = L::kBlockHeads;
  constexpr int kRow = L::kRow, kRowVecs = kRow / 4;
  extern __shared__ __align__(16) uint8_t smem[];
  auto* q_hi = reinterpret_cast<__nv_bfloat16*>(smem + L::q_hi);
  auto* q_lo = reinterpret_cast<__nv_bfloat16*>(smem + L::q_lo);
  auto* s_s = reinterpret_cast<float*>(smem + L::s);
  auto* p_hi = reinterpret_cast<__nv_bfloat16*>(smem + L::p_hi);
  auto* p_lo = reinterpret_cast<__nv_bfloat16*>(smem + L::p_lo);
  auto* corr_s = reinterpret_cast<float*>(smem + L::corr);
  auto* fin_m = reinterpret_cast<float*>(smem + L::fin_m);
  auto* fin_l = reinterpret_cast<float*>(smem + L::fin_l);
  auto k_hi = [&](int b) { return reinterpret_cast<__nv_bfloat16*>(smem + L::k_hi + b * L::kKeyBuf); };
  auto k_lo = [&](int b) { return reinterpret_cast<__nv_bfloat16*>(smem + L::k_lo + b * L::kKeyBuf); };

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int hb = static_cast<int>(blockIdx.x) * kBlockHeads;
  const int64_t t = blockIdx.y;
  const int split = static_cast<int>(blockIdx.z);

  // This split's keys: positions [k_begin, k_end), the fp32 attend kernel's split.
  const PagedMlaSplitKeys keys = paged_mla_split_keys(p, t, split, split == 0 && blockIdx.x == 0 && tid == 0);
  const int32_t* table = keys.table;
  const int64_t k_begin = keys.begin, k_end = keys.end;
  const int n_tiles = static_cast<int>((k_end - k_begin + kTile - 1) / kTile);

  if (tid >= kConsumers) {
    // Producers: thread ptid owns row ptid / 8 of every tile and its 16-byte vectors ptid % 8 + 8·j (the 8 threads
    // of a row read 128 contiguous bytes a load): float4s of an f32 pool, 8 bf16 values of a bf16 one.
    using Vec = std::conditional_t<kBf16, uint4, float4>;
    constexpr int kVecs = kRow / (kBf16 ? 8 : 4) / 8;
    const int ptid = tid - kConsumers, pr = ptid / 8, pc = ptid % 8;
    // Tile i's row of this thread into v (its page resolved through the block table).
    auto load = [&](int i, Vec(&v)[kVecs]) {
      const int64_t key = k_begin + static_cast<int64_t>(i) * kTile + pr;
      const Vec* row = nullptr;
      bool bad = false;
      if (key < k_end) {
        const int64_t blk = key / p.block_size, id = table[blk], at = id * p.block_size + key % p.block_size;
        bad = id < 0 || at >= p.pool_rows;
        if (bad) {
          if (pc == 0) atomicOr(p.status, kStatusPagedAttentionRange);
        } else {
          row = reinterpret_cast<const Vec*>(static_cast<const uint8_t*>(p.kv_pool) + at * kRow * (kBf16 ? 2 : 4));
        }
      }
      Vec fill;
      if constexpr (kBf16) {
        const uint32_t f = bad ? 0x7fc07fc0u : 0u;  // bf16 quiet NaN pairs
        fill = make_uint4(f, f, f, f);
      } else {
        const float f = bad ? __int_as_float(0x7fc00000) : 0.0f;
        fill = make_float4(f, f, f, f);
      }
#pragma unroll
      for (int j = 0; j < kVecs; ++j) v[j] = row ? __ldg(row + pc + 8 * j) : fill;
    };
    // v into tile i's key buffer once the consumers are done with the tile it held: f32 rows split into hi / lo,
    // bf16 rows as they are (their lo terms are zero, and the consumers skip them).
    auto put = [&](int i, const Vec(&v)[kVecs]) {
      const int b = i % kStages;
      // Buffer b last held tile i - kStages: wait for the consumers' O phase on it.
      if (i >= kStages) bar_sync_stage(kBarEmpty, b);
      __nv_bfloat16 *kh = k_hi(b), *kl = k_lo(b);
#pragma unroll
      for (int j = 0; j < kVecs; ++j) {
        if constexpr (kBf16) {
          *reinterpret_cast<uint4*>(kh + pr * L::kLd + (pc + 8 * j) * 8) = v[j];
        } else {
          const int at = pr * L::kLd + (pc + 8 * j) * 4;
          uint2 h, l;
          split4(v[j], h, l);
          *reinterpret_cast<uint2*>(kh + at) = h;
          *reinterpret_cast<uint2*>(kl + at) = l;
        }
      }
      bar_arrive_stage(kBarFull, b);
    };
    if constexpr (kAhead) {
      // Tile i + 1's loads go out before tile i's wait and stores: two tiles of rows in flight a thread (the 16-head
      // block reads each row for one block only, so its rows come from DRAM, not from a neighbour's L2 hits).
      Vec va[kVecs], vb[kVecs];
      if (n_tiles > 0) load(0, va);
      for (int i = 0; i < n_tiles; i += 2) {
        if (i + 1 < n_tiles) load(i + 1, vb);
        put(i, va);
        if (i + 1 >= n_tiles) break;
        if (i + 2 < n_tiles) load(i + 2, va);
        put(i + 1, vb);
      }
    } else {
      for (int i = 0; i < n_tiles; ++i) {
        Vec v[kVecs];
        load(i, v);
        put(i, v);
      }
    }
    return;
  }

  // Consumers. Q̃ of the block's heads (zeros past the last head), split once for every tile.
  for (int i = tid; i < kBlockHeads * kRowVecs; i += kConsumers) {
    const int r = i / kRowVecs, c = (i % kRowVecs) * 4, h = hb + r;
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (h < p.heads) v = *reinterpret_cast<const float4*>(p.q_full + (t * p.heads + h) * kRow + c);
    uint2 hi, lo;
    split4(v, hi, lo);
    *reinterpret_cast<uint2*>(q_hi + r * L::kLd + c) = hi;
    *reinterpret_cast<uint2*>(q_lo + r * L::kLd + c) = lo;
  }

  const int g = lane >> 2, tq = lane & 3;
  // S phase: warp = (quarter qd) x (head group hg with two groups, or the tile's key half kh with one: 8 keys a
  // warp, so that 16 heads still busy all 8 warps, each S value summed in the same order either way).
  const int hg = kHg == 2 ? warp % 2 : 0, kh = kHg == 1 ? warp % 2 : 0, qd = warp / 2, r0 = hg * 16 + g;
  constexpr int kQDims = kRow / kQuarters;
  const int d0 = qd * kQDims;
  const int srow = tid >> 3, seg = tid & 7;  // softmax: head row, 2-key segment of the tile
  float m_run = -INFINITY, l_run = 0.0f;
  // O phase: all 32 heads (two m-tiles) x latent dims od0 .. od0 + kODims a warp.
  constexpr int kODims = kR / (kConsumers / 32), kNt = kODims / 8;
  const int od0 = warp * kODims;
  float acc[kHg][kNt][4];
#pragma unroll
  for (int m = 0; m < kHg; ++m)
#pragma unroll
    for (int j = 0; j < kNt; ++j) acc[m][j][0] = acc[m][j][1] = acc[m][j][2] = acc[m][j][3] = 0.0f;
  bar_sync(kBarCons, kConsumers);  // Q̃ stored

  for (int i = 0; i < n_tiles; ++i) {
    const int b = i % kStages;
    const int n = static_cast<int>(min(int64_t{kTile}, k_end - k_begin - static_cast<int64_t>(i) * kTile));
    bar_sync_stage(kBarFull, b);
    const __nv_bfloat16 *kh_s = k_hi(b), *kl_s = k_lo(b);

    // 1. S partial of heads r0, r0 + 8 x the tile's 16 keys over dims d0 .. d0 + kQDims; hi·hi and the cross terms
    // in separate accumulators (4 independent mma chains, the small terms summed among themselves first).
    {
      constexpr int kNtS = kHg;  // n8 key tiles a warp: 2 (all 16 keys) or 1 (its half)
      float sacc[kNtS][4] = {}, sx[kNtS][4] = {};
#pragma unroll
      for (int ks = 0; ks < kQDims / 16; ++ks) {
        uint32_t ah[4], al[4], bh[4], bl[4];
        const int dq = d0 + ks * 16;
        const int a_at = (hg * 16 + (lane & 15)) * L::kLd + dq + (lane >> 4) * 8;
        ldmatrix_x4(ah, q_hi + a_at);
        ldmatrix_x4(al, q_lo + a_at);
        if constexpr (kHg == 2) {
          // Keys 8·(lane >> 4) + (lane & 7), dims +8 for lanes 8-15 and 24-31: b0, b1 of n-tiles 0 and 1.
          const int b_at = ((lane >> 4) * 8 + (lane & 7)) * L::kLd + dq + ((lane >> 3) & 1) * 8;
          ldmatrix_x4(bh, kh_s + b_at);
          if constexpr (!kBf16) ldmatrix_x4(bl, kl_s + b_at);
        } else {
          // Keys 8·kh + (lane & 7), dims +8 for lanes 8-15: b0, b1 of the warp's n-tile, hi (lanes 0-15) and lo
          // (lanes 16-31) in one load (hi alone from a bf16 pool).
          const int b_at = (kh * 8 + (lane & 7)) * L::kLd + dq + ((lane >> 3) & 1) * 8;
          if constexpr (kBf16) {
            uint32_t b2[2];
            ldmatrix_x2(b2, kh_s + b_at);
            bh[0] = b2[0], bh[1] = b2[1];
          } else {
            uint32_t b4[4];
            ldmatrix_x4(b4, (lane < 16 ? kh_s : kl_s) + b_at);
            bh[0] = b4[0], bh[1] = b4[1], bl[0] = b4[2], bl[1] = b4[3];
          }
        }
#pragma unroll
        for (int nt = 0; nt < kNtS; ++nt) {
          // A bf16 pool's keys have no lo terms: the q-hi x k-lo products are zeros, left out (the same sums).
          if constexpr (!kBf16) mma_bf16(sx[nt], ah, bl[2 * nt], bl[2 * nt + 1]);
          mma_bf16(sx[nt], al, bh[2 * nt], bh[2 * nt + 1]);
          mma_bf16(sacc[nt], ah, bh[2 * nt], bh[2 * nt + 1]);
        }
      }
      float* sq = s_s + qd * kBlockHeads * L::kSLd;
#pragma unroll
      for (int nt = 0; nt < kNtS; ++nt) {
        const int col = (kh + nt) * 8 + 2 * tq;
        *reinterpret_cast<float2*>(sq + r0 * L::kSLd + col) =
            make_float2(sacc[nt][0] + sx[nt][0], sacc[nt][1] + sx[nt][1]);
        *reinterpret_cast<float2*>(sq + (r0 + 8) * L::kSLd + col) =
            make_float2(sacc[nt][2] + sx[nt][2], sacc[nt][3] + sx[nt][3]);
      }
    }
    bar_sync(kBarCons, kConsumers);

    // 2. Online softmax of row srow over keys 2·seg, 2·seg + 1 (keys >= n are padding). A row's 8 threads are 8
    // consecutive lanes; with one head group warps 4-7 have no row.
    if (srow < kBlockHeads) {
      float2 part[kQuarters];
#pragma unroll
      for (int q = 0; q < kQuarters; ++q)
        part[q] = *reinterpret_cast<const float2*>(s_s + (q * kBlockHeads + srow) * L::kSLd + seg * 2);
      static_assert(kQuarters == 4, "the partials' sum order below");
      float x[2];
      x[0] = (((part[0].x + part[1].x) + part[2].x) + part[3].x) * p.scale;
      x[1] = (((part[0].y + part[1].y) + part[2].y) + part[3].y) * p.scale;
      float mx = m_run;
#pragma unroll
      for (int c = 0; c < 2; ++c)
        if (seg * 2 + c < n) mx = fmaxf(mx, x[c]);
#pragma unroll
      for (int o = 1; o < 8; o <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      const float corr = expf(m_run - mx);  // m = −inf before the first key: 0
      float w[2], sum = 0.0f;
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        w[c] = seg * 2 + c < n ? expf(x[c] - mx) : 0.0f;
        sum += w[c];
      }
#pragma unroll
      for (int o = 1; o < 8; o <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
      l_run = l_run * corr + sum;
      m_run = mx;
      uint32_t h, l;
      split_pair(w[0], w[1], h, l);
      *reinterpret_cast<uint32_t*>(p_hi + srow * L::kPLd + seg * 2) = h;
      *reinterpret_cast<uint32_t*>(p_lo + srow * L::kPLd + seg * 2) = l;
      if (seg == 0) corr_s[srow] = corr;
    }
    bar_sync(kBarCons, kConsumers);

    // 3. Ō[32 heads][the warp's dims] = Ō · corr + P · C. ldmatrix.trans lanes: keys (lane & 15) in two 8-row
    // matrices, dims +8 for lanes 16-31: registers 0-1 are n-tile 2·pr's b0 / b1, 2-3 n-tile 2·pr + 1's.
    {
      float c[kHg][2];
      bool grew = false;
#pragma unroll
      for (int m = 0; m < kHg; ++m) {
        c[m][0] = corr_s[m * 16 + g];
        c[m][1] = corr_s[m * 16 + g + 8];
        grew = grew || c[m][0] != 1.0f || c[m][1] != 1.0f;
      }
      // corr is exactly 1 where a head's max did not grow (expf(0)): with lazy_rescale the warp skips the
      // multiplications when that holds for all the block's heads, the same bits.
      if (!p.lazy_rescale || __any_sync(0xffffffffu, grew)) {
#pragma unroll
        for (int m = 0; m < kHg; ++m)
#pragma unroll
          for (int j = 0; j < kNt; ++j) {
            acc[m][j][0] *= c[m][0];
            acc[m][j][1] *= c[m][0];
            acc[m][j][2] *= c[m][1];
            acc[m][j][3] *= c[m][1];
          }
      }
      uint32_t ah[kHg][4], al[kHg][4];
#pragma unroll
      for (int m = 0; m < kHg; ++m) {
        const int at = (m * 16 + (lane & 15)) * L::kPLd + (lane >> 4) * 8;
        ldmatrix_x4(ah[m], p_hi + at);
        ldmatrix_x4(al[m], p_lo + at);
      }
      const int key = lane & 15;
#pragma unroll
      for (int pr = 0; pr < kNt / 2; ++pr) {
        const int dim = od0 + pr * 16 + (lane >> 4) * 8;
        uint32_t bh[4], bl[4];
        ldmatrix_x4_trans(bh, kh_s + key * L::kLd + dim);
        if constexpr (kBf16) {
#pragma unroll
          for (int m = 0; m < kHg; ++m) {
            mma2(acc[m][2 * pr], ah[m], al[m], bh[0], bh[1]);
            mma2(acc[m][2 * pr + 1], ah[m], al[m], bh[2], bh[3]);
          }
        } else {
          ldmatrix_x4_trans(bl, kl_s + key * L::kLd + dim);
#pragma unroll
          for (int m = 0; m < kHg; ++m) {
            mma3(acc[m][2 * pr], ah[m], al[m], bh[0], bh[1], bl[0], bl[1]);
            mma3(acc[m][2 * pr + 1], ah[m], al[m], bh[2], bh[3], bl[2], bl[3]);
          }
        }
      }
    }
    // Buffer b is free once every consumer is past its O phase; the producers wait for it only while tiles remain
    // (an arrival nobody waits for would be left pending at exit).
    if (i + kStages < n_tiles) bar_arrive_stage(kBarEmpty, b);
  }

  // The running max / sum live with the softmax threads; the Ō fragments with the mma lanes. A query with a bad
  // sequence or position gets NaN partials (the SIMT attend's poison).
  if (seg == 0 && srow < kBlockHeads) {
    fin_m[srow] = m_run;
    fin_l[srow] = l_run;
  }
  bar_sync(kBarCons, kConsumers);
  const bool bad_query = table == nullptr;
  const float poison = __int_as_float(0x7fc00000);
#pragma unroll
  for (int mh = 0; mh < 2 * kHg; ++mh) {
    const int mt = mh / 2, hh = mh % 2;
    const int r = mt * 16 + g + 8 * hh, h = hb + r;
    if (h >= p.heads) continue;
    const int64_t at = (t * p.heads + h) * p.splits + split;
    if (warp == 0 && tq == 0) {
      p.part_m[at] = fin_m[r];
      p.part_l[at] = bad_query ? poison : fin_l[r];
    }
    float* dst = p.part_o + at * kR;
#pragma unroll
    for (int j = 0; j < kNt; ++j) {
      const int dim = od0 + j * 8 + 2 * tq;
      const float2 v =
          bad_query ? make_float2(poison, poison) : make_float2(acc[mt][j][2 * hh], acc[mt][j][2 * hh + 1]);
      *reinterpret_cast<float2*>(dst + dim) = v;
    }
  }
}

constexpr int kV3R = 512, kV3Dr = 64;

}  // namespace

bool paged_mla_mma_takes(int64_t r, int64_t dr, size_t smem_per_block_optin) {
  static_assert(Layout<kV3R, kV3Dr, 1>::bytes < Layout<kV3R, kV3Dr, 2>::bytes);
  return r == kV3R && dr == kV3Dr && Layout<kV3R, kV3Dr, 2>::bytes <= smem_per_block_optin;
}

int paged_mla_mma_block_heads(int64_t heads, bool narrow) { return narrow && heads <= 16 ? 16 : 32; }

bool paged_mla_mma_two_blocks(bool choice, bool kv_bf16, int block_heads) {
  static_assert(2 * (Layout<kV3R, kV3Dr, 1, true>::bytes + 1024) <= 228 * 1024, "two blocks' shared memory an SM");
  return choice && kv_bf16 && block_heads == 16;
}

int paged_mla_mma_splits(int64_t tokens, int64_t heads, int64_t max_keys, int sm_count, int block_heads,
                         int blocks_per_sm) {
  const int64_t blocks = std::max<int64_t>(1, tokens * ceil_div(heads, block_heads));
  const int64_t want = std::max<int64_t>(1, int64_t{blocks_per_sm} * sm_count / blocks);
  return static_cast<int>(
      std::max<int64_t>(1, std::min<int64_t>({want, ceil_div(max_keys, kPagedMlaSplitKeys), kPagedMlaMaxSplits})));
}

void launch_paged_mla_attend_mma(const PagedMlaKernelParams& p, cudaStream_t stream) {
  DI_CHECK_INTERNAL(p.r == kV3R && p.dr == kV3Dr)
      << "paged_mla_attention: no tensor-core kernel for latent " << p.r << " + rope " << p.dr;
  DI_CHECK_INTERNAL(p.mma_block_heads == 16 || p.mma_block_heads == 32)
      << "paged_mla_attention: " << p.mma_block_heads << " heads a block";
  auto launch = [&](auto kernel, size_t smem) {
    DI_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    // Head groups fastest: a token's four blocks (V3) run side by side and share the cache rows through L2.
    const dim3 grid(static_cast<unsigned>(ceil_div(p.heads, int64_t{p.mma_block_heads})),
                    static_cast<unsigned>(p.tokens), static_cast<unsigned>(p.splits));
    kernel<<<grid, kThreads, smem, stream>>>(p);
    DI_CUDA_CHECK_LAUNCH();
  };
  if (p.two_blocks) {
    DI_CHECK_INTERNAL(p.kv_bf16 && p.mma_block_heads == 16) << "paged_mla_attention: two blocks an SM need a bf16 pool";
    auto* kernel = paged_mla_attend_mma_kernel<kV3R, kV3Dr, 1, false, true, 2>;
    // Both blocks' shared memory: the largest carveout (the default may leave room for one).
    DI_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared));
    launch(kernel, Layout<kV3R, kV3Dr, 1, true>::bytes);
    return;
  }
  auto by_pool = [&](auto f32_kernel, auto bf16_kernel, size_t f32_smem, size_t bf16_smem) {
    if (p.kv_bf16)
      launch(bf16_kernel, bf16_smem);
    else
      launch(f32_kernel, f32_smem);
  };
  if (p.mma_block_heads == 16 && p.producer_ahead)
    by_pool(paged_mla_attend_mma_kernel<kV3R, kV3Dr, 1, true, false>,
            paged_mla_attend_mma_kernel<kV3R, kV3Dr, 1, true, true>, Layout<kV3R, kV3Dr, 1>::bytes,
            Layout<kV3R, kV3Dr, 1, true>::bytes);
  else if (p.mma_block_heads == 16)
    by_pool(paged_mla_attend_mma_kernel<kV3R, kV3Dr, 1, false, false>,
            paged_mla_attend_mma_kernel<kV3R, kV3Dr, 1, false, true>, Layout<kV3R, kV3Dr, 1>::bytes,
            Layout<kV3R, kV3Dr, 1, true>::bytes);
  else
    by_pool(paged_mla_attend_mma_kernel<kV3R, kV3Dr, 2, false, false>,
            paged_mla_attend_mma_kernel<kV3R, kV3Dr, 2, false, true>, Layout<kV3R, kV3Dr, 2>::bytes,
            Layout<kV3R, kV3Dr, 2, true>::bytes);
}

}  // namespace deepinfer::cuda
