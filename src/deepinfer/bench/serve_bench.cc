#include "deepinfer/bench/serve_bench.h"

#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <thread>
#include <utility>

#include <fmt/format.h>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

#include "deepinfer/core/error.h"

namespace deepinfer::bench {

namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// Prompt ids are drawn from this text's tokens, so they are ordinary tokens of the served model's vocabulary.
constexpr const char* kPassage =
    "The river runs through the old city from the hills in the north to the sea in the south. In the first years "
    "of the school the people of the city built a bridge over the water, and later a second one made of stone. "
    "During the war the bridges were closed, but the family that kept the mill went on working while the music "
    "of the local band played every season. Most of the world has changed since then; the team that plays "
    "national games still meets between the two bridges, and the number of visitors grows every year because "
    "the place is well known for its early markets, its water gardens and its long summer evenings.";

bool is_loopback(const std::string& host) {
  if (host == "localhost") return true;
  boost::system::error_code ec;
  auto a = net::ip::make_address(host, ec);
  return !ec && a.is_loopback();
}

net::ip::tcp::endpoint endpoint_of(const ServeBenchOptions& o) {
  return {net::ip::make_address(o.host == "localhost" ? "127.0.0.1" : o.host), o.port};
}

http::request<http::string_body> make_request(const ServeBenchOptions& o, http::verb verb, const std::string& target,
                                              const std::string& body) {
  http::request<http::string_body> req{verb, target, 11};
  req.set(http::field::host, o.host);
  req.set(http::field::content_type, "application/json");
  if (!o.api_key.empty()) req.set(http::field::authorization, "Bearer " + o.api_key);
  req.body() = body;
  req.prepare_payload();
  return req;
}

// One small request/response: the status and the body (kNotFound when nothing listens).
std::pair<int, std::string> call(const ServeBenchOptions& o, http::verb verb, const std::string& target,
                                 const std::string& body) {
  net::io_context ioc;
  beast::tcp_stream stream(ioc);
  beast::error_code ec;
  stream.socket().connect(endpoint_of(o), ec);
  DI_CHECK_CODE(!ec, ErrorCode::kNotFound)
      << "bench serve: cannot connect to " << o.host << ":" << o.port << ": " << ec.message();
  http::write(stream, make_request(o, verb, target, body));
  beast::flat_buffer buf;
  http::response<http::string_body> res;
  http::read(stream, buf, res);
  stream.socket().shutdown(net::ip::tcp::socket::shutdown_both, ec);
  return {res.result_int(), res.body()};
}

// Model list, tokenize: must answer 200 with JSON.
Json call_json(const ServeBenchOptions& o, http::verb verb, const std::string& target, const std::string& body) {
  auto [status, text] = call(o, verb, target, body);
  DI_CHECK_CODE(status == 200, ErrorCode::kNotFound)
      << "bench serve: " << target << " answered " << status << ": " << text;
  return Json::parse(text);
}

// The value of the first sample line of `series` (name without labels), or `missing`.
double prometheus_value(const std::string& text, const std::string& series, double missing) {
  size_t at = 0;
  while ((at = text.find(series, at)) != std::string::npos) {
    const bool line_start = at == 0 || text[at - 1] == '\n';
    const size_t after = at + series.size();
    if (line_start && after < text.size() && (text[after] == '{' || text[after] == ' ')) {
      const size_t eol = std::min(text.find('\n', after), text.size());
      const size_t sp = text.rfind(' ', eol - 1);
      if (sp != std::string::npos && sp >= after) return std::strtod(text.c_str() + sp + 1, nullptr);
    }
    at = after;
  }
  return missing;
}

// The server's spec counters after what was in flight has retired (the engine publishes its counters with the
// running / waiting gauges after each step, so both at zero means the last step is counted), or nullopt when the
// server has no /metrics (not a deepinfer server): the report then has no speculative section.
std::optional<SpecDecodeStats> scrape_spec(const ServeBenchOptions& o, bool settle) {
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  for (;;) {
    std::pair<int, std::string> r;
    try {
      r = call(o, http::verb::get, "/metrics", "");
    } catch (const std::exception&) {
      return std::nullopt;
    }
    if (r.first != 200) return std::nullopt;
    const bool idle = prometheus_value(r.second, "deepinfer_num_requests_running", 0) == 0 &&
                      prometheus_value(r.second, "deepinfer_num_requests_waiting", 0) == 0;
    if (!settle || idle || Clock::now() >= deadline) return parse_spec_decode_metrics(r.second);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

struct Outcome {
  bool ok = false;
  std::string error;
  double ttft = -1, e2e = 0;
  std::vector<double> itl;
  int64_t prompt_tokens = 0, output_tokens = 0;
};

// Sockets in use, so the deadline can cut reads that would otherwise block past it.
class SocketRegistry {
 public:
  void add(int fd) {
    std::lock_guard<std::mutex> l(mu_);
    if (cut_) ::shutdown(fd, SHUT_RDWR);
    fds_.insert(fd);
  }
  void remove(int fd) {
    std::lock_guard<std::mutex> l(mu_);
    fds_.erase(fd);
  }
  void cut_all() {
    std::lock_guard<std::mutex> l(mu_);
    cut_ = true;
    for (int fd : fds_) ::shutdown(fd, SHUT_RDWR);
  }

 private:
  std::mutex mu_;
  std::set<int> fds_;
  bool cut_ = false;
};

// One streamed completion: timestamps of the SSE chunks that carry tokens.
Outcome stream_one(const ServeBenchOptions& o, const std::string& body, SocketRegistry& sockets) {
  Outcome r;
  net::io_context ioc;
  beast::tcp_stream stream(ioc);
  beast::error_code ec;
  stream.socket().open(net::ip::tcp::v4(), ec);
  if (ec) {
    r.error = "socket: " + ec.message();
    return r;
  }
  const int fd = stream.socket().native_handle();
  sockets.add(fd);
  struct Unregister {
    SocketRegistry& s;
    int fd;
    ~Unregister() { s.remove(fd); }
  } unregister{sockets, fd};
  const auto t0 = Clock::now();
  auto seconds_since = [&](Clock::time_point t) { return std::chrono::duration<double>(t - t0).count(); };
  stream.socket().connect(endpoint_of(o), ec);
  if (!ec) http::write(stream, make_request(o, http::verb::post, "/v1/completions", body), ec);
  beast::flat_buffer buf;
  http::response_parser<http::buffer_body> parser;
  parser.body_limit(boost::none);
  if (!ec) http::read_header(stream, buf, parser, ec);
  if (ec) {
    r.error = "connection: " + ec.message();
    return r;
  }
  const int status = static_cast<int>(parser.get().result_int());
  std::string pending;  // SSE bytes not yet split into events
  std::string error_body;
  Clock::time_point last_chunk{};
  bool saw_usage = false;
  char tmp[16384];
  while (!parser.is_done()) {
    parser.get().body().data = tmp;
    parser.get().body().size = sizeof tmp;
    http::read_some(stream, buf, parser, ec);
    if (ec == http::error::need_buffer) ec = {};
    if (ec) break;
    const auto now = Clock::now();
    const size_t n = sizeof tmp - parser.get().body().size;
    if (status != 200) {
      error_body.append(tmp, n);
      continue;
    }
    pending.append(tmp, n);
    for (size_t end; (end = pending.find("\n\n")) != std::string::npos; pending.erase(0, end + 2)) {
      const std::string event = pending.substr(0, end);
      const size_t data = event.find("data: ");
      if (data == std::string::npos) continue;
      const std::string payload = event.substr(data + 6);
      if (payload == "[DONE]") continue;
      Json j = Json::parse(payload, nullptr, false);
      if (j.is_discarded() || !j.is_object()) continue;
      if (j.contains("error")) {
        r.error = "stream error: " + j["error"].dump();
        continue;
      }
      if (auto u = j.find("usage"); u != j.end() && u->is_object()) {
        r.prompt_tokens = u->value("prompt_tokens", int64_t{0});
        r.output_tokens = u->value("completion_tokens", int64_t{0});
        saw_usage = true;
      }
      auto ch = j.find("choices");
      if (ch == j.end() || !ch->is_array() || ch->empty()) continue;
      const Json& c = (*ch)[0];
      auto ids = c.find("token_ids");
      if (ids == c.end() || !ids->is_array() || ids->empty()) continue;
      if (r.ttft < 0)
        r.ttft = seconds_since(now);
      else
        r.itl.push_back(std::chrono::duration<double>(now - last_chunk).count());
      last_chunk = now;
    }
  }
  r.e2e = seconds_since(Clock::now());
  stream.socket().shutdown(net::ip::tcp::socket::shutdown_both, ec);
  if (status != 200) {
    r.error = fmt::format("HTTP {}: {}", status, error_body.substr(0, 300));
  } else if (r.error.empty() && !parser.is_done()) {
    r.error = "the stream was cut (time limit or server gone)";
  } else if (r.error.empty() && !saw_usage) {
    r.error = "the stream had no usage chunk";
  }
  r.ok = r.error.empty();
  return r;
}

int clamp_len(double x, int hi) { return static_cast<int>(std::clamp(std::lround(x), 1L, static_cast<long>(hi))); }

}  // namespace

LengthDistribution parse_length_distribution(const std::string& name) {
  if (name == "random") return LengthDistribution::kRandom;
  if (name == "sharegpt") return LengthDistribution::kShareGpt;
  DI_FAIL(ErrorCode::kInvalidArgument) << "--dataset must be random or sharegpt, got '" << name << "'";
}

LatencyStats latency_stats(std::vector<double> s) {
  LatencyStats r;
  r.count = static_cast<int64_t>(s.size());
  if (s.empty()) return r;
  std::sort(s.begin(), s.end());
  double sum = 0;
  for (double x : s) sum += x;
  const size_t n = s.size();
  r.mean_ms = sum / static_cast<double>(n) * 1000;
  r.median_ms = (n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2) * 1000;
  r.p99_ms = s[std::min(n - 1, static_cast<size_t>(std::lround(0.99 * static_cast<double>(n - 1))))] * 1000;
  return r;
}

std::vector<std::pair<int, int>> sample_lengths(const ServeBenchOptions& o) {
  std::mt19937_64 rng(o.seed);
  std::vector<std::pair<int, int>> out;
  const int in_hi = std::max(1, o.lengths == LengthDistribution::kShareGpt ? 8 * o.input_len : o.input_len * 2);
  const int out_hi = std::max(1, o.lengths == LengthDistribution::kShareGpt ? 8 * o.output_len : o.output_len * 2);
  for (int i = 0; i < o.num_prompts; ++i) {
    if (o.lengths == LengthDistribution::kRandom) {
      std::uniform_real_distribution<double> in(o.input_len * (1 - o.range_ratio), o.input_len * (1 + o.range_ratio));
      std::uniform_real_distribution<double> ou(o.output_len * (1 - o.range_ratio), o.output_len * (1 + o.range_ratio));
      out.emplace_back(clamp_len(in(rng), in_hi), clamp_len(ou(rng), out_hi));
    } else {
      // Log-normal with the given medians; the spreads give ShareGPT's shape (a long tail of long prompts, outputs
      // a little less spread), without reading the dataset.
      std::lognormal_distribution<double> in(std::log(o.input_len), 0.9), ou(std::log(o.output_len), 0.7);
      out.emplace_back(clamp_len(in(rng), in_hi), clamp_len(ou(rng), out_hi));
    }
  }
  return out;
}

double SpecDecodeStats::acceptance_rate() const {
  return drafted > 0 ? static_cast<double>(accepted) / static_cast<double>(drafted) : 0.0;
}
double SpecDecodeStats::mean_accepted_length() const {
  return steps > 0 ? 1.0 + static_cast<double>(accepted) / static_cast<double>(steps) : 0.0;
}
double SpecDecodeStats::acceptance_at(size_t j) const {
  return j < drafted_at.size() && drafted_at[j] > 0 && j < accepted_at.size()
             ? static_cast<double>(accepted_at[j]) / static_cast<double>(drafted_at[j])
             : 0.0;
}

SpecDecodeStats parse_spec_decode_metrics(const std::string& text) {
  SpecDecodeStats s;
  auto count = [&](const char* series) { return static_cast<int64_t>(prometheus_value(text, series, 0)); };
  s.steps = count("deepinfer_spec_decode_num_drafts_total");
  s.drafted = count("deepinfer_spec_decode_num_draft_tokens_total");
  s.accepted = count("deepinfer_spec_decode_num_accepted_tokens_total");
  // Per-position series: NAME{model_name="...",position="J"} V.
  auto per_pos = [&](const std::string& series, std::vector<int64_t>* out) {
    size_t at = 0;
    while ((at = text.find(series + "{", at)) != std::string::npos) {
      const size_t eol = std::min(text.find('\n', at), text.size());
      const std::string line = text.substr(at, eol - at);
      at = eol;
      const size_t p = line.find("position=\"");
      const size_t sp = line.rfind(' ');
      if (p == std::string::npos || sp == std::string::npos) continue;
      const long j = std::strtol(line.c_str() + p + 10, nullptr, 10);
      if (j < 0 || j > 4096) continue;
      if (out->size() <= static_cast<size_t>(j)) out->resize(static_cast<size_t>(j) + 1, 0);
      (*out)[static_cast<size_t>(j)] = static_cast<int64_t>(std::strtod(line.c_str() + sp + 1, nullptr));
    }
  };
  per_pos("deepinfer_spec_decode_num_draft_tokens_per_pos_total", &s.drafted_at);
  per_pos("deepinfer_spec_decode_num_accepted_tokens_per_pos_total", &s.accepted_at);
  const size_t n = std::max(s.drafted_at.size(), s.accepted_at.size());
  s.drafted_at.resize(n, 0);
  s.accepted_at.resize(n, 0);
  return s;
}

SpecDecodeStats spec_decode_delta(const SpecDecodeStats& before, const SpecDecodeStats& after) {
  DI_CHECK(after.steps >= before.steps && after.drafted >= before.drafted && after.accepted >= before.accepted)
      << "bench serve: the server's speculative-decoding counters went down during the run (was it restarted?)";
  SpecDecodeStats d;
  d.steps = after.steps - before.steps;
  d.drafted = after.drafted - before.drafted;
  d.accepted = after.accepted - before.accepted;
  const size_t n = std::max(after.drafted_at.size(), before.drafted_at.size());
  d.drafted_at.assign(n, 0);
  d.accepted_at.assign(n, 0);
  auto at = [](const std::vector<int64_t>& v, size_t j) { return j < v.size() ? v[j] : 0; };
  for (size_t j = 0; j < n; ++j) {
    d.drafted_at[j] = at(after.drafted_at, j) - at(before.drafted_at, j);
    d.accepted_at[j] = at(after.accepted_at, j) - at(before.accepted_at, j);
  }
  // Positions no step of this run reached carry nothing.
  while (!d.drafted_at.empty() && d.drafted_at.back() == 0 && d.accepted_at.back() == 0) {
    d.drafted_at.pop_back();
    d.accepted_at.pop_back();
  }
  return d;
}

ServeBenchReport run_serve_bench(const ServeBenchOptions& o) {
  DI_CHECK(is_loopback(o.host)) << "bench serve: --host must be a loopback address (this is a load generator for "
                                   "a local server), got '"
                                << o.host << "'";
  DI_CHECK(o.port > 0) << "bench serve: --port is required with --host";
  DI_CHECK(o.num_prompts >= 1 && o.num_prompts <= 100000)
      << "--num-prompts must be in [1, 100000], got " << o.num_prompts;
  DI_CHECK(o.max_concurrency >= 1 && o.max_concurrency <= 1024)
      << "--max-concurrency must be in [1, 1024], got " << o.max_concurrency;
  DI_CHECK(o.input_len >= 1 && o.output_len >= 1) << "--input-len and --output-len must be positive";
  DI_CHECK(o.range_ratio >= 0 && o.range_ratio < 1) << "--range-ratio must be in [0, 1), got " << o.range_ratio;
  DI_CHECK(o.request_rate > 0) << "--request-rate must be positive (inf = no pacing), got " << o.request_rate;
  DI_CHECK(o.time_limit_s > 0) << "--time-limit must be positive, got " << o.time_limit_s;

  ServeBenchReport rep;
  const Json models = call_json(o, http::verb::get, "/v1/models", "");
  DI_CHECK_CODE(models.contains("data") && !models["data"].empty(), ErrorCode::kNotFound)
      << "bench serve: /v1/models lists no model";
  rep.model = o.model.empty() ? models["data"][0].value("id", "") : o.model;
  const int64_t max_model_len = models["data"][0].value("max_model_len", int64_t{1} << 30);
  const Json tok = call_json(o, http::verb::post, "/tokenize", Json{{"prompt", kPassage}}.dump());
  std::vector<int64_t> pool;
  for (const auto& t : tok["tokens"]) pool.push_back(t.get<int64_t>());
  DI_CHECK_CODE(!pool.empty(), ErrorCode::kNotFound) << "bench serve: /tokenize returned no tokens";

  const std::optional<SpecDecodeStats> spec_before = scrape_spec(o, /*settle=*/false);

  std::vector<std::pair<int, int>> lengths = sample_lengths(o);
  std::mt19937_64 rng(o.seed ^ 0x5bd1e995u);
  std::vector<std::string> bodies;
  std::vector<double> arrival;
  double t = 0;
  std::exponential_distribution<double> gap(std::isfinite(o.request_rate) ? o.request_rate : 1.0);
  for (auto& [in, out] : lengths) {
    out = static_cast<int>(std::min<int64_t>(out, std::max<int64_t>(1, max_model_len / 2)));
    in = static_cast<int>(std::min<int64_t>(in, std::max<int64_t>(1, max_model_len - out)));
    std::vector<int64_t> ids(static_cast<size_t>(in));
    std::uniform_int_distribution<size_t> pick(0, pool.size() - 1);
    for (auto& id : ids) id = pool[pick(rng)];
    bodies.push_back(Json{
        {"model", rep.model},
        {"prompt", ids},
        {"max_tokens", out},
        {"ignore_eos", true},
        {"temperature", 0},
        {"stream", true},
        {"stream_options", {{"include_usage", true}}},
        {"return_token_ids",
         true}}.dump());
    if (std::isfinite(o.request_rate)) t += gap(rng);
    arrival.push_back(t);
  }

  std::vector<Outcome> results(bodies.size());
  std::vector<char> started(bodies.size(), 0);
  std::atomic<size_t> next{0};
  SocketRegistry sockets;
  const auto t0 = Clock::now();
  const auto deadline = t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.time_limit_s));
  std::vector<std::thread> workers;
  const int nworkers = std::min<int>(o.max_concurrency, static_cast<int>(bodies.size()));
  for (int w = 0; w < nworkers; ++w) {
    workers.emplace_back([&] {
      for (;;) {
        const size_t i = next.fetch_add(1);
        if (i >= bodies.size()) return;
        const auto at = t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(arrival[i]));
        if (at >= deadline) return;
        std::this_thread::sleep_until(at);
        if (Clock::now() >= deadline) return;
        started[i] = 1;
        results[i] = stream_one(o, bodies[i], sockets);
      }
    });
  }
  // The time limit: cut what is still streaming.
  std::atomic<bool> all_done{false};
  std::thread watchdog([&] {
    while (!all_done.load() && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (!all_done.load()) sockets.cut_all();
  });
  for (auto& w : workers) w.join();
  const auto t1 = Clock::now();
  all_done = true;
  watchdog.join();
  if (spec_before) {
    if (const std::optional<SpecDecodeStats> after = scrape_spec(o, /*settle=*/true))
      rep.spec = spec_decode_delta(*spec_before, *after);
  }

  rep.distribution = o.lengths == LengthDistribution::kRandom ? "random" : "sharegpt";
  rep.num_prompts = o.num_prompts;
  rep.max_concurrency = o.max_concurrency;
  rep.request_rate = o.request_rate;
  rep.wall_s = std::chrono::duration<double>(t1 - t0).count();
  std::vector<double> ttft, tpot, itl, e2e;
  for (size_t i = 0; i < results.size(); ++i) {
    if (!started[i]) continue;
    const Outcome& r = results[i];
    if (!r.ok) {
      ++rep.failed;
      if (rep.first_error.empty()) rep.first_error = r.error;
      continue;
    }
    ++rep.completed;
    rep.input_tokens += r.prompt_tokens;
    rep.output_tokens += r.output_tokens;
    if (r.ttft >= 0) ttft.push_back(r.ttft);
    if (r.ttft >= 0 && r.output_tokens > 1) tpot.push_back((r.e2e - r.ttft) / static_cast<double>(r.output_tokens - 1));
    itl.insert(itl.end(), r.itl.begin(), r.itl.end());
    e2e.push_back(r.e2e);
  }
  rep.request_throughput = rep.completed / rep.wall_s;
  rep.output_throughput = static_cast<double>(rep.output_tokens) / rep.wall_s;
  rep.total_token_throughput = static_cast<double>(rep.input_tokens + rep.output_tokens) / rep.wall_s;
  rep.ttft = latency_stats(ttft);
  rep.tpot = latency_stats(tpot);
  rep.itl = latency_stats(itl);
  rep.e2e = latency_stats(e2e);
  return rep;
}

