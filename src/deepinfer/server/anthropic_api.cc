// Anthropic routes: POST /v1/messages (content blocks: text, thinking, tool_use; streaming with the named events
// message_start / content_block_start / content_block_delta / content_block_stop / message_delta / message_stop)
// and POST /v1/messages/count_tokens. Requests are converted to the OpenAI-shaped chat the encoders take.
#include <fmt/format.h>

#include "deepinfer/server/api.h"

namespace deepinfer::server {

namespace {

std::string text_of(const Json& content, const std::string& where) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) throw bad_request("messages", where + " must be a string or an array of content blocks");
  std::string out;
  for (size_t i = 0; i < content.size(); ++i) {
    const Json& b = content[i];
    const std::string bw = where + "[" + std::to_string(i) + "]";
    if (!b.is_object() || b.value("type", "") != "text" || !b.contains("text") || !b["text"].is_string())
      throw bad_request("messages", bw + ": only text blocks are allowed here");
    out += b["text"].get<std::string>();
  }
  return out;
}

// Anthropic request → {"messages", "tools", "tool_choice", "thinking"} for parse_chat_request.
Json anthropic_to_encoder_json(const Json& body) {
  Fields f(body);
  Json msgs = Json::array();
  if (const Json* sys = f.get("system")) msgs.push_back({{"role", "system"}, {"content", text_of(*sys, "system")}});
  const Json* messages = f.get("messages");
  if (!messages) throw bad_request("messages", "messages is required");
  if (!messages->is_array() || messages->empty()) throw bad_request("messages", "messages must be a non-empty array");
  for (size_t i = 0; i < messages->size(); ++i) {
    const Json& m = (*messages)[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) throw bad_request("messages", where + " must be an object");
    const std::string role = m.value("role", "");
    if (role != "user" && role != "assistant")
      throw bad_request("messages", where + ".role must be \"user\" or \"assistant\", got \"" + role + "\"");
    auto c = m.find("content");
    if (c == m.end()) throw bad_request("messages", where + ".content is required");
    if (c->is_string()) {
      msgs.push_back({{"role", role}, {"content", *c}});
      continue;
    }
    if (!c->is_array()) throw bad_request("messages", where + ".content must be a string or an array of blocks");
    std::string text, thinking;
    bool has_thinking = false;
    Json calls = Json::array();
    Json results = Json::array();
    for (size_t k = 0; k < c->size(); ++k) {
      const Json& b = (*c)[k];
      const std::string bw = where + ".content[" + std::to_string(k) + "]";
      if (!b.is_object()) throw bad_request("messages", bw + " must be an object");
      const std::string type = b.value("type", "");
      if (type == "text") {
        if (!b.contains("text") || !b["text"].is_string()) throw bad_request("messages", bw + ".text must be a string");
        text += b["text"].get<std::string>();
      } else if (type == "thinking" && role == "assistant") {
        if (!b.contains("thinking") || !b["thinking"].is_string())
          throw bad_request("messages", bw + ".thinking must be a string");
        thinking += b["thinking"].get<std::string>();
        has_thinking = true;
      } else if (type == "redacted_thinking" && role == "assistant") {
        // Opaque to this model: dropped.
      } else if (type == "tool_use" && role == "assistant") {
        if (!b.contains("name") || !b["name"].is_string()) throw bad_request("messages", bw + ".name must be a string");
        Json input = b.contains("input") ? b["input"] : Json::object();
        if (!input.is_object()) throw bad_request("messages", bw + ".input must be an object");
        calls.push_back({{"id", b.value("id", "")},
                         {"type", "function"},
                         {"function", {{"name", b["name"]}, {"arguments", input.dump()}}}});
      } else if (type == "tool_result" && role == "user") {
        std::string content;
        if (auto rc = b.find("content"); rc != b.end() && !rc->is_null()) content = text_of(*rc, bw + ".content");
        if (b.value("is_error", false)) content = "Error: " + content;
        results.push_back({{"role", "tool"}, {"tool_call_id", b.value("tool_use_id", "")}, {"content", content}});
      } else {
        throw bad_request("messages", bw + ": block type \"" + type + "\" is not supported in a " + role + " message");
      }
    }
    for (auto& r : results) msgs.push_back(std::move(r));
    if (role == "user") {
      if (!text.empty() || results.empty()) msgs.push_back({{"role", "user"}, {"content", text}});
    } else {
      Json a = {{"role", "assistant"}, {"content", text}};
      if (has_thinking) a["reasoning_content"] = thinking;
      if (!calls.empty()) a["tool_calls"] = calls;
      msgs.push_back(std::move(a));
    }
  }
  Json chat = {{"messages", msgs}};
  if (const Json* tools = f.get("tools")) {
    if (!tools->is_array()) throw bad_request("tools", "tools must be an array");
    Json t = Json::array();
    for (size_t i = 0; i < tools->size(); ++i) {
      const Json& d = (*tools)[i];
      if (!d.is_object() || !d.contains("name") || !d["name"].is_string())
        throw bad_request("tools", "tools[" + std::to_string(i) + "] must be an object with a name");
      Json fn = {{"name", d["name"]}};
      if (d.contains("description")) fn["description"] = d["description"];
      if (d.contains("input_schema")) fn["parameters"] = d["input_schema"];
      t.push_back({{"type", "function"}, {"function", fn}});
    }
    chat["tools"] = t;
  }
  if (const Json* tc = f.get("tool_choice")) {
    const std::string type = tc->is_object() ? tc->value("type", "") : "";
    if (type == "auto" || type == "none")
      chat["tool_choice"] = type;
    else if (type == "any")
      chat["tool_choice"] = "required";
    else
      throw bad_request("tool_choice",
                        "tool_choice must be {\"type\": auto | any | none} (naming a tool is not supported)");
  }
  bool thinking = false;
  if (const Json* t = f.get("thinking")) {
    if (!t->is_object())
      throw bad_request("thinking", "thinking must be an object {\"type\": \"enabled\" | \"disabled\"}");
    const std::string type = t->value("type", "");
    if (type != "enabled" && type != "disabled")
      throw bad_request("thinking", "thinking.type must be \"enabled\" or \"disabled\", got \"" + type + "\"");
    thinking = type == "enabled";
  }
  chat["thinking"] = thinking;
  return chat;
}

