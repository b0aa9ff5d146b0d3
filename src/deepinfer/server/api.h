// ServerApi: the protocol layer between HTTP and the engine. It turns (method, path, body) into either an
// immediate reply or a prepared generation (engine Request + the GenerationJob that renders its deltas). It
// never touches the engine or sockets, so every route is testable with plain strings.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "deepinfer/engine/request.h"
#include "deepinfer/server/api_error.h"
#include "deepinfer/server/generation_job.h"
#include "deepinfer/server/model_host.h"
#include "deepinfer/server/request_fields.h"

namespace deepinfer::server {

struct HttpReply {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
};

using RouteOutcome = std::variant<HttpReply, PreparedGeneration>;

// Which error body shape a path uses.
enum class ErrorStyle { kOpenAI, kAnthropic };
ErrorStyle error_style_for(const std::string& path);
HttpReply error_reply(const ApiError& e, ErrorStyle style);

class ServerApi {
 public:
  ServerApi(const ModelHost& host, RequestLimits limits) : host_(host), limits_(limits) {}

  // Throws nothing: errors become replies in the route's error shape.
  RouteOutcome handle(const std::string& method, const std::string& path, const std::string& body);

  // Routes (throw ApiError).
  HttpReply models() const;
  PreparedGeneration chat_completions(const Json& body);
  PreparedGeneration completions(const Json& body);
  PreparedGeneration messages(const Json& body);
  HttpReply count_tokens(const Json& body) const;
  PreparedGeneration responses(const Json& body);
  HttpReply tokenize(const Json& body) const;
  HttpReply detokenize(const Json& body) const;

  const ModelHost& host() const { return host_; }
  const RequestLimits& limits() const { return limits_; }

  // Shared by the protocol files.
  void check_model(const Json& body) const;
  const tokenizer::Tokenizer& require_tokenizer(const char* what) const;
  std::string next_id(const char* prefix);
  // A GenerationSpec with this server's id, model name and EOS ids filled in.
  GenerationSpec new_spec(const char* id_prefix);
  // Chat messages (OpenAI shape, content possibly as parts) → prompt ids; fills thinking / format into `out`.
  std::vector<TokenId> encode_chat(const Json& chat_json, SampleOutputOptions* out) const;
  // Compiles a structured-output constraint now (400 naming `field` if it is invalid or unavailable); the
  // engine's compile of the same constraint is then a cache hit.
  void check_structured(const SamplingParams& p, const std::string& field) const;

 private:
  const ModelHost& host_;
  RequestLimits limits_;
  std::atomic<uint64_t> counter_{0};
};

}  // namespace deepinfer::server
