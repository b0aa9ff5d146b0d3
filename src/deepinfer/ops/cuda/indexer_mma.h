// Tensor-core lightning-indexer scores for prefill-like calls (indexer_mma_cuda.cu). Same inputs, visibility,
// paged-key resolution (indexer_entries.cuh), NaN / −inf / status semantics and formula as the SIMT kernels of
// indexer_cuda.cu, which stay the path for every call this one does not take (decode, unsupported shapes).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "deepinfer/ops/cuda/kernels.h"

namespace deepinfer::cuda {

// Fewest query tokens for which the tensor-core kernel is chosen by default. It runs one block per 4 (64 heads) or
// 8 (32 heads) tokens at one block an SM; at 128 tokens that is 16-32 blocks, still faster than the SIMT kernel by
// FLOP arithmetic (~90 µs against ~290 µs at 2048 entries and 64 heads), but unmeasured below; decode (one token
// per sequence) always stays on the SIMT kernel.
constexpr int64_t kIndexerMmaMinTokens = 128;

// Whether the indexer scores of p take the tensor-core kernel. Temporary A/B switch, read on every call so that
// one process (a bench, a test) can compare both: DEEPINFER_AB_INDEXER_MMA = "0" never, unset or any other value
// for calls of at least kIndexerMmaMinTokens tokens (paged calls also need >= 4 tokens a sequence on average:
// the kernel shares a key tile among the tokens of one sequence), "all" for every call of a supported shape
// (tests use it for small shapes). Supported: dim 64 or 128, 1 to 64 heads. Never in batch-invariant mode: a
// token's scores must not depend on which kernel its call's size picked.
bool indexer_scores_use_mma(const IndexerScoresKernelParams& p, bool batch_invariant);

void launch_indexer_scores_mma(const IndexerScoresKernelParams& p, cudaStream_t stream);

}  // namespace deepinfer::cuda
