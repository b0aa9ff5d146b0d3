// Tensor-core paged sink attention for prefill-like calls (attention_paged_mma.h says when it is chosen).
//
// V4 attention is MQA-like: every head of a query attends to the same key rows, and the values are those rows
// too. So a block takes one query token and 32 of its heads as the M dimension of mma.sync m16n8k16 and runs
// FlashMLA-style math per token: S = Q[32 x hd] · K[32 keys x hd]ᵀ, online softmax, O += P · K, tile by tile.
// Each key row is read from global memory once per (token, 32 heads) instead of once per 8 heads, and the
// products run on the tensor cores instead of the fp32 pipes.
//
// Accuracy (the CUDA path is held to the fp32 CPU op): every operand is split x = hi + lo, both bf16 (hi =
// RN(x), lo = RN(x − hi): |x − hi − lo| <= 2^-16 |x|), and each product is hi·hi + hi·lo + lo·hi accumulated in
// fp32 (lo·lo, <= 2^-16 |xy|, is dropped). A product is therefore off by at most 3·2^-16 ≈ 4.6e-5 of |x||y|,
// with random signs over a dot product. Emulated on the CPU (torch: exact products of the bf16 parts; uniform
// (-1, 1) q and keys, 16-128 heads of 64-512, 5-2048 keys, sinks in (-1, 2)): the output's norm-relative error
// against fp64 is 3.7e-6 to 4.4e-6, of which O = P·K gives 3.7e-6 (an average of many random rows cancels, so
// its relative error grows) and S 1.3e-6; the fp32 SIMT kernel and the CPU op sit at 2-3e-7. The GPU tests hold
// this kernel to 2e-5 against the CPU op. 3xTF32 would be ~60x more accurate (5.8e-8 emulated) at twice the mma
// count (m16n8k8), the fallback if a model-level check ever needs it.
// (Skipping the hi·lo mmas of bf16-exact key tiles, the same bits, measured slower on the H200 — 2.41-2.64 vs
// 2.22 ms, and 2.50 vs 2.32 ms for a per-warp vote — and was removed, as was the next tile's compaction during the
// loads, which gained nothing: 2.323 vs 2.304 ms without it.)
//
// Block: 12 warps, 32 heads (why 32 and not all 64: below).
// - Warps 8-11 produce, one 32-key tile ahead, into two shared key buffers: warp 8 compacts the query's key
//   slots (window positions, then the selected compressed entries; invalid ones skipped) into row pointers, then
//   all 128 threads load the tile's rows (fp32, one memory round trip: 32 float4 a thread at hd 512) and, once
//   the consumers have released that buffer, store them split into hi / lo bf16; then warp 8 compacts the next
//   tile. Missing rows of a short tile are zeros: P is 0 there, and 0 · NaN would poison O.
// - Warps 0-7 consume: (head group hg = warp % 2: heads 16·hg .. 16·hg + 15) x (quarter qd = warp / 2: dims
//   qd·hd/4 .. (qd+1)·hd/4). Per tile: (1) S partial over the warp's dims for all 32 keys -> shared memory;
//   (2) softmax, 8 threads per head row: the four partials summed in a fixed order, fp32 online max / sum in
//   registers (the SIMT kernel's formulas), P = exp(s − m) split into hi / lo bf16, the row's rescale factor;
//   (3) O += P · K for all 32 heads x hd/8 dims a warp at hd >= 128 (64 fp32 registers at hd 512; each K
//   fragment, transposed by ldmatrix.trans, feeds both head tiles), at hd 64 the S phase's 16 heads x hd/4.
//   Fragments by ldmatrix (32-bit fragment loads with one head tile a warp in the O phase measured 2.42 vs
//   2.22 ms and were removed).
// - Hand-over by named barriers, per buffer: kFull (producers arrive, consumers wait) and kEmpty (consumers
//   arrive after their O phase, producers wait before overwriting).
// Why 32 heads: the two key buffers (65 KB each at hd 512) and Q (65 KB) fit the 227 KB of shared memory only
// with 32 heads of Q; with 64 heads one buffer fits, its loads cannot overlap the math, and 16 heads x 256 dims
// of O a warp (128 registers) spilled at the 168-register cap that 12 warps (3 per SM sub-partition, 16K
// registers each) impose. Each key row is then read once per 32 heads, still 4x fewer reads than the SIMT kernel.
// ptxas -v (sm_90a, CUDA 13.0): 168 registers at hd 512 (the cap), 135 at hd 256, no spills; at hd 128 / 64 (no
// model's shape) ptxas picks 80 / 56 registers and spills 12 / 8 bytes; shared memory 226,192 bytes at hd 512 (one
// block an SM).
// The end is the SIMT kernel's: with one split the sink joins the denominator and o is written; otherwise the
// unnormalised partial (o, m, l) of the split goes to the combine.
// bf16 pools (kBf16, --kv-cache-dtype bf16): the producers read half the bytes and widen them; a bf16 key's lo part
// is zero, so its lo buffer is never stored and the S and O phases drop the products with it (two mmas instead of
// three): the f32 pool's sums of the same values without their zero products, the same bits.
// V4.1's records (kRecords, --kv-cache-dtype fp8): the producers decode them (slot_load4) and the rest is the f32
// pools' kernel. Their values have at most 6 significant bits, so the lo planes are zero too except below bf16's
// subnormal range (an FP8 code times 2^-127 can be 2^-136): dropping them is left until a test shows those rows never
// occur.
#include <cuda_bf16.h>

