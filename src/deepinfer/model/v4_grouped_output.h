// The V4 attention's grouped low-rank output projection, shared by the model's forward, its batched decode and the
// DSpark draft blocks: heads split into G groups, z_g = wo_a[g]·o_g, out = wo_b·[z_0 … z_{G−1}].
#pragma once

#include <cstdint>

#include "deepinfer/model/kept_matrix.h"
#include "deepinfer/ops/memory.h"
#include "deepinfer/ops/ops.h"

namespace deepinfer {

// heads f32 [T, H·hd] (rotated back to the query position); wo_a [G·o_lora, H·hd / G]; wo_b [D, G·o_lora].
// Returns f32 [T, D].
OwnedTensor v4_grouped_output(Backend& backend, TensorMemory& mem, const Tensor& heads, const KeptMatrix& wo_a,
                              const KeptMatrix& wo_b, int64_t groups, int64_t o_lora);

}  // namespace deepinfer
