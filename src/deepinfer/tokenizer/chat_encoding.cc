// Request parsing, the V3 / V3.1 templates, prompt encoding. The V4 family is in chat_encoding_v4.cc.
#include "deepinfer/tokenizer/chat_encoding.h"

#include <charconv>

#include "deepinfer/core/error.h"

namespace deepinfer::tokenizer {

namespace {

constexpr std::string_view kBos = "<｜begin▁of▁sentence｜>";
constexpr std::string_view kEos = "<｜end▁of▁sentence｜>";
constexpr std::string_view kUser = "<｜User｜>";
constexpr std::string_view kAssistant = "<｜Assistant｜>";
constexpr std::string_view kThinkStart = "<think>";
constexpr std::string_view kThinkEnd = "</think>";
constexpr std::string_view kCallsBegin = "<｜tool▁calls▁begin｜>";
constexpr std::string_view kCallsEnd = "<｜tool▁calls▁end｜>";
constexpr std::string_view kCallBegin = "<｜tool▁call▁begin｜>";
constexpr std::string_view kCallEnd = "<｜tool▁call▁end｜>";
constexpr std::string_view kSep = "<｜tool▁sep｜>";
constexpr std::string_view kOutputsBegin = "<｜tool▁outputs▁begin｜>";
constexpr std::string_view kOutputsEnd = "<｜tool▁outputs▁end｜>";
constexpr std::string_view kOutputBegin = "<｜tool▁output▁begin｜>";
constexpr std::string_view kOutputEnd = "<｜tool▁output▁end｜>";

std::string get_string(const nlohmann::ordered_json& obj, const char* key, const std::string& where,
                       bool* is_null = nullptr) {
  if (is_null) *is_null = false;
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) {
    if (is_null) *is_null = true;
    return {};
  }
  DI_CHECK(it->is_string()) << where << "." << key << " must be a string";
  return it->get<std::string>();
}

ChatRole parse_role(const std::string& role, const std::string& where) {
  if (role == "system" || role == "developer") return ChatRole::kSystem;
  if (role == "user") return ChatRole::kUser;
  if (role == "assistant") return ChatRole::kAssistant;
  if (role == "tool") return ChatRole::kTool;
  if (role == "latest_reminder") return ChatRole::kLatestReminder;
  DI_FAIL(ErrorCode::kInvalidArgument) << where << ": unknown role \"" << role
                                       << "\" (expected system, user, assistant, tool or latest_reminder)";
}

ChatToolDefinition parse_tool(const nlohmann::ordered_json& t, const std::string& where) {
  DI_CHECK(t.is_object()) << where << " must be an object";
  const nlohmann::ordered_json* fn = &t;
  if (auto it = t.find("function"); it != t.end()) fn = &*it;  // {"type": "function", "function": {...}}
  DI_CHECK(fn->is_object()) << where << ".function must be an object";
  ChatToolDefinition d;
  d.name = get_string(*fn, "name", where);
  DI_CHECK(!d.name.empty()) << where << ": missing tool name";
  bool null = false;
  std::string desc = get_string(*fn, "description", where, &null);
  if (!null) d.description = desc;
  if (auto it = fn->find("parameters"); it != fn->end()) d.parameters = *it;
  return d;
}

}  // namespace

ChatFormat parse_chat_format(std::string_view name) {
  if (name == "v3") return ChatFormat::kV3;
  if (name == "v31" || name == "v3.1") return ChatFormat::kV31;
  if (name == "v4") return ChatFormat::kV4;
  if (name == "v41" || name == "v4.1") return ChatFormat::kV41;
  DI_FAIL(ErrorCode::kInvalidArgument) << "unknown chat encoding \"" << name << "\" (expected v3, v31, v4, v41)";
}