std::string ServeBenchReport::to_json() const {
  nlohmann::ordered_json j = {{"model", model},
                              {"dataset", distribution},
                              {"num_prompts", num_prompts},
                              {"completed", completed},
                              {"failed", failed},
                              {"max_concurrency", max_concurrency},
                              {"request_rate", std::isfinite(request_rate) ? Json(request_rate) : Json("inf")},
                              {"duration_s", wall_s},
                              {"total_input_tokens", input_tokens},
                              {"total_output_tokens", output_tokens},
                              {"request_throughput", request_throughput},
                              {"output_throughput", output_throughput},
                              {"total_token_throughput", total_token_throughput}};
  for (const auto& [name, s] :
       {std::pair<const char*, const LatencyStats*>{"ttft", &ttft}, {"tpot", &tpot}, {"itl", &itl}, {"e2el", &e2e}}) {
    j[fmt::format("mean_{}_ms", name)] = s->mean_ms;
    j[fmt::format("median_{}_ms", name)] = s->median_ms;
    j[fmt::format("p99_{}_ms", name)] = s->p99_ms;
  }
  if (spec.steps > 0) {
    std::vector<double> per;
    for (size_t i = 0; i < spec.drafted_at.size(); ++i) per.push_back(spec.acceptance_at(i));
    j["spec_decode"] = {{"num_drafts", spec.steps},
                        {"num_draft_tokens", spec.drafted},
                        {"num_accepted_tokens", spec.accepted},
                        {"acceptance_rate", spec.acceptance_rate()},
                        {"mean_acceptance_length", spec.mean_accepted_length()},
                        {"num_draft_tokens_per_pos", spec.drafted_at},
                        {"num_accepted_tokens_per_pos", spec.accepted_at},
                        {"acceptance_rate_per_pos", per}};
  }
  if (!first_error.empty()) j["first_error"] = first_error;
  return j.dump(1);
}

