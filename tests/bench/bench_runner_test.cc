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
