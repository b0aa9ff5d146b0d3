// Prometheus rendering of the server metrics, here the speculative-decoding acceptance counters (the engine fills
// them when speculative decoding runs; the server test checks the engine-fed gauges end to end).
#include <gtest/gtest.h>

#include <regex>

#include "deepinfer/server/metrics.h"

namespace deepinfer::server {
namespace {

double value_of(const std::string& text, const std::string& series) {
  const size_t at = text.find(series + " ");
  EXPECT_NE(at, std::string::npos) << series << "\n" << text;
  if (at == std::string::npos) return -1;
  return std::stod(text.substr(at + series.size() + 1));
}

TEST(Metrics, SpeculativeAcceptance) {
  Metrics m;
  EngineGauges g;
  g.spec_steps = 10;
  g.spec_draft_tokens = 40;
  g.spec_accepted_tokens = 30;
  g.spec_draft_per_pos = {10, 10, 10, 10};
  g.spec_accepted_per_pos = {10, 9, 7, 4};
  m.set_gauges(g);
  const std::string t = m.render("tiny");
  EXPECT_EQ(value_of(t, "deepinfer_spec_decode_num_drafts_total{model_name=\"tiny\"}"), 10);
  EXPECT_EQ(value_of(t, "deepinfer_spec_decode_num_draft_tokens_total{model_name=\"tiny\"}"), 40);
  EXPECT_EQ(value_of(t, "deepinfer_spec_decode_num_accepted_tokens_total{model_name=\"tiny\"}"), 30);
  EXPECT_DOUBLE_EQ(value_of(t, "deepinfer_spec_decode_acceptance_rate{model_name=\"tiny\"}"), 0.75);
  EXPECT_EQ(value_of(t, "deepinfer_spec_decode_num_accepted_tokens_per_pos_total{model_name=\"tiny\",position=\"2\"}"),
            7);
  EXPECT_EQ(value_of(t, "deepinfer_spec_decode_num_draft_tokens_per_pos_total{model_name=\"tiny\",position=\"3\"}"),
            10);
  // Every sample line belongs to a metric announced with # TYPE.
  std::smatch mt;
  std::string rest = t;
  while (std::regex_search(rest, mt, std::regex("\n(deepinfer_[a-z_]+?)(_bucket|_sum|_count)?[{ ]"))) {
    EXPECT_NE(t.find("# TYPE " + mt[1].str() + " "), std::string::npos) << mt[1];
    rest = mt.suffix();
  }
  // Without drafts the rate is 0, not NaN.
  m.set_gauges({});
  EXPECT_EQ(value_of(m.render("tiny"), "deepinfer_spec_decode_acceptance_rate{model_name=\"tiny\"}"), 0);
}

}  // namespace
}  // namespace deepinfer::server
