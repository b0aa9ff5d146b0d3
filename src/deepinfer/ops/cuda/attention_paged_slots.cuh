// Key-slot resolution of paged sink attention, shared by the SIMT and the tensor-core kernels so that both read
// exactly the same rows: a query's slots are its window positions [lo, pos], then its comp_idx / comp_mask row.
#pragma once

#include <cstdint>

#include "deepinfer/ops/cuda/cuda_runtime.h"
#include "deepinfer/ops/cuda/device_math.cuh"
#include "deepinfer/ops/cuda/kernels.h"
#include "deepinfer/ops/cuda/pool_rows.cuh"

namespace deepinfer::cuda {

// The pools' formats as the kernels' template argument: both f32, both bf16, or V4.1's records (FP8 window rows,
// FP4 entries). Under kRecords an entry's row pointer carries 1 in bit 0 (records are 4-byte aligned), so a pointer
// handed between lanes or threads says how its row decodes.
enum class SlotPools { kF32, kBf16, kRecords };

inline SlotPools slot_pools_of(const PagedSinkAttentionKernelParams& p) {
  if (pool_record(p.window_format)) return SlotPools::kRecords;
  return p.window_format == PoolFormat::kBf16 ? SlotPools::kBf16 : SlotPools::kF32;
}

// Values 4·i .. 4·i + 3 and value i of a (tagged) slot row of hd values.
template <SlotPools kPools>
__device__ __forceinline__ float4 slot_load4(const void* row, int64_t i, int64_t hd) {
  if constexpr (kPools == SlotPools::kRecords) {
    const auto u = reinterpret_cast<uintptr_t>(row);
    return u & 1 ? record_load4(reinterpret_cast<const void*>(u - 1), i, PoolFormat::kFp4E4m3B16, hd)
                 : record_load4(row, i, PoolFormat::kFp8Ue8m0B32, hd);
  } else {
    return pool_load4(row, i, kPools == SlotPools::kBf16 ? PoolFormat::kBf16 : PoolFormat::kF32, hd);
  }
}
template <SlotPools kPools>
__device__ __forceinline__ float slot_load1(const void* row, int64_t i, int64_t hd) {
  if constexpr (kPools == SlotPools::kRecords) {
    const auto u = reinterpret_cast<uintptr_t>(row);
    return u & 1 ? record_load1(reinterpret_cast<const void*>(u - 1), i, PoolFormat::kFp4E4m3B16, hd)
                 : record_load1(row, i, PoolFormat::kFp8Ue8m0B32, hd);
  } else {
    return pool_load1(row, i, kPools == SlotPools::kBf16 ? PoolFormat::kBf16 : PoolFormat::kF32, hd);
  }
}

// Pool row of group g (ratio r) of a sequence (of format f: pool_rows.cuh), or nullptr (and a status bit) when the
// page is bad.
__device__ __forceinline__ const void* paged_pool_row(const PagedSinkAttentionKernelParams& p, const int32_t* table,
                                                      const void* pool, PoolFormat f, int64_t pool_rows, int64_t g,
                                                      int r) {
  // 32-bit divisions where the position fits (64-bit ones are long emulated sequences, and the tensor-core
  // kernel's producers resolve 32 slots a tile on their critical path); the same quotients either way.
  const int64_t gr = g * r;
  int64_t blk, in_blk;
  if (gr >= 0 && gr <= INT32_MAX) {
    const uint32_t u = static_cast<uint32_t>(gr), bs = static_cast<uint32_t>(p.block_size);
    blk = u / bs;
    in_blk = u - static_cast<uint32_t>(blk) * bs;
  } else {
    blk = gr / p.block_size;
    in_blk = gr % p.block_size;
  }
  if (g < 0 || blk >= p.max_blocks) {
    atomicOr(p.status, kStatusPagedAttentionRange);
    return nullptr;
  }
  const int64_t id = table[blk], per_block = p.block_size / r;
  const int64_t row = id * per_block + static_cast<int32_t>(in_blk) / r;
  if (id < 0 || row >= pool_rows) {
    atomicOr(p.status, kStatusPagedAttentionRange);
    return nullptr;
  }
  return cuda::pool_row(pool, row, p.hd, f);
}

// The slots of query t: window positions from lo (n_window of them), then k_sel selection columns.
struct PagedQuerySlots {
  const int32_t* table = nullptr;
  int64_t lo = 0, n_window = 0, n_slots = 0;
};

__device__ __forceinline__ PagedQuerySlots paged_query_slots(const PagedSinkAttentionKernelParams& p, int64_t t,
                                                             bool report) {
  PagedQuerySlots s;
  const int b = p.q_seq[t];
  const int64_t pos = p.q_positions[t];
  if (b < 0 || b >= p.seqs) {
    if (report) atomicOr(p.status, kStatusPagedAttentionRange);
    return s;
  }
  s.table = p.block_tables + static_cast<int64_t>(b) * p.max_blocks;
  s.lo = max(max(pos - p.window + 1, p.window_begin[b]), int64_t{0});
  s.n_window = pos >= s.lo ? pos - s.lo + 1 : 0;
  s.n_slots = s.n_window + p.k_sel;
  return s;
}

// Row of slot `slot` (< n_slots) of query t, or nullptr when the slot holds nothing (unselected, padding, a bad page).
__device__ __forceinline__ const void* paged_slot_row(const PagedSinkAttentionKernelParams& p, const PagedQuerySlots& s,
                                                      int64_t t, int64_t slot) {
  if (slot < s.n_window)
    return paged_pool_row(p, s.table, p.window_pool, p.window_format, p.window_rows, s.lo + slot, 1);
  const int64_t j = slot - s.n_window;
  const int64_t e = p.comp_mask ? (p.comp_mask[t * p.k_sel + j] ? j : -1) : p.comp_idx[t * p.k_sel + j];
  if (e < 0) return nullptr;
  const void* row = paged_pool_row(p, s.table, p.comp_pool, p.comp_format, p.comp_rows, e, p.comp_ratio);
  // An entry record's tag (SlotPools::kRecords).
  return row && pool_record(p.comp_format) ? static_cast<const char*>(row) + 1 : row;
}

}  // namespace deepinfer::cuda
