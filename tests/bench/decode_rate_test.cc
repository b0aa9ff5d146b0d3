// The reference's decode figures (avg_SPS, the full-acceptance token count) and the delivered tokens next to them,
// against values worked out by hand.
#include "deepinfer/bench/decode_rate.h"

#include <gtest/gtest.h>

#include "deepinfer/core/error.h"

namespace deepinfer::bench {
namespace {

TEST(DecodeRate, SpeculativeRunByHand) {
  // 10 steps of 4 sequences in 0.5 s, one draft each: 40 drafted, 30 accepted.
  DecodeCounts c{10, 0.5, 40, 40, 30, 0, 1};
  const DecodeRate r = decode_rate(c);
  EXPECT_DOUBLE_EQ(r.avg_sps, 20.0);
  EXPECT_DOUBLE_EQ(r.mean_batch, 4.0);
  EXPECT_DOUBLE_EQ(r.acceptance, 0.75);
  EXPECT_DOUBLE_EQ(r.delivered_tokens, 70.0);               // 40 sampled + 30 accepted drafts
  EXPECT_DOUBLE_EQ(r.delivered_tokens_per_s, 140.0);        // 70 / 0.5
  EXPECT_DOUBLE_EQ(r.full_acceptance_tokens_per_s, 160.0);  // 20 × 4 × (1 + 1)
  EXPECT_EQ(format_decode_rate(c, r),
            "avg_SPS 20.00 steps/s (10 steps in 0.500000 s, mean batch 4.00); delivered 140.0 tokens/s (measured "
            "acceptance 0.750 of 40 drafts); full-acceptance assumption 160.0 tokens/s (avg_SPS x batch x (1 + 1))");
}

TEST(DecodeRate, WithoutSpeculationDeliveredIsTheFullAcceptanceFigure) {
  // 3 steps of batch 2, 3 and 1 (6 sequence steps) in 0.25 s.
  DecodeCounts c{3, 0.25, 6, 0, 0, 0, 0};
  const DecodeRate r = decode_rate(c);
  EXPECT_DOUBLE_EQ(r.avg_sps, 12.0);
  EXPECT_DOUBLE_EQ(r.mean_batch, 2.0);
  EXPECT_DOUBLE_EQ(r.delivered_tokens_per_s, 24.0);
  EXPECT_DOUBLE_EQ(r.full_acceptance_tokens_per_s, r.delivered_tokens_per_s);
  EXPECT_NE(format_decode_rate(c, r).find("(no speculation)"), std::string::npos);
  // A token sampled for a sequence that had already stopped is not delivered.
  c.discarded = 1;
  EXPECT_DOUBLE_EQ(decode_rate(c).delivered_tokens_per_s, 20.0);
  EXPECT_DOUBLE_EQ(decode_rate(c).full_acceptance_tokens_per_s, 24.0);
}

TEST(DecodeRate, DraftsThatWereNeverVerified) {
  // Draft length 2 but no verification step (e.g. every sequence stopped first): full acceptance still assumes
  // 3 tokens per sequence step, delivered counts 1.
  DecodeCounts c{2, 1.0, 2, 0, 0, 0, 2};
  const DecodeRate r = decode_rate(c);
  EXPECT_DOUBLE_EQ(r.delivered_tokens_per_s, 2.0);
  EXPECT_DOUBLE_EQ(r.full_acceptance_tokens_per_s, 6.0);
  EXPECT_NE(format_decode_rate(c, r).find("(no drafts verified)"), std::string::npos);
}

TEST(DecodeRate, NoStepsAndBadCounts) {
  const DecodeRate zero = decode_rate({});
  EXPECT_EQ(zero.avg_sps, 0.0);
  EXPECT_EQ(zero.full_acceptance_tokens_per_s, 0.0);
  EXPECT_EQ(format_decode_rate({}, zero), "avg_SPS n/a (no decode steps)");
  EXPECT_THROW(decode_rate({1, 0.0, 1, 0, 0, 0, 0}), Error);   // steps without time
  EXPECT_THROW(decode_rate({1, 1.0, 1, 2, 3, 0, 1}), Error);   // accepted > drafted
  EXPECT_THROW(decode_rate({-1, 1.0, 1, 0, 0, 0, 0}), Error);  // negative
  EXPECT_THROW(decode_rate({1, 1.0, 1, 0, 0, 2, 0}), Error);   // more discarded than sampled
  EXPECT_THROW(decode_rate({0, 0.0, 3, 0, 0, 0, 0}), Error);   // sequence steps without steps
  EXPECT_THROW(decode_rate({1, 1.0, 1, 0, 0, 0, -1}), Error);  // negative draft length
}

}  // namespace
}  // namespace deepinfer::bench
