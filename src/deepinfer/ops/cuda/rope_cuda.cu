// Interleaved-pair RoPE on the trailing rope slice of every head, in place. The angle is rounded to fp32 and
// cos/sin are taken in double and rounded, as the CPU op does, so the rotation factors match it bit for bit;
// the rotation itself is written without FMA contraction for the same reason.
#include <algorithm>

#include "deepinfer/ops/cuda/device_math.cuh"
#include "deepinfer/ops/cuda/kernels.h"

namespace deepinfer::cuda {
namespace {

// Block (token, group of heads_per_block heads). The angles depend on the token and the pair only, so the block
// evaluates each pair's double-precision cos / sin once into shared memory (heads x fewer trigonometric calls than one
// per (head, pair): 7.2 µs a call at batch 1 on the H200, ncu) and then walks its (head, pair) with the pair index
// fastest. Head groups (about one pair a thread) spread a decode call over several SMs instead of one block walking
// 64 heads in 8 dependent load/store rounds; every value is computed the same way whatever the grouping.
__global__ void rope_kernel(RopeKernelParams p, int64_t heads_per_block) {
  extern __shared__ float cs[];  // [2][half]: cos, then sin
  const int64_t t = blockIdx.x;
  const int64_t offset = p.hd - 2 * p.half;
  const int64_t h0 = static_cast<int64_t>(blockIdx.y) * heads_per_block;
  const int64_t h1 = min(p.heads, h0 + heads_per_block);
  const int64_t pairs = (h1 - h0) * p.half;
  // The thread's first pair is read before the angles are evaluated (it does not depend on them): a decode call's
  // head group is one pair a thread, so its load overlaps the positions load and the trigonometry.
  const auto at = [&](int64_t idx) {
    const int64_t h = h0 + idx / p.half, i = idx % p.half;
    return p.x + (t * p.heads + h) * p.hd + offset + 2 * i;
  };
  float2 first = make_float2(0.0f, 0.0f);
  if (threadIdx.x < pairs) {
    const float* v = at(threadIdx.x);
    first = make_float2(v[0], v[1]);
  }
  const float fpos = static_cast<float>(p.positions[t]);
  for (int64_t i = threadIdx.x; i < p.half; i += blockDim.x) {
    const float theta = __fmul_rn(p.inv_freq[i], fpos);
    cs[i] = static_cast<float>(cos(static_cast<double>(theta)));
    const float s = static_cast<float>(sin(static_cast<double>(theta)));
    cs[p.half + i] = p.inverse ? -s : s;
  }
  __syncthreads();
  for (int64_t idx = threadIdx.x; idx < pairs; idx += blockDim.x) {
    const int64_t i = idx % p.half;
    const float c = cs[i], s = cs[p.half + i];
    float* v = at(idx);
    const float a = idx == threadIdx.x ? first.x : v[0], b = idx == threadIdx.x ? first.y : v[1];
    v[0] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
    v[1] = __fadd_rn(__fmul_rn(a, s), __fmul_rn(b, c));
  }
}

}  // namespace

void run_rope(const RopeKernelParams& p, cudaStream_t stream) {
  if (p.tokens == 0 || p.half == 0 || p.heads == 0) return;
  const size_t smem = 2 * sizeof(float) * static_cast<size_t>(p.half);
  DI_CHECK_CODE(smem <= 48 * 1024, ErrorCode::kUnsupported) << "rope: " << p.half << " rotated pairs";
  const int64_t per_block = std::max<int64_t>(1, 256 / p.half);
  const int64_t groups = ceil_div(p.heads, per_block);
  DI_CHECK_CODE(groups <= 65535, ErrorCode::kUnsupported) << "rope: " << p.heads << " heads";
  rope_kernel<<<dim3(static_cast<unsigned>(p.tokens), static_cast<unsigned>(groups)), 256, smem, stream>>>(p,
                                                                                                           per_block);
  DI_CUDA_CHECK_LAUNCH();
}

}  // namespace deepinfer::cuda
