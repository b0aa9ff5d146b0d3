// Chat encoders: a conversation (system/user/assistant/tool messages, tool definitions, tool calls, reasoning)
// → the prompt text DeepSeek's models were trained on, with the byte ranges that are special tokens.
//
//   ChatRequest req = parse_chat_request(json);            // OpenAI-style {"messages": [...], "tools": [...]}
//   RenderedPrompt p = render_chat(req, ChatFormat::kV41);
//   std::vector<int32_t> ids = encode_prompt(tok, p);      // specials by id, the rest as plain text
//
// Formats and their references (fixtures: tools/make_chat_fixtures.py → tests/data/tokenizer/chat_expected.json):
//   kV3  : the chat_template of DeepSeek-V3's tokenizer_config.json (also R1-era tool markup), quirks included.
//   kV31 : DeepSeek-V3.1's chat_template (thinking: generation prompt `<｜Assistant｜><think>` vs `</think>`).
//   kV4  : DeepSeek-V4 (deepseek-recipe DeepseekV4Encoding): system text on top, DSML `<｜DSML｜tool_calls>`.
//   kV41 : DeepSeek-V4.1 (deepseek-recipe DeepseekV41Encoding): `<｜System｜>` blocks, "Reasoning Effort: N"
//          line in thinking mode, DSML `<｜DSML｜ calls>`.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "deepinfer/tokenizer/tokenizer.h"

namespace deepinfer::tokenizer {

enum class ChatFormat { kV3, kV31, kV4, kV41 };

// "v3", "v31", "v4", "v41" (also "v3.1", "v4.1"); InvalidArgument otherwise.
ChatFormat parse_chat_format(std::string_view name);

struct ChatToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // JSON text as the client sent it
};

struct ChatToolDefinition {
  std::string name;
  std::optional<std::string> description;
  nlohmann::ordered_json parameters;  // null when absent
};

enum class ChatRole { kSystem, kUser, kAssistant, kTool, kLatestReminder };

struct ChatMessage {
  ChatRole role = ChatRole::kUser;
  std::string content;
  bool content_null = false;  // assistant: JSON null content, or "" next to tool calls (OpenAI convention)
  std::optional<std::string> reasoning_content;
  std::vector<ChatToolCall> tool_calls;
  std::optional<std::string> tool_call_id;
  bool prefix = false;  // assistant: continued by the model (no end of sentence, no generation prompt)
};

struct ChatRequest {
  std::vector<ChatMessage> messages;
  std::vector<ChatToolDefinition> tools;
  bool thinking = true;
  std::string reasoning_effort;  // "" (default), "low", "high", "xhigh", "max"
  std::string tool_choice = "auto";  // "auto", "none", "required"
  bool add_generation_prompt = true;
};

struct ChatParseOptions {
  // Tool-call arguments must be a JSON object (deepseek-recipe itself renders other text as one "arguments"
  // string parameter; the fixtures turn this off to check that path).
  bool require_json_object_arguments = true;
};

// Parses {"messages": [...], "tools": [...], "thinking": bool, "reasoning_effort": s, "tool_choice": s} or a
// bare messages array. Errors name the message: `messages[2]: unknown role "robot"`,
// `messages[3].tool_calls[0]: missing function name`, `messages[3].tool_calls[0].arguments: not a JSON object`.
ChatRequest parse_chat_request(const nlohmann::ordered_json& j, const ChatParseOptions& options = {});

struct RenderedPrompt {
  std::string text;
  std::vector<std::pair<size_t, size_t>> special_ranges;  // ascending [begin, end) byte ranges of special tokens
};

RenderedPrompt render_chat(const ChatRequest& request, ChatFormat format);

// Prompt encoding as deepseek-recipe does it: each special range by its token id (NotFound if the tokenizer
// lacks it), the text between them with no added-token matching (kAllAsText), so user text that spells
// `<｜User｜>` stays text.
std::vector<int32_t> encode_prompt(const Tokenizer& tok, const RenderedPrompt& prompt);

namespace chat_detail {
// Builds a prompt from text and special-token pieces.
class PromptBuilder {
 public:
  void text(std::string_view s) { out_.text += s; }
  void special(std::string_view s) {
    out_.special_ranges.emplace_back(out_.text.size(), out_.text.size() + s.size());
    out_.text += s;
  }
  RenderedPrompt take() { return std::move(out_); }

 private:
  RenderedPrompt out_;
};
RenderedPrompt render_v3(const ChatRequest& request);
RenderedPrompt render_v31(const ChatRequest& request);
RenderedPrompt render_v4(const ChatRequest& request, bool v41);
// JSON text with ", " and ": " separators, non-ASCII kept (the tool-schema and DSML value spelling).
std::string dump_spaced(const nlohmann::ordered_json& j);
}  // namespace chat_detail

}  // namespace deepinfer::tokenizer