class MessagesJob final : public GenerationJob {
 public:
  explicit MessagesJob(JobContext ctx) : GenerationJob(std::move(ctx)) {}

  std::string prologue() override {
    return sse_event("message_start", {{"type", "message_start"}, {"message", message_head()}});
  }

  std::string epilogue() override {
    if (ctx_.stream) {
      std::string out = close_block();
      out +=
          sse_event("message_delta", {{"type", "message_delta"},
                                      {"delta", {{"stop_reason", stop_reason()}, {"stop_sequence", stop_sequence()}}},
                                      {"usage", {{"output_tokens", completion_tokens_}}}});
      return out + sse_event("message_stop", {{"type", "message_stop"}});
    }
    OJson m = message_head();
    OJson content = OJson::array();
    if (!reasoning_.empty() || ctx_.output.thinking)
      content.push_back({{"type", "thinking"}, {"thinking", reasoning_}, {"signature", ""}});
    if (!text_.empty() || calls_.empty()) content.push_back({{"type", "text"}, {"text", text_}});
    for (auto& c : calls_) content.push_back(c);
    m["content"] = content;
    m["stop_reason"] = stop_reason();
    m["stop_sequence"] = stop_sequence();
    m["usage"] = anthropic_usage_json();
    return dump_json(m);
  }

  std::string stream_error(const ApiError& e) override { return sse_event("error", e.anthropic_body()); }
  std::string error_body(const ApiError& e) const override { return dump_json(e.anthropic_body()); }

 protected:
  std::string emit(int, const tokenizer::ChatDelta& d, const SequenceDelta&) override {
    if (!ctx_.stream) {
      reasoning_ += d.reasoning;
      text_ += d.content;
      for (const auto& c : d.tool_calls) {
        OJson input = OJson::parse(c.arguments, nullptr, false);
        if (input.is_discarded() || !input.is_object()) input = OJson::object();
        calls_.push_back({{"type", "tool_use"}, {"id", tool_id(num_calls_++)}, {"name", c.name}, {"input", input}});
      }
      return {};
    }
    std::string out;
    if (!d.reasoning.empty()) {
      out += open_block("thinking", {{"type", "thinking"}, {"thinking", ""}, {"signature", ""}});
      out += delta({{"type", "thinking_delta"}, {"thinking", d.reasoning}});
    }
    if (!d.content.empty()) {
      out += open_block("text", {{"type", "text"}, {"text", ""}});
      out += delta({{"type", "text_delta"}, {"text", d.content}});
    }
    // Tool calls stream as the model writes them: a tool_use block per call, its input as input_json_delta pieces.
    for (const auto& t : d.tool_call_deltas) {
      if (t.index >= num_calls_) {
        num_calls_ = t.index + 1;
        out += open_block(
            "tool_use", {{"type", "tool_use"}, {"id", tool_id(t.index)}, {"name", t.name}, {"input", OJson::object()}},
            /*force_new=*/true);
      }
      if (!t.arguments.empty()) out += delta({{"type", "input_json_delta"}, {"partial_json", t.arguments}});
    }
    return out;
  }

