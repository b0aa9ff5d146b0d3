#include "deepinfer/kv/kv_layout.h"

#include <gtest/gtest.h>

#include "deepinfer/core/error.h"
#include "test_util.h"

namespace deepinfer {
namespace {

ModelConfig config(const std::string& family) {
  return load_model_config(testing::test_data_dir() + "/configs/" + family + ".json");
}

const CacheKindSpec* find_kind(const KvLayout& l, const std::string& name) {
  for (const auto& k : l.kinds)
    if (k.kind.name == name) return &k;
  return nullptr;
}

TEST(KvLayout, V3MlaLatentIsPagedAndFullyPrefixReusable) {
  const ModelConfig c = config("deepseek_v3");
  const KvLayout l = make_kv_layout(c);
  EXPECT_EQ(l.block_size, 64);
  ASSERT_EQ(l.kinds.size(), 1u);
  EXPECT_TRUE(l.kinds[0].paged);
  EXPECT_TRUE(l.kinds[0].prefix_reusable);
  EXPECT_EQ(l.replay_tokens(), 0);
  // bf16 (kv_lora_rank + rope) per layer.
  const double per_token = 2.0 * (c.mla.kv_lora_rank + c.mla.qk_rope_head_dim) * c.num_layers;
  EXPECT_DOUBLE_EQ(l.bytes_per_token(), per_token);
  EXPECT_EQ(l.bytes_per_block(), static_cast<int64_t>(per_token * 64));
  EXPECT_EQ(l.bytes_per_sequence(), 0);
}

TEST(KvLayout, V41SlidingWindowRingNeedsBoundedReplay) {
  const ModelConfig c = config("deepseek_v41");
  const KvLayout l = make_kv_layout(c);
  const CacheKindSpec* swa = find_kind(l, "swa_ring");
  ASSERT_NE(swa, nullptr);
  EXPECT_FALSE(swa->paged);
  EXPECT_FALSE(swa->prefix_reusable);
  EXPECT_EQ(swa->replay_tokens, c.attn.sliding_window);
  EXPECT_EQ(l.replay_tokens(), c.attn.sliding_window);
  const CacheKindSpec* comp = find_kind(l, "compressed_kv");
  ASSERT_NE(comp, nullptr);
  EXPECT_TRUE(comp->paged);
  EXPECT_TRUE(comp->prefix_reusable);
  if (const CacheKindSpec* st = find_kind(l, "compressor_state")) {
    EXPECT_TRUE(st->prefix_reusable);
  }
  EXPECT_GT(l.bytes_per_sequence(), 0);
}

TEST(KvLayout, V4BlockSizeCoversEveryCompressionRatio) {
  const ModelConfig c = config("deepseek_v4");
  const KvLayout l = make_kv_layout(c);
  for (const auto& p : c.layers)
    if (p.compress_ratio > 0) {
      EXPECT_EQ(l.block_size % p.compress_ratio, 0) << "layer " << p.index;
    }
  int max_ratio = 1;
  for (const auto& p : c.layers) max_ratio = std::max(max_ratio, p.compress_ratio);
  if (max_ratio > 1) {
    EXPECT_THROW(make_kv_layout(c, max_ratio + 1), Error);
  }
}

KvLayout synthetic_layout() {
  KvLayout l;
  l.block_size = 16;
  l.kinds.push_back({CacheKind{"mla_latent", "test", 2, 100.0, 0}, true, true, 0});
  l.kinds.push_back({CacheKind{"swa_ring", "test", 2, 0.0, 1000}, false, false, 8});
  return l;
}

TEST(KvSizing, FillsTheBudgetAfterReservingStateSlots) {
  const KvLayout l = synthetic_layout();
  EXPECT_EQ(l.bytes_per_block(), 1600);
  EXPECT_EQ(l.bytes_per_sequence(), 1000);
  const KvSizing s = size_kv_cache(l, 4 * 1000 + 50 * 1600 + 100, /*max_num_seqs=*/4, /*max_model_len=*/160);
  EXPECT_EQ(s.num_state_slots, 4);
  EXPECT_EQ(s.num_blocks, 50);
  EXPECT_EQ(s.token_capacity, 800);
  EXPECT_EQ(s.max_concurrency, 4);  // bounded by the slots (50 blocks / 10 per sequence = 5)
  EXPECT_EQ(s.bytes_used, 4 * 1000 + 50 * 1600);
  const KvSizing s8 = size_kv_cache(l, 4 * 1000 + 50 * 1600 + 100, 8, 160);
  EXPECT_EQ(s8.num_blocks, 47);
  EXPECT_EQ(s8.max_concurrency, 4);  // 47 / 10: memory-bound now
  const std::string text = describe_kv_cache(l, s, 160);
  EXPECT_NE(text.find("800 tokens fit"), std::string::npos) << text;
  EXPECT_NE(text.find("max concurrency 4"), std::string::npos) << text;
  EXPECT_NE(text.find("re-runs the last 8 tokens"), std::string::npos) << text;
}

TEST(KvSizing, TooSmallBudgetIsResourceExhaustedWithTheNumbers) {
  const KvLayout l = synthetic_layout();
  try {
    size_kv_cache(l, 4 * 1000 + 9 * 1600, 4, 160);
    FAIL() << "expected ResourceExhausted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kResourceExhausted);
    EXPECT_NE(e.message().find("max_model_len 160"), std::string::npos) << e.message();
  }
  EXPECT_THROW(kv_budget_bytes(1000, 0.5, 400, 200), Error);
  EXPECT_EQ(kv_budget_bytes(1000, 0.9, 400, 200), 300);
  EXPECT_THROW(kv_budget_bytes(1000, 1.5, 0, 0), Error);
}

TEST(KvSizing, CacheConfigEnablesPrefixReuseOnlyWhereItIsExactOrReplayIsAllowed) {
  const KvLayout v3 = make_kv_layout(config("deepseek_v3"));
  const KvSizing s3 = size_kv_cache(v3, int64_t{16} << 20, 4, 1024);
  const KvCacheConfig k3 = make_kv_cache_config(v3, s3, true, false);
  EXPECT_TRUE(k3.enable_prefix_cache);
  EXPECT_EQ(k3.prefix_replay_tokens, 0);
  EXPECT_EQ(k3.num_blocks, s3.num_blocks);
  EXPECT_EQ(k3.block_size, v3.block_size);
  EXPECT_EQ(k3.num_state_slots, 4);
  const ModelConfig c41 = config("deepseek_v41");
  const KvLayout v41 = make_kv_layout(c41);
  const KvSizing s41 = size_kv_cache(v41, int64_t{16} << 20, 4, 1024);
  EXPECT_FALSE(make_kv_cache_config(v41, s41, true, false).enable_prefix_cache);
  const KvCacheConfig k41 = make_kv_cache_config(v41, s41, true, true);
  EXPECT_TRUE(k41.enable_prefix_cache);
  EXPECT_EQ(k41.prefix_replay_tokens, c41.attn.sliding_window);
  EXPECT_FALSE(make_kv_cache_config(v3, s3, false, true).enable_prefix_cache);
}

TEST(KvSizing, RealConfigSizesAndLogs) {
  const KvLayout l = make_kv_layout(config("deepseek_v41"));
  const KvSizing s = size_kv_cache(l, int64_t{64} << 20, 4, 1024);
  EXPECT_GT(s.num_blocks, 0);
  EXPECT_GE(s.max_concurrency, 1);
  EXPECT_LE(s.bytes_used, int64_t{64} << 20);
  log_kv_sizing(l, s, 1024);
}

}  // namespace
}  // namespace deepinfer
