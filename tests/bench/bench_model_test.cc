// FLOP/byte counting of the bench slice against values worked out by hand for the tiny slice (dims in
// bench_model.cc: D=64, H=4, hd=32, q_lora=32, 2 output groups of 16, window 8, indexer 2×16 top-4, 4 experts
// top-2 of I=32 + 1 shared, hc=4, 32×32 FP8 blocks).
#include "deepinfer/bench/bench_model.h"

#include <gtest/gtest.h>

#include "deepinfer/core/error.h"

namespace deepinfer::bench {
namespace {

TEST(BenchModel, Pieces) {
  EXPECT_EQ(visible_entries(15, 2), 8);
  EXPECT_EQ(visible_entries(0, 2), 0);
  EXPECT_EQ(visible_entries(1, 2), 1);
  EXPECT_EQ(visible_entries(127, 128), 1);
  EXPECT_EQ(visible_entries(100, 0), 0);
  EXPECT_DOUBLE_EQ(expected_distinct_experts(4, 2, 1), 2.0);  // one token picks exactly k
  EXPECT_DOUBLE_EQ(expected_distinct_experts(4, 2, 2), 3.0);  // 4·(1 − ½²)
  EXPECT_DOUBLE_EQ(expected_distinct_experts(256, 6, 0), 0.0);
  EXPECT_DOUBLE_EQ(fp8_block_bytes(33, 64, 32), 33 * 64 + 2 * 2);  // partial block row still has a scale
  EXPECT_DOUBLE_EQ(mxfp4_bytes(32, 64), 1024 + 64);
}

TEST(BenchModel, TinyDecodeStepByHand) {
  const BenchModel m = tiny_slice();
  const StepCost c = count_step(m, {false, 1, 1, 16});
  // Per layer, every kind: projections 2·(32·64 + 128·32 + 32·64 + 16·128 + 64·32) = 24576; mHC 2 sites ·
  // 2·24·256 = 24576; router 2·4·64 = 512; experts 2·(2+1)·3·64·32 = 36864.
  const double common = 24576 + 24576 + 512 + 36864;
  // Attention at position 15: 8 window keys; + top-4 of 8 entries (indexed, reuse r=2); + 4 entries (r=4).
  const double attn = 4.0 * 128 * (8 + 12 + 12 + 12);
  // Indexer (r=2 layer): q proj 2·(32·32) + head weights 2·(2·64), scores 2·2·16·8.
  const double indexer = 2.0 * (32 * 32 + 2 * 64) + 2.0 * 2 * 16 * 8;
  EXPECT_DOUBLE_EQ(c.flops, 4 * common + attn + indexer);
  // Weights per layer: projections 2050 + 4100 + 2050 + 2·1026 + 2050; mHC 2·4·24·256; router 4·4·64; two
  // distinct experts 2·3·1088; shared expert 3·2050. Indexer: 1025 + 130.
  const double w_layer =
      (2050 + 4100 + 2050 + 2 * 1026 + 2050) + 2 * 4 * 24 * 256 + 4 * 4 * 64 + 2 * 3 * 1088 + 3 * 2050;
  EXPECT_DOUBLE_EQ(c.weight_bytes, 4 * w_layer + 1025 + 130);
  // Cache rows (f32, 32 wide): 8 window rows per layer, + 4 selected (r=2 twice) / 4 entries (r=4); index keys
  // 8 rows of 16.
  EXPECT_DOUBLE_EQ(c.cache_bytes, 4.0 * 32 * (8 + 12 + 12 + 12) + 4.0 * 16 * 8);
  EXPECT_DOUBLE_EQ(c.bytes(), c.weight_bytes + c.cache_bytes);
}

TEST(BenchModel, PrefillCountsEveryQueryCausally) {
  BenchModel m = tiny_slice();
  m.layers = {{AttnKind::kAllSeen, 2}};
  const StepCost c = count_step(m, {true, 1, 4, 4});
  // Positions 0..3: window keys 1+2+3+4, entries 0+1+1+2.
  const double attn = 4.0 * 128 * (10 + 4);
  EXPECT_DOUBLE_EQ(c.flops, 4 * (24576 + 24576 + 512 + 36864) + attn);
  // 4 tokens touch 4·(1 − ½⁴) = 3.75 experts on average.
  EXPECT_DOUBLE_EQ(c.weight_bytes, 12302 + 2 * 4 * 24 * 256 + 4 * 4 * 64 + 3.75 * 3 * 1088 + 3 * 2050);
  EXPECT_DOUBLE_EQ(c.cache_bytes, 4.0 * 32 * (4 + 2));
}

TEST(BenchModel, BadStepIsRejected) {
  EXPECT_THROW(count_step(tiny_slice(), {false, 0, 1, 16}), Error);
  EXPECT_THROW(count_step(tiny_slice(), {true, 1, 32, 16}), Error);
  EXPECT_THROW(v4_flash_slice(0), Error);
}

TEST(BenchModel, RealSlicesHaveEveryKind) {
  const BenchModel v41 = v41_flash_slice(2);
  EXPECT_EQ(v41.layers.size(), 10u);
  EXPECT_EQ(v41.hidden, 5120);
  EXPECT_EQ(v41.experts, 384);
  const BenchModel v4 = v4_flash_slice();
  EXPECT_EQ(v4.layers.size(), 3u);
  EXPECT_EQ(v4.layers[2].kind, AttnKind::kAllSeen);
  EXPECT_EQ(v4.layers[2].ratio, 128);
  // One V4.1 decode token, one layer: the dense projections alone are 2·(1280·5120 + 32768·1280 + 512·5120 +
  // 1024·32768 + 5120·8192) FLOPs.
  BenchModel one = v41;
  one.layers = {{AttnKind::kSwa, 0}};
  const StepCost c = count_step(one, {false, 1, 1, 1024});
  const double proj = 2.0 * (1280.0 * 5120 + 32768.0 * 1280 + 512.0 * 5120 + 1024.0 * 32768 + 5120.0 * 8192);
  const double mhc = 2 * 2.0 * 24 * 4 * 5120, router = 2.0 * 384 * 5120, experts = 2.0 * 7 * 3 * 5120 * 2304;
  EXPECT_DOUBLE_EQ(c.flops, proj + mhc + router + experts + 4.0 * 32768 * 128);
}

}  // namespace
}  // namespace deepinfer::bench
