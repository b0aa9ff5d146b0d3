// Entry resolution of the lightning-indexer scores, shared by the SIMT kernels (indexer_cuda.cu) and the
// tensor-core kernel (indexer_mma_cuda.cu) so that both score exactly the same entries and read exactly the same
// key rows: how many entries token t scores (causal visibility, and with paged keys its sequence's entry count),
// and where entry e's key lives (the contiguous keys, or its sequence's pages).
#pragma once

#include <cstdint>

#include "deepinfer/ops/cuda/cuda_runtime.h"
#include "deepinfer/ops/cuda/device_math.cuh"
#include "deepinfer/ops/cuda/kernels.h"
#include "deepinfer/ops/cuda/pool_rows.cuh"

namespace deepinfer::cuda {

// Entries token t scores: the visible ones, and with paged keys only those below its sequence's entry count.
// -1: a bad q_seq / n_entries (status set when `report`): the whole row becomes NaN. With contiguous keys the
// count is not clamped to n (callers clamp), and a negative count (position < -1) also makes the row NaN.
__device__ __forceinline__ int64_t scored_entries(const IndexerScoresKernelParams& p, int64_t t, bool report) {
  int64_t count = (p.positions[t] + 1) / p.ratio;
  if (p.block_tables == nullptr) return count;
  const int64_t b = p.q_seq[t], n = p.n_entries[t];
  if (b < 0 || b >= p.seqs || n < 0 || n > p.n) {
    if (report) atomicOr(p.status, kStatusPagedAttentionRange);
    return -1;
  }
  return count < n ? count : n;
}

// Key of entry e (< scored_entries) for token t (f32, or a paged pool's row of p.keys_format: pool_rows.cuh's
// pool_load*), or nullptr (status set) when its page is bad. Tokens of the same sequence (q_seq) get the same row.
__device__ __forceinline__ const void* entry_key(const IndexerScoresKernelParams& p, int64_t t, int64_t e) {
  if (p.block_tables == nullptr) return pool_row(p.keys, e, p.dim, PoolFormat::kF32);
  const int64_t blk = e * p.key_ratio / p.block_size;
  if (blk >= p.max_blocks) {
    atomicOr(p.status, kStatusPagedAttentionRange);
    return nullptr;
  }
  const int64_t id = p.block_tables[p.q_seq[t] * p.max_blocks + blk];
  const int64_t row = id * (p.block_size / p.key_ratio) + (e * p.key_ratio % p.block_size) / p.key_ratio;
  if (id < 0 || row >= p.pool_rows) {
    atomicOr(p.status, kStatusPagedAttentionRange);
    return nullptr;
  }
  return pool_row(p.keys, row, p.dim, p.keys_format);
}

}  // namespace deepinfer::cuda
