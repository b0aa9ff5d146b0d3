// Quantized cache records (ops/kv_record.h): every row a kind fake-quantizes comes back bit for bit from its record,
// at the reference's record sizes; rows the kind did not quantize are refused; non-finite blocks read as NaNs.
#include "deepinfer/ops/kv_record.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "deepinfer/ops/cpu/cpu_backend.h"
#include "ops/kv_record_rows.h"

namespace deepinfer {
namespace {

constexpr FakeQuantKind kKinds[] = {kWindowRecord, kEntryRecord, kIndexKeyRecord};

using testing::quantized_rows;

bool same_bits(const float* a, const float* b, size_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; }

TEST(KvRecord, SizesAreTheReferencesRecords) {
  EXPECT_EQ(kv_record_bytes(kWindowRecord, 512), 512 + 16);  // 528 B: e4m3 codes + 16 UE8M0 scales
  EXPECT_EQ(kv_record_bytes(kEntryRecord, 512), 256 + 32);   // 288 B: e2m1 pairs + 32 e4m3 scales
  EXPECT_EQ(kv_record_bytes(kIndexKeyRecord, 128), 64 + 4);  // 68 B: e2m1 pairs + 4 UE8M0 scales
  EXPECT_EQ(kv_record_bytes(kWindowRecord, 32), 36);         // 33 B padded to a multiple of 4
  EXPECT_EQ(kv_record_bytes(kEntryRecord, 16), 12);          // 8 + 1 padded
  EXPECT_FALSE(kv_record_kind(FakeQuantKind::kFP8E4M3Block128));
}

TEST(KvRecord, FakeQuantizedRowsComeBackBitForBit) {
  for (const FakeQuantKind kind : kKinds)
    for (const int width : {32, 128, 512}) {
      const int rows = 64;
      const std::vector<float> v = quantized_rows(kind, rows, width, 17u + width);
      const int64_t bytes = kv_record_bytes(kind, width);
      const int64_t used = (kind == kWindowRecord ? width : width / 2) + width / fake_quant_block_len(kind);
      std::vector<uint8_t> rec(bytes);
      std::vector<float> back(width);
      for (int r = 0; r < rows; ++r) {
        const float* row = v.data() + static_cast<size_t>(r) * width;
        std::fill(rec.begin(), rec.end(), uint8_t{0xAB});
        ASSERT_TRUE(kv_record_encode(kind, row, width, rec.data()))
            << "kind " << static_cast<int>(kind) << " row " << r;
        for (int64_t i = used; i < bytes; ++i) ASSERT_EQ(rec[i], 0) << "padding byte " << i;
        kv_record_decode(kind, rec.data(), width, back.data());
        ASSERT_TRUE(same_bits(back.data(), row, width)) << "kind " << static_cast<int>(kind) << " row " << r;
      }
    }
}

// The quantizers' smallest scales (the keys' 2^-126, whose half-codes are f32 subnormals; the entries' e4m3 2^-9) and
// their largest codes come back exactly too.
TEST(KvRecord, ExtremeScalesComeBackBitForBit) {
  for (const FakeQuantKind kind : kKinds) {
    const int n = fake_quant_block_len(kind);
    // 5e-38: the keys' blocks whose amax / 6 is an f32 subnormal above 2^-127 (their scale is 2^-126).
    for (const float mag : {1e-38f, 5e-38f, 7e-38f, 1e-30f, 3e-3f, 2e4f}) {
      std::vector<float> row(n);
      for (int i = 0; i < n; ++i) row[i] = (i % 2 ? -1.0f : 1.0f) * mag * static_cast<float>(i + 1) / n;
      fake_quant_rows(row.data(), 1, n, kind);
      std::vector<uint8_t> rec(kv_record_bytes(kind, n));
      ASSERT_TRUE(kv_record_encode(kind, row.data(), n, rec.data())) << static_cast<int>(kind) << " " << mag;
      std::vector<float> back(n);
      kv_record_decode(kind, rec.data(), n, back.data());
      EXPECT_TRUE(same_bits(back.data(), row.data(), n)) << static_cast<int>(kind) << " " << mag;
    }
  }
}

TEST(KvRecord, RowsTheKindDidNotQuantizeAreRefused) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const FakeQuantKind kind : kKinds) {
    std::vector<float> row(128);
    for (float& x : row) x = normal(rng);
    std::vector<uint8_t> rec(kv_record_bytes(kind, 128));
    EXPECT_FALSE(kv_record_encode(kind, row.data(), 128, rec.data())) << static_cast<int>(kind);
  }
  // A window row's values are FP8 codes times a power of two, not FP4 ones: the entry and key records refuse it.
  const std::vector<float> window = quantized_rows(kWindowRecord, 1, 128, 3);
  std::vector<uint8_t> rec(kv_record_bytes(kIndexKeyRecord, 128));
  EXPECT_FALSE(kv_record_encode(kIndexKeyRecord, window.data(), 128, rec.data()));
}

TEST(KvRecord, NonFiniteBlocksReadAsNaN) {
  for (const FakeQuantKind kind : kKinds) {
    std::vector<float> row = quantized_rows(kind, 1, 64, 9);
    const int block = fake_quant_block_len(kind);
    row[3] = std::numeric_limits<float>::quiet_NaN();
    row[block + 1] = -std::numeric_limits<float>::infinity();
    std::vector<uint8_t> rec(kv_record_bytes(kind, 64));
    ASSERT_TRUE(kv_record_encode(kind, row.data(), 64, rec.data()));
    std::vector<float> back(64);
    kv_record_decode(kind, rec.data(), 64, back.data());
    for (int i = 0; i < 2 * block; ++i) EXPECT_TRUE(std::isnan(back[i])) << static_cast<int>(kind) << " " << i;
    EXPECT_TRUE(same_bits(back.data() + 2 * block, row.data() + 2 * block, 64 - 2 * block)) << static_cast<int>(kind);
  }
}

}  // namespace
}  // namespace deepinfer
