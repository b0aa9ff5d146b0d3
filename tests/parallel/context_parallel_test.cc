// Zig-zag split (coverage, order, balance of causal work), the CP row all-gather, and the exact LSE merge of
// partial attentions against the CPU sink-attention op.
#include "deepinfer/parallel/context_parallel.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "deepinfer/ops/memory.h"
#include "deepinfer/ops/ops.h"
#include "deepinfer/parallel/attention_merge.h"
#include "parallel/cp_test_group.h"

namespace deepinfer {
namespace {

TEST(ZigZag, EveryTokenOnceInOrderAndTheLastTokenOnRankZero) {
  for (int n : {1, 2, 3, 4, 8}) {
    for (int64_t T : {2 * int64_t{n}, int64_t{37}, int64_t{64}, int64_t{101}, int64_t{1000}}) {
      if (T < 2 * n) continue;
      std::vector<int> owner(T, -1);
      for (int r = 0; r < n; ++r) {
        const std::vector<int64_t> idx = zigzag_indices(T, n, r);
        ASSERT_FALSE(idx.empty()) << "T " << T << " n " << n << " rank " << r;
        EXPECT_TRUE(std::is_sorted(idx.begin(), idx.end()));
        const auto ranges = zigzag_ranges(T, n, r);
        ASSERT_EQ(ranges.size(), 2u);
        EXPECT_EQ(ranges[0].begin, r * T / (2 * n));                  // piece r
        EXPECT_EQ(ranges[1].end, (2 * n - r) * T / (2 * n));          // piece 2n-1-r
        EXPECT_LE(std::abs(ranges[0].size() - ranges[1].size()), 1);  // pieces differ by at most one token
        for (int64_t t : idx) {
          ASSERT_EQ(owner[t], -1) << "token " << t << " owned twice";
          owner[t] = r;
        }
      }
      for (int64_t t = 0; t < T; ++t) ASSERT_NE(owner[t], -1) << "token " << t << " unowned (T " << T << ")";
      EXPECT_EQ(owner[T - 1], 0);
    }
  }
}

TEST(ZigZag, BalancesCausalAttentionWork) {
  // Causal work of the query at position p is p + 1 keys. Contiguous splitting gives the last rank ~2n−1 times
  // the first rank's work; zig-zag keeps every rank within a few percent.
  for (int n : {2, 4, 8}) {
    const int64_t T = 4096 + 3;
    std::vector<double> work(n, 0.0), contiguous(n, 0.0);
    for (int r = 0; r < n; ++r) {
      for (int64_t t : zigzag_indices(T, n, r)) work[r] += static_cast<double>(t + 1);
      for (int64_t t = r * T / n; t < (r + 1) * T / n; ++t) contiguous[r] += static_cast<double>(t + 1);
    }
    const auto [lo, hi] = std::minmax_element(work.begin(), work.end());
    EXPECT_LT(*hi / *lo, 1.01) << "cp " << n;
    const auto [clo, chi] = std::minmax_element(contiguous.begin(), contiguous.end());
    EXPECT_GT(*chi / *clo, 2.0 * n - 2) << "cp " << n;  // what zig-zag avoids
  }
}

TEST(ZigZag, RejectsBadArguments) {
  EXPECT_THROW(zigzag_ranges(10, 0, 0), Error);
  EXPECT_THROW(zigzag_ranges(10, 2, 2), Error);
  EXPECT_THROW(zigzag_piece(-1, 2, 0), Error);
  EXPECT_FALSE(cp_splittable(7, 4));
  EXPECT_TRUE(cp_splittable(8, 4));
  EXPECT_THROW(CpShard(0, 4, 7, [](const void*, void*, size_t) {}), Error);  // a rank would get no token
}

TEST(CpShard, AllGatherRowsRestoresChunkOrder) {
  for (int n : {2, 3, 4}) {
    const int64_t T = 29, W = 3;
    testing::CpTestGroup group(n);
    std::vector<std::vector<float>> gathered(n);
    group.run([&](int rank) {
      CpShard shard(rank, n, T, group.all_gather(rank));
      HostTensor mine(DType::kF32, {shard.local_tokens(), W});
      for (int64_t i = 0; i < shard.local_tokens(); ++i)
        for (int64_t j = 0; j < W; ++j) mine.data<float>()[i * W + j] = 100.0f * shard.local()[i] + j;
      HostTensor all(DType::kF32, {T, W});
      shard.all_gather_rows(host_memory(), mine.view(), all.view());
      gathered[rank].assign(all.data<float>(), all.data<float>() + T * W);
      HostTensor back(DType::kF32, {shard.local_tokens(), W});
      shard.select_rows(host_memory(), all.view(), back.view());
      for (int64_t i = 0; i < mine.numel(); ++i) ASSERT_EQ(back.data<float>()[i], mine.data<float>()[i]);
    });
    for (int r = 0; r < n; ++r)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t j = 0; j < W; ++j) ASSERT_EQ(gathered[r][t * W + j], 100.0f * t + j) << "rank " << r;
  }
}

// Partial attentions of zig-zag query pieces over key blocks (each rank's pieces), merged with the LSE and the
// sink once, equal the one-shot sink attention of the CPU backend. Tolerance: the merge reassociates fp32 sums
// (and the partials accumulate the denominator in double), so outputs of magnitude ~1 agree to 2e-6.
TEST(AttentionMerge, MergedPartialsEqualFullSinkAttention) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  auto backend = make_cpu_backend(1);
  const int64_t H = 3, d = 16;
  for (int n : {2, 4}) {
    for (int64_t window : {int64_t{0}, int64_t{9}}) {
      const int64_t T = 37;
      HostTensor q(DType::kF32, {T, H, d}), kv(DType::kF32, {T, d}), pos(DType::kI64, {T}), sinks(DType::kF32, {H});
      for (int64_t i = 0; i < q.numel(); ++i) q.data<float>()[i] = nd(rng);
      for (int64_t i = 0; i < kv.numel(); ++i) kv.data<float>()[i] = nd(rng);
      for (int64_t i = 0; i < H; ++i) sinks.data<float>()[i] = nd(rng);
      for (int64_t t = 0; t < T; ++t) pos.data<int64_t>()[t] = t;
      const float scale = 0.25f;
      HostTensor ref(DType::kF32, {T, H, d});
      SinkAttentionParams p;
      p.q = q.view();
      p.q_positions = pos.view();
      p.window_kv = kv.view();
      p.kv_positions = pos.view();
      p.sinks = sinks.view();
      p.out = ref.view();
      p.window = window > 0 ? static_cast<int>(window) : static_cast<int>(T + 1);
      p.scale = scale;
      backend->sink_attention(p);

      // Key blocks: each rank's zig-zag pieces (one block per rank, as a ring step would deliver them).
      std::vector<AttentionPartial> parts;
      for (int r = 0; r < n; ++r) {
        const std::vector<int64_t> idx = zigzag_indices(T, n, r);
        const int64_t S = static_cast<int64_t>(idx.size());
        HostTensor bkv(DType::kF32, {S, d}), bpos(DType::kI64, {S});
        for (int64_t s = 0; s < S; ++s) {
          std::copy_n(kv.data<float>() + idx[s] * d, d, bkv.data<float>() + s * d);
          bpos.data<int64_t>()[s] = idx[s];
        }
        parts.push_back(partial_attention(q.view(), pos.view(), bkv.view(), bpos.view(), window, scale));
      }
      const HostTensor merged = merge_attention_partials(parts, sinks.view());
      double err = 0;
      for (int64_t i = 0; i < ref.numel(); ++i)
        err = std::max(err, std::fabs(double(merged.data<float>()[i]) - ref.data<float>()[i]));
      EXPECT_LE(err, 2e-6) << "cp " << n << " window " << window;

      // Folding the sink into every partial instead of once is measurably wrong (the check above can fail).
      std::vector<AttentionPartial> twice = std::move(parts);
      twice.push_back(AttentionPartial{HostTensor(DType::kF32, {T, H, d}), HostTensor(DType::kF32, {T, H})});
      for (int64_t i = 0; i < T * H; ++i) twice.back().lse.data<float>()[i] = sinks.data<float>()[i % H];
      const HostTensor wrong = merge_attention_partials(twice, sinks.view());
      double werr = 0;
      for (int64_t i = 0; i < ref.numel(); ++i)
        werr = std::max(werr, std::fabs(double(wrong.data<float>()[i]) - ref.data<float>()[i]));
      EXPECT_GT(werr, 1e-3);
    }
  }
}

