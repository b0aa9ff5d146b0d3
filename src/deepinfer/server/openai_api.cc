// OpenAI routes: POST /v1/chat/completions and POST /v1/completions, streaming (SSE ending in `data: [DONE]`)
// and not.
#include <limits>

#include <fmt/format.h>

#include "deepinfer/server/api.h"

namespace deepinfer::server {

namespace {

// vLLM's request extension: the priority scheduling policy serves lower values first (the FCFS policy ignores it).
int parse_priority(const Fields& f) {
  return static_cast<int>(
      f.integer("priority", std::numeric_limits<int>::min(), std::numeric_limits<int>::max()).value_or(0));
}

// OpenAI content: a string or an array of parts; only text parts are understood.
std::string flatten_content(const Json& content, const std::string& where) {
  if (content.is_null() || content.is_string()) return content.is_null() ? std::string() : content.get<std::string>();
  if (!content.is_array()) throw bad_request("messages", where + " must be a string or an array of content parts");
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    const Json& part = content[i];
    const std::string pw = where + "[" + std::to_string(i) + "]";
    if (!part.is_object()) throw bad_request("messages", pw + " must be an object");
    auto type = part.find("type");
    const std::string t = type != part.end() && type->is_string() ? type->get<std::string>() : "";
    if (t != "text" && t != "input_text" && t != "output_text")
      throw bad_request("messages", pw + ": content part type \"" + t + "\" is not supported (text only)");
    auto tx = part.find("text");
    if (tx == part.end() || !tx->is_string()) throw bad_request("messages", pw + ".text must be a string");
    text += tx->get<std::string>();
  }
  return text;
}

// Thinking on/off from the several spellings clients use; off unless asked for.
bool parse_thinking(const Fields& f, const Json& body) {
  bool thinking = false;
  if (const Json* t = f.get("thinking")) {
    if (t->is_boolean()) {
      thinking = t->get<bool>();
    } else if (t->is_object()) {
      Fields tf(*t, "thinking.");
      auto type = tf.string("type").value_or("enabled");
      if (type != "enabled" && type != "disabled")
        throw bad_request("thinking.type", "thinking.type must be \"enabled\" or \"disabled\", got \"" + type + "\"");
      thinking = type == "enabled";
    } else {
      throw bad_request("thinking", "thinking must be a boolean or {\"type\": \"enabled\" | \"disabled\"}");
    }
  }
  if (const Json* k = f.get("chat_template_kwargs")) {
    if (!k->is_object()) throw bad_request("chat_template_kwargs", "chat_template_kwargs must be an object");
    Fields kf(*k, "chat_template_kwargs.");
    if (auto v = kf.boolean("thinking")) thinking = *v;
    if (auto v = kf.boolean("enable_thinking")) thinking = *v;
  }
  (void)body;
  return thinking;
}

// OpenAI's reasoning_effort → the encoders' vocabulary ("" = the model's default).
std::string map_effort(const std::string& e, bool* thinking) {
  if (e == "none") {
    *thinking = false;
    return "";
  }
  *thinking = true;
  if (e == "minimal" || e == "low") return "low";
  if (e == "medium") return "";
  if (e == "high" || e == "xhigh" || e == "max") return e;
  throw bad_request("reasoning_effort",
                    "reasoning_effort must be none, minimal, low, medium, high, xhigh or max, got \"" + e + "\"");
}

}  // namespace

// The chat JSON the encoders take, from an OpenAI chat body.
Json openai_chat_to_encoder_json(const Json& body) {
  Fields f(body);
  const Json* messages = f.get("messages");
  if (!messages) throw bad_request("messages", "messages is required");
  if (!messages->is_array()) throw bad_request("messages", "messages must be an array");
  Json chat = Json::object();
  Json msgs = Json::array();
  for (size_t i = 0; i < messages->size(); ++i) {
    const Json& m = (*messages)[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) throw bad_request("messages", where + " must be an object");
    Json c = m;
    if (auto it = m.find("content"); it != m.end())
      c["content"] = it->is_null() ? Json(nullptr) : Json(flatten_content(*it, where + ".content"));
    if (auto it = c.find("tool_calls"); it != c.end() && it->is_array() && it->empty()) c.erase("tool_calls");
    msgs.push_back(std::move(c));
  }
  chat["messages"] = std::move(msgs);
  if (const Json* tools = f.get("tools")) {
    if (!tools->is_array()) throw bad_request("tools", "tools must be an array");
    chat["tools"] = *tools;
  }
  if (const Json* tc = f.get("tool_choice")) {
    if (!tc->is_string())
      throw bad_request("tool_choice", "tool_choice naming a function is not supported; use auto, none or required");
    chat["tool_choice"] = *tc;
  }
  bool thinking = parse_thinking(f, body);
  if (auto e = f.string("reasoning_effort")) chat["reasoning_effort"] = map_effort(*e, &thinking);
  chat["thinking"] = thinking;
  if (auto v = f.boolean("add_generation_prompt")) chat["add_generation_prompt"] = *v;
  return chat;
}