#include <cstring>

#include "deepinfer/ops/cuda/attention_paged_mma.h"
#include "deepinfer/ops/cuda/attention_paged_slots.cuh"
#include "deepinfer/ops/cuda/cuda_runtime.h"
#include "deepinfer/ops/cuda/device_math.cuh"
#include "deepinfer/ops/cuda/gemm_decode.cuh"

namespace deepinfer::cuda {
namespace {

constexpr int kHeadGroups = 2;  // 16 heads each: the mma M dimension
constexpr int kBlockHeads = 16 * kHeadGroups;
constexpr int kQuarters = 4;     // consumer warps per head group, each a quarter of the head dim
constexpr int kTile = 32;        // key rows per tile: one compaction pass of 32 lanes fills at most one tile
constexpr int kConsumers = 256;  // 8 warps: (head group, quarter)
constexpr int kProducers = 128;  // 4 warps, 4 threads a key row
constexpr int kThreads = kConsumers + kProducers;
// Named barriers (0 is __syncthreads'): kFull + b / kEmpty + b hand key buffer b between the two sides
// (bar.arrive on one, bar.sync on the other); kCons and kProd order each side's own shared memory.
constexpr int kBarFull = 1, kBarEmpty = 3, kBarCons = 5, kBarProd = 6;
constexpr unsigned kFull = 0xffffffffu;

template <int kHd>
struct Layout {
  // +8 bf16 (16 bytes) a row: the 8 rows of a fragment load or an ldmatrix phase fall in distinct bank groups.
  static constexpr int kLd = kHd + 8;
  // S partials: 40 floats a row (8 words mod 32) make the mma lanes' float2 stores (rows g, words 2·tq) fill each
  // half-warp's 32 banks once, and keep the softmax's float4 rows 16-byte aligned.
  static constexpr int kSLd = kTile + 8;
  static constexpr int kPLd = kTile + 8;
  static constexpr size_t kKeyBuf = size_t{2} * kTile * kLd;  // bytes of one hi or lo key tile
  static constexpr size_t q_hi = 0;
  static constexpr size_t q_lo = q_hi + size_t{2} * kBlockHeads * kLd;
  static constexpr size_t k_hi = q_lo + size_t{2} * kBlockHeads * kLd;  // [2 buffers]
  static constexpr size_t k_lo = k_hi + 2 * kKeyBuf;                    // [2 buffers]
  static constexpr size_t s = k_lo + 2 * kKeyBuf;                       // [quarter][head][key] fp32 partials
  static constexpr size_t p_hi = s + size_t{4} * kQuarters * kBlockHeads * kSLd;
  static constexpr size_t p_lo = p_hi + size_t{2} * kBlockHeads * kPLd;
  static constexpr size_t corr = p_lo + size_t{2} * kBlockHeads * kPLd;
  static constexpr size_t fin_m = corr + size_t{4} * kBlockHeads;
  static constexpr size_t fin_l = fin_m + size_t{4} * kBlockHeads;
  static constexpr size_t rows = fin_l + size_t{4} * kBlockHeads;  // [2][kTile] row pointers (producers)
  // int [2] compacted rows, [2] rows in buffer b
  static constexpr size_t count = rows + sizeof(void*) * 2 * kTile;
  static constexpr size_t bytes = count + 16;
  static_assert(kHd % 64 == 0 && kHd <= 512, "head dim");
  static_assert(k_hi % 16 == 0 && s % 16 == 0 && p_hi % 16 == 0 && corr % 16 == 0 && rows % 16 == 0,
                "16-byte aligned regions");
  static_assert(bytes <= 227 * 1024, "sm_90's opt-in shared memory a block (more would fall back to SIMT)");
};

// Barrier id + b (b in {0, 1}) with the id a constant on each path: a register id makes ptxas reserve all 16.
__device__ __forceinline__ void bar_sync_pair(int id, int b, int threads) {
  if (b)
    bar_sync(id + 1, threads);
  else
    bar_sync(id, threads);
}
__device__ __forceinline__ void bar_arrive_pair(int id, int b, int threads) {
  if (b)
    bar_arrive(id + 1, threads);
  else
    bar_arrive(id, threads);
}

__device__ __forceinline__ void store_split4(const float4 v, __nv_bfloat16* hi, __nv_bfloat16* lo) {
  uint2 h, l;
  split4(v, h, l);
  *reinterpret_cast<uint2*>(hi) = h;
  *reinterpret_cast<uint2*>(lo) = l;
}

// Consumers: fragments by ldmatrix, and in the O phase each warp takes both head tiles x hd/8 dims (hd >= 128),
// so each K fragment feeds both. (Head groups 0 / 1 on warps 0-3 / 4-7 with their own barriers, so that one
// group's softmax could overlap the other's mmas, measured no faster on the H200 and was removed.)
template <int kHd, SlotPools kPools>
__global__ void __launch_bounds__(kThreads) paged_attention_mma_kernel(PagedSinkAttentionKernelParams p) {
  using L = Layout<kHd>;
  constexpr bool kBf16 = kPools == SlotPools::kBf16;  // keys exact in bf16: no lo planes
  extern __shared__ __align__(16) uint8_t smem[];
  auto* q_hi = reinterpret_cast<__nv_bfloat16*>(smem + L::q_hi);
  auto* q_lo = reinterpret_cast<__nv_bfloat16*>(smem + L::q_lo);
  auto* s_s = reinterpret_cast<float*>(smem + L::s);
  auto* p_hi = reinterpret_cast<__nv_bfloat16*>(smem + L::p_hi);
  auto* p_lo = reinterpret_cast<__nv_bfloat16*>(smem + L::p_lo);
  auto* corr_s = reinterpret_cast<float*>(smem + L::corr);
  auto* fin_m = reinterpret_cast<float*>(smem + L::fin_m);
  auto* fin_l = reinterpret_cast<float*>(smem + L::fin_l);
  auto* rows_s = reinterpret_cast<const void**>(smem + L::rows);
  auto* count_s = reinterpret_cast<int*>(smem + L::count);
  // Key buffer b: hi at k_hi(b), lo at k_lo(b), [kTile][kLd] bf16 each.
  auto k_hi = [&](int b) { return reinterpret_cast<__nv_bfloat16*>(smem + L::k_hi + b * L::kKeyBuf); };
  auto k_lo = [&](int b) { return reinterpret_cast<__nv_bfloat16*>(smem + L::k_lo + b * L::kKeyBuf); };

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t t = blockIdx.x;
  const int hb = static_cast<int>(blockIdx.y) * kBlockHeads;
  const int split = static_cast<int>(blockIdx.z);
  const PagedQuerySlots qs = paged_query_slots(p, t, split == 0 && blockIdx.y == 0 && tid == 0);
  const int64_t begin = min(qs.n_slots, static_cast<int64_t>(split) * p.slots_per_split);
  const int64_t end = min(qs.n_slots, begin + p.slots_per_split);
  constexpr int kRowVecs = kHd / 4;

  if (tid >= kConsumers) {
    // Producers. Tile i goes to buffer i % 2; its row pointers to pointer buffer i % 2 (warp 8 compacts tile
    // i + 1 while the other producer warps may still read tile i's pointers; kProd publishes them).
    static_assert(kProducers == 4 * kTile, "4 producer threads a key row");
    constexpr int kVecs = kRowVecs / 4;
    const int ptid = tid - kConsumers, pr = ptid / 4, pc = ptid % 4;
    int64_t cursor = begin;
    // Warp 8: the next valid slots, up to a tile, in slot order.
    auto gather = [&](int buf) {
      const void** rows = rows_s + buf * kTile;
      int count = 0;
      while (count < kTile && cursor < end) {
        const int64_t slot = cursor + lane;
        const void* mine = slot < end ? paged_slot_row(p, qs, t, slot) : nullptr;
        const unsigned valid = __ballot_sync(kFull, mine != nullptr);
        const int need = kTile - count, rank = __popc(valid & ((1u << lane) - 1u));
        if (mine && rank < need) rows[count + rank] = mine;
        if (__popc(valid) <= need) {
          count += __popc(valid);
          cursor += 32;
        } else {
          // The tile fills inside this pass: resume after its last row's slot.
          cursor += __ffs(__ballot_sync(kFull, mine && rank == need - 1));
          count = kTile;
        }
      }
      if (lane == 0) count_s[buf] = count;
    };
    if (warp == kConsumers / 32) gather(0);
    bar_sync(kBarProd, kProducers);
    for (int i = 0;; ++i) {
      const int b = i & 1, n = count_s[b];
      // Thread ptid owns row ptid / 4 (one pointer live, not 32) and its float4s ptid % 4 + 4·j: the 4 threads
      // of a row read 64 contiguous bytes per load.
      const void* row = pr < n ? rows_s[b * kTile + pr] : nullptr;
      // Records are fetched as codes and scale bytes and decoded after the wait (32 decoded float4 a thread spilled
      // at the 168-register cap, ptxas: 380 bytes at hd 512).
      constexpr bool kRecords = kPools == SlotPools::kRecords;
      float4 v[kRecords ? 1 : kVecs];
      RecordQuad raw[kRecords ? kVecs : 1];
      const auto u = reinterpret_cast<uintptr_t>(row);
      const PoolFormat fmt = u & 1 ? PoolFormat::kFp4E4m3B16 : PoolFormat::kFp8Ue8m0B32;  // tagged entries
#pragma unroll
      for (int j = 0; j < kVecs; ++j) {
        if constexpr (kRecords)
          raw[j] = row ? record_fetch4(reinterpret_cast<const void*>(u & ~uintptr_t{1}), pc + 4 * j, fmt, kHd)
                       : RecordQuad{0, 0};
        else
          v[j] = row ? slot_load4<kPools>(row, pc + 4 * j, kHd) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
      // Buffer b last held tile i - 2: wait for the consumers' O phase on it (also before count_s[2 + b], which
      // they read at that tile's start).
      if (i >= 2) bar_sync_pair(kBarEmpty, b, kThreads);
      if (n > 0) {
        __nv_bfloat16 *kh = k_hi(b), *kl = k_lo(b);
#pragma unroll
        for (int j = 0; j < kVecs; ++j) {
          const int at = pr * L::kLd + (pc + 4 * j) * 4;
          uint2 h, l;
          if constexpr (kRecords)  // a missing row's zero codes decode to zeros in either format
            split4(record_decode4(raw[j], fmt), h, l);
          else
            split4(v[j], h, l);
          *reinterpret_cast<uint2*>(kh + at) = h;
          if constexpr (!kBf16) *reinterpret_cast<uint2*>(kl + at) = l;
        }
      }
      if (ptid == 0) count_s[2 + b] = n;
      bar_arrive_pair(kBarFull, b, kThreads);
      if (n == 0) {
        // Pair the consumers' last release (tile i - 1, the other buffer) so that no barrier is left half-arrived.
        if (i >= 1) bar_sync_pair(kBarEmpty, b ^ 1, kThreads);
        return;
      }
      // Pointer buffer b ^ 1 was last read at the previous tile's start, before the kProd barrier that ended it.
      if (warp == kConsumers / 32) gather(b ^ 1);
      bar_sync(kBarProd, kProducers);
    }
  }

  // Consumers. Q of the block's heads (zeros past the last head), split once for every tile.
  for (int i = tid; i < kBlockHeads * kRowVecs; i += kConsumers) {
    const int r = i / kRowVecs, c = (i % kRowVecs) * 4, h = hb + r;
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (h < p.heads) v = __ldg(reinterpret_cast<const float4*>(p.q + (t * p.heads + h) * p.hd + c));
    store_split4(v, q_hi + r * L::kLd + c, q_lo + r * L::kLd + c);
  }

  const int g = lane >> 2, tq = lane & 3;
  const int hg = warp % kHeadGroups, qd = warp / kHeadGroups, r0 = hg * 16 + g;
  constexpr int kQDims = kHd / kQuarters;  // dims of this warp's quarter
  const int d0 = qd * kQDims;
  const int srow = tid >> 3, seg = tid & 7;  // softmax: head row, 4-key segment of the tile
  float m_run = -INFINITY, l_run = 0.0f;
  // O phase: warp -> head m-tiles og·kOM .. og·kOM + kOM − 1 x dims od0 .. od0 + kODims (kOM 1: the S phase's
  // (hg, qd); kOM 2: all 32 heads x an eighth of the dims).
  constexpr int kOM = kHd >= 128 ? 2 : 1;  // hd 64: an eighth is one n-tile
  constexpr int kOGroups = kHeadGroups / kOM, kODims = kHd * kOGroups / (kConsumers / 32);
  static_assert(kODims % 16 == 0, "O-phase dims a warp: whole ldmatrix pairs");
  const int og = kOM == 2 ? 0 : hg, opart = kOM == 2 ? warp : qd, od0 = opart * kODims;
  constexpr int kNt = kODims / 8;  // 8-dim n-tiles of this warp's part of O
  float acc[kOM][kNt][4];
#pragma unroll
  for (int m = 0; m < kOM; ++m)
#pragma unroll
    for (int j = 0; j < kNt; ++j) acc[m][j][0] = acc[m][j][1] = acc[m][j][2] = acc[m][j][3] = 0.0f;
  bar_sync(kBarCons, kConsumers);  // Q stored

  for (int i = 0;; ++i) {
    const int b = i & 1;
    bar_sync_pair(kBarFull, b, kThreads);
    const int n = count_s[2 + b];
    if (n == 0) break;
    const __nv_bfloat16 *kh = k_hi(b), *kl = k_lo(b);

    // 1. S partial of heads r0, r0 + 8 x all 32 keys over dims d0 .. d0 + kQDims. hi·hi and the cross terms in
    // separate accumulators: 8 independent mma chains a warp, the small terms summed among themselves first.
    {
      float sacc[4][4] = {}, sx[4][4] = {};
#pragma unroll
      for (int ks = 0; ks < kQDims / 16; ++ks) {
        uint32_t ah[4], al[4];
        // K fragments: bh[np][0..1] = b0, b1 of n-tile 2·np, bh[np][2..3] of n-tile 2·np + 1 (either load).
        // ldmatrix moves the same bytes as the 32-bit loads in 10 instructions a step instead of 24.
        uint32_t bh[2][4], bl[2][4];
        // ldmatrix lanes: A rows hg·16 + (lane & 15), dims +8 for lanes 16-31 (matrices a0..a3); K keys
        // 16·np + 8·(lane >> 4) + (lane & 7), dims +8 for lanes 8-15 and 24-31 (b0, b1 of two n-tiles).
        const int dq = d0 + ks * 16;
        const int a_at = (hg * 16 + (lane & 15)) * L::kLd + dq + (lane >> 4) * 8;
        ldmatrix_x4(ah, q_hi + a_at);
        ldmatrix_x4(al, q_lo + a_at);
#pragma unroll
        for (int np = 0; np < 2; ++np) {
          const int b_at = (np * 16 + (lane >> 4) * 8 + (lane & 7)) * L::kLd + dq + ((lane >> 3) & 1) * 8;
          ldmatrix_x4(bh[np], kh + b_at);
          if constexpr (!kBf16) ldmatrix_x4(bl[np], kl + b_at);
        }
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
          const uint32_t *b_h = bh[nt / 2] + 2 * (nt % 2), *b_l = bl[nt / 2] + 2 * (nt % 2);
          if constexpr (!kBf16) mma_bf16(sx[nt], ah, b_l[0], b_l[1]);
          mma_bf16(sx[nt], al, b_h[0], b_h[1]);
          mma_bf16(sacc[nt], ah, b_h[0], b_h[1]);
        }
      }
      float* sq = s_s + qd * kBlockHeads * L::kSLd;
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const int col = nt * 8 + 2 * tq;
        *reinterpret_cast<float2*>(sq + r0 * L::kSLd + col) =
            make_float2(sacc[nt][0] + sx[nt][0], sacc[nt][1] + sx[nt][1]);
        *reinterpret_cast<float2*>(sq + (r0 + 8) * L::kSLd + col) =
            make_float2(sacc[nt][2] + sx[nt][2], sacc[nt][3] + sx[nt][3]);
      }
    }
    bar_sync(kBarCons, kConsumers);

    // 2. Online softmax of row srow over keys 4·seg .. 4·seg + 3 (keys >= n are missing rows). The 8 threads of
    // a row are 8 consecutive lanes.
    {
      float x[4], mx = m_run;
      float4 part[kQuarters];  // the quarters' partials of the thread's 4 keys, one 16-byte load each
#pragma unroll
      for (int q = 0; q < kQuarters; ++q)
        part[q] = *reinterpret_cast<const float4*>(s_s + (q * kBlockHeads + srow) * L::kSLd + seg * 4);
      static_assert(kQuarters == 4, "the partials' sum order below");
      const float4 q0 = part[0], q1 = part[1], q2 = part[2], q3 = part[3];
      x[0] = (((q0.x + q1.x) + q2.x) + q3.x) * p.scale;
      x[1] = (((q0.y + q1.y) + q2.y) + q3.y) * p.scale;
      x[2] = (((q0.z + q1.z) + q2.z) + q3.z) * p.scale;
      x[3] = (((q0.w + q1.w) + q2.w) + q3.w) * p.scale;
#pragma unroll
      for (int c = 0; c < 4; ++c)
        if (seg * 4 + c < n) mx = fmaxf(mx, x[c]);
#pragma unroll
      for (int o = 1; o < 8; o <<= 1) mx = fmaxf(mx, __shfl_xor_sync(kFull, mx, o));
      const float corr = expf(m_run - mx);  // m = −inf before the first key: 0
      float w[4], sum = 0.0f;
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        w[c] = seg * 4 + c < n ? expf(x[c] - mx) : 0.0f;
        sum += w[c];
      }
#pragma unroll
      for (int o = 1; o < 8; o <<= 1) sum += __shfl_xor_sync(kFull, sum, o);
      l_run = l_run * corr + sum;
      m_run = mx;
      uint2 h, l;
      split_pair(w[0], w[1], h.x, l.x);
      split_pair(w[2], w[3], h.y, l.y);
      *reinterpret_cast<uint2*>(p_hi + srow * L::kPLd + seg * 4) = h;
      *reinterpret_cast<uint2*>(p_lo + srow * L::kPLd + seg * 4) = l;
      if (seg == 0) corr_s[srow] = corr;
    }
    bar_sync(kBarCons, kConsumers);

