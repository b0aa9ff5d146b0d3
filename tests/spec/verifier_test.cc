#include "deepinfer/spec/verifier.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "deepinfer/sampling/sampler.h"
#include "deepinfer/spec/policy.h"

namespace deepinfer::spec {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// A toy "target": the logits at a position depend on the previous token, so the verifier's history matters.
std::vector<float> toy_logits(int vocab, TokenId prev) {
  std::vector<float> l(vocab);
  for (int t = 0; t < vocab; ++t) l[t] = std::sin(1.7f * static_cast<float>(t) + 0.9f * static_cast<float>(prev));
  return l;
}

StopFn never_stop() {
  return [](int, TokenId) { return false; };
}

TEST(SpecVerifierGreedy, AcceptsTheMatchingPrefixThenCorrects) {
  const int V = 7;
  // Greedy chain from token 3 under toy_logits: the draft matches the first two, then deviates.
  std::vector<TokenId> chain = {3};
  for (int i = 0; i < 4; ++i) chain.push_back(argmax(toy_logits(V, chain.back())));
  Draft d;
  d.tokens = {chain[1], chain[2], static_cast<TokenId>((chain[3] + 1) % V)};
  std::vector<TokenId> hist = {chain[0]};
  auto row = [&](int i) { return toy_logits(V, i == 0 ? chain[0] : d.tokens[i - 1]); };
  VerifyResult r = verify_draft(d, 3, true, row, never_stop(), {}, 10);
  EXPECT_EQ(r.num_accepted, 2);
  EXPECT_EQ(r.tokens, (std::vector<TokenId>{chain[1], chain[2], chain[3]}));
  // All accepted: the bonus is the next greedy token.
  d.tokens = {chain[1], chain[2], chain[3]};
  r = verify_draft(d, 3, true, row, never_stop(), {}, 10);
  EXPECT_EQ(r.num_accepted, 3);
  EXPECT_EQ(r.tokens, (std::vector<TokenId>{chain[1], chain[2], chain[3], chain[4]}));
  // Verifying fewer than drafted ignores the rest; n = 0 is a plain greedy step.
  r = verify_draft(d, 0, true, row, never_stop(), {}, 10);
  EXPECT_EQ(r.num_accepted, 0);
  EXPECT_EQ(r.tokens, (std::vector<TokenId>{chain[1]}));
}

TEST(SpecVerifierGreedy, StopsInsideTheDraftAndNeverProcessesLaterRows) {
  const int V = 7;
  std::vector<TokenId> chain = {2};
  for (int i = 0; i < 4; ++i) chain.push_back(argmax(toy_logits(V, chain.back())));
  Draft d;
  d.tokens = {chain[1], chain[2], chain[3]};
  int rows_seen = 0;
  auto row = [&](int i) {
    ++rows_seen;
    return toy_logits(V, i == 0 ? chain[0] : d.tokens[i - 1]);
  };
  auto stop = [&](int i, TokenId) { return i == 1; };  // e.g. the second token is EOS
  const VerifyResult r = verify_draft(d, 3, true, row, stop, {}, 0);
  EXPECT_EQ(r.num_accepted, 2);
  EXPECT_EQ(r.tokens, (std::vector<TokenId>{chain[1], chain[2]}));
  EXPECT_EQ(rows_seen, 2);
}

TEST(SpecVerifierGreedy, MaskedDraftTokenIsRejected) {
  // A grammar mask (-inf) on the drafted token: greedy never emits it even when its raw logit is the largest.
  Draft d;
  d.tokens = {1};
  auto row = [&](int) { return std::vector<float>{0.5f, kNegInf, 0.2f}; };
  const VerifyResult r = verify_draft(d, 1, true, row, never_stop(), {}, 0);
  EXPECT_EQ(r.num_accepted, 0);
  EXPECT_EQ(r.tokens, (std::vector<TokenId>{0}));
  // Sampling: p(d) = 0 is never accepted.
  for (uint64_t s = 0; s < 200; ++s) {
    const VerifyResult rs = verify_draft(d, 1, false, row, never_stop(), {s, 0}, 0);
    EXPECT_EQ(rs.num_accepted, 0);
    EXPECT_NE(rs.tokens[0], 1);
  }
}

// Lossless sampling: the joint distribution of the first two emitted tokens equals the target's, p(a)·p(b|a),
// whether drafts are point masses (greedy-style drafter) or sampled from a different q. Pearson chi-square over
// the 25 cells (24 degrees of freedom) against the exact probabilities, N = 40000 seeds; 73 is the 1 - 1e-6
// quantile (Wilson–Hilferty), so a correct verifier fails for a given seed set with probability ~1e-6 (the seeds
// are fixed, so the test is deterministic). A verifier that skipped the residual correction (emits the target
// sample without subtracting q) gives chi-square in the thousands here.
double chi_square_two_tokens(bool point_mass_draft, double temperature) {
  const int V = 5, N = 40000;
  const TokenId prev = 2;
  Sampler sampler;
  SamplingParams params;
  params.temperature = static_cast<float>(temperature);
  auto processed = [&](TokenId p) { return sampler.process(toy_logits(V, p), params, {}); };
  auto probs = [&](TokenId p) {
    const std::vector<float> r = processed(p);
    std::vector<double> out(V);
    double tot = 0;
    for (int t = 0; t < V; ++t) tot += (out[t] = std::exp(static_cast<double>(r[t])));
    for (double& v : out) v /= tot;
    return out;
  };
  // The drafter's own distribution q: deliberately different from p.
  auto q_of = [&](TokenId p) {
    std::vector<float> q(V);
    float tot = 0;
    for (int t = 0; t < V; ++t) tot += (q[t] = 1.0f + static_cast<float>((t * 3 + p) % V));
    for (float& v : q) v /= tot;
    return q;
  };
  std::vector<double> expected(V * V);
  const std::vector<double> p0 = probs(prev);
  for (int a = 0; a < V; ++a) {
    const std::vector<double> p1 = probs(a);
    for (int b = 0; b < V; ++b) expected[a * V + b] = p0[a] * p1[b] * N;
  }
  std::vector<int> counts(V * V, 0);
  std::mt19937_64 g(1234);
  for (int s = 0; s < N; ++s) {
    const RngKey key{static_cast<uint64_t>(s), 7};
    Draft d;
    TokenId last = prev;
    for (int i = 0; i < 2; ++i) {
      std::vector<float> q = q_of(last);
      TokenId t;
      if (point_mass_draft) {
        t = static_cast<TokenId>((last + 1) % V);
      } else {
        std::discrete_distribution<int> dist(q.begin(), q.end());
        t = dist(g);
        d.probs.push_back(q);
      }
      d.tokens.push_back(t);
      last = t;
    }
    std::vector<TokenId> emitted;
    auto row = [&](int i) { return processed(i == 0 ? prev : d.tokens[i - 1]); };
    VerifyResult r = verify_draft(d, 2, false, row, never_stop(), key, 100);
    TokenId a = r.tokens[0], b;
    if (r.tokens.size() >= 2) {
      b = r.tokens[1];
    } else {
      // Rejected at the first draft: the next token comes from a fresh step, as the engine would run it (plain
      // sampling at the next position, given the corrected token).
      b = sample_from_logits(processed(a), rng_uniform(key, 101, 0));
    }
    ++counts[a * V + b];
  }
  double chi2 = 0;
  for (int c = 0; c < V * V; ++c) chi2 += (counts[c] - expected[c]) * (counts[c] - expected[c]) / expected[c];
  return chi2;
}

TEST(SpecVerifierSampling, PointMassDraftsKeepTheTargetDistribution) {
  EXPECT_LT(chi_square_two_tokens(true, 1.0), 73.0);
  EXPECT_LT(chi_square_two_tokens(true, 0.6), 73.0);
}

TEST(SpecVerifierSampling, SampledDraftsKeepTheTargetDistribution) {
  EXPECT_LT(chi_square_two_tokens(false, 0.8), 73.0);
}

TEST(SpecVerifierSampling, DeterministicForAKey) {
  Draft d;
  d.tokens = {1, 2, 3};
  auto row = [&](int i) { return toy_logits(6, i); };
  const VerifyResult a = verify_draft(d, 3, false, row, never_stop(), {42, 1}, 5);
  const VerifyResult b = verify_draft(d, 3, false, row, never_stop(), {42, 1}, 5);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.num_accepted, b.num_accepted);
}

