// HttpServer: HTTP/1.1 on Boost.Beast/Asio in front of ServerApi and EngineService. One coroutine per connection
// on its own strand; a fixed pool of I/O threads. Generation replies wait on a per-request channel that the engine
// thread fills; while waiting, the socket is watched so that a client that goes away aborts its request.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "deepinfer/server/api.h"
#include "deepinfer/server/engine_service.h"
#include "deepinfer/server/metrics.h"

namespace deepinfer::server {

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 8000;                 // 0: an ephemeral port (see HttpServer::port)
  std::string api_key;                  // non-empty: every route but /health needs it (Bearer or x-api-key)
  size_t max_body_bytes = 8u << 20;     // larger: 413
  size_t max_header_bytes = 16u << 10;  // request line + headers; larger: 431
  int io_threads = 2;
  std::chrono::seconds idle_timeout{120};  // a connection with no complete request for this long is closed
};

class HttpServer {
 public:
  HttpServer(ServerApi& api, EngineService& engine, Metrics& metrics, HttpServerOptions options);
  ~HttpServer();
  // Binds and starts the I/O threads. Throws InvalidArgument naming host:port when it cannot bind.
  void start();
  uint16_t port() const;
  // Starts a drain: /health answers 503 from then on, and so do new generation requests once the engine stops
  // accepting (EngineService::drain). Connections are still accepted, so that new clients get that 503 rather
  // than a refused connection; in-flight requests continue.
  void stop_accepting();
  // Waits until no generation reply is being written (after EngineService::drain the engine is done, but the
  // last events may still be on their way to the socket); false on timeout.
  bool wait_for_replies(std::chrono::milliseconds timeout);
  // Shuts the engine (its final deltas go nowhere) and the I/O threads down. Idempotent.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace deepinfer::server
