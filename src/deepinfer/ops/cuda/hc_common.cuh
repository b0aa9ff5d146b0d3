// What the mHC kernel files share (hc_cuda.cu: coefficients and the one-launch expand + mix; hc_expand_cuda.cu:
// collapse and expand): the largest hc the kernels take and the expand arithmetic, which both must repeat bit for bit.
#pragma once

#include <cstdint>

namespace deepinfer::cuda::hc_common {

constexpr int kMaxHc = 8;

// Stream k's expanded value post · y + Σ_j comb[j·hc + k] · old_j, in hc_expand's order (the expand kernels and the
// one-launch expand + mix kernels share it: their outputs must be the same bits). `post` by reference: read where it is
// used, as each kernel read it before it shared this (their SASS is unchanged, cuobjdump).
template <int kN>
__device__ __forceinline__ float expand_value(const float* comb, int64_t hc, const float (&old)[kN], const float& post,
                                              float y, int k) {
  float acc = 0.0f;
#pragma unroll
  for (int j = 0; j < kN; ++j)
    if (j < hc) acc = __fadd_rn(acc, __fmul_rn(comb[j * hc + k], old[j]));
  return __fadd_rn(__fmul_rn(post, y), acc);
}

}  // namespace deepinfer::cuda::hc_common
