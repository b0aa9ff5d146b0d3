// The HTTP server driven over real loopback sockets: OpenAI routes, streaming, errors, auth, limits, client
// disconnects and concurrency, on the golden V4.1 fixture model (random weights, CPU backend).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <regex>
#include <set>
#include <thread>

#include <boost/asio.hpp>
#include <nlohmann/json.hpp>

#include "deepinfer/io/safetensors.h"
#include "server/server_test_util.h"

namespace deepinfer::testing {
namespace {

using Json = nlohmann::json;

std::string golden_dir() { return test_data_dir() + "/golden/deepseek_v41"; }

std::vector<int64_t> golden_ids(const std::string& name) {
  auto f = SafetensorsFile::open(golden_dir() + "/golden.safetensors");
  Tensor t = f->tensor(name);
  return std::vector<int64_t>(t.data_as<int64_t>(), t.data_as<int64_t>() + t.numel());
}

// One server on the chat fixture for the whole suite (loading is cheap but not free).
class ServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    server_ = TestServer::start(make_chat_fixture_dir(dir_->file("model"))).release();
  }
  static void TearDownTestSuite() {
    delete server_;
    delete dir_;
  }
  static HttpResult post(const std::string& path, const Json& body) {
    return http_request(server_->port, "POST", path, body.dump());
  }
  static Json chat_body(const std::string& text, int max_tokens) {
    return {{"model", "test-model"},
            {"messages", {{{"role", "user"}, {"content", text}}}},
            {"max_tokens", max_tokens},
            {"ignore_eos", true}};
  }
  static void wait_idle() {
    for (int i = 0; i < 500 && server_->engine->active_requests() > 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    EXPECT_EQ(server_->engine->active_requests(), 0);
  }
  static TempDir* dir_;
  static TestServer* server_;
};
TempDir* ServerTest::dir_ = nullptr;
TestServer* ServerTest::server_ = nullptr;

TEST_F(ServerTest, HealthAndModels) {
  auto h = http_request(server_->port, "GET", "/health");
  EXPECT_EQ(h.status, 200);
  auto m = http_request(server_->port, "GET", "/v1/models");
  ASSERT_EQ(m.status, 200);
  Json j = Json::parse(m.body);
  ASSERT_EQ(j["data"].size(), 1u);
  EXPECT_EQ(j["data"][0]["id"], "test-model");
  EXPECT_EQ(http_request(server_->port, "GET", "/nope").status, 404);
  EXPECT_EQ(http_request(server_->port, "GET", "/v1/chat/completions").status, 405);
}

// Greedy completion of the golden prompt through HTTP gives transformers' greedy continuation.
TEST(ServerGolden, GreedyCompletionMatchesTransformers) {
  auto s = TestServer::start(golden_dir());
  const auto prompt = golden_ids("prompt0.input_ids");
  const auto expected = golden_ids("prompt0.generated_ids");
  Json body = {{"model", "test-model"}, {"prompt", prompt},   {"max_tokens", expected.size()},
               {"temperature", 0},      {"ignore_eos", true}, {"return_token_ids", true}};
  auto r = http_request(s->port, "POST", "/v1/completions", body.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  Json j = Json::parse(r.body);
  EXPECT_EQ(j["choices"][0]["token_ids"].get<std::vector<int64_t>>(), expected);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["prompt_tokens"], prompt.size());
  EXPECT_EQ(j["usage"]["completion_tokens"], expected.size());
  // The text is the tokenizer's decode of those ids (WordLevel: space separated).
  const auto& tok = *s->host->tokenizer();
  std::vector<int32_t> ids(expected.begin(), expected.end());
  EXPECT_EQ(j["choices"][0]["text"], tok.decode(ids, /*skip_special_tokens=*/true));

  // Streaming gives the same tokens, then a usage chunk and [DONE].
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  auto st = http_request(s->port, "POST", "/v1/completions", body.dump());
  ASSERT_EQ(st.status, 200);
  EXPECT_EQ(st.header("Content-Type"), "text/event-stream");
  auto lines = sse_data_lines(st.body);
  ASSERT_GE(lines.size(), 3u);
  EXPECT_EQ(lines.back(), "[DONE]");
  std::vector<int64_t> streamed;
  std::string text;
  for (size_t i = 0; i + 2 < lines.size(); ++i) {
    Json c = Json::parse(lines[i]);
    ASSERT_EQ(c["choices"].size(), 1u);
    for (auto& t : c["choices"][0]["token_ids"]) streamed.push_back(t.get<int64_t>());
    text += c["choices"][0]["text"].get<std::string>();
  }
  EXPECT_EQ(streamed, expected);
  EXPECT_EQ(text, j["choices"][0]["text"].get<std::string>());
  Json usage = Json::parse(lines[lines.size() - 2]);
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["completion_tokens"], expected.size());
}

