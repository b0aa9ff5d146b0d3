// Flash attention for the naive MLA form (CudaBackend::mla_attention_naive under KernelChoices::mla_flash): every
// head its own keys [k_nope | k_pe] (qk values) and values (dv), causal by positions, one pass over the keys with an
// online softmax, so the logits never go through memory. The GEMM path it replaces writes, soft-maxes and re-reads
// a [heads, queries, keys] logit buffer (at 8192 queries and 128 heads 34 GB a layer in chunks): V3 slice prefill 8192
// spends 298 of 358 ms there (H100, docs/PERF.md session 30).
//
// Numerics: bf16x3 on the tensor cores, as the GEMM path's mla_bf16x3 and the V4 prefill attention
// (attention_paged_mma_cuda.cu): each operand split x = hi + lo in bf16 (split_pair), each product
// hi·hi + hi·lo + lo·hi accumulated in fp32, the small terms first (mma3; ~2^-16 relative a product; lo·lo dropped). Q
// is split once into shared memory; keys and values come pre-split (run_bf16_parts: [hi | lo] planes); P = exp(s − m)
// is split in registers. The
// softmax is online (the running max and sum in fp32, the output rescaled when the max grows), so its rounding
// differs from the two-pass CPU op in the last bits; the GPU test holds it to 3e-5 against the CPU naive form.
//
// Block: kRows queries of one head, 16 rows a warp (mma.sync m16n8k16 row.col), keys in tiles of 32: stage the
// tile's key and value planes into shared memory (rows padded by 16 bytes: ldmatrix conflict-free), S = Q·Kᵀ (3 mmas
// a product), mask (kv_positions[j] > q_positions[t], or past S), online softmax, O += P·V (3 mmas). With the layout
// facts (kv_first_position >= 0: row j holds position kv_first_position + j) a block stops after its newest query's
// row: causal prefill does about half the work.
// kRows 64 (4 warps, two blocks an SM) stages each tile after the previous one's products; kRows 128 (8 warps, one
// block an SM: Q's planes take 100 KB) reads each key tile once per 128 queries instead of 64 and double-buffers it:
// tile i + 1's cp.async copies run under tile i's products (MlaFlashKernelParams::rows, KernelChoices::
// mla_flash_rows).
#include <climits>

#include "deepinfer/ops/cuda/cuda_check.h"
#include "deepinfer/ops/cuda/device_math.cuh"
#include "deepinfer/ops/cuda/gemm_decode.cuh"
#include "deepinfer/ops/cuda/kernels.h"
#include "deepinfer/ops/cuda/mla_flash_common.cuh"

