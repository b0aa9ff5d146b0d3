// Scheduler unit tests: hand-built sequences and a real KvCacheManager as the cache view; no model.
#include "deepinfer/engine/scheduler.h"

#include <gtest/gtest.h>

#include <memory>

#include "deepinfer/core/error.h"

namespace deepinfer {
namespace {

constexpr int kBs = 4;

class SchedulerTest : public ::testing::Test {
 protected:
  void make_cache(int32_t blocks, bool prefix = false) {
    kv_ = std::make_unique<KvCacheManager>(
        KvCacheConfig{.num_blocks = blocks, .block_size = kBs, .num_state_slots = 8, .enable_prefix_cache = prefix});
  }

  // A sequence with `num_tokens` tokens (prompt_len of them prompt) of which `computed` are in the cache.
  // Running sequences hold the blocks covering their computed positions.
  Sequence* add(int64_t num_tokens, int64_t computed, int64_t prompt_len = -1, TokenId base = -1) {
    auto s = std::make_unique<Sequence>();
    s->id = static_cast<int64_t>(seqs_.size());
    s->params = std::make_shared<SamplingParams>();
    for (int64_t i = 0; i < num_tokens; ++i) s->tokens.push_back((base < 0 ? s->id * 1000 : base) + i);
    s->prompt_len = prompt_len < 0 ? num_tokens : prompt_len;
    s->num_computed = computed;
    if (computed > 0) {
      s->status = computed == num_tokens - 1 ? SequenceStatus::kDecoding : SequenceStatus::kRunning;
      EXPECT_TRUE(kv_->allocate(s->block_table, blocks_for_tokens(computed, kBs)));
      running_.push_back(s.get());
    } else {
      s->status = SequenceStatus::kWaiting;
      waiting_.push_back(s.get());
    }
    seqs_.push_back(std::move(s));
    return seqs_.back().get();
  }

  StepPlan plan() { return schedule({running_, waiting_}, *kv_, config_); }