namespace {

class ChatCompletionJob final : public GenerationJob {
 public:
  explicit ChatCompletionJob(JobContext ctx) : GenerationJob(std::move(ctx)), acc_(static_cast<size_t>(ctx_.n)) {}

  std::string prologue() override {
    std::string out;
    for (int i = 0; i < ctx_.n; ++i)
      out += sse_data(chunk(i, {{"role", "assistant"}, {"content", ""}}, OJson(nullptr), OJson(nullptr)));
    return out;
  }

  std::string epilogue() override {
    if (ctx_.stream) {
      std::string out;
      if (ctx_.include_usage) {
        OJson c = base("chat.completion.chunk");
        c["choices"] = OJson::array();
        c["usage"] = usage_json();
        out += sse_data(c);
      }
      return out + "data: [DONE]\n\n";
    }
    OJson r = base("chat.completion");
    OJson choices = OJson::array();
    for (int i = 0; i < ctx_.n; ++i) {
      Acc& a = acc_[static_cast<size_t>(i)];
      OJson msg = {{"role", "assistant"}};
      const bool tools = !a.tool_calls.empty();
      msg["content"] = (tools && a.content.empty()) ? OJson(nullptr) : OJson(a.content);
      if (ctx_.output.thinking || !a.reasoning.empty()) msg["reasoning_content"] = a.reasoning;
      if (tools) msg["tool_calls"] = a.tool_calls;
      OJson lp = ctx_.logprobs ? OJson{{"content", a.logprobs}} : OJson(nullptr);
      choices.push_back({{"index", i},
                         {"message", msg},
                         {"logprobs", lp},
                         {"finish_reason", samples_[static_cast<size_t>(i)].finish_reason()}});
    }
    r["choices"] = choices;
    r["usage"] = usage_json();
    return dump_json(r);
  }

