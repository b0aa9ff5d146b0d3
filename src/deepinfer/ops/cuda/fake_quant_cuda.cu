// QAT fake quantization (quantize + dequantize in place), block-wise along rows, with the CPU op's scale
// rules and RNE conversions (device_math.cuh mirrors core/dtype.h; the block itself is fake_quant.cuh's), so results
// match the CPU bit for bit.
// One thread per block of 16/32 values: the op is tiny next to the GEMMs around it.
#include <cstdint>

#include "deepinfer/core/error.h"
#include "deepinfer/ops/cuda/device_math.cuh"
#include "deepinfer/ops/cuda/fake_quant.cuh"
#include "deepinfer/ops/cuda/kernels.h"

namespace deepinfer::cuda {
namespace {

template <FakeQuantKind K>
__global__ void fake_quant_kernel(float* x, int64_t blocks) {
  const int64_t b = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (b >= blocks) return;
  fake_quant_block<K>(x + b * fake_quant_block_size<K>());
}

// The same blocks read from `in` and written to x (one pass instead of a copy and an in-place pass: act_quant's
// rounded copies of GEMM inputs). The block's values go through registers with the in-place kernel's arithmetic;
// kVec: 16-byte loads and stores (both pointers 16-byte aligned), else one float at a time.
template <FakeQuantKind K, bool kVec>
__global__ void fake_quant_copy_kernel(const float* in, float* x, int64_t blocks) {
  constexpr int kBlock = fake_quant_block_size<K>();
  const int64_t b = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (b >= blocks) return;
  float v[kBlock];
#pragma unroll
  for (int i = 0; i < (kVec ? kBlock / 4 : kBlock); ++i) {
    if constexpr (kVec)
      reinterpret_cast<float4*>(v)[i] = reinterpret_cast<const float4*>(in + b * kBlock)[i];
    else
      v[i] = in[b * kBlock + i];
  }
  fake_quant_block<K>(v);
#pragma unroll
  for (int i = 0; i < (kVec ? kBlock / 4 : kBlock); ++i) {
    if constexpr (kVec)
      reinterpret_cast<float4*>(x + b * kBlock)[i] = reinterpret_cast<const float4*>(v)[i];
    else
      x[b * kBlock + i] = v[i];
  }
}

// One thread a block of 32: fake_quant_block's kFP8E4M3Ue8m0Block32 scale and codes, kept as bytes (the scale's
// exponent field is its e8m0 byte: the amax floor keeps it a normal float).
__global__ void mxfp8_quantize_kernel(const float* x, uint8_t* codes, uint8_t* scales, int64_t blocks) {
  const int64_t b = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (b >= blocks) return;
  float v[32];
  const float4* src = reinterpret_cast<const float4*>(x + b * 32);
#pragma unroll
  for (int i = 0; i < 8; ++i) reinterpret_cast<float4*>(v)[i] = src[i];
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 32; ++i) amax = fmaxf(amax, fabsf(v[i]));
  const float s = pow2_ceil_dev(__fmul_rn(fmaxf(amax, 1e-4f), static_cast<float>(1.0 / 448.0)));
  uint32_t words[8];
#pragma unroll
  for (int w = 0; w < 8; ++w) {
    uint32_t word = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float q = fminf(fmaxf(__fdiv_rn(v[4 * w + j], s), -448.0f), 448.0f);
      word |= static_cast<uint32_t>(f32_to_e4m3_dev(q)) << (8 * j);
    }
    words[w] = word;
  }
  uint4* dst = reinterpret_cast<uint4*>(codes + b * 32);
  dst[0] = make_uint4(words[0], words[1], words[2], words[3]);
  dst[1] = make_uint4(words[4], words[5], words[6], words[7]);
  scales[b] = static_cast<uint8_t>(__float_as_uint(s) >> 23);
}

// A 128-value block's scale, its values four a lane of a warp: the block's amax by shuffles.
template <bool kUe8m0>
__device__ __forceinline__ float block128_scale(const float4& v) {
  float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, o));
  return fp8_block128_scale_dev(amax, kUe8m0);
}

// The 128-value kinds: a warp a block, four values a lane (kVec: 16-byte loads, `in` and x 16-byte aligned), the
// block's amax by shuffles; from `in` (or x in place) into x.
template <bool kUe8m0, bool kVec>
__global__ void fake_quant128_kernel(const float* in, float* x, int64_t blocks) {
  const int64_t b = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (b >= blocks) return;  // whole warps
  const float* src = in + b * 128 + 4 * lane;
  const float4 v = kVec ? *reinterpret_cast<const float4*>(src) : make_float4(src[0], src[1], src[2], src[3]);
  const float s = block128_scale<kUe8m0>(v);
  auto round = [&](float f) { return __fmul_rn(e4m3_to_f32_dev(fp8_block128_code(f, s)), s); };
  const float4 o = make_float4(round(v.x), round(v.y), round(v.z), round(v.w));
  float* dst = x + b * 128 + 4 * lane;
  if constexpr (kVec) {
    *reinterpret_cast<float4*>(dst) = o;
  } else {
    dst[0] = o.x;
    dst[1] = o.y;
    dst[2] = o.z;
    dst[3] = o.w;
  }
}

