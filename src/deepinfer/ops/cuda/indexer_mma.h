// Tensor-core lightning-indexer scores for prefill-like calls (indexer_mma_cuda.cu). Same inputs, visibility,
// paged-key resolution (indexer_entries.cuh), NaN / −inf / status semantics and formula as the SIMT kernels of
// indexer_cuda.cu, which stay the path for every call this one does not take (decode, unsupported shapes).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "deepinfer/ops/cuda/kernels.h"

namespace deepinfer::cuda {

// Fewest query tokens for which the tensor-core kernel is chosen by default. Measured on the H200 before its key
// tiles were split over blocks for small calls (CudaBench.DISABLED_PrefillIndexerTimings, V4's 64 x 128 over 2048
// entries, same run): 16 tokens 0.144 ms against the SIMT kernel's 0.064 ms, 64 tokens 0.145 against 0.200, 128
// tokens 0.145 against 0.391 — one block's walk over all entries, which the split now shortens (not yet measured).
// Decode (one token per sequence) always stays on the SIMT kernel.
constexpr int64_t kIndexerMmaMinTokens = 64;

// Whether the indexer scores of p take the tensor-core kernel, by p.mma: kNever never, kAuto for calls of at least
// kIndexerMmaMinTokens tokens (paged calls also need >= 4 tokens a sequence on average: the kernel shares a key tile
// among the tokens of one sequence), kAlways for every call of a supported shape (tests use it for small shapes).
// Supported: dim 64 or 128, 1 to 64 heads. Never in batch-invariant mode: a token's scores must not depend on which
// kernel its call's size picked.
bool indexer_scores_use_mma(const IndexerScoresKernelParams& p, bool batch_invariant);

void launch_indexer_scores_mma(const IndexerScoresKernelParams& p, cudaStream_t stream);

}  // namespace deepinfer::cuda
