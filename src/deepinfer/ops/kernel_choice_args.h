// `--kernel-choice KEY=VALUE` (`deepinfer bench`, and since session 31 the engine's commands and
// EngineStackOptions::kernel_choices): the CUDA backend's kernel choices (ops/cuda/kernel_choices.h) from the command
// line, so that a slice or a checkpoint can be run under another kernel in the same build (the A/B runs the
// environment switches gave before session 19). Host-only: parsed and printed in any build.
#pragma once

#include <string>
#include <vector>

#include "deepinfer/ops/cuda/kernel_choices.h"

namespace deepinfer {

// Keys: attn_mma, indexer_mma, topk_small_blocks, wgmma (auto | never | always); wgmma_exact (0 | 1); wgmma_decode
// (by_format | producer | split | consumers); wgmma_tile (by_rows | 128x256 | 256x128 | mixed); stream_mma_max_rows,
// grouped_one_launch_rows (a row count >= 0, or default); f32_scale_mma and the other on/off keys (0 | 1).
// Later specs of a key win. InvalidArgument naming the spec and what is accepted otherwise.
cuda::KernelChoices parse_kernel_choices(const std::vector<std::string>& specs);

// The choices that differ from the defaults, as "KEY=VALUE, ..." in the order above ("" when none).
std::string describe_kernel_choices(const cuda::KernelChoices& c);

}  // namespace deepinfer
