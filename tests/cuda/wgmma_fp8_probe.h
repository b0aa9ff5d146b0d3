// A one-tile probe of the e4m3 wgmma (wgmma_fp8_probe.cu): the first device test of the FP8 expert GEMM's pieces.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace deepinfer::testing {

struct Fp8ProbeParams {
  const uint8_t* a = nullptr;      // e4m3 [64, 128], row-major (K contiguous)
  const uint8_t* b = nullptr;      // e4m3 [128, 128]: 128 weight rows, K contiguous
  const float* a_scale = nullptr;  // [64, 4]: each row's factor for each 32-value block (promote only)
  float* c = nullptr;              // [64, 128]: c[m][n] = Σ_k a[m][k] · b[n][k] (· the block's factor)
  bool promote = false;            // false: the hardware accumulates the four k32 products
};
void run_wgmma_fp8_probe(const Fp8ProbeParams& p, cudaStream_t stream);

}  // namespace deepinfer::testing
