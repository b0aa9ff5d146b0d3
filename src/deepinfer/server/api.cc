#include "deepinfer/server/api.h"

#include <fmt/format.h>

#include "deepinfer/core/error.h"
#include "deepinfer/core/logging.h"
#include "deepinfer/structured/grammar_compiler.h"

namespace deepinfer::server {

ErrorStyle error_style_for(const std::string& path) {
  return path.rfind("/v1/messages", 0) == 0 ? ErrorStyle::kAnthropic : ErrorStyle::kOpenAI;
}

HttpReply error_reply(const ApiError& e, ErrorStyle style) {
  HttpReply r;
  r.status = e.status();
  r.body = dump_json(style == ErrorStyle::kAnthropic ? e.anthropic_body() : e.openai_body());
  return r;
}

namespace {
HttpReply json_reply(const OJson& j) {
  HttpReply r;
  r.body = dump_json(j);
  return r;
}
}  // namespace

RouteOutcome ServerApi::handle(const std::string& method, const std::string& path, const std::string& body) {
  const ErrorStyle style = error_style_for(path);
  try {
    if (path == "/v1/models") {
      if (method != "GET") throw ApiError(405, "use GET for " + path);
      return models();
    }
    struct PostRoute {
      const char* path;
      int kind;
    };
    static const PostRoute routes[] = {
        {"/v1/chat/completions", 0}, {"/v1/completions", 1}, {"/v1/messages", 2}, {"/v1/messages/count_tokens", 3},
        {"/v1/responses", 4},        {"/tokenize", 5},       {"/detokenize", 6}};
    for (const auto& r : routes) {
      if (path != r.path) continue;
      if (method != "POST") throw ApiError(405, std::string("use POST for ") + r.path);
      Json j = parse_body(body, limits_.max_json_depth);
      switch (r.kind) {
        case 0:
          return chat_completions(j);
        case 1:
          return completions(j);
        case 2:
          return messages(j);
        case 3:
          return count_tokens(j);
        case 4:
          return responses(j);
        case 5:
          return tokenize(j);
        default:
          return detokenize(j);
      }
    }
    throw ApiError(404, "no route for " + method + " " + path);
  } catch (const ApiError& e) {
    return error_reply(e, style);
  } catch (const Error& e) {
    // A checked failure below the protocol layer (chat parsing, tokenizer): the client's input named in the text.
    const int status = e.code() == ErrorCode::kInvalidArgument || e.code() == ErrorCode::kNotFound ||
                               e.code() == ErrorCode::kUnsupported
                           ? 400
                           : 500;
    if (status == 500) DI_LOG_ERROR("{} {}: {}", method, path, e.what());
    return error_reply(ApiError(status, e.message()), style);
  } catch (const std::exception& e) {
    DI_LOG_ERROR("{} {}: {}", method, path, e.what());
    return error_reply(ApiError(500, std::string("internal error: ") + e.what()), style);
  }
}

HttpReply ServerApi::models() const {
  OJson m = {{"id", host_.name()},
             {"object", "model"},
             {"created", host_.created_unix()},
             {"owned_by", "deepinfer"},
             {"max_model_len", host_.max_model_len()}};
  return json_reply({{"object", "list"}, {"data", OJson::array({m})}});
}

void ServerApi::check_model(const Json& body) const {
  Fields f(body);
  auto model = f.string("model");
  if (!model) throw bad_request("model", "model is required (this server serves \"" + host_.name() + "\")");
  if (*model != host_.name())
    throw ApiError(404, "the model \"" + *model + "\" does not exist; this server serves \"" + host_.name() + "\"",
                   "model", "invalid_request_error", "model_not_found");
}

const tokenizer::Tokenizer& ServerApi::require_tokenizer(const char* what) const {
  if (!host_.tokenizer())
    throw ApiError(400, std::string(what) +
                            " needs the model's tokenizer.json, which this model directory lacks; "
                            "send token ids instead");
  return *host_.tokenizer();
}

std::string ServerApi::next_id(const char* prefix) {
  return fmt::format("{}{:016x}", prefix, (counter_.fetch_add(1) + 1) * 0x9E3779B97F4A7C15ull);
}

GenerationSpec ServerApi::new_spec(const char* id_prefix) {
  GenerationSpec s;
  s.ctx.id = next_id(id_prefix);
  s.ctx.model = host_.name();
  s.eos_token_ids = host_.engine_config().eos_token_ids;
  return s;
}

std::vector<TokenId> ServerApi::encode_chat(const Json& chat, SampleOutputOptions* out) const {
  const tokenizer::Tokenizer& tok = require_tokenizer("chat");
  tokenizer::ChatRequest req;
  try {
    req = tokenizer::parse_chat_request(chat);
  } catch (const Error& e) {
    throw bad_request("messages", e.message());
  }
  if (req.messages.empty()) throw bad_request("messages", "messages must not be empty");
  tokenizer::RenderedPrompt rendered = tokenizer::render_chat(req, host_.chat_format());
  std::vector<TokenId> ids;
  try {
    ids = tokenizer::encode_prompt(tok, rendered);
  } catch (const Error& e) {
    throw ApiError(400, "this model's tokenizer cannot encode its chat format: " + e.message(), "messages");
  }
  out->tok = &tok;
  out->chat = true;
  out->format = host_.chat_format();
  out->thinking = req.thinking;
  out->skip_special_tokens = false;
  return ids;
}

void ServerApi::check_structured(const SamplingParams& p, const std::string& field) const {
  if (!p.structured.active()) return;
  structured::GrammarCompiler* compiler = host_.grammar_compiler();
  if (!compiler)
    throw bad_request(field, "structured output is not available for this model: " + host_.structured_unavailable());
  try {
    compiler->compile(p.structured);
  } catch (const Error& e) {
    throw bad_request(field, e.message());
  }
}

HttpReply ServerApi::tokenize(const Json& body) const {
  Fields f(body);
  if (f.get("model")) check_model(body);
  std::vector<TokenId> ids;
  if (f.get("messages")) {
    SampleOutputOptions unused;
    Json chat = body;
    if (!chat.contains("thinking")) chat["thinking"] = false;
    ids = encode_chat(chat, &unused);
  } else {
    auto prompt = f.string("prompt");
    if (!prompt) throw bad_request("prompt", "prompt (a string) or messages is required");
    ids = require_tokenizer("tokenize").encode(*prompt);
  }
  OJson r = {{"count", ids.size()}, {"max_model_len", host_.max_model_len()}, {"tokens", ids}};
  if (f.boolean("return_token_strs").value_or(false)) {
    OJson strs = OJson::array();
    for (TokenId id : ids) strs.push_back(host_.tokenizer()->id_to_token(id).value_or(""));
    r["token_strs"] = strs;
  }
  return json_reply(r);
}

HttpReply ServerApi::detokenize(const Json& body) const {
  Fields f(body);
  if (f.get("model")) check_model(body);
  const auto ids = f.integer_list("tokens", 0, host_.vocab_size() - 1);
  std::vector<TokenId> t(ids.begin(), ids.end());
  const auto& tok = require_tokenizer("detokenize");
  for (size_t i = 0; i < t.size(); ++i)
    if (!tok.is_valid_id(t[i])) throw bad_request("tokens", fmt::format("tokens[{}] = {} names no token", i, t[i]));
  return json_reply({{"prompt", tok.decode(t)}});
}

}  // namespace deepinfer::server
