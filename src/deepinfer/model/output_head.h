// The output head (`head.weight` / `lm_head.weight`, [vocab, hidden]) as a model keeps it: in f32 (the CPU
// reference, `--weight-format f32`, expert / context parallelism), or, when the block-format weights are kept
// quantized, in bf16 exactly as the checkpoint stores it. A real V4-Flash head is 2.12 GB in f32 and 1.06 GB in bf16,
// the largest matrix a batch-1 decode step reads. A bf16 head runs through linear_quant as a kFloat bf16 QuantMatrix:
// the CPU reference expands it exactly (its logits equal the f32 head's bit for bit); CUDA rounds the activations
// to bf16 for a cuBLASLt bf16 GEMM, as it does for the FP8 projections' many-row GEMMs.
#pragma once

#include <string>

#include "deepinfer/core/tensor.h"
#include "deepinfer/ops/ops.h"

namespace deepinfer {

class WeightLoader;

// `name` in bf16 as stored when `keep_stored` and the checkpoint stores it in bf16; else dequantized to f32.
HostTensor load_output_head(const WeightLoader& ld, const std::string& name, bool keep_stored);

// out[M, V] = in[M, D] · headᵀ: f32 head through linear (today's arithmetic), bf16 head through linear_quant.
void head_linear(Backend& backend, const Tensor& in, const Tensor& head, const Tensor& out);

}  // namespace deepinfer