    // 3. O[heads][the warp's dims] = O · corr + P · K. ldmatrix.trans lanes: keys 16·ks + (lane & 15) in two
    // 8-row matrices, dims +8 for lanes 16-31: registers 0-1 are n-tile 2·pr's b0 / b1, 2-3 n-tile 2·pr + 1's.
    // With kOM 2 each K fragment feeds both head tiles, so K^T crosses shared memory once a tile instead of once
    // per head group (PV's shared-memory bytes 144 -> 96 KB a tile at hd 512, ldmatrix count halved). Every O
    // element sees the same corr and the same mma sequence (ks, then hi·lo, lo·hi, hi·hi) at the same row of its
    // m-tile either way: the same bits.
    {
#pragma unroll
      for (int m = 0; m < kOM; ++m) {
        const int r = (og * kOM + m) * 16 + g;
        const float c0 = corr_s[r], c1 = corr_s[r + 8];
#pragma unroll
        for (int j = 0; j < kNt; ++j) {
          acc[m][j][0] *= c0;
          acc[m][j][1] *= c0;
          acc[m][j][2] *= c1;
          acc[m][j][3] *= c1;
        }
      }
#pragma unroll
      for (int ks = 0; ks < kTile / 16; ++ks) {
        uint32_t ah[kOM][4], al[kOM][4];
#pragma unroll
        for (int m = 0; m < kOM; ++m) {
          const int at = ((og * kOM + m) * 16 + (lane & 15)) * L::kPLd + ks * 16 + (lane >> 4) * 8;
          ldmatrix_x4(ah[m], p_hi + at);
          ldmatrix_x4(al[m], p_lo + at);
        }
        const int key = ks * 16 + (lane & 15);
#pragma unroll
        for (int pr = 0; pr < kNt / 2; ++pr) {
          const int dim = od0 + pr * 16 + (lane >> 4) * 8;
          uint32_t bh[4], bl[4];
          ldmatrix_x4_trans(bh, kh + key * L::kLd + dim);
          if constexpr (!kBf16) ldmatrix_x4_trans(bl, kl + key * L::kLd + dim);
#pragma unroll
          for (int m = 0; m < kOM; ++m) {
            if constexpr (kBf16) {
              mma2(acc[m][2 * pr], ah[m], al[m], bh[0], bh[1]);
              mma2(acc[m][2 * pr + 1], ah[m], al[m], bh[2], bh[3]);
            } else {
              mma3(acc[m][2 * pr], ah[m], al[m], bh[0], bh[1], bl[0], bl[1]);
              mma3(acc[m][2 * pr + 1], ah[m], al[m], bh[2], bh[3], bl[2], bl[3]);
            }
          }
        }
      }
    }
    bar_arrive_pair(kBarEmpty, b, kThreads);  // key buffer b is free; S and P are guarded by kCons and kFull
  }

