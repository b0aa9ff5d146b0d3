// Typed access to a JSON request body: every type or range error is an ApiError 400 naming the field, so the
// protocol code reads like a schema and never throws nlohmann's type errors at a client.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "deepinfer/sampling/sampling_params.h"
#include "deepinfer/server/api_error.h"

namespace deepinfer::server {

using Json = nlohmann::ordered_json;

// Parses a request body; malformed JSON, a non-object, or arrays/objects nested deeper than `max_depth` levels
// (checked before parsing, so that no deep tree is ever built) is a 400.
Json parse_body(const std::string& body, int max_depth = 128);

// The deepest array/object nesting in a JSON text (brackets inside strings do not count); stops counting and
// returns `limit + 1` as soon as the depth exceeds `limit`. Malformed text gives some depth; the parser rejects it.
int json_nesting_depth(std::string_view text, int limit);

class Fields {
 public:
  // `prefix` is prepended to field names in errors ("" for the top level, "stream_options." for nested ones).
  explicit Fields(const Json& obj, std::string prefix = {}) : obj_(obj), prefix_(std::move(prefix)) {}

  // Null when the key is absent or JSON null.
  const Json* get(const char* key) const;
  std::optional<double> number(const char* key, double lo, double hi) const;
  std::optional<int64_t> integer(const char* key, int64_t lo, int64_t hi) const;
  std::optional<bool> boolean(const char* key) const;
  std::optional<std::string> string(const char* key) const;
  // A string or an array of strings (OpenAI's `stop`).
  std::vector<std::string> string_or_list(const char* key, size_t max_items) const;
  std::vector<int64_t> integer_list(const char* key, int64_t lo, int64_t hi) const;
  std::string name(const char* key) const { return prefix_ + key; }

 private:
  const Json& obj_;
  std::string prefix_;
};

// Limits the server enforces on top of SamplingParams' own ranges.
struct RequestLimits {
  int max_n = 16;
  int64_t max_tokens = 0;  // 0 = max_model_len
  // Arrays/objects nested deeper than this in a request body: 400 (bounds every recursive walk of the body).
  int max_json_depth = 128;
  // A structured-output constraint (JSON Schema text, regex, EBNF grammar) longer than this: 400. Compiling one
  // runs on the engine thread, so its size is bounded as well as its automaton (structured::CompileLimits).
  size_t max_constraint_bytes = 64u << 10;
};

// SamplingParams from the OpenAI fields (chat and completions; `chat` selects logprobs' shape: a boolean plus
// top_logprobs, vs an integer). vLLM's extensions top_k, min_p, repetition_penalty, min_tokens, ignore_eos and
// stop_token_ids are accepted. Structured output comes from response_format (json_object, json_schema), vLLM's
// guided_json / guided_regex / guided_grammar, or the `regex` / `grammar` extensions; the field that set it goes
// to `structured_field`. Unsupported features (logit_bias, guided_choice) are 400s that say so, never ignored.
SamplingParams parse_openai_sampling(const Json& body, bool chat, int64_t vocab_size, const RequestLimits& limits,
                                     std::string* structured_field = nullptr);

// Another API's spelling of an OpenAI request field (Anthropic's stop_sequences is OpenAI's stop).
struct FieldAlias {
  const char* name;
  const char* openai_name;
};

// Sampling params of an API that spells OpenAI's fields its own way (messages, responses): the `fields` present in
// `body` are copied under their OpenAI names into `openai_view` (which may already hold converted fields, such as
// the Responses API's text.format as response_format), parsed by parse_openai_sampling as a chat request, and any
// error (and `structured_field`) names the client's field, not OpenAI's.
SamplingParams parse_aliased_sampling(const Json& body, std::initializer_list<FieldAlias> fields, Json openai_view,
                                      int64_t vocab_size, const RequestLimits& limits,
                                      std::string* structured_field = nullptr);

// Runs deepinfer::validate and maps its InvalidArgument to a 400 whose param is the field the message names.
void validate_sampling(const SamplingParams& p, int64_t vocab_size);

// A prompt of `prompt_len` tokens with `p.max_tokens` must fit max_model_len; 400 "prompt too long" otherwise.
// Unset max_tokens becomes the room left.
void fit_to_context(SamplingParams* p, int64_t prompt_len, int64_t max_model_len, const char* prompt_field);

}  // namespace deepinfer::server
