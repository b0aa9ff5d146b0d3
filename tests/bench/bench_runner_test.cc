// The bench plumbing on the CPU reference: the tiny slice runs every attention kind in prefill and decode,
// each row carries the counted cost of its shape and a measured time, and the table prints them.
#include "deepinfer/bench/bench_runner.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "deepinfer/core/error.h"

namespace deepinfer::bench {
namespace {

// Prefill of 12 tokens, decode at batches 1 and 3 over 20 tokens: no warm-up, one timed step each.
BenchOptions small_options() {
  BenchOptions o;
  o.prompts = {12};
  o.batches = {1, 3};
  o.contexts = {20};
  o.warmup = 0;
  o.iters = 1;
  return o;
}

TEST(BenchRunner, TinySliceOnCpu) {
  std::unique_ptr<BenchTarget> t = make_cpu_target(1);
  const BenchModel m = tiny_slice();
  const BenchOptions o = small_options();
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
    EXPECT_GT(r.segment_ms[kSegEngram], 0.0) << "the tiny slice's first layer runs Engram";
  }
  // GEMM calls per layer: the two fused projections, the grouped output projection and wo_b, whatever the shape,
  // and Engram's wkv on the first layer. Fused parts are views for one token; for more, qr and kv are copied per
  // layer, the indexer's q and head weights too on the indexed one (tiny: swa, indexed, reuse, all-seen) and Engram's
  // key and value.
  for (const BenchRow& r : rows) {
    ASSERT_TRUE(r.counts.counted);
    EXPECT_EQ(r.counts.gemm_calls, 4 * static_cast<int64_t>(m.layers.size()) + 1);
    const bool one_token = r.shape.seqs * r.shape.tokens == 1;
    EXPECT_EQ(r.counts.part_copies, one_token ? 0 : 2 * 3 + 5 + 2) << (r.shape.prefill ? "prefill" : "decode");
  }
  EXPECT_NE(format_breakdown(rows).find("experts"), std::string::npos);
  EXPECT_NE(format_breakdown(rows).find("gemm-calls"), std::string::npos);
  Ceilings c;
  c.copy_bytes_per_s = 1e10;
  c.gemm_flops_per_s = 1e10;
  const std::string table = format_table(rows, c);
  EXPECT_NE(table.find("prefill"), std::string::npos);
  EXPECT_NE(table.find("decode"), std::string::npos);
  EXPECT_NE(table.find("tiny"), std::string::npos);
}

// --kv-cache-dtype fp8 on the tiny slice (its indexer keys widened to whole 32-value blocks): the paged calls read
// record copies of the pools, and every step runs and counts the record bytes.
TEST(BenchRunner, TinySliceWithRecordCachesOnCpu) {
  std::unique_ptr<BenchTarget> t = make_cpu_target(1);
  BenchModel m = tiny_slice();
  m.index_dim = 32;
  m.kv_records = true;
  const std::vector<BenchRow> rows = run_slice(*t, m, small_options());
  ASSERT_EQ(rows.size(), 3u);
  for (const BenchRow& r : rows) {
    EXPECT_GT(r.ms, 0.0);
    EXPECT_DOUBLE_EQ(r.cost.bytes(), count_step(m, r.shape).bytes());
    EXPECT_GT(r.segment_ms[kSegIndexer] + r.segment_ms[kSegAttention], 0.0);
  }
}

// The MLA slice (dense + MoE layers, FP8-block routed experts) in prefill and batched decode on the CPU reference.
// With a bf16 decode cache (--kv-cache-dtype bf16) too: decode counts half the cache bytes, prefill the same.
TEST(BenchRunner, TinyMlaSliceOnCpu) {
  std::unique_ptr<BenchTarget> t = make_cpu_target(1);
  for (int kv_bytes : {4, 2}) {
    MlaBenchModel m = tiny_mla();
    m.kv_value_bytes = kv_bytes;
    const BenchOptions o = small_options();
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
      MlaBenchModel f32 = m;
      f32.kv_value_bytes = 4;
      const StepCost f32_cost = count_mla_step(f32, r.shape);
      EXPECT_DOUBLE_EQ(r.cost.cache_bytes,
                       r.shape.prefill ? f32_cost.cache_bytes : f32_cost.cache_bytes * kv_bytes / 4);
    }
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

// --activation-quant mxfp8 on the CPU target: a linear over an FP8 / MXFP4 weight equals the same linear over the
// fake_quant-rounded input (and differs from the unrounded one); over bf16 / f32 weights nothing is rounded.
TEST(BenchRunner, ActivationQuantRoundsTheBlockFormatGemmsOnly) {
  std::unique_ptr<BenchTarget> t = make_cpu_target(1);
  const int64_t n = 24, k = 64;
  const OwnedTensor x = t->random({3, k}, 1, 4.0f);
  HostTensor xq(DType::kF32, {3, k});
  std::memcpy(xq.data<float>(), x.view().data(), sizeof(float) * 3 * k);
  t->backend().fake_quant({xq.view(), FakeQuantKind::kFP8E4M3Ue8m0Block32});
  for (BenchFormat f : {BenchFormat::kFP8Block, BenchFormat::kMXFP4, BenchFormat::kBF16, BenchFormat::kF32}) {
    auto w = t->weight(f, n, k, 32, 5);
    const OwnedTensor plain = t->random({3, n}, 2, 1.0f), rounded_in = t->random({3, n}, 3, 1.0f),
                      got = t->random({3, n}, 4, 1.0f);
    t->set_activation_quant(ActQuant::kNone);
    t->linear(x.view(), *w, plain.view());
    t->linear(xq.view(), *w, rounded_in.view());
    t->set_activation_quant(ActQuant::kMxfp8);
    t->linear(x.view(), *w, got.view());
    const bool block = f == BenchFormat::kFP8Block || f == BenchFormat::kMXFP4;
    const size_t bytes = sizeof(float) * 3 * n;
    EXPECT_EQ(std::memcmp(got.view().data(), (block ? rounded_in : plain).view().data(), bytes), 0)
        << bench_format_name(f);
    EXPECT_NE(std::memcmp(plain.view().data(), rounded_in.view().data(), bytes), 0) << bench_format_name(f);
  }
}

// The grouped linear of the CPU target against one linear() per group on the same weights: bitwise equal, for
// every weight format and a few row counts; unplanned row counts and bad shapes are rejected.
TEST(BenchRunner, GroupedLinearEqualsPerGroupLinear) {
  std::unique_ptr<BenchTarget> t = make_cpu_target(1);
  const int64_t groups = 3, n = 40, k = 64;
  for (BenchFormat f : {BenchFormat::kFP8Block, BenchFormat::kMXFP4, BenchFormat::kBF16, BenchFormat::kF32}) {
    auto w = t->grouped_weight(f, groups, n, k, 32, 11);
    ASSERT_EQ(w->groups.size(), static_cast<size_t>(groups));
    for (int64_t r : {1, 2, 5}) {
      t->plan_grouped(*w, r);
      const OwnedTensor in = t->random({groups * r, k}, 100 + r, 1.0f), out = t->random({groups * r, n}, 200 + r, 1.0f);
      t->grouped_linear(in.view(), *w, out.view());
      double sum = 0;
      for (int64_t g = 0; g < groups; ++g) {
        const OwnedTensor want = t->random({r, n}, 300 + g, 1.0f);
        t->linear(in.view().slice(g * r, (g + 1) * r), *w->groups[g], want.view());
        const float* got = out.view().data_as<float>() + g * r * n;
        for (int64_t i = 0; i < r * n; ++i) {
          ASSERT_EQ(std::memcmp(&got[i], &want.view().data_as<float>()[i], sizeof(float)), 0)
              << bench_format_name(f) << " r=" << r << " group " << g << " element " << i;
          sum += std::fabs(got[i]);
        }
      }
      EXPECT_GT(sum, 0.0) << bench_format_name(f);
    }
    // Groups differ (each its own weight): the same input rows through two groups give different outputs.
    const OwnedTensor x = t->random({1, k}, 7, 1.0f), y0 = t->random({1, n}, 8, 1.0f), y1 = t->random({1, n}, 9, 1.0f);
    t->linear(x.view(), *w->groups[0], y0.view());
    t->linear(x.view(), *w->groups[1], y1.view());
    EXPECT_NE(std::memcmp(y0.view().data(), y1.view().data(), n * sizeof(float)), 0) << bench_format_name(f);
    const OwnedTensor in4 = t->random({groups * 4, k}, 1, 1.0f), out4 = t->random({groups * 4, n}, 2, 1.0f);
    EXPECT_THROW(t->grouped_linear(in4.view(), *w, out4.view()), Error);  // 4 rows per group: not planned
    const OwnedTensor in_odd = t->random({groups * 2 + 1, k}, 1, 1.0f),
                      out_odd = t->random({groups * 2 + 1, n}, 2, 1.0f);
    EXPECT_THROW(t->grouped_linear(in_odd.view(), *w, out_odd.view()), Error);  // not a multiple of the groups
  }
  EXPECT_THROW(t->grouped_weight(BenchFormat::kFP8Block, 0, 16, 64, 32, 1), Error);
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