  // The running max / sum live with the softmax threads; the O fragments with the mma lanes.
  if (seg == 0) {
    fin_m[srow] = m_run;
    fin_l[srow] = l_run;
  }
  bar_sync(kBarCons, kConsumers);
#pragma unroll
  for (int mh = 0; mh < 2 * kOM; ++mh) {
    const int mt = mh / 2, hh = mh % 2;
    const int r = (og * kOM + mt) * 16 + g + 8 * hh, h = hb + r;
    if (h >= p.heads) continue;
    const float m = fin_m[r], l = fin_l[r];
    const int64_t th = t * p.heads + h;
    float mul = 1.0f;
    float* dst;
    if (p.splits == 1 && !p.always_combine) {
      // The sink joins the denominator only: out = Σ w·v / (Σ w + exp(sink − M)) with M = max(m, sink).
      const float sink = p.sinks[h], mx = fmaxf(m, sink);
      mul = expf(m - mx) / (l * expf(m - mx) + expf(sink - mx));
      dst = p.out + th * p.hd;
    } else {
      const int64_t at = th * p.splits + split;
      dst = p.part_o + at * p.hd;
      if (opart == 0 && tq == 0) {
        p.part_m[at] = m;
        p.part_l[at] = l;
      }
    }
#pragma unroll
    for (int j = 0; j < kNt; ++j) {
      const int dim = od0 + j * 8 + 2 * tq;
      *reinterpret_cast<float2*>(dst + dim) = make_float2(acc[mt][j][2 * hh] * mul, acc[mt][j][2 * hh + 1] * mul);
    }
  }
}

