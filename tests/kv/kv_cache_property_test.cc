// Property test of the cache manager: 10k random operations (admit with prefix lookup, grow, cache full blocks,
// fork, release, evict by pressure) against a shadow model of block contents. Checked after every operation:
// ref counts equal the number of holding tables (never negative), every block is exactly one of free / used /
// parked, nothing leaks; and on every prefix hit the adopted blocks really hold the tokens of that prefix (a
// freed block is "poisoned" in the shadow and must never be handed out as a hit).
#include <gtest/gtest.h>

#include <random>

#include "deepinfer/kv/kv_cache_manager.h"

namespace deepinfer {
namespace {

constexpr int kBlockSize = 4;
constexpr TokenId kPoison = -1;

struct LiveSeq {
  std::vector<TokenId> tokens;
  int64_t computed = 0;
  BlockTable table;
  PrefixCursor cursor;
};

class Harness {
 public:
  Harness(int32_t num_blocks, uint32_t seed, int replay)
      : kv_({.num_blocks = num_blocks, .block_size = kBlockSize, .num_state_slots = 0, .enable_prefix_cache = true,
             .prefix_replay_tokens = replay}),
        shadow_(static_cast<size_t>(num_blocks) * kBlockSize, kPoison),
        rng_(seed) {}

  void check() {
    std::vector<const BlockTable*> tables;
    for (const auto& s : seqs_) tables.push_back(&s.table);
    kv_.check_invariants(tables);
    // Free blocks are poisoned in the shadow.
    for (BlockId b = 0; b < kv_.num_blocks(); ++b)
      if (kv_.ref_count(b) == 0 && !kv_.prefix_cache().holds(b)) {
        for (int i = 0; i < kBlockSize; ++i) ASSERT_EQ(shadow_[b * kBlockSize + i], kPoison) << "block " << b;
      }
  }

  // Token streams drawn from a few shared prefixes so that hits are common.
  std::vector<TokenId> random_tokens() {
    const int family = static_cast<int>(rng_() % 4);
    const int len = 1 + static_cast<int>(rng_() % 23);
    std::vector<TokenId> t(len);
    for (int i = 0; i < len; ++i) t[i] = (i < 10 ? family * 1000 + i : static_cast<TokenId>(rng_() % 5));
    return t;
  }

  void admit() {
    LiveSeq s;
    s.tokens = random_tokens();
    const PrefixMatch m = kv_.match_prefix(s.tokens);
    // Every hit block holds exactly the prefix's tokens.
    for (size_t i = 0; i < m.blocks.size(); ++i)
      for (int j = 0; j < kBlockSize; ++j)
        ASSERT_EQ(shadow_[m.blocks[i] * kBlockSize + j], s.tokens[i * kBlockSize + j]) << "stale prefix block";
    const int64_t n_new = blocks_for_tokens(s.tokens.size(), kBlockSize) - static_cast<int64_t>(m.blocks.size());
    const int32_t avail_before = kv_.num_available_blocks();
    int64_t revive = 0;
    for (BlockId b : m.blocks) revive += kv_.ref_count(b) == 0;
    if (n_new + revive > avail_before) {
      ++exhausted_;
      return;  // the scheduler would not admit it
    }
    s.cursor = kv_.adopt_prefix(m, static_cast<int64_t>(s.tokens.size()), s.table);
    s.computed = m.cached_tokens;
    ASSERT_TRUE(kv_.allocate(s.table, n_new));
    hits_ += m.blocks.size();
    seqs_.push_back(std::move(s));
    compute(seqs_.back());
  }

