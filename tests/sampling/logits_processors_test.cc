#include "deepinfer/sampling/logits_processors.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "deepinfer/core/error.h"

namespace deepinfer {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

std::vector<float> logs(std::vector<double> probs) {
  std::vector<float> out;
  for (double p : probs) out.push_back(static_cast<float>(std::log(p)));
  return out;
}

std::vector<bool> kept(const std::vector<float>& logits) {
  std::vector<bool> k;
  for (float v : logits) k.push_back(v != kNegInf);
  return k;
}

TEST(SamplingProcessors, PenaltiesMatchHandComputedValues) {
  // rep 2: seen tokens 0 (prompt), 1, 2 (output): 1/2, -1*2, 2/2; then output counts {1:1, 2:2}:
  // token 1: -2 - (0.25*1 + 0.5) = -2.75; token 2: 1 - (0.25*2 + 0.5) = 0; token 0 (prompt only) 0.5; token 3 kept.
  std::vector<float> logits = {1.0f, -1.0f, 2.0f, 0.5f};
  SamplingParams p;
  p.repetition_penalty = 2.0f;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.25f;
  const std::vector<TokenId> prompt = {0}, output = {1, 2, 2};
  SamplingContext ctx{prompt, output, {}, {}};
  PenaltyProcessor proc;
  ASSERT_TRUE(proc.enabled(p, ctx));
  proc.apply(logits, p, ctx);
  EXPECT_EQ(logits, (std::vector<float>{0.5f, -2.75f, 0.0f, 0.5f}));
}

TEST(SamplingProcessors, PenaltiesOffByDefault) {
  SamplingParams p;
  const std::vector<TokenId> output = {1};
  EXPECT_FALSE(PenaltyProcessor().enabled(p, SamplingContext{{}, output, {}, {}}));
}

TEST(SamplingProcessors, TemperatureDividesLogits) {
  std::vector<float> logits = {1.0f, 2.0f, kNegInf};
  SamplingParams p;
  p.temperature = 0.5f;
  TemperatureProcessor().apply(logits, p, {});
  EXPECT_EQ(logits, (std::vector<float>{2.0f, 4.0f, kNegInf}));
  p.temperature = 1.0f;
  EXPECT_FALSE(TemperatureProcessor().enabled(p, {}));
}

TEST(SamplingProcessors, TopKKeepsKLargestLowerIdOnTies) {
  SamplingParams p;
  p.top_k = 2;
  std::vector<float> logits = {1, 3, 2, 3};
  TopKProcessor().apply(logits, p, {});
  EXPECT_EQ(kept(logits), (std::vector<bool>{false, true, false, true}));
  p.top_k = 1;
  logits = {1, 3, 2, 3};
  TopKProcessor().apply(logits, p, {});
  EXPECT_EQ(kept(logits), (std::vector<bool>{false, true, false, false}));
  p.top_k = 10;  // larger than the vocabulary: identity
  logits = {1, 3, 2, 3};
  TopKProcessor().apply(logits, p, {});
  EXPECT_EQ(kept(logits), (std::vector<bool>{true, true, true, true}));
}

TEST(SamplingProcessors, TopPKeepsSmallestSetReachingP) {
  const std::vector<double> probs = {0.15, 0.5, 0.05, 0.3};  // sorted: 1 (0.5), 3 (0.3), 0 (0.15), 2 (0.05)
  SamplingParams p;
  auto run = [&](float top_p) {
    p.top_p = top_p;
    std::vector<float> l = logs(probs);
    TopPProcessor().apply(l, p, {});
    return kept(l);
  };
  EXPECT_EQ(run(0.4f), (std::vector<bool>{false, true, false, false}));  // 0.5 reaches 0.4
  EXPECT_EQ(run(0.7f), (std::vector<bool>{false, true, false, true}));   // 0.5 < 0.7, 0.8 reaches it
  EXPECT_EQ(run(0.9f), (std::vector<bool>{true, true, false, true}));    // 0.8 < 0.9, 0.95 reaches it
  EXPECT_EQ(run(1.0f), (std::vector<bool>{true, true, true, true}));
}

TEST(SamplingProcessors, MinPDropsBelowFractionOfMax) {
  SamplingParams p;
  p.min_p = 0.2f;  // threshold 0.2 * 0.5 = 0.1
  std::vector<float> l = logs({0.15, 0.5, 0.05, 0.3});
  MinPProcessor().apply(l, p, {});
  EXPECT_EQ(kept(l), (std::vector<bool>{true, true, false, true}));
  p.min_p = 1.0f;  // only the max survives
  l = logs({0.15, 0.5, 0.05, 0.3});
  MinPProcessor().apply(l, p, {});
  EXPECT_EQ(kept(l), (std::vector<bool>{false, true, false, false}));
}

TEST(SamplingProcessors, TokenMaskKeepsAllowedBitsOnly) {
  std::vector<float> l(40, 1.0f);
  std::vector<uint32_t> mask = {(1u << 3) | (1u << 31), 1u << 2};  // tokens 3, 31, 34
  SamplingContext ctx;
  ctx.allowed_tokens = mask;
  TokenMaskProcessor().apply(l, {}, ctx);
  for (int t = 0; t < 40; ++t) EXPECT_EQ(l[t] != kNegInf, t == 3 || t == 31 || t == 34) << t;
  std::vector<uint32_t> none = {0u, 0u};
  ctx.allowed_tokens = none;
  std::vector<float> l2(40, 1.0f);
  EXPECT_THROW(TokenMaskProcessor().apply(l2, {}, ctx), Error);
  std::vector<uint32_t> short_mask = {~0u};
  ctx.allowed_tokens = short_mask;
  EXPECT_THROW(TokenMaskProcessor().apply(l2, {}, ctx), Error);
}

TEST(SamplingProcessors, MinTokensSuppressesEosAndStopTokens) {
  SamplingParams p;
  p.min_tokens = 2;
  p.stop_token_ids = {1};
  const std::vector<TokenId> eos = {3};
  std::vector<TokenId> output = {0};
  SamplingContext ctx{{}, output, {}, eos};
  MinTokensProcessor proc;
  ASSERT_TRUE(proc.enabled(p, ctx));
  std::vector<float> l = {0, 5, 0, 9};
  proc.apply(l, p, ctx);
  EXPECT_EQ(kept(l), (std::vector<bool>{true, false, true, false}));
  output = {0, 2};
  ctx.output = output;
  EXPECT_FALSE(proc.enabled(p, ctx));
}

TEST(SamplingProcessors, ChainAppliesInDocumentedOrder) {
  // temperature before top-p: at T=4 the distribution flattens, so top-p 0.7 keeps more tokens than at T=1.
  SamplingParams p;
  p.top_p = 0.7f;
  const auto chain = LogitsProcessorChain::standard();
  std::vector<float> cold = logs({0.6, 0.25, 0.1, 0.05});
  chain.apply(cold, p, {});
  EXPECT_EQ(kept(cold), (std::vector<bool>{true, true, false, false}));
  p.temperature = 4.0f;
  std::vector<float> hot = logs({0.6, 0.25, 0.1, 0.05});
  chain.apply(hot, p, {});
  EXPECT_EQ(kept(hot), (std::vector<bool>{true, true, true, false}));
  // top-k before top-p: top_k 1 leaves one token whatever top_p says.
  p.temperature = 1.0f;
  p.top_k = 1;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  std::vector<float> l = logs({0.2, 0.3, 0.5});
  chain.apply(l, p, {});
  EXPECT_EQ(kept(l), (std::vector<bool>{false, false, true}));
  EXPECT_EQ(LogitsProcessorChain::standard().size(), 7u);
}

TEST(SamplingProcessors, SoftmaxAndLogSoftmaxIgnoreMaskedTokens) {
  const std::vector<float> l = {0.0f, kNegInf, std::log(3.0f)};
  const auto p = softmax(l);
  EXPECT_NEAR(p[0], 0.25, 1e-6);
  EXPECT_EQ(p[1], 0.0);
  EXPECT_NEAR(p[2], 0.75, 1e-6);
  const auto lp = log_softmax(l);
  EXPECT_NEAR(lp[0], std::log(0.25), 1e-6);
  EXPECT_EQ(lp[1], kNegInf);
}

}  // namespace
}  // namespace deepinfer