template <int kHd, SlotPools kPools>
void launch_pools(const PagedSinkAttentionKernelParams& p, cudaStream_t stream) {
  constexpr size_t smem = Layout<kHd>::bytes;
  DI_CUDA_CHECK(cudaFuncSetAttribute(paged_attention_mma_kernel<kHd, kPools>,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  const dim3 grid(static_cast<unsigned>(p.tokens), static_cast<unsigned>(ceil_div(p.heads, kBlockHeads)),
                  static_cast<unsigned>(p.splits));
  paged_attention_mma_kernel<kHd, kPools><<<grid, kThreads, smem, stream>>>(p);
  DI_CUDA_CHECK_LAUNCH();
}

template <int kHd>
void launch(const PagedSinkAttentionKernelParams& p, cudaStream_t stream) {
  switch (slot_pools_of(p)) {
    case SlotPools::kF32:
      launch_pools<kHd, SlotPools::kF32>(p, stream);
      break;
    case SlotPools::kBf16:
      launch_pools<kHd, SlotPools::kBf16>(p, stream);
      break;
    case SlotPools::kRecords:
      launch_pools<kHd, SlotPools::kRecords>(p, stream);
      break;
  }
}

size_t smem_bytes(int64_t hd) {
  switch (hd) {
    case 512:
      return Layout<512>::bytes;
    case 256:
      return Layout<256>::bytes;
    case 128:
      return Layout<128>::bytes;
    case 64:
      return Layout<64>::bytes;
    default:
      return 0;
  }
}

}  // namespace

bool paged_attention_use_mma(const PagedSinkAttentionKernelParams& p) {
  // Every supported call (batch-invariant mode too: always_combine, fixed 256-slot splits, partials always merged; a
  // query's partial of a split depends only on that split's own slots).
  if (p.mma == KernelPick::kNever) return false;
  const size_t smem = smem_bytes(p.hd);
  return smem > 0 && p.heads % 16 == 0 && smem <= smem_optin_or_current(p.smem_optin);
}

void launch_paged_attention_mma(const PagedSinkAttentionKernelParams& p, cudaStream_t stream) {
  switch (p.hd) {
    case 512:
      launch<512>(p, stream);
      break;
    case 256:
      launch<256>(p, stream);
      break;
    case 128:
      launch<128>(p, stream);
      break;
    case 64:
      launch<64>(p, stream);
      break;
    default:
      DI_CHECK_INTERNAL(false) << "paged_sink_attention: no tensor-core kernel for head dim " << p.hd;
  }
}

}  // namespace deepinfer::cuda
