// The MLA flash kernel on wgmma (sm_90a; KernelChoices::mla_flash_wgmma): the same attention and numerics as
// mla_flash_cuda.cu (bf16x3 products: each operand split x = hi + lo in bf16, hi·lo + lo·hi + hi·hi accumulated in
// fp32 a product; online softmax), with the products on warpgroup MMAs instead of mma.sync.
//
// Why: the mma.sync kernel loads every operand fragment through ldmatrix into registers (Q's per key tile, K's and V's
// per 16 query rows), ~0.43 ldmatrix a mma, and its session 34 profile was fixed-latency waits on dependent mma chains
// (the V3 slice's prefill attention at ~196 TFLOP/s of bf16 products on the H100). wgmma reads the key and value tiles
// from shared memory itself for 64 query rows at once and runs asynchronously to the issuing warps.
//
// Block: 128 queries of one head, two warpgroups of 64 (each warp 16 rows, as in mma.sync), 256 threads; key tiles of
// 64 keys, double-buffered by cp.async (tile i + 1's copies run under tile i's products).
// - Q: each thread's A fragments of its rows, hi and lo, for the 12 k16 steps of 192 dims, in registers (96 words):
//   S = Q·Kᵀ as wgmma m64n64k16 with A from registers and B = the key tile (K-major: a key's dims contiguous).
// - The key tile's [hi | lo] planes as 3 blocks of 64 dims x 64 keys each, 128B-swizzled (gemm_wgmma_cuda.cu's
//   layout and descriptors); the value tile transposed, Vᵀ [128 dims x 64 keys] hi and lo (one 128B-swizzled block:
//   a dim's 64 keys contiguous), so that O += P·V is wgmma m64n128k16 with A = P from registers (split in registers)
//   and B = Vᵀ K-major. The caller writes Vᵀ's planes once ([2][heads][dv][keys padded to 64]: run_mla_vt_parts).
// - The accumulators' layout is mma.sync's (each warp 16 rows x N), so masking, the online softmax and P's A
//   fragments are the mma.sync kernel's code.
// Smaller heads (qk < 192, dv < 128, multiples of 8) run zero-padded.
#include <climits>

#include "deepinfer/ops/cuda/cuda_check.h"
#include "deepinfer/ops/cuda/device_math.cuh"
#include "deepinfer/ops/cuda/gemm_decode.cuh"
#include "deepinfer/ops/cuda/gemm_wgmma.h"
#include "deepinfer/ops/cuda/gemm_wgmma_device.cuh"
#include "deepinfer/ops/cuda/kernels.h"
#include "deepinfer/ops/cuda/mla_flash_common.cuh"

namespace deepinfer::cuda {
namespace {

using namespace wgmma;

constexpr int kWfKeys = 64;                               // keys a tile
constexpr int kWfQK = 192, kWfDV = 128;                   // compiled head sizes
constexpr int kWfRows = 128;                              // queries a block
constexpr int kWfThreads = 256;                           // two warpgroups
constexpr int kWfSteps = kWfQK / 16;                      // k16 steps of S
constexpr uint32_t kWfKBlock = kWfKeys * 128;             // one 64-dim block of the key tile: 64 rows x 128 bytes
constexpr uint32_t kWfKPlane = (kWfQK / 64) * kWfKBlock;  // 24 KB
constexpr uint32_t kWfVPlane = kWfDV * 128;               // Vᵀ: 128 rows x 64 keys x 2 bytes = 16 KB
constexpr uint32_t kWfStage = 2 * kWfKPlane + 2 * kWfVPlane;
constexpr int kWfStages = 2;
// Named barriers ordering the warpgroups' products (id 0 is __syncthreads'): warpgroup 0 arrives at kWfBarS0 once its
// S products are issued, warpgroup 1 at kWfBarS1 once its are.
constexpr int kWfBarS0 = 1, kWfBarS1 = 2;
// 1024 bytes of slack for the swizzle's 1024-byte aligned base, the stages, their key positions.
constexpr size_t kWfSmem = 1024 + size_t{kWfStages} * kWfStage + size_t{kWfStages} * kWfKeys * sizeof(int64_t);

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ void cp_async16_to(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0) : "memory");
}

