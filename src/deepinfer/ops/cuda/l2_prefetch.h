// Weights pulled into L2 ahead of the kernels that read them (decode at small batches: each GEMM streams a few MB and
// is mostly launch, ramp and DRAM latency, so HBM sits idle between and inside the calls; a prefetch issued one call
// ahead lets the next call read from L2). cp.async.bulk.prefetch.L2: fire and forget, nothing waits for it, and a
// prefetch never changes a result.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace deepinfer::cuda {

constexpr int kL2PrefetchMaxRanges = 32;

struct L2PrefetchRange {
  const void* ptr = nullptr;  // 16-byte aligned (bytes past the last whole 16 are left out)
  size_t bytes = 0;
};

struct L2PrefetchKernelParams {
  L2PrefetchRange ranges[kL2PrefetchMaxRanges];
  int count = 0;
};

// Pieces of kL2PrefetchPieceBytes over one block of 32 threads an SM (sms blocks at most).
constexpr size_t kL2PrefetchPieceBytes = 16 * 1024;
void launch_l2_prefetch(const L2PrefetchKernelParams& p, int sms, cudaStream_t stream);

}  // namespace deepinfer::cuda