std::string ServeBenchReport::table() const {
  std::string t = "============ Serving Benchmark Result ============\n";
  auto row = [&](const std::string& k, const std::string& v) { t += fmt::format("{:<40}{:>10}\n", k, v); };
  row("Model:", model);
  row("Dataset (lengths):", distribution);
  row("Successful requests:", std::to_string(completed));
  row("Failed requests:", std::to_string(failed));
  row("Max concurrency:", std::to_string(max_concurrency));
  row("Request rate (req/s):", std::isfinite(request_rate) ? fmt::format("{:.2f}", request_rate) : "inf");
  row("Benchmark duration (s):", fmt::format("{:.2f}", wall_s));
  row("Total input tokens:", std::to_string(input_tokens));
  row("Total generated tokens:", std::to_string(output_tokens));
  row("Request throughput (req/s):", fmt::format("{:.2f}", request_throughput));
  row("Output token throughput (tok/s):", fmt::format("{:.2f}", output_throughput));
  row("Total token throughput (tok/s):", fmt::format("{:.2f}", total_token_throughput));
  for (const auto& [title, name, s] :
       {std::tuple<const char*, const char*, const LatencyStats*>{"Time to First Token", "TTFT", &ttft},
        {"Time per Output Token (excl. 1st token)", "TPOT", &tpot},
        {"Inter-token Latency", "ITL", &itl},
        {"End-to-end Latency", "E2EL", &e2e}}) {
    t += fmt::format("{:-^50}\n", std::string(title));
    row(fmt::format("Mean {} (ms):", name), fmt::format("{:.2f}", s->mean_ms));
    row(fmt::format("Median {} (ms):", name), fmt::format("{:.2f}", s->median_ms));
    row(fmt::format("P99 {} (ms):", name), fmt::format("{:.2f}", s->p99_ms));
  }
  if (spec.steps > 0) {
    t += fmt::format("{:-^50}\n", std::string("Speculative Decoding"));
    row("Acceptance rate (%):", fmt::format("{:.2f}", 100 * spec.acceptance_rate()));
    row("Mean acceptance length:", fmt::format("{:.2f}", spec.mean_accepted_length()));
    row("Drafts (verification steps):", std::to_string(spec.steps));
    row("Draft tokens:", std::to_string(spec.drafted));
    row("Accepted tokens:", std::to_string(spec.accepted));
    t += "Per-position acceptance (%):\n";
    for (size_t i = 0; i < spec.drafted_at.size(); ++i)
      row(fmt::format("  Position {}:", i), fmt::format("{:.2f}", 100 * spec.acceptance_at(i)));
  }
  t += std::string(50, '=') + "\n";
  if (!first_error.empty()) t += "first error: " + first_error + "\n";
  return t;
}

}  // namespace deepinfer::bench
