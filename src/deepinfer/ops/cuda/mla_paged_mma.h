// Tensor-core attend step of the paged absorbed MLA (mla_paged_mma_cuda.cu): the middle of run_paged_mla_attention's
// three kernels on bf16x3 mma.sync instead of fp32 CUDA cores, taken by KernelChoices::paged_mla_mma for V3-family
// shapes (latent 512, rope 64). The absorb and the combine + project kernels around it are unchanged, and so is
// the partials' layout: a split covers the same keys either way.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "deepinfer/ops/cuda/kernels.h"

namespace deepinfer::cuda {

// Splits the combine + project kernel takes (its per-token weights in shared memory).
constexpr int kPagedMlaMaxSplits = 64;

// Whether the tensor-core attend kernel has an instantiation for latent r and rope dr that fits a block's shared
// memory (DeviceInfo::smem_per_block_optin, read once by the backend rather than on every decode step).
bool paged_mla_mma_takes(int64_t r, int64_t dr, size_t smem_per_block_optin);
// Heads a block of the tensor-core kernel: 32 (two m16 groups), or 16 for models with at most 16 heads when `narrow`
// (KernelChoices::paged_mla_16: V2-Lite's 16 heads would leave a 32-head block's second group all padding).
int paged_mla_mma_block_heads(int64_t heads, bool narrow);
// Splits for the tensor-core kernel (blocks_per_sm blocks an SM: 1 for its shared memory, 2 for the bf16-pool form of
// paged_mla_mma_two_blocks): the fewest that fill the SMs once — tokens x head groups of block_heads below
// blocks_per_sm · sm_count blocks get blocks_per_sm · sm_count / blocks splits, at most one per 32 keys of max_keys and
// kPagedMlaMaxSplits.
int paged_mla_mma_splits(int64_t tokens, int64_t heads, int64_t max_keys, int sm_count, int block_heads,
                         int blocks_per_sm = 1);
// Whether a launch takes the two-blocks-an-SM form (KernelChoices::paged_mla_two_blocks): a bf16 pool and 16-head
// blocks, whose key buffers need no lo planes (99 KB a block) and whose consumers fit 80 registers.
bool paged_mla_mma_two_blocks(bool choice, bool kv_bf16, int block_heads);
// Writes the split partials (p.part_o / part_m / part_l) for every (token, head, split), as the SIMT attend does.
void launch_paged_mla_attend_mma(const PagedMlaKernelParams& p, cudaStream_t stream);

}  // namespace deepinfer::cuda
