// Compressor pooling, indexer scores, candidate blocks and top-k masks against naive references.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "op_test_util.h"

namespace deepinfer {
namespace {

TEST(CompressPoolOp, SoftmaxOverSlotsWithMaskedSlots) {
  auto backend = make_cpu_backend(1);
  const int64_t G = 3, S = 8, C = 20;
  HostTensor kv = testing::random_tensor({G, S, C}, 1), gate = testing::random_tensor({G, S, C}, 2, 0.1f, 3.f);
  for (int64_t s = 0; s < 4; ++s)  // group 0's first half has no predecessor window
    for (int64_t c = 0; c < C; ++c) gate.data<float>()[s * C + c] = -INFINITY;
  HostTensor out(DType::kF32, {G, C});
  backend->compress_pool({kv.view(), gate.view(), out.view()});
  std::vector<double> ref(G * C);
  for (int64_t g = 0; g < G; ++g)
    for (int64_t c = 0; c < C; ++c) {
      double den = 0, num = 0;
      for (int64_t s = 0; s < S; ++s) {
        const double e = std::exp(double(gate.data<float>()[(g * S + s) * C + c]));
        den += e;
        num += e * kv.data<float>()[(g * S + s) * C + c];
      }
      ref[g * C + c] = num / den;
    }
  EXPECT_LT(testing::max_rel_error(out.data<float>(), ref), 1e-6);
}

TEST(IndexerScoresOp, WeightedReluScoresWithCausalVisibility) {
  auto backend = make_cpu_backend(2);
  const int64_t T = 6, IH = 4, Id = 32, N = 9;
  const int ratio = 2;
  HostTensor q = testing::random_tensor({T, IH, Id}, 1), keys = testing::random_tensor({N, Id}, 2);
  HostTensor w = testing::random_tensor({T, IH}, 3), pos = testing::positions_tensor({0, 3, 4, 9, 12, 17});
  HostTensor out(DType::kF32, {T, N});
  IndexerScoreParams p{q.view(), keys.view(), w.view(), pos.view(), out.view(), ratio, 0.25f, 0.5f};
  backend->indexer_scores(p);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = 0; n < N; ++n) {
      const float got = out.data<float>()[t * N + n];
      if (n >= (pos.data<int64_t>()[t] + 1) / ratio) {
        EXPECT_EQ(got, -INFINITY);
        continue;
      }
      double ref = 0;
      for (int64_t h = 0; h < IH; ++h) {
        double d = 0;
        for (int64_t i = 0; i < Id; ++i)
          d += double(q.data<float>()[(t * IH + h) * Id + i]) * keys.data<float>()[n * Id + i];
        ref += std::max(d, 0.0) * 0.25 * w.data<float>()[t * IH + h] * 0.5;
      }
      EXPECT_NEAR(got, ref, 1e-5) << t << "," << n;
    }
}

TEST(TopKMaskOp, SelectsLargestDropsInfAndRespectsAllowed) {
  auto backend = make_cpu_backend(1);
  const int64_t T = 4, N = 10;
  HostTensor s = testing::random_tensor({T, N}, 5);
  for (int64_t n = 6; n < N; ++n) s.data<float>()[N + n] = -INFINITY;  // row 1: only 6 finite entries
  HostTensor allowed(DType::kU8, {T, N}), out(DType::kU8, {T, N});
  for (int64_t i = 0; i < T * N; ++i) allowed.data<uint8_t>()[i] = (i % 3) != 0;
  for (bool use_allowed : {false, true}) {
    backend->topk_mask({s.view(), use_allowed ? allowed.view() : Tensor{}, out.view(), 8});
    for (int64_t t = 0; t < T; ++t) {
      std::vector<std::pair<float, int64_t>> cand;
      for (int64_t n = 0; n < N; ++n) {
        const float v = s.data<float>()[t * N + n];
        if (v != -INFINITY && (!use_allowed || allowed.data<uint8_t>()[t * N + n])) cand.push_back({v, n});
      }
      std::sort(cand.begin(), cand.end(), [](auto a, auto b) { return a.first > b.first; });
      std::vector<uint8_t> want(N, 0);
      for (size_t i = 0; i < std::min<size_t>(8, cand.size()); ++i) want[cand[i].second] = 1;
      for (int64_t n = 0; n < N; ++n) EXPECT_EQ(out.data<uint8_t>()[t * N + n], want[n]) << t << "," << n;
    }
  }
}

TEST(CandidateBlocksOp, KeepsTopBlocksAndTheNewestBlock) {
  auto backend = make_cpu_backend(1);
  const int64_t T = 2, N = 30, bs = 4;
  HostTensor s = testing::random_tensor({T, N}, 6), pos = testing::positions_tensor({20, 29});
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = pos.data<int64_t>()[t] + 1; n < N; ++n) s.data<float>()[t * N + n] = -INFINITY;  // ratio 1
  HostTensor keep(DType::kU8, {T, N});
  backend->candidate_blocks({s.view(), pos.view(), keep.view(), 1, 2, bs});
  for (int64_t t = 0; t < T; ++t) {
    const int64_t blocks = (N + bs - 1) / bs, newest = pos.data<int64_t>()[t] / bs;
    std::vector<std::pair<float, int64_t>> score;
    for (int64_t b = 0; b < blocks; ++b) {
      float mx = -INFINITY;
      for (int64_t n = b * bs; n < std::min(N, (b + 1) * bs); ++n) mx = std::max(mx, s.data<float>()[t * N + n]);
      score.push_back({b == newest ? INFINITY : mx, b});
    }
    std::sort(score.begin(), score.end(), [](auto a, auto b) { return a.first > b.first; });
    std::vector<uint8_t> want(N, 0);
    for (int i = 0; i < 2; ++i)
      for (int64_t n = score[i].second * bs; n < std::min(N, (score[i].second + 1) * bs); ++n) want[n] = 1;
    for (int64_t n = 0; n < N; ++n) EXPECT_EQ(keep.data<uint8_t>()[t * N + n], want[n]) << t << "," << n;
  }
}

}  // namespace
}  // namespace deepinfer
