// Data moves of the model between ops (ops/memory.h): a generic strided copy (layout changes such as
// column slices, broadcasts into the mHC streams, group scatter), an f32 fill and an f32 add. One thread per
// element; these are bandwidth-trivial next to the GEMMs and exist so that no activation leaves the device.
#include "deepinfer/ops/cuda/cuda_check.h"
#include "deepinfer/ops/cuda/cuda_runtime.h"
#include "deepinfer/ops/cuda/kernels.h"

namespace deepinfer::cuda {
namespace {

template <typename T>
__global__ void strided_copy_kernel(StridedCopyKernelParams p, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  int64_t rest = i, doff = 0, soff = 0;
#pragma unroll
  for (int d = 3; d >= 0; --d) {
    const int64_t idx = rest % p.shape[d];
    rest /= p.shape[d];
    doff += idx * p.dst_strides[d];
    soff += idx * p.src_strides[d];
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
  for (int64_t j = threadIdx.x; j < p.width; j += blockDim.x) p.dst[at * p.width + j] = p.src[t * p.width + j];
}

constexpr int kThreads = 256;
unsigned blocks_for(int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

}  // namespace

void run_strided_copy(const StridedCopyKernelParams& p, cudaStream_t stream) {
  const int64_t n = p.shape[0] * p.shape[1] * p.shape[2] * p.shape[3];
  if (n == 0) return;
  switch (p.elem_bytes) {
    case 1:
      strided_copy_kernel<uint8_t><<<blocks_for(n), kThreads, 0, stream>>>(p, n);
      break;
    case 2:
      strided_copy_kernel<uint16_t><<<blocks_for(n), kThreads, 0, stream>>>(p, n);
      break;
    case 4:
      strided_copy_kernel<uint32_t><<<blocks_for(n), kThreads, 0, stream>>>(p, n);
      break;
    case 8:
      strided_copy_kernel<uint64_t><<<blocks_for(n), kThreads, 0, stream>>>(p, n);
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

void run_scatter_rows(const ScatterRowsKernelParams& p, cudaStream_t stream) {
  if (p.rows == 0) return;
  scatter_rows_kernel<<<static_cast<unsigned>(p.rows), 128, 0, stream>>>(p);
  DI_CUDA_CHECK_LAUNCH();
}

}  // namespace deepinfer::cuda
