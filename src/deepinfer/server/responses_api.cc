// OpenAI Responses API: POST /v1/responses (input as a string or message / function_call / function_call_output
// items, instructions, tools, reasoning.effort, text.format structured output; streaming with response.* events).
// Stateless: previous_response_id and store are not supported.
#include <fmt/format.h>

#include "deepinfer/server/api.h"

namespace deepinfer::server {

Json openai_chat_to_encoder_json(const Json& body);  // openai_api.cc

namespace {

std::string item_text(const Json& content, const std::string& where) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) throw bad_request("input", where + " must be a string or an array of content parts");
  std::string out;
  for (size_t i = 0; i < content.size(); ++i) {
    const Json& p = content[i];
    const std::string t = p.is_object() ? p.value("type", "") : "";
    if ((t != "input_text" && t != "output_text" && t != "text") || !p.contains("text") || !p["text"].is_string())
      throw bad_request("input", where + "[" + std::to_string(i) + "]: only text parts are supported");
    out += p["text"].get<std::string>();
  }
  return out;
}

// Responses request → an OpenAI chat body (messages, tools, reasoning_effort) for the shared chat path.
Json responses_to_chat(const Json& body) {
  Fields f(body);
  if (f.get("previous_response_id"))
    throw bad_request("previous_response_id", "previous_response_id is not supported (this server stores nothing)");
  Json msgs = Json::array();
  if (auto ins = f.string("instructions")) msgs.push_back({{"role", "system"}, {"content", *ins}});
  const Json* input = f.get("input");
  if (!input) throw bad_request("input", "input is required");
  if (input->is_string()) {
    msgs.push_back({{"role", "user"}, {"content", *input}});
  } else if (input->is_array()) {
    for (size_t i = 0; i < input->size(); ++i) {
      const Json& it = (*input)[i];
      const std::string where = "input[" + std::to_string(i) + "]";
      if (!it.is_object()) throw bad_request("input", where + " must be an object");
      const std::string type = it.value("type", "message");
      if (type == "message") {
        const std::string role = it.value("role", "");
        if (role != "user" && role != "assistant" && role != "system" && role != "developer")
          throw bad_request("input", where + ".role must be user, assistant, system or developer");
        if (!it.contains("content")) throw bad_request("input", where + ".content is required");
        msgs.push_back({{"role", role}, {"content", item_text(it["content"], where + ".content")}});
      } else if (type == "function_call") {
        Json call = {{"id", it.value("call_id", "")},
                     {"type", "function"},
                     {"function", {{"name", it.value("name", "")}, {"arguments", it.value("arguments", "{}")}}}};
        if (!msgs.empty() && msgs.back()["role"] == "assistant" && msgs.back().contains("tool_calls"))
          msgs.back()["tool_calls"].push_back(call);
        else
          msgs.push_back({{"role", "assistant"}, {"content", ""}, {"tool_calls", Json::array({call})}});
      } else if (type == "function_call_output") {
        const Json out = it.contains("output") ? it["output"] : Json("");
        msgs.push_back({{"role", "tool"},
                        {"tool_call_id", it.value("call_id", "")},
                        {"content", out.is_string() ? out.get<std::string>() : out.dump()}});
      } else if (type == "reasoning") {
        // Earlier reasoning is not replayed (the encoders drop it without tools anyway).
      } else {
        throw bad_request("input", where + ": item type \"" + type + "\" is not supported");
      }
    }
  } else {
    throw bad_request("input", "input must be a string or an array of items");
  }
  Json chat = {{"model", body.value("model", "")}, {"messages", msgs}};
  if (const Json* tools = f.get("tools")) {
    if (!tools->is_array()) throw bad_request("tools", "tools must be an array");
    Json t = Json::array();
    for (size_t i = 0; i < tools->size(); ++i) {
      const Json& d = (*tools)[i];
      if (!d.is_object() || d.value("type", "") != "function" || !d.contains("name"))
        throw bad_request("tools", "tools[" + std::to_string(i) + "]: only function tools with a name are supported");
      Json fn = {{"name", d["name"]}};
      if (d.contains("description")) fn["description"] = d["description"];
      if (d.contains("parameters")) fn["parameters"] = d["parameters"];
      t.push_back({{"type", "function"}, {"function", fn}});
    }
    chat["tools"] = t;
  }
  if (const Json* tc = f.get("tool_choice")) chat["tool_choice"] = *tc;
  if (const Json* r = f.get("reasoning")) {
    if (!r->is_object()) throw bad_request("reasoning", "reasoning must be an object");
    if (auto e = Fields(*r, "reasoning.").string("effort")) chat["reasoning_effort"] = *e;
  }
  return chat;
}

