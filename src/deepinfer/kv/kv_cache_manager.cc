#include "deepinfer/kv/kv_cache_manager.h"

#include <algorithm>

#include "deepinfer/core/error.h"

namespace deepinfer {

KvCacheManager::KvCacheManager(const KvCacheConfig& config)
    : config_(config), allocator_(config.num_blocks), prefix_(config.block_size, config.num_blocks) {
  DI_CHECK(config.block_size > 0) << "block_size must be positive, got " << config.block_size;
  DI_CHECK(config.num_state_slots >= 0) << "num_state_slots must be >= 0, got " << config.num_state_slots;
  DI_CHECK(config.prefix_replay_tokens >= 0) << "prefix_replay_tokens must be >= 0";
  DI_CHECK(config.prefix_replay_tokens_past_prompt >= 0) << "prefix_replay_tokens_past_prompt must be >= 0";
  for (int32_t s = config.num_state_slots - 1; s >= 0; --s) free_slots_.push_back(s);
  slot_in_use_.assign(config.num_state_slots, 0);
}

int32_t KvCacheManager::num_available_blocks() const { return allocator_.num_free() + prefix_.num_parked(); }

PrefixMatch KvCacheManager::match_prefix(std::span<const TokenId> tokens, int64_t prompt_len) const {
  PrefixMatch m;
  if (!config_.enable_prefix_cache || tokens.empty()) return m;
  // The last token is always computed: its logits are what the step is for.
  const int64_t max_blocks = (static_cast<int64_t>(tokens.size()) - 1) / config_.block_size;
  auto found = prefix_.match(tokens, max_blocks);
  m.blocks = std::move(found.blocks);
  m.nodes = std::move(found.nodes);
  m.cached_tokens = static_cast<int64_t>(m.blocks.size()) * config_.block_size;
  int64_t replay = config_.prefix_replay_tokens;
  if (prompt_len >= 0 && m.cached_tokens > prompt_len && config_.prefix_replay_tokens_past_prompt > replay)
    replay = std::min<int64_t>(config_.prefix_replay_tokens_past_prompt, replay + m.cached_tokens - prompt_len);
  m.compute_from = std::max<int64_t>(0, m.cached_tokens - replay);
  return m;
}

PrefixCursor KvCacheManager::adopt_prefix(const PrefixMatch& match, int64_t query_tokens, BlockTable& table) {
  DI_CHECK_INTERNAL(table.empty()) << "adopt_prefix into a non-empty block table";
  if (config_.enable_prefix_cache) {
    ++stats_.prefix_queries;
    stats_.prefix_query_tokens += query_tokens;
    stats_.prefix_hit_tokens += match.cached_tokens;
  }
  PrefixCursor cursor;
  for (size_t i = 0; i < match.blocks.size(); ++i) {
    const BlockId b = match.blocks[i];
    DI_CHECK_INTERNAL(prefix_.node_of(b) == match.nodes[i]) << "stale prefix match: block " << b << " was evicted";
    if (allocator_.ref_count(b) == 0) prefix_.unpark(b);
    allocator_.retain(b);
    prefix_.touch(match.nodes[i]);
    table.push_back(b);
    cursor = {match.nodes[i], static_cast<int64_t>(i) + 1};
  }
  return cursor;
}

std::optional<BlockId> KvCacheManager::take_block() {
  if (auto b = allocator_.allocate()) return b;
  const auto victim = prefix_.evict();
  if (!victim) return std::nullopt;
  ++stats_.evictions;
  allocator_.free(*victim);
  return allocator_.allocate();
}

bool KvCacheManager::allocate(BlockTable& table, int64_t n) {
  DI_CHECK_INTERNAL(n >= 0) << "allocate of " << n << " blocks";
  if (n > num_available_blocks()) return false;
  if (n > 0 && config_.allocation_fault && config_.allocation_fault(n)) return false;
  for (int64_t i = 0; i < n; ++i) {
    const auto b = take_block();
    DI_CHECK_INTERNAL(b.has_value()) << "block accounting out of sync: " << num_available_blocks() << " available";
    table.push_back(*b);
  }
  return true;
}

void KvCacheManager::fork(const BlockTable& src, BlockTable& dst) {
  DI_CHECK_INTERNAL(dst.empty()) << "fork into a non-empty block table";
  for (BlockId b : src) allocator_.retain(b);
  dst = src;
}

void KvCacheManager::release(BlockTable& table) {
  // Tail first: the deepest blocks are parked last-used-earliest, so eviction trims chains from the end.
  for (auto it = table.rbegin(); it != table.rend(); ++it) {
    if (allocator_.release(*it) == 0 && !prefix_.park(*it)) allocator_.free(*it);
  }
  table.clear();
}

void KvCacheManager::cache_full_blocks(std::span<const TokenId> tokens, int64_t num_computed, BlockTable& table,
                                       PrefixCursor& cursor) {
  if (!config_.enable_prefix_cache) return;
  const int bs = config_.block_size;
  const int64_t full = std::min<int64_t>(num_computed / bs, static_cast<int64_t>(table.size()));
  for (int64_t i = cursor.num_blocks; i < full; ++i) {
    const auto inserted = prefix_.insert(cursor.node, tokens.subspan(i * bs, bs), table[i]);
    if (!inserted) return;  // hash collision: stop caching this sequence's chain
    const auto [node, cached_block] = *inserted;
    if (cached_block != table[i]) {
      // Same prefix computed by another sequence first: share its block, free ours (same content).
      if (allocator_.ref_count(cached_block) == 0) prefix_.unpark(cached_block);
      allocator_.retain(cached_block);
      if (allocator_.release(table[i]) == 0) allocator_.free(table[i]);
      table[i] = cached_block;
    }
    cursor = {node, i + 1};
  }
}

std::optional<int32_t> KvCacheManager::allocate_slot() {
  if (free_slots_.empty()) return std::nullopt;
  const int32_t s = free_slots_.back();
  free_slots_.pop_back();
  slot_in_use_[s] = 1;
  return s;
}

void KvCacheManager::free_slot(int32_t slot) {
  DI_CHECK_INTERNAL(slot >= 0 && slot < config_.num_state_slots && slot_in_use_[slot])
      << "free of state slot " << slot << " that is not in use";
  slot_in_use_[slot] = 0;
  free_slots_.push_back(slot);
}

void KvCacheManager::check_invariants(std::span<const BlockTable* const> tables) const {
  const int32_t n = allocator_.num_blocks();
  std::vector<int32_t> holders(n, 0);
  for (const BlockTable* t : tables)
    for (BlockId b : *t) {
      DI_CHECK_INTERNAL(b >= 0 && b < n) << "table holds invalid block " << b;
      ++holders[b];
    }
  int32_t free = 0, parked = 0;
  for (BlockId b = 0; b < n; ++b) {
    const int32_t ref = allocator_.ref_count(b);
    DI_CHECK_INTERNAL(ref >= 0) << "block " << b << " has negative ref count " << ref;
    DI_CHECK_INTERNAL(ref == holders[b]) << "block " << b << " ref " << ref << " but " << holders[b] << " holders";
    if (allocator_.is_free(b)) {
      ++free;
      DI_CHECK_INTERNAL(ref == 0 && !prefix_.holds(b)) << "free block " << b << " is referenced or cached";
    } else if (ref == 0) {
      ++parked;
      DI_CHECK_INTERNAL(prefix_.is_parked(b)) << "block " << b << " leaked: ref 0, not free, not cached";
    } else {
      DI_CHECK_INTERNAL(!prefix_.is_parked(b)) << "used block " << b << " is marked parked";
    }
    if (prefix_.holds(b)) {
      const PrefixNodeId parent = prefix_.parent_of(prefix_.node_of(b));
      // Held blocks have held ancestors, so a parked subtree is entirely parked: every parked block can be
      // reclaimed by evicting leaves, which is what makes "available = free + parked" true.
      if (parent != kPrefixRoot && ref > 0) {
        const BlockId pb = prefix_.block_of(parent);
        DI_CHECK_INTERNAL(allocator_.ref_count(pb) > 0)
            << "block " << b << " is held but its prefix parent block " << pb << " is not";
      }
    }
  }
  DI_CHECK_INTERNAL(free == allocator_.num_free()) << "free list size " << allocator_.num_free() << " != " << free;
  DI_CHECK_INTERNAL(parked == prefix_.num_parked()) << "parked count " << prefix_.num_parked() << " != " << parked;
}

}  // namespace deepinfer
