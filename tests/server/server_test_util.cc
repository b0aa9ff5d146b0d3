#include "server/server_test_util.h"

#include <filesystem>
#include <fstream>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

namespace deepinfer::testing {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;

const std::vector<std::string>& chat_fixture_tokens() {
  static const std::vector<std::string> t = {"<｜begin▁of▁sentence｜>",
                                             "<｜end▁of▁sentence｜>",
                                             "<｜User｜>",
                                             "<｜Assistant｜>",
                                             "<｜System｜>",
                                             "<｜latest_reminder｜>",
                                             "<think>",
                                             "</think>",
                                             "｜DSML｜",
                                             "<｜DSML｜ calls>",
                                             "</｜DSML｜ calls>",
                                             "<｜DSML｜ invoke name=\"get_weather\">",
                                             "</｜DSML｜ invoke>",
                                             "<｜DSML｜ parameter name=\"days\" string=\"false\">",
                                             "</｜DSML｜ parameter>"};
  return t;
}

// The golden vocabulary is w<i>, W<i>, ẁ<i>, v<4i+3> (ids 4i..4i+3); Engram folds the first three into one
// compressed id, so only v-entries are renamed (each stays its own compressed id, and the size stays 256).
int chat_fixture_id(int k) { return 511 - 4 * k; }
int chat_fixture_index(int id) {
  if (id % 4 != 3) return -1;
  const int k = (511 - id) / 4;
  return k < static_cast<int>(chat_fixture_tokens().size()) ? k : -1;
}

std::string make_chat_fixture_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  const std::string src = test_data_dir() + "/golden/deepseek_v41";
  fs::create_directories(dir);
  fs::copy_file(src + "/config.json", dir + "/config.json", fs::copy_options::overwrite_existing);
  fs::create_symlink(fs::absolute(src + "/model.safetensors"), dir + "/model.safetensors");
  nlohmann::ordered_json tok = nlohmann::ordered_json::parse(read_file_or_empty(src + "/tokenizer.json"));
  auto& vocab = tok["model"]["vocab"];
  const auto& names = chat_fixture_tokens();
  nlohmann::ordered_json renamed = nlohmann::ordered_json::object();
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    const int id = it.value().get<int>();
    const int k = chat_fixture_index(id);
    renamed[k >= 0 ? names[static_cast<size_t>(k)] : it.key()] = id;
  }
  vocab = renamed;
  auto& added = tok["added_tokens"];
  for (size_t i = 0; i < names.size(); ++i)
    added.push_back({{"id", chat_fixture_id(static_cast<int>(i))},
                     {"content", names[i]},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  write_file(dir + "/tokenizer.json", tok.dump());
  return dir;
}

std::unique_ptr<TestServer> TestServer::start(const std::string& model_dir, server::HttpServerOptions http,
                                              int max_active, int max_num_seqs) {
  auto s = std::make_unique<TestServer>();
  server::ModelHostOptions mo;
  mo.model_dir = model_dir;
  mo.served_model_name = "test-model";
  mo.threads = 1;
  mo.max_num_seqs = max_num_seqs;
  mo.kv_budget_mb = 64;
  s->host = server::ModelHost::load(mo);
  s->metrics = std::make_unique<server::Metrics>();
  s->engine = std::make_unique<server::EngineService>(*s->host, *s->metrics, server::EngineServiceOptions{max_active});
  server::RequestLimits limits;
  s->api = std::make_unique<server::ServerApi>(*s->host, limits);
  http.host = "127.0.0.1";
  http.port = 0;
  s->http = std::make_unique<server::HttpServer>(*s->api, *s->engine, *s->metrics, http);
  s->http->start();
  s->port = s->http->port();
  return s;
}

TestServer::~TestServer() {
  if (http) http->stop();
}

std::string HttpResult::header(const std::string& name) const {
  for (const auto& [k, v] : headers)
    if (beast::iequals(k, name)) return v;
  return {};
}

HttpResult http_request(uint16_t port, const std::string& method, const std::string& target, const std::string& body,
                        const std::vector<std::pair<std::string, std::string>>& headers) {
  net::io_context ioc;
  beast::tcp_stream stream(ioc);
  stream.connect(net::ip::tcp::endpoint(net::ip::make_address("127.0.0.1"), port));
  http::request<http::string_body> req{http::string_to_verb(method), target, 11};
  req.set(http::field::host, "127.0.0.1");
  req.set(http::field::content_type, "application/json");
  for (const auto& [k, v] : headers) req.set(k, v);
  req.body() = body;
  req.prepare_payload();
  http::write(stream, req);
  beast::flat_buffer buf;
  http::response_parser<http::string_body> parser;
  parser.body_limit(64u << 20);
  http::read(stream, buf, parser);
  auto res = parser.release();
  HttpResult r;
  r.status = static_cast<int>(res.result_int());
  r.body = res.body();
  for (const auto& f : res) r.headers.emplace_back(std::string(f.name_string()), std::string(f.value()));
  beast::error_code ec;
  stream.socket().shutdown(net::ip::tcp::socket::shutdown_both, ec);
  return r;
}

std::vector<std::string> sse_data_lines(const std::string& body) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < body.size()) {
    size_t nl = body.find('\n', pos);
    if (nl == std::string::npos) nl = body.size();
    std::string line = body.substr(pos, nl - pos);
    if (line.rfind("data: ", 0) == 0) out.push_back(line.substr(6));
    pos = nl + 1;
  }
  return out;
}

}  // namespace deepinfer::testing
