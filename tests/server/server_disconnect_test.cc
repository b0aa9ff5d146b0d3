// Fault injection at the socket: a client that goes away at any stage of a streamed generation (mid-upload,
// queued before the response headers, after the first chunk, mid-stream) gets its request aborted and every KV
// block back, while the other requests carry on.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <regex>
#include <string>
#include <thread>

#include <boost/asio.hpp>
#include <nlohmann/json.hpp>

#include "server/server_test_util.h"

namespace deepinfer::testing {
namespace {

namespace net = boost::asio;
using Json = nlohmann::json;

// One streamed completion on a raw socket, so that the test decides when the connection goes away.
class RawStream {
 public:
  RawStream(uint16_t port, int max_tokens, bool send_all = true) : sock_(ioc_) {
    sock_.connect({net::ip::make_address("127.0.0.1"), port});
    const std::string b = Json({{"model", "test-model"},
                                {"prompt", "w1 w2"},
                                {"max_tokens", max_tokens},
                                {"ignore_eos", true},
                                {"stream", true}})
                              .dump();
    std::string req = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
                      std::to_string(b.size()) + "\r\n\r\n" + (send_all ? b : b.substr(0, b.size() / 2));
    net::write(sock_, net::buffer(req));
  }
  // Reads until `n` SSE data lines have arrived; false if the stream ended first.
  bool read_events(int n) {
    char buf[512];
    boost::system::error_code ec;
    while (count_events() < n) {
      size_t got = sock_.read_some(net::buffer(buf), ec);
      if (ec) return false;
      received_.append(buf, got);
    }
    return true;
  }
  // Reads until the stream's final "data: [DONE]"; false if the connection ended first.
  bool read_to_done() {
    char buf[512];
    boost::system::error_code ec;
    while (received_.find("data: [DONE]") == std::string::npos) {
      size_t got = sock_.read_some(net::buffer(buf), ec);
      if (ec) return false;
      received_.append(buf, got);
    }
    return true;
  }
  void close() { sock_.close(); }
  const std::string& received() const { return received_; }

 private:
  int count_events() const {
    int n = 0;
    for (size_t p = received_.find("data: "); p != std::string::npos; p = received_.find("data: ", p + 1)) ++n;
    return n;
  }
  net::io_context ioc_;
  net::ip::tcp::socket sock_;
  std::string received_;
};

double metric(uint16_t port, const std::string& name) {
  auto m = http_request(port, "GET", "/metrics");
  std::smatch hit;
  if (!std::regex_search(m.body, hit, std::regex(name + "\\{[^}]*\\} ([0-9.e+-]+)"))) return -1;
  return std::stod(hit[1]);
}

double aborted_count(uint16_t port) {
  auto m = http_request(port, "GET", "/metrics");
  std::smatch hit;
  if (!std::regex_search(m.body, hit, std::regex("finished_reason=\"aborted\"\\} (\\d+)"))) return 0;
  return std::stod(hit[1]);
}

bool wait_for(const std::function<bool()>& pred, std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

TEST(ServerDisconnect, EveryStageOfAStreamAbortsTheRequestAndFreesItsBlocks) {
  TempDir dir;
  // One sequence at a time, so that a second request waits in the queue with no response headers sent yet.
  auto s = TestServer::start(make_chat_fixture_dir(dir.file("model")), {}, /*max_active=*/16, /*max_num_seqs=*/1);
  auto& engine = *s->engine;

  // Mid-upload: the body never completes, so no request exists; the server just drops the connection.
  {
    RawStream half(s->port, 10, /*send_all=*/false);
    half.close();
  }

  // Queued before the response headers: a long request holds the only sequence slot.
  RawStream holder(s->port, 1000);
  ASSERT_TRUE(holder.read_events(1)) << holder.received();
  {
    RawStream queued(s->port, 1000);
    ASSERT_TRUE(wait_for([&] { return engine.active_requests() == 2; }));
    ASSERT_TRUE(wait_for([&] { return metric(s->port, "deepinfer_num_requests_waiting") == 1; }));
    queued.close();
    ASSERT_TRUE(wait_for([&] { return engine.active_requests() == 1; })) << "the queued request was not aborted";
    EXPECT_EQ(queued.received(), "") << "no headers were sent to the queued request";
  }
  EXPECT_EQ(aborted_count(s->port), 1);
  holder.close();
  ASSERT_TRUE(wait_for([&] { return engine.active_requests() == 0; }));
  EXPECT_EQ(aborted_count(s->port), 2);

  // After the first chunk, and mid-stream (after 20 events), with another stream (queued ahead of or behind the
  // victim) that must finish normally.
  int aborted = 2;
  for (int events : {1, 20}) {
    RawStream bystander(s->port, 40);
    RawStream victim(s->port, 1000);
    ASSERT_TRUE(victim.read_events(events));
    victim.close();
    ASSERT_TRUE(bystander.read_to_done());
    EXPECT_NE(bystander.received().find("\"finish_reason\":\"length\""), std::string::npos) << bystander.received();
    ASSERT_TRUE(wait_for([&] { return engine.active_requests() == 0; })) << "after " << events << " events";
    EXPECT_EQ(aborted_count(s->port), ++aborted);
  }
  // Every block is back: the gauges are published before a request stops counting as active.
  EXPECT_EQ(metric(s->port, "deepinfer_kv_cache_usage_perc"), 0);
  // And the server still answers.
  auto r =
      http_request(s->port, "POST", "/v1/completions",
                   Json({{"model", "test-model"}, {"prompt", "w1"}, {"max_tokens", 3}, {"ignore_eos", true}}).dump());
  EXPECT_EQ(r.status, 200) << r.body;
}

}  // namespace
}  // namespace deepinfer::testing