  // Writes the not-yet-computed tokens into the shadow (the "forward pass") and caches full blocks.
  void compute(LiveSeq& s) {
    for (int64_t p = s.computed; p < static_cast<int64_t>(s.tokens.size()); ++p) {
      const BlockId b = s.table[p / kBlockSize];
      ASSERT_EQ(kv_.ref_count(b), 1) << "writing into a shared block";
      shadow_[b * kBlockSize + p % kBlockSize] = s.tokens[p];
    }
    s.computed = static_cast<int64_t>(s.tokens.size());
    const BlockTable before = s.table;
    kv_.cache_full_blocks(s.tokens, s.computed, s.table, s.cursor);
    for (size_t i = 0; i < before.size(); ++i)
      if (before[i] != s.table[i]) poison_if_free(before[i]);
  }

  void grow(LiveSeq& s) {
    const int add = 1 + static_cast<int>(rng_() % 6);
    const int64_t new_len = static_cast<int64_t>(s.tokens.size()) + add;
    const int64_t need = blocks_for_tokens(new_len, kBlockSize) - static_cast<int64_t>(s.table.size());
    if (!kv_.allocate(s.table, need)) {
      ++exhausted_;
      return;
    }
    for (int i = 0; i < add; ++i) s.tokens.push_back(static_cast<TokenId>(rng_() % 5));
    compute(s);
  }

  void release(size_t i) {
    const BlockTable t = seqs_[i].table;
    kv_.release(seqs_[i].table);
    for (BlockId b : t) poison_if_free(b);
    seqs_.erase(seqs_.begin() + i);
  }

  void fork(size_t i) {
    // Fork only block-aligned sequences: a shared partial block would need copy-on-write.
    if (seqs_[i].tokens.size() % kBlockSize != 0) return;
    LiveSeq c = seqs_[i];
    c.table.clear();
    kv_.fork(seqs_[i].table, c.table);
    seqs_.push_back(std::move(c));
  }

  void poison_if_free(BlockId b) {
    if (kv_.ref_count(b) == 0 && !kv_.prefix_cache().holds(b))
      std::fill_n(shadow_.begin() + b * kBlockSize, kBlockSize, kPoison);
  }

  // Evicted blocks are handed out again; their old content must not survive in the shadow as a hit: the next
  // writer overwrites it, and the tree node is gone. Poison every free block after allocations that evict.
  void repoison_free() {
    for (BlockId b = 0; b < kv_.num_blocks(); ++b) poison_if_free(b);
  }

  void run(int ops) {
    for (int op = 0; op < ops; ++op) {
      const uint32_t r = rng_() % 10;
      if (seqs_.empty() || r < 4) {
        admit();
      } else if (r < 7) {
        grow(seqs_[rng_() % seqs_.size()]);
      } else if (r < 8) {
        fork(rng_() % seqs_.size());
      } else {
        release(rng_() % seqs_.size());
      }
      repoison_free();
      check();
      if (::testing::Test::HasFatalFailure()) return;
    }
    while (!seqs_.empty()) release(seqs_.size() - 1);
    check();
    EXPECT_EQ(kv_.num_available_blocks(), kv_.num_blocks()) << "blocks leaked";
  }

  KvCacheManager kv_;
  std::vector<TokenId> shadow_;
  std::mt19937 rng_;
  std::vector<LiveSeq> seqs_;
  int64_t hits_ = 0;
  int64_t exhausted_ = 0;
};

TEST(KvCacheProperty, TenThousandRandomOperationsKeepInvariants) {
  for (uint32_t seed : {1u, 2u, 3u}) {
    Harness h(/*num_blocks=*/40, seed, /*replay=*/0);
    h.run(10000);
    if (HasFatalFailure()) return;
    EXPECT_GT(h.hits_, 100) << "the workload should exercise prefix hits";
    EXPECT_GT(h.exhausted_, 10) << "the workload should exercise exhaustion";
    EXPECT_GT(h.kv_.stats().evictions, 10) << "the workload should exercise eviction";
  }
}

TEST(KvCacheProperty, WithReplayWindow) {
  Harness h(/*num_blocks=*/24, 9, /*replay=*/4);
  h.run(3000);
}

}  // namespace
}  // namespace deepinfer
