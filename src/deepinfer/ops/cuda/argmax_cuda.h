// Row argmax on the device for the engine's greedy fast path (engine/greedy_argmax.h): per row of f32 [rows, vocab]
// logits, exactly sampling/sampler.h's argmax — the lowest id among the largest values, -inf and NaN skipped, -1
// when nothing is left — and whether the row holds NaN or +inf (StepExecutor's kNonFinite). One block per row; the
// order (value, then lower id) is total over the values it compares, so the result does not depend on scheduling.
//
// Optionally the chosen token's logprob, as sampling/sampler.h token_logprob computes it on the host: with m the
// row's max (the chosen token's value), sum = the sum over the entries that are not -inf of exp(double(x) - m) in
// double, lse = m + log(sum) in double, and float(x[id] - lse). Only the order of the sum differs from the host's
// (the host adds in id order; here the row is cut into chunks of 4096 entries, one block each — every thread adds
// its strided entries in id order, then a fixed tree over the threads — and the chunks' sums are added in chunk
// order), and the device's double exp / log may differ from the host's by an ulp: the double lse agrees to a few
// double ulps, so the float result is equal in practice and always within one float ulp plus that double error
// (tests/cuda/cuda_argmax_test.cc measures it). The order is fixed and depends on the vocabulary only: the result
// is deterministic run to run and does not depend on the other rows (batch invariance).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace deepinfer::cuda {

struct ArgmaxKernelParams {
  const float* logits = nullptr;  // [rows, vocab], contiguous
  int64_t rows = 0, vocab = 0;
  int32_t* out = nullptr;  // [2 * rows]: out[r] the token of row r, out[rows + r] 1 if the row holds NaN or +inf
  // [rows] or null (not wanted): the chosen token's logprob; 0 for a row without a token or with NaN / +inf.
  float* logprobs = nullptr;
  double* partial = nullptr;  // with logprobs: argmax_logprob_scratch(rows, vocab) doubles of scratch
};
void run_argmax(const ArgmaxKernelParams& p, cudaStream_t stream);
// The doubles of scratch the logprobs need (the chunks' partial sums).
int64_t argmax_logprob_scratch(int64_t rows, int64_t vocab);

}  // namespace deepinfer::cuda
