#include "deepinfer/server/request_fields.h"

#include <algorithm>
#include <cmath>

#include "deepinfer/core/error.h"

namespace deepinfer::server {

namespace {
std::string type_name(const Json& j) { return j.type_name(); }
}  // namespace

int json_nesting_depth(std::string_view text, int limit) {
  int depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
      if (deepest > limit) return limit + 1;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return deepest;
}

Json parse_body(const std::string& body, int max_depth) {
  if (json_nesting_depth(body, max_depth) > max_depth)
    throw ApiError(400, "request body nests arrays/objects deeper than " + std::to_string(max_depth) + " levels",
                   "body");
  Json j;
  try {
    j = Json::parse(body);
  } catch (const nlohmann::json::exception& e) {
    // parse_error for bad syntax, out_of_range for a number JSON allows but a double cannot hold (1e999).
    throw ApiError(400, std::string("request body is not valid JSON: ") + e.what(), "body");
  }
  if (!j.is_object()) throw ApiError(400, "request body must be a JSON object, got " + type_name(j), "body");
  return j;
}

const Json* Fields::get(const char* key) const {
  auto it = obj_.find(key);
  if (it == obj_.end() || it->is_null()) return nullptr;
  return &*it;
}

std::optional<double> Fields::number(const char* key, double lo, double hi) const {
  const Json* v = get(key);
  if (!v) return std::nullopt;
  if (!v->is_number()) throw bad_request(name(key), name(key) + " must be a number, got " + type_name(*v));
  double d = v->get<double>();
  if (!std::isfinite(d) || d < lo || d > hi)
    throw bad_request(name(key), name(key) + " must be in [" + nlohmann::json(lo).dump() + ", " +
                                     nlohmann::json(hi).dump() + "], got " + v->dump());
  return d;
}

std::optional<int64_t> Fields::integer(const char* key, int64_t lo, int64_t hi) const {
  const Json* v = get(key);
  if (!v) return std::nullopt;
  if (!v->is_number_integer()) {
    // 3.0 is accepted as 3 (some clients serialize every number as a float).
    if (v->is_number_float() && std::isfinite(v->get<double>()) && std::floor(v->get<double>()) == v->get<double>() &&
        std::abs(v->get<double>()) < 9e15) {
      int64_t i = static_cast<int64_t>(v->get<double>());
      if (i < lo || i > hi)
        throw bad_request(name(key), name(key) + " must be in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                                         "], got " + v->dump());
      return i;
    }
    throw bad_request(name(key), name(key) + " must be an integer, got " + type_name(*v) + " " + v->dump());
  }
  int64_t i;
  if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
    i = INT64_MAX;
  else
    i = v->get<int64_t>();
  if (i < lo || i > hi)
    throw bad_request(name(key), name(key) + " must be in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                                     "], got " + v->dump());
  return i;
}

std::optional<bool> Fields::boolean(const char* key) const {
  const Json* v = get(key);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) throw bad_request(name(key), name(key) + " must be a boolean, got " + type_name(*v));
  return v->get<bool>();
}

std::optional<std::string> Fields::string(const char* key) const {
  const Json* v = get(key);
  if (!v) return std::nullopt;
  if (!v->is_string()) throw bad_request(name(key), name(key) + " must be a string, got " + type_name(*v));
  return v->get<std::string>();
}

std::vector<std::string> Fields::string_or_list(const char* key, size_t max_items) const {
  const Json* v = get(key);
  if (!v) return {};
  std::vector<std::string> out;
  if (v->is_string()) {
    out.push_back(v->get<std::string>());
  } else if (v->is_array()) {
    for (size_t i = 0; i < v->size(); ++i) {
      if (!(*v)[i].is_string())
        throw bad_request(name(key), name(key) + "[" + std::to_string(i) + "] must be a string");
      out.push_back((*v)[i].get<std::string>());
    }
  } else {
    throw bad_request(name(key), name(key) + " must be a string or an array of strings, got " + type_name(*v));
  }
  if (out.size() > max_items)
    throw bad_request(name(key), name(key) + " has " + std::to_string(out.size()) + " entries, at most " +
                                     std::to_string(max_items) + " are allowed");
  for (size_t i = 0; i < out.size(); ++i)
    if (out[i].empty()) throw bad_request(name(key), name(key) + "[" + std::to_string(i) + "] must not be empty");
  return out;
}