TEST(AttentionMerge, QueriesWithNoVisibleKeyInABlockAndBadShapes) {
  // Query 0 sees only key 0; a block holding keys 1..3 contributes lse = −inf and nothing else.
  HostTensor q(DType::kF32, {1, 1, 2}), kv(DType::kF32, {3, 2}), qp(DType::kI64, {1}), kp(DType::kI64, {3});
  q.data<float>()[0] = 0.3f;
  q.data<float>()[1] = -0.7f;
  for (int i = 0; i < 6; ++i) kv.data<float>()[i] = 0.1f * (i + 1);
  for (int i = 0; i < 3; ++i) kp.data<int64_t>()[i] = i + 1;
  AttentionPartial p = partial_attention(q.view(), qp.view(), kv.view(), kp.view(), 0, 1.0f);
  EXPECT_TRUE(std::isinf(p.lse.data<float>()[0]) && p.lse.data<float>()[0] < 0);
  EXPECT_EQ(p.out.data<float>()[0], 0.0f);
  HostTensor bad(DType::kF32, {2, 2});
  EXPECT_THROW(partial_attention(bad.view(), qp.view(), kv.view(), kp.view(), 0, 1.0f), Error);
  EXPECT_THROW(merge_attention_partials({}, Tensor{}), Error);
}

}  // namespace
}  // namespace deepinfer
