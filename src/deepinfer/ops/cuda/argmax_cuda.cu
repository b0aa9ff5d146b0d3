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

__global__ void __launch_bounds__(kThreads) argmax_kernel(ArgmaxKernelParams p) {
  __shared__ Best warp_best[kWarps];
  __shared__ int warp_bad[kWarps];
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
  }
}

// The chosen token's logprob, split so that a row's sum does not wait on one SM (at batch 1 a single block would
// run ~130k double exps alone): blocks of (row, chunk of kSumChunk entries), then one thread per row. The split
// depends on the vocabulary only, never on the number of rows, so a row's result does not depend on the batch.
constexpr int kSumThreads = 256;
constexpr int kSumWarps = kSumThreads / 32;
constexpr int64_t kSumChunk = 4096;

int64_t sum_chunks(int64_t vocab) { return (vocab + kSumChunk - 1) / kSumChunk; }

// A row the executor samples: a token, no NaN / +inf (out as argmax_kernel wrote it).
__device__ __forceinline__ bool has_token(const ArgmaxKernelParams& p, int64_t row) {
  return p.out[row] >= 0 && p.out[p.rows + row] == 0;
}

// partial[row, chunk] = the sum over the chunk's entries that are not -inf of exp(double(x) - m), m = x[id] (the
// row's max): each thread adds its strided entries in id order, a fixed butterfly within each warp (a + b == b + a:
// every lane ends with the same value), then the warps' sums in warp order.
__global__ void __launch_bounds__(kSumThreads) logprob_partial_kernel(ArgmaxKernelParams p, int64_t chunks) {
  __shared__ double warp_sum[kSumWarps];
  const int64_t row = blockIdx.x, chunk = blockIdx.y;
  const float* x = p.logits + row * p.vocab;
  double acc = 0.0;
  if (has_token(p, row)) {  // the same for the whole block
    const double m = static_cast<double>(x[p.out[row]]);
    const int64_t end = (chunk + 1) * kSumChunk < p.vocab ? (chunk + 1) * kSumChunk : p.vocab;
    for (int64_t i = chunk * kSumChunk + threadIdx.x; i < end; i += kSumThreads) {
      const float v = x[i];
      if (v != -INFINITY) acc += exp(static_cast<double>(v) - m);
    }
  }
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if ((threadIdx.x & 31) == 0) warp_sum[threadIdx.x >> 5] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    double sum = 0.0;
    for (int w = 0; w < kSumWarps; ++w) sum += warp_sum[w];
    p.partial[row * chunks + chunk] = sum;
  }
}

// Per row: the chunks' sums in chunk order, lse = m + log(sum), float(x[id] - lse) (sampler.h token_logprob's
// arithmetic); 0 for a row without a token to sample.
__global__ void logprob_finish_kernel(ArgmaxKernelParams p, int64_t chunks) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (row >= p.rows) return;
  if (!has_token(p, row)) {
    p.logprobs[row] = 0.0f;
    return;
  }
  double sum = 0.0;
  for (int64_t c = 0; c < chunks; ++c) sum += p.partial[row * chunks + c];
  // x[id] is the row's max as the host's float max finds it (the first largest value in id order, ±0 included).
  const double m = static_cast<double>(p.logits[row * p.vocab + p.out[row]]);
  const double lse = m + log(sum);
  p.logprobs[row] = static_cast<float>(m - lse);
}

}  // namespace

void run_argmax(const ArgmaxKernelParams& p, cudaStream_t stream) {
  if (p.rows == 0) return;
  DI_CHECK(p.vocab > 0 && p.vocab < (int64_t{1} << 31)) << "argmax: vocab " << p.vocab << " outside [1, 2^31)";
  DI_CHECK(p.rows < (int64_t{1} << 31)) << "argmax: " << p.rows << " rows";
  argmax_kernel<<<static_cast<unsigned>(p.rows), kThreads, 0, stream>>>(p);
  DI_CUDA_CHECK_LAUNCH();
  if (p.logprobs == nullptr) return;
  const int64_t chunks = sum_chunks(p.vocab);
  DI_CHECK(p.partial != nullptr) << "argmax: the logprobs need argmax_logprob_scratch() doubles of scratch";
  DI_CHECK(chunks < 65536) << "argmax: vocab " << p.vocab << " needs " << chunks << " chunks";
  logprob_partial_kernel<<<dim3(static_cast<unsigned>(p.rows), static_cast<unsigned>(chunks)), kSumThreads, 0,
                           stream>>>(p, chunks);
  DI_CUDA_CHECK_LAUNCH();
  constexpr int kFinishThreads = 128;
  logprob_finish_kernel<<<static_cast<unsigned>((p.rows + kFinishThreads - 1) / kFinishThreads), kFinishThreads, 0,
                          stream>>>(p, chunks);
  DI_CUDA_CHECK_LAUNCH();
}

int64_t argmax_logprob_scratch(int64_t rows, int64_t vocab) { return rows * sum_chunks(vocab); }

}  // namespace deepinfer::cuda
