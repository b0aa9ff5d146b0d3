// KvCacheManager: the block pool, the prefix cache and the per-sequence state slots behind one small interface.
// It decides which block ids and slots a sequence owns; the model's cache storage (one array per cache kind,
// indexed by block id or slot) lives with the forward pass. Single-threaded: the engine calls it between steps.
//
// Capacity accounting: a block is "available" when free or parked (ref 0 but kept by the prefix cache);
// allocation takes free blocks first and then evicts the least recently used parked leaf.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "deepinfer/kv/block_allocator.h"
#include "deepinfer/kv/block_table.h"
#include "deepinfer/kv/prefix_cache.h"
#include "deepinfer/sampling/sampling_params.h"

namespace deepinfer {

struct KvCacheConfig {
  int32_t num_blocks = 0;
  int block_size = 64;
  int32_t num_state_slots = 0;
  bool enable_prefix_cache = true;
  // Positions before a prefix hit that a new sequence must still run to rebuild state that is not
  // prefix-reusable (KvLayout::replay_tokens: the SWA window for V4/V4.1, 0 for V3).
  int prefix_replay_tokens = 0;
  // A hit past a sequence's prompt (a recompute after preemption) replays prefix_replay_tokens plus the hit's
  // distance past the prompt, up to this many (ModelRunner::prefix_replay_tokens_past_prompt; the Engine fills it
  // in from its runner when 0). Below prefix_replay_tokens it has no effect.
  int prefix_replay_tokens_past_prompt = 0;
  // Fault injection (tests, soak runs): asked before each allocate() of n > 0 blocks; true makes that allocation
  // fail as if the pool were exhausted. Passed by construction so that no test reaches into a global.
  std::function<bool(int64_t n)> allocation_fault;
};

// A prefix-cache hit for a sequence that has not started (or restarts after preemption).
struct PrefixMatch {
  std::vector<BlockId> blocks;      // cached blocks covering [0, cached_tokens)
  std::vector<PrefixNodeId> nodes;  // their tree nodes
  int64_t cached_tokens = 0;        // persistent cache entries for these positions already exist
  int64_t compute_from = 0;         // first position the model must run: cached_tokens - replay, >= 0
};

// Read-only queries the scheduler plans with. The scheduler never mutates the cache: the engine commits a plan.
class CacheView {
 public:
  virtual ~CacheView() = default;
  virtual int block_size() const = 0;
  virtual int32_t num_blocks() const = 0;
  virtual int32_t num_available_blocks() const = 0;  // free + parked
  virtual int32_t ref_count(BlockId b) const = 0;
  // Longest cached prefix of `tokens`, leaving at least one token to compute (the model must produce logits).
  // `prompt_len`: how many of `tokens` are the prompt (-1: all), for the replay of a hit past the prompt.
  virtual PrefixMatch match_prefix(std::span<const TokenId> tokens, int64_t prompt_len = -1) const = 0;
};

// How far a sequence's own blocks have been entered into the prefix cache.
struct PrefixCursor {
  PrefixNodeId node = kPrefixRoot;
  int64_t num_blocks = 0;
};

struct KvCacheStats {
  int64_t prefix_queries = 0;       // sequences admitted with a lookup
  int64_t prefix_query_tokens = 0;  // their token counts
  int64_t prefix_hit_tokens = 0;    // tokens whose persistent cache came from the prefix cache
  int64_t evictions = 0;
  double hit_rate() const {
    return prefix_query_tokens ? static_cast<double>(prefix_hit_tokens) / prefix_query_tokens : 0.0;
  }
};

class KvCacheManager final : public CacheView {
 public:
  explicit KvCacheManager(const KvCacheConfig& config);

  // CacheView
  int block_size() const override { return config_.block_size; }
  int32_t num_blocks() const override { return allocator_.num_blocks(); }
  int32_t num_available_blocks() const override;
  int32_t ref_count(BlockId b) const override { return allocator_.ref_count(b); }
  PrefixMatch match_prefix(std::span<const TokenId> tokens, int64_t prompt_len = -1) const override;

  const KvCacheConfig& config() const { return config_; }

  // Takes references on a match's blocks into an empty table and returns the cursor after them.
  // `query_tokens` is the sequence length, for the hit-rate statistics.
  PrefixCursor adopt_prefix(const PrefixMatch& match, int64_t query_tokens, BlockTable& table);
  // Appends n blocks, all or nothing: returns false (table unchanged) when not enough blocks are available or
  // config.allocation_fault says this allocation fails.
  bool allocate(BlockTable& table, int64_t n);
  // Shares every block of `src` with an empty `dst` (beam search). Blocks are immutable only once full: a
  // shared partial last block must be copied before either table writes to it (no copy-on-write here). The
  // engine's n > 1 samples do not fork; they share the prompt through the prefix cache.
  void fork(const BlockTable& src, BlockTable& dst);
  // Drops the table's references; blocks the prefix cache holds are parked, the rest freed. Clears the table.
  void release(BlockTable& table);
  // Enters the sequence's full, computed blocks into the prefix cache (tokens[0 : num_computed)). If another
  // sequence cached the same prefix first, the table switches to that block and frees its duplicate.
  void cache_full_blocks(std::span<const TokenId> tokens, int64_t num_computed, BlockTable& table,
                         PrefixCursor& cursor);

  std::optional<int32_t> allocate_slot();
  void free_slot(int32_t slot);
  int32_t num_free_slots() const { return static_cast<int32_t>(free_slots_.size()); }

  const KvCacheStats& stats() const { return stats_; }
  const PrefixCache& prefix_cache() const { return prefix_; }

  // Tests: every block is exactly one of free / used / parked; `tables` (all live sequences' tables) account
  // for every reference; parked blocks are exactly the ref-0 tree blocks; the tree's ancestor invariant holds.
  // Throws Internal on a violation.
  void check_invariants(std::span<const BlockTable* const> tables) const;

 private:
  std::optional<BlockId> take_block();

  KvCacheConfig config_;
  BlockAllocator allocator_;
  PrefixCache prefix_;
  std::vector<int32_t> free_slots_;
  std::vector<uint8_t> slot_in_use_;
  KvCacheStats stats_;
};

}  // namespace deepinfer
