#include "deepinfer/kv/block_allocator.h"

#include <gtest/gtest.h>

#include "deepinfer/core/error.h"

namespace deepinfer {
namespace {

TEST(BlockAllocator, AllocatesEveryBlockThenSignalsExhaustion) {
  BlockAllocator a(3);
  EXPECT_EQ(a.allocate(), 0);
  EXPECT_EQ(a.allocate(), 1);
  EXPECT_EQ(a.allocate(), 2);
  EXPECT_EQ(a.num_free(), 0);
  EXPECT_FALSE(a.allocate().has_value());
  EXPECT_EQ(a.release(1), 0);
  a.free(1);
  EXPECT_EQ(a.allocate(), 1);  // LIFO reuse
}

TEST(BlockAllocator, RefCountsNeverGoNegative) {
  BlockAllocator a(2);
  const BlockId b = *a.allocate();
  a.retain(b);
  EXPECT_EQ(a.ref_count(b), 2);
  EXPECT_EQ(a.release(b), 1);
  EXPECT_EQ(a.release(b), 0);
  EXPECT_THROW(a.release(b), Error);  // would go negative
  EXPECT_EQ(a.ref_count(b), 0);
  a.free(b);
  EXPECT_THROW(a.free(b), Error);    // double free
  EXPECT_THROW(a.retain(b), Error);  // retain of a free block
  EXPECT_THROW(a.ref_count(7), Error);
}

TEST(BlockAllocator, FreeOfAReferencedBlockIsRejected) {
  BlockAllocator a(1);
  const BlockId b = *a.allocate();
  EXPECT_THROW(a.free(b), Error);
  EXPECT_FALSE(a.is_free(b));
}

}  // namespace
}  // namespace deepinfer