__global__ void __launch_bounds__(kWfThreads, 1) mla_flash_wgmma_kernel(MlaFlashKernelParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw = smem_addr(smem_raw);
  const uint32_t base = raw + ((1024 - (raw & 1023)) & 1023);
  int64_t* key_pos_s = reinterpret_cast<int64_t*>(smem_raw + (base - raw) + kWfStages * kWfStage);
  __shared__ long long newest_warp[kWfThreads / 32];

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tq = lane & 3, wg = warp >> 2;
  const int head = blockIdx.y;
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * kWfRows;
  const int64_t row[2] = {t0 + warp * 16 + g, t0 + warp * 16 + g + 8};
  long long qpos[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) qpos[i] = row[i] < p.tokens ? p.q_positions[row[i]] : LLONG_MIN;

  // Q's A fragments (register i: row g + 8 (i & 1), dims 16 kk + 8 (i >> 1) + 2 tq, +1), split into hi and lo.
  uint32_t qh[kWfSteps][4], ql[kWfSteps][4];
#pragma unroll
  for (int kk = 0; kk < kWfSteps; ++kk)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t r = row[i & 1];
      const int c = 16 * kk + 8 * (i >> 1) + 2 * tq;
      const float* src = p.q + r * p.q_row + static_cast<int64_t>(head) * p.q_head;
      const bool in = r < p.tokens;
      const float x0 = in && c < p.qk ? src[c] : 0.0f;
      const float x1 = in && c + 1 < p.qk ? src[c + 1] : 0.0f;
      split_pair(x0, x1, qh[kk][i], ql[kk][i]);
    }

  // The keys this block may see (as the mma.sync kernel).
  const int64_t s_end = flash_block_keys<kWfThreads / 32>(p, qpos, lane, warp, newest_warp);

  const uint16_t* k_src = static_cast<const uint16_t*>(p.k2) + static_cast<int64_t>(head) * p.k_head;
  const uint16_t* v_src = static_cast<const uint16_t*>(p.v2) + static_cast<int64_t>(head) * p.v_head;
  // Tile i (keys 64 i ..) into stage i % 2: key row r's 16-byte chunk c (dims 8c ..) at block c / 8, swizzled chunk
  // c % 8; Vᵀ row d's chunk c (keys 8c ..) at swz(d, c). Rows past the keys or the head's dims zero-fill.
  auto stage = [&](int64_t i) {
    const uint32_t st = base + static_cast<uint32_t>(i % kWfStages) * kWfStage;
    const int64_t s0 = i * kWfKeys;
    for (int c = tid; c < kWfKeys * (kWfQK / 8); c += kWfThreads) {
      const int r = c / (kWfQK / 8), ch = c % (kWfQK / 8);
      const bool ok = s0 + r < p.s && 8 * ch < p.qk;
      const uint16_t* src = ok ? k_src + (s0 + r) * p.k_row + 8 * ch : k_src;
      const uint32_t off = (ch >> 3) * kWfKBlock + swz(r, ch & 7);
      cp_async16_to(st + off, src, ok);
      cp_async16_to(st + kWfKPlane + off, src + (ok ? p.k_part : 0), ok);
    }
    for (int c = tid; c < kWfDV * 8; c += kWfThreads) {
      const int d = c >> 3, ch = c & 7;
      const bool ok = d < p.dv;  // the planes' keys run to a multiple of 64: zeros past s
      const uint16_t* src = ok ? v_src + d * p.v_row + s0 + 8 * ch : v_src;
      const uint32_t off = 2 * kWfKPlane + swz(d, ch);
      cp_async16_to(st + off, src, ok);
      cp_async16_to(st + kWfVPlane + off, src + (ok ? p.v_part : 0), ok);
    }
    if (p.kv_first_position < 0 && tid < kWfKeys)  // (with the layout facts a key's index decides)
      key_pos_s[(i % kWfStages) * kWfKeys + tid] = s0 + tid < p.s ? p.kv_positions[s0 + tid] : LLONG_MAX;
    cp_async_commit();
  };

  float o[kWfDV / 2];
