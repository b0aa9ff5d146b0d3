// Random fill on the device (synthetic weights and activations for `deepinfer bench`): a counter-based hash
// of (seed, byte index), so a fill costs one pass over the buffer and the same seed gives the same bytes.
#include <algorithm>

#include "deepinfer/ops/cuda/cuda_check.h"
#include "deepinfer/ops/cuda/device_math.cuh"
#include "deepinfer/ops/cuda/kernels.h"

namespace deepinfer::cuda {
namespace {

__device__ __forceinline__ uint64_t mix64(uint64_t z) {  // splitmix64 finaliser
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// One 8-byte word per thread step; the tail word is written byte by byte.
__global__ void fill_random_kernel(RandomFillKernelParams p) {
  const int64_t words = p.bytes / 8;
  for (int64_t w = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; w <= words;
       w += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint64_t r = mix64(p.seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(w));
    uint8_t b[8];
    for (int i = 0; i < 8; ++i) b[i] = static_cast<uint8_t>(r >> (8 * i));
    if (p.mode == RandomFillMode::kF32) {
      // Two uniform floats in [-range, range).
      float f[2];
      for (int i = 0; i < 2; ++i)
        f[i] = (static_cast<float>(static_cast<uint32_t>(r >> (32 * i)) >> 8) * (1.0f / 16777216.0f) * 2.0f - 1.0f) *
               p.range;
      r = static_cast<uint64_t>(__float_as_uint(f[0])) | (static_cast<uint64_t>(__float_as_uint(f[1])) << 32);
      for (int i = 0; i < 8; ++i) b[i] = static_cast<uint8_t>(r >> (8 * i));
    } else if (p.mode == RandomFillMode::kE4M3) {
      for (auto& c : b)
        if ((c & 0x7F) == 0x7F) c = 0x38;  // no NaN codes
    } else if (p.mode == RandomFillMode::kBF16) {
      // Sign and mantissa random, exponent in [2^-7, 2^0]: finite values of moderate size.
      for (int i = 0; i < 4; ++i) {
        const uint32_t h = static_cast<uint32_t>(r >> (16 * i)) & 0xFFFFu;
        const uint32_t v = (h & 0x807Fu) | ((120u + (h >> 7) % 8u) << 7);
        b[2 * i] = static_cast<uint8_t>(v);
        b[2 * i + 1] = static_cast<uint8_t>(v >> 8);
      }
    } else if (p.mode == RandomFillMode::kE8M0) {
      for (auto& c : b) c = static_cast<uint8_t>(p.e8m0_low + c % p.e8m0_span);
    }
    if (w < words) {
      *reinterpret_cast<uint64_t*>(static_cast<uint8_t*>(p.out) + 8 * w) =
          static_cast<uint64_t>(b[0]) | static_cast<uint64_t>(b[1]) << 8 | static_cast<uint64_t>(b[2]) << 16 |
          static_cast<uint64_t>(b[3]) << 24 | static_cast<uint64_t>(b[4]) << 32 | static_cast<uint64_t>(b[5]) << 40 |
          static_cast<uint64_t>(b[6]) << 48 | static_cast<uint64_t>(b[7]) << 56;
    } else {
      for (int64_t i = 0; 8 * w + i < p.bytes; ++i) static_cast<uint8_t*>(p.out)[8 * w + i] = b[i];
    }
  }
}

}  // namespace

void run_fill_random(const RandomFillKernelParams& p, cudaStream_t stream) {
  if (p.bytes == 0) return;
  DI_CHECK(reinterpret_cast<uintptr_t>(p.out) % 8 == 0) << "fill_random: the buffer must be 8-byte aligned";
  DI_CHECK(p.mode != RandomFillMode::kF32 || p.bytes % 4 == 0) << "fill_random: f32 fill of " << p.bytes << " bytes";
  const int64_t words = p.bytes / 8 + 1;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(ceil_div(words, 256), 65536));
  fill_random_kernel<<<blocks, 256, 0, stream>>>(p);
  DI_CUDA_CHECK_LAUNCH();
}

}  // namespace deepinfer::cuda