namespace deepinfer::cuda {
namespace {

constexpr int kFlashKeys = 32;

// d0 / d1 (n-tiles u = 0 / 1 of an ldmatrix x4 pair: b fragments b[2u], b[2u + 1]) += A·B as bf16x3 (mma3) of A's
// terms (a_hi, a_lo) and B's (b_hi, b_lo).
__device__ __forceinline__ void mma_x3_pair(float (&d0)[4], float (&d1)[4], const uint32_t (&a_hi)[4],
                                            const uint32_t (&a_lo)[4], const uint32_t (&b_hi)[4],
                                            const uint32_t (&b_lo)[4]) {
  mma3(d0, a_hi, a_lo, b_hi[0], b_hi[1], b_lo[0], b_lo[1]);
  mma3(d1, a_hi, a_lo, b_hi[2], b_hi[3], b_lo[2], b_lo[3]);
}

// kQK / kDV: the compiled head sizes (multiples of 16); a call's qk <= kQK and dv <= kDV, the rest zeros.
template <int kQK, int kDV, int kRows>
struct FlashShape {
  static constexpr int kThreads = 2 * kRows;  // a warp per 16 rows
  static constexpr int kStages = kRows >= 128 ? 2 : 1;
  static constexpr int kKStride = kQK + 8, kVStride = kDV + 8;  // bf16 a shared row: 16 bytes of padding
  static constexpr int kKPlane = kFlashKeys * kKStride, kVPlane = kFlashKeys * kVStride, kQPlane = kRows * kKStride;
  // A stage: K hi, K lo, V hi, V lo.
  static constexpr int kStage = 2 * kKPlane + 2 * kVPlane;
  static constexpr size_t kSmem =
      sizeof(uint16_t) * (kStages * kStage + 2 * kQPlane) + sizeof(int64_t) * kStages * kFlashKeys;
  static_assert(kRows == 64 || kRows == 128, "64 or 128 queries a block");
};

// Rows s0 .. s0 + kFlashKeys - 1 of a [hi | lo] plane pair (row s at src + s · row, lo `part` elements after hi; len
// values) into shared rows of kStride: 8 bf16 (16 bytes) a copy, rows past s_len and columns past len zeros. Whole
// 16-byte chunks of aligned planes (vec16) go by cp.async (the caller commits and waits), the rest by plain stores.
// A whole tile of full rows (vec16, len == kCols, all 32 rows before s_len: every tile of V3's heads but the last)
// takes the general loop's chunk order (chunk i = tid + j · kThreads: row i / kChunks, column i % kChunks, so a warp
// reads whole rows) with the row and column stepped incrementally and the row's address kept: the general loop's
// per-chunk division, bounds checks and 64-bit address math were ~26% of the kernel's stall samples and 14% of its
// instructions (H100 ncu source counters, docs/PERF.md session 34). A fixed row a thread (kThreads / 32 threads a
// row) measured slower at 64 queries a block (attention 140.1-140.7 ms against 131.1-131.7: a warp's copies then span
// 8 rows). The same bytes either way.
template <int kCols, int kStride, int kThreads>
__device__ __forceinline__ void stage_planes(const uint16_t* src, int64_t row, int64_t part, int64_t s0, int64_t s_len,
                                             int len, bool vec16, uint16_t* hi_dst, uint16_t* lo_dst, int tid) {
  constexpr int kChunks = kCols / 8, kTotal = kFlashKeys * kChunks;
  constexpr int kRowStep = kThreads / kChunks, kColStep = kThreads % kChunks;
  if (vec16 && len == kCols && s0 + kFlashKeys <= s_len) {
    int r = tid / kChunks, c = tid % kChunks;
    const uint16_t* x = src + (s0 + r) * row;
#pragma unroll
    for (int j = 0; j < (kTotal + kThreads - 1) / kThreads; ++j) {
      if (kTotal % kThreads != 0 && r >= kFlashKeys) break;
      cp_async16(hi_dst + r * kStride + 8 * c, x + 8 * c, true);
      cp_async16(lo_dst + r * kStride + 8 * c, x + part + 8 * c, true);
      r += kRowStep;
      x += kRowStep * row;
      c += kColStep;
      if (c >= kChunks) {
        c -= kChunks;
        ++r;
        x += row;
      }
    }
    return;
  }
  for (int i = tid; i < kFlashKeys * (kCols / 8); i += kThreads) {
    const int r = i / (kCols / 8), c = 8 * (i % (kCols / 8));
    const int64_t s = s0 + r;
    uint4 hi = make_uint4(0, 0, 0, 0), lo = hi;
    if (s < s_len && c < len) {
      const uint16_t* x = src + s * row + c;
      if (vec16 && c + 8 <= len) {
        cp_async16(hi_dst + r * kStride + c, x, true);
        cp_async16(lo_dst + r * kStride + c, x + part, true);
        continue;
      } else {
        uint16_t h[8], w[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          h[e] = c + e < len ? x[e] : 0;
          w[e] = c + e < len ? x[part + e] : 0;
        }
        hi = *reinterpret_cast<const uint4*>(h);
        lo = *reinterpret_cast<const uint4*>(w);
      }
    }
    *reinterpret_cast<uint4*>(hi_dst + r * kStride + c) = hi;
    *reinterpret_cast<uint4*>(lo_dst + r * kStride + c) = lo;
  }
}

// kSplitS (MlaFlashKernelParams::split_s): S's hi·hi products and its cross terms in separate accumulators, 8
// independent mma chains a warp instead of 4 of three dependent products a k-step (the session 34 profile's largest
// stall was fixed-latency waits, 38% of them on HMMA); another fp32 summation order, the same 3e-5 budget.
template <int kQK, int kDV, int kRows, bool kSplitS>
__global__ void __launch_bounds__(FlashShape<kQK, kDV, kRows>::kThreads, kRows >= 128 ? 1 : 2)
    mla_flash_kernel(MlaFlashKernelParams p) {
  using F = FlashShape<kQK, kDV, kRows>;
  constexpr int kThreads = F::kThreads;
  extern __shared__ __align__(16) uint16_t smem[];
  uint16_t* q_hi = smem;
  uint16_t* q_lo = q_hi + F::kQPlane;
  uint16_t* stages = q_lo + F::kQPlane;  // [kStages][K hi, K lo, V hi, V lo]
  int64_t* key_pos_s = reinterpret_cast<int64_t*>(stages + F::kStages * F::kStage);  // [kStages][kFlashKeys]
  __shared__ long long newest_warp[kThreads / 32];

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tq = lane & 3;
  const int head = blockIdx.y;
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * kRows;
  const int64_t row[2] = {t0 + warp * 16 + g, t0 + warp * 16 + g + 8};
  long long qpos[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) qpos[i] = row[i] < p.tokens ? p.q_positions[row[i]] : LLONG_MIN;

  // Q's hi and lo terms into shared memory once (rows past the tokens and columns past qk zeros); each use takes its A
  // fragment by ldmatrix (in registers the 2 x 48 words of V3's 192 values spilled at 255 registers).
  for (int i = tid; i < kRows * (kQK / 2); i += kThreads) {
    const int r = i / (kQK / 2), c = 2 * (i % (kQK / 2));
    const int64_t t = t0 + r;
    const float* src = p.q + t * p.q_row + static_cast<int64_t>(head) * p.q_head;
    const float x0 = t < p.tokens && c < p.qk ? src[c] : 0.0f;
    const float x1 = t < p.tokens && c + 1 < p.qk ? src[c + 1] : 0.0f;
    uint32_t hi, lo;
    split_pair(x0, x1, hi, lo);
    *reinterpret_cast<uint32_t*>(q_hi + r * F::kKStride + c) = hi;
    *reinterpret_cast<uint32_t*>(q_lo + r * F::kKStride + c) = lo;
  }
  const int mi = lane >> 3, mr = lane & 7;
  // This warp's A fragment of K chunk c: ldmatrix x4 at rows 16 warp + 8 (mi & 1) + (lane & 7), dims 16c + 8 (mi >> 1).
  const int q_off = (16 * warp + 8 * (mi & 1) + mr) * F::kKStride + 8 * (mi >> 1);

  // The keys this block may see: all, or with the layout facts those up to its newest query's row.
  const int64_t s_end = flash_block_keys<kThreads / 32>(p, qpos, lane, warp, newest_warp);

  float o[kDV / 8][4];
#pragma unroll
  for (int n = 0; n < kDV / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

  const uint16_t* k_src = static_cast<const uint16_t*>(p.k2) + static_cast<int64_t>(head) * p.k_head;
  const uint16_t* v_src = static_cast<const uint16_t*>(p.v2) + static_cast<int64_t>(head) * p.v_head;
  // Tile i (keys 32 i ..) into stage i % kStages.
  auto stage = [&](int64_t i) {
    const int b = static_cast<int>(i % F::kStages);
    uint16_t* base = stages + b * F::kStage;
    const int64_t s0 = i * kFlashKeys;
    stage_planes<kQK, F::kKStride, kThreads>(k_src, p.k_row, p.k_part, s0, p.s, p.qk, p.vec16, base, base + F::kKPlane,
                                             tid);
    stage_planes<kDV, F::kVStride, kThreads>(v_src, p.v_row, p.v_part, s0, p.s, p.dv, p.vec16, base + 2 * F::kKPlane,
                                             base + 2 * F::kKPlane + F::kVPlane, tid);
    if (tid < kFlashKeys) key_pos_s[b * kFlashKeys + tid] = s0 + tid < p.s ? p.kv_positions[s0 + tid] : LLONG_MAX;
    cp_async_commit();
  };
  const int64_t n_tiles = (s_end + kFlashKeys - 1) / kFlashKeys;
  if (n_tiles > 0) stage(0);
  for (int64_t it = 0; it < n_tiles; ++it) {
    // Two stages: tile it + 1 copies while this one's products run (its buffer was freed by the barrier that ended
    // tile it - 1). One stage: tile it was staged after tile it - 1's products.
    if (F::kStages == 2 && it + 1 < n_tiles) {
      stage(it + 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // tile it's copies and stores are visible
    const int b = static_cast<int>(it % F::kStages);
    const uint16_t* k_hi = stages + b * F::kStage;
    const uint16_t* k_lo = k_hi + F::kKPlane;
    const uint16_t* v_hi = k_lo + F::kKPlane;
    const uint16_t* v_lo = v_hi + F::kVPlane;
    const int64_t* key_pos = key_pos_s + b * kFlashKeys;

    // S = Q·Kᵀ: n-tile j = keys 8j .. 8j + 7. ldmatrix x4 at keys 16jj + 8 (mi >> 1) + (lane & 7), dims 16c + 8 (mi &
    // 1) (mi = lane >> 3) gives b0 / b1 of n-tiles 2jj and 2jj + 1.
    float sc[kFlashKeys / 8][4];
    // kSplitS: the cross terms' own accumulators (one register set otherwise, unused).
    float sx[kSplitS ? kFlashKeys / 8 : 1][4];
#pragma unroll
    for (int j = 0; j < kFlashKeys / 8; ++j) sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.0f;
#pragma unroll
    for (int j = 0; j < (kSplitS ? kFlashKeys / 8 : 1); ++j) sx[j][0] = sx[j][1] = sx[j][2] = sx[j][3] = 0.0f;
#pragma unroll
    for (int c = 0; c < kQK / 16; ++c) {
      uint32_t qh[4], ql[4];
      ldmatrix_x4(qh, q_hi + q_off + 16 * c);
      ldmatrix_x4(ql, q_lo + q_off + 16 * c);
#pragma unroll
      for (int jj = 0; jj < kFlashKeys / 16; ++jj) {
        const int off = (16 * jj + 8 * (mi >> 1) + mr) * F::kKStride + 16 * c + 8 * (mi & 1);
        uint32_t bh[4], bl[4];
        ldmatrix_x4(bh, k_hi + off);
        ldmatrix_x4(bl, k_lo + off);
        if constexpr (kSplitS) {
#pragma unroll
          for (int u = 0; u < 2; ++u) {
            float(&x)[4] = sx[2 * jj + u];
            mma_bf16(x, qh, bl[2 * u], bl[2 * u + 1]);
            mma_bf16(x, ql, bh[2 * u], bh[2 * u + 1]);
            mma_bf16(sc[2 * jj + u], qh, bh[2 * u], bh[2 * u + 1]);
          }
        } else {
          mma_x3_pair(sc[2 * jj], sc[2 * jj + 1], qh, ql, bh, bl);
        }
      }
    }
    if constexpr (kSplitS) {
#pragma unroll
      for (int j = 0; j < kFlashKeys / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) sc[j][e] += sx[j][e];
    }

    // Mask and scale (entry e of n-tile j: row row[e >> 1], key 8j + 2tq + (e & 1)), the tile's row maxima over the
    // quad's four threads, the rescale of what came before.
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < kFlashKeys / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const bool visible = key_pos[8 * j + 2 * tq + (e & 1)] <= qpos[e >> 1];
        sc[j][e] = visible ? sc[j][e] * p.scale : -INFINITY;
        tile_max[e >> 1] = fmaxf(tile_max[e >> 1], sc[j][e]);
      }
    flash_online_max(
        tile_max, m, l, p.lazy_rescale, [](float x) { return expf(x); },
        [&](float c0, float c1) {
#pragma unroll
          for (int n = 0; n < kDV / 8; ++n) {
            o[n][0] *= c0;
            o[n][1] *= c0;
            o[n][2] *= c1;
            o[n][3] *= c1;
          }
        });
#pragma unroll
    for (int j = 0; j < kFlashKeys / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float x = sc[j][e];
        sc[j][e] = x == -INFINITY ? 0.0f : expf(x - m[e >> 1]);
        l[e >> 1] += sc[j][e];
      }

      // O += P·V: K chunk kc = keys 16kc .. 16kc + 15, P's A fragment from n-tiles 2kc (a0, a1) and 2kc + 1 (a2, a3).
      // ldmatrix x4 .trans at keys 16kc + 8 (mi & 1) + (lane & 7), dims 16nn + 8 (mi >> 1) gives b0 / b1 of n-tiles 2nn
      // and 2nn + 1.
#pragma unroll
    for (int kc = 0; kc < kFlashKeys / 16; ++kc) {
      uint32_t a_hi[4], a_lo[4];
      split_pair(sc[2 * kc][0], sc[2 * kc][1], a_hi[0], a_lo[0]);
      split_pair(sc[2 * kc][2], sc[2 * kc][3], a_hi[1], a_lo[1]);
      split_pair(sc[2 * kc + 1][0], sc[2 * kc + 1][1], a_hi[2], a_lo[2]);
      split_pair(sc[2 * kc + 1][2], sc[2 * kc + 1][3], a_hi[3], a_lo[3]);
#pragma unroll
      for (int nn = 0; nn < kDV / 16; ++nn) {
        const int off = (16 * kc + 8 * (mi & 1) + mr) * F::kVStride + 16 * nn + 8 * (mi >> 1);
        uint32_t bh[4], bl[4];
        ldmatrix_x4_trans(bh, v_hi + off);
        ldmatrix_x4_trans(bl, v_lo + off);
        mma_x3_pair(o[2 * nn], o[2 * nn + 1], a_hi, a_lo, bh, bl);
      }
    }
    __syncthreads();  // this stage's reads are done before it is restaged
    if (F::kStages == 1 && it + 1 < n_tiles) stage(it + 1);
  }

  flash_store_rows<kDV>(p, row, head, tq, l, [&](int n, int e) { return o[n][e]; });
}

template <int kQK, int kDV, int kRows>
void launch_flash(const MlaFlashKernelParams& p, cudaStream_t stream) {
  using F = FlashShape<kQK, kDV, kRows>;
  auto* kernel = p.split_s ? mla_flash_kernel<kQK, kDV, kRows, true> : mla_flash_kernel<kQK, kDV, kRows, false>;
  DI_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(F::kSmem)));
  const dim3 grid(static_cast<unsigned>(ceil_div(p.tokens, kRows)), static_cast<unsigned>(p.heads));
  kernel<<<grid, F::kThreads, F::kSmem, stream>>>(p);
  DI_CUDA_CHECK_LAUNCH();
}

template <int kQK, int kDV>
void launch_flash_rows(const MlaFlashKernelParams& p, cudaStream_t stream) {
  if (p.rows == 128)
    launch_flash<kQK, kDV, 128>(p, stream);
  else
    launch_flash<kQK, kDV, 64>(p, stream);
}

}  // namespace

bool mla_flash_takes(int64_t qk, int64_t dv) { return qk > 0 && dv > 0 && qk <= 192 && dv <= 128; }

void run_mla_flash(const MlaFlashKernelParams& p, cudaStream_t stream) {
  DI_CHECK(mla_flash_takes(p.qk, p.dv)) << "mla flash: qk " << p.qk << ", dv " << p.dv << " not compiled";
  DI_CHECK(p.rows == 64 || p.rows == 128) << "mla flash: " << p.rows << " rows a block (64 or 128)";
  DI_CHECK(p.heads < 65536 && ceil_div(p.tokens, int64_t{p.rows}) < (int64_t{1} << 31))
      << "mla flash: " << p.heads << " heads, " << p.tokens << " tokens";
  if (p.tokens == 0 || p.heads == 0) return;
  // V3 / R1 / V3.1 / V2-Lite: qk 192, dv 128; smaller heads (the tests' dims) in the small instantiation.
  if (p.qk <= 64 && p.dv <= 32)
    launch_flash_rows<64, 32>(p, stream);
  else
    launch_flash_rows<192, 128>(p, stream);
}

}  // namespace deepinfer::cuda
