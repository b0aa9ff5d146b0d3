// scatter_rows on the CPU reference: random rows land at their index (others untouched, -1 writes nothing), a bad
// index or shape is a clear InvalidArgument naming the row/field.
#include <gtest/gtest.h>

#include <algorithm>
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
