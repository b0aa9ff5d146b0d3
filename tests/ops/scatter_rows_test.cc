// scatter_rows on the CPU reference: random rows land at their index (others untouched, -1 writes nothing), a bad
// index or shape is a clear InvalidArgument naming the row/field.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "deepinfer/core/error.h"
#include "ops/op_test_util.h"

namespace deepinfer::testing {
namespace {

TEST(ScatterRows, RowsLandAtTheirIndexAndMinusOneSkips) {
  auto be = make_cpu_backend(1);
  const int64_t rows = 9, width = 37, n = 23;
  HostTensor src = random_tensor({rows, width}, 1), dst = random_tensor({n, width}, 2);
  const HostTensor before = copy_of(dst);
  std::vector<int64_t> targets(n);
  std::iota(targets.begin(), targets.end(), 0);
  std::shuffle(targets.begin(), targets.end(), std::mt19937(3));
  HostTensor index(DType::kI64, {rows});
  for (int64_t t = 0; t < rows; ++t) index.data<int64_t>()[t] = t % 3 == 1 ? -1 : targets[t];
  be->scatter_rows({src, index, dst});
  std::vector<int64_t> written_from(n, -1);
  for (int64_t t = 0; t < rows; ++t)
    if (index.data<int64_t>()[t] >= 0) written_from[index.data<int64_t>()[t]] = t;
  for (int64_t r = 0; r < n; ++r) {
    const float* want =
        written_from[r] >= 0 ? src.data<float>() + written_from[r] * width : before.data<float>() + r * width;
    EXPECT_EQ(std::memcmp(dst.data<float>() + r * width, want, sizeof(float) * width), 0) << "row " << r;
  }
}

// Into a bf16 cache each value is rounded to nearest even (ties to even, NaN kept a NaN); other rows untouched.
TEST(ScatterRows, Bf16DestinationRoundsToNearestEven) {
  auto be = make_cpu_backend(1);
  const int64_t rows = 4, width = 19, n = 6;
  HostTensor src = random_tensor({rows, width}, 7);
  // Exact ties: 1 + 2^-8 lies halfway between bf16 1 and 1 + 2^-7 (rounds down to the even 1), 1 + 3·2^-8 halfway
  // between 1 + 2^-7 and 1 + 2^-6 (rounds up to the even 1 + 2^-6).
  src.data<float>()[0] = 1.0f + 0x1p-8f;
  src.data<float>()[1] = 1.0f + 3 * 0x1p-8f;
  src.data<float>()[2] = NAN;
  HostTensor dst(DType::kBF16, {n, width});
  for (int64_t i = 0; i < dst.numel(); ++i) dst.data<uint16_t>()[i] = 0x3f80;  // 1.0
  HostTensor index(DType::kI64, {rows});
  const int64_t at[] = {4, -1, 0, 2};
  std::copy(at, at + rows, index.data<int64_t>());
  be->scatter_rows({src, index, dst});
  EXPECT_EQ(dst.data<uint16_t>()[4 * width + 0], 0x3f80) << "1 + 2^-8 ties to the even 1";
  EXPECT_EQ(dst.data<uint16_t>()[4 * width + 1], 0x3f82) << "1 + 3·2^-8 ties to the even 1 + 2^-6";
  EXPECT_TRUE(std::isnan(bf16_to_f32(dst.data<uint16_t>()[4 * width + 2])));
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t j = 0; j < width; ++j) {
      if (at[t] < 0 || (t == 0 && j < 3)) continue;
      const float v = src.data<float>()[t * width + j], back = bf16_to_f32(dst.data<uint16_t>()[at[t] * width + j]);
      ASSERT_EQ(back, round_bf16(v)) << "row " << t << " value " << j;
      ASSERT_LE(std::fabs(back - v), std::fabs(v) * 0x1p-8f) << "row " << t << " value " << j;
    }
  for (int64_t r : {1, 3, 5})
    for (int64_t j = 0; j < width; ++j) ASSERT_EQ(dst.data<uint16_t>()[r * width + j], 0x3f80) << "row " << r;
  HostTensor f16(DType::kF16, {n, width});
  EXPECT_THROW(be->scatter_rows({src, index, f16}), Error) << "an f16 cache is neither f32 nor bf16";
}

// Into a record cache (--kv-cache-dtype fp8) each row becomes its kind's record, which reads back as the row; a row
// the kind did not quantize is an internal error, not a silently rounded record.
TEST(ScatterRows, RecordDestinationEncodesEachRowExactly) {
  auto be = make_cpu_backend(1);
  for (const FakeQuantKind kind : {kWindowRecord, kEntryRecord, kIndexKeyRecord}) {
    const int64_t rows = 5, width = 64, n = 7, bytes = kv_record_bytes(kind, width);
    const RecordPool src = records_of(random_tensor({rows, width}, 11, 1e-3f, 30.0f), kind);
    HostTensor dst(DType::kU8, {n, bytes});
    std::fill(dst.data<uint8_t>(), dst.data<uint8_t>() + dst.numel(), uint8_t{0x5A});
    HostTensor index(DType::kI64, {rows});
    const int64_t at[] = {6, -1, 0, 3, 2};
    std::copy(at, at + rows, index.data<int64_t>());
    ScatterRowsParams p{src.values, index, dst};
    p.record = kind;
    be->scatter_rows(p);
    std::vector<float> back(width);
    for (int64_t t = 0; t < rows; ++t) {
      if (at[t] < 0) continue;
      kv_record_decode(kind, dst.data<uint8_t>() + at[t] * bytes, width, back.data());
      EXPECT_EQ(std::memcmp(back.data(), src.values.data<float>() + t * width, sizeof(float) * width), 0) << t;
    }
    for (int64_t j = 0; j < bytes; ++j) ASSERT_EQ(dst.data<uint8_t>()[1 * bytes + j], 0x5A) << "row 1 untouched";
    const HostTensor unquantized = random_tensor({rows, width}, 12);
    ScatterRowsParams raw{unquantized, index, dst};
    raw.record = kind;
    EXPECT_THROW(be->scatter_rows(raw), Error) << "unquantized rows into a record cache";
  }
}

TEST(ScatterRows, BadIndexOrShapeIsAClearError) {
  auto be = make_cpu_backend(1);
  HostTensor src = random_tensor({2, 4}, 4), dst = random_tensor({3, 4}, 5), index(DType::kI64, {2});
  for (int64_t bad : {int64_t{3}, int64_t{-2}}) {
    index.data<int64_t>()[0] = 0;
    index.data<int64_t>()[1] = bad;
    try {
      be->scatter_rows({src, index, dst});
      ADD_FAILURE() << "index " << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("index[1]"), std::string::npos) << e.what();
    }
  }
  HostTensor narrow = random_tensor({3, 5}, 6);
  index.data<int64_t>()[1] = 1;
  try {
    be->scatter_rows({src, index, narrow});
    ADD_FAILURE() << "width mismatch accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("dst"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace deepinfer::testing
