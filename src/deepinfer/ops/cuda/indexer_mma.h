// Tensor-core lightning-indexer scores for prefill and batched decode calls (indexer_mma_cuda.cu). Same inputs,
// visibility, paged-key resolution (indexer_entries.cuh), NaN / −inf / status semantics and formula as the SIMT kernels
// of indexer_cuda.cu, which stay the path for every call this one does not take (decode batches below 16, unsupported
// shapes).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "deepinfer/ops/cuda/kernels.h"

namespace deepinfer::cuda {

// Fewest query tokens for which the tensor-core kernel is chosen by default. Measured on the H200 before its key
// tiles were split over blocks for small calls (CudaBench.DISABLED_PrefillIndexerTimings, V4's 64 x 128 over 2048
// entries, same run): 16 tokens 0.144 ms against the SIMT kernel's 0.064 ms, 64 tokens 0.145 against 0.200, 128
// tokens 0.145 against 0.391 — one block's walk over all entries, which the split now shortens (not yet measured).
constexpr int64_t kIndexerMmaMinTokens = 64;
// Fewest tokens of a paged call with fewer than 4 tokens a sequence (decode: one each) for which it is chosen: the
// block then shares no key tile among its tokens, but each token's 64 (or 32) heads still make the M of its mmas
// (H200, session 20, slices at context 4096, indexer ms a step, SIMT -> mma: V4-Flash b1 0.016 -> 0.019, b16 0.047 ->
// 0.041, b64 0.120 -> 0.074, b256 0.438 -> 0.198; V4.1 b1 0.034 -> 0.042, b16 0.147 -> 0.115, b256 1.537 -> 0.801).
constexpr int64_t kIndexerMmaMinDecodeTokens = 16;

// Whether the indexer scores of p take the tensor-core kernel, by p.mma: kNever never, kAuto for calls of at least
// kIndexerMmaMinTokens tokens with >= 4 tokens a sequence on average (the kernel shares a key tile among the tokens
// of one sequence) and of paged calls with fewer of at least kIndexerMmaMinDecodeTokens, kAlways for every call of a
// supported shape (tests use it for small shapes). Supported: dim 64 or 128, 1 to 64 heads. Never in batch-invariant
// mode: a token's scores must not depend on which kernel its call's size picked.
bool indexer_scores_use_mma(const IndexerScoresKernelParams& p, bool batch_invariant);

// Whether a call the tensor-core kernel takes runs in its decode form (p.mma_decode,
// KernelChoices::indexer_mma_decode): paged calls of fewer than 4 tokens a sequence, where a block's tokens rarely
// share a key tile. Each token is then its own pass and all 8 warps score its tile — a warp its m-tile of heads against
// a slice of the keys, the m-tiles' sums added in shared memory — where the sequence-pass form keeps 1 warp of 8 (32
// heads) or 2 (64) busy per pass.
bool indexer_scores_decode_form(const IndexerScoresKernelParams& p);

// Whether a decode-form call takes the ring kernel (indexer_decode_ring_cuda.cu; p.mma_ring,
// KernelChoices::indexer_mma_ring): f32 and bf16 key pools and FP4 key records, where a block is one token and its key
// tiles come through a ring of shared-memory stages by cp.async; the decode form's scores bit for bit.
bool indexer_decode_ring_takes(const IndexerScoresKernelParams& p);
void launch_indexer_decode_ring(const IndexerScoresKernelParams& p, cudaStream_t stream);
// The ring kernel's key-tile splits a token (its grid's y) for `tokens` tokens of `tiles` key tiles on `slots` resident
// blocks: the fewest splits of the least waves x (tiles a block + a block's fixed cost).
int64_t indexer_decode_ring_splits(int64_t tokens, int64_t tiles, int64_t slots);

// The tensor-core kernel for a call indexer_scores_use_mma chose: the ring kernel where it takes the call, else the
// sequence-pass or decode form.
void launch_indexer_scores_mma(const IndexerScoresKernelParams& p, cudaStream_t stream);

}  // namespace deepinfer::cuda
