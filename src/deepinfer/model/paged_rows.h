// PagedRows: one paged cache kind of one layer (MLA latents, V4 window rows, compressed entries, indexer keys),
// stored in the model runner's block pool and addressed through a sequence's block table
// (engine/model_runner.h): with ratio r (1 for per-token rows), group g lives in block table[g*r / block_size]
// at row (g*r % block_size) / r. Block ids index the pool directly, so sequences that share a prefix's blocks
// read the same rows. The pool grows by doubling to the largest block id seen (on the backend's memory), so an
// engine sized for many blocks only commits what it touches.
#pragma once

#include <cstdint>
#include <span>

#include "deepinfer/kv/block_table.h"
#include "deepinfer/ops/kv_record.h"
#include "deepinfer/ops/memory.h"

namespace deepinfer {

// Where a sequence's paged rows are for one forward call.
struct PageRef {
  std::span<const BlockId> block_table;
  int block_size = 0;
  // Positions below this already have rows (a prefix hit, possibly in blocks shared with other sequences):
  // they are never rewritten.
  int64_t persistent_until = 0;
};

class PagedRows {
 public:
  PagedRows() = default;
  // dtype: the pool's element type, f32, bf16 (rows written as f32 are rounded to nearest even and read back
  // widened exactly: --kv-cache-dtype bf16) or u8: each row a quantized record of kind `record` (ops/kv_record.h,
  // --kv-cache-dtype fp8; the rows must be fake-quantized by that kind, and are read back exactly).
  PagedRows(int64_t width, int ratio, DType dtype = DType::kF32, FakeQuantKind record = kWindowRecord);

  int64_t width() const { return width_; }
  DType dtype() const { return dtype_; }
  FakeQuantKind record() const { return record_; }
  int ratio() const { return ratio_; }
  // The whole pool [capacity rows, width] (u8: [capacity rows, record bytes]; rows by PagedRows' layout), for ops that
  // read pages in place.
  Tensor pool() const { return pool_.view(); }
  // Bytes one block of the pool takes (block_size / ratio rows of [width] in dtype()); 0 for an unused kind.
  int64_t bytes_per_block(int block_size) const;
  // Bytes the pool holds now.
  int64_t bytes_allocated() const;
  // The engine's pool has `blocks` blocks: growth by doubling stops there (0: unbounded).
  void set_max_blocks(int64_t blocks) { max_blocks_ = blocks; }
  // rows f32 [n, width] become groups [first, first + n); groups that end at or below persistent_until are
  // skipped (they exist already).
  void write(TensorMemory& mem, const PageRef& ref, int64_t first, const Tensor& rows);
  // The pool row group `g` goes to when written by the device (scatter_rows), the pool grown to hold it; -1 for
  // a group that exists already (ends at or below persistent_until). Growth moves the pool: take pool() after.
  int64_t row_for_write(TensorMemory& mem, const PageRef& ref, int64_t g);
  // Groups [first, first + n) as one contiguous f32 [n, width] tensor (null data when n is 0).
  OwnedTensor gather(TensorMemory& mem, const PageRef& ref, int64_t first, int64_t n) const;

 private:
  // Calls f(pool_row, at, len) for the runs of groups [first, first + n) that are contiguous in the pool.
  template <typename F>
  void for_runs(const PageRef& ref, int64_t first, int64_t n, F&& f) const;
  void reserve(TensorMemory& mem, int64_t blocks, int block_size);

  // Elements a pool row takes: width, or a u8 pool's record bytes.
  int64_t row_elements() const;

  int64_t width_ = 0;
  int ratio_ = 1;
  DType dtype_ = DType::kF32;
  FakeQuantKind record_ = kWindowRecord;
  int64_t capacity_blocks_ = 0;
  int64_t max_blocks_ = 0;
  OwnedTensor pool_;  // [capacity_blocks * block_size / ratio, width]
};

// f32 rows rounded in place to bf16 values (still f32): what a bf16 pool holds of them. Under --kv-cache-dtype bf16
// the caches kept outside the pools (unpaged sequences' row buffers, rings of window rows: context parallelism's
// scratch ranks, sequences without pages) store their rows so, so that every path attends the values the pages hold.
void round_to_bf16_values(TensorMemory& mem, const Tensor& rows);

}  // namespace deepinfer
