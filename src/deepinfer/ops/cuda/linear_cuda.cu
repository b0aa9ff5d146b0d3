// Linear family, elementwise parts: weight dequantization (float, FP8 block-scaled, MXFP4, FP8 per-32 rows)
// to f32, embedding row gathers, and the f32 -> bf16 cast (one term, or two: hi + lo) that feeds cuBLASLt. The GEMMs
// themselves are in gemm_cuda.cu (own kernel) and cuda_backend_impl.cc (cuBLASLt).
#include "deepinfer/ops/cuda/cuda_runtime.h"
#include "deepinfer/ops/cuda/device_math.cuh"
#include "deepinfer/ops/cuda/kernels.h"

namespace deepinfer::cuda {
namespace {

__device__ __forceinline__ float load_scale(const void* scale, bool e8m0, int64_t i) {
  return e8m0 ? e8m0_to_f32_dev(static_cast<const uint8_t*>(scale)[i]) : static_cast<const float*>(scale)[i];
}

__global__ void dequantize_kernel(DequantizeKernelParams p) {
  const int64_t total = p.n * p.k;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = idx / p.k, j = idx % p.k;
    float v;
    switch (p.format) {
      case QuantFormat::kFloat:
        if (p.float_kind == FloatKind::kF32)
          v = static_cast<const float*>(p.weight)[idx];
        else if (p.float_kind == FloatKind::kBF16)
          v = bf16_bits_to_f32(static_cast<const uint16_t*>(p.weight)[idx]);
        else
          v = __half2float(static_cast<const __half*>(p.weight)[idx]);
        break;
      case QuantFormat::kFP8Block:
        v = e4m3_to_f32_dev(static_cast<const uint8_t*>(p.weight)[idx]) *
            load_scale(p.scale, p.scale_e8m0, (i / p.block_n) * p.scale_cols + j / p.block_k);
        break;
      case QuantFormat::kMXFP4: {
        const uint8_t byte = static_cast<const uint8_t*>(p.weight)[i * (p.k / 2) + j / 2];
        v = e2m1_to_f32_dev((j & 1) ? (byte >> 4) : (byte & 0xF)) *
            e8m0_to_f32_dev(static_cast<const uint8_t*>(p.scale)[i * (p.k / 32) + j / 32]);
        break;
      }
      case QuantFormat::kFP8Row32:
      default:
        v = e4m3_to_f32_dev(static_cast<const uint8_t*>(p.weight)[idx]) *
            load_scale(p.scale, p.scale_e8m0, i * p.scale_cols + j / 32);
        break;
    }
    if (p.out_bf16)
      static_cast<__nv_bfloat16*>(p.out_bf16)[idx] = __float2bfloat16_rn(v);
    else
      p.out[idx] = v;
  }
}

// One block per token row; 16-byte copies when the row allows it.
__global__ void embedding_kernel(EmbeddingKernelParams p) {
  const int64_t t = blockIdx.x;
  const int64_t id = p.ids[t];
  float* out = p.out + t * p.dim;
  if (id < 0 || id >= p.vocab) {
    if (threadIdx.x == 0) atomicOr(p.status, kStatusEmbeddingIdRange);
    for (int64_t i = threadIdx.x; i < p.dim; i += blockDim.x) out[i] = __uint_as_float(0x7FC00000u);
    return;
  }
  const float* row = p.table + id * p.dim;
  if (p.dim % 4 == 0 && ((reinterpret_cast<uintptr_t>(p.table) | reinterpret_cast<uintptr_t>(p.out)) & 15) == 0) {
    const float4* src = reinterpret_cast<const float4*>(row);
    float4* dst = reinterpret_cast<float4*>(out);
    for (int64_t i = threadIdx.x; i < p.dim / 4; i += blockDim.x) dst[i] = src[i];
  } else {
    for (int64_t i = threadIdx.x; i < p.dim; i += blockDim.x) out[i] = row[i];
  }
}

__global__ void cast_f32_to_bf16_kernel(const float* in, __nv_bfloat16* out, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = __float2bfloat16_rn(in[i]);
}

// cast_f32_to_bf16_kernel with 8 values a thread (n % 8 == 0, in and out 16-byte aligned): two 16-byte loads in
// flight before one 16-byte store, where the grid-stride loop above has one 4-byte load a thread in flight
// (latency-bound: 64 µs a call on average in a V4-Flash prefill of 8192 tokens, ncu); the same __float2bfloat16_rn of
// each value.
__global__ void cast_f32_to_bf16_vec_kernel(const float4* in, uint4* out, int64_t n8) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n8) return;
  const float4 a = in[2 * i], b = in[2 * i + 1];
  __align__(16) __nv_bfloat162 o[4];
  o[0].x = __float2bfloat16_rn(a.x);
  o[0].y = __float2bfloat16_rn(a.y);
  o[1].x = __float2bfloat16_rn(a.z);
  o[1].y = __float2bfloat16_rn(a.w);
  o[2].x = __float2bfloat16_rn(b.x);
  o[2].y = __float2bfloat16_rn(b.y);
  o[3].x = __float2bfloat16_rn(b.z);
  o[3].y = __float2bfloat16_rn(b.w);
  out[i] = *reinterpret_cast<const uint4*>(o);
}

