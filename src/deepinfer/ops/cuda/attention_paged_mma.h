// Tensor-core paged sink attention for prefill-like calls (attention_paged_mma_cuda.cu). Same inputs, slot
// resolution, sink and split / combine semantics as the SIMT kernel of attention_paged_cuda.cu, which stays the
// path for every call this one does not take.
#pragma once

#include <cuda_runtime.h>

#include "deepinfer/ops/cuda/kernels.h"

namespace deepinfer::cuda {

// Fewest query tokens for which the tensor-core kernel is chosen. It was 128 (one block per (token, 32 heads,
// split) at one block an SM: below a wave the SIMT kernel's 8-head blocks were thought to fill the GPU better), but
// with the splits the tensor-core kernel is faster at every decode batch measured (H200, session 20, slices at
// context 4096, attention ms a step, SIMT -> mma: V4-Flash b1 0.053 -> 0.050, b16 0.188 -> 0.092, b64 0.586 ->
// 0.187; V4.1 b1 0.098 -> 0.087, b16 0.476 -> 0.202, b64 1.638 -> 0.458).
constexpr int64_t kPagedAttentionMmaMinTokens = 1;

// Whether run_paged_sink_attention takes the tensor-core kernel for p, by p.mma: kNever never, kAuto for calls of at
// least kPagedAttentionMmaMinTokens tokens, kAlways for every call of a supported shape (tests use it to cover splits
// and decode shapes). Supported: hd in {64, 128, 256, 512}, heads % 16 == 0.
// Batch-invariant mode (p.always_combine) takes it for every supported call whatever the token count, so that
// the choice does not depend on the batch.
bool paged_attention_use_mma(const PagedSinkAttentionKernelParams& p);

// The attention part only (o, or the split partials); run_paged_sink_attention launches the combine after it.
void launch_paged_attention_mma(const PagedSinkAttentionKernelParams& p, cudaStream_t stream);

}  // namespace deepinfer::cuda
