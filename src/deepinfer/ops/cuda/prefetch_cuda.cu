// L2 prefetch of weights (CudaBackend::prefetch): at decode batches of a few rows a step alternates between calls that
// stream weights at the memory's rate and latency-bound calls (mHC, norms, attention, the router) during which the
// memory idles. A prefetch launched before the latency-bound calls reads the next weights into L2 meanwhile, so the
// weight-streaming call that follows finds them there. Each thread sends one bulk prefetch (sm_90's
// cp.async.bulk.prefetch.L2: the copy engine of its SM fetches the piece; nothing waits for it), so the kernel is
// over in about a launch's time and the bytes arrive while the next kernels run.
#include <cstdint>

#include "deepinfer/ops/cuda/cuda_check.h"
#include "deepinfer/ops/cuda/kernels.h"

namespace deepinfer::cuda {
namespace {

constexpr int kPrefetchThreads = 128;

// The 16-byte-aligned interior [a, b) of range r: bulk prefetches take 16-byte-aligned addresses and sizes.
__host__ __device__ inline void aligned_interior(const L2PrefetchKernelParams& p, int r, uintptr_t& a, uintptr_t& b) {
  const auto lo = reinterpret_cast<uintptr_t>(p.begin[r]);
  a = (lo + 15) & ~uintptr_t{15};
  b = (lo + static_cast<uintptr_t>(p.bytes[r])) & ~uintptr_t{15};
  if (b < a) b = a;
}

__global__ void __launch_bounds__(kPrefetchThreads) l2_prefetch_kernel(L2PrefetchKernelParams p) {
  int64_t i = static_cast<int64_t>(blockIdx.x) * kPrefetchThreads + threadIdx.x;  // this thread's piece
  for (int r = 0; r < p.ranges; ++r) {
    uintptr_t a = 0, b = 0;
    aligned_interior(p, r, a, b);
    const int64_t pieces = static_cast<int64_t>((b - a + p.piece - 1) / p.piece);
    if (i >= pieces) {
      i -= pieces;
      continue;
    }
    const uintptr_t at = a + static_cast<uintptr_t>(i * p.piece);
    const uint32_t size = static_cast<uint32_t>(b - at < static_cast<uintptr_t>(p.piece) ? b - at : p.piece);
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(at), "r"(size) : "memory");
    return;
  }
}

}  // namespace

void run_l2_prefetch(const L2PrefetchKernelParams& p, cudaStream_t stream) {
  DI_CHECK_INTERNAL(p.ranges >= 0 && p.ranges <= L2PrefetchKernelParams::kMaxRanges && p.piece > 0 &&
                    p.piece % 16 == 0 && p.piece <= (int64_t{1} << 30))
      << "l2_prefetch: " << p.ranges << " ranges, piece " << p.piece;
  int64_t pieces = 0;
  for (int r = 0; r < p.ranges; ++r) {
    DI_CHECK_INTERNAL(p.bytes[r] >= 0) << "l2_prefetch: range " << r << " of " << p.bytes[r] << " bytes";
    uintptr_t a = 0, b = 0;
    aligned_interior(p, r, a, b);
    pieces += static_cast<int64_t>((b - a + p.piece - 1) / p.piece);
  }
  if (pieces == 0) return;
  const auto blocks = static_cast<unsigned>((pieces + kPrefetchThreads - 1) / kPrefetchThreads);
  l2_prefetch_kernel<<<blocks, kPrefetchThreads, 0, stream>>>(p);
  DI_CUDA_CHECK_LAUNCH();
}

}  // namespace deepinfer::cuda