  SchedulerConfig config_{.max_num_seqs = 4, .max_num_batched_tokens = 10, .max_model_len = 64};
  std::unique_ptr<KvCacheManager> kv_;
  std::vector<std::unique_ptr<Sequence>> seqs_;
  std::vector<const Sequence*> running_, waiting_;
};

TEST_F(SchedulerTest, DecodesFirstThenChunkedPrefillUnderTheTokenBudget) {
  make_cache(32);
  Sequence* c = add(20, 0);  // waiting, arrived first but not running
  Sequence* a = add(9, 8);
  Sequence* b = add(9, 8);
  running_ = {a, b};
  const StepPlan p = plan();
  ASSERT_EQ(p.scheduled.size(), 3u);
  EXPECT_EQ(p.scheduled[0].seq, a);
  EXPECT_EQ(p.scheduled[1].seq, b);
  EXPECT_EQ(p.scheduled[0].start, 8);
  EXPECT_EQ(p.scheduled[0].end, 9);
  EXPECT_TRUE(p.scheduled[0].sample);
  EXPECT_EQ(p.scheduled[0].num_new_blocks, 1);  // position 8 starts block 2
  EXPECT_EQ(p.scheduled[2].seq, c);
  EXPECT_TRUE(p.scheduled[2].admitted);
  EXPECT_EQ(p.scheduled[2].start, 0);
  EXPECT_EQ(p.scheduled[2].end, 8);  // the 2 decodes used 2 of the 10 tokens
  EXPECT_FALSE(p.scheduled[2].sample);
  EXPECT_EQ(p.scheduled[2].num_new_blocks, 2);
  EXPECT_EQ(p.num_batched_tokens, 10);
  EXPECT_EQ(p.num_decodes, 2);
  EXPECT_EQ(p.num_prefills, 1);
  EXPECT_TRUE(p.preempted.empty());
}

TEST_F(SchedulerTest, RunningPrefillContinuesBeforeNewAdmissions) {
  make_cache(32);
  Sequence* a = add(20, 8);  // mid-prefill: 8 of 20 computed
  add(5, 0);                 // waiting
  const StepPlan p = plan();
  ASSERT_EQ(p.scheduled.size(), 1u);
  EXPECT_EQ(p.scheduled[0].seq, a);
  EXPECT_EQ(p.scheduled[0].start, 8);
  EXPECT_EQ(p.scheduled[0].end, 18);
  EXPECT_EQ(p.scheduled[0].num_new_blocks, 3);  // blocks 2..4 for positions 8..17
  config_.max_num_batched_tokens = 32;
  const StepPlan q = plan();
  ASSERT_EQ(q.scheduled.size(), 2u);
  EXPECT_EQ(q.scheduled[0].end, 20);
  EXPECT_TRUE(q.scheduled[0].sample);
  EXPECT_EQ(q.scheduled[1].end, 5);
  EXPECT_TRUE(q.scheduled[1].sample);
}

TEST_F(SchedulerTest, MaxNumSeqsBoundsRunningSequences) {
  make_cache(32);
  config_.max_num_seqs = 2;
  config_.max_num_batched_tokens = 100;
  add(9, 8);
  add(3, 0);
  add(3, 0);
  const StepPlan p = plan();
  ASSERT_EQ(p.scheduled.size(), 2u);
  EXPECT_EQ(p.scheduled[1].seq->id, 1);
}

TEST_F(SchedulerTest, StrictFcfsHeadOfLineBlocksLaterArrivals) {
  make_cache(6);
  config_.enable_chunked_prefill = false;
  config_.max_num_batched_tokens = 64;
  add(40, 0);  // needs 10 blocks: never fits now
  add(3, 0);   // would fit, but must not overtake
  EXPECT_TRUE(plan().scheduled.empty());
  // With chunking, the head takes what fits (6 blocks = 24 tokens) and the next still waits for budget.
  config_.enable_chunked_prefill = true;
  config_.max_num_batched_tokens = 30;
  const StepPlan p = plan();
  ASSERT_EQ(p.scheduled.size(), 1u);
  EXPECT_EQ(p.scheduled[0].seq->id, 0);
  EXPECT_EQ(p.scheduled[0].end, 24);
  EXPECT_EQ(p.scheduled[0].num_new_blocks, 6);
}

TEST_F(SchedulerTest, PreemptsNewestFirstWhenTheCacheIsFull) {
  make_cache(6);
  Sequence* a = add(9, 8);
  Sequence* b = add(9, 8);
  Sequence* c = add(9, 8);  // all 6 blocks held; every decode needs a 3rd block
  add(2, 0);                // waiting: must not be admitted in a step that preempted
  ASSERT_EQ(kv_->num_available_blocks(), 0);
  const StepPlan p = plan();
  ASSERT_EQ(p.preempted.size(), 1u);
  EXPECT_EQ(p.preempted[0], c);
  ASSERT_EQ(p.scheduled.size(), 2u);
  EXPECT_EQ(p.scheduled[0].seq, a);
  EXPECT_EQ(p.scheduled[1].seq, b);
  EXPECT_EQ(p.scheduled[0].num_new_blocks + p.scheduled[1].num_new_blocks, 2);
}

TEST_F(SchedulerTest, TheNeedySequencePreemptsItselfWhenItIsTheNewest) {
  make_cache(4);
  Sequence* a = add(6, 5);  // positions 0..5 fit in its 2 blocks
  Sequence* b = add(9, 8);  // needs a third block, none available, nobody newer
  const StepPlan p = plan();
  ASSERT_EQ(p.preempted.size(), 1u);
  EXPECT_EQ(p.preempted[0], b);
  ASSERT_EQ(p.scheduled.size(), 1u);
  EXPECT_EQ(p.scheduled[0].seq, a);
}

TEST_F(SchedulerTest, PreemptionCountsOnlyBlocksItReallyFrees) {
  make_cache(8, /*prefix=*/true);
  Sequence* a = add(9, 8);
  Sequence* b = add(9, 8);
  Sequence* d = add(9, 8);
  // c (newest) shares b's first block, as after a prefix hit, and owns one more: preempting it frees only 1.
  auto c_owned = std::make_unique<Sequence>(*b);
  Sequence* c = c_owned.get();
  c->id = 3;
  c->block_table.clear();
  kv_->fork(BlockTable{b->block_table[0]}, c->block_table);
  ASSERT_TRUE(kv_->allocate(c->block_table, 1));
  running_.push_back(c);
  seqs_.push_back(std::move(c_owned));
  ASSERT_EQ(kv_->num_available_blocks(), 1);
  // a takes the free block; b needs one: preempting c frees 1; d needs one: only d itself is left.
  // Counting c's shared block as freed would have scheduled d and over-committed the cache.
  const StepPlan p = plan();
  ASSERT_EQ(p.preempted.size(), 2u);
  EXPECT_EQ(p.preempted[0], c);
  EXPECT_EQ(p.preempted[1], d);
  ASSERT_EQ(p.scheduled.size(), 2u);
  EXPECT_EQ(p.scheduled[0].seq, a);
  EXPECT_EQ(p.scheduled[1].seq, b);
}

TEST_F(SchedulerTest, PrefixHitStartsAfterCachedBlocksAndCountsRevivedBlocks) {
  make_cache(5, /*prefix=*/true);
  // A finished sequence left tokens 0..11 cached in 3 parked blocks.
  {
    BlockTable t;
    PrefixCursor cur;
    std::vector<TokenId> toks;
    for (int i = 0; i < 12; ++i) toks.push_back(500 + i);
    ASSERT_TRUE(kv_->allocate(t, 3));
    kv_->cache_full_blocks(toks, 12, t, cur);
    kv_->release(t);
  }
  ASSERT_EQ(kv_->num_available_blocks(), 5);
  config_.max_num_batched_tokens = 64;
  Sequence* s = add(18, 0, -1, 500);  // tokens 500..517: 3 blocks cached
  const StepPlan p = plan();
  ASSERT_EQ(p.scheduled.size(), 1u);
  EXPECT_EQ(p.scheduled[0].seq, s);
  EXPECT_EQ(p.scheduled[0].prefix.cached_tokens, 12);
  EXPECT_EQ(p.scheduled[0].start, 12);
  EXPECT_EQ(p.scheduled[0].end, 18);
  EXPECT_EQ(p.scheduled[0].num_new_blocks, 2);
  // A second identical sequence cannot also fit: the first revives 3 parked blocks and takes the other 2.
  add(18, 0, -1, 500);
  const StepPlan q = plan();
  ASSERT_EQ(q.scheduled.size(), 1u);
}

TEST_F(SchedulerTest, NothingToScheduleGivesAnEmptyPlan) {
  make_cache(4);
  EXPECT_TRUE(plan().empty());
  config_.max_num_batched_tokens = 0;
  EXPECT_THROW(validate(config_), Error);
  config_ = {.max_num_seqs = 1, .max_num_batched_tokens = 8, .max_model_len = 64, .enable_chunked_prefill = false};
  EXPECT_THROW(validate(config_), Error);
}

// ---- scheduling policies (scheduling_policy.h) ----

TEST_F(SchedulerTest, PriorityPolicyAdmitsLowerValuesFirstTiesInArrivalOrder) {
  make_cache(32);
  config_.max_num_seqs = 2;
  config_.max_num_batched_tokens = 100;
  config_.policy = SchedulingPolicyKind::kPriority;
  Sequence* a = add(3, 0);
  Sequence* b = add(3, 0);
  Sequence* c = add(3, 0);
  Sequence* d = add(3, 0);
  a->priority = 5;
  b->priority = 1;
  c->priority = 5;
  d->priority = 1;
  const StepPlan p = plan();
  ASSERT_EQ(p.scheduled.size(), 2u);
  EXPECT_EQ(p.scheduled[0].seq, b);
  EXPECT_EQ(p.scheduled[1].seq, d);
  // FCFS ignores the priorities.
  config_.policy = SchedulingPolicyKind::kFcfs;
  const StepPlan q = plan();
  ASSERT_EQ(q.scheduled.size(), 2u);
  EXPECT_EQ(q.scheduled[0].seq, a);
  EXPECT_EQ(q.scheduled[1].seq, b);
}

TEST_F(SchedulerTest, PriorityPolicyHeadOfLineIsTheMostUrgentWaitingSequence) {
  make_cache(6);
  config_.max_num_batched_tokens = 64;
  config_.enable_chunked_prefill = false;
  config_.policy = SchedulingPolicyKind::kPriority;
  Sequence* small = add(3, 0);  // arrived first, would fit
  Sequence* big = add(40, 0);   // more urgent, does not fit now
  small->priority = 2;
  big->priority = 0;
  EXPECT_TRUE(plan().scheduled.empty()) << "a less urgent sequence overtook the head of the priority queue";
  big->priority = 3;
  const StepPlan p = plan();
  ASSERT_EQ(p.scheduled.size(), 1u);
  EXPECT_EQ(p.scheduled[0].seq, small);
}

TEST_F(SchedulerTest, PriorityPolicyPreemptsTheLeastUrgentRunningSequence) {
  make_cache(6);
  Sequence* a = add(9, 8);
  Sequence* b = add(9, 8);
  Sequence* c = add(9, 8);  // all 6 blocks held; every decode needs a 3rd block
  a->priority = 9;          // oldest but least urgent
  b->priority = 0;
  c->priority = 1;
  config_.policy = SchedulingPolicyKind::kPriority;
  const StepPlan p = plan();
  ASSERT_EQ(p.preempted.size(), 1u);
  EXPECT_EQ(p.preempted[0], a);
  ASSERT_EQ(p.scheduled.size(), 2u);
  EXPECT_EQ(p.scheduled[0].seq, b);  // decodes in priority order
  EXPECT_EQ(p.scheduled[1].seq, c);
  // FCFS preempts the newest whatever the priorities.
  config_.policy = SchedulingPolicyKind::kFcfs;
  const StepPlan q = plan();
  ASSERT_EQ(q.preempted.size(), 1u);
  EXPECT_EQ(q.preempted[0], c);
}

TEST_F(SchedulerTest, PolicyNamesParseAndBadNamesAreRejected) {
  EXPECT_EQ(parse_scheduling_policy("fcfs"), SchedulingPolicyKind::kFcfs);
  EXPECT_EQ(parse_scheduling_policy("priority"), SchedulingPolicyKind::kPriority);
  EXPECT_EQ(scheduling_policy_name(SchedulingPolicyKind::kPriority), "priority");
  EXPECT_EQ(make_scheduling_policy(SchedulingPolicyKind::kPriority)->kind(), SchedulingPolicyKind::kPriority);
  try {
    parse_scheduling_policy("lifo");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(e.message().find("'fcfs' or 'priority'"), std::string::npos) << e.message();
    EXPECT_NE(e.message().find("lifo"), std::string::npos) << e.message();
  }
}

}  // namespace
}  // namespace deepinfer
