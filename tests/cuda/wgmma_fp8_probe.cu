// A one-tile probe of Hopper's e4m3 wgmma for the FP8 expert GEMM that --activation-quant mxfp8 opens (docs/PERF.md,
// "Next steps after session 26"): one warpgroup, A = 64 token rows and B = 128 weight rows of 128 e4m3 codes each in
// the 128-byte-swizzled K-major layout of gemm_wgmma_cuda.cu (its helpers: gemm_wgmma_device.cuh) (a row of 128
// one-byte codes is the bf16 kernel's row of 64 two-byte values), four wgmma m64n128k32 over K. Either the hardware
// accumulates all four (scale-d = 1 after the first), or each k32 block starts from zero and is added into fp32 times
// its row's block scale (the promotion the kernel needs, as the activation scale differs per row and 32 values). The
// test compares both with exact sums: the PTX form, the layout with one-byte elements, the accumulator map and the
// precision of the FP8 accumulation.
#include "cuda/wgmma_fp8_probe.h"

#include <cstdint>

#include "deepinfer/core/error.h"
#include "deepinfer/ops/cuda/cuda_check.h"
#include "deepinfer/ops/cuda/gemm_wgmma_device.cuh"

namespace deepinfer::testing {
namespace {

using cuda::wgmma::smem_desc;
using cuda::wgmma::swz;
using cuda::wgmma::wgmma_m64n128k32_e4m3;

template <bool kPromote>
__global__ void __launch_bounds__(128) wgmma_fp8_probe_kernel(Fp8ProbeParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __shared__ __align__(1024) uint8_t tiles[(64 + 128) * 128];
  const int tid = threadIdx.x;
  const uint32_t a_base = static_cast<uint32_t>(__cvta_generic_to_shared(tiles)), b_base = a_base + 64 * 128;
  for (int i = tid; i < 64 * 8; i += 128)
    *reinterpret_cast<uint4*>(tiles + swz(i / 8, i % 8)) = reinterpret_cast<const uint4*>(p.a)[i];
  for (int i = tid; i < 128 * 8; i += 128)
    *reinterpret_cast<uint4*>(tiles + 64 * 128 + swz(i / 8, i % 8)) = reinterpret_cast<const uint4*>(p.b)[i];
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();
  const int lane = tid & 31, w = tid >> 5;
  const int r0 = 16 * w + lane / 4, r1 = r0 + 8;  // this thread's rows: d[4j + 0/1] and d[4j + 2/3]
  float acc[64], part[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = part[i] = 0.0f;
  for (int ks = 0; ks < 4; ++ks) {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
    if constexpr (kPromote)
      wgmma_m64n128k32_e4m3(part, smem_desc(a_base + 32 * ks), smem_desc(b_base + 32 * ks), false);
    else
      wgmma_m64n128k32_e4m3(acc, smem_desc(a_base + 32 * ks), smem_desc(b_base + 32 * ks), ks > 0);
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    if constexpr (kPromote) {
      const float s0 = p.a_scale[r0 * 4 + ks], s1 = p.a_scale[r1 * 4 + ks];
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        acc[4 * j] = fmaf(part[4 * j], s0, acc[4 * j]);
        acc[4 * j + 1] = fmaf(part[4 * j + 1], s0, acc[4 * j + 1]);
        acc[4 * j + 2] = fmaf(part[4 * j + 2], s1, acc[4 * j + 2]);
        acc[4 * j + 3] = fmaf(part[4 * j + 3], s1, acc[4 * j + 3]);
      }
    }
  }
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    const int col = 8 * j + 2 * (lane & 3);
    p.c[r0 * 128 + col] = acc[4 * j];
    p.c[r0 * 128 + col + 1] = acc[4 * j + 1];
    p.c[r1 * 128 + col] = acc[4 * j + 2];
    p.c[r1 * 128 + col + 1] = acc[4 * j + 3];
  }
#else
  __trap();
#endif
}

}  // namespace

void run_wgmma_fp8_probe(const Fp8ProbeParams& p, cudaStream_t stream) {
  if (p.promote)
    wgmma_fp8_probe_kernel<true><<<1, 128, 0, stream>>>(p);
  else
    wgmma_fp8_probe_kernel<false><<<1, 128, 0, stream>>>(p);
  DI_CUDA_CHECK_LAUNCH();
}

}  // namespace deepinfer::testing
