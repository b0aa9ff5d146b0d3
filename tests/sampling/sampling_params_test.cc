#include "deepinfer/sampling/sampling_params.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>

#include "deepinfer/core/error.h"

namespace deepinfer {
namespace {

// The error message of validate(p), or "" if it passed.
std::string error_of(const SamplingParams& p, int64_t vocab = 100) {
  try {
    validate(p, vocab);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    return e.message();
  }
  return "";
}

TEST(SamplingParams, DefaultsAndGreedyAreValid) {
  EXPECT_EQ(error_of(SamplingParams{}), "");
  SamplingParams p;
  p.temperature = 0;
  p.top_k = -1;
  p.logprobs = 0;
  p.stop = {"\n\n"};
  p.stop_token_ids = {0, 99};
  p.max_tokens = 1;
  p.seed = 7;
  EXPECT_EQ(error_of(p), "");
  EXPECT_TRUE(p.greedy());
}

struct BadCase {
  const char* name;
  std::function<void(SamplingParams&)> set;
  const char* expect;  // substring of the message: the parameter and its range
};

TEST(SamplingParams, EveryInvalidValueIsRejectedWithItsNameAndRange) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<BadCase> cases = {
      {"negative temperature", [](SamplingParams& p) { p.temperature = -0.1f; }, "temperature must be a finite value >= 0"},
      {"nan temperature", [&](SamplingParams& p) { p.temperature = nan; }, "temperature"},
      {"inf temperature", [&](SamplingParams& p) { p.temperature = inf; }, "temperature"},
      {"top_k -2", [](SamplingParams& p) { p.top_k = -2; }, "top_k must be -1 or 0 (disabled) or >= 1, got -2"},
      {"top_p 0", [](SamplingParams& p) { p.top_p = 0; }, "top_p must be in (0, 1], got 0"},
      {"top_p 1.5", [](SamplingParams& p) { p.top_p = 1.5f; }, "top_p must be in (0, 1]"},
      {"top_p nan", [&](SamplingParams& p) { p.top_p = nan; }, "top_p"},
      {"min_p -0.1", [](SamplingParams& p) { p.min_p = -0.1f; }, "min_p must be in [0, 1]"},
      {"min_p 2", [](SamplingParams& p) { p.min_p = 2; }, "min_p must be in [0, 1]"},
      {"repetition 0", [](SamplingParams& p) { p.repetition_penalty = 0; }, "repetition_penalty must be a finite value > 0"},
      {"repetition inf", [&](SamplingParams& p) { p.repetition_penalty = inf; }, "repetition_penalty"},
      {"presence 3", [](SamplingParams& p) { p.presence_penalty = 3; }, "presence_penalty must be in [-2, 2]"},
      {"presence -2.5", [](SamplingParams& p) { p.presence_penalty = -2.5f; }, "presence_penalty must be in [-2, 2]"},
      {"frequency 2.1", [](SamplingParams& p) { p.frequency_penalty = 2.1f; }, "frequency_penalty must be in [-2, 2]"},
      {"max_tokens 0", [](SamplingParams& p) { p.max_tokens = 0; }, "max_tokens must be >= 1, got 0"},
      {"min_tokens -1", [](SamplingParams& p) { p.min_tokens = -1; }, "min_tokens must be >= 0"},
      {"min > max", [](SamplingParams& p) { p.max_tokens = 4; p.min_tokens = 5; }, "min_tokens must be <= max_tokens (4)"},
      {"n 0", [](SamplingParams& p) { p.n = 0; }, "n must be in [1, 128], got 0"},
      {"n 129", [](SamplingParams& p) { p.n = 129; }, "n must be in [1, 128]"},
      {"logprobs -1", [](SamplingParams& p) { p.logprobs = -1; }, "logprobs must be in [0, 20], got -1"},
      {"logprobs 21", [](SamplingParams& p) { p.logprobs = 21; }, "logprobs must be in [0, 20]"},
      {"empty stop", [](SamplingParams& p) { p.stop = {"ok", ""}; }, "stop[1] must not be empty"},
      {"stop id neg", [](SamplingParams& p) { p.stop_token_ids = {-1}; }, "stop_token_ids[0] must be in [0, 100)"},
      {"stop id vocab", [](SamplingParams& p) { p.stop_token_ids = {5, 100}; }, "stop_token_ids[1] must be in [0, 100), got 100"},
  };
  for (const auto& c : cases) {
    SamplingParams p;
    c.set(p);
    const std::string msg = error_of(p);
    EXPECT_NE(msg.find(c.expect), std::string::npos) << c.name << ": got '" << msg << "'";
  }
}

}  // namespace
}  // namespace deepinfer