 protected:
  std::string emit(int index, const tokenizer::ChatDelta& d, const SequenceDelta& sd) override {
    Acc& a = acc_[static_cast<size_t>(index)];
    OJson lps = OJson::array();
    if (ctx_.logprobs)
      for (const auto& r : sd.logprobs) lps.push_back(logprob_entry(r));
    OJson calls = OJson::array();
    if (!ctx_.stream) {
      for (const auto& c : d.tool_calls)
        calls.push_back({{"id", call_id(index, a.num_calls++)},
                         {"type", "function"},
                         {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
    } else {
      // Streamed as the model writes them: id, type and name with a call's first piece, then argument pieces.
      for (const auto& t : d.tool_call_deltas) {
        OJson call = {{"index", t.index}};
        if (t.index >= a.num_calls) {
          a.num_calls = t.index + 1;
          call["id"] = call_id(index, t.index);
          call["type"] = "function";
          call["function"] = {{"name", t.name}, {"arguments", t.arguments}};
        } else {
          call["function"] = {{"arguments", t.arguments}};
        }
        calls.push_back(std::move(call));
      }
    }
    if (!ctx_.stream) {
      a.reasoning += d.reasoning;
      a.content += d.content;
      for (auto& c : calls) a.tool_calls.push_back(c);
      for (auto& l : lps) a.logprobs.push_back(l);
      return {};
    }
    std::string out;
    OJson lp_field = ctx_.logprobs && !lps.empty() ? OJson{{"content", lps}} : OJson(nullptr);
    if (!d.reasoning.empty()) out += sse_data(chunk(index, {{"reasoning_content", d.reasoning}}, nullptr, nullptr));
    if (!d.content.empty() || (!lps.empty() && d.reasoning.empty())) {
      out += sse_data(chunk(index, {{"content", d.content}}, lp_field, nullptr));
    } else if (!lps.empty()) {
      out += sse_data(chunk(index, OJson::object(), lp_field, nullptr));
    }
    for (auto& c : calls) out += sse_data(chunk(index, {{"tool_calls", OJson::array({c})}}, nullptr, nullptr));
    if (sd.finished)
      out += sse_data(chunk(index, OJson::object(), nullptr, samples_[static_cast<size_t>(index)].finish_reason()));
    return out;
  }

 private:
  struct Acc {
    std::string reasoning, content;
    OJson tool_calls = OJson::array();
    OJson logprobs = OJson::array();
    int num_calls = 0;
  };

  std::string call_id(int sample, int call) const {
    return fmt::format("call_{}_{}_{}", ctx_.id.substr(ctx_.id.size() - 8), sample, call);
  }

  OJson base(const char* object) const {
    return {{"id", ctx_.id}, {"object", object}, {"created", ctx_.created}, {"model", ctx_.model}};
  }
  OJson chunk(int index, OJson delta, OJson logprobs, OJson finish) const {
    OJson c = base("chat.completion.chunk");
    c["choices"] = OJson::array({{{"index", index},
                                  {"delta", std::move(delta)},
                                  {"logprobs", std::move(logprobs)},
                                  {"finish_reason", finish}}});
    if (ctx_.include_usage) c["usage"] = nullptr;
    return c;
  }
  OJson token_json(TokenId id, float logprob) const {
    const std::string t = token_text(id);
    OJson bytes = OJson::array();
    for (unsigned char ch : t) bytes.push_back(static_cast<int>(ch));
    return {{"token", t}, {"logprob", logprob}, {"bytes", bytes}};
  }
  OJson logprob_entry(const SampleResult& r) const {
    OJson e = token_json(r.token, r.logprob);
    OJson top = OJson::array();
    for (const auto& t : r.top_logprobs) top.push_back(token_json(t.token, t.logprob));
    e["top_logprobs"] = top;
    return e;
  }

  std::vector<Acc> acc_;
};

class CompletionJob final : public GenerationJob {
 public:
  CompletionJob(JobContext ctx, bool return_token_ids)
      : GenerationJob(std::move(ctx)), return_ids_(return_token_ids), acc_(static_cast<size_t>(ctx_.n)) {}

  std::string epilogue() override {
    if (ctx_.stream) {
      std::string out;
      if (ctx_.include_usage) {
        OJson c = base();
        c["choices"] = OJson::array();
        c["usage"] = usage_json();
        out += sse_data(c);
      }
      return out + "data: [DONE]\n\n";
    }
    OJson r = base();
    OJson choices = OJson::array();
    for (int i = 0; i < ctx_.n; ++i) {
      Acc& a = acc_[static_cast<size_t>(i)];
      const SampleOutput& s = samples_[static_cast<size_t>(i)];
      OJson c = {{"index", i},
                 {"text", a.text},
                 {"logprobs", ctx_.logprobs ? a.logprobs : OJson(nullptr)},
                 {"finish_reason", s.finish_reason()}};
      if (return_ids_) c["token_ids"] = s.token_ids();
      choices.push_back(c);
    }
    r["choices"] = choices;
    r["usage"] = usage_json();
    return dump_json(r);
  }

 protected:
  std::string emit(int index, const tokenizer::ChatDelta& d, const SequenceDelta& sd) override {
    Acc& a = acc_[static_cast<size_t>(index)];
    OJson lp = nullptr;
    if (ctx_.logprobs) {
      lp = {{"tokens", OJson::array()},
            {"token_logprobs", OJson::array()},
            {"top_logprobs", OJson::array()},
            {"text_offset", OJson::array()}};
      for (const auto& r : sd.logprobs) {
        const std::string t = token_text(r.token);
        lp["tokens"].push_back(t);
        lp["token_logprobs"].push_back(r.logprob);
        OJson top = OJson::object();
        for (const auto& x : r.top_logprobs) top[token_text(x.token)] = x.logprob;
        lp["top_logprobs"].push_back(top);
        lp["text_offset"].push_back(a.offset);
        a.offset += static_cast<int64_t>(t.size());
      }
    }
    if (!ctx_.stream) {
      a.text += d.content;
      if (ctx_.logprobs)
        for (const char* k : {"tokens", "token_logprobs", "top_logprobs", "text_offset"})
          for (auto& x : lp[k]) a.logprobs[k].push_back(x);
      return {};
    }
    if (d.content.empty() && !sd.finished && sd.logprobs.empty()) return {};
    OJson c = base();
    OJson choice = {
        {"index", index},
        {"text", d.content},
        {"logprobs", lp},
        {"finish_reason", sd.finished ? OJson(samples_[static_cast<size_t>(index)].finish_reason()) : OJson(nullptr)}};
    if (return_ids_) choice["token_ids"] = sd.new_token_ids;
    c["choices"] = OJson::array({choice});
    if (ctx_.include_usage) c["usage"] = nullptr;
    return sse_data(c);
  }

 private:
  struct Acc {
    std::string text;
    OJson logprobs = {{"tokens", OJson::array()},
                      {"token_logprobs", OJson::array()},
                      {"top_logprobs", OJson::array()},
                      {"text_offset", OJson::array()}};
    int64_t offset = 0;
  };
  OJson base() const {
    return {{"id", ctx_.id}, {"object", "text_completion"}, {"created", ctx_.created}, {"model", ctx_.model}};
  }
  bool return_ids_;
  std::vector<Acc> acc_;
};

// stream / stream_options.include_usage.
void parse_stream(const Fields& f, JobContext* ctx) {
  ctx->stream = f.boolean("stream").value_or(false);
  if (const Json* so = f.get("stream_options")) {
    if (!so->is_object()) throw bad_request("stream_options", "stream_options must be an object");
    if (!ctx->stream) throw bad_request("stream_options", "stream_options is only allowed with stream: true");
    ctx->include_usage = Fields(*so, "stream_options.").boolean("include_usage").value_or(false);
  }
}

}  // namespace

PreparedGeneration ServerApi::chat_completions(const Json& body) {
  check_model(body);
  Fields f(body);
  GenerationSpec spec = new_spec("chatcmpl-");
  spec.prompt = encode_chat(openai_chat_to_encoder_json(body), &spec.ctx.output);
  std::string structured_field;
  spec.params = parse_openai_sampling(body, /*chat=*/true, host_.vocab_size(), limits_, &structured_field);
  check_structured(spec.params, structured_field);
  fit_to_context(&spec.params, static_cast<int64_t>(spec.prompt.size()), host_.max_model_len(), "messages");
  parse_stream(f, &spec.ctx);
  spec.priority = parse_priority(f);
  return prepare_generation<ChatCompletionJob>(std::move(spec));
}

PreparedGeneration ServerApi::completions(const Json& body) {
  check_model(body);
  Fields f(body);
  const Json* prompt = f.get("prompt");
  if (!prompt) throw bad_request("prompt", "prompt is required");
  // One prompt: a string, a list of token ids, or a one-element list of either.
  const Json* one = prompt;
  if (prompt->is_array() && prompt->size() == 1 && ((*prompt)[0].is_string() || (*prompt)[0].is_array()))
    one = &(*prompt)[0];
  GenerationSpec spec = new_spec("cmpl-");
  std::vector<TokenId>& ids = spec.prompt;
  if (one->is_string()) {
    const auto& tok = require_tokenizer("a text prompt");
    ids = tok.encode(one->get<std::string>());
    spec.ctx.output.tok = &tok;
  } else if (one->is_array() && !one->empty() && (*one)[0].is_number()) {
    for (size_t i = 0; i < one->size(); ++i) {
      const Json& t = (*one)[i];
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= host_.vocab_size())
        throw bad_request("prompt", fmt::format("prompt[{}] must be a token id in [0, {})", i, host_.vocab_size()));
      ids.push_back(static_cast<TokenId>(t.get<int64_t>()));
    }
    spec.ctx.output.tok = host_.tokenizer();
  } else if (prompt->is_array() && prompt->size() > 1) {
    throw bad_request("prompt", "a batch of prompts is not supported; send one request per prompt");
  } else {
    throw bad_request("prompt", "prompt must be a string or an array of token ids");
  }
  if (ids.empty()) throw bad_request("prompt", "prompt must not be empty");
  for (const char* key : {"suffix", "echo"})
    if (const Json* v = f.get(key); v && !(v->is_boolean() && !v->get<bool>()) && !(v->is_string() && v->empty()))
      throw bad_request(key, std::string(key) + " is not supported by this server");
  std::string structured_field;
  spec.params = parse_openai_sampling(body, /*chat=*/false, host_.vocab_size(), limits_, &structured_field);
  check_structured(spec.params, structured_field);
  if (!f.get("max_tokens") && spec.params.max_tokens == std::nullopt)
    spec.params.max_tokens = 16;  // OpenAI's completions default
  fit_to_context(&spec.params, static_cast<int64_t>(ids.size()), host_.max_model_len(), "prompt");
  parse_stream(f, &spec.ctx);
  spec.ctx.output.chat = false;
  spec.ctx.output.skip_special_tokens = f.boolean("skip_special_tokens").value_or(true);
  spec.priority = parse_priority(f);
  const bool return_ids = f.boolean("return_token_ids").value_or(false);
  return prepare_generation<CompletionJob>(std::move(spec), return_ids);
}

}  // namespace deepinfer::server