// The Responses API's sampling fields (OpenAI's, max_output_tokens, text.format) plus this server's extensions.
SamplingParams responses_sampling(const Json& body, int64_t vocab, const RequestLimits& limits,
                                  std::string* structured_field) {
  Fields f(body);
  Json view = Json::object();
  if (const Json* text = f.get("text")) {
    if (!text->is_object()) throw bad_request("text", "text must be an object");
    if (auto fm = text->find("format"); fm != text->end() && fm->is_object()) {
      Json rf = {{"type", fm->value("type", "text")}};
      if (rf["type"] == "json_schema")
        rf["json_schema"] = {{"schema", fm->contains("schema") ? (*fm)["schema"] : Json()}};
      view["response_format"] = rf;
    }
  }
  return parse_aliased_sampling(body,
                                {{"temperature", "temperature"},
                                 {"top_p", "top_p"},
                                 {"top_k", "top_k"},
                                 {"min_p", "min_p"},
                                 {"seed", "seed"},
                                 {"stop", "stop"},
                                 {"presence_penalty", "presence_penalty"},
                                 {"frequency_penalty", "frequency_penalty"},
                                 {"repetition_penalty", "repetition_penalty"},
                                 {"ignore_eos", "ignore_eos"},
                                 {"max_output_tokens", "max_tokens"},
                                 {"regex", "regex"},
                                 {"grammar", "grammar"},
                                 {"text.format", "response_format"}},
                                std::move(view), vocab, limits, structured_field);
}

class ResponsesJob final : public GenerationJob {
 public:
  explicit ResponsesJob(JobContext ctx) : GenerationJob(std::move(ctx)) {}

  std::string prologue() override {
    OJson r = response("in_progress");
    std::string out = ev("response.created", {{"response", r}});  // two statements: sequence numbers in order
    return out + ev("response.in_progress", {{"response", r}});
  }

  std::string epilogue() override {
    if (!ctx_.stream) return dump_json(response(final_status()));
    std::string out = close_item();
    return out + ev("response.completed", {{"response", response(final_status())}});
  }

 protected:
  std::string emit(int, const tokenizer::ChatDelta& d, const SequenceDelta&) override {
    std::string out;
    if (!d.reasoning.empty()) {
      if (ctx_.stream) {
        out += open_item("reasoning");
        out += ev(
            "response.reasoning_text.delta",
            {{"item_id", item_id()}, {"output_index", output_index()}, {"content_index", 0}, {"delta", d.reasoning}});
      }
      cur("reasoning") += d.reasoning;
    }
    if (!d.content.empty()) {
      if (ctx_.stream) {
        out += open_item("message");
        out +=
            ev("response.output_text.delta",
               {{"item_id", item_id()}, {"output_index", output_index()}, {"content_index", 0}, {"delta", d.content}});
      }
      cur("message") += d.content;
    }
    if (!ctx_.stream) {
      for (const auto& c : d.tool_calls) {
        Item it;
        it.kind = "function_call";
        it.id = fmt::format("fc_{}_{}", ctx_.id.substr(ctx_.id.size() - 8), items_.size());
        it.name = c.name;
        it.text = c.arguments;
        items_.push_back(it);
      }
      return out;
    }
    // Streamed function calls: an output item per call, its arguments as function_call_arguments.delta events.
    for (const auto& t : d.tool_call_deltas) {
      if (t.index >= num_calls_) {
        num_calls_ = t.index + 1;
        out += close_item();
        Item it;
        it.kind = "function_call";
        it.id = fmt::format("fc_{}_{}", ctx_.id.substr(ctx_.id.size() - 8), items_.size());
        it.name = t.name;
        items_.push_back(it);
        open_ = true;
        out += ev("response.output_item.added",
                  {{"output_index", output_index()}, {"item", item_json(items_.back(), "in_progress")}});
      }
      if (t.arguments.empty()) continue;
      items_.back().text += t.arguments;
      out += ev("response.function_call_arguments.delta",
                {{"item_id", items_.back().id}, {"output_index", output_index()}, {"delta", t.arguments}});
    }
    return out;
  }

 private:
  struct Item {
    std::string kind, id, text, name;
  };

