// Tensor-core paged sink attention for prefill-like calls (attention_paged_mma_cuda.cu). Same inputs, slot
// resolution, sink and split / combine semantics as the SIMT kernel of attention_paged_cuda.cu, which stays the
// path for every call this one does not take.
#pragma once

#include <cuda_runtime.h>

#include "deepinfer/ops/cuda/kernels.h"

namespace deepinfer::cuda {

// Whether run_paged_sink_attention takes the tensor-core kernel for p, by p.mma: kNever never, kAuto and kAlways for
// every call of a supported shape: hd in {64, 128, 256, 512}, heads % 16 == 0. (kAuto took it from 128 tokens until
// session 20, when with its splits it measured faster at every decode batch too — H200, slices at context 4096,
// attention ms a step, SIMT -> mma: V4-Flash b1 0.053 -> 0.050, b16 0.188 -> 0.092, b64 0.586 -> 0.187; V4.1 b1 0.098
// -> 0.087, b16 0.476 -> 0.202, b64 1.638 -> 0.458; kNever keeps the SIMT kernel reachable for tests and A/B runs.)
// Batch-invariant mode (p.always_combine) relies on that: the choice may not depend on the batch.
bool paged_attention_use_mma(const PagedSinkAttentionKernelParams& p);

// The attention part only (o, or the split partials); run_paged_sink_attention launches the combine after it.
void launch_paged_attention_mma(const PagedSinkAttentionKernelParams& p, cudaStream_t stream);

}  // namespace deepinfer::cuda