#pragma unroll
  for (int n = 0; n < kWfDV / 2; ++n) o[n] = 0.0f;
  // The online softmax in base 2 (logits times scale · log2 e, ex2.approx): the same weights as exp of the scaled
  // logits up to ex2's ~2^-22.
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  const float scale2 = p.scale * 1.4426950408889634f;
  const bool layout = p.kv_first_position >= 0;
  const int64_t n_tiles = (s_end + kWfKeys - 1) / kWfKeys;
  if (n_tiles > 0) stage(0);
  for (int64_t it = 0; it < n_tiles; ++it) {
    if (it + 1 < n_tiles) {
      stage(it + 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    fence_proxy_async();  // this thread's copies, visible to the tensor cores' reads
    __syncthreads();
    const uint32_t st = base + static_cast<uint32_t>(it % kWfStages) * kWfStage;
    const int64_t* key_pos = key_pos_s + (it % kWfStages) * kWfKeys;

    // S = Q·Kᵀ (64 rows x 64 keys a warpgroup): entry 4j + e is row g + 8 (e >> 1), key 8j + 2tq + (e & 1).
    float sc[kWfKeys / 2];
#pragma unroll
    for (int j = 0; j < kWfKeys / 2; ++j) sc[j] = 0.0f;
    // The two warpgroups take the tensor cores in turn (FA3's ping-pong): warpgroup 1 issues its S products after
    // warpgroup 0's, and warpgroup 0 its O products after warpgroup 1's S, so that one's softmax runs while the
    // other's products do instead of both softmaxes at once.
    if (wg == 1) bar_sync(kWfBarS0, kWfThreads);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kWfSteps; ++kk) {
      // All 12 steps whatever qk (the padding is zeros): a branch per step split the chain into one group a step.
      const uint32_t kb = st + (kk >> 2) * kWfKBlock + k16_offset(kk & 3);
      wgmma_m64nNk16_reg_a<64>(sc, qh[kk], smem_desc(kb + kWfKPlane));
      wgmma_m64nNk16_reg_a<64>(sc, ql[kk], smem_desc(kb));
      wgmma_m64nNk16_reg_a<64>(sc, qh[kk], smem_desc(kb));
    }
    wgmma_commit();
    if (wg == 0)
      bar_arrive(kWfBarS0, kWfThreads);
    else
      bar_arrive(kWfBarS1, kWfThreads);
    wgmma_wait<0>();
    pin(sc);

    // Visibility: with the layout facts key k of the tile is position kv_first_position + 64 it + k, so a row sees the
    // keys up to `last` (and none past s); else the staged positions.
    int last[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      // (A row past the tokens has qpos LLONG_MIN: it sees nothing, without the subtraction overflowing.)
      const long long lim =
          min(qpos[i] - static_cast<long long>(p.kv_first_position), static_cast<long long>(p.s) - 1) - it * kWfKeys;
      last[i] = qpos[i] == LLONG_MIN ? -1 : static_cast<int>(max(-1LL, min(lim, static_cast<long long>(kWfKeys))));
    }
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < kWfKeys / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float& x = sc[4 * j + e];
        const int key = 8 * j + 2 * tq + (e & 1);
        const bool visible = layout ? key <= last[e >> 1] : key_pos[key] <= qpos[e >> 1];
        x = visible ? x * scale2 : -INFINITY;
        tile_max[e >> 1] = fmaxf(tile_max[e >> 1], x);
      }
    flash_online_max(
        tile_max, m, l, p.lazy_rescale, [](float x) { return fast_exp2(x); },
        [&](float c0, float c1) {
#pragma unroll
          for (int n = 0; n < kWfDV / 8; ++n) {
            o[4 * n] *= c0;
            o[4 * n + 1] *= c0;
            o[4 * n + 2] *= c1;
            o[4 * n + 3] *= c1;
          }
        });
#pragma unroll
    for (int j = 0; j < kWfKeys / 2; ++j) {
      const float x = sc[j];
      sc[j] = x == -INFINITY ? 0.0f : fast_exp2(x - m[(j >> 1) & 1]);
      l[(j >> 1) & 1] += sc[j];
    }
    // P's A fragments of k16 step kc (keys 16 kc ..): n-tiles 2kc (registers 0, 1) and 2kc + 1 (2, 3).
    uint32_t ph[kWfKeys / 16][4], pl[kWfKeys / 16][4];
#pragma unroll
    for (int kc = 0; kc < kWfKeys / 16; ++kc)
#pragma unroll
      for (int i = 0; i < 4; ++i) split_pair(sc[8 * kc + 2 * i], sc[8 * kc + 2 * i + 1], ph[kc][i], pl[kc][i]);
    // O += P·V (64 rows x 128 dims a warpgroup): entry 4n + e is row g + 8 (e >> 1), dim 8n + 2tq + (e & 1).
    if (wg == 0) bar_sync(kWfBarS1, kWfThreads);
    wgmma_fence();
#pragma unroll
    for (int kc = 0; kc < kWfKeys / 16; ++kc) {
      const uint32_t vb = st + 2 * kWfKPlane + k16_offset(kc);
      wgmma_m64nNk16_reg_a<128>(o, ph[kc], smem_desc(vb + kWfVPlane));
      wgmma_m64nNk16_reg_a<128>(o, pl[kc], smem_desc(vb));
      wgmma_m64nNk16_reg_a<128>(o, ph[kc], smem_desc(vb));
    }
    wgmma_commit();
    wgmma_wait<0>();
    pin(o);
    __syncthreads();  // both warpgroups' reads of this stage are done before it is restaged
  }

  flash_store_rows<kWfDV>(p, row, head, tq, l, [&](int n, int e) { return o[4 * n + e]; });
