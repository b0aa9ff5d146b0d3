// Incremental parser of model output into reasoning, content and tool calls, fed any split of the text (token
// by token, byte by byte); the totals are the same for every split. Checked against deepseek-recipe's stream
// parser (tests/data/tokenizer/chat_expected.json "parses").
//
//   ChatOutputParser p(ChatFormat::kV41, /*thinking=*/true);
//   for (piece : stream) { ChatDelta d = p.feed(piece); ... }
//   ChatDelta last = p.finish();
//
// Grammar: [reasoning "</think>"] content [DSML block | V3 tool-call block] [end of sentence].
// Reasoning drops its leading and trailing newlines; content drops the newlines before a tool-call block.
// DSML parameters with string="true" become JSON strings, others are parsed as JSON (kept as a string when
// they do not parse); arguments are spelled with ", " / ": " separators like deepseek-recipe.
// V3/V3.1 tool calls: `<｜tool▁calls▁begin｜>` (`<｜tool▁call▁begin｜>` [type `<｜tool▁sep｜>`] name ... args
// `<｜tool▁call▁end｜>`)* `<｜tool▁calls▁end｜>`, args optionally fenced in ```json.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "deepinfer/tokenizer/chat_encoding.h"

namespace deepinfer::tokenizer {

struct ParsedToolCall {
  std::string name;
  std::string arguments;  // JSON object text
};

struct ChatDelta {
  std::string reasoning;
  std::string content;
  std::vector<ParsedToolCall> tool_calls;  // complete calls only
  bool empty() const { return reasoning.empty() && content.empty() && tool_calls.empty(); }
};

class ChatOutputParser {
 public:
  ChatOutputParser(ChatFormat format, bool thinking);
  ChatDelta feed(std::string_view text);
  ChatDelta finish();
  bool done() const { return state_ == State::kDone; }
  bool saw_tool_calls() const { return saw_tool_calls_; }

 private:
  enum class State { kReasoning, kContent, kToolBlock, kDone };
  void step(ChatDelta* out, bool final);
  void parse_tool_block(std::string_view block, ChatDelta* out) const;

  ChatFormat format_;
  bool thinking_;
  State state_;
  std::string buf_;
  bool reasoning_started_ = false;  // leading newlines of reasoning are dropped until the first other byte
  bool saw_tool_calls_ = false;
  std::string block_open_, block_close_;
};

}  // namespace deepinfer::tokenizer
