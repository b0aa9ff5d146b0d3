// Tensor-core paged sink attention for prefill-like calls (attention_paged_mma_cuda.cu). Same inputs, slot
// resolution, sink and split / combine semantics as the SIMT kernel of attention_paged_cuda.cu, which stays the
// path for every call this one does not take.
#pragma once

#include <cuda_runtime.h>

#include "deepinfer/ops/cuda/kernels.h"

namespace deepinfer::cuda {

// Fewest query tokens for which the tensor-core kernel is chosen: it runs one block per (token, 32 heads, split)
// at one block an SM, so below about one wave of blocks the SIMT kernel's 8-head blocks fill the GPU better.
constexpr int64_t kPagedAttentionMmaMinTokens = 128;

// Whether run_paged_sink_attention takes the tensor-core kernel for p, by p.mma: kNever never, kAuto for calls of at
// least kPagedAttentionMmaMinTokens tokens, kAlways for every call of a supported shape (tests use it to cover splits
// and decode shapes). Supported: hd in {64, 128, 256, 512}, heads % 16 == 0.
// Batch-invariant mode (p.always_combine) takes it for every supported call whatever the token count, so that
// the choice does not depend on the batch.
bool paged_attention_use_mma(const PagedSinkAttentionKernelParams& p);

// The attention part only (o, or the split partials); run_paged_sink_attention launches the combine after it.
void launch_paged_attention_mma(const PagedSinkAttentionKernelParams& p, cudaStream_t stream);

}  // namespace deepinfer::cuda