ChatRequest parse_chat_request(const nlohmann::ordered_json& j, const ChatParseOptions& options) {
  ChatRequest req;
  const nlohmann::ordered_json* messages = &j;
  if (j.is_object()) {
    auto it = j.find("messages");
    DI_CHECK(it != j.end()) << "chat request: missing \"messages\"";
    messages = &*it;
    if (auto t = j.find("tools"); t != j.end() && !t->is_null()) {
      DI_CHECK(t->is_array()) << "tools must be an array";
      for (size_t i = 0; i < t->size(); ++i) req.tools.push_back(parse_tool((*t)[i], "tools[" + std::to_string(i) + "]"));
    }
    if (auto t = j.find("thinking"); t != j.end() && !t->is_null()) {
      DI_CHECK(t->is_boolean()) << "thinking must be a boolean";
      req.thinking = t->get<bool>();
    }
    bool null = false;
    req.reasoning_effort = get_string(j, "reasoning_effort", "request", &null);
    DI_CHECK(req.reasoning_effort.empty() || req.reasoning_effort == "low" || req.reasoning_effort == "high" ||
             req.reasoning_effort == "xhigh" || req.reasoning_effort == "max")
        << "reasoning_effort must be low, high, xhigh or max, got \"" << req.reasoning_effort << "\"";
    std::string choice = get_string(j, "tool_choice", "request", &null);
    if (!null) req.tool_choice = choice;
    DI_CHECK(req.tool_choice == "auto" || req.tool_choice == "none" || req.tool_choice == "required")
        << "tool_choice must be auto, none or required, got \"" << req.tool_choice << "\"";
    if (auto t = j.find("add_generation_prompt"); t != j.end() && t->is_boolean())
      req.add_generation_prompt = t->get<bool>();
  }
  DI_CHECK(messages->is_array()) << "messages must be an array";
  for (size_t i = 0; i < messages->size(); ++i) {
    const auto& m = (*messages)[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    DI_CHECK(m.is_object()) << where << " must be an object";
    auto role_it = m.find("role");
    DI_CHECK(role_it != m.end() && role_it->is_string()) << where << ": missing role";
    ChatMessage msg;
    msg.role = parse_role(role_it->get<std::string>(), where);
    msg.content = get_string(m, "content", where, &msg.content_null);
    if (msg.role != ChatRole::kAssistant)
      DI_CHECK(!msg.content_null) << where << ": content must be a string";
    bool null = false;
    std::string reasoning = get_string(m, "reasoning_content", where, &null);
    if (!null) msg.reasoning_content = reasoning;
    std::string call_id = get_string(m, "tool_call_id", where, &null);
    if (!null) msg.tool_call_id = call_id;
    if (auto p = m.find("prefix"); p != m.end() && p->is_boolean()) msg.prefix = p->get<bool>();
    if (auto calls = m.find("tool_calls"); calls != m.end() && !calls->is_null()) {
      DI_CHECK(msg.role == ChatRole::kAssistant) << where << ": only assistant messages have tool_calls";
      DI_CHECK(calls->is_array()) << where << ".tool_calls must be an array";
      for (size_t c = 0; c < calls->size(); ++c) {
        const auto& call = (*calls)[c];
        const std::string cw = where + ".tool_calls[" + std::to_string(c) + "]";
        DI_CHECK(call.is_object()) << cw << " must be an object";
        const nlohmann::ordered_json* fn = &call;
        if (auto f = call.find("function"); f != call.end()) fn = &*f;
        DI_CHECK(fn->is_object()) << cw << ".function must be an object";
        ChatToolCall tc;
        tc.id = get_string(call, "id", cw);
        tc.name = get_string(*fn, "name", cw);
        DI_CHECK(!tc.name.empty()) << cw << ": missing function name";
        auto args = fn->find("arguments");
        if (args != fn->end() && args->is_object()) {
          tc.arguments = args->dump();  // already parsed JSON: keep it as text
        } else {
          tc.arguments = get_string(*fn, "arguments", cw);
        }
        if (options.require_json_object_arguments) {
          auto parsed = nlohmann::ordered_json::parse(tc.arguments, nullptr, /*allow_exceptions=*/false);
          DI_CHECK(!parsed.is_discarded() && parsed.is_object())
              << cw << ".arguments: not a JSON object: " << tc.arguments.substr(0, 80);
        }
        msg.tool_calls.push_back(std::move(tc));
      }
      // OpenAI clients send "" or null next to tool calls; the V3 templates test for null.
      if (msg.content.empty()) msg.content_null = true;
    }
    req.messages.push_back(std::move(msg));
  }
  return req;
}

RenderedPrompt render_chat(const ChatRequest& request, ChatFormat format) {
  switch (format) {
    case ChatFormat::kV3:
      return chat_detail::render_v3(request);
    case ChatFormat::kV31:
      return chat_detail::render_v31(request);
    case ChatFormat::kV4:
      return chat_detail::render_v4(request, /*v41=*/false);
    case ChatFormat::kV41:
      return chat_detail::render_v4(request, /*v41=*/true);
  }
  DI_FAIL(ErrorCode::kInternal) << "bad chat format";
}

std::vector<int32_t> encode_prompt(const Tokenizer& tok, const RenderedPrompt& prompt) {
  std::vector<int32_t> ids;
  size_t pos = 0;
  auto plain = [&](size_t end) {
    if (end > pos) {
      auto part = tok.encode(std::string_view(prompt.text).substr(pos, end - pos), SpecialTokenMode::kAllAsText);
      ids.insert(ids.end(), part.begin(), part.end());
    }
  };
  for (auto [b, e] : prompt.special_ranges) {
    plain(b);
    std::string_view s = std::string_view(prompt.text).substr(b, e - b);
    auto id = tok.token_to_id(s);
    DI_CHECK_CODE(id.has_value(), ErrorCode::kNotFound) << "special token \"" << s << "\" is not in the vocabulary";
    ids.push_back(*id);
    pos = e;
  }
  plain(prompt.text.size());
  return ids;
}

namespace chat_detail {

namespace {
void dump_to(const nlohmann::ordered_json& j, std::string* out) {
  if (j.is_object()) {
    *out += '{';
    bool first = true;
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (!first) *out += ", ";
      first = false;
      *out += nlohmann::ordered_json(it.key()).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
      *out += ": ";
      dump_to(it.value(), out);
    }
    *out += '}';
  } else if (j.is_array()) {
    *out += '[';
    for (size_t i = 0; i < j.size(); ++i) {
      if (i) *out += ", ";
      dump_to(j[i], out);
    }
    *out += ']';
  } else if (j.is_number_float()) {
    // serde_json (ryu) spelling: shortest round trip, integral values keep ".0", exponents without '+'.
    char buf[64];
    auto r = std::to_chars(buf, buf + sizeof buf, j.get<double>());
    std::string s(buf, r.ptr);
    if (auto e = s.find("e+"); e != std::string::npos) s.erase(e + 1, 1);
    if (s.find_first_of(".en") == std::string::npos) s += ".0";
    *out += s;
  } else {
    *out += j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
}
}  // namespace

std::string dump_spaced(const nlohmann::ordered_json& j) {
  std::string out;
  dump_to(j, &out);
  return out;
}

// DeepSeek-V3's template: system prompts joined on top; tool calls as ```json blocks. Its state flags are
// reproduced as they are, so a single tool call never gets `<｜tool▁calls▁end｜>` and only the first tool
// output of the conversation gets `<｜tool▁outputs▁begin｜>`.
RenderedPrompt render_v3(const ChatRequest& req) {
  PromptBuilder b;
  b.special(kBos);
  bool first_sp = true;
  for (const auto& m : req.messages) {
    if (m.role != ChatRole::kSystem) continue;
    if (!first_sp) b.text("\n\n");
    b.text(m.content);
    first_sp = false;
  }
  bool is_first = false, is_tool = false, is_output_first = true;
  for (const auto& m : req.messages) {
    if (m.role == ChatRole::kUser) {
      is_tool = false;
      b.special(kUser);
      b.text(m.content);
    } else if (m.role == ChatRole::kAssistant && m.content_null) {
      is_tool = false;
      for (const auto& c : m.tool_calls) {
        if (!is_first) {
          b.special(kAssistant);
          b.special(kCallsBegin);
          b.special(kCallBegin);
        } else {
          b.text("\n");
          b.special(kCallBegin);
        }
        b.text("function");
        b.special(kSep);
        b.text(c.name + "\n```json\n" + c.arguments + "\n```");
        b.special(kCallEnd);
        if (is_first) {
          b.special(kCallsEnd);
          b.special(kEos);
        }
        is_first = true;
      }
    } else if (m.role == ChatRole::kAssistant) {
      if (is_tool) {
        b.special(kOutputsEnd);
        is_tool = false;
      } else {
        b.special(kAssistant);
      }
      b.text(m.content);
      b.special(kEos);
    } else if (m.role == ChatRole::kTool) {
      is_tool = true;
      if (is_output_first) {
        b.special(kOutputsBegin);
        is_output_first = false;
      } else {
        b.text("\n");
      }
      b.special(kOutputBegin);
      b.text(m.content);
      b.special(kOutputEnd);
    }
  }
  if (is_tool) b.special(kOutputsEnd);
  if (req.add_generation_prompt && !is_tool) b.special(kAssistant);
  return b.take();
}

// DeepSeek-V3.1's template: `</think>` opens every answer to a user turn; thinking changes only the
// generation prompt (and a prefix assistant message). Content after tool outputs has no `<｜Assistant｜>`.
RenderedPrompt render_v31(const ChatRequest& req) {
  PromptBuilder b;
  b.special(kBos);
  bool first_sp = true;
  for (const auto& m : req.messages) {
    if (m.role != ChatRole::kSystem) continue;
    if (!first_sp) b.text("\n\n");
    b.text(m.content);
    first_sp = false;
  }
  bool is_first = false, is_tool = false, is_last_user = false;
  for (const auto& m : req.messages) {
    if (m.role == ChatRole::kUser) {
      is_tool = false;
      is_first = false;
      is_last_user = true;
      b.special(kUser);
      b.text(m.content);
    } else if (m.role == ChatRole::kAssistant && !m.tool_calls.empty()) {
      if (is_last_user) {
        b.special(kAssistant);
        b.special(kThinkEnd);
      }
      is_last_user = false;
      is_first = false;
      is_tool = false;
      for (const auto& c : m.tool_calls) {
        if (!is_first) {
          if (!m.content_null) b.text(m.content);
          b.special(kCallsBegin);
          is_first = true;
        }
        b.special(kCallBegin);
        b.text(c.name);
        b.special(kSep);
        b.text(c.arguments);
        b.special(kCallEnd);
      }
      b.special(kCallsEnd);
      b.special(kEos);
    } else if (m.role == ChatRole::kAssistant) {
      if (is_last_user) {
        b.special(kAssistant);
        b.special(m.prefix && req.thinking ? kThinkStart : kThinkEnd);
      }
      is_last_user = false;
      if (is_tool) {
        b.text(m.content);
        is_tool = false;
      } else {
        std::string_view content = m.content;
        if (auto p = content.find(kThinkEnd); p != std::string_view::npos) content = content.substr(p + kThinkEnd.size());
        b.text(content);
      }
      b.special(kEos);
    } else if (m.role == ChatRole::kTool) {
      is_last_user = false;
      is_tool = true;
      b.special(kOutputBegin);
      b.text(m.content);
      b.special(kOutputEnd);
    }
  }
  if (req.add_generation_prompt && is_last_user && !is_tool) {
    b.special(kAssistant);
    b.special(req.thinking ? kThinkStart : kThinkEnd);
  }
  return b.take();
}

}  // namespace chat_detail
}  // namespace deepinfer::tokenizer