#endif
}

// Vᵀ's planes: value (s, h, d) at src + s · src_row + h · src_head + d as bf16 hi / lo at dst + h · dv · s_pad + d ·
// s_pad + s (lo `part` elements on), zeros for s in [s, s_pad). A 32 x 32 tile a block through shared memory, so that
// both the reads (along d) and the writes (along s) are coalesced.
__global__ void mla_vt_parts_kernel(MlaVtPartsKernelParams p) {
  __shared__ float tile[32][33];
  const int h = blockIdx.z;
  const int64_t s0 = static_cast<int64_t>(blockIdx.x) * 32;
  const int d0 = blockIdx.y * 32, tx = threadIdx.x;
  for (int j = threadIdx.y; j < 32; j += 8) {
    const int64_t s = s0 + j;
    const int d = d0 + tx;
    tile[j][tx] = s < p.s && d < p.dv ? p.src[s * p.src_row + h * p.src_head + d] : 0.0f;
  }
  __syncthreads();
  for (int j = threadIdx.y; j < 32; j += 8) {
    const int d = d0 + j;
    if (d >= p.dv) continue;
    uint32_t hi, lo;
    split_pair(tile[tx][j], 0.0f, hi, lo);
    const int64_t at = (static_cast<int64_t>(h) * p.dv + d) * p.s_pad + s0 + tx;
    p.dst[at] = static_cast<uint16_t>(hi & 0xFFFFu);
    p.dst[p.part + at] = static_cast<uint16_t>(lo & 0xFFFFu);
  }
}

}  // namespace

int64_t mla_vt_keys(int64_t s) { return ceil_div(s, int64_t{kWfKeys}) * kWfKeys; }

bool mla_flash_wgmma_takes(int64_t qk, int64_t dv) {
  return qk > 0 && dv > 0 && qk <= kWfQK && dv <= kWfDV && qk % 8 == 0 && dv % 8 == 0 && device_is_sm90();
}

void run_mla_vt_parts(const MlaVtPartsKernelParams& p, cudaStream_t stream) {
  DI_CHECK(p.s_pad % 32 == 0 && p.s_pad >= p.s && p.heads < 65536)
      << "mla vt parts: s " << p.s << ", s_pad " << p.s_pad;
  if (p.s_pad == 0 || p.heads == 0 || p.dv == 0) return;
  const dim3 grid(static_cast<unsigned>(p.s_pad / 32), static_cast<unsigned>(ceil_div(p.dv, 32)),
                  static_cast<unsigned>(p.heads));
  mla_vt_parts_kernel<<<grid, dim3(32, 8), 0, stream>>>(p);
  DI_CUDA_CHECK_LAUNCH();
}

void run_mla_flash_wgmma(const MlaFlashKernelParams& p, cudaStream_t stream) {
  DI_CHECK(mla_flash_wgmma_takes(p.qk, p.dv) && p.vec16) << "mla flash wgmma: qk " << p.qk << ", dv " << p.dv;
  DI_CHECK(p.heads < 65536 && ceil_div(p.tokens, int64_t{kWfRows}) < (int64_t{1} << 31))
      << "mla flash wgmma: " << p.heads << " heads, " << p.tokens << " tokens";
  if (p.tokens == 0 || p.heads == 0) return;
  DI_CUDA_CHECK(cudaFuncSetAttribute(mla_flash_wgmma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(kWfSmem)));
  const dim3 grid(static_cast<unsigned>(ceil_div(p.tokens, int64_t{kWfRows})), static_cast<unsigned>(p.heads));
  mla_flash_wgmma_kernel<<<grid, kWfThreads, kWfSmem, stream>>>(p);
  DI_CUDA_CHECK_LAUNCH();
}

}  // namespace deepinfer::cuda
