// A one-tile probe of Hopper's e4m3 wgmma for the FP8 expert GEMM that --activation-quant mxfp8 opens (docs/PERF.md,
// "Next steps after session 26"): one warpgroup, A = 64 token rows and B = 128 weight rows of 128 e4m3 codes each in
// the 128-byte-swizzled K-major layout of gemm_wgmma_cuda.cu (a row of 128 one-byte codes is the bf16 kernel's row of
// 64 two-byte values), four wgmma m64n128k32 over K. Either the hardware accumulates all four (scale-d = 1 after the
// first), or each k32 block starts from zero and is added into fp32 times its row's block scale (the promotion the
// kernel needs, as the activation scale differs per row and 32 values). The test compares both with exact sums: the
// PTX form, the layout with one-byte elements, the accumulator map and the precision of the FP8 accumulation.
#include "cuda/wgmma_fp8_probe.h"

#include <cstdint>

#include "deepinfer/core/error.h"
#include "deepinfer/ops/cuda/cuda_check.h"

namespace deepinfer::testing {
namespace {

__device__ __forceinline__ uint32_t swz(int r, int c) { return r * 128 + ((c ^ (r & 7)) << 4); }

__device__ __forceinline__ uint64_t smem_desc(uint32_t addr) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>(1) << 16) |
         (static_cast<uint64_t>(1024 >> 4) << 32) | (static_cast<uint64_t>(1) << 62);
}

// d (+)= A · Bᵀ over one k32 slice; accumulate = false starts from zero (scale-d = 0).
__device__ __forceinline__ void wgmma_m64n128k32_e4m3(float (&d)[64], uint64_t desc_a, uint64_t desc_b,
                                                      bool accumulate) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "
      "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, "
      "%46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "%64, %65, p, 1, 1;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),
        "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),
        "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
        "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b), "r"(accumulate ? 1 : 0));
#else
  __trap();
#endif
}

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
