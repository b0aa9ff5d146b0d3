// The CUDA record code (ops/cuda/kv_record.cuh) run on the host against the CPU's records (ops/kv_record.cc): the
// device encoder writes the CPU's bytes block by block (padding included), and its loaders read the CPU's values bit
// for bit, 4 values or 1 at a time. The same source runs in the kernels, so this checks their layout, index and packing
// arithmetic here; the GPU tests (tests/cuda/cuda_kv_record_test.cc) check the device's conversions.
#ifdef DEEPINFER_WITH_CUDA

#include "deepinfer/ops/cuda/kv_record.cuh"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "deepinfer/ops/cpu/cpu_backend.h"
#include "deepinfer/ops/cuda/kernels.h"
#include "deepinfer/ops/kv_record.h"
#include "ops/kv_record_rows.h"

namespace deepinfer {
namespace {

constexpr FakeQuantKind kKinds[] = {kWindowRecord, kEntryRecord, kIndexKeyRecord};

// testing::quantized_rows with a NaN in row 1 and an infinity in row 2 (blocks the encoders store as NaNs). Over
// magnitudes down to 1e-38 it found the CPU encoder's too small scale for FP4 key blocks with
// 6 · 2^-127 < amax < 6 · 2^-126.
std::vector<float> quantized_rows(FakeQuantKind kind, int rows, int width, uint32_t seed) {
  std::vector<float> v = testing::quantized_rows(kind, rows, width, seed);
  v[1 * width + 3] = std::numeric_limits<float>::quiet_NaN();
  v[2 * width + width - 1] = -std::numeric_limits<float>::infinity();
  return v;
}

// Bit for bit, but any NaN for a NaN (a NaN block's payload is the conversion's own, on either side).
bool same_value(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0 || (std::isnan(a) && std::isnan(b)); }

TEST(CudaKvRecordCode, FormatsAreTheCpusRecords) {
  for (const FakeQuantKind kind : kKinds) {
    const cuda::PoolFormat f = cuda::pool_format_of(DType::kU8, kind);
    EXPECT_TRUE(cuda::pool_record(f));
    EXPECT_EQ(cuda::record_block(f), fake_quant_block_len(kind));
    for (const int64_t width : {32, 64, 96, 128, 512})
      EXPECT_EQ(cuda::pool_row_bytes(f, width), kv_record_bytes(kind, width));
  }
  EXPECT_EQ(cuda::pool_row_bytes(cuda::PoolFormat::kBf16, 100), 200);
  EXPECT_EQ(cuda::pool_row_bytes(cuda::PoolFormat::kF32, 100), 400);
}

TEST(CudaKvRecordCode, EncoderWritesTheCpusBytes) {
  for (const FakeQuantKind kind : kKinds) {
    const cuda::PoolFormat f = cuda::pool_format_of(DType::kU8, kind);
    for (const int width : {32, 64, 128, 512}) {
      const int rows = 40;
      const int64_t bytes = kv_record_bytes(kind, width);
      const std::vector<float> v = quantized_rows(kind, rows, width, 7u + width);
      std::vector<uint8_t> want(bytes), got(bytes);
      for (int r = 0; r < rows; ++r) {
        const float* row = v.data() + static_cast<size_t>(r) * width;
        ASSERT_TRUE(kv_record_encode(kind, row, width, want.data()))
            << "kind " << static_cast<int>(kind) << " width " << width << " row " << r;
        std::fill(got.begin(), got.end(), uint8_t{0xAB});
        // Blocks in reverse, as threads may run: block 0 (the padding's writer) last.
        for (int64_t b = width / cuda::record_block(f) - 1; b >= 0; --b)
          ASSERT_TRUE(cuda::record_write_block(f, row, width, b, got.data())) << "block " << b;
        ASSERT_EQ(got, want) << "kind " << static_cast<int>(kind) << " width " << width << " row " << r;
      }
    }
  }
}

TEST(CudaKvRecordCode, LoadersReadTheCpusValues) {
  for (const FakeQuantKind kind : kKinds) {
    const cuda::PoolFormat f = cuda::pool_format_of(DType::kU8, kind);
    for (const int width : {32, 64, 512}) {
      const int rows = 16;
      const int64_t bytes = kv_record_bytes(kind, width);
      const std::vector<float> v = quantized_rows(kind, rows, width, 11u + width);
      // 4-byte aligned records, as a pool holds them.
      std::vector<uint32_t> storage(static_cast<size_t>(bytes / 4));
      auto* rec = reinterpret_cast<uint8_t*>(storage.data());
      std::vector<float> want(width);
      for (int r = 0; r < rows; ++r) {
        ASSERT_TRUE(kv_record_encode(kind, v.data() + static_cast<size_t>(r) * width, width, rec));
        kv_record_decode(kind, rec, width, want.data());
        for (int i = 0; i < width / 4; ++i) {
          const float4 q = cuda::record_load4(rec, i, f, width);
          const float got[4] = {q.x, q.y, q.z, q.w};
          for (int k = 0; k < 4; ++k)
            ASSERT_TRUE(same_value(got[k], want[4 * i + k]))
                << "kind " << static_cast<int>(kind) << " width " << width << " row " << r << " value " << 4 * i + k
                << ": " << got[k] << " vs " << want[4 * i + k];
        }
        for (int i = 0; i < width; ++i)
          ASSERT_TRUE(same_value(cuda::record_load1(rec, i, f, width), want[i])) << "value " << i;
      }
    }
  }
}

TEST(CudaKvRecordCode, RowsTheKindDidNotQuantizeAreReportedAndStoredAsNaN) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const FakeQuantKind kind : kKinds) {
    const cuda::PoolFormat f = cuda::pool_format_of(DType::kU8, kind);
    std::vector<float> row(64);
    for (float& x : row) x = normal(rng);
    std::vector<uint8_t> rec(kv_record_bytes(kind, 64));
    ASSERT_FALSE(cuda::record_write_block(f, row.data(), 64, 0, rec.data())) << static_cast<int>(kind);
    for (int i = 0; i < cuda::record_block(f); ++i)
      EXPECT_TRUE(std::isnan(cuda::record_load1(rec.data(), i, f, 64))) << static_cast<int>(kind) << " " << i;
  }
}

}  // namespace
}  // namespace deepinfer

#endif  // DEEPINFER_WITH_CUDA
