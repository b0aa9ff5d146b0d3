#include "deepinfer/ops/cuda/l2_prefetch.h"

#include <algorithm>

#include "deepinfer/ops/cuda/cuda_check.h"

namespace deepinfer::cuda {
namespace {

// Thread i of the grid takes pieces i, i + threads, ... of the ranges laid end to end.
__global__ void l2_prefetch_kernel(L2PrefetchKernelParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const size_t threads = static_cast<size_t>(gridDim.x) * blockDim.x;
  size_t piece = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  size_t first = 0;  // the first piece of range r
  for (int r = 0; r < p.count; ++r) {
    const size_t bytes = p.ranges[r].bytes & ~size_t{15};
    const size_t pieces = (bytes + kL2PrefetchPieceBytes - 1) / kL2PrefetchPieceBytes;
    for (; piece < first + pieces; piece += threads) {
      const size_t off = (piece - first) * kL2PrefetchPieceBytes;
      const auto size = static_cast<unsigned>(bytes - off < kL2PrefetchPieceBytes ? bytes - off : kL2PrefetchPieceBytes);
      const char* a = static_cast<const char*>(p.ranges[r].ptr) + off;
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(a), "r"(size) : "memory");
    }
    first += pieces;
  }
#endif
}

}  // namespace

void launch_l2_prefetch(const L2PrefetchKernelParams& p, int sms, cudaStream_t stream) {
  size_t pieces = 0;
  for (int r = 0; r < p.count; ++r)
    pieces += ((p.ranges[r].bytes & ~size_t{15}) + kL2PrefetchPieceBytes - 1) / kL2PrefetchPieceBytes;
  if (pieces == 0) return;
  const int blocks = static_cast<int>(std::clamp<size_t>((pieces + 31) / 32, 1, static_cast<size_t>(std::max(sms, 1))));
  l2_prefetch_kernel<<<blocks, 32, 0, stream>>>(p);
  DI_CUDA_CHECK(cudaGetLastError());
}

}  // namespace deepinfer::cuda
