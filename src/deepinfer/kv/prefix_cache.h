// PrefixCache: a radix tree over full token blocks. Each node is one block of block_size tokens; its path from
// the root spells the token prefix whose cache entries the node's block holds. Lookups walk the tree and return
// the longest cached prefix (whole blocks only: a partial block is still being written by its sequence).
//
// Invariants (checked by KvCacheManager::check_invariants):
//   - a node's block is used (ref > 0) or parked (ref 0, content kept); never free while the node exists.
//   - a sequence holding a node's block also holds all its ancestors, so ref(child) > 0 implies ref(parent) > 0
//     and a parked node's whole subtree is parked: every parked block can be reclaimed by evicting leaves.
//   - eviction takes the least recently used parked leaf, so a chain is trimmed from its tail and the remaining
//     prefix stays reachable.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "deepinfer/kv/block_allocator.h"
#include "deepinfer/sampling/sampling_params.h"

namespace deepinfer {

using PrefixNodeId = int32_t;
inline constexpr PrefixNodeId kPrefixRoot = 0;

class PrefixCache {
 public:
  PrefixCache(int block_size, int32_t num_blocks);

  struct Match {
    std::vector<BlockId> blocks;
    std::vector<PrefixNodeId> nodes;
  };
  // The longest chain of cached blocks spelling tokens[0 : k*block_size) for k <= max_blocks.
  Match match(std::span<const TokenId> tokens, int64_t max_blocks) const;

  // Records that `block` now holds `block_tokens` (exactly block_size tokens) following `parent`'s prefix.
  // Returns the node and the block that holds this prefix: `block` if it was new, or the block already cached
  // for it (the caller switches to that one and releases its own duplicate). Returns nullopt on the
  // astronomically rare 64-bit hash collision between different token blocks (the block is then not cached).
  std::optional<std::pair<PrefixNodeId, BlockId>> insert(PrefixNodeId parent, std::span<const TokenId> block_tokens,
                                                         BlockId block);

  // Bumps the LRU clock of a node (on a prefix hit).
  void touch(PrefixNodeId node);
  // The block's ref count dropped to 0: returns true if the tree holds it (it is now parked), false if the
  // caller must free it.
  bool park(BlockId block);
  // A parked block is referenced again (prefix hit): it is no longer evictable.
  void unpark(BlockId block);
  // Removes the least recently used parked leaf and returns its block (now the caller's to free or reuse).
  std::optional<BlockId> evict();

  bool holds(BlockId block) const { return node_of_block_[block] >= 0; }
  bool is_parked(BlockId block) const;
  int32_t num_nodes() const { return static_cast<int32_t>(nodes_.size() - free_nodes_.size()) - 1; }
  int32_t num_parked() const { return num_parked_; }
  int32_t num_evictable() const { return static_cast<int32_t>(evictable_.size()); }
  PrefixNodeId node_of(BlockId block) const { return node_of_block_[block]; }
  PrefixNodeId parent_of(PrefixNodeId node) const { return nodes_[node].parent; }
  BlockId block_of(PrefixNodeId node) const { return nodes_[node].block; }
  bool is_leaf(PrefixNodeId node) const { return nodes_[node].children.empty(); }

 private:
  struct Node {
    BlockId block = -1;
    PrefixNodeId parent = -1;
    uint64_t hash = 0;
    std::vector<TokenId> tokens;
    std::unordered_map<uint64_t, PrefixNodeId> children;  // by hash of the child's tokens
    uint64_t last_used = 0;
    bool parked = false;
  };
  uint64_t hash_tokens(std::span<const TokenId> tokens) const;
  PrefixNodeId find_child(PrefixNodeId parent, std::span<const TokenId> tokens, uint64_t h) const;
  void update_evictable(PrefixNodeId node);

  int block_size_;
  std::vector<Node> nodes_;  // nodes_[0] is the root (no block)
  std::vector<PrefixNodeId> free_nodes_;
  std::vector<PrefixNodeId> node_of_block_;
  std::set<std::pair<uint64_t, PrefixNodeId>> evictable_;  // (last_used, node): parked leaves
  uint64_t clock_ = 0;
  int32_t num_parked_ = 0;
};

}  // namespace deepinfer
