// Row argmax on the device for the engine's greedy fast path (engine/greedy_argmax.h): per row of f32 [rows, vocab]
// logits, exactly sampling/sampler.h's argmax — the lowest id among the largest values, -inf and NaN skipped, -1
// when nothing is left — and whether the row holds NaN or +inf (StepExecutor's kNonFinite). One block per row; the
// order (value, then lower id) is total over the values it compares, so the result does not depend on scheduling.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace deepinfer::cuda {

struct ArgmaxKernelParams {
  const float* logits = nullptr;  // [rows, vocab], contiguous
  int64_t rows = 0, vocab = 0;
  int32_t* out = nullptr;  // [2 * rows]: out[r] the token of row r, out[rows + r] 1 if the row holds NaN or +inf
};
void run_argmax(const ArgmaxKernelParams& p, cudaStream_t stream);

}  // namespace deepinfer::cuda
