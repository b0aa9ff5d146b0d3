// Security limits of the HTTP server (docs/SECURITY.md): constant-time API-key checks, header / body / nesting /
// constraint-size limits answered with a 4xx that names the limit, and a server that keeps serving afterwards.
#include <gtest/gtest.h>

#include <string>

#include <boost/asio.hpp>
#include <nlohmann/json.hpp>

#include "deepinfer/server/api_key.h"
#include "deepinfer/server/request_fields.h"
#include "server/server_test_util.h"

namespace deepinfer::testing {
namespace {

using Json = nlohmann::json;

std::string golden_dir() { return test_data_dir() + "/golden/deepseek_v41"; }

// Raw bytes on a fresh connection; returns everything the server sends until it closes.
std::string raw_exchange(uint16_t port, const std::string& bytes) {
  namespace net = boost::asio;
  net::io_context ioc;
  net::ip::tcp::socket sock(ioc);
  sock.connect({net::ip::make_address("127.0.0.1"), port});
  net::write(sock, net::buffer(bytes));
  sock.shutdown(net::ip::tcp::socket::shutdown_send);  // nothing more comes: the server must not wait for it
  std::string out;
  boost::system::error_code ec;
  char buf[4096];
  for (;;) {
    size_t n = sock.read_some(net::buffer(buf), ec);
    if (ec) break;
    out.append(buf, n);
  }
  return out;
}

TEST(ApiKey, ConstantTimeEqualIsExactEquality) {
  EXPECT_TRUE(server::constant_time_equal("sekret", "sekret"));
  EXPECT_FALSE(server::constant_time_equal("sekreT", "sekret"));
  EXPECT_FALSE(server::constant_time_equal("sekre", "sekret"));    // a prefix
  EXPECT_FALSE(server::constant_time_equal("sekrets", "sekret"));  // longer
  EXPECT_FALSE(server::constant_time_equal("", "sekret"));
  EXPECT_FALSE(server::constant_time_equal(std::string("sekret\0", 7), "sekret"));  // NUL padding is not equal
  EXPECT_TRUE(server::constant_time_equal("", ""));
}

TEST(ApiKey, MatchesBearerOrXApiKeyOnly) {
  EXPECT_TRUE(server::api_key_matches("Bearer k1", "", "k1"));
  EXPECT_TRUE(server::api_key_matches("bearer k1", "", "k1"));  // the scheme is case-insensitive (RFC 7235)
  EXPECT_TRUE(server::api_key_matches("", "k1", "k1"));
  EXPECT_TRUE(server::api_key_matches("Bearer wrong", "k1", "k1"));
  EXPECT_FALSE(server::api_key_matches("k1", "", "k1"));  // no scheme
  EXPECT_FALSE(server::api_key_matches("Basic k1", "", "k1"));
  EXPECT_FALSE(server::api_key_matches("Bearer k1 ", "", "k1"));
  EXPECT_FALSE(server::api_key_matches("Bearer ", "", ""));  // an empty key never matches
  EXPECT_FALSE(server::api_key_matches("", "", ""));
}

TEST(RequestLimits, JsonNestingDepthIgnoresStrings) {
  EXPECT_EQ(server::json_nesting_depth(R"({"a": [1, {"b": []}]})", 100), 4);
  EXPECT_EQ(server::json_nesting_depth(R"({"a": "[[[[{{{{"})", 100), 1);
  EXPECT_EQ(server::json_nesting_depth(R"({"a": "\"[[[", "b": [[]]})", 100), 3);
  EXPECT_EQ(server::json_nesting_depth(std::string(1000, '['), 10), 11);  // stops early
  EXPECT_EQ(server::json_nesting_depth("", 10), 0);
}

// Found by fuzz_request_body: a number too large for a double is nlohmann's out_of_range, not parse_error, and
// escaped as a 500 (a crash in the fuzzer). It is a 400 naming the body like any other invalid JSON.
TEST(RequestLimits, NumbersBeyondDoubleRangeAre400) {
  for (const char* body : {R"({"max_tokens": 1e999})", R"({"temperature": -1e400, "prompt": "x"})",
                           R"({"mos":66666666666666666666e55550.9})"}) {
    try {
      server::parse_body(body);
      ADD_FAILURE() << body << " parsed";
    } catch (const server::ApiError& e) {
      EXPECT_EQ(e.status(), 400) << body;
      EXPECT_NE(std::string(e.what()).find("not valid JSON"), std::string::npos) << e.what();
    }
  }
}

class ServerSecurityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server::HttpServerOptions opt;
    opt.api_key = "k-123";
    opt.max_header_bytes = 4096;
    server_ = TestServer::start(golden_dir(), opt).release();
  }
  static void TearDownTestSuite() { delete server_; }
  static HttpResult post(const std::string& path, const std::string& body,
                         std::vector<std::pair<std::string, std::string>> extra = {}) {
    extra.emplace_back("Authorization", "Bearer k-123");
    return http_request(server_->port, "POST", path, body, extra);
  }
  static void expect_still_serving() {
    auto r = post("/v1/completions", Json({{"model", "test-model"}, {"prompt", {1, 2}}, {"max_tokens", 2}}).dump());
    EXPECT_EQ(r.status, 200) << r.body;
  }
  static TestServer* server_;
};
TestServer* ServerSecurityTest::server_ = nullptr;

TEST_F(ServerSecurityTest, EveryInferenceRouteNeedsTheKey) {
  for (const char* path : {"/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/messages/count_tokens",
                           "/v1/responses", "/tokenize", "/detokenize"}) {
    auto r = http_request(server_->port, "POST", path, "{}");
    EXPECT_EQ(r.status, 401) << path;
    r = http_request(server_->port, "POST", path, "{}", {{"Authorization", "Bearer k-12"}});
    EXPECT_EQ(r.status, 401) << path;
    r = http_request(server_->port, "POST", path, "{}", {{"x-api-key", "k-1234"}});
    EXPECT_EQ(r.status, 401) << path;
  }
  EXPECT_EQ(http_request(server_->port, "GET", "/v1/models").status, 401);
  EXPECT_EQ(http_request(server_->port, "GET", "/metrics").status, 401);
  EXPECT_EQ(http_request(server_->port, "GET", "/health").status, 200);
}

TEST_F(ServerSecurityTest, OversizedHeadersAre431) {
  auto r = post("/v1/completions", "{}", {{"X-Padding", std::string(8000, 'a')}});
  EXPECT_EQ(r.status, 431) << r.body;
  EXPECT_NE(r.body.find("4096 bytes"), std::string::npos) << r.body;
  expect_still_serving();
}

TEST_F(ServerSecurityTest, MalformedHttpIs400) {
  std::string out = raw_exchange(server_->port, "GARBAGE\x01 / HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(out.rfind("HTTP/1.1 400", 0), 0u) << out;
  EXPECT_NE(out.find("malformed HTTP request"), std::string::npos) << out;
  // Not HTTP at all, and a connection that closes mid-headers: no reply needed, nothing breaks.
  raw_exchange(server_->port, std::string("\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 11));
  raw_exchange(server_->port, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le");
  expect_still_serving();
}

TEST_F(ServerSecurityTest, DeeplyNestedBodiesAre400BeforeParsing) {
  // 1 MB of '[' would build a million-level tree (and recurse on it) if it were parsed.
  std::string deep = "{\"model\": \"m\", \"prompt\": " + std::string(1 << 20, '[') + "}";
  auto r = post("/v1/completions", deep);
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_NE(r.body.find("deeper than 128 levels"), std::string::npos) << r.body;
  // Brackets inside strings do not count: a prompt of 10k '[' characters is fine.
  Json ok = {{"model", "test-model"}, {"prompt", std::string(10000, '[')}, {"max_tokens", 1}};
  r = post("/tokenize", ok.dump());
  EXPECT_EQ(r.status, 200) << r.body;
  expect_still_serving();
}

TEST_F(ServerSecurityTest, OversizedConstraintsAre400NamingTheField) {
  const std::string big_regex(70 * 1024, 'a');
  Json body = {{"model", "test-model"}, {"prompt", {1, 2}}, {"max_tokens", 2}, {"regex", big_regex}};
  auto r = post("/v1/completions", body.dump());
  EXPECT_EQ(r.status, 400) << r.body.substr(0, 300);
  Json e = Json::parse(r.body)["error"];
  EXPECT_EQ(e["param"], "regex");
  EXPECT_NE(e["message"].get<std::string>().find("limit of 65536"), std::string::npos) << e.dump();
  Json props = Json::object();
  for (int i = 0; i < 3000; ++i) props["field_" + std::to_string(i)] = {{"type", "string"}};
  body = {{"model", "test-model"},
          {"prompt", {1, 2}},
          {"max_tokens", 2},
          {"response_format",
           {{"type", "json_schema"},
            {"json_schema", {{"name", "x"}, {"schema", {{"type", "object"}, {"properties", props}}}}}}}};
  r = post("/v1/completions", body.dump());
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(Json::parse(r.body)["error"]["param"], "response_format") << r.body.substr(0, 300);
  expect_still_serving();
}

TEST_F(ServerSecurityTest, TokenAndSampleCountsAreBounded) {
  // n over --max-n, max_tokens over the context: 400s naming the field.
  auto r = post("/v1/completions", Json({{"model", "test-model"}, {"prompt", {1}}, {"n", 17}}).dump());
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(Json::parse(r.body)["error"]["param"], "n");
  r = post("/v1/completions", Json({{"model", "test-model"}, {"prompt", {1}}, {"max_tokens", 1 << 30}}).dump());
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(Json::parse(r.body)["error"]["param"], "max_tokens");
  expect_still_serving();
}

}  // namespace
}  // namespace deepinfer::testing
