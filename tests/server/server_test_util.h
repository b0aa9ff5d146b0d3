// Test helpers for the HTTP server: a fixture model directory whose tokenizer has the chat special tokens, a
// server running in-process on an ephemeral loopback port, and a small blocking HTTP client (Boost.Beast).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "deepinfer/server/engine_service.h"
#include "deepinfer/server/http_server.h"
#include "test_util.h"

namespace deepinfer::testing {

// tests/data/golden/deepseek_v41 with a tokenizer.json whose last vocabulary entries are renamed to the V4.1 chat
// special tokens and DSML tool-call pieces (added tokens, as in DeepSeek's real tokenizer). The weights are the
// golden random ones, so generated text is arbitrary but every id decodes.
std::string make_chat_fixture_dir(const std::string& dir);
// The renamed entries; entry k has id chat_fixture_id(k).
const std::vector<std::string>& chat_fixture_tokens();
int chat_fixture_id(int k);

struct TestServer {
  std::unique_ptr<server::ModelHost> host;
  std::unique_ptr<server::Metrics> metrics;
  std::unique_ptr<server::EngineService> engine;
  std::unique_ptr<server::ServerApi> api;
  std::unique_ptr<server::HttpServer> http;
  uint16_t port = 0;

  static std::unique_ptr<TestServer> start(const std::string& model_dir, server::HttpServerOptions http = {},
                                           int max_active = 256, int max_num_seqs = 8);
  ~TestServer();
};

struct HttpResult {
  int status = 0;
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string header(const std::string& name) const;
};

// One request on a fresh connection; returns the whole response (SSE bodies included).
HttpResult http_request(uint16_t port, const std::string& method, const std::string& target,
                        const std::string& body = {},
                        const std::vector<std::pair<std::string, std::string>>& headers = {});

// The `data:` payloads of an SSE body, in order.
std::vector<std::string> sse_data_lines(const std::string& body);

}  // namespace deepinfer::testing