TEST_F(ServerTest, ChatNonStreamingAndStreamingAgreeWithSeed) {
  Json body = chat_body("w1 w2 w3", 12);
  body["temperature"] = 0.8;
  body["seed"] = 1234;
  body["n"] = 2;
  auto r = post("/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  Json j = Json::parse(r.body);
  ASSERT_EQ(j["choices"].size(), 2u);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["usage"]["completion_tokens"], 24);
  // usage.prompt_tokens is the chat encoding's length, as /tokenize reports it.
  auto tk = post("/tokenize", {{"model", "test-model"}, {"messages", body["messages"]}});
  ASSERT_EQ(tk.status, 200) << tk.body;
  EXPECT_EQ(j["usage"]["prompt_tokens"], Json::parse(tk.body)["count"]);

  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  auto s = post("/v1/chat/completions", body);
  ASSERT_EQ(s.status, 200);
  auto lines = sse_data_lines(s.body);
  ASSERT_EQ(lines.back(), "[DONE]");
  std::string content[2], reasoning[2], finish[2];
  bool saw_role[2] = {false, false};
  int usage_chunks = 0;
  for (size_t i = 0; i + 1 < lines.size(); ++i) {
    Json c = Json::parse(lines[i]);
    EXPECT_EQ(c["object"], "chat.completion.chunk");
    if (c["choices"].empty()) {
      ++usage_chunks;
      EXPECT_EQ(c["usage"]["completion_tokens"], 24);
      continue;
    }
    int idx = c["choices"][0]["index"];
    const Json& d = c["choices"][0]["delta"];
    if (d.contains("role")) saw_role[idx] = true;
    if (d.contains("content")) content[idx] += d["content"].get<std::string>();
    if (d.contains("reasoning_content")) reasoning[idx] += d["reasoning_content"].get<std::string>();
    if (!c["choices"][0]["finish_reason"].is_null()) finish[idx] = c["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(usage_chunks, 1);
  for (int i = 0; i < 2; ++i) {
    EXPECT_TRUE(saw_role[i]);
    const Json& m = j["choices"][i]["message"];
    EXPECT_EQ(content[i], m["content"].is_null() ? "" : m["content"].get<std::string>()) << i;
    EXPECT_EQ(finish[i], j["choices"][i]["finish_reason"].get<std::string>());
  }
  wait_idle();
}

// Thinking on / off (and OpenAI's reasoning_effort, Anthropic's thinking block) reaches the chat encoding and the
// output split: with thinking on and no `</think>` in the (random) output, everything generated is reasoning.
TEST_F(ServerTest, ThinkingAndReasoningEffort) {
  auto prompt_and_message = [&](const char* key, Json value) {
    Json body = chat_body("w1 w2", 4);
    body["temperature"] = 0;
    if (key) body[key] = value;
    auto r = post("/v1/chat/completions", body);
    EXPECT_EQ(r.status, 200) << r.body;
    Json j = Json::parse(r.body);
    return std::make_pair(j["usage"]["prompt_tokens"].get<int>(), j["choices"][0]["message"]);
  };
  auto [off_len, off] = prompt_and_message(nullptr, nullptr);
  auto [on_len, on] = prompt_and_message("thinking", true);
  auto [eff_len, eff] = prompt_and_message("reasoning_effort", "high");
  auto [none_len, none] = prompt_and_message("reasoning_effort", "none");
  EXPECT_FALSE(off.contains("reasoning_content")) << off.dump();
  ASSERT_TRUE(on.contains("reasoning_content")) << on.dump();
  EXPECT_FALSE(on["reasoning_content"].get<std::string>().empty()) << on.dump();
  EXPECT_TRUE(eff.contains("reasoning_content")) << eff.dump();
  EXPECT_EQ(none_len, off_len);
  EXPECT_EQ(none, off);
  // The encoding itself changes with thinking (V4.1 opens the assistant turn with <think> instead of </think>).
  auto tk_off = post("/tokenize", {{"model", "test-model"}, {"messages", chat_body("w1 w2", 4)["messages"]}});
  auto tk_on =
      post("/tokenize", {{"model", "test-model"}, {"messages", chat_body("w1 w2", 4)["messages"]}, {"thinking", true}});
  EXPECT_NE(Json::parse(tk_off.body)["tokens"], Json::parse(tk_on.body)["tokens"]);
  EXPECT_EQ(Json::parse(tk_off.body)["count"], off_len);
  EXPECT_EQ(Json::parse(tk_on.body)["count"], on_len);
  (void)eff_len;
  Json msg = {{"model", "test-model"},
              {"max_tokens", 4},
              {"temperature", 0},
              {"thinking", {{"type", "enabled"}, {"budget_tokens", 1024}}},
              {"messages", {{{"role", "user"}, {"content", "w1 w2"}}}}};
  auto m = post("/v1/messages", msg);
  ASSERT_EQ(m.status, 200) << m.body;
  EXPECT_EQ(Json::parse(m.body)["content"][0]["type"], "thinking") << m.body;
  wait_idle();
}

TEST_F(ServerTest, ChatLogprobs) {
  Json body = chat_body("w5", 4);
  body["logprobs"] = true;
  body["top_logprobs"] = 3;
  auto r = post("/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  Json lp = Json::parse(r.body)["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(lp.size(), 4u);
  for (const auto& e : lp) {
    EXPECT_LE(e["logprob"].get<double>(), 0.0);
    ASSERT_EQ(e["top_logprobs"].size(), 3u);
    EXPECT_GE(e["top_logprobs"][0]["logprob"].get<double>(), e["top_logprobs"][2]["logprob"].get<double>());
  }
}

TEST_F(ServerTest, BadRequestsAreOpenAIErrorsNamingTheField) {
  struct Case {
    std::string body;
    int status;
    std::string param;
  };
  Json ok = chat_body("w1", 2);
  auto with = [&](const char* k, Json v) {
    Json b = ok;
    b[k] = v;
    return b.dump();
  };
  const std::vector<Case> cases = {
      {"{not json", 400, "body"},
      {"[1,2]", 400, "body"},
      {with("model", "other"), 404, "model"},
      {with("temperature", "hot"), 400, "temperature"},
      {with("temperature", -1), 400, "temperature"},
      {with("top_p", 1.5), 400, "top_p"},
      {with("top_k", -5), 400, "top_k"},
      {with("min_p", 2), 400, "min_p"},
      {with("presence_penalty", 3), 400, "presence_penalty"},
      {with("frequency_penalty", "x"), 400, "frequency_penalty"},
      {with("max_tokens", 0), 400, "max_tokens"},
      {with("max_tokens", 100000), 400, "max_tokens"},
      {with("n", 0), 400, "n"},
      {with("n", 1000), 400, "n"},
      {with("stop", 5), 400, "stop"},
      {with("seed", "abc"), 400, "seed"},
      {with("top_logprobs", 50), 400, "top_logprobs"},
      {with("logit_bias", {{"5", 10}}), 400, "logit_bias"},
      {with("response_format", {{"type", "xml"}}), 400, "response_format"},
      {with("messages", "hello"), 400, "messages"},
      {with("messages", Json::array()), 400, "messages"},
      {with("messages", {{{"role", "robot"}, {"content", "x"}}}), 400, "messages"},
      {with("stream", "yes"), 400, "stream"},
  };
  for (const auto& c : cases) {
    auto r = http_request(server_->port, "POST", "/v1/chat/completions", c.body);
    EXPECT_EQ(r.status, c.status) << c.body << " -> " << r.body;
    Json j = Json::parse(r.body, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << r.body;
    ASSERT_TRUE(j.contains("error")) << r.body;
    EXPECT_EQ(j["error"]["param"], c.param) << c.body << " -> " << r.body;
    EXPECT_FALSE(j["error"]["message"].get<std::string>().empty());
  }
  // A prompt longer than the context (1024 tokens).
  std::string longp;
  for (int i = 0; i < 1100; ++i) longp += "w1 ";
  auto r = post("/v1/completions", {{"model", "test-model"}, {"prompt", longp}});
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(Json::parse(r.body)["error"]["code"], "context_length_exceeded");
  // Prompt + max_tokens over the context, each alone within it: 400 naming max_tokens.
  std::vector<int> p600(600, 5);
  r = post("/v1/completions", {{"model", "test-model"}, {"prompt", p600}, {"max_tokens", 600}});
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_EQ(Json::parse(r.body)["error"]["code"], "context_length_exceeded");
  EXPECT_EQ(Json::parse(r.body)["error"]["param"], "max_tokens");
  r = post("/v1/completions", {{"model", "test-model"}, {"prompt", {1, 2, 99999}}});
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(Json::parse(r.body)["error"]["param"], "prompt");
  wait_idle();
}

TEST_F(ServerTest, StopStringIsCutFromTheOutput) {
  // Greedy output first, then the same request stopping at its third token's text.
  Json body = {
      {"model", "test-model"}, {"prompt", "w7 w8"}, {"max_tokens", 8}, {"temperature", 0}, {"ignore_eos", true}};
  Json full = Json::parse(post("/v1/completions", body).body);
  std::string text = full["choices"][0]["text"];
  auto sp = text.find(' ', text.find(' ') + 1);  // start of the third word
  ASSERT_NE(sp, std::string::npos) << text;
  std::string third = text.substr(sp, text.find(' ', sp + 1) - sp);
  body["stop"] = {third};
  for (bool stream : {false, true}) {
    body["stream"] = stream;
    auto r = post("/v1/completions", body);
    ASSERT_EQ(r.status, 200);
    std::string got, finish;
    if (!stream) {
      Json j = Json::parse(r.body);
      got = j["choices"][0]["text"];
      finish = j["choices"][0]["finish_reason"];
    } else {
      for (const auto& l : sse_data_lines(r.body)) {
        if (l == "[DONE]") break;
        Json c = Json::parse(l);
        got += c["choices"][0]["text"].get<std::string>();
        if (!c["choices"][0]["finish_reason"].is_null()) finish = c["choices"][0]["finish_reason"];
      }
    }
    EXPECT_EQ(got, text.substr(0, text.find(third))) << "stream=" << stream;
    EXPECT_EQ(finish, "stop");
  }
}

TEST(ServerAuth, ApiKeyGuardsEveryRouteButHealth) {
  TempDir dir;
  server::HttpServerOptions opt;
  opt.api_key = "sekret";
  opt.max_body_bytes = 4096;
  auto s = TestServer::start(golden_dir(), opt);
  EXPECT_EQ(http_request(s->port, "GET", "/health").status, 200);
  auto r = http_request(s->port, "GET", "/v1/models");
  EXPECT_EQ(r.status, 401);
  EXPECT_EQ(Json::parse(r.body)["error"]["code"], "invalid_api_key");
  EXPECT_EQ(http_request(s->port, "GET", "/v1/models", "", {{"Authorization", "Bearer wrong"}}).status, 401);
  EXPECT_EQ(http_request(s->port, "GET", "/metrics").status, 401);
  EXPECT_EQ(http_request(s->port, "GET", "/v1/models", "", {{"Authorization", "Bearer sekret"}}).status, 200);
  EXPECT_EQ(http_request(s->port, "GET", "/v1/models", "", {{"x-api-key", "sekret"}}).status, 200);
  // Every inference route, before its body is even parsed; Anthropic routes answer in Anthropic's shape.
  for (const char* path : {"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages",
                           "/v1/messages/count_tokens", "/tokenize", "/detokenize"}) {
    auto u = http_request(s->port, "POST", path, R"({"model": "test-model"})", {{"Authorization", "Bearer wrong"}});
    EXPECT_EQ(u.status, 401) << path;
    Json j = Json::parse(u.body);
    if (std::string(path).rfind("/v1/messages", 0) == 0)
      EXPECT_EQ(j["error"]["type"], "authentication_error") << path << " " << u.body;
    else
      EXPECT_EQ(j["error"]["code"], "invalid_api_key") << path << " " << u.body;
  }
  // Body over the limit: 413, and the server keeps serving.
  auto big =
      http_request(s->port, "POST", "/v1/completions", std::string(10000, ' '), {{"Authorization", "Bearer sekret"}});
  EXPECT_EQ(big.status, 413);
  EXPECT_EQ(http_request(s->port, "GET", "/health").status, 200);
}

// A client that disconnects mid-stream gets its request aborted: the engine ends up idle with every KV block
// back, long before the request's max_tokens would have run out.
TEST_F(ServerTest, DisconnectMidStreamAbortsTheRequest) {
  namespace net = boost::asio;
  for (bool stream : {true, false}) {
    net::io_context ioc;
    net::ip::tcp::socket sock(ioc);
    sock.connect({net::ip::make_address("127.0.0.1"), server_->port});
    Json body = {
        {"model", "test-model"}, {"prompt", "w1 w2"}, {"max_tokens", 1000}, {"ignore_eos", true}, {"stream", stream}};
    std::string b = body.dump();
    std::string req = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
                      std::to_string(b.size()) + "\r\n\r\n" + b;
    net::write(sock, net::buffer(req));
    if (stream) {
      char buf[256];
      size_t n = sock.read_some(net::buffer(buf));  // the header / first chunk: generation has started
      EXPECT_GT(n, 0u);
    } else {
      for (int i = 0; i < 200 && server_->engine->active_requests() == 0; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      EXPECT_EQ(server_->engine->active_requests(), 1);
    }
    sock.close();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 500 && server_->engine->active_requests() > 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    EXPECT_EQ(server_->engine->active_requests(), 0) << "stream=" << stream;
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  }
  // Exact, not eventually: the gauges are published before the request stops counting as active.
  auto m = http_request(server_->port, "GET", "/metrics");
  EXPECT_NE(m.body.find("deepinfer_kv_cache_usage_perc{model_name=\"test-model\"} 0\n"), std::string::npos) << m.body;
  EXPECT_NE(m.body.find("finished_reason=\"aborted\"} 2"), std::string::npos);
}

// 32 clients at once: each gets exactly one complete answer with its own id.
TEST_F(ServerTest, ConcurrentRequestsAreEachAnsweredOnce) {
  constexpr int kClients = 32;
  std::vector<std::thread> threads;
  std::vector<HttpResult> results(kClients);
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      Json body = {{"model", "test-model"},
                   {"prompt", "w" + std::to_string(i) + " w3"},
                   {"max_tokens", 3 + i % 5},
                   {"ignore_eos", true},
                   {"stream", i % 2 == 0}};
      results[i] = http_request(server_->port, "POST", "/v1/completions", body.dump());
    });
  }
  for (auto& t : threads) t.join();
  std::set<std::string> ids;
  for (int i = 0; i < kClients; ++i) {
    ASSERT_EQ(results[i].status, 200) << results[i].body;
    int tokens = 0;
    std::string id;
    if (i % 2 == 0) {
      auto lines = sse_data_lines(results[i].body);
      ASSERT_EQ(lines.back(), "[DONE]");
      int finishes = 0;
      for (size_t k = 0; k + 1 < lines.size(); ++k) {
        Json c = Json::parse(lines[k]);
        id = c["id"];
        if (!c["choices"][0]["finish_reason"].is_null()) ++finishes;
      }
      EXPECT_EQ(finishes, 1);
      tokens = 3 + i % 5;
    } else {
      Json j = Json::parse(results[i].body);
      id = j["id"];
      tokens = j["usage"]["completion_tokens"];
    }
    EXPECT_EQ(tokens, 3 + i % 5);
    ids.insert(id);
  }
  EXPECT_EQ(ids.size(), static_cast<size_t>(kClients));
  wait_idle();
}

TEST(ServerLimits, FullQueueAnswers429WithRetryAfter) {
  auto s = TestServer::start(golden_dir(), {}, /*max_active=*/1, /*max_num_seqs=*/1);
  std::thread slow([&] {
    Json body = {{"model", "test-model"}, {"prompt", {1, 2}}, {"max_tokens", 300}, {"ignore_eos", true}};
    http_request(s->port, "POST", "/v1/completions", body.dump());
  });
  for (int i = 0; i < 500 && s->engine->active_requests() == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  auto r = http_request(s->port, "POST", "/v1/completions",
                        Json({{"model", "test-model"}, {"prompt", {1}}, {"max_tokens", 1}}).dump());
  EXPECT_EQ(r.status, 429);
  EXPECT_EQ(r.header("Retry-After"), "1");
  slow.join();
}

TEST_F(ServerTest, MetricsCountTokensAndLatencies) {
  // The same 200-token prompt twice: the second finds its full blocks in the prefix cache.
  std::vector<int> prompt;
  for (int i = 0; i < 200; ++i) prompt.push_back((i * 37) % 400);
  for (int rep = 0; rep < 2; ++rep)
    post("/v1/completions", {{"model", "test-model"}, {"prompt", prompt}, {"max_tokens", 3}, {"ignore_eos", true}});
  auto m = http_request(server_->port, "GET", "/metrics");
  std::smatch hits;
  ASSERT_TRUE(std::regex_search(m.body, hits, std::regex("deepinfer_prefix_cache_hits_total\\{[^}]*\\} (\\d+)")));
  EXPECT_GE(std::stoi(hits[1]), 128) << m.body;
  ASSERT_EQ(m.status, 200);
  for (const char* name :
       {"deepinfer_num_requests_running", "deepinfer_num_requests_waiting", "deepinfer_kv_cache_usage_perc",
        "deepinfer_prefix_cache_hit_rate", "deepinfer_prompt_tokens_total", "deepinfer_generation_tokens_total",
        "deepinfer_time_to_first_token_seconds_bucket", "deepinfer_inter_token_latency_seconds_count",
        "deepinfer_e2e_request_latency_seconds_sum", "deepinfer_spec_decode_num_draft_tokens_total",
        "deepinfer_spec_decode_num_accepted_tokens_total", "deepinfer_spec_decode_acceptance_rate"})
    EXPECT_NE(m.body.find(name), std::string::npos) << name;
  EXPECT_EQ(m.body.find("deepinfer_generation_tokens_total{model_name=\"test-model\"} 0\n"), std::string::npos);
}

}  // namespace
}  // namespace deepinfer::testing

namespace deepinfer::testing {
namespace {

// Structured output through the API: the V3 golden model with a byte-level BPE tokenizer (WordLevel's separators
// rule it out for the V4.1 fixture, which must answer 400 saying why).
TEST(ServerStructured, JsonSchemaOutputParsesAndBadSchemasAre400) {
  namespace fs = std::filesystem;
  TempDir dir;
  const std::string src = test_data_dir() + "/golden/deepseek_v3";
  const std::string model = dir.file("v3");
  fs::create_directories(model);
  fs::copy_file(src + "/config.json", model + "/config.json");
  fs::create_symlink(fs::absolute(src + "/model.safetensors"), model + "/model.safetensors");
  fs::copy_file(test_data_dir() + "/tokenizer/synthetic_bpe.json", model + "/tokenizer.json");
  auto s = TestServer::start(model);
  const Json schema = {{"type", "object"},
                       {"properties", {{"color", {{"enum", {"red", "green", "blue"}}}}}},
                       {"required", {"color"}},
                       {"additionalProperties", false}};
  for (bool stream : {false, true}) {
    Json body = {{"model", "test-model"},
                 {"prompt", {5, 6, 7}},
                 {"max_tokens", 300},
                 {"seed", 7},
                 {"stream", stream},
                 {"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "c"}, {"schema", schema}}}}}};
    auto r = http_request(s->port, "POST", "/v1/completions", body.dump());
    ASSERT_EQ(r.status, 200) << r.body;
    std::string text, finish;
    if (stream) {
      for (const auto& l : sse_data_lines(r.body)) {
        if (l == "[DONE]") break;
        Json c = Json::parse(l);
        text += c["choices"][0]["text"].get<std::string>();
        if (!c["choices"][0]["finish_reason"].is_null()) finish = c["choices"][0]["finish_reason"];
      }
    } else {
      Json j = Json::parse(r.body);
      text = j["choices"][0]["text"];
      finish = j["choices"][0]["finish_reason"];
    }
    EXPECT_EQ(finish, "stop") << text;
    Json out = Json::parse(text, nullptr, false);
    ASSERT_TRUE(out.is_object()) << text;
    ASSERT_EQ(out.size(), 1u) << text;
    const std::string color = out["color"];
    EXPECT_TRUE(color == "red" || color == "green" || color == "blue") << text;
  }
  Json bad = {{"model", "test-model"},
              {"prompt", {5}},
              {"response_format", {{"type", "json_schema"}, {"json_schema", {{"schema", "{not json"}}}}}};
  auto r = http_request(s->port, "POST", "/v1/completions", bad.dump());
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_EQ(Json::parse(r.body)["error"]["param"], "response_format");
  bad = {{"model", "test-model"}, {"prompt", {5}}, {"regex", "a(b"}};
  r = http_request(s->port, "POST", "/v1/completions", bad.dump());
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_EQ(Json::parse(r.body)["error"]["param"], "regex");
  // json_object: any JSON object.
  Json jo = {{"model", "test-model"},
             {"prompt", {5, 6}},
             {"max_tokens", 200},
             {"seed", 3},
             {"response_format", {{"type", "json_object"}}}};
  r = http_request(s->port, "POST", "/v1/completions", jo.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  Json jc = Json::parse(r.body)["choices"][0];
  if (jc["finish_reason"] == "stop") {
    EXPECT_TRUE(Json::parse(jc["text"].get<std::string>(), nullptr, false).is_object()) << jc.dump();
  } else {  // cut by max_tokens: still a prefix of an object
    const std::string t = jc["text"];
    EXPECT_EQ(t[t.find_first_not_of(" \t\n\r")], '{') << jc.dump();
  }
  bad = {{"model", "test-model"}, {"prompt", {5}}, {"grammar", "root ::= \"a\" undefined_rule"}};
  r = http_request(s->port, "POST", "/v1/completions", bad.dump());
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_EQ(Json::parse(r.body)["error"]["param"], "grammar");
  // A GBNF grammar constraint: the output is in its language.
  Json gr = {
      {"model", "test-model"}, {"prompt", {5}}, {"max_tokens", 50}, {"grammar", "root ::= (\"yes\" | \"no\") \"!\""}};
  r = http_request(s->port, "POST", "/v1/completions", gr.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  const std::string g = Json::parse(r.body)["choices"][0]["text"];
  EXPECT_TRUE(g == "yes!" || g == "no!") << g;
  // A regex constraint: the whole output matches it.
  Json rx = {{"model", "test-model"}, {"prompt", {5}}, {"max_tokens", 50}, {"regex", "(ab|cd){2}x"}};
  r = http_request(s->port, "POST", "/v1/completions", rx.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  const std::string t = Json::parse(r.body)["choices"][0]["text"];
  EXPECT_TRUE(std::regex_match(t, std::regex("(ab|cd){2}x"))) << t;
}

TEST_F(ServerTest, StructuredOutputUnavailableIsAClear400) {
  Json body = chat_body("w1", 4);
  body["response_format"] = {{"type", "json_object"}};
  auto r = post("/v1/chat/completions", body);
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body.find("structured output is not available"), std::string::npos) << r.body;
}

}  // namespace
}  // namespace deepinfer::testing

namespace deepinfer::testing {
namespace {

using OJson = nlohmann::ordered_json;

// Feeds a job the fixture's tool-call markup as model output (ids of the renamed DSML tokens) and returns the
// rendered non-streaming body.
std::string render_tool_call(server::PreparedGeneration& g, bool thinking_text = false) {
  // "<｜DSML｜ calls> <｜DSML｜ invoke name="get_weather"> <｜DSML｜ parameter name="days" ...> w3
  //  </｜DSML｜ parameter> </｜DSML｜ invoke> </｜DSML｜ calls>"
  std::vector<int32_t> ids;
  if (thinking_text) ids.push_back(12);  // some content first: w3
  for (int k : {9, 11, 13}) ids.push_back(chat_fixture_id(k));
  ids.push_back(12);
  for (int k : {14, 12, 10}) ids.push_back(chat_fixture_id(k));
  SequenceDelta d;
  d.request_id = g.request.request_id;
  d.new_token_ids = ids;
  d.finished = true;
  d.stop_reason = StopReason::kEos;
  g.job->on_delta(d);
  EXPECT_TRUE(g.job->done());
  return g.job->epilogue();
}

TEST_F(ServerTest, ToolCallsAreRenderedPerProtocol) {
  const OJson tools = OJson::parse(R"([{"type": "function", "function": {"name": "get_weather",
      "parameters": {"type": "object", "properties": {"days": {"type": "string"}}}}}])");
  OJson chat = {{"model", "test-model"}, {"messages", {{{"role", "user"}, {"content", "w1"}}}}, {"tools", tools}};
  auto g = server_->api->chat_completions(chat);
  Json c = Json::parse(render_tool_call(g));
  EXPECT_EQ(c["choices"][0]["finish_reason"], "tool_calls");
  const Json& call = c["choices"][0]["message"]["tool_calls"][0];
  EXPECT_EQ(call["type"], "function");
  EXPECT_EQ(call["function"]["name"], "get_weather");
  EXPECT_TRUE(Json::parse(call["function"]["arguments"].get<std::string>()).contains("days"));
  EXPECT_TRUE(c["choices"][0]["message"]["content"].is_null());

  OJson msg = {{"model", "test-model"},
               {"max_tokens", 8},
               {"messages", {{{"role", "user"}, {"content", "w1"}}}},
               {"tools", {{{"name", "get_weather"}, {"input_schema", {{"type", "object"}}}}}}};
  auto gm = server_->api->messages(msg);
  Json m = Json::parse(render_tool_call(gm, true));
  EXPECT_EQ(m["stop_reason"], "tool_use");
  ASSERT_EQ(m["content"].size(), 2u) << m.dump();
  EXPECT_EQ(m["content"][0]["type"], "text");
  EXPECT_EQ(m["content"][1]["type"], "tool_use");
  EXPECT_EQ(m["content"][1]["name"], "get_weather");
  EXPECT_TRUE(m["content"][1]["input"].contains("days"));

  OJson resp = {{"model", "test-model"}, {"input", "w1"}, {"tools", {{{"type", "function"}, {"name", "get_weather"}}}}};
  auto gr = server_->api->responses(resp);
  Json r = Json::parse(render_tool_call(gr));
  ASSERT_EQ(r["output"].size(), 1u) << r.dump();
  EXPECT_EQ(r["output"][0]["type"], "function_call");
  EXPECT_EQ(r["output"][0]["name"], "get_weather");
}

std::vector<std::pair<std::string, Json>> sse_events(const std::string& body) {
  std::vector<std::pair<std::string, Json>> out;
  std::string event;
  size_t pos = 0;
  while (pos < body.size()) {
    size_t nl = body.find('\n', pos);
    if (nl == std::string::npos) nl = body.size();
    std::string line = body.substr(pos, nl - pos);
    if (line.rfind("event: ", 0) == 0) event = line.substr(7);
    if (line.rfind("data: ", 0) == 0) out.emplace_back(event, Json::parse(line.substr(6)));
    pos = nl + 1;
  }
  return out;
}

TEST_F(ServerTest, AnthropicMessagesStreamingAndNot) {
  Json body = {{"model", "test-model"},
               {"max_tokens", 6},
               {"system", "w9"},
               {"messages", {{{"role", "user"}, {"content", {{{"type", "text"}, {"text", "w1 w2"}}}}}}},
               {"temperature", 0}};
  auto r = post("/v1/messages", body);
  ASSERT_EQ(r.status, 200) << r.body;
  Json m = Json::parse(r.body);
  EXPECT_EQ(m["type"], "message");
  EXPECT_EQ(m["role"], "assistant");
  auto ct =
      post("/v1/messages/count_tokens", {{"model", "test-model"}, {"system", "w9"}, {"messages", body["messages"]}});
  ASSERT_EQ(ct.status, 200) << ct.body;
  EXPECT_EQ(m["usage"]["input_tokens"], Json::parse(ct.body)["input_tokens"]);
  std::string text;
  for (const auto& b : m["content"])
    if (b["type"] == "text") text += b["text"].get<std::string>();
  if (m["stop_reason"] == "max_tokens") {
    EXPECT_EQ(m["usage"]["output_tokens"], 6);
  }

  body["stream"] = true;
  auto s = post("/v1/messages", body);
  ASSERT_EQ(s.status, 200);
  auto ev = sse_events(s.body);
  ASSERT_GE(ev.size(), 3u);
  EXPECT_EQ(ev.front().first, "message_start");
  EXPECT_EQ(ev.back().first, "message_stop");
  EXPECT_EQ(ev[ev.size() - 2].first, "message_delta");
  EXPECT_EQ(ev[ev.size() - 2].second["delta"]["stop_reason"], m["stop_reason"]);
  std::string streamed;
  int open = 0;
  for (const auto& [name, data] : ev) {
    EXPECT_EQ(data["type"], name);
    if (name == "content_block_start") ++open;
    if (name == "content_block_stop") --open;
    if (name == "content_block_delta" && data["delta"]["type"] == "text_delta")
      streamed += data["delta"]["text"].get<std::string>();
  }
  EXPECT_EQ(open, 0);
  EXPECT_EQ(streamed, text);

  // Errors use Anthropic's shape.
  auto e = post("/v1/messages", {{"model", "test-model"}, {"messages", body["messages"]}});
  EXPECT_EQ(e.status, 400);
  Json ej = Json::parse(e.body);
  EXPECT_EQ(ej["type"], "error");
  EXPECT_EQ(ej["error"]["type"], "invalid_request_error");
  EXPECT_NE(ej["error"]["message"].get<std::string>().find("max_tokens"), std::string::npos);
}

TEST_F(ServerTest, ResponsesStreamingAndNot) {
  Json body = {{"model", "test-model"},  {"input", "w4 w5"}, {"instructions", "w1"},
               {"max_output_tokens", 5}, {"temperature", 0}, {"ignore_eos", true}};
  auto r = post("/v1/responses", body);
  ASSERT_EQ(r.status, 200) << r.body;
  Json j = Json::parse(r.body);
  EXPECT_EQ(j["object"], "response");
  EXPECT_EQ(j["status"], "incomplete");
  EXPECT_EQ(j["usage"]["output_tokens"], 5);
  std::string text;
  for (const auto& it : j["output"])
    if (it["type"] == "message") text += it["content"][0]["text"].get<std::string>();
  body["stream"] = true;
  auto s = post("/v1/responses", body);
  ASSERT_EQ(s.status, 200);
  auto ev = sse_events(s.body);
  ASSERT_GE(ev.size(), 3u);
  EXPECT_EQ(ev.front().first, "response.created");
  EXPECT_EQ(ev.back().first, "response.completed");
  std::string streamed;
  int64_t seq = 0;
  for (const auto& [name, data] : ev) {
    EXPECT_EQ(data["type"], name);
    EXPECT_EQ(data["sequence_number"], seq++);
    if (name == "response.output_text.delta") streamed += data["delta"].get<std::string>();
  }
  EXPECT_EQ(streamed, text);
  std::string final_text;
  for (const auto& it : ev.back().second["response"]["output"])
    if (it["type"] == "message") final_text += it["content"][0]["text"].get<std::string>();
  EXPECT_EQ(final_text, text);
}

// The fixture's tool call fed one token per delta to a streaming job; returns the whole SSE text.
std::string stream_tool_call(server::PreparedGeneration& g) {
  std::vector<int32_t> ids;
  for (int k : {9, 11, 13}) ids.push_back(chat_fixture_id(k));
  ids.push_back(12);
  for (int k : {14, 12, 10}) ids.push_back(chat_fixture_id(k));
  std::string out = g.job->prologue();
  for (size_t i = 0; i < ids.size(); ++i) {
    SequenceDelta d;
    d.request_id = g.request.request_id;
    d.new_token_ids = {ids[i]};
    d.finished = i + 1 == ids.size();
    d.stop_reason = d.finished ? StopReason::kEos : StopReason::kNone;
    out += g.job->on_delta(d);
  }
  EXPECT_TRUE(g.job->done());
  out += g.job->epilogue();
  if (auto done = out.find("data: [DONE]"); done != std::string::npos) out.erase(done);  // not JSON
  return out;
}

// max_tokens cuts the tool-call block: the non-streaming reply keeps the block's text as content (nothing can be
// called), a stream that already sent the call's pieces does not repeat it as content; both finish with "length".
TEST_F(ServerTest, TruncatedToolCallBlock) {
  OJson chat = {{"model", "test-model"}, {"messages", {{{"role", "user"}, {"content", "w1"}}}}};
  std::vector<int32_t> ids = {12};  // content "w3", then a block cut before </parameter>
  for (int k : {9, 11, 13}) ids.push_back(chat_fixture_id(k));
  ids.push_back(12);
  for (bool stream : {false, true}) {
    chat["stream"] = stream;
    auto g = server_->api->chat_completions(chat);
    std::string out = stream ? g.job->prologue() : "";
    for (size_t i = 0; i < ids.size(); ++i) {
      SequenceDelta d;
      d.request_id = g.request.request_id;
      d.new_token_ids = {ids[i]};
      d.finished = i + 1 == ids.size();
      d.stop_reason = d.finished ? StopReason::kMaxTokens : StopReason::kNone;
      out += g.job->on_delta(d);
    }
    out += g.job->epilogue();
    if (!stream) {
      Json c = Json::parse(out)["choices"][0];
      EXPECT_EQ(c["finish_reason"], "length");
      EXPECT_NE(c["message"]["content"].get<std::string>().find("DSML"), std::string::npos) << out;
      continue;
    }
    if (auto done = out.find("data: [DONE]"); done != std::string::npos) out.erase(done);
    std::string content, finish, name;
    for (const auto& [event, data] : sse_events(out)) {
      const Json& c = data["choices"][0];
      if (c["delta"].contains("content")) content += c["delta"]["content"].get<std::string>();
      if (c["delta"].contains("tool_calls") && c["delta"]["tool_calls"][0].contains("id"))
        name = c["delta"]["tool_calls"][0]["function"]["name"];
      if (!c["finish_reason"].is_null()) finish = c["finish_reason"];
    }
    EXPECT_EQ(name, "get_weather");
    EXPECT_EQ(content.find("DSML"), std::string::npos) << content;
    EXPECT_FALSE(content.empty());
    EXPECT_EQ(finish, "length");
  }
}

// Streamed tool calls arrive in pieces while the model writes them (name first, arguments in several pieces) and
// add up to the non-streaming reply's call, in each protocol's event shape.
TEST_F(ServerTest, ToolCallArgumentsStreamPerProtocol) {
  const OJson tools = OJson::parse(R"([{"type": "function", "function": {"name": "get_weather",
      "parameters": {"type": "object", "properties": {"days": {"type": "string"}}}}}])");
  OJson chat = {{"model", "test-model"}, {"messages", {{{"role", "user"}, {"content", "w1"}}}}, {"tools", tools}};
  auto whole = server_->api->chat_completions(chat);
  const Json want = Json::parse(render_tool_call(whole))["choices"][0]["message"]["tool_calls"][0];
  chat["stream"] = true;
  auto g = server_->api->chat_completions(chat);
  std::string name, args, finish;
  int pieces = 0;
  for (const auto& [event, data] : sse_events(stream_tool_call(g))) {
    if (!data.contains("choices")) continue;
    const Json& c = data["choices"][0];
    if (!c["finish_reason"].is_null()) finish = c["finish_reason"];
    if (!c["delta"].contains("tool_calls")) continue;
    const Json& tc = c["delta"]["tool_calls"][0];
    EXPECT_EQ(tc["index"], 0);
    if (tc.contains("id")) {
      EXPECT_TRUE(name.empty()) << "id and name come once";
      EXPECT_EQ(tc["type"], "function");
      name = tc["function"]["name"];
    }
    args += tc["function"]["arguments"].get<std::string>();
    ++pieces;
  }
  EXPECT_EQ(name, "get_weather");
  EXPECT_EQ(args, want["function"]["arguments"].get<std::string>());
  EXPECT_GE(pieces, 3) << "the arguments did not stream in pieces";
  EXPECT_EQ(finish, "tool_calls");

  OJson msg = {{"model", "test-model"},
               {"max_tokens", 8},
               {"messages", {{{"role", "user"}, {"content", "w1"}}}},
               {"tools", {{{"name", "get_weather"}, {"input_schema", {{"type", "object"}}}}}}};
  auto gm_whole = server_->api->messages(msg);
  const Json want_input = Json::parse(render_tool_call(gm_whole))["content"][0]["input"];
  msg["stream"] = true;
  auto gm = server_->api->messages(msg);
  std::string partial, stop_reason;
  int starts = 0, json_pieces = 0;
  for (const auto& [event, data] : sse_events(stream_tool_call(gm))) {
    if (event == "content_block_start" && data["content_block"]["type"] == "tool_use") {
      ++starts;
      EXPECT_EQ(data["content_block"]["name"], "get_weather");
      EXPECT_EQ(data["content_block"]["input"], Json::object());
    }
    if (event == "content_block_delta" && data["delta"]["type"] == "input_json_delta") {
      partial += data["delta"]["partial_json"].get<std::string>();
      ++json_pieces;
    }
    if (event == "message_delta") stop_reason = data["delta"]["stop_reason"];
  }
  EXPECT_EQ(starts, 1);
  EXPECT_GE(json_pieces, 2);
  EXPECT_EQ(Json::parse(partial), want_input);
  EXPECT_EQ(stop_reason, "tool_use");

  OJson resp = {{"model", "test-model"}, {"input", "w1"}, {"tools", {{{"type", "function"}, {"name", "get_weather"}}}}};
  auto gr_whole = server_->api->responses(resp);
  const Json want_item = Json::parse(render_tool_call(gr_whole))["output"][0];
  resp["stream"] = true;
  auto gr = server_->api->responses(resp);
  std::string deltas, done_args;
  Json final_output;
  for (const auto& [event, data] : sse_events(stream_tool_call(gr))) {
    if (event == "response.output_item.added") EXPECT_EQ(data["item"]["name"], "get_weather");
    if (event == "response.function_call_arguments.delta") deltas += data["delta"].get<std::string>();
    if (event == "response.function_call_arguments.done") done_args = data["arguments"];
    if (event == "response.completed") final_output = data["response"]["output"];
  }
  EXPECT_EQ(deltas, want_item["arguments"].get<std::string>());
  EXPECT_EQ(done_args, deltas);
  ASSERT_EQ(final_output.size(), 1u) << final_output.dump();
  EXPECT_EQ(final_output[0]["arguments"], want_item["arguments"]);
}

}  // namespace
}  // namespace deepinfer::testing
