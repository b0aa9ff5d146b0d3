// The DSpark proposer behind the spec::Proposer interface, driven the way the engine's runner drives it:
// observe() with the target's feature rows of the verified positions (NaN rows where bounded replay skipped
// the target layers) and the sampled next token, propose() for the anchor. A greedy speculative loop over it
// reproduces plain greedy decoding token for token.
#include "deepinfer/spec/dspark_proposer.h"

#include <gtest/gtest.h>

#include <cmath>

#include "model/dspark_fixture.h"

namespace deepinfer::spec {
namespace {

TEST(DsparkProposer, GreedyLoopThroughObserveAndProposeEqualsGreedyDecoding) {
  testing::DraftFixture& f = testing::dspark_fixture("deepseek_v41");
  const DeepseekV4Model& m = *f.model;
  const int64_t V = m.config().vocab_size, T = m.decoder_window() + 6;
  const std::vector<int64_t> prompt = testing::dspark_prompt(static_cast<int>(T), V);
  auto argmax = [&](const HostTensor& logits, int64_t row) {
    return static_cast<TokenId>(testing::argmax_of({logits.data<float>() + row * V, static_cast<size_t>(V)}));
  };
  const int kNew = 12;
  std::vector<TokenId> plain;
  {
    auto seq = m.new_sequence();
    HostTensor logits = m.forward(seq, prompt);
    TokenId next = argmax(logits, logits.shape()[0] - 1);
    while (static_cast<int>(plain.size()) < kNew) {
      plain.push_back(next);
      logits = m.forward(seq, std::vector<int64_t>{next});
      next = argmax(logits, 0);
    }
  }

  DsparkProposer proposer(m, 2);
  const int64_t F = proposer.feature_dim();
  std::vector<TokenId> prompt_ids(prompt.begin(), prompt.end());
  // Prefill in two chunks, the prompt run with bounded replay (its first positions carry no features).
  auto pre = m.new_sequence();
  pre.decoder_from = m.bounded_decoder_from(T);
  ASSERT_GT(pre.decoder_from, 0);
  std::vector<float> features;
  const int64_t split = 5;
  m.forward_features(pre, std::span<const int64_t>(prompt).first(split), &features);
  TargetChunk c;
  c.slot = 1;
  c.reset = true;
  c.start = 0;
  c.ids = std::span<const TokenId>(prompt_ids).first(split);
  c.features = features;
  c.feature_dim = F;
  proposer.observe(c);
  DraftRequest req;
  req.slot = 1;
  req.max_tokens = 5;
  req.position = split + 1;
  EXPECT_TRUE(proposer.propose(req).tokens.empty());  // no next token yet
  const HostTensor logits = m.forward_features(pre, std::span<const int64_t>(prompt).subspan(split), &features);
  c.reset = false;
  c.start = split;
  c.ids = std::span<const TokenId>(prompt_ids).subspan(split);
  c.features = features;
  c.next_token = argmax(logits, logits.shape()[0] - 1);
  proposer.observe(c);
  ASSERT_EQ(proposer.context(1)->num_positions, T);
  int64_t cached = 0;
  for (int64_t p : proposer.context(1)->slot_position) cached += p >= 0;
  EXPECT_EQ(cached, T - pre.decoder_from);  // the skipped positions stay out of the draft cache

  std::vector<TokenId> kept = prompt_ids, spec;
  TokenId anchor = *c.next_token;
  while (static_cast<int>(spec.size()) < kNew) {
    const int64_t P = static_cast<int64_t>(kept.size());
    req.position = P + 1;
    const Draft d = proposer.propose(req);
    ASSERT_EQ(d.tokens.size(), 5u);
    ASSERT_EQ(d.confidence.size(), 5u);
    for (float x : d.confidence) EXPECT_TRUE(x > 0.0f && x < 1.0f) << x;
    EXPECT_TRUE(d.probs.empty());  // greedy drafts: point masses
    // The target verifies [anchor, d_1 .. d_5] (re-running the kept sequence: no target rollback involved).
    std::vector<int64_t> chunk(kept.begin(), kept.end());
    chunk.push_back(anchor);
    chunk.insert(chunk.end(), d.tokens.begin(), d.tokens.end());
    auto seq = m.new_sequence();
    const HostTensor out = m.forward_features(seq, chunk, &features);
    size_t a = 0;
    while (a < d.tokens.size() && d.tokens[a] == argmax(out, P + static_cast<int64_t>(a))) ++a;
    std::vector<TokenId> accepted = {anchor};
    accepted.insert(accepted.end(), d.tokens.begin(), d.tokens.begin() + static_cast<int64_t>(a));
    TargetChunk v;
    v.slot = 1;
    v.start = P;
    v.ids = accepted;
    v.features = std::span<const float>(features).subspan(static_cast<size_t>(P * F), accepted.size() * F);
    v.feature_dim = F;
    v.next_token = argmax(out, P + static_cast<int64_t>(a));
    proposer.observe(v);
    kept.insert(kept.end(), accepted.begin(), accepted.end());
    spec.insert(spec.end(), accepted.begin(), accepted.end());
    anchor = *v.next_token;
  }
  spec.resize(kNew);
  EXPECT_EQ(spec, plain);
  // Re-observing already cached positions rolls the draft cache back to them (within its slack).
  const int64_t at = proposer.context(1)->num_positions;
  TargetChunk again;
  again.slot = 1;
  again.start = at - 2;
  std::vector<TokenId> two(kept.end() - 2, kept.end());
  again.ids = two;
  again.features = std::span<const float>(features).subspan(static_cast<size_t>((at - 2) * F), 2 * F);
  again.feature_dim = F;
  proposer.observe(again);
  EXPECT_EQ(proposer.context(1)->num_positions, at);
  proposer.release_slot(1);
  EXPECT_EQ(proposer.context(1), nullptr);
  req.position = at + 1;
  EXPECT_TRUE(proposer.propose(req).tokens.empty());
}

TEST(DsparkProposer, UnavailableWithoutDraftConfig) {
  testing::DraftFixture& f = testing::dspark_fixture("deepseek_v41");
  auto golden = DeepseekV4Model::load(testing::test_data_dir() + "/golden/deepseek_v41", *f.backend, f.token_map);
  try {
    DsparkProposer p(*golden, 1);
    ADD_FAILURE() << "DSpark proposer on a model without a draft";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("DSpark"), std::string::npos);
  }
}

}  // namespace
}  // namespace deepinfer::spec
