// Tensor-core paged sink attention for prefill-like calls (attention_paged_mma.h says when it is chosen).
//
// V4 attention is MQA-like: every head of a query attends to the same key rows, and the values are those rows
// too. So a block takes one query token and 64 of its heads as the M dimension of mma.sync m16n8k16 and runs
// FlashMLA-style math per token: S = Q[64 x hd] · K[32 keys x hd]ᵀ, online softmax, O += P · K, tile by tile.
// Each key row is read from global memory once per (token, 64 heads) instead of once per 8 heads, and the
// products run on the tensor cores instead of the fp32 pipes.
//
// Accuracy (the CUDA path is held to the fp32 CPU op): every operand is split x = hi + lo, both bf16 (hi =
// RN(x), lo = RN(x − hi): |x − hi − lo| <= 2^-16 |x|), and each product is hi·hi + hi·lo + lo·hi accumulated in
// fp32 (lo·lo, <= 2^-16 |xy|, is dropped). A product is therefore off by at most 3·2^-16 ≈ 4.6e-5 of |x||y|,
// with random signs over a dot product. Emulated on the CPU (torch: exact products of the bf16 parts; uniform
// (-1, 1) q and keys, hd 512, 64 heads, 128 / 640 / 2048 keys, sinks in (-1, 2)): the output's norm-relative
// error against fp64 is 3.8e-6 to 4.4e-6, of which O = P·K gives 3.7e-6 (an average of many random rows cancels,
// so its relative error grows) and S 1.3e-6; the fp32 SIMT kernel and the CPU op sit at 2-3e-7. The GPU tests
// hold this kernel to 2e-5 against the CPU op. 3xTF32 would be ~60x more accurate (5.8e-8 emulated) at twice the
// mma count (m16n8k8), the fallback if a model-level golden test ever needs it.
//
// Block: 9 warps. Warp 8 is the producer: it compacts the query's key slots (window positions, then the
// selected compressed entries; invalid ones skipped) into row pointers, one 32-key tile ahead, double-buffered,
// so its dependent index -> block-table -> row loads overlap the consumers' math. Warps 0-7 are consumers:
// (head group hg = warp % 4: heads 16·hg..16·hg+15) x (half = warp / 4). Per tile they
//   1. load the 32 key rows (fp32, through the pointers) and store them split into hi / lo bf16 in shared memory
//      (missing rows as zeros: P is 0 there, and 0 · NaN would poison O);
//   2. S: warp (hg, half) computes 16 heads x keys 16·half..16·half+15 over all hd dims -> shared memory;
//   3. softmax: 4 threads per head row, fp32, running max / sum in registers (the SIMT kernel's formulas);
//      P = exp(s − m) split into hi / lo bf16 in shared memory, the row's rescale factor beside it;
//   4. O: warp (hg, half) keeps 16 heads x dims half·hd/2 .. (half+1)·hd/2 in registers (128 fp32 at hd 512) and
//      adds P · K, the K fragments transposed by ldmatrix.trans.
// Registers (ptxas -v, sm_90a): 9 warps put 3 on one SM sub-partition, whose 16K registers cap a thread at 168;
// hd 512 uses all 168 with 64 bytes of spills (a few O registers around the S phase, once a tile), hd 256 133 and
// hd 128 92 without. Shared memory at hd 512: 219,664 bytes (Q 130 KB, the key tile 65 KB), one block an SM.
// Q stays in shared memory, split once. The end is the SIMT kernel's: with one split the sink joins the
// denominator and o is written; otherwise the unnormalised partial (o, m, l) of the split goes to the combine.
#include <cuda_bf16.h>

#include <cstdlib>
#include <cstring>

#include "deepinfer/ops/cuda/attention_paged_mma.h"
#include "deepinfer/ops/cuda/attention_paged_slots.cuh"
#include "deepinfer/ops/cuda/cuda_runtime.h"
#include "deepinfer/ops/cuda/device_math.cuh"

