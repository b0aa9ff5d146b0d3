#include "deepinfer/kv/prefix_cache.h"

#include <algorithm>

#include "deepinfer/core/error.h"
#include "deepinfer/sampling/rng.h"

namespace deepinfer {

PrefixCache::PrefixCache(int block_size, int32_t num_blocks) : block_size_(block_size) {
  DI_CHECK(block_size > 0) << "block_size must be positive, got " << block_size;
  nodes_.emplace_back();  // root
  node_of_block_.assign(num_blocks, -1);
}

uint64_t PrefixCache::hash_tokens(std::span<const TokenId> tokens) const {
  uint64_t h = 0x243F6A8885A308D3ull;
  for (TokenId t : tokens) h = mix64(h ^ static_cast<uint32_t>(t));
  return h;
}

PrefixNodeId PrefixCache::find_child(PrefixNodeId parent, std::span<const TokenId> tokens, uint64_t h) const {
  const auto& children = nodes_[parent].children;
  const auto it = children.find(h);
  if (it == children.end()) return -1;
  return std::equal(tokens.begin(), tokens.end(), nodes_[it->second].tokens.begin(), nodes_[it->second].tokens.end())
             ? it->second
             : -1;
}

PrefixCache::Match PrefixCache::match(std::span<const TokenId> tokens, int64_t max_blocks) const {
  Match m;
  const int64_t n = std::min<int64_t>(max_blocks, static_cast<int64_t>(tokens.size()) / block_size_);
  PrefixNodeId node = kPrefixRoot;
  for (int64_t i = 0; i < n; ++i) {
    const auto block_tokens = tokens.subspan(i * block_size_, block_size_);
    const PrefixNodeId child = find_child(node, block_tokens, hash_tokens(block_tokens));
    if (child < 0) break;
    m.blocks.push_back(nodes_[child].block);
    m.nodes.push_back(child);
    node = child;
  }
  return m;
}

void PrefixCache::update_evictable(PrefixNodeId id) {
  const Node& n = nodes_[id];
  if (n.parked && n.children.empty()) evictable_.insert({n.last_used, id});
}

std::optional<std::pair<PrefixNodeId, BlockId>> PrefixCache::insert(PrefixNodeId parent,
                                                                    std::span<const TokenId> block_tokens,
                                                                    BlockId block) {
  DI_CHECK_INTERNAL(static_cast<int>(block_tokens.size()) == block_size_)
      << "prefix cache insert of " << block_tokens.size() << " tokens, block_size is " << block_size_;
  DI_CHECK_INTERNAL(parent >= 0 && parent < static_cast<PrefixNodeId>(nodes_.size()) &&
                    (parent == kPrefixRoot || nodes_[parent].block >= 0))
      << "bad prefix parent node " << parent;
  const uint64_t h = hash_tokens(block_tokens);
  const PrefixNodeId existing = find_child(parent, block_tokens, h);
  if (existing >= 0) return std::make_pair(existing, nodes_[existing].block);
  if (nodes_[parent].children.count(h)) return std::nullopt;  // hash collision with different tokens
  DI_CHECK_INTERNAL(node_of_block_[block] < 0) << "block " << block << " is already in the prefix cache";

  PrefixNodeId id;
  if (!free_nodes_.empty()) {
    id = free_nodes_.back();
    free_nodes_.pop_back();
  } else {
    id = static_cast<PrefixNodeId>(nodes_.size());
    nodes_.emplace_back();
  }
  Node& n = nodes_[id];
  n.block = block;
  n.parent = parent;
  n.hash = h;
  n.tokens.assign(block_tokens.begin(), block_tokens.end());
  n.children.clear();
  n.last_used = ++clock_;
  n.parked = false;
  node_of_block_[block] = id;
  // The parent gains a child, so it stops being an evictable leaf (it cannot be parked here anyway: the
  // inserting sequence holds it).
  if (parent != kPrefixRoot) evictable_.erase({nodes_[parent].last_used, parent});
  nodes_[parent].children.emplace(h, id);
  return std::make_pair(id, block);
}

void PrefixCache::touch(PrefixNodeId id) {
  Node& n = nodes_[id];
  const bool was_evictable = evictable_.erase({n.last_used, id}) > 0;
  n.last_used = ++clock_;
  if (was_evictable) evictable_.insert({n.last_used, id});
}

bool PrefixCache::is_parked(BlockId block) const {
  const PrefixNodeId id = node_of_block_[block];
  return id >= 0 && nodes_[id].parked;
}

bool PrefixCache::park(BlockId block) {
  const PrefixNodeId id = node_of_block_[block];
  if (id < 0) return false;
  Node& n = nodes_[id];
  DI_CHECK_INTERNAL(!n.parked) << "block " << block << " parked twice";
  n.parked = true;
  ++num_parked_;
  // Freed now: the LRU clock measures time since last use, which ends at release.
  n.last_used = ++clock_;
  update_evictable(id);
  return true;
}

void PrefixCache::unpark(BlockId block) {
  const PrefixNodeId id = node_of_block_[block];
  DI_CHECK_INTERNAL(id >= 0 && nodes_[id].parked) << "unpark of block " << block << " that is not parked";
  Node& n = nodes_[id];
  evictable_.erase({n.last_used, id});
  n.parked = false;
  --num_parked_;
}

std::optional<BlockId> PrefixCache::evict() {
  if (evictable_.empty()) return std::nullopt;
  const PrefixNodeId id = evictable_.begin()->second;
  evictable_.erase(evictable_.begin());
  Node& n = nodes_[id];
  const BlockId block = n.block;
  Node& parent = nodes_[n.parent];
  parent.children.erase(n.hash);
  node_of_block_[block] = -1;
  --num_parked_;
  const PrefixNodeId parent_id = n.parent;
  n = Node{};
  free_nodes_.push_back(id);
  if (parent_id != kPrefixRoot) update_evictable(parent_id);
  return block;
}

}  // namespace deepinfer