 private:
  std::string tool_id(int call) const { return fmt::format("toolu_{}_{}", ctx_.id.substr(ctx_.id.size() - 8), call); }
  OJson message_head() const {
    return {{"id", ctx_.id},
            {"type", "message"},
            {"role", "assistant"},
            {"model", ctx_.model},
            {"content", OJson::array()},
            {"stop_reason", nullptr},
            {"stop_sequence", nullptr},
            {"usage", {{"input_tokens", ctx_.prompt_len}, {"output_tokens", 0}}}};
  }
  std::string stop_reason() const {
    const SampleOutput& s = samples_[0];
    if (s.saw_tool_calls()) return "tool_use";
    switch (s.stop_reason()) {
      case StopReason::kMaxTokens:
      case StopReason::kMaxModelLen:
        return "max_tokens";
      case StopReason::kStopString:
      case StopReason::kStopToken:
        return "stop_sequence";
      default:
        return "end_turn";
    }
  }
  OJson stop_sequence() const {
    const SampleOutput& s = samples_[0];
    return s.stop_reason() == StopReason::kStopString ? OJson(s.stop_string()) : OJson(nullptr);
  }
  std::string close_block() {
    if (open_.empty()) return {};
    open_.clear();
    return sse_event("content_block_stop", {{"type", "content_block_stop"}, {"index", index_}});
  }
  std::string open_block(const std::string& kind, const OJson& block, bool force_new = false) {
    if (open_ == kind && !force_new) return {};
    std::string out = close_block();
    if (started_) ++index_;
    started_ = true;
    open_ = kind;
    return out + sse_event("content_block_start",
                           {{"type", "content_block_start"}, {"index", index_}, {"content_block", block}});
  }
  std::string delta(const OJson& d) const {
    return sse_event("content_block_delta", {{"type", "content_block_delta"}, {"index", index_}, {"delta", d}});
  }

  std::string reasoning_, text_;
  std::vector<OJson> calls_;
  int num_calls_ = 0;
  std::string open_;  // kind of the open streaming block ("" = none)
  int index_ = 0;
  bool started_ = false;
};

// Anthropic's sampling fields plus the OpenAI-named extensions this server accepts on every route.
SamplingParams anthropic_sampling(const Json& body, int64_t vocab, const RequestLimits& limits,
                                  std::string* structured_field) {
  if (!Fields(body).get("max_tokens")) throw bad_request("max_tokens", "max_tokens is required");
  return parse_aliased_sampling(body,
                                {{"max_tokens", "max_tokens"},
                                 {"temperature", "temperature"},
                                 {"top_p", "top_p"},
                                 {"top_k", "top_k"},
                                 {"stop_sequences", "stop"},
                                 {"seed", "seed"},
                                 {"ignore_eos", "ignore_eos"},
                                 {"regex", "regex"},
                                 {"grammar", "grammar"}},
                                Json::object(), vocab, limits, structured_field);
}

}  // namespace

PreparedGeneration ServerApi::messages(const Json& body) {
  check_model(body);
  GenerationSpec spec = new_spec("msg_");
  spec.prompt = encode_chat(anthropic_to_encoder_json(body), &spec.ctx.output);
  std::string structured_field;
  spec.params = anthropic_sampling(body, host_.vocab_size(), limits_, &structured_field);
  check_structured(spec.params, structured_field);
  fit_to_context(&spec.params, static_cast<int64_t>(spec.prompt.size()), host_.max_model_len(), "messages");
  spec.ctx.stream = Fields(body).boolean("stream").value_or(false);
  return prepare_generation<MessagesJob>(std::move(spec));
}

HttpReply ServerApi::count_tokens(const Json& body) const {
  check_model(body);
  SampleOutputOptions unused;
  std::vector<TokenId> ids = encode_chat(anthropic_to_encoder_json(body), &unused);
  HttpReply r;
  r.body = dump_json({{"input_tokens", ids.size()}});
  return r;
}

}  // namespace deepinfer::server
