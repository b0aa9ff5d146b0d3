// EngineService: the one thread that owns the Engine. HTTP handlers submit requests and aborts through a
// thread-safe queue that the engine thread drains between steps; each request's deltas go to its RequestSink
// (which hands them to the connection's strand). Nothing else touches the Engine.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <variant>

#include "deepinfer/engine/engine.h"
#include "deepinfer/server/metrics.h"
#include "deepinfer/server/model_host.h"

namespace deepinfer::server {

// Called on the engine thread; implementations must not block (they queue and notify).
class RequestSink {
 public:
  virtual ~RequestSink() = default;
  virtual void on_delta(const SequenceDelta& delta) = 0;
  // The engine refused the request (add_request threw) or failed while running it; no more deltas follow.
  virtual void on_failed(int http_status, const std::string& message) = 0;
};

struct EngineServiceOptions {
  int max_active_requests = 256;  // submitted and not finished; more → 429
};

class EngineService {
 public:
  EngineService(ModelHost& host, Metrics& metrics, EngineServiceOptions options = {});
  ~EngineService();  // aborts what is left and joins the thread
  EngineService(const EngineService&) = delete;
  EngineService& operator=(const EngineService&) = delete;

  // False when max_active_requests are in flight (the caller answers 429) or the service is draining.
  bool submit(Request request, std::shared_ptr<RequestSink> sink);
  // Aborts a submitted request (no-op if it already finished). Its final delta still reaches the sink.
  void abort(const std::string& request_id);
  // Stops accepting, waits up to `timeout` for active requests to finish, then aborts the rest.
  void drain(std::chrono::milliseconds timeout);
  // Aborts everything left and joins the engine thread; no sink is called afterwards. Idempotent.
  void shutdown();
  int active_requests() const;
  bool accepting() const;

 private:
  struct Add {
    Request request;
    std::shared_ptr<RequestSink> sink;
  };
  struct Abort {
    std::string request_id;
  };
  using Command = std::variant<Add, Abort>;
  struct Active {
    std::shared_ptr<RequestSink> sink;
    int remaining = 0;  // samples without a final delta
    std::chrono::steady_clock::time_point arrival;
    std::vector<std::chrono::steady_clock::time_point> last_token;  // per sample; arrival until the first
    std::vector<bool> got_first;
  };

  void loop();
  void on_delta(const SequenceDelta& d);
  void fail_all(const std::string& message);
  void publish_gauges();

  ModelHost& host_;
  Metrics& metrics_;
  EngineServiceOptions options_;
  std::unique_ptr<Engine> engine_;
  std::unordered_map<std::string, Active> active_;  // engine thread only

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Command> queue_;
  int num_active_ = 0;  // guarded by mu_: submitted, not finished
  bool accepting_ = true;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace deepinfer::server
