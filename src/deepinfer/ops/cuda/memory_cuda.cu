// Data moves of the model between ops (ops/memory.h): a generic strided copy (layout changes such as
// column slices, broadcasts into the mHC streams, group scatter), an f32 fill and an f32 add, so that no
// activation leaves the device. Not bandwidth-trivial at prefill sizes: the V4 grouped output moves [T, 64·512] f32
// (1.07 GB at 8192 tokens) into group-major order every layer; one 4-byte element a thread with 64-bit index
// division ran that at 1.18 TB/s (ncu, H200), so rows of 16-byte multiples move 16 bytes a thread, and the index
// math is 32-bit whenever the element count allows.
#include <algorithm>
#include <cstdint>

#include "deepinfer/ops/cuda/cuda_check.h"
#include "deepinfer/ops/cuda/cuda_runtime.h"
#include "deepinfer/ops/cuda/device_math.cuh"
#include "deepinfer/ops/cuda/kernels.h"
#include "deepinfer/ops/cuda/kv_record.cuh"

namespace deepinfer::cuda {
namespace {

// T: the unit moved (1 to 16 bytes); I: the index type (uint32_t when the unit count and every extent fit).
template <typename T, typename I>
__global__ void strided_copy_kernel(StridedCopyKernelParams p, I n) {
  const I i = static_cast<I>(blockIdx.x) * static_cast<I>(blockDim.x) + static_cast<I>(threadIdx.x);
  if (i >= n) return;
  I rest = i;
  int64_t doff = 0, soff = 0;
#pragma unroll
  for (int d = 3; d >= 0; --d) {
    const I extent = static_cast<I>(p.shape[d]);
    const I idx = rest % extent;
    rest /= extent;
    doff += static_cast<int64_t>(idx) * p.dst_strides[d];
    soff += static_cast<int64_t>(idx) * p.src_strides[d];
  }
  static_cast<T*>(p.dst)[doff] = static_cast<const T*>(p.src)[soff];
}

__global__ void fill_kernel(float* out, float value, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = value;
}

__global__ void add_kernel(float* out, const float* in, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] += in[i];
}

__global__ void cast_f32_bf16_kernel(uint16_t* out, const float* in, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = f32_to_bf16_bits(in[i]);
}

__global__ void cast_bf16_f32_kernel(float* out, const uint16_t* in, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = bf16_bits_to_f32(in[i]);
}

// One block per row; threads stride over the row's width.
__global__ void scatter_rows_kernel(ScatterRowsKernelParams p) {
  const int64_t t = blockIdx.x;
  const int64_t at = p.index[t];
  if (at < 0) {
    if (at != -1 && threadIdx.x == 0) atomicOr(p.status, kStatusScatterRange);
    return;
  }
  if (at >= p.dst_rows) {
    if (threadIdx.x == 0) atomicOr(p.status, kStatusScatterRange);
    return;
  }
  const float* src = p.src + t * p.width;
  if (pool_record(p.dst_format)) {
    auto* dst = static_cast<uint8_t*>(p.dst) + at * pool_row_bytes(p.dst_format, p.width);
    for (int64_t b = threadIdx.x; b < p.width / record_block(p.dst_format); b += blockDim.x)
      if (!record_write_block(p.dst_format, src, p.width, b, dst)) atomicOr(p.status, kStatusRecordEncode);
  } else if (p.dst_format == PoolFormat::kBf16) {
    auto* dst = static_cast<uint16_t*>(p.dst) + at * p.width;
    for (int64_t j = threadIdx.x; j < p.width; j += blockDim.x) dst[j] = f32_to_bf16_bits(src[j]);
  } else {
    auto* dst = static_cast<float*>(p.dst) + at * p.width;
    for (int64_t j = threadIdx.x; j < p.width; j += blockDim.x) dst[j] = src[j];
  }
}

// One thread a block of values (16 or 32): the row's record, written block by block.
__global__ void records_encode_kernel(RecordRowsKernelParams p) {
  const int64_t blocks = p.width / record_block(p.format);
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= p.rows * blocks) return;
  const int64_t r = i / blocks, b = i % blocks;
  auto* dst = static_cast<uint8_t*>(p.dst) + r * pool_row_bytes(p.format, p.width);
  if (!record_write_block(p.format, static_cast<const float*>(p.src) + r * p.width, p.width, b, dst))
    atomicOr(p.status, kStatusRecordEncode);
}

// One thread 4 values.
__global__ void records_decode_kernel(RecordRowsKernelParams p) {
  const int64_t quads = p.width / 4;
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= p.rows * quads) return;
  const int64_t r = i / quads, q = i % quads;
  const float4 v =
      record_load4(static_cast<const uint8_t*>(p.src) + r * pool_row_bytes(p.format, p.width), q, p.format, p.width);
  float* out = static_cast<float*>(p.dst) + r * p.width + 4 * q;
  out[0] = v.x;
  out[1] = v.y;
  out[2] = v.z;
  out[3] = v.w;
}

constexpr int kThreads = 256;
unsigned blocks_for(int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

}  // namespace

