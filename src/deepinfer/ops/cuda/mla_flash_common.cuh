// What the MLA flash kernels (mla_flash_cuda.cu on mma.sync, mla_flash_wgmma_cuda.cu on warpgroup MMAs) share around
// their products: the keys a block of queries may see, and the final O / l of a thread's two rows. Both kernels hold
// a thread's accumulators in mma.sync's layout (rows g and g + 8 of its warp's 16, columns 8n + 2tq + {0, 1}).
#pragma once

#include <climits>

#include "deepinfer/ops/cuda/kernels.h"

namespace deepinfer::cuda {

// The keys a block may see: all p.s, or with the layout facts (row j = position kv_first_position + j) those up to its
// newest query's row. qpos: the thread's two rows' positions (LLONG_MIN past the tokens); newest_warp: kWarps slots of
// shared memory. Every thread of the block calls it (a __syncthreads inside when the layout facts are set).
template <int kWarps>
__device__ __forceinline__ int64_t flash_block_keys(const MlaFlashKernelParams& p, const long long (&qpos)[2], int lane,
                                                    int warp, long long* newest_warp) {
  if (p.kv_first_position < 0) return p.s;
  long long newest = max(qpos[0], qpos[1]);
  for (int o = 16; o > 0; o >>= 1) newest = max(newest, __shfl_xor_sync(0xFFFFFFFFu, newest, o));
  if (lane == 0) newest_warp[warp] = newest;
  __syncthreads();
  newest = newest_warp[0];
#pragma unroll
  for (int w = 1; w < kWarps; ++w) newest = max(newest, newest_warp[w]);
  const long long last = newest - static_cast<long long>(p.kv_first_position) + 1;
  return newest == LLONG_MIN ? 0 : static_cast<int64_t>(min(static_cast<long long>(p.s), max(0LL, last)));
}

// The online softmax's step for a tile: each row's maximum over the quad (tile_max: the thread's own entries' maxima),
// the new running max m, and the factor exp(m_old - m_new) (1 while nothing is visible: exp(-inf - -inf) would be
// NaN) applied to l and, through scale_acc(c0, c1), to the output accumulators' row-0 / row-1 entries. corr is exactly
// 1 where a row's max did not grow, so with `lazy` a warp whose rows all kept theirs skips the multiplications: the
// same bits. exp: the kernel's exponential, matching its logits' base.
template <typename Exp, typename ScaleAcc>
__device__ __forceinline__ void flash_online_max(float (&tile_max)[2], float (&m)[2], float (&l)[2], bool lazy, Exp exp,
                                                 ScaleAcc scale_acc) {
  float corr[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    tile_max[i] = fmaxf(tile_max[i], __shfl_xor_sync(0xFFFFFFFFu, tile_max[i], 1));
    tile_max[i] = fmaxf(tile_max[i], __shfl_xor_sync(0xFFFFFFFFu, tile_max[i], 2));
    const float m_new = fmaxf(m[i], tile_max[i]);
    corr[i] = m_new == -INFINITY ? 1.0f : exp(m[i] - m_new);
    m[i] = m_new;
    l[i] *= corr[i];
  }
  if (!lazy || __any_sync(0xFFFFFFFFu, corr[0] != 1.0f || corr[1] != 1.0f)) scale_acc(corr[0], corr[1]);
}

// The row sums over the quad, then O / l into p.out for the thread's rows below p.tokens (0 for a row with no visible
// key, as the CPU op). o(n, e): entry e of n-tile n (row e >> 1, column 8n + 2tq + (e & 1)).
template <int kDV, typename Acc>
__device__ __forceinline__ void flash_store_rows(const MlaFlashKernelParams& p, const int64_t (&row)[2], int head,
                                                 int tq, float (&l)[2], Acc o) {
  float inv[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l[i] += __shfl_xor_sync(0xFFFFFFFFu, l[i], 1);
    l[i] += __shfl_xor_sync(0xFFFFFFFFu, l[i], 2);
    inv[i] = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if (row[i] >= p.tokens) continue;
    float* dst = p.out + row[i] * p.out_row + static_cast<int64_t>(head) * p.out_head;
#pragma unroll
    for (int n = 0; n < kDV / 8; ++n) {
      const int col = 8 * n + 2 * tq;
      if (col < p.dv) dst[col] = o(n, 2 * i) * inv[i];
      if (col + 1 < p.dv) dst[col + 1] = o(n, 2 * i + 1) * inv[i];
    }
  }
}

}  // namespace deepinfer::cuda
