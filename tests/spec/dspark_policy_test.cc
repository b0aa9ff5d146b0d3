// DSpark's confidence-scheduled verification lengths: threshold on the prefix-survival product per request,
// greedy budget allocation by expected accepted tokens across the batch.
#include "deepinfer/spec/dspark_policy.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <numeric>

#include "deepinfer/core/error.h"

namespace deepinfer {
namespace {

std::vector<int> lengths(const std::vector<std::vector<float>>& c, const DsparkPolicyParams& p) {
  std::vector<std::span<const float>> spans(c.begin(), c.end());
  return dspark_verify_lengths(spans, p);
}

TEST(DsparkPolicy, ThresholdCutsThePrefixSurvival) {
  DsparkPolicyParams p;
  p.threshold = 0.5;
  p.min_tokens = 0;
  // Survival: 0.9, 0.72, 0.504, 0.3528 -> 3 tokens; 0.4 -> 0; 1,1,1 -> all.
  EXPECT_EQ(lengths({{0.9f, 0.8f, 0.7f, 0.7f}, {0.4f, 1.0f}, {1.0f, 1.0f, 1.0f}}, p), (std::vector<int>{3, 0, 3}));
  p.min_tokens = 1;  // the first draft is verified even below the threshold
  EXPECT_EQ(lengths({{0.4f, 1.0f}}, p), (std::vector<int>{1}));
  p.max_draft_tokens = 2;
  EXPECT_EQ(lengths({{0.9f, 0.8f, 0.7f, 0.7f}}, p), (std::vector<int>{2}));
  p.threshold = 0.0;
  p.max_draft_tokens = -1;
  EXPECT_EQ(lengths({{0.0f, 0.5f}, {}}, p), (std::vector<int>{2, 0}));
}

// The greedy allocation maximises the expected accepted tokens: compare with brute force over every split.
TEST(DsparkPolicy, BudgetGoesToTheLargestExpectedGain) {
  const std::vector<std::vector<float>> c = {{0.95f, 0.9f, 0.3f, 0.9f}, {0.6f, 0.99f, 0.99f}, {0.8f, 0.8f, 0.8f, 0.8f}};
  for (int64_t budget = 0; budget <= 11; ++budget) {
    DsparkPolicyParams p;
    p.threshold = 0.0;
    p.min_tokens = 0;
    p.token_budget = budget;
    const std::vector<int> got = lengths(c, p);
    int64_t used = std::accumulate(got.begin(), got.end(), int64_t{0});
    EXPECT_EQ(used, std::min<int64_t>(budget, 11)) << budget;
    double got_value = 0;
    for (size_t r = 0; r < c.size(); ++r) got_value += dspark_expected_accepted(c[r], got[r]);
    double best = 0;
    for (int a = 0; a <= 4; ++a)
      for (int b = 0; b <= 3; ++b)
        for (int d = 0; d <= 4; ++d)
          if (a + b + d <= budget)
            best = std::max(best, dspark_expected_accepted(c[0], a) + dspark_expected_accepted(c[1], b) +
                                      dspark_expected_accepted(c[2], d));
    EXPECT_NEAR(got_value, best, 1e-9) << "budget " << budget;
  }
  // Budget 1: the single best marginal token is request 0's first (0.95).
  DsparkPolicyParams p;
  p.min_tokens = 0;
  p.threshold = 0.0;
  p.token_budget = 1;
  EXPECT_EQ(lengths(c, p), (std::vector<int>{1, 0, 0}));
}

TEST(DsparkPolicy, ExpectedAcceptedAndBadInput) {
  const std::vector<float> c = {0.5f, 0.5f};
  EXPECT_DOUBLE_EQ(dspark_expected_accepted(c, 0), 0.0);
  EXPECT_DOUBLE_EQ(dspark_expected_accepted(c, 2), 0.5 + 0.25);
  EXPECT_THROW(dspark_expected_accepted(c, 3), Error);
  DsparkPolicyParams p;
  p.threshold = 1.5;
  EXPECT_THROW(lengths({{0.5f}}, p), Error);
  p.threshold = 0.5;
  EXPECT_THROW(lengths({{1.5f}}, p), Error);
}

}  // namespace
}  // namespace deepinfer

namespace deepinfer::spec {
namespace {

TEST(DsparkBudgetPolicy, ChoosesWithinTheStepBudget) {
  DsparkBudgetPolicy policy(0.5, 0);
  const std::vector<float> a = {0.9f, 0.9f, 0.2f}, b = {0.95f, 0.6f, 0.9f};
  // Candidate 2 drafted without confidences (verify all, survival 1); candidate 1's confidences cover more
  // positions than it drafted (only the drafted count matters).
  const std::vector<DraftCandidate> cands = {{3, a}, {2, b}, {2, {}}};
  std::vector<int> out(3);
  // Survival a: 0.9, 0.81, 0.162 (cut); b: 0.95, 0.57; c: 1, 1.
  policy.choose(cands, 100, out);
  EXPECT_EQ(out, (std::vector<int>{2, 2, 2}));
  policy.choose(cands, 3, out);  // gains 1, 1 (c), then 0.95 (b) before 0.9 (a)
  EXPECT_EQ(out, (std::vector<int>{0, 1, 2}));
  policy.choose(cands, 0, out);
  EXPECT_EQ(out, (std::vector<int>{0, 0, 0}));
  EXPECT_THROW(DsparkBudgetPolicy(-0.1), Error);
}

}  // namespace
}  // namespace deepinfer::spec
