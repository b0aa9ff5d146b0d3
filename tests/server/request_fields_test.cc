// Request field parsing shared by the API routes: the server's limits on n and max_tokens, and the aliased
// sampling fields of the Anthropic / Responses routes naming the client's field in errors.
#include <gtest/gtest.h>

#include <functional>

#include "deepinfer/server/request_fields.h"

namespace deepinfer::server {
namespace {

ApiError error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "no ApiError";
  return ApiError(0, "");
}

TEST(RequestFields, ServerLimitsOnNAndMaxTokens) {
  RequestLimits limits;
  limits.max_n = 4;
  limits.max_tokens = 64;
  Json ok = {{"max_tokens", 64}, {"n", 4}};
  SamplingParams p = parse_openai_sampling(ok, /*chat=*/true, 1000, limits);
  EXPECT_EQ(*p.max_tokens, 64);
  EXPECT_EQ(p.n, 4);
  ApiError e = error_of([&] { parse_openai_sampling({{"max_tokens", 65}}, true, 1000, limits); });
  EXPECT_EQ(e.status(), 400);
  EXPECT_EQ(e.param(), "max_tokens");
  EXPECT_NE(e.message().find("[1, 64]"), std::string::npos) << e.message();
  e = error_of([&] { parse_openai_sampling({{"max_completion_tokens", 100}}, true, 1000, limits); });
  EXPECT_EQ(e.param(), "max_completion_tokens");
  e = error_of([&] { parse_openai_sampling({{"n", 5}}, true, 1000, limits); });
  EXPECT_EQ(e.param(), "n");
}

TEST(RequestFields, AliasedSamplingNamesTheClientsField) {
  RequestLimits limits;
  Json body = {{"max_output_tokens", 0}};
  ApiError e = error_of([&] {
    parse_aliased_sampling(body, {{"max_output_tokens", "max_tokens"}}, Json::object(), 1000, limits);
  });
  EXPECT_EQ(e.param(), "max_output_tokens");
  EXPECT_EQ(e.message().rfind("max_output_tokens must be", 0), 0u) << e.message();
  e = error_of([&] {
    parse_aliased_sampling({{"stop_sequences", 5}}, {{"stop_sequences", "stop"}}, Json::object(), 1000, limits);
  });
  EXPECT_EQ(e.param(), "stop_sequences");
  // Fields not in the alias list are not read, and the converted view is parsed as given.
  SamplingParams p = parse_aliased_sampling({{"temperature", 0.5}, {"n", 3}}, {{"temperature", "temperature"}},
                                            Json{{"top_k", 7}}, 1000, limits);
  EXPECT_FLOAT_EQ(p.temperature, 0.5f);
  EXPECT_EQ(p.n, 1);
  EXPECT_EQ(p.top_k, 7);
  std::string field;
  p = parse_aliased_sampling({}, {{"text.format", "response_format"}},
                             Json{{"response_format", {{"type", "json_object"}}}}, 1000, limits, &field);
  EXPECT_TRUE(p.structured.active());
  EXPECT_EQ(field, "text.format");
}

}  // namespace
}  // namespace deepinfer::server
