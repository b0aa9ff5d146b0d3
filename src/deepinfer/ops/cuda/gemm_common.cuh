// What the block-dequantizing GEMM's kernel files share (gemm_cuda.cu, gemm_chain_cuda.cu, gemm_tc_cuda.cu): the SIMT
// k-step and tile size, the per-element weight decode, and the entry points of the kernel families they hold.
#pragma once

#include <cuda_runtime.h>

#include <type_traits>

#include "deepinfer/ops/cuda/device_math.cuh"
#include "deepinfer/ops/cuda/kernels.h"

namespace deepinfer::cuda {

constexpr int kBK = 16;   // the SIMT tile's k-step (chains run over K rounded up to it)
constexpr int kSm = 128;  // the SIMT tile: kSm x kSm outputs a block

template <QuantFormat F>
__device__ __forceinline__ float load_weight(const void* b, const void* s, const GemmKernelParams& p, int64_t n,
                                             int64_t k) {
  if constexpr (F == QuantFormat::kFloat) {
    return static_cast<const float*>(b)[n * p.k + k];
  } else if constexpr (F == QuantFormat::kMXFP4) {
    const uint8_t byte = static_cast<const uint8_t*>(b)[n * (p.k / 2) + k / 2];
    return e2m1_to_f32_dev((k & 1) ? (byte >> 4) : (byte & 0xF)) *
           e8m0_to_f32_dev(static_cast<const uint8_t*>(s)[n * (p.k / 32) + k / 32]);
  } else {
    // Power-of-two blocks (every checkpoint: 128, 32) index with shifts: a 64-bit division is ~100 instructions
    // per weight here (the SIMT tile and the batch-invariant chain kernel call this once per element).
    int64_t si = n * p.scale_cols + (k >> 5);  // kFP8Row32
    if constexpr (F == QuantFormat::kFP8Block) {
      if ((p.block_n & (p.block_n - 1)) == 0 && (p.block_k & (p.block_k - 1)) == 0)
        si = (n >> (__ffs(p.block_n) - 1)) * p.scale_cols + (k >> (__ffs(p.block_k) - 1));
      else
        si = (n / p.block_n) * p.scale_cols + k / p.block_k;
    }
    const float scale =
        p.scale_e8m0 ? e8m0_to_f32_dev(static_cast<const uint8_t*>(s)[si]) : static_cast<const float*>(s)[si];
    return e4m3_to_f32_dev(static_cast<const uint8_t*>(b)[n * p.k + k]) * scale;
  }
}

// fn(std::integral_constant<QuantFormat, F>{}) for F = format: one switch for the entry points below, whose kernels
// are templates on the format.
template <class Fn>
void with_format(QuantFormat format, Fn&& fn) {
  switch (format) {
    case QuantFormat::kFloat:
      fn(std::integral_constant<QuantFormat, QuantFormat::kFloat>{});
      break;
    case QuantFormat::kFP8Block:
      fn(std::integral_constant<QuantFormat, QuantFormat::kFP8Block>{});
      break;
    case QuantFormat::kMXFP4:
      fn(std::integral_constant<QuantFormat, QuantFormat::kMXFP4>{});
      break;
    case QuantFormat::kFP8Row32:
      fn(std::integral_constant<QuantFormat, QuantFormat::kFP8Row32>{});
      break;
  }
}

// Vector loads: 16-byte weight chunks never straddle a row or a scale block, A rows are float4-aligned.
bool gemm_vector_ok(const GemmKernelParams& p, bool check_a);

// The SIMT tile (gemm_cuda.cu) for p.format: f32 weights with more than a few rows, and batch-invariant mode's
// many-row calls of formats the tensor-core sequence does not take.
void run_gemm_simt(const GemmKernelParams& p, bool vec, cudaStream_t stream);

// Batch-invariant mode past its tensor-core and f32-split kernels (gemm_chain_cuda.cu): the column-chain kernels for
// few rows, the SIMT tile for many; p.format's instantiation.
void run_gemm_chains(const GemmKernelParams& p, bool vec, cudaStream_t stream);

// The bf16 WMMA tile (gemm_tc_cuda.cu) for p.format: many rows, when neither wgmma nor the mma.sync kernel took the
// call.
void run_gemm_tc(const GemmKernelParams& p, bool vec, cudaStream_t stream);

}  // namespace deepinfer::cuda