std::vector<int64_t> Fields::integer_list(const char* key, int64_t lo, int64_t hi) const {
  const Json* v = get(key);
  if (!v) return {};
  if (!v->is_array()) throw bad_request(name(key), name(key) + " must be an array of integers");
  std::vector<int64_t> out;
  for (size_t i = 0; i < v->size(); ++i) {
    const Json& e = (*v)[i];
    const std::string n = name(key) + "[" + std::to_string(i) + "]";
    if (!e.is_number_integer()) throw bad_request(name(key), n + " must be an integer");
    int64_t x = e.get<int64_t>();
    if (x < lo || x > hi)
      throw bad_request(name(key), n + " must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " +
                                       std::to_string(x));
    out.push_back(x);
  }
  return out;
}

SamplingParams parse_openai_sampling(const Json& body, bool chat, int64_t vocab_size, const RequestLimits& limits,
                                     std::string* structured_field_out) {
  Fields f(body);
  SamplingParams p;
  if (auto v = f.number("temperature", 0.0, 2.0)) p.temperature = static_cast<float>(*v);
  if (auto v = f.number("top_p", 0.0, 1.0)) {
    if (*v == 0.0) throw bad_request("top_p", "top_p must be in (0, 1], got 0");
    p.top_p = static_cast<float>(*v);
  }
  if (auto v = f.integer("top_k", -1, INT32_MAX)) p.top_k = static_cast<int>(*v);
  if (auto v = f.number("min_p", 0.0, 1.0)) p.min_p = static_cast<float>(*v);
  if (auto v = f.number("presence_penalty", -2.0, 2.0)) p.presence_penalty = static_cast<float>(*v);
  if (auto v = f.number("frequency_penalty", -2.0, 2.0)) p.frequency_penalty = static_cast<float>(*v);
  if (auto v = f.number("repetition_penalty", 1e-6, 1e6)) p.repetition_penalty = static_cast<float>(*v);
  if (auto v = f.integer("seed", INT64_MIN, INT64_MAX)) p.seed = static_cast<uint64_t>(*v);
  const int64_t max_tokens_cap = limits.max_tokens > 0 ? limits.max_tokens : INT32_MAX;
  std::optional<int64_t> max_tokens = f.integer("max_tokens", 1, max_tokens_cap);
  if (chat) {
    if (auto v = f.integer("max_completion_tokens", 1, max_tokens_cap)) max_tokens = v;
  }
  if (max_tokens) p.max_tokens = static_cast<int>(*max_tokens);
  if (auto v = f.integer("min_tokens", 0, max_tokens_cap)) p.min_tokens = static_cast<int>(*v);
  if (auto v = f.integer("n", 1, limits.max_n)) p.n = static_cast<int>(*v);
  if (auto v = f.integer("best_of", 1, limits.max_n))
    if (*v != p.n) throw bad_request("best_of", "best_of other than n is not supported");
  if (f.boolean("use_beam_search").value_or(false))
    throw bad_request("use_beam_search", "beam search is not supported");
  p.stop = f.string_or_list("stop", 16);
  for (int64_t t : f.integer_list("stop_token_ids", 0, vocab_size - 1))
    p.stop_token_ids.push_back(static_cast<TokenId>(t));
  if (auto v = f.boolean("ignore_eos")) p.ignore_eos = *v;
  if (chat) {
    const bool want = f.boolean("logprobs").value_or(false);
    auto top = f.integer("top_logprobs", 0, kMaxTopLogprobs);
    if (top && !want) throw bad_request("top_logprobs", "top_logprobs requires logprobs: true");
    if (want) p.logprobs = static_cast<int>(top.value_or(0));
  } else {
    // Completions: logprobs is the number of top alternatives (0..5 in OpenAI, up to 20 here).
    if (const Json* v = f.get("logprobs"); v && v->is_boolean()) {
      if (v->get<bool>()) p.logprobs = 0;
    } else if (auto n = f.integer("logprobs", 0, kMaxTopLogprobs)) {
      p.logprobs = static_cast<int>(*n);
    }
  }
  if (const Json* lb = f.get("logit_bias"); lb && !(lb->is_object() && lb->empty()))
    throw bad_request("logit_bias", "logit_bias is not supported by this server");
  // Structured output: OpenAI's response_format, vLLM's guided_* and the regex / grammar extensions.
  std::string structured_field;
  auto constrain = [&](StructuredOutputParams sp, const std::string& field) {
    if (sp.spec.size() > limits.max_constraint_bytes)
      throw bad_request(field, field + ": the constraint is " + std::to_string(sp.spec.size()) +
                                   " bytes, more than this server's limit of " +
                                   std::to_string(limits.max_constraint_bytes));
    if (p.structured.active())
      throw bad_request(field, field + ": only one structured-output constraint per request (" + structured_field +
                                   " is already set)");
    p.structured = std::move(sp);
    structured_field = field;
  };
  auto schema_text = [](const Json& v, const std::string& field) {
    if (v.is_object() || v.is_boolean()) return v.dump();
    if (v.is_string()) return v.get<std::string>();
    throw bad_request(field, field + " must be a JSON Schema (an object)");
  };
  if (const Json* rf = f.get("response_format")) {
    if (!rf->is_object()) throw bad_request("response_format", "response_format must be an object");
    Fields rff(*rf, "response_format.");
    std::string type = rff.string("type").value_or("");
    if (type == "json_object") {
      constrain(StructuredOutputParams::json_object(), "response_format");
    } else if (type == "json_schema") {
      const Json* js = rff.get("json_schema");
      if (!js || !js->is_object())
        throw bad_request("response_format", "response_format.json_schema must be an object with a \"schema\"");
      auto sc = js->find("schema");
      if (sc == js->end()) throw bad_request("response_format", "response_format.json_schema.schema is required");
      constrain(StructuredOutputParams::json_schema(schema_text(*sc, "response_format.json_schema.schema")),
                "response_format");
    } else if (type != "text") {
      throw bad_request("response_format",
                        "response_format.type must be text, json_object or json_schema, got \"" + type + "\"");
    }
  }
  if (const Json* g = f.get("guided_json"))
    constrain(StructuredOutputParams::json_schema(schema_text(*g, "guided_json")), "guided_json");
  for (const char* key : {"guided_regex", "regex"})
    if (auto r = f.string(key)) constrain(StructuredOutputParams::regex(*r), key);
  for (const char* key : {"guided_grammar", "grammar"})
    if (auto r = f.string(key)) constrain(StructuredOutputParams::grammar(*r), key);
  if (f.get("guided_choice")) throw bad_request("guided_choice", "guided_choice is not supported; use regex");
  if (structured_field_out) *structured_field_out = structured_field;
  validate_sampling(p, vocab_size);
  return p;
}