TEST(SpecPolicy, FixedLengthWithinBudget) {
  const std::vector<DraftCandidate> c = {{3, {}}, {3, {}}, {2, {}}};
  std::vector<int> out(3);
  FixedLengthPolicy().choose(c, 7, out);
  EXPECT_EQ(out, (std::vector<int>{3, 3, 1}));
  FixedLengthPolicy().choose(c, 100, out);
  EXPECT_EQ(out, (std::vector<int>{3, 3, 2}));
}

TEST(SpecPolicy, ConfidencePrefixSurvival) {
  const std::vector<float> conf = {0.9f, 0.8f, 0.5f, 0.9f};  // survival 0.9, 0.72, 0.36, 0.32
  const std::vector<DraftCandidate> c = {{4, conf}, {4, {}}};
  std::vector<int> out(2);
  ConfidencePolicy(0.7).choose(c, 100, out);
  EXPECT_EQ(out, (std::vector<int>{2, 4}));
  ConfidencePolicy(0.95).choose(c, 100, out);
  EXPECT_EQ(out, (std::vector<int>{1, 4}));  // at least min_tokens = 1
  ConfidencePolicy(0.3).choose(c, 5, out);
  EXPECT_EQ(out, (std::vector<int>{4, 1}));
  EXPECT_THROW(ConfidencePolicy(1.5), Error);
}

}  // namespace
}  // namespace deepinfer::spec
