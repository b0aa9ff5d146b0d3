#include <gtest/gtest.h>

#include <atomic>
#include <numeric>

#include "deepinfer/core/error.h"
#include "deepinfer/core/tensor.h"
#include "deepinfer/core/thread_pool.h"

namespace deepinfer {
namespace {

TEST(Error, CheckThrowsWithCategoryMessageAndLocation) {
  int n = -3;
  try {
    DI_CHECK(n > 0) << "batch size must be positive, got " << n;
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_EQ(e.message(), "batch size must be positive, got -3");
    EXPECT_NE(std::string(e.what()).find("core_test.cc"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("InvalidArgument"), std::string::npos);
  }
  EXPECT_NO_THROW(DI_CHECK(n < 0) << "not evaluated");
  try {
    DI_CHECK_CODE(false, ErrorCode::kNotFound);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNotFound);
    EXPECT_EQ(e.message(), "check failed: false");
  }
  EXPECT_THROW(DI_FAIL(ErrorCode::kUnsupported) << "x", Error);
}

TEST(Error, MessageIsOnlyBuiltOnFailure) {
  int calls = 0;
  auto expensive = [&] { return ++calls; };
  DI_CHECK(true) << expensive();
  EXPECT_EQ(calls, 0);
}

TEST(Tensor, ViewsShareMemoryAndCheckBounds) {
  HostTensor t(DType::kF32, {4, 3});
  float* p = t.data<float>();
  std::iota(p, p + 12, 0.0f);
  Tensor v = t.view();
  EXPECT_TRUE(v.is_contiguous());
  EXPECT_EQ(v.nbytes(), 48);
  Tensor rows = v.slice(1, 3);
  EXPECT_EQ(rows.shape(), (Shape{2, 3}));
  EXPECT_EQ(rows.data_as<float>()[0], 3.0f);
  EXPECT_EQ(v.row(3).data_as<float>()[2], 11.0f);
  EXPECT_EQ(v.row(3).shape(), (Shape{3}));
  EXPECT_EQ(v.reshape({3, -1}).shape(), (Shape{3, 4}));
  EXPECT_THROW(v.reshape({5, -1}), Error);
  EXPECT_THROW(v.slice(2, 5), Error);
  EXPECT_THROW(v.dim(2), Error);
  EXPECT_EQ(v.dim(-1), 3);
  EXPECT_EQ(v.str(), "f32[4, 3]");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % kHostAlignment, 0u);
}

TEST(Tensor, Fp4SliceMustBeByteAligned) {
  HostTensor t(DType::kFP4E2M1, {3, 3});
  EXPECT_THROW(t.view().slice(1, 2), Error);  // row 1 starts mid-byte
  HostTensor u(DType::kFP4E2M1, {3, 4});
  EXPECT_EQ(u.view().slice(1, 2).nbytes(), 2);
}

TEST(ThreadPool, CoversRangeExactlyOnceAndPropagatesErrors) {
  ThreadPool pool(4);
  std::vector<std::atomic<int>> hits(1001);
  pool.parallel_for(1001, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) hits[i]++;
  });
  for (auto& h : hits) EXPECT_EQ(h.load(), 1);
  EXPECT_THROW(pool.parallel_for(8,
                                 [&](int64_t b, int64_t) {
                                   if (b >= 4) DI_FAIL(ErrorCode::kInternal) << "chunk failed";
                                 }),
               Error);
  // Still usable after an error.
  std::atomic<int64_t> sum{0};
  pool.parallel_for(100, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) sum += i;
  });
  EXPECT_EQ(sum.load(), 4950);
}

}  // namespace
}  // namespace deepinfer
