#include "deepinfer/kv/block_allocator.h"

#include "deepinfer/core/error.h"

namespace deepinfer {

BlockAllocator::BlockAllocator(int32_t num_blocks) {
  DI_CHECK(num_blocks >= 0) << "num_blocks must be >= 0, got " << num_blocks;
  ref_.assign(num_blocks, 0);
  on_free_list_.assign(num_blocks, 1);
  free_.reserve(num_blocks);
  // Reversed so that allocate() hands out 0, 1, 2, ... on a fresh pool (readable test expectations).
  for (BlockId b = num_blocks - 1; b >= 0; --b) free_.push_back(b);
}

void BlockAllocator::check_id(BlockId b) const {
  DI_CHECK_INTERNAL(b >= 0 && b < num_blocks()) << "block id " << b << " out of range [0, " << num_blocks() << ")";
}

int32_t BlockAllocator::ref_count(BlockId b) const {
  check_id(b);
  return ref_[b];
}

bool BlockAllocator::is_free(BlockId b) const {
  check_id(b);
  return on_free_list_[b] != 0;
}

std::optional<BlockId> BlockAllocator::allocate() {
  if (free_.empty()) return std::nullopt;
  const BlockId b = free_.back();
  free_.pop_back();
  on_free_list_[b] = 0;
  ref_[b] = 1;
  return b;
}

void BlockAllocator::retain(BlockId b) {
  check_id(b);
  DI_CHECK_INTERNAL(!on_free_list_[b]) << "retain of free block " << b;
  ++ref_[b];
}

int32_t BlockAllocator::release(BlockId b) {
  check_id(b);
  DI_CHECK_INTERNAL(ref_[b] > 0) << "release of block " << b << " whose ref count is already 0";
  return --ref_[b];
}

void BlockAllocator::free(BlockId b) {
  check_id(b);
  DI_CHECK_INTERNAL(ref_[b] == 0 && !on_free_list_[b])
      << "free of block " << b << " with ref " << ref_[b] << (on_free_list_[b] ? " (already free)" : "");
  on_free_list_[b] = 1;
  free_.push_back(b);
}

}  // namespace deepinfer