__global__ void split_f32_to_bf16_kernel(const float* in, __nv_bfloat16* hi, __nv_bfloat16* lo, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    split_bf16(in[i], hi[i], lo[i]);
}

// 8 values a thread with 16-byte loads and stores (n % 8 == 0, every pointer 16-byte aligned), as
// cast_f32_to_bf16_vec_kernel.
__global__ void split_f32_to_bf16_vec_kernel(const float4* in, uint4* hi, uint4* lo, int64_t n8) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n8) return;
  const float4 a = in[2 * i], b = in[2 * i + 1];
  const float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
  __align__(16) __nv_bfloat16 h[8];
  __align__(16) __nv_bfloat16 l[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) split_bf16(v[j], h[j], l[j]);
  hi[i] = *reinterpret_cast<const uint4*>(h);
  lo[i] = *reinterpret_cast<const uint4*>(l);
}

}  // namespace

void run_dequantize(const DequantizeKernelParams& p, cudaStream_t stream) {
  if (p.n * p.k == 0) return;
  const unsigned blocks = grid_1d(p.n * p.k, 256) > 65536 ? 65536 : grid_1d(p.n * p.k, 256);
  dequantize_kernel<<<blocks, 256, 0, stream>>>(p);
  DI_CUDA_CHECK_LAUNCH();
}

void run_embedding(const EmbeddingKernelParams& p, cudaStream_t stream) {
  if (p.tokens == 0 || p.dim == 0) return;
  embedding_kernel<<<static_cast<unsigned>(p.tokens), 256, 0, stream>>>(p);
  DI_CUDA_CHECK_LAUNCH();
}

void run_cast_f32_to_bf16(const float* in, void* out_bf16, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  const auto aligned16 = [](const void* q) { return reinterpret_cast<uintptr_t>(q) % 16 == 0; };
  if (n % 8 == 0 && aligned16(in) && aligned16(out_bf16)) {  // 1.5x the grid-stride kernel at the copy rate
    cast_f32_to_bf16_vec_kernel<<<grid_1d(n / 8, 256), 256, 0, stream>>>(reinterpret_cast<const float4*>(in),
                                                                         static_cast<uint4*>(out_bf16), n / 8);
    DI_CUDA_CHECK_LAUNCH();
    return;
  }
  const unsigned blocks = grid_1d(n, 256) > 65536 ? 65536 : grid_1d(n, 256);
  cast_f32_to_bf16_kernel<<<blocks, 256, 0, stream>>>(in, static_cast<__nv_bfloat16*>(out_bf16), n);
  DI_CUDA_CHECK_LAUNCH();
}

void run_split_f32_to_bf16(const float* in, void* hi_bf16, void* lo_bf16, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  const auto aligned16 = [](const void* q) { return reinterpret_cast<uintptr_t>(q) % 16 == 0; };
  if (n % 8 == 0 && aligned16(in) && aligned16(hi_bf16) && aligned16(lo_bf16)) {
    split_f32_to_bf16_vec_kernel<<<grid_1d(n / 8, 256), 256, 0, stream>>>(
        reinterpret_cast<const float4*>(in), static_cast<uint4*>(hi_bf16), static_cast<uint4*>(lo_bf16), n / 8);
    DI_CUDA_CHECK_LAUNCH();
    return;
  }
  const unsigned blocks = grid_1d(n, 256) > 65536 ? 65536 : grid_1d(n, 256);
  split_f32_to_bf16_kernel<<<blocks, 256, 0, stream>>>(in, static_cast<__nv_bfloat16*>(hi_bf16),
                                                       static_cast<__nv_bfloat16*>(lo_bf16), n);
  DI_CUDA_CHECK_LAUNCH();
}

}  // namespace deepinfer::cuda
