#include "deepinfer/kv/prefix_cache.h"

#include <gtest/gtest.h>

#include <numeric>

#include "deepinfer/kv/kv_cache_manager.h"

namespace deepinfer {
namespace {

std::vector<TokenId> iota_tokens(int n, TokenId first = 0) {
  std::vector<TokenId> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

// A sequence computed `tokens` entirely: allocate, cache its full blocks.
struct Seq {
  std::vector<TokenId> tokens;
  BlockTable table;
  PrefixCursor cursor;
};

Seq run_sequence(KvCacheManager& kv, std::vector<TokenId> tokens) {
  Seq s{std::move(tokens), {}, {}};
  const PrefixMatch m = kv.match_prefix(s.tokens);
  s.cursor = kv.adopt_prefix(m, static_cast<int64_t>(s.tokens.size()), s.table);
  EXPECT_TRUE(kv.allocate(s.table, blocks_for_tokens(s.tokens.size(), kv.block_size()) - s.table.size()));
  kv.cache_full_blocks(s.tokens, static_cast<int64_t>(s.tokens.size()), s.table, s.cursor);
  return s;
}

KvCacheManager make_kv(int32_t blocks, int replay = 0) {
  return KvCacheManager({.num_blocks = blocks,
                         .block_size = 4,
                         .num_state_slots = 4,
                         .enable_prefix_cache = true,
                         .prefix_replay_tokens = replay});
}

TEST(PrefixCache, LongestPrefixOfWholeBlocksLeavingOneTokenToCompute) {
  auto kv = make_kv(16);
  Seq a = run_sequence(kv, iota_tokens(10));  // blocks [0..3], [4..7] full; [8, 9] partial
  EXPECT_EQ(kv.prefix_cache().num_nodes(), 2);

  auto same_start = iota_tokens(12);
  same_start[9] = 99;
  PrefixMatch m = kv.match_prefix(same_start);
  EXPECT_EQ(m.cached_tokens, 8);
  EXPECT_EQ(m.compute_from, 8);
  EXPECT_EQ(m.blocks, (BlockTable{a.table[0], a.table[1]}));

  auto diverge_in_block_two = iota_tokens(12);
  diverge_in_block_two[5] = 77;
  EXPECT_EQ(kv.match_prefix(diverge_in_block_two).cached_tokens, 4);
  auto diverge_at_zero = iota_tokens(12, 1);
  EXPECT_EQ(kv.match_prefix(diverge_at_zero).cached_tokens, 0);
  // Exactly 8 tokens: the last one must be computed, so only the first block is a hit.
  EXPECT_EQ(kv.match_prefix(iota_tokens(8)).cached_tokens, 4);
  EXPECT_EQ(kv.match_prefix(iota_tokens(9)).cached_tokens, 8);
}

TEST(PrefixCache, ReplayWindowMovesComputeStartBack) {
  auto kv = make_kv(16, /*replay=*/6);
  run_sequence(kv, iota_tokens(14));  // 3 full blocks
  PrefixMatch m = kv.match_prefix(iota_tokens(20));
  EXPECT_EQ(m.cached_tokens, 12);
  EXPECT_EQ(m.compute_from, 6);
  m = kv.match_prefix(iota_tokens(5));
  EXPECT_EQ(m.cached_tokens, 4);
  EXPECT_EQ(m.compute_from, 0);
}

// A hit past the sequence's prompt (a recompute after preemption) replays the window plus the hit's distance past
// the prompt, up to prefix_replay_tokens_past_prompt; a hit inside the prompt keeps the window.
TEST(PrefixCache, ReplayGrowsForAHitPastThePrompt) {
  KvCacheManager kv({.num_blocks = 16,
                     .block_size = 4,
                     .num_state_slots = 4,
                     .enable_prefix_cache = true,
                     .prefix_replay_tokens = 2,
                     .prefix_replay_tokens_past_prompt = 7});
  run_sequence(kv, iota_tokens(14));  // 3 full blocks
  const std::vector<TokenId> t = iota_tokens(20);
  EXPECT_EQ(kv.match_prefix(t).compute_from, 10);                     // no prompt length: all prompt
  EXPECT_EQ(kv.match_prefix(t, /*prompt_len=*/12).compute_from, 10);  // the hit ends inside the prompt
  EXPECT_EQ(kv.match_prefix(t, /*prompt_len=*/10).compute_from, 8);   // 2 past: replay 2 + 2
  EXPECT_EQ(kv.match_prefix(t, /*prompt_len=*/3).compute_from, 5);    // 9 past: replay capped at 7
  // Without the cap, the window as before.
  auto plain = make_kv(16, /*replay=*/2);
  run_sequence(plain, iota_tokens(14));
  EXPECT_EQ(plain.match_prefix(t, /*prompt_len=*/3).compute_from, 10);
}

TEST(PrefixCache, HitsShareBlocksAndCountStatistics) {
  auto kv = make_kv(16);
  Seq a = run_sequence(kv, iota_tokens(9));
  Seq b = run_sequence(kv, iota_tokens(11));
  EXPECT_EQ(b.table[0], a.table[0]);
  EXPECT_EQ(b.table[1], a.table[1]);
  EXPECT_NE(b.table[2], a.table[2]);
  EXPECT_EQ(kv.ref_count(a.table[0]), 2);
  EXPECT_EQ(kv.stats().prefix_queries, 2);
  EXPECT_EQ(kv.stats().prefix_hit_tokens, 8);
  EXPECT_EQ(kv.stats().prefix_query_tokens, 20);
  EXPECT_DOUBLE_EQ(kv.stats().hit_rate(), 0.4);
  const BlockTable* tables[] = {&a.table, &b.table};
  kv.check_invariants(tables);
}

TEST(PrefixCache, ReleasedBlocksParkAndRevive) {
  auto kv = make_kv(8);
  Seq a = run_sequence(kv, iota_tokens(9));
  const BlockTable old = a.table;
  kv.release(a.table);
  EXPECT_EQ(kv.num_available_blocks(), 8);
  EXPECT_EQ(kv.prefix_cache().num_parked(), 2);  // the two full blocks; the partial one went to the free list
  Seq b = run_sequence(kv, iota_tokens(9));
  EXPECT_EQ(b.table[0], old[0]);
  EXPECT_EQ(b.table[1], old[1]);
  EXPECT_EQ(kv.prefix_cache().num_parked(), 0);
  const BlockTable* tables[] = {&b.table};
  kv.check_invariants(tables);
}

TEST(PrefixCache, EvictsLeastRecentlyUsedLeavesFirst) {
  auto kv = make_kv(6);
  Seq a = run_sequence(kv, iota_tokens(8, 0));    // 2 blocks: a0 a1
  Seq b = run_sequence(kv, iota_tokens(8, 100));  // 2 blocks: b0 b1
  const BlockTable ta = a.table, tb = b.table;
  kv.release(a.table);  // parked first: older
  kv.release(b.table);
  EXPECT_EQ(kv.prefix_cache().num_evictable(), 2);  // only leaves: a1, b1
  BlockTable t;
  ASSERT_TRUE(kv.allocate(t, 2));  // the two free blocks, no eviction
  EXPECT_EQ(kv.stats().evictions, 0);
  ASSERT_TRUE(kv.allocate(t, 1));  // evicts a's leaf a1
  EXPECT_EQ(t.back(), ta[1]);
  EXPECT_EQ(kv.match_prefix(iota_tokens(9, 0)).cached_tokens, 4);
  ASSERT_TRUE(kv.allocate(t, 1));  // then a0 (now a leaf, parked before b's blocks)
  EXPECT_EQ(t.back(), ta[0]);
  EXPECT_EQ(kv.match_prefix(iota_tokens(9, 0)).cached_tokens, 0);
  EXPECT_EQ(kv.match_prefix(iota_tokens(9, 100)).cached_tokens, 8);
  // Then b, leaf first.
  ASSERT_TRUE(kv.allocate(t, 2));
  EXPECT_EQ(t[4], tb[1]);
  EXPECT_EQ(t[5], tb[0]);
  EXPECT_FALSE(kv.allocate(t, 1));  // exhausted: all or nothing, table unchanged
  EXPECT_EQ(t.size(), 6u);
  EXPECT_EQ(kv.stats().evictions, 4);
  const BlockTable* tables[] = {&t};
  kv.check_invariants(tables);
}

TEST(PrefixCache, HitRefreshesRecency) {
  auto kv = make_kv(4);
  Seq a = run_sequence(kv, iota_tokens(5, 0));    // a0 + partial
  Seq b = run_sequence(kv, iota_tokens(5, 100));  // b0 + partial
  const BlockId a0 = a.table[0], b0 = b.table[0];
  kv.release(a.table);
  kv.release(b.table);
  Seq a2 = run_sequence(kv, iota_tokens(5, 0));  // revives a0: it is now the most recently used
  kv.release(a2.table);
  BlockTable t;
  ASSERT_TRUE(kv.allocate(t, 3));  // 2 free + evict b0, the least recently used
  EXPECT_EQ(t.back(), b0);
  EXPECT_EQ(kv.match_prefix(iota_tokens(5, 0)).blocks, (BlockTable{a0}));
}

TEST(PrefixCache, DuplicateComputationSwitchesToTheCachedBlock) {
  auto kv = make_kv(8);
  // Two sequences admitted together (no hit for either), both compute the same first block.
  Seq a{iota_tokens(6), {}, {}}, b{iota_tokens(6), {}, {}};
  ASSERT_TRUE(kv.allocate(a.table, 2));
  ASSERT_TRUE(kv.allocate(b.table, 2));
  kv.cache_full_blocks(a.tokens, 6, a.table, a.cursor);
  const BlockId b_own = b.table[0];
  kv.cache_full_blocks(b.tokens, 6, b.table, b.cursor);
  EXPECT_EQ(b.table[0], a.table[0]);
  EXPECT_EQ(kv.ref_count(a.table[0]), 2);
  EXPECT_EQ(kv.ref_count(a.table[1]), 1);
  EXPECT_EQ(b.cursor.num_blocks, 1);
  (void)b_own;
  EXPECT_EQ(kv.num_available_blocks(), 8 - 3);  // b's duplicate went back
  const BlockTable* tables[] = {&a.table, &b.table};
  kv.check_invariants(tables);
}

TEST(PrefixCache, DisabledCacheNeverMatches) {
  KvCacheManager kv({.num_blocks = 8, .block_size = 4, .num_state_slots = 1, .enable_prefix_cache = false});
  Seq a = run_sequence(kv, iota_tokens(9));
  kv.release(a.table);
  EXPECT_EQ(kv.match_prefix(iota_tokens(9)).cached_tokens, 0);
  EXPECT_EQ(kv.prefix_cache().num_nodes(), 0);
  EXPECT_EQ(kv.num_available_blocks(), 8);
}

}  // namespace
}  // namespace deepinfer
