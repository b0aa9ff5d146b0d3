// PagedRows: the block-table addressing of model_runner.h (group g of ratio r in block table[g*r / bs], row
// (g*r % bs) / r), rows below persistent_until never rewritten, pool growth keeping earlier rows, and sequences
// sharing a prefix block reading the same rows.
#include "deepinfer/model/paged_rows.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "deepinfer/ops/cpu/cpu_backend.h"

namespace deepinfer {
namespace {

HostTensor random_rows(int64_t n, int64_t width, uint32_t seed) {
  HostTensor t(DType::kF32, {n, width});
  std::mt19937 rng(seed);
  std::normal_distribution<float> d;
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = d(rng);
  return t;
}

void expect_rows(const OwnedTensor& got, const HostTensor& want, int64_t want_first, const std::string& what) {
  const int64_t n = got.shape()[0], w = got.shape()[1];
  for (int64_t i = 0; i < n * w; ++i)
    ASSERT_EQ(got.data<float>()[i], want.data<float>()[want_first * w + i]) << what << " value " << i;
}

TEST(PagedRows, BlockTableAddressingGrowthAndPersistentRows) {
  TensorMemory& mem = host_memory();
  for (int ratio : {1, 2, 4}) {
    PagedRows rows(6, ratio);
    const int bs = 8;
    // Sequence A: scattered, high block ids (the pool grows while writing), in chunks of odd sizes.
    const std::vector<BlockId> table_a = {9, 2, 30, 5};
    const int64_t groups = 4 * bs / ratio;
    HostTensor a = random_rows(groups, 6, 1 + ratio);
    PageRef ref_a{table_a, bs, 0};
    for (int64_t at = 0; at < groups;) {
      const int64_t n = std::min<int64_t>(3, groups - at);
      rows.write(mem, ref_a, at, a.view().slice(at, at + n));
      at += n;
    }
    expect_rows(rows.gather(mem, ref_a, 0, groups), a, 0, "A");
    expect_rows(rows.gather(mem, ref_a, 3, 5), a, 3, "A middle");
    // Sequence B shares A's first two blocks (a prefix hit): writes of its first 2 blocks' groups are skipped,
    // so A's rows survive; its own rows land in its own blocks.
    const std::vector<BlockId> table_b = {9, 2, 12};
    HostTensor b = random_rows(3 * bs / ratio, 6, 100 + ratio);
    PageRef ref_b{table_b, bs, 2 * bs};
    rows.write(mem, ref_b, 0, b.view());
    expect_rows(rows.gather(mem, ref_b, 0, 2 * bs / ratio), a, 0, "B's shared prefix");
    expect_rows(rows.gather(mem, ref_b, 2 * bs / ratio, bs / ratio), b, 2 * bs / ratio, "B's own block");
    expect_rows(rows.gather(mem, ref_a, 0, groups), a, 0, "A after B");
    EXPECT_EQ(rows.gather(mem, ref_a, 0, 0).view().data(), nullptr);
  }
}

// A bf16 pool (--kv-cache-dtype bf16) keeps each written value rounded to nearest even, gathers it back widened
// exactly, counts half the bytes a block, and keeps earlier rows through growth; f16 is refused.
TEST(PagedRows, Bf16PoolRoundsOnWriteAndWidensOnGather) {
  TensorMemory& mem = host_memory();
  PagedRows f32(6, 1), bf16(6, 1, DType::kBF16);
  EXPECT_EQ(bf16.dtype(), DType::kBF16);
  EXPECT_EQ(bf16.bytes_per_block(8), f32.bytes_per_block(8) / 2);
  const int bs = 8;
  const std::vector<BlockId> table = {7, 1, 20};  // block 20 grows the pool after blocks 7 and 1 are written
  HostTensor a = random_rows(3 * bs, 6, 11);
  PageRef ref{table, bs, 0};
  bf16.write(mem, ref, 0, a.view().slice(0, 2 * bs));
  bf16.write(mem, ref, 2 * bs, a.view().slice(2 * bs, 3 * bs));
  EXPECT_EQ(bf16.bytes_allocated(), 21 * bf16.bytes_per_block(bs));
  const OwnedTensor got = bf16.gather(mem, ref, 0, 3 * bs);
  ASSERT_EQ(got.dtype(), DType::kF32);
  int64_t changed = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    ASSERT_EQ(got.data<float>()[i], round_bf16(a.data<float>()[i])) << "value " << i;
    changed += got.data<float>()[i] != a.data<float>()[i];
  }
  EXPECT_GT(changed, a.numel() / 2) << "normal values are almost never exact in bf16";
  EXPECT_THROW(PagedRows(6, 1, DType::kF16), Error);
}

// A record pool (--kv-cache-dtype fp8) keeps each fake-quantized row as its kind's record, gathers it back bit for bit
// through growth and a ratio, counts the records' bytes a block, and refuses rows the kind did not quantize and
// widths that are not whole blocks.
TEST(PagedRows, RecordPoolKeepsQuantizedRowsExactly) {
  TensorMemory& mem = host_memory();
  const int bs = 8, width = 64;
  for (const FakeQuantKind kind : {kWindowRecord, kEntryRecord, kIndexKeyRecord}) {
    PagedRows rec(width, 2, DType::kU8, kind);
    EXPECT_EQ(rec.record(), kind);
    EXPECT_EQ(rec.bytes_per_block(bs), bs / 2 * kv_record_bytes(kind, width));
    const std::vector<BlockId> table = {5, 0, 12};
    HostTensor a = random_rows(3 * bs / 2, width, 21);
    fake_quant_rows(a.data<float>(), a.view().dim(0), width, kind);
    PageRef ref{table, bs, 0};
    rec.write(mem, ref, 0, a.view().slice(0, bs));
    rec.write(mem, ref, bs / 2 * 2, a.view().slice(bs, 3 * bs / 2));
    EXPECT_EQ(rec.bytes_allocated(), 13 * rec.bytes_per_block(bs));
    const OwnedTensor got = rec.gather(mem, ref, 0, 3 * bs / 2);
    ASSERT_EQ(got.dtype(), DType::kF32);
    EXPECT_EQ(std::memcmp(got.data<float>(), a.data<float>(), a.view().nbytes()), 0) << static_cast<int>(kind);
    const HostTensor raw = random_rows(bs / 2, width, 22);
    EXPECT_THROW(rec.write(mem, ref, 0, raw.view()), Error) << "unquantized rows into a record pool";
  }
  EXPECT_THROW(PagedRows(24, 1, DType::kU8, kWindowRecord), Error) << "24 values are no whole FP8 block";
  EXPECT_THROW(PagedRows(64, 1, DType::kU8, FakeQuantKind::kFP8E4M3Block128), Error) << "no record of that kind";
}

TEST(PagedRows, TablesThatDoNotCoverTheRowsAreInternalErrors) {
  PagedRows rows(4, 2);
  const std::vector<BlockId> table = {0};
  HostTensor r = random_rows(5, 4, 7);  // groups 0..4 = tokens 0..9 > one block of 8
  EXPECT_THROW(rows.write(host_memory(), PageRef{table, 8, 0}, 0, r.view()), Error);
  EXPECT_THROW(rows.gather(host_memory(), PageRef{table, 8, 0}, 0, 2), Error);  // never written
}

}  // namespace
}  // namespace deepinfer
