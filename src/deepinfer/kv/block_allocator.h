// BlockAllocator: a fixed pool of cache blocks (block_size tokens each, in every paged cache kind at once)
// with reference counts and a free list.
//
// Every block is in exactly one state:
//   free    — on the free list, ref 0, content meaningless
//   used    — ref > 0: held by that many sequences (several when a prefix block is shared)
//   parked  — ref 0 but not free: its content is kept by the prefix cache and may be revived or evicted
// The allocator only tracks counts; who parks a block (the prefix cache) is the caller's decision.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace deepinfer {

using BlockId = int32_t;

class BlockAllocator {
 public:
  explicit BlockAllocator(int32_t num_blocks);

  int32_t num_blocks() const { return static_cast<int32_t>(ref_.size()); }
  int32_t num_free() const { return static_cast<int32_t>(free_.size()); }
  int32_t ref_count(BlockId b) const;
  bool is_free(BlockId b) const;

  // A free block with ref 1, or nullopt when the free list is empty (the caller may then evict a parked block).
  std::optional<BlockId> allocate();
  // ref++ on a used or parked block (reviving a parked one).
  void retain(BlockId b);
  // ref--; returns the new count. At 0 the block is parked: the caller either keeps it (prefix cache) or calls
  // free(). Releasing a block whose count is already 0 is an Internal error (counts never go negative).
  int32_t release(BlockId b);
  // Returns a ref-0 block to the free list.
  void free(BlockId b);

 private:
  void check_id(BlockId b) const;

  std::vector<int32_t> ref_;
  std::vector<uint8_t> on_free_list_;
  // LIFO: a just-freed block is reused first, which keeps the working set of a small load warm in cache.
  std::vector<BlockId> free_;
};

}  // namespace deepinfer
