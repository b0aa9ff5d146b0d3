#include "deepinfer/model/paged_rows.h"

#include <algorithm>

#include "deepinfer/core/error.h"

namespace deepinfer {

template <typename F>
void PagedRows::for_runs(const PageRef& ref, int64_t first, int64_t n, F&& f) const {
  const int64_t per_block = ref.block_size / ratio_;
  DI_CHECK_INTERNAL(per_block > 0 && ref.block_size % ratio_ == 0)
      << "block size " << ref.block_size << " is not a multiple of the compression ratio " << ratio_;
  DI_CHECK_INTERNAL((first + n) * ratio_ <= static_cast<int64_t>(ref.block_table.size()) * ref.block_size)
      << "block table of " << ref.block_table.size() << " blocks does not cover group " << first + n - 1;
  for (int64_t done = 0; done < n;) {
    const int64_t g = first + done, block = g / per_block, row = g % per_block;
    const int64_t len = std::min(n - done, per_block - row);
    f(static_cast<int64_t>(ref.block_table[block]) * per_block + row, done, len);
    done += len;
  }
}

namespace {
// Rows between f32 and the pool: a copy for an f32 pool, a cast (rounding into bf16, widening out of it) for bf16,
// records encoded / decoded for a u8 pool.
void move_rows(TensorMemory& mem, const Tensor& dst, const Tensor& src, FakeQuantKind record) {
  if (dst.dtype() == src.dtype())
    mem.copy(dst, src);
  else if (dst.dtype() == DType::kU8 || src.dtype() == DType::kU8)
    mem.convert_records(dst, src, record);
  else
    mem.cast(dst, src);
}
}  // namespace

PagedRows::PagedRows(int64_t width, int ratio, DType dtype, FakeQuantKind record)
    : width_(width), ratio_(ratio), dtype_(dtype), record_(record) {
  DI_CHECK(dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kU8)
      << "paged rows are kept in f32, bf16 or u8 records, not " << dtype_name(dtype);
  DI_CHECK(dtype != DType::kU8 || (kv_record_kind(record) && width % fake_quant_block_len(record) == 0))
      << "paged rows: no quantized record of " << width << " values for this kind";
}

int64_t PagedRows::row_elements() const { return dtype_ == DType::kU8 ? kv_record_bytes(record_, width_) : width_; }

int64_t PagedRows::bytes_per_block(int block_size) const {
  if (width_ == 0) return 0;
  return dtype_bytes(dtype_, block_size / ratio_ * row_elements());
}

int64_t PagedRows::bytes_allocated() const {
  return pool_.view().data() ? dtype_bytes(pool_.dtype(), pool_.numel()) : 0;
}

void PagedRows::reserve(TensorMemory& mem, int64_t blocks, int block_size) {
  if (blocks <= capacity_blocks_) return;
  DI_CHECK_INTERNAL(max_blocks_ == 0 || blocks <= max_blocks_)
      << "block id " << blocks - 1 << " beyond the pool of " << max_blocks_ << " blocks";
  const int64_t per_block = block_size / ratio_;
  // Doubling amortises growth; it never passes the engine's pool, so the pages stay inside the cache budget.
  int64_t cap = std::max<int64_t>(blocks, 2 * capacity_blocks_);
  if (max_blocks_ > 0) cap = std::min(cap, max_blocks_);
  OwnedTensor grown = mem.zeros(dtype_, {cap * per_block, row_elements()});
  if (capacity_blocks_ > 0) mem.copy(grown.view().slice(0, capacity_blocks_ * per_block), pool_.view());
  pool_ = std::move(grown);
  capacity_blocks_ = cap;
}

void PagedRows::write(TensorMemory& mem, const PageRef& ref, int64_t first, const Tensor& rows) {
  const int64_t n = rows.dim(0);
  DI_CHECK_INTERNAL(rows.dim(1) == width_) << "paged rows of width " << width_ << " written with " << rows.dim(1);
  DI_CHECK_INTERNAL((first + n) * ratio_ <= static_cast<int64_t>(ref.block_table.size()) * ref.block_size)
      << "block table of " << ref.block_table.size() << " blocks does not cover group " << first + n - 1;
  // Groups ending at or below persistent_until exist already.
  const int64_t skip = std::clamp<int64_t>(ref.persistent_until / ratio_ - first, 0, n);
  if (skip == n) return;
  int64_t max_block = 0;
  for (int64_t b = (first + skip) * ratio_ / ref.block_size; b <= ((first + n) * ratio_ - 1) / ref.block_size; ++b)
    max_block = std::max<int64_t>(max_block, ref.block_table[b]);
  reserve(mem, max_block + 1, ref.block_size);
  for_runs(ref, first + skip, n - skip, [&](int64_t pool_row, int64_t at, int64_t len) {
    move_rows(mem, pool_.view().slice(pool_row, pool_row + len), rows.slice(skip + at, skip + at + len), record_);
  });
}

int64_t PagedRows::row_for_write(TensorMemory& mem, const PageRef& ref, int64_t g) {
  DI_CHECK_INTERNAL((g + 1) * ratio_ <= static_cast<int64_t>(ref.block_table.size()) * ref.block_size)
      << "block table of " << ref.block_table.size() << " blocks does not cover group " << g;
  if ((g + 1) * ratio_ <= ref.persistent_until) return -1;
  const int64_t per_block = ref.block_size / ratio_;
  const int64_t block = ref.block_table[g / per_block];
  reserve(mem, block + 1, ref.block_size);
  return block * per_block + g % per_block;
}

OwnedTensor PagedRows::gather(TensorMemory& mem, const PageRef& ref, int64_t first, int64_t n) const {
  if (n == 0) return OwnedTensor{};
  OwnedTensor out = mem.zeros(DType::kF32, {n, width_});
  for_runs(ref, first, n, [&](int64_t pool_row, int64_t at, int64_t len) {
    DI_CHECK_INTERNAL((pool_row + len) * ratio_ <= capacity_blocks_ * ref.block_size)
        << "read of paged rows never written (pool row " << pool_row + len - 1 << ")";
    move_rows(mem, out.view().slice(at, at + len), pool_.view().slice(pool_row, pool_row + len), record_);
  });
  return out;
}

void round_to_bf16_values(TensorMemory& mem, const Tensor& rows) {
  if (rows.numel() == 0) return;
  const OwnedTensor bf16 = mem.zeros(DType::kBF16, rows.shape());
  mem.cast(bf16.view(), rows);
  mem.cast(rows, bf16.view());
}

}  // namespace deepinfer