namespace deepinfer::cuda {
namespace {

constexpr int kHeadGroups = 4;  // 16 heads each: the mma M dimension
constexpr int kBlockHeads = 16 * kHeadGroups;
constexpr int kTile = 32;  // key rows per tile: one producer pass of 32 lanes fills at most one tile
constexpr int kConsumers = 256;
constexpr int kThreads = kConsumers + 32;
constexpr int kBarAll = 1, kBarConsumers = 2;  // named barriers (0 is __syncthreads')
constexpr unsigned kFull = 0xffffffffu;

template <int kHd>
struct Layout {
  // +8 bf16 (16 bytes) a row: the 8 rows of a fragment load or an ldmatrix phase fall in distinct bank groups.
  static constexpr int kLd = kHd + 8;
  static constexpr int kSLd = kTile + 1;
  static constexpr int kPLd = kTile + 8;
  static constexpr size_t q_hi = 0;
  static constexpr size_t q_lo = q_hi + size_t{2} * kBlockHeads * kLd;
  static constexpr size_t k_hi = q_lo + size_t{2} * kBlockHeads * kLd;
  static constexpr size_t k_lo = k_hi + size_t{2} * kTile * kLd;
  static constexpr size_t s = k_lo + size_t{2} * kTile * kLd;
  static constexpr size_t p_hi = s + size_t{4} * kBlockHeads * kSLd;
  static constexpr size_t p_lo = p_hi + size_t{2} * kBlockHeads * kPLd;
  static constexpr size_t corr = p_lo + size_t{2} * kBlockHeads * kPLd;
  static constexpr size_t fin_m = corr + size_t{4} * kBlockHeads;
  static constexpr size_t fin_l = fin_m + size_t{4} * kBlockHeads;
  static constexpr size_t rows = fin_l + size_t{4} * kBlockHeads;    // [2][kTile] row pointers
  static constexpr size_t count = rows + sizeof(void*) * 2 * kTile;  // [2] rows in each buffer
  static constexpr size_t bytes = count + 16;
  static_assert(kHd % 64 == 0 && kHd <= 512, "head dim");
  static_assert(s % 16 == 0 && p_hi % 16 == 0 && corr % 16 == 0 && rows % 16 == 0, "16-byte aligned regions");
};

__device__ __forceinline__ void bar_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// (a, b) -> hi and lo bf16 pairs, a in the low half (the lower k or n index of an mma register).
__device__ __forceinline__ void split_pair(float a, float b, uint32_t& hi, uint32_t& lo) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  const float2 hf = __bfloat1622float2(h);
  const __nv_bfloat162 l = __floats2bfloat162_rn(a - hf.x, b - hf.y);
  std::memcpy(&hi, &h, 4);
  std::memcpy(&lo, &l, 4);
}

__device__ __forceinline__ void store_split4(const float4 v, __nv_bfloat16* hi, __nv_bfloat16* lo) {
  uint2 h, l;
  split_pair(v.x, v.y, h.x, l.x);
  split_pair(v.z, v.w, h.y, l.y);
  *reinterpret_cast<uint2*>(hi) = h;
  *reinterpret_cast<uint2*>(lo) = l;
}

__device__ __forceinline__ uint32_t ld32(const __nv_bfloat16* at) { return *reinterpret_cast<const uint32_t*>(at); }

// A fragment (16 x 16, row-major, leading dimension ld) with rows r0 / r0 + 8 and columns c / c + 8 for this lane.
__device__ __forceinline__ void frag_a(const __nv_bfloat16* base, int ld, int r0, int c, uint32_t (&a)[4]) {
  a[0] = ld32(base + r0 * ld + c);
  a[1] = ld32(base + (r0 + 8) * ld + c);
  a[2] = ld32(base + r0 * ld + c + 8);
  a[3] = ld32(base + (r0 + 8) * ld + c + 8);
}

__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// hi·hi + hi·lo + lo·hi, the small terms first.
__device__ __forceinline__ void mma3(float (&c)[4], const uint32_t (&ah)[4], const uint32_t (&al)[4], uint32_t bh0,
                                     uint32_t bh1, uint32_t bl0, uint32_t bl1) {
  mma(c, ah, bl0, bl1);
  mma(c, al, bh0, bh1);
  mma(c, ah, bh0, bh1);
}

// volatile keeps it between the same barriers (bar_sync is volatile asm too; the tile's plain C++ stores stay on
// their side through bar_sync's "memory" clobber); without a clobber of its own the compiler may still move the
// fragment loads and mmas around it.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const __nv_bfloat16* src) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(src));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

template <int kHd>
__global__ void __launch_bounds__(kThreads) paged_attention_mma_kernel(PagedSinkAttentionKernelParams p) {
  using L = Layout<kHd>;
  extern __shared__ __align__(16) uint8_t smem[];
  auto* q_hi = reinterpret_cast<__nv_bfloat16*>(smem + L::q_hi);
  auto* q_lo = reinterpret_cast<__nv_bfloat16*>(smem + L::q_lo);
  auto* k_hi = reinterpret_cast<__nv_bfloat16*>(smem + L::k_hi);
  auto* k_lo = reinterpret_cast<__nv_bfloat16*>(smem + L::k_lo);
  auto* s_s = reinterpret_cast<float*>(smem + L::s);
  auto* p_hi = reinterpret_cast<__nv_bfloat16*>(smem + L::p_hi);
  auto* p_lo = reinterpret_cast<__nv_bfloat16*>(smem + L::p_lo);
  auto* corr_s = reinterpret_cast<float*>(smem + L::corr);
  auto* fin_m = reinterpret_cast<float*>(smem + L::fin_m);
  auto* fin_l = reinterpret_cast<float*>(smem + L::fin_l);
  auto* rows_s = reinterpret_cast<const float**>(smem + L::rows);
  auto* count_s = reinterpret_cast<int*>(smem + L::count);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t t = blockIdx.x;
  const int hb = static_cast<int>(blockIdx.y) * kBlockHeads;
  const int split = static_cast<int>(blockIdx.z);
  const PagedQuerySlots qs = paged_query_slots(p, t, split == 0 && blockIdx.y == 0 && tid == 0);
  const int64_t begin = min(qs.n_slots, static_cast<int64_t>(split) * p.slots_per_split);
  const int64_t end = min(qs.n_slots, begin + p.slots_per_split);

  if (warp == kConsumers / 32) {
    // Producer: tile i's row pointers into buffer i % 2. Buffer b is read by the consumers' loads between
    // barrier i and their next consumer barrier, and rewritten only after barrier i + 1, which they reach after
    // finishing tile i. The last pass publishes an empty tile, which ends both loops.
    int64_t cursor = begin;
    for (int i = 0;; ++i) {
      const float** rows = rows_s + (i & 1) * kTile;
      int count = 0;
      while (count < kTile && cursor < end) {
        const int64_t slot = cursor + lane;
        const float* mine = slot < end ? paged_slot_row(p, qs, t, slot) : nullptr;
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
      if (lane == 0) count_s[i & 1] = count;
      bar_sync(kBarAll, kThreads);
      if (count == 0) return;
    }
  }

  // Consumers. Q of the block's heads (zeros past the last head), split once for every tile.
  constexpr int kRowVecs = kHd / 4;
  for (int i = tid; i < kBlockHeads * kRowVecs; i += kConsumers) {
    const int r = i / kRowVecs, c = (i % kRowVecs) * 4, h = hb + r;
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (h < p.heads) v = __ldg(reinterpret_cast<const float4*>(p.q + (t * p.heads + h) * p.hd + c));
    store_split4(v, q_hi + r * L::kLd + c, q_lo + r * L::kLd + c);
  }

  const int g = lane >> 2, tq = lane & 3;
  const int hg = warp & 3, half = warp >> 2, r0 = hg * 16 + g;
  const int srow = tid >> 2, squart = tid & 3;  // softmax: head row, quarter of the tile's keys
  float m_run = -INFINITY, l_run = 0.0f;
  constexpr int kNt = kHd / 16;  // 8-dim n-tiles of this warp's half of O
  float acc[kNt][4];
#pragma unroll
  for (int j = 0; j < kNt; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;

  for (int i = 0;; ++i) {
    bar_sync(kBarAll, kThreads);  // tile i's rows published; also orders the Q stores before tile 0's reads
    const int n = count_s[i & 1];
    if (n == 0) break;
    const float* const* rows = rows_s + (i & 1) * kTile;

    // 1. Key rows -> hi / lo bf16, 4 float4 loads in flight a thread (8 gave 156 bytes of spills at hd 512).
    {
      constexpr int kVecs = kTile * kRowVecs / kConsumers;
      constexpr int kBatch = kVecs < 4 ? kVecs : 4;
#pragma unroll
      for (int j0 = 0; j0 < kVecs; j0 += kBatch) {
        float4 v[kBatch];
        int at[kBatch];
#pragma unroll
        for (int j = 0; j < kBatch; ++j) {
          const int e = tid + (j0 + j) * kConsumers, r = e / kRowVecs, c = (e % kRowVecs) * 4;
          at[j] = r * L::kLd + c;
          v[j] = r < n ? __ldg(reinterpret_cast<const float4*>(rows[r] + c)) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
#pragma unroll
        for (int j = 0; j < kBatch; ++j) store_split4(v[j], k_hi + at[j], k_lo + at[j]);
      }
    }
    bar_sync(kBarConsumers, kConsumers);

    // 2. S for heads r0, r0 + 8 and keys 16·half + 8·nt + 2·tq (+1).
    {
      // hi·hi and the two cross terms in separate accumulators: four independent mma chains a warp instead of two
      // (the k loop is 3·hd/16 mmas long), and the small terms summed among themselves first.
      float sacc[2][4] = {}, sx[2][4] = {};
#pragma unroll 4
      for (int ks = 0; ks < kHd / 16; ++ks) {
        const int d = ks * 16 + 2 * tq;
        uint32_t ah[4], al[4];
        frag_a(q_hi, L::kLd, r0, d, ah);
        frag_a(q_lo, L::kLd, r0, d, al);
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          const int key = half * 16 + nt * 8 + g;
          const __nv_bfloat16 *kh = k_hi + key * L::kLd + d, *kl = k_lo + key * L::kLd + d;
          const uint32_t bh0 = ld32(kh), bh1 = ld32(kh + 8);
          mma(sx[nt], ah, ld32(kl), ld32(kl + 8));
          mma(sx[nt], al, bh0, bh1);
          mma(sacc[nt], ah, bh0, bh1);
        }
      }
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        const int col = half * 16 + nt * 8 + 2 * tq;
        s_s[r0 * L::kSLd + col] = sacc[nt][0] + sx[nt][0];
        s_s[r0 * L::kSLd + col + 1] = sacc[nt][1] + sx[nt][1];
        s_s[(r0 + 8) * L::kSLd + col] = sacc[nt][2] + sx[nt][2];
        s_s[(r0 + 8) * L::kSLd + col + 1] = sacc[nt][3] + sx[nt][3];
      }
    }
    bar_sync(kBarConsumers, kConsumers);

    // 3. Online softmax of row srow over keys 8·squart .. 8·squart + 7 (keys >= n are missing rows).
    {
      const float* sr = s_s + srow * L::kSLd + squart * 8;
      float x[8], mx = m_run;
#pragma unroll
      for (int c = 0; c < 8; ++c) {
        x[c] = sr[c] * p.scale;
        if (squart * 8 + c < n) mx = fmaxf(mx, x[c]);
      }
      mx = fmaxf(mx, __shfl_xor_sync(kFull, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(kFull, mx, 2));
      const float corr = expf(m_run - mx);  // m = −inf before the first key: 0
      float w[8], sum = 0.0f;
#pragma unroll
      for (int c = 0; c < 8; ++c) {
        w[c] = squart * 8 + c < n ? expf(x[c] - mx) : 0.0f;
        sum += w[c];
      }
      sum += __shfl_xor_sync(kFull, sum, 1);
      sum += __shfl_xor_sync(kFull, sum, 2);
      l_run = l_run * corr + sum;
      m_run = mx;
      uint4 h, l;
      split_pair(w[0], w[1], h.x, l.x);
      split_pair(w[2], w[3], h.y, l.y);
      split_pair(w[4], w[5], h.z, l.z);
      split_pair(w[6], w[7], h.w, l.w);
      *reinterpret_cast<uint4*>(p_hi + srow * L::kPLd + squart * 8) = h;
      *reinterpret_cast<uint4*>(p_lo + srow * L::kPLd + squart * 8) = l;
      if (squart == 0) corr_s[srow] = corr;
    }
    bar_sync(kBarConsumers, kConsumers);

    // 4. O[r0, r0 + 8][half's dims] = O · corr + P · K. ldmatrix.trans lanes: keys 16·ks + (lane & 15) in two
    // 8-row matrices, dims +8 for lanes 16-31: registers 0-1 are n-tile 2·pr's b0 / b1, 2-3 n-tile 2·pr + 1's.
    {
      const float c0 = corr_s[r0], c1 = corr_s[r0 + 8];
#pragma unroll
      for (int j = 0; j < kNt; ++j) {
        acc[j][0] *= c0;
        acc[j][1] *= c0;
        acc[j][2] *= c1;
        acc[j][3] *= c1;
      }
#pragma unroll
      for (int ks = 0; ks < kTile / 16; ++ks) {
        uint32_t ah[4], al[4];
        frag_a(p_hi, L::kPLd, r0, ks * 16 + 2 * tq, ah);
        frag_a(p_lo, L::kPLd, r0, ks * 16 + 2 * tq, al);
        const int key = ks * 16 + (lane & 15);
#pragma unroll
        for (int pr = 0; pr < kNt / 2; ++pr) {
          const int dim = half * (kHd / 2) + pr * 16 + (lane >> 4) * 8;
          uint32_t bh[4], bl[4];
          ldmatrix_x4_trans(bh, k_hi + key * L::kLd + dim);
          ldmatrix_x4_trans(bl, k_lo + key * L::kLd + dim);
          mma3(acc[2 * pr], ah, al, bh[0], bh[1], bl[0], bl[1]);
          mma3(acc[2 * pr + 1], ah, al, bh[2], bh[3], bl[2], bl[3]);
        }
      }
    }
  }

  // The running max / sum live with the softmax threads; the O fragments with the mma lanes.
  if (squart == 0) {
    fin_m[srow] = m_run;
    fin_l[srow] = l_run;
  }
  bar_sync(kBarConsumers, kConsumers);
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int r = r0 + 8 * hh, h = hb + r;
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
      if (half == 0 && tq == 0) {
        p.part_m[at] = m;
        p.part_l[at] = l;
      }
    }
#pragma unroll
    for (int j = 0; j < kNt; ++j) {
      const int dim = half * (kHd / 2) + j * 8 + 2 * tq;
      *reinterpret_cast<float2*>(dst + dim) = make_float2(acc[j][2 * hh] * mul, acc[j][2 * hh + 1] * mul);
    }
  }
}

template <int kHd>
void launch(const PagedSinkAttentionKernelParams& p, cudaStream_t stream) {
  constexpr size_t smem = Layout<kHd>::bytes;
  DI_CUDA_CHECK(cudaFuncSetAttribute(paged_attention_mma_kernel<kHd>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(smem)));
  const dim3 grid(static_cast<unsigned>(p.tokens), static_cast<unsigned>(ceil_div(p.heads, kBlockHeads)),
                  static_cast<unsigned>(p.splits));
  paged_attention_mma_kernel<kHd><<<grid, kThreads, smem, stream>>>(p);
  DI_CUDA_CHECK_LAUNCH();
}

int max_smem_optin() {
  int dev = 0, v = 0;
  DI_CUDA_CHECK(cudaGetDevice(&dev));
  DI_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  return v;
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
  const char* v = std::getenv("DEEPINFER_AB_ATTN_MMA");
  if (v && std::strcmp(v, "0") == 0) return false;
  const bool all = v && std::strcmp(v, "all") == 0;
  if (!all && p.tokens < kPagedAttentionMmaMinTokens) return false;
  const size_t smem = smem_bytes(p.hd);
  return smem > 0 && p.heads % 16 == 0 && !p.always_combine && static_cast<int64_t>(smem) <= max_smem_optin();
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