SamplingParams parse_aliased_sampling(const Json& body, std::initializer_list<FieldAlias> fields, Json openai_view,
                                      int64_t vocab_size, const RequestLimits& limits, std::string* structured_field) {
  Fields f(body);
  for (const FieldAlias& a : fields)
    if (const Json* v = f.get(a.name)) openai_view[a.openai_name] = *v;
  auto client_name = [&](const std::string& openai_name) {
    for (const FieldAlias& a : fields)
      if (openai_name == a.openai_name) return std::string(a.name);
    return openai_name;
  };
  try {
    SamplingParams p = parse_openai_sampling(openai_view, /*chat=*/true, vocab_size, limits, structured_field);
    if (structured_field && !structured_field->empty()) *structured_field = client_name(*structured_field);
    return p;
  } catch (const ApiError& e) {
    const std::string name = client_name(e.param());
    if (name == e.param()) throw;
    std::string message = e.message();
    if (message.rfind(e.param(), 0) == 0) message = name + message.substr(e.param().size());
    throw ApiError(e.status(), message, name, e.type(), e.code());
  }
}

void validate_sampling(const SamplingParams& p, int64_t vocab_size) {
  try {
    validate(p, vocab_size);
  } catch (const Error& e) {
    const std::string& m = e.message();
    size_t end = m.find_first_of(" [");
    throw bad_request(m.substr(0, end), m);
  }
}

void fit_to_context(SamplingParams* p, int64_t prompt_len, int64_t max_model_len, const char* prompt_field) {
  if (prompt_len > max_model_len)
    throw ApiError(400,
                   "the prompt has " + std::to_string(prompt_len) + " tokens, more than this model's context of " +
                       std::to_string(max_model_len) + " tokens",
                   prompt_field, "invalid_request_error", "context_length_exceeded");
  if (p->max_tokens) {
    if (prompt_len + *p->max_tokens > max_model_len)
      throw ApiError(400,
                     "the prompt (" + std::to_string(prompt_len) + " tokens) plus max_tokens (" +
                         std::to_string(*p->max_tokens) + ") is more than this model's context of " +
                         std::to_string(max_model_len) + " tokens",
                     "max_tokens", "invalid_request_error", "context_length_exceeded");
  } else {
    p->max_tokens = static_cast<int>(std::max<int64_t>(1, max_model_len - prompt_len));
  }
  if (p->min_tokens > *p->max_tokens)
    throw bad_request("min_tokens", "min_tokens (" + std::to_string(p->min_tokens) + ") exceeds the room left (" +
                                        std::to_string(*p->max_tokens) + " tokens)");
}

}  // namespace deepinfer::server
