#include "deepinfer/ops/cuda/argmax_cuda.h"
#include "deepinfer/ops/cuda/cuda_check.h"

namespace deepinfer::cuda {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;

// A candidate: (value, id), id -1 = none. Better = larger value, then lower id: the CPU's scan keeps the first
// (lowest) id of the largest value because it replaces only on a strictly larger one.
struct Best {
  float v;
  int64_t id;
};
__device__ __forceinline__ Best better(Best a, Best b) {
  if (a.id < 0) return b;
  if (b.id < 0) return a;
  if (a.v != b.v) return a.v > b.v ? a : b;
  return a.id < b.id ? a : b;
}

// The sum over the row of exp(double(x) - m), -inf entries left out: each thread adds its entries in id order,
// then a fixed butterfly within each warp (a + b == b + a, so every lane holds the same value) and the warps' sums
// in warp order. Called by every thread of the block; the result is valid in thread 0.
__device__ double row_exp_sum(const float* x, int64_t V, double m, double* warp_sum) {
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < V; i += kThreads) {
    const float v = x[i];
    if (v != -INFINITY) acc += exp(static_cast<double>(v) - m);
  }
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if ((threadIdx.x & 31) == 0) warp_sum[threadIdx.x >> 5] = acc;
  __syncthreads();
  double sum = 0.0;
  if (threadIdx.x == 0)
    for (int w = 0; w < kWarps; ++w) sum += warp_sum[w];
  return sum;
}

__global__ void __launch_bounds__(kThreads) argmax_kernel(ArgmaxKernelParams p) {
  __shared__ Best warp_best[kWarps];
  __shared__ int warp_bad[kWarps];
  __shared__ Best row_best;
  __shared__ int row_bad;
  __shared__ double warp_sum[kWarps];
  const int64_t row = blockIdx.x, V = p.vocab;
  const float* x = p.logits + row * V;
  Best best{0.0f, -1};
  int bad = 0;
  for (int64_t i = threadIdx.x; i < V; i += kThreads) {
    const float v = x[i];
    if (isnan(v)) {
      bad = 1;
      continue;
    }
    if (v == INFINITY) bad = 1;
    if (v == -INFINITY) continue;
    best = better(best, Best{v, i});  // ids rise within a thread: a tie keeps the earlier one
  }
  for (int o = 16; o > 0; o >>= 1) {
    const Best other{__shfl_xor_sync(0xffffffffu, best.v, o), __shfl_xor_sync(0xffffffffu, best.id, o)};
    best = better(best, other);
    bad |= __shfl_xor_sync(0xffffffffu, bad, o);
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) {
    warp_best[warp] = best;
    warp_bad[warp] = bad;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    Best b = warp_best[0];
    int any_bad = warp_bad[0];
    for (int w = 1; w < kWarps; ++w) {
      b = better(b, warp_best[w]);
      any_bad |= warp_bad[w];
    }
    p.out[row] = static_cast<int32_t>(b.id);
    p.out[p.rows + row] = any_bad;
    row_best = b;
    row_bad = any_bad;
  }
  if (p.logprobs == nullptr) return;
  __syncthreads();
  const Best b = row_best;
  if (row_bad || b.id < 0) {  // the executor samples neither: no pass over the row
    if (threadIdx.x == 0) p.logprobs[row] = 0.0f;
    return;
  }
  // b.v is the row's max as the host's float max finds it (the first largest value in id order, ±0 included).
  const double m = static_cast<double>(b.v);
  const double sum = row_exp_sum(x, V, m, warp_sum);
  if (threadIdx.x == 0) {
    const double lse = m + log(sum);
    p.logprobs[row] = static_cast<float>(static_cast<double>(x[b.id]) - lse);
  }
}

}  // namespace

void run_argmax(const ArgmaxKernelParams& p, cudaStream_t stream) {
  if (p.rows == 0) return;
  DI_CHECK(p.vocab > 0 && p.vocab < (int64_t{1} << 31)) << "argmax: vocab " << p.vocab << " outside [1, 2^31)";
  DI_CHECK(p.rows < (int64_t{1} << 31)) << "argmax: " << p.rows << " rows";
  argmax_kernel<<<static_cast<unsigned>(p.rows), kThreads, 0, stream>>>(p);
  DI_CUDA_CHECK_LAUNCH();
}

}  // namespace deepinfer::cuda