namespace {

template <typename T>
void launch_strided_copy(const StridedCopyKernelParams& p, int64_t n, cudaStream_t stream) {
  const bool narrow =
      n < (int64_t{1} << 31) && std::max({p.shape[0], p.shape[1], p.shape[2], p.shape[3]}) < (int64_t{1} << 31);
  if (narrow)
    strided_copy_kernel<T, uint32_t><<<blocks_for(n), kThreads, 0, stream>>>(p, static_cast<uint32_t>(n));
  else
    strided_copy_kernel<T, int64_t><<<blocks_for(n), kThreads, 0, stream>>>(p, n);
}

// The same copy in 16-byte units when the innermost dimension is contiguous on both sides and every row, stride and
// base address is a multiple of 16 bytes (a broadcast's zero stride too): p rewritten in place, true if it applies.
bool as_16_byte_units(StridedCopyKernelParams& p) {
  const int64_t e = p.elem_bytes;
  if (e <= 0 || 16 % e != 0 || p.dst_strides[3] != 1 || p.src_strides[3] != 1) return false;
  if ((p.shape[3] * e) % 16 != 0) return false;
  if (reinterpret_cast<uintptr_t>(p.dst) % 16 != 0 || reinterpret_cast<uintptr_t>(p.src) % 16 != 0) return false;
  for (int d = 0; d < 3; ++d)
    if ((p.dst_strides[d] * e) % 16 != 0 || (p.src_strides[d] * e) % 16 != 0) return false;
  const int64_t v = 16 / e;
  p.shape[3] /= v;
  for (int d = 0; d < 3; ++d) {
    p.dst_strides[d] /= v;
    p.src_strides[d] /= v;
  }
  p.elem_bytes = 16;
  return true;
}

}  // namespace

void run_strided_copy(const StridedCopyKernelParams& p, cudaStream_t stream) {
  const int64_t n = p.shape[0] * p.shape[1] * p.shape[2] * p.shape[3];
  if (n == 0) return;
  StridedCopyKernelParams q = p;
  if (as_16_byte_units(q)) {
    launch_strided_copy<uint4>(q, n / (16 / p.elem_bytes), stream);
    DI_CUDA_CHECK_LAUNCH();
    return;
  }
  switch (p.elem_bytes) {
    case 1:
      launch_strided_copy<uint8_t>(p, n, stream);
      break;
    case 2:
      launch_strided_copy<uint16_t>(p, n, stream);
      break;
    case 4:
      launch_strided_copy<uint32_t>(p, n, stream);
      break;
    case 8:
      launch_strided_copy<uint64_t>(p, n, stream);
      break;
    default:
      DI_FAIL(ErrorCode::kInternal) << "strided copy: element size " << p.elem_bytes;
  }
  DI_CUDA_CHECK_LAUNCH();
}

void run_fill_f32(float* out, float value, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  fill_kernel<<<blocks_for(n), kThreads, 0, stream>>>(out, value, n);
  DI_CUDA_CHECK_LAUNCH();
}

void run_add_f32(float* out, const float* in, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  add_kernel<<<blocks_for(n), kThreads, 0, stream>>>(out, in, n);
  DI_CUDA_CHECK_LAUNCH();
}

void run_cast_f32_bf16(uint16_t* out, const float* in, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  cast_f32_bf16_kernel<<<blocks_for(n), kThreads, 0, stream>>>(out, in, n);
  DI_CUDA_CHECK_LAUNCH();
}

void run_cast_bf16_f32(float* out, const uint16_t* in, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  cast_bf16_f32_kernel<<<blocks_for(n), kThreads, 0, stream>>>(out, in, n);
  DI_CUDA_CHECK_LAUNCH();
}

void run_records_encode(const RecordRowsKernelParams& p, cudaStream_t stream) {
  if (p.rows == 0) return;
  records_encode_kernel<<<blocks_for(p.rows * (p.width / record_block(p.format))), kThreads, 0, stream>>>(p);
  DI_CUDA_CHECK_LAUNCH();
}

void run_records_decode(const RecordRowsKernelParams& p, cudaStream_t stream) {
  if (p.rows == 0) return;
  records_decode_kernel<<<blocks_for(p.rows * (p.width / 4)), kThreads, 0, stream>>>(p);
  DI_CUDA_CHECK_LAUNCH();
}

PoolFormat pool_format_of(DType dtype, FakeQuantKind record) {
  if (dtype == DType::kF32) return PoolFormat::kF32;
  if (dtype == DType::kBF16) return PoolFormat::kBf16;
  DI_CHECK_INTERNAL(dtype == DType::kU8) << "a paged pool of " << dtype_name(dtype);
  switch (record) {
    case FakeQuantKind::kFP8E4M3Ue8m0Block32:
      return PoolFormat::kFp8Ue8m0B32;
    case FakeQuantKind::kFP4E4m3Block16:
      return PoolFormat::kFp4E4m3B16;
    case FakeQuantKind::kFP4Ue8m0Block32:
      return PoolFormat::kFp4Ue8m0B32;
    default:
      break;
  }
  DI_FAIL(ErrorCode::kInternal) << "no quantized record of this fake-quant kind";
}

void run_scatter_rows(const ScatterRowsKernelParams& p, cudaStream_t stream) {
  if (p.rows == 0) return;
  scatter_rows_kernel<<<static_cast<unsigned>(p.rows), 128, 0, stream>>>(p);
  DI_CUDA_CHECK_LAUNCH();
}

}  // namespace deepinfer::cuda
