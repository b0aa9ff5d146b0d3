#include "deepinfer/server/engine_service.h"

#include "deepinfer/core/error.h"
#include "deepinfer/core/logging.h"

namespace deepinfer::server {

namespace {
std::string finish_reason_label(StopReason r) { return std::string(stop_reason_name(r)); }
}  // namespace

EngineService::EngineService(ModelHost& host, Metrics& metrics, EngineServiceOptions options)
    : host_(host), metrics_(metrics), options_(options) {
  engine_ =
      std::make_unique<Engine>(host_.engine_config(), host_.runner(), [this](const SequenceDelta& d) { on_delta(d); });
  thread_ = std::thread([this] { loop(); });
}

EngineService::~EngineService() { shutdown(); }

void EngineService::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    accepting_ = false;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

bool EngineService::submit(Request request, std::shared_ptr<RequestSink> sink) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!accepting_ || num_active_ >= options_.max_active_requests) return false;
    ++num_active_;
    queue_.push_back(Add{std::move(request), std::move(sink)});
  }
  cv_.notify_one();
  return true;
}

void EngineService::abort(const std::string& request_id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(Abort{request_id});
  }
  cv_.notify_one();
}

int EngineService::active_requests() const {
  std::lock_guard<std::mutex> lock(mu_);
  return num_active_;
}

bool EngineService::accepting() const {
  std::lock_guard<std::mutex> lock(mu_);
  return accepting_;
}

void EngineService::drain(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  accepting_ = false;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (num_active_ > 0 && std::chrono::steady_clock::now() < deadline) {
    lock.unlock();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    lock.lock();
  }
  if (num_active_ == 0) return;
  DI_LOG_WARN("drain: {} requests still running after {} ms, aborting them", num_active_, timeout.count());
  stop_ = true;  // the loop aborts everything before it exits
  lock.unlock();
  cv_.notify_all();
}

void EngineService::on_delta(const SequenceDelta& d) {
  auto it = active_.find(d.request_id);
  if (it == active_.end()) return;
  Active& a = it->second;
  const auto now = std::chrono::steady_clock::now();
  if (!d.new_token_ids.empty()) {
    const size_t s = static_cast<size_t>(d.sample_index);
    if (s < a.got_first.size()) {
      if (!a.got_first[s]) {
        metrics_.observe_ttft(std::chrono::duration<double>(now - a.arrival).count());
        a.got_first[s] = true;
      } else {
        metrics_.observe_inter_token(std::chrono::duration<double>(now - a.last_token[s]).count());
      }
      a.last_token[s] = now;
    }
    metrics_.add_generation_tokens(static_cast<int64_t>(d.new_token_ids.size()));
  }
  a.sink->on_delta(d);
  if (d.finished) {
    metrics_.observe_e2e(std::chrono::duration<double>(now - a.arrival).count());
    metrics_.count_finished(finish_reason_label(d.stop_reason));
    if (--a.remaining == 0) {
      active_.erase(it);
      // The engine has released this request's cache by now (finish() runs before its delta). Publish before a
      // waiter can see the request gone, so that "no active requests" never meets a stale KV-usage gauge (the
      // engine thread may go to sleep right after this).
      publish_gauges();
      std::lock_guard<std::mutex> lock(mu_);
      --num_active_;
    }
  }
}

void EngineService::fail_all(const std::string& message) {
  // Taken out first: the aborts' final deltas come back through on_delta, which must neither find these
  // requests (they already got on_failed) nor erase from a map being iterated.
  std::unordered_map<std::string, Active> failed;
  failed.swap(active_);
  for (auto& [id, a] : failed) {
    a.sink->on_failed(500, message);
    try {
      engine_->abort(id);
    } catch (const std::exception& e) {
      DI_LOG_ERROR("abort of {} after an engine failure: {}", id, e.what());
    }
  }
  const int n = static_cast<int>(failed.size());
  publish_gauges();
  std::lock_guard<std::mutex> lock(mu_);
  num_active_ -= n;
}

void EngineService::publish_gauges() {
  EngineGauges g;
  g.running = engine_->num_running();
  g.waiting = engine_->num_waiting();
  const auto& kv = engine_->kv_cache();
  g.kv_usage = kv.num_blocks() > 0 ? 1.0 - static_cast<double>(kv.num_available_blocks()) / kv.num_blocks() : 0.0;
  const auto& st = engine_->stats();
  g.prefix_query_tokens = st.kv.prefix_query_tokens;
  g.prefix_hit_tokens = st.kv.prefix_hit_tokens;
  g.preemptions = st.preemptions;
  g.spec_steps = st.spec.steps;
  g.spec_draft_tokens = st.spec.drafted;
  g.spec_accepted_tokens = st.spec.accepted;
  g.spec_draft_per_pos = st.spec.drafted_at;
  g.spec_accepted_per_pos = st.spec.accepted_at;
  metrics_.set_gauges(g);
}

void EngineService::loop() {
  for (;;) {
    std::deque<Command> commands;
    bool stop = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty() || engine_->has_unfinished(); });
      commands.swap(queue_);
      stop = stop_;
    }
    for (auto& c : commands) {
      if (auto* add = std::get_if<Add>(&c)) {
        const std::string id = add->request.request_id;
        const int n = add->request.params.n;
        const int64_t prompt_len = static_cast<int64_t>(add->request.prompt_token_ids.size());
        Active a;
        a.sink = add->sink;
        a.remaining = n;
        a.arrival = add->request.arrival_time;
        a.last_token.assign(static_cast<size_t>(n), a.arrival);
        a.got_first.assign(static_cast<size_t>(n), false);
        try {
          if (active_.count(id)) DI_FAIL(ErrorCode::kInvalidArgument) << "duplicate request id " << id;
          engine_->add_request(std::move(add->request));
          active_.emplace(id, std::move(a));
          metrics_.add_prompt_tokens(prompt_len);
        } catch (const Error& e) {
          add->sink->on_failed(e.code() == ErrorCode::kInternal ? 500 : 400, e.message());
          std::lock_guard<std::mutex> lock(mu_);
          --num_active_;
        }
      } else {
        const auto& ab = std::get<Abort>(c);
        if (active_.count(ab.request_id)) engine_->abort(ab.request_id);
      }
    }
    if (stop) {
      for (auto it = active_.begin(); it != active_.end();) {
        const std::string id = (it++)->first;  // abort's final deltas erase the entry
        engine_->abort(id);
      }
      publish_gauges();
      return;
    }
    if (engine_->has_unfinished()) {
      try {
        engine_->step();
      } catch (const std::exception& e) {
        DI_LOG_ERROR("engine step failed: {}", e.what());
        fail_all(std::string("engine failure: ") + e.what());
      }
    }
    engine_->take_finished();  // the deltas carried everything; drop the engine's copies
    publish_gauges();
  }
}

}  // namespace deepinfer::server
