#include "deepinfer/server/http_server.h"

#include <sys/socket.h>

#include <cerrno>
#include <mutex>
#include <thread>
#include <vector>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "deepinfer/core/error.h"
#include "deepinfer/core/logging.h"
#include "deepinfer/server/api_key.h"

namespace deepinfer::server {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

namespace {

// The meeting point of the engine thread (producer) and one connection's coroutine (consumer). The timer is the
// consumer's doorbell: the producer queues under the mutex, then posts a cancel to the connection's strand.
class Channel final : public RequestSink, public std::enable_shared_from_this<Channel> {
 public:
  explicit Channel(net::any_io_executor strand) : strand_(strand), timer_(strand) {}

  void on_delta(const SequenceDelta& d) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      deltas_.push_back(d);
    }
    ring();
  }
  void on_failed(int status, const std::string& message) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      failure_ = ApiError(status, message);
    }
    ring();
  }
  // On the strand.
  void ring() {
    net::post(strand_, [self = shared_from_this()] { self->timer_.cancel(); });
  }
  std::vector<SequenceDelta> take(std::optional<ApiError>* failure) {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<SequenceDelta> out;
    out.swap(deltas_);
    if (failure_) *failure = failure_;
    return out;
  }
  bool has_pending() {
    std::lock_guard<std::mutex> lock(mu_);
    return !deltas_.empty() || failure_.has_value();
  }
  net::steady_timer& timer() { return timer_; }
  bool disconnected = false;   // strand only
  bool watching_done = false;  // strand only

 private:
  net::any_io_executor strand_;  // the connection's strand
  net::steady_timer timer_;
  std::mutex mu_;
  std::vector<SequenceDelta> deltas_;
  std::optional<ApiError> failure_;
};

std::string strip_query(std::string_view target) {
  auto q = target.find('?');
  return std::string(target.substr(0, q));
}

}  // namespace

struct HttpServer::Impl {
  ServerApi& api;
  EngineService& engine;
  Metrics& metrics;
  HttpServerOptions opt;
  net::io_context ioc;
  tcp::acceptor acceptor{ioc};
  std::vector<std::thread> threads;
  std::optional<net::executor_work_guard<net::io_context::executor_type>> work;
  std::atomic<bool> accepting{false};
  std::atomic<int> replying{0};  // generation replies being written (see wait_for_replies)
  std::once_flag stopped;

  Impl(ServerApi& a, EngineService& e, Metrics& m, HttpServerOptions o)
      : api(a), engine(e), metrics(m), opt(std::move(o)) {}

  net::awaitable<void> accept_loop() {
    for (;;) {
      beast::error_code ec;
      tcp::socket sock =
          co_await acceptor.async_accept(net::make_strand(ioc), net::redirect_error(net::use_awaitable, ec));
      if (ec) {
        if (ec == net::error::operation_aborted || !accepting) co_return;
        DI_LOG_WARN("accept: {}", ec.message());
        continue;
      }
      auto ex = sock.get_executor();
      net::co_spawn(ex, session(std::move(sock)), net::detached);
    }
  }

  bool authorized(const http::request<http::string_body>& req) const {
    if (opt.api_key.empty()) return true;
    auto value = [&req](auto field) {
      auto it = req.find(field);
      return it == req.end() ? std::string_view{} : std::string_view(it->value().data(), it->value().size());
    };
    return api_key_matches(value(http::field::authorization), value("x-api-key"), opt.api_key);
  }

  template <class Stream>
  net::awaitable<bool> write_reply(Stream& stream, const HttpReply& r, unsigned version, bool keep_alive) {
    http::response<http::string_body> res{static_cast<http::status>(r.status), version};
    res.set(http::field::server, "deepinfer");
    res.set(http::field::content_type, r.content_type);
    for (const auto& [k, v] : r.headers) res.set(k, v);
    res.keep_alive(keep_alive);
    res.body() = r.body;
    res.prepare_payload();
    metrics.count_http(r.status);
    beast::error_code ec;
    stream.expires_after(std::chrono::seconds(60));
    co_await http::async_write(stream, res, net::redirect_error(net::use_awaitable, ec));
    co_return !ec;
  }

