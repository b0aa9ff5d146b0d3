// The keys one split of a paged MLA query covers, shared by the fp32 attend kernel (mla_paged_cuda.cu) and the
// tensor-core one (mla_paged_mma_cuda.cu): both write partials into the same [token, head, split] layout that the
// combine + project kernel merges, and batch-invariant mode relies on the same boundaries, so they must cut alike.
#pragma once

#include "deepinfer/ops/cuda/cuda_runtime.h"
#include "deepinfer/ops/cuda/kernels.h"

namespace deepinfer::cuda {

// Split boundaries are multiples of this many keys (the fp32 kernel's tile; PagedMlaKernelParams::tiles_per_split
// counts them).
constexpr int kPagedMlaSplitKeys = 32;

struct PagedMlaSplitKeys {
  const int32_t* table = nullptr;  // the query's block table; null for a bad sequence or position
  int64_t begin = 0, end = 0;      // positions [begin, end) of its keys
};

// Split `split` of query t. A bad sequence index or a position past the table raises the status word when `report`
// (one thread of the query's first block) and gives no keys and no table.
__device__ __forceinline__ PagedMlaSplitKeys paged_mla_split_keys(const PagedMlaKernelParams& p, int64_t t, int split,
                                                                  bool report) {
  PagedMlaSplitKeys k;
  const int b = p.q_seq[t];
  const int64_t pos = p.q_positions[t];
  int64_t n_keys = 0;
  if (b < 0 || b >= p.seqs || pos >= p.max_blocks * p.block_size) {
    if (report) atomicOr(p.status, kStatusPagedAttentionRange);
  } else {
    k.table = p.block_tables + static_cast<int64_t>(b) * p.max_blocks;
    n_keys = pos + 1 > 0 ? pos + 1 : 0;
  }
  const int64_t tiles = (n_keys + kPagedMlaSplitKeys - 1) / kPagedMlaSplitKeys;
  const int64_t per_split = p.tiles_per_split > 0 ? p.tiles_per_split : (tiles + p.splits - 1) / p.splits;
  k.begin = min(n_keys, split * per_split * kPagedMlaSplitKeys);
  k.end = min(n_keys, k.begin + per_split * kPagedMlaSplitKeys);
  return k;
}

}  // namespace deepinfer::cuda