  std::string ev(const char* type, OJson body) {
    OJson e = {{"type", type}, {"sequence_number", seq_++}};
    for (auto it = body.begin(); it != body.end(); ++it) e[it.key()] = it.value();
    return sse_event(type, e);
  }
  std::string& cur(const char* kind) {
    if (items_.empty() || items_.back().kind != kind || (ctx_.stream && !open_)) {
      Item it;
      it.kind = kind;
      it.id = fmt::format("{}_{}_{}", kind[0] == 'm' ? "msg" : "rs", ctx_.id.substr(ctx_.id.size() - 8), items_.size());
      items_.push_back(it);
    }
    return items_.back().text;
  }
  std::string item_id() const { return items_.empty() ? std::string() : items_.back().id; }
  int output_index() const { return static_cast<int>(items_.size()) - 1; }
  std::string open_item(const char* kind) {
    if (open_ && items_.back().kind == kind) return {};
    std::string out = close_item();
    Item it;
    it.kind = kind;
    it.id = fmt::format("{}_{}_{}", kind[0] == 'm' ? "msg" : "rs", ctx_.id.substr(ctx_.id.size() - 8), items_.size());
    items_.push_back(it);
    open_ = true;
    out += ev("response.output_item.added", {{"output_index", output_index()}, {"item", item_json(it, "in_progress")}});
    if (it.kind == "message")
      out += ev("response.content_part.added",
                {{"item_id", it.id},
                 {"output_index", output_index()},
                 {"content_index", 0},
                 {"part", {{"type", "output_text"}, {"text", ""}, {"annotations", OJson::array()}}}});
    return out;
  }
  std::string close_item() {
    if (!open_) return {};
    open_ = false;
    const Item& it = items_.back();
    std::string out;
    if (it.kind == "message") {
      out += ev("response.output_text.done",
                {{"item_id", it.id}, {"output_index", output_index()}, {"content_index", 0}, {"text", it.text}});
      out += ev("response.content_part.done",
                {{"item_id", it.id},
                 {"output_index", output_index()},
                 {"content_index", 0},
                 {"part", {{"type", "output_text"}, {"text", it.text}, {"annotations", OJson::array()}}}});
    } else if (it.kind == "function_call") {
      out += ev("response.function_call_arguments.done",
                {{"item_id", it.id}, {"output_index", output_index()}, {"arguments", it.text}});
    } else if (it.kind == "reasoning") {
      out += ev("response.reasoning_text.done",
                {{"item_id", it.id}, {"output_index", output_index()}, {"content_index", 0}, {"text", it.text}});
    }
    return out +
           ev("response.output_item.done", {{"output_index", output_index()}, {"item", item_json(it, "completed")}});
  }
  OJson item_json(const Item& it, const char* status) const {
    if (it.kind == "message")
      return {
          {"type", "message"},
          {"id", it.id},
          {"status", status},
          {"role", "assistant"},
          {"content", OJson::array({{{"type", "output_text"}, {"text", it.text}, {"annotations", OJson::array()}}})}};
    if (it.kind == "reasoning")
      return {{"type", "reasoning"},
              {"id", it.id},
              {"summary", OJson::array()},
              {"content", OJson::array({{{"type", "reasoning_text"}, {"text", it.text}}})}};
    return {{"type", "function_call"}, {"id", it.id},          {"call_id", it.id},
            {"name", it.name},         {"arguments", it.text}, {"status", status}};
  }
  std::string final_status() const {
    const StopReason r = samples_[0].stop_reason();
    return r == StopReason::kMaxTokens || r == StopReason::kMaxModelLen ? "incomplete" : "completed";
  }
  OJson response(const std::string& status) const {
    OJson out = OJson::array();
    if (status != "in_progress")
      for (const auto& it : items_) out.push_back(item_json(it, "completed"));
    OJson r = {{"id", ctx_.id},
               {"object", "response"},
               {"created_at", ctx_.created},
               {"status", status},
               {"model", ctx_.model},
               {"output", out},
               {"incomplete_details", nullptr},
               {"error", nullptr},
               {"parallel_tool_calls", true},
               {"tool_choice", "auto"},
               {"tools", OJson::array()}};
    if (status == "incomplete") r["incomplete_details"] = {{"reason", "max_output_tokens"}};
    if (status != "in_progress") {
      r["usage"] = responses_usage_json();
    } else {
      r["usage"] = nullptr;
    }
    return r;
  }

  std::vector<Item> items_;
  bool open_ = false;  // streaming: the last item is open
  int num_calls_ = 0;  // streaming: function calls started
  int64_t seq_ = 0;
};

}  // namespace

PreparedGeneration ServerApi::responses(const Json& body) {
  check_model(body);
  GenerationSpec spec = new_spec("resp_");
  spec.prompt = encode_chat(openai_chat_to_encoder_json(responses_to_chat(body)), &spec.ctx.output);
  std::string structured_field;
  spec.params = responses_sampling(body, host_.vocab_size(), limits_, &structured_field);
  check_structured(spec.params, structured_field);
  fit_to_context(&spec.params, static_cast<int64_t>(spec.prompt.size()), host_.max_model_len(), "input");
  spec.ctx.stream = Fields(body).boolean("stream").value_or(false);
  return prepare_generation<ResponsesJob>(std::move(spec));
}

}  // namespace deepinfer::server
