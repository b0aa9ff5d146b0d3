// FLOP/byte counting of the MLA bench models against values worked out by hand for tiny_mla (dims in
// bench_mla_model.cc: D=64, H=4, q_lora=32, r=32, dr=8, dn=dv=16, 8 experts top-2 of I=32 + 1 shared, dense
// I=64, 1 dense + 2 MoE layers, FP8 32×32 blocks), and the real dimensions of the V3 slice and V2-Lite.
#include "deepinfer/bench/bench_mla_model.h"

#include <gtest/gtest.h>

#include "deepinfer/core/error.h"

namespace deepinfer::bench {
namespace {

TEST(BenchMlaModel, FormatBytes) {
  EXPECT_DOUBLE_EQ(format_bytes(BenchFormat::kFP8Block, 33, 64, 32), 33 * 64 + 2 * 2);
  EXPECT_DOUBLE_EQ(format_bytes(BenchFormat::kMXFP4, 32, 64, 128), 1024 + 64);
  EXPECT_DOUBLE_EQ(format_bytes(BenchFormat::kBF16, 3, 5, 128), 30);
  EXPECT_DOUBLE_EQ(format_bytes(BenchFormat::kF32, 3, 5, 128), 60);
}

TEST(BenchMlaModel, TinyDecodeStepByHand) {
  const MlaBenchModel m = tiny_mla();
  const StepCost c = count_mla_step(m, {false, 1, 1, 16});
  // Per layer: projections 2·(32·64 + 96·32 + 40·64 + 64·64) = 23552; attention at position 15 (16 keys) in the
  // absorbed form, 2·(4·32·32 + 16·4·72) = 17408 (naive would be 2·(16·4·32·32 + 16·4·40)).
  const double attn_layer = 23552 + 17408;
  // Dense SwiGLU 2·3·64·64; MoE layers: router 2·8·64, experts 2·(2+1)·3·64·32.
  EXPECT_DOUBLE_EQ(c.flops, 3 * attn_layer + 24576 + 2 * (1024 + 36864));
  // Weights: projections 2050 + 3075 + 2564 + 4100, kv_b f32 4·128·32; dense 3·4100; MoE router 4·8·64, two
  // distinct experts 2·3·2050, the shared one 3·2050.
  EXPECT_DOUBLE_EQ(c.weight_bytes, 3 * (11789 + 16384) + 12300 + 2 * (2048 + 12300 + 6150));
  // Cache rows: 16 of 40 f32 per layer.
  EXPECT_DOUBLE_EQ(c.cache_bytes, 3 * 4.0 * 16 * 40);
  EXPECT_DOUBLE_EQ(c.attention_bytes, c.cache_bytes);
}

TEST(BenchMlaModel, PrefillTakesTheCheaperForm) {
  const MlaBenchModel m = tiny_mla();
  // 4 queries at positions 0..3 see 1+2+3+4 = 10 rows: naive 4·4·32·32 + 10·4·40 = 17984 beats absorbed
  // 4·4·32·32 + 10·4·72 = 19264.
  EXPECT_DOUBLE_EQ(mla_naive_macs(m, 1, 4, 4, 10), 17984);
  EXPECT_DOUBLE_EQ(mla_absorbed_macs(m, 4, 10), 19264);
  const StepCost c = count_mla_step(m, {true, 1, 4, 4});
  const double per_token = 23552 / 1.0;  // projections per token (see above)
  const double experts = 4 * (1024 + 36864);
  EXPECT_DOUBLE_EQ(c.flops, 3 * (4 * per_token + 2 * 17984) + 4 * 24576 + 2 * experts);
  // 4 tokens touch 8·(1 − (3/4)^4) experts on average.
  const double distinct = 8 * (1 - 0.75 * 0.75 * 0.75 * 0.75);
  EXPECT_DOUBLE_EQ(c.weight_bytes, 3 * (11789 + 16384) + 12300 + 2 * (2048 + distinct * 6150 + 6150));
  EXPECT_DOUBLE_EQ(c.cache_bytes, 3 * 4.0 * 4 * 40);
}

TEST(BenchMlaModel, BatchedDecodeReadsEverySequence) {
  const MlaBenchModel m = tiny_mla();
  const StepCost one = count_mla_step(m, {false, 1, 1, 16}), four = count_mla_step(m, {false, 4, 1, 16});
  EXPECT_DOUBLE_EQ(four.cache_bytes, 4 * one.cache_bytes);
  EXPECT_GT(four.weight_bytes, one.weight_bytes);  // more distinct experts
  EXPECT_THROW(count_mla_step(m, {false, 1, 2, 1}), Error);
}

TEST(BenchMlaModel, RealDimensions) {
  const MlaBenchModel v3 = v3_slice(2);
  EXPECT_EQ(v3.layers(), 3);
  EXPECT_EQ(v3.hidden, 7168);
  EXPECT_EQ(v3.heads * (v3.nope_dim + v3.rope_dim), 24576);  // q_b_proj rows
  EXPECT_EQ(v3.row(), 576);                                  // 1152 B per token and layer in bf16
  EXPECT_EQ(v3.experts, 256);
  EXPECT_EQ(v3.topk, 8);
  EXPECT_EQ(v3.ffn_format, BenchFormat::kFP8Block);
  EXPECT_THROW(v3_slice(0), Error);
  const MlaBenchModel v2 = v2_lite_model();
  EXPECT_EQ(v2.layers(), 27);
  EXPECT_EQ(v2.q_lora, 0);
  EXPECT_EQ(v2.shared_experts * v2.moe_inter, 2816);
  EXPECT_EQ(v2.dense_inter, 10944);
  EXPECT_EQ(v2.proj_format, BenchFormat::kBF16);
  EXPECT_EQ(v2.ffn_format, BenchFormat::kBF16);
  EXPECT_EQ(v2_lite_model(BenchFormat::kF32).ffn_format, BenchFormat::kF32);
  EXPECT_THROW(v2_lite_model(BenchFormat::kMXFP4), Error);
  // V3 decode at batch 1: the 8 routed + 1 shared expert of each MoE layer dominate the FP8 bytes.
  const StepCost c = count_mla_step(v3, {false, 1, 1, 1024});
  const double expert = 3 * fp8_block_bytes(2048, 7168, 128);
  EXPECT_GT(c.weight_bytes, 2 * 9 * expert);
  EXPECT_LT(c.weight_bytes, 2 * 9 * expert + 3 * 400e6);
}

}  // namespace
}  // namespace deepinfer::bench
