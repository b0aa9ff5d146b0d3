// V4SlotPool: slots are handed out lowest first, given back when their handle goes (also after the pool
// object moved, and in any order), reused; growth by whole steps keeps every row written before it; rows of
// compressors made after a growth are as large as the pool.
#include "deepinfer/model/v4_slot_pool.h"

#include <gtest/gtest.h>

#include <random>
#include <set>

#include "deepinfer/ops/cpu/cpu_backend.h"

namespace deepinfer {
namespace {

TEST(V4SlotPool, SlotsAreReusedAndGrowthKeepsRows) {
  TensorMemory& mem = host_memory();
  V4SlotPool pool;
  std::vector<std::unique_ptr<V4SlotPool::Slot>> held;
  for (int i = 0; i < 3; ++i) held.push_back(pool.acquire(mem));
  EXPECT_EQ(held[0]->index(), 0);
  EXPECT_EQ(held[2]->index(), 2);
  const int64_t first_capacity = pool.capacity();
  ASSERT_GE(first_capacity, 3);

  // Random rows in every slot's part of a compressor's kv and gate.
  V4SlotPool::Rows& rows = pool.rows(mem, 2, V4SlotPool::Kind::kCompressor, 4, 5);
  ASSERT_EQ(rows.kv.shape()[0], first_capacity * 4);
  std::mt19937 rng(3);
  std::normal_distribution<float> d;
  for (OwnedTensor* t : {&rows.kv, &rows.gate})
    for (int64_t i = 0; i < t->numel(); ++i) t->data<float>()[i] = d(rng);
  const std::vector<float> kv(rows.kv.data<float>(), rows.kv.data<float>() + rows.kv.numel());
  const std::vector<float> gate(rows.gate.data<float>(), rows.gate.data<float>() + rows.gate.numel());

  // Giving back slot 1 makes it the next one handed out.
  held[1].reset();
  held[1] = pool.acquire(mem);
  EXPECT_EQ(held[1]->index(), 1);

  // Past the capacity the pool grows; every slot index stays unique and the rows written before are kept.
  while (pool.capacity() == first_capacity) held.push_back(pool.acquire(mem));
  std::set<int64_t> indices;
  for (const auto& s : held) indices.insert(s->index());
  EXPECT_EQ(indices.size(), held.size());
  EXPECT_EQ(*indices.rbegin(), static_cast<int64_t>(held.size()) - 1);
  V4SlotPool::Rows* grown = pool.find(2, V4SlotPool::Kind::kCompressor);
  ASSERT_NE(grown, nullptr);
  ASSERT_EQ(grown->kv.shape()[0], pool.capacity() * 4);
  for (size_t i = 0; i < kv.size(); ++i) {
    ASSERT_EQ(grown->kv.data<float>()[i], kv[i]) << "kv value " << i;
    ASSERT_EQ(grown->gate.data<float>()[i], gate[i]) << "gate value " << i;
  }

  // A compressor made now is as large as the grown pool; bytes count both.
  const V4SlotPool::Rows& later = pool.rows(mem, 5, V4SlotPool::Kind::kIndexer, 8, 3);
  EXPECT_EQ(later.gate.shape()[0], pool.capacity() * 8);
  EXPECT_EQ(pool.bytes_allocated(), 2 * pool.capacity() * (4 * 5 + 8 * 3) * 4);
  EXPECT_EQ(pool.find(5, V4SlotPool::Kind::kCompressor), nullptr);

  // Asking a compressor's rows with another shape is an internal error, not a silent reinterpretation.
  EXPECT_THROW(pool.rows(mem, 2, V4SlotPool::Kind::kCompressor, 8, 5), Error);

  // Handles outlive a moved-from pool object: giving back a slot after the move lands in the moved pool.
  V4SlotPool moved = std::move(pool);
  const int64_t freed = held[0]->index();
  held[0].reset();
  EXPECT_EQ(moved.acquire(mem)->index(), freed);
}

TEST(V4SlotPool, GrowsNoFurtherThanItsMaxSlots) {
  TensorMemory& mem = host_memory();
  V4SlotPool pool;
  pool.set_max_slots(3);  // an engine with 3 state slots
  std::vector<std::unique_ptr<V4SlotPool::Slot>> held;
  for (int i = 0; i < 3; ++i) held.push_back(pool.acquire(mem));
  EXPECT_EQ(pool.capacity(), 3);
  EXPECT_EQ(pool.rows(mem, 0, V4SlotPool::Kind::kCompressor, 2, 4).kv.shape()[0], 3 * 2);
  EXPECT_THROW(pool.acquire(mem), Error);
  held.pop_back();
  EXPECT_EQ(pool.acquire(mem)->index(), 2);
}

}  // namespace
}  // namespace deepinfer
