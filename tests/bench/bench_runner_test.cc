// The bench plumbing on the CPU reference: the tiny slice runs every attention kind in prefill and decode,
// each row carries the counted cost of its shape and a measured time, and the table prints them.
#include "deepinfer/bench/bench_runner.h"

#include <gtest/gtest.h>

#include <cmath>

#include "deepinfer/core/error.h"

namespace deepinfer::bench {
namespace {

TEST(BenchRunner, TinySliceOnCpu) {
  std::unique_ptr<BenchTarget> t = make_cpu_target(1);
  const BenchModel m = tiny_slice();
  BenchOptions o;
  o.prompts = {12};
  o.batches = {1, 3};
  o.contexts = {20};
  o.warmup = 0;
  o.iters = 1;
  const std::vector<BenchRow> rows = run_slice(*t, m, o);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_TRUE(rows[0].shape.prefill);
  EXPECT_EQ(rows[0].shape.tokens, 12);
  EXPECT_EQ(rows[2].shape.seqs, 3);
  for (const BenchRow& r : rows) {
    EXPECT_GT(r.ms, 0.0);
    const StepCost want = count_step(m, r.shape);
    EXPECT_DOUBLE_EQ(r.cost.flops, want.flops);
    EXPECT_DOUBLE_EQ(r.cost.bytes(), want.bytes());
    EXPECT_NEAR(r.tokens_per_s(), r.shape.seqs * r.shape.tokens / (r.ms / 1000.0), 1e-6 * r.tokens_per_s());
    ASSERT_EQ(r.segment_ms.size(), static_cast<size_t>(kSegCount));
    for (int g = 0; g < kSegCount; ++g) EXPECT_GE(r.segment_ms[g], 0.0) << segment_name(g);
    // Every op group of the slice ran: the tiny slice has an indexed layer, attention and experts in each step.
    EXPECT_GT(r.segment_ms[kSegIndexer] + r.segment_ms[kSegAttention] + r.segment_ms[kSegExperts], 0.0);
  }
  EXPECT_NE(format_breakdown(rows).find("experts"), std::string::npos);
  Ceilings c;
  c.copy_bytes_per_s = 1e10;
  c.gemm_flops_per_s = 1e10;
  const std::string table = format_table(rows, c);
  EXPECT_NE(table.find("prefill"), std::string::npos);
  EXPECT_NE(table.find("decode"), std::string::npos);
  EXPECT_NE(table.find("tiny"), std::string::npos);
}

// The MLA slice (dense + MoE layers, FP8-block routed experts) in prefill and batched decode on the CPU reference.
TEST(BenchRunner, TinyMlaSliceOnCpu) {
  std::unique_ptr<BenchTarget> t = make_cpu_target(1);
  const MlaBenchModel m = tiny_mla();
  BenchOptions o;
  o.prompts = {12};
  o.batches = {1, 3};
  o.contexts = {20};
  o.warmup = 0;
  o.iters = 1;
  const std::vector<BenchRow> rows = run_mla_slice(*t, m, o);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_TRUE(rows[0].shape.prefill);
  EXPECT_EQ(rows[2].shape.seqs, 3);
  for (const BenchRow& r : rows) {
    EXPECT_GT(r.ms, 0.0);
    const StepCost want = count_mla_step(m, r.shape);
    EXPECT_DOUBLE_EQ(r.cost.flops, want.flops);
    EXPECT_DOUBLE_EQ(r.cost.bytes(), want.bytes());
    ASSERT_EQ(r.segment_ms.size(), static_cast<size_t>(kSegCount));
    EXPECT_GT(r.segment_ms[kSegAttention], 0.0);
    EXPECT_GT(r.segment_ms[kSegExperts], 0.0);
    EXPECT_EQ(r.segment_ms[kSegIndexer], 0.0);
    EXPECT_EQ(r.model, "tiny-mla");
  }
}

// bf16 and f32 weights and FP8-block routed experts through the CPU target: an expert layer's output is finite.
TEST(BenchRunner, CpuTargetFormats) {
  std::unique_ptr<BenchTarget> t = make_cpu_target(1);
  for (BenchFormat f : {BenchFormat::kFP8Block, BenchFormat::kBF16, BenchFormat::kF32, BenchFormat::kMXFP4}) {
    ExpertSpec es;
    es.count = 3;
    es.d = 64;
    es.inter = 32;
    es.routed = f;
    es.shared_inter = f == BenchFormat::kMXFP4 ? 64 : 0;
    es.block = 32;
    auto e = t->experts(es, 7);
    OwnedTensor x = t->random({2, 64}, 1, 1.0f), w = t->random({2, 2}, 2, 1.0f), y = t->random({2, 64}, 3, 1.0f);
    HostTensor idx(DType::kI32, {2, 2});
    for (int i = 0; i < 4; ++i) idx.data<int32_t>()[i] = i % 3;
    t->moe(x.view(), w.view(), idx.view(), *e, y.view(), 0.0f, false);
    double sum = 0;
    for (int64_t i = 0; i < y.numel(); ++i) sum += std::fabs(y.view().data_as<float>()[i]);
    EXPECT_TRUE(std::isfinite(sum)) << bench_format_name(f);
    EXPECT_GT(sum, 0.0) << bench_format_name(f);
    auto lw = t->weight(f, 16, 64, 32, 5);
    OwnedTensor out = t->random({2, 16}, 4, 1.0f);
    t->linear(x.view(), *lw, out.view());
  }
}

TEST(BenchRunner, CpuCeilingsArePositive) {
  std::unique_ptr<BenchTarget> t = make_cpu_target(1);
  const Ceilings c = t->measure_ceilings();
  EXPECT_GT(c.copy_bytes_per_s, 0.0);
  EXPECT_GT(c.gemm_flops_per_s, 0.0);
  EXPECT_TRUE(std::isfinite(c.gemm_flops_per_s));
}

TEST(BenchRunner, BadOptionsAreRejected) {
  std::unique_ptr<BenchTarget> t = make_cpu_target(1);
  BenchOptions o;
  o.iters = 0;
  EXPECT_THROW(run_slice(*t, tiny_slice(), o), Error);
}

}  // namespace
}  // namespace deepinfer::bench
