// GenerationJob: one API request in flight, protocol side. The HTTP session feeds it the engine's deltas (on the
// connection's strand) and writes what it returns: SSE events while streaming, one JSON body at the end
// otherwise. Subclasses (chat completions, completions, messages, responses) only render.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "deepinfer/engine/request.h"
#include "deepinfer/sampling/sampling_params.h"
#include "deepinfer/server/api_error.h"
#include "deepinfer/server/sample_output.h"

namespace deepinfer::server {

using OJson = nlohmann::ordered_json;

// JSON text that never throws on bad UTF-8 (replaced by U+FFFD).
std::string dump_json(const OJson& j);
std::string sse_data(const OJson& j);
std::string sse_event(const std::string& event, const OJson& j);

struct JobContext {
  std::string id;  // API id (chatcmpl-..., cmpl-..., msg_..., resp_...), also the engine request id
  std::string model;
  int64_t created = 0;
  int64_t prompt_len = 0;
  int n = 1;
  bool stream = false;
  bool include_usage = false;
  std::optional<int> logprobs;  // as in SamplingParams
  SampleOutputOptions output;
};

class GenerationJob {
 public:
  explicit GenerationJob(JobContext ctx);
  virtual ~GenerationJob() = default;

  const JobContext& context() const { return ctx_; }
  bool stream() const { return ctx_.stream; }
  bool done() const { return num_finished_ == ctx_.n; }
  std::string on_delta(const SequenceDelta& d);
  // Streaming: events before the first delta. Non-streaming: unused.
  virtual std::string prologue() { return {}; }
  // Streaming: the closing events; non-streaming: the JSON response body.
  virtual std::string epilogue() = 0;
  // Streaming: an error event after the stream started (the status line is already sent).
  virtual std::string stream_error(const ApiError& e) { return sse_data(e.openai_body()); }
  // Non-streaming error body (Anthropic routes use their own shape).
  virtual std::string error_body(const ApiError& e) const { return dump_json(e.openai_body()); }

 protected:
  // One sample's new text. Returns SSE text to send now (streaming) or "" (accumulated for the epilogue).
  virtual std::string emit(int index, const tokenizer::ChatDelta& delta, const SequenceDelta& d) = 0;
  std::string token_text(TokenId id) const;
  // The usage block in each API's shape.
  OJson usage_json() const;            // OpenAI chat / completions
  OJson anthropic_usage_json() const;  // messages
  OJson responses_usage_json() const;  // responses

  JobContext ctx_;
  std::vector<SampleOutput> samples_;
  int num_finished_ = 0;
  int64_t completion_tokens_ = 0;
};

// An engine request and the job that renders its deltas.
struct PreparedGeneration {
  Request request;
  std::unique_ptr<GenerationJob> job;
};

// What a route has parsed; prepare_generation derives the rest of the JobContext (prompt_len, n, logprobs, stop,
// eos) from the prompt and the sampling params the same way for every API.
struct GenerationSpec {
  JobContext ctx;  // id, model, stream, include_usage, output (tokenizer, chat format, thinking) set by the route
  std::vector<TokenId> prompt;
  SamplingParams params;
  int priority = 0;
  std::vector<TokenId> eos_token_ids;
};

template <class Job, class... Args>
PreparedGeneration prepare_generation(GenerationSpec spec, Args&&... job_args);

// Fills the derived JobContext fields and the request (the part of prepare_generation that is not a template).
JobContext finish_context(GenerationSpec* spec, Request* request);

template <class Job, class... Args>
PreparedGeneration prepare_generation(GenerationSpec spec, Args&&... job_args) {
  PreparedGeneration g;
  JobContext ctx = finish_context(&spec, &g.request);
  g.job = std::make_unique<Job>(std::move(ctx), std::forward<Args>(job_args)...);
  return g;
}

}  // namespace deepinfer::server
