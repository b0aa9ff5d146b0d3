#include "deepinfer/sampling/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

namespace deepinfer {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

std::vector<float> random_logits(int vocab, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> n(0.0f, 1.5f);
  std::vector<float> l(vocab);
  for (float& v : l) v = n(g);
  return l;
}

TEST(SamplerGreedy, ArgmaxAfterPenaltiesLowestIdOnTies) {
  Sampler s;
  SamplingParams p;
  p.temperature = 0;
  const std::vector<float> l = {1, 5, 5, 2};
  EXPECT_EQ(s.sample(l, p, {}, {}, 0).token, 1);
  p.frequency_penalty = 1.0f;
  const std::vector<TokenId> out = {1};
  EXPECT_EQ(s.sample(l, p, SamplingContext{{}, out, {}, {}}, {}, 1).token, 2);
  // Greedy ignores the RNG and the filters: same token for every key and position.
  p.top_k = 3;
  for (uint64_t seed = 0; seed < 5; ++seed)
    EXPECT_EQ(s.sample(l, p, SamplingContext{{}, out, {}, {}}, {seed, 1}, 7).token, 2);
}

// Sampled frequencies match the processed softmax: each token within 5 standard errors, and filtered tokens
// never drawn. Positions vary, as they do in generation; the key is fixed.
void check_distribution(const SamplingParams& p, const std::vector<float>& logits, int n = 40000) {
  Sampler s;
  const auto expected = softmax(s.process(logits, p, {}));
  std::vector<int> counts(logits.size(), 0);
  for (int i = 0; i < n; ++i) ++counts[s.sample(logits, p, {}, {123, 4}, i).token];
  for (size_t t = 0; t < logits.size(); ++t) {
    const double f = static_cast<double>(counts[t]) / n;
    const double se = std::sqrt(std::max(expected[t] * (1 - expected[t]), 1e-12) / n);
    if (expected[t] == 0) {
      EXPECT_EQ(counts[t], 0) << "token " << t << " was filtered but sampled";
    } else {
      EXPECT_NEAR(f, expected[t], 5 * se + 1e-9) << "token " << t;
    }
  }
}

TEST(SamplerDistribution, PlainSoftmax) { check_distribution(SamplingParams{}, random_logits(12, 1)); }

TEST(SamplerDistribution, TemperatureTopKTopPMinP) {
  SamplingParams p;
  p.temperature = 0.7f;
  p.top_k = 8;
  p.top_p = 0.9f;
  p.min_p = 0.02f;
  check_distribution(p, random_logits(16, 2));
}

TEST(SamplerDistribution, HotTemperatureWithPenalties) {
  SamplingParams p;
  p.temperature = 1.8f;
  p.presence_penalty = 1.0f;
  p.repetition_penalty = 1.3f;
  Sampler s;
  const auto logits = random_logits(10, 3);
  const std::vector<TokenId> prompt = {0, 1}, output = {2, 2};
  const SamplingContext ctx{prompt, output, {}, {}};
  const auto expected = softmax(s.process(logits, p, ctx));
  constexpr int kN = 40000;
  std::vector<int> counts(logits.size(), 0);
  for (int i = 0; i < kN; ++i) ++counts[s.sample(logits, p, ctx, {5, 5}, i).token];
  for (size_t t = 0; t < logits.size(); ++t)
    EXPECT_NEAR(static_cast<double>(counts[t]) / kN, expected[t], 5 * std::sqrt(expected[t] * (1 - expected[t]) / kN));
}

// logprobs = 0 takes a shortcut (no vocabulary-sized output): the same value as log_softmax, bit for bit, also with
// -inf entries; top entries sorted, the chosen token's value equal to its log_softmax entry.
TEST(SamplerLogprobs, ChosenTokenShortcutEqualsLogSoftmax) {
  Sampler s;
  for (uint64_t seed = 0; seed < 20; ++seed) {
    std::vector<float> logits = random_logits(5000, static_cast<uint32_t>(seed));
    for (size_t i = seed; i < logits.size(); i += 97) logits[i] = -std::numeric_limits<float>::infinity();
    const std::vector<float> lp = log_softmax(logits);
    for (int k : {0, 3}) {
      SamplingParams p;
      p.seed = seed;
      p.logprobs = k;
      const SampleResult r = s.sample(logits, p, SamplingContext{}, RngKey{seed, 1}, 4);
      EXPECT_EQ(r.logprob, lp[r.token]) << seed << " k=" << k;
      ASSERT_EQ(r.top_logprobs.size(), static_cast<size_t>(k));
      for (int j = 0; j < k; ++j) EXPECT_EQ(r.top_logprobs[j].logprob, lp[r.top_logprobs[j].token]);
    }
  }
}

TEST(SamplerDeterminism, SameKeyAndPositionSameToken) {
  Sampler s;
  SamplingParams p;
  p.temperature = 1.0f;
  const auto logits = random_logits(1000, 4);
  for (int pos = 0; pos < 50; ++pos)
    EXPECT_EQ(s.sample(logits, p, {}, {9, 1}, pos).token, s.sample(logits, p, {}, {9, 1}, pos).token);
  // Different streams give different draws somewhere.
  int differ = 0;
  for (int pos = 0; pos < 50; ++pos)
    differ += s.sample(logits, p, {}, {9, 1}, pos).token != s.sample(logits, p, {}, {9, 2}, pos).token;
  EXPECT_GT(differ, 10);
}

TEST(SamplerLogprobs, RawLogprobsOfChosenAndTopN) {
  Sampler s;
  SamplingParams p;
  p.temperature = 0.0f;
  p.logprobs = 2;
  p.presence_penalty = 2.0f;  // changes the choice but not the reported (raw) logprobs
  const std::vector<float> l = {0.0f, std::log(3.0f), std::log(2.0f), std::log(2.0f)};  // probs 1/8, 3/8, 2/8, 2/8
  const std::vector<TokenId> out = {1};
  const SampleResult r = s.sample(l, p, SamplingContext{{}, out, {}, {}}, {}, 3);
  EXPECT_EQ(r.token, 2);  // 1 is penalized below 2 (ties 2/3 broken to the lower id)
  EXPECT_NEAR(r.logprob, std::log(0.25), 1e-6);
  ASSERT_EQ(r.top_logprobs.size(), 2u);
  EXPECT_EQ(r.top_logprobs[0].token, 1);
  EXPECT_NEAR(r.top_logprobs[0].logprob, std::log(0.375), 1e-6);
  EXPECT_EQ(r.top_logprobs[1].token, 2);
  p.logprobs.reset();
  EXPECT_TRUE(s.sample(l, p, {}, {}, 3).top_logprobs.empty());
}

TEST(SamplerEdgeCases, MaskedTokensNeverSampledAndSampleFromLogitsWalksIds) {
  const std::vector<float> l = {kNegInf, 0.0f, kNegInf, 0.0f};
  EXPECT_EQ(sample_from_logits(l, 0.0), 1);
  EXPECT_EQ(sample_from_logits(l, 0.49), 1);
  EXPECT_EQ(sample_from_logits(l, 0.51), 3);
  EXPECT_EQ(sample_from_logits(l, 0.999999), 3);
  const std::vector<float> none = {kNegInf, kNegInf};
  EXPECT_EQ(argmax(none), -1);
  Sampler s;
  EXPECT_THROW(s.sample(none, SamplingParams{}, {}, {}, 0), std::exception);
}

}  // namespace
}  // namespace deepinfer