// kFP8E4M3(Ue8m0)Block128's scale and codes as an operand: a warp a block, a lane's four codes one 4-byte store.
template <bool kUe8m0>
__global__ void fp8_block128_quantize_kernel(Fp8Block128QuantizeKernelParams p, int64_t blocks) {
  const int64_t b = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (b >= blocks) return;
  const int64_t kb = p.cols / 128, r = b / kb, c = b % kb;
  const float4 v = reinterpret_cast<const float4*>(p.x + r * p.ldx + c * 128)[lane];
  const float s = block128_scale<kUe8m0>(v);
  const uint32_t word = fp8_block128_code(v.x, s) | (fp8_block128_code(v.y, s) << 8) |
                        (fp8_block128_code(v.z, s) << 16) | (static_cast<uint32_t>(fp8_block128_code(v.w, s)) << 24);
  reinterpret_cast<uint32_t*>(p.codes + r * p.ldc + c * 128)[lane] = word;
  if (lane == 0) p.scales[r * p.scale_row_stride + c * p.scale_block_stride] = s;
}

template <FakeQuantKind K>
void launch(const FakeQuantKernelParams& p, int64_t blocks, cudaStream_t stream) {
  const unsigned grid = grid_1d(blocks, 128);
  const bool vec = reinterpret_cast<uintptr_t>(p.in) % 16 == 0 && reinterpret_cast<uintptr_t>(p.x) % 16 == 0;
  if (!p.in)
    fake_quant_kernel<K><<<grid, 128, 0, stream>>>(p.x, blocks);
  else if (vec)
    fake_quant_copy_kernel<K, true><<<grid, 128, 0, stream>>>(p.in, p.x, blocks);
  else
    fake_quant_copy_kernel<K, false><<<grid, 128, 0, stream>>>(p.in, p.x, blocks);
}

}  // namespace

void run_mxfp8_quantize(const Mxfp8QuantizeKernelParams& p, cudaStream_t stream) {
  DI_CHECK(p.cols % 32 == 0) << "mxfp8 quantize: " << p.cols << " columns are not whole blocks of 32";
  DI_CHECK(reinterpret_cast<uintptr_t>(p.x) % 16 == 0 && reinterpret_cast<uintptr_t>(p.codes) % 16 == 0)
      << "mxfp8 quantize: x and codes must be 16-byte aligned";
  const int64_t blocks = p.rows * p.cols / 32;
  if (blocks == 0) return;
  mxfp8_quantize_kernel<<<grid_1d(blocks, 128), 128, 0, stream>>>(p.x, p.codes, p.scales, blocks);
  DI_CUDA_CHECK_LAUNCH();
}

void run_fp8_block128_quantize(const Fp8Block128QuantizeKernelParams& p, cudaStream_t stream) {
  DI_CHECK(p.cols % 128 == 0 && p.ldx % 4 == 0 && p.ldc % 4 == 0 && reinterpret_cast<uintptr_t>(p.x) % 16 == 0 &&
           reinterpret_cast<uintptr_t>(p.codes) % 4 == 0)
      << "fp8 block quantize: " << p.cols << " columns (whole blocks of 128), 16-byte aligned rows and 4-byte codes";
  const int64_t blocks = p.rows * (p.cols / 128);
  if (blocks == 0) return;
  if (p.ue8m0)
    fp8_block128_quantize_kernel<true><<<grid_1d(blocks * 32, 256), 256, 0, stream>>>(p, blocks);
  else
    fp8_block128_quantize_kernel<false><<<grid_1d(blocks * 32, 256), 256, 0, stream>>>(p, blocks);
  DI_CUDA_CHECK_LAUNCH();
}

void run_fake_quant(const FakeQuantKernelParams& p, cudaStream_t stream) {
  const int64_t block = fake_quant_block_len(p.kind);
  if (p.cols % block != 0 || p.rows * p.cols == 0) return;  // as the CPU op: unblockable rows pass through
  const int64_t blocks = p.rows * p.cols / block;
  if (block == 128) {
    const float* in = p.in ? p.in : p.x;
    const bool vec = reinterpret_cast<uintptr_t>(in) % 16 == 0 && reinterpret_cast<uintptr_t>(p.x) % 16 == 0;
    const unsigned grid = grid_1d(blocks * 32, 256);
    const bool ue8m0 = p.kind == FakeQuantKind::kFP8E4M3Ue8m0Block128;
    if (ue8m0 && vec)
      fake_quant128_kernel<true, true><<<grid, 256, 0, stream>>>(in, p.x, blocks);
    else if (ue8m0)
      fake_quant128_kernel<true, false><<<grid, 256, 0, stream>>>(in, p.x, blocks);
    else if (vec)
      fake_quant128_kernel<false, true><<<grid, 256, 0, stream>>>(in, p.x, blocks);
    else
      fake_quant128_kernel<false, false><<<grid, 256, 0, stream>>>(in, p.x, blocks);
    DI_CUDA_CHECK_LAUNCH();
    return;
  }
  switch (p.kind) {
    case FakeQuantKind::kFP8E4M3Ue8m0Block32:
      launch<FakeQuantKind::kFP8E4M3Ue8m0Block32>(p, blocks, stream);
      break;
    case FakeQuantKind::kFP4Ue8m0Block32:
      launch<FakeQuantKind::kFP4Ue8m0Block32>(p, blocks, stream);
      break;
    case FakeQuantKind::kFP4E4m3Block16:
      launch<FakeQuantKind::kFP4E4m3Block16>(p, blocks, stream);
      break;
    default:
      break;  // the 128-value kinds: above
  }
  DI_CUDA_CHECK_LAUNCH();
}

}  // namespace deepinfer::cuda