  // Watches the idle socket while a generation runs: readable with EOF (or an error) means the client left.
  void watch(beast::tcp_stream& stream, std::shared_ptr<Channel> ch) {
    stream.socket().async_wait(tcp::socket::wait_read, [&stream, ch](const boost::system::error_code& ec) {
      if (ch->watching_done) return;
      if (ec) {
        ch->disconnected = true;
      } else {
        char c;
        ssize_t r = ::recv(stream.socket().native_handle(), &c, 1, MSG_PEEK | MSG_DONTWAIT);
        if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) ch->disconnected = true;
        // r > 0: a pipelined request is waiting; it is read after this reply.
      }
      if (ch->disconnected) ch->timer().cancel();
    });
  }

  // Runs one generation; returns false if the connection must be closed.
  net::awaitable<bool> generate(beast::tcp_stream& stream, PreparedGeneration g, unsigned version, bool keep_alive,
                                ErrorStyle style) {
    auto ex = co_await net::this_coro::executor;
    // Counted from here until the coroutine ends, i.e. until the reply's last bytes are written.
    struct Replying {
      std::atomic<int>& n;
      explicit Replying(std::atomic<int>& c) : n(c) { ++n; }
      ~Replying() { --n; }
    } replying_guard(replying);
    auto ch = std::make_shared<Channel>(ex);
    GenerationJob& job = *g.job;
    const std::string id = g.request.request_id;
    if (!engine.submit(std::move(g.request), ch)) {
      HttpReply r = error_reply(
          ApiError(engine.accepting() ? 429 : 503,
                   engine.accepting() ? "too many requests in flight; retry later" : "the server is shutting down"),
          style);
      r.headers.emplace_back("Retry-After", "1");
      co_return co_await write_reply(stream, r, version, keep_alive);
    }
    watch(stream, ch);
    std::optional<http::response<http::empty_body>> head;
    std::optional<http::response_serializer<http::empty_body>> sr;
    bool ok = true;
    bool engine_done = false;
    auto abort_request = [&] {
      if (!engine_done) engine.abort(id);
      engine_done = true;
    };
    auto send = [&](const std::string& text) -> net::awaitable<bool> {
      beast::error_code ec;
      if (!head) {
        head.emplace(http::status::ok, version);
        head->set(http::field::server, "deepinfer");
        head->set(http::field::content_type, "text/event-stream");
        head->set(http::field::cache_control, "no-cache");
        head->keep_alive(keep_alive);
        head->chunked(true);
        sr.emplace(*head);
        metrics.count_http(200);
        stream.expires_after(std::chrono::seconds(60));
        co_await http::async_write_header(stream, *sr, net::redirect_error(net::use_awaitable, ec));
        if (ec) co_return false;
      }
      if (text.empty()) co_return true;
      stream.expires_after(std::chrono::seconds(60));
      co_await net::async_write(stream, http::make_chunk(net::buffer(text)),
                                net::redirect_error(net::use_awaitable, ec));
      co_return !ec;
    };
    for (;;) {
      std::optional<ApiError> failure;
      auto deltas = ch->take(&failure);
      std::string out;
      bool first = job.stream() && !head && !deltas.empty();
      if (first) out += job.prologue();
      for (const auto& d : deltas) out += job.on_delta(d);
      if (job.done()) engine_done = true;
      if (failure) {
        engine_done = true;
        if (!head) {
          ch->watching_done = true;
          stream.socket().cancel();
          co_return co_await write_reply(stream, error_reply(*failure, style), version, keep_alive) && ok;
        }
        out += job.stream_error(*failure);
      }
      if (job.stream() && !out.empty()) {
        if (!co_await send(out)) {
          ok = false;
          break;
        }
      }
      if (job.done() || failure) break;
      if (ch->disconnected) {
        ok = false;
        break;
      }
      // A delta that arrived while this coroutine was suspended in a write rang a doorbell nobody waited on: look
      // again before sleeping. From here to the wait nothing suspends, so any later ring wakes the wait.
      if (ch->has_pending()) continue;
      ch->timer().expires_at(net::steady_timer::time_point::max());
      beast::error_code ec;
      co_await ch->timer().async_wait(net::redirect_error(net::use_awaitable, ec));
    }
    ch->watching_done = true;
    if (!ok) {
      abort_request();
      co_return false;
    }
    beast::error_code ec;
    stream.socket().cancel(ec);  // the watcher's wait
    if (job.stream()) {
      if (!co_await send(job.epilogue())) co_return false;
      stream.expires_after(std::chrono::seconds(60));
      co_await net::async_write(stream, http::make_chunk_last(), net::redirect_error(net::use_awaitable, ec));
      co_return !ec && keep_alive;
    }
    HttpReply r;
    r.body = job.epilogue();
    co_return co_await write_reply(stream, r, version, keep_alive) && keep_alive;
  }

  net::awaitable<void> session(tcp::socket sock) {
    beast::tcp_stream stream(std::move(sock));
    beast::flat_buffer buffer;
    for (;;) {
      http::request_parser<http::string_body> parser;
      parser.body_limit(opt.max_body_bytes);
      parser.header_limit(static_cast<uint32_t>(std::min<size_t>(opt.max_header_bytes, UINT32_MAX)));
      beast::error_code ec;
      stream.expires_after(opt.idle_timeout);
      co_await http::async_read(stream, buffer, parser, net::redirect_error(net::use_awaitable, ec));
      // Over a limit or not HTTP: one error reply naming the problem, then close (the rest of the stream cannot
      // be trusted to start at a request boundary).
      std::optional<ApiError> refuse;
      if (ec == http::error::body_limit) {
        refuse = ApiError(413, "request body larger than " + std::to_string(opt.max_body_bytes) + " bytes", "body");
      } else if (ec == http::error::header_limit) {
        refuse = ApiError(
            431, "request line and headers larger than " + std::to_string(opt.max_header_bytes) + " bytes", "headers");
      } else if (ec && ec.category() == http::make_error_code(http::error::bad_target).category() &&
                 ec != http::error::end_of_stream && ec != http::error::partial_message) {
        refuse = ApiError(400, "malformed HTTP request: " + ec.message());
      }
      if (refuse) {
        co_await write_reply(stream, error_reply(*refuse, ErrorStyle::kOpenAI), 11, false);
        break;
      }
      if (ec) break;           // end of stream, timeout, connection error: close
      stream.expires_never();  // the read's timer must not close the socket during a long generation
      http::request<http::string_body> req = parser.release();
      const bool keep_alive = req.keep_alive();
      const std::string path = strip_query(std::string_view(req.target().data(), req.target().size()));
      const std::string method(req.method_string());
      bool keep = keep_alive;
      if (path == "/health") {
        HttpReply r;
        r.status = accepting ? 200 : 503;
        r.body = accepting ? "{\"status\":\"ok\"}" : "{\"status\":\"draining\"}";
        keep = co_await write_reply(stream, r, req.version(), keep_alive) && keep_alive;
      } else if (!authorized(req)) {
        ErrorStyle style = error_style_for(path);
        HttpReply r = error_reply(ApiError(401, "invalid or missing API key (Authorization: Bearer <key>)", "",
                                           "invalid_request_error", "invalid_api_key"),
                                  style);
        r.headers.emplace_back("WWW-Authenticate", "Bearer");
        keep = co_await write_reply(stream, r, req.version(), keep_alive) && keep_alive;
      } else if (path == "/metrics") {
        HttpReply r;
        r.content_type = "text/plain; version=0.0.4; charset=utf-8";
        r.body = metrics.render(api.host().name());
        keep = co_await write_reply(stream, r, req.version(), keep_alive) && keep_alive;
      } else {
        RouteOutcome outcome = api.handle(method, path, req.body());
        if (auto* reply = std::get_if<HttpReply>(&outcome)) {
          keep = co_await write_reply(stream, *reply, req.version(), keep_alive) && keep_alive;
        } else {
          keep = co_await generate(stream, std::move(std::get<PreparedGeneration>(outcome)), req.version(), keep_alive,
                                   error_style_for(path));
        }
      }
      if (!keep) break;
    }
    beast::error_code ec;
    stream.socket().shutdown(tcp::socket::shutdown_send, ec);
    stream.socket().close(ec);
  }
};

HttpServer::HttpServer(ServerApi& api, EngineService& engine, Metrics& metrics, HttpServerOptions options)
    : impl_(std::make_unique<Impl>(api, engine, metrics, std::move(options))) {}

HttpServer::~HttpServer() { stop(); }

void HttpServer::start() {
  Impl& m = *impl_;
  beast::error_code ec;
  auto addr = net::ip::make_address(m.opt.host, ec);
  DI_CHECK(!ec) << "--host " << m.opt.host << ": not an IP address (" << ec.message() << ")";
  tcp::endpoint ep(addr, m.opt.port);
  m.acceptor.open(ep.protocol(), ec);
  if (!ec) m.acceptor.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) m.acceptor.bind(ep, ec);
  if (!ec) m.acceptor.listen(net::socket_base::max_listen_connections, ec);
  DI_CHECK(!ec) << "cannot listen on " << m.opt.host << ":" << m.opt.port << ": " << ec.message();
  m.accepting = true;
  m.work.emplace(m.ioc.get_executor());
  net::co_spawn(m.ioc, m.accept_loop(), net::detached);
  for (int i = 0; i < std::max(1, m.opt.io_threads); ++i) m.threads.emplace_back([&m] { m.ioc.run(); });
  DI_LOG_INFO("listening on http://{}:{}", m.opt.host, port());
}

uint16_t HttpServer::port() const {
  beast::error_code ec;
  auto ep = impl_->acceptor.local_endpoint(ec);
  return ec ? 0 : ep.port();
}

void HttpServer::stop_accepting() { impl_->accepting = false; }

bool HttpServer::wait_for_replies(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (impl_->replying > 0) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

void HttpServer::stop() {
  Impl& m = *impl_;
  std::call_once(m.stopped, [&m, this] {
    stop_accepting();
    net::post(m.ioc, [&m] {
      beast::error_code ec;
      m.acceptor.close(ec);
    });
    // The engine thread posts to connection strands: it must be gone before the I/O context stops.
    m.engine.shutdown();
    m.work.reset();
    m.ioc.stop();
    for (auto& t : m.threads)
      if (t.joinable()) t.join();
  });
}

}  // namespace deepinfer::server
