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
// Tool calls come twice: whole in `tool_calls` when the block closes (what a non-streaming reply shows), and as
// `tool_call_deltas` while the block is written: a call's name as soon as its tag is complete, then its arguments
// in pieces (DSML string parameters byte by byte, other parameters when they close; V3 arguments byte by byte),
// never splitting a UTF-8 character. When the block closes, whatever the pieces lack of the complete calls is sent,
// so the pieces add up to `tool_calls` (a DSML call naming one parameter twice is the exception: the complete call
// keeps the last value in the first one's place, which streamed text cannot take back).
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

// A piece of a tool call as the model writes it. Per call, the pieces' `arguments` concatenate to the complete
// call's arguments (for any well-formed block; see ChatOutputParser).
struct ToolCallDelta {
  int index = 0;          // the call's position in the output (0, 1, ...)
  std::string name;       // on the call's first piece only
  std::string arguments;  // the next piece of the arguments' JSON text
};

struct ChatDelta {
  std::string reasoning;
  std::string content;
  std::vector<ParsedToolCall> tool_calls;       // complete calls, all at once when the block closes
  std::vector<ToolCallDelta> tool_call_deltas;  // the same calls streamed: name first, then argument pieces
  // A block cut off by the end of the output is content (nothing can be called), but a streaming client already
  // got its calls' pieces: `content` from this offset on is that block's text, which a stream leaves out.
  size_t streamed_block_at = std::string::npos;
  bool empty() const { return reasoning.empty() && content.empty() && tool_calls.empty() && tool_call_deltas.empty(); }
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
  // Streams the calls of the (open or just closed) tool-call block `block` from stream_pos_ on.
  void stream_tool_block(std::string_view block, ChatDelta* out);
  void stream_dsml(std::string_view block, ChatDelta* out);
  void stream_v3(std::string_view block, ChatDelta* out);
  void start_call(ChatDelta* out, std::string name);
  void emit_arguments(ChatDelta* out, std::string_view piece);

  ChatFormat format_;
  bool thinking_;
  State state_;
  std::string buf_;
  bool reasoning_started_ = false;  // leading newlines of reasoning are dropped until the first other byte
  bool saw_tool_calls_ = false;
  std::string block_open_, block_close_;

  // Tool-call streaming state: a scan of the block (buf_ from the block's opening tag) from stream_pos_ on.
  enum class CallState { kBetween, kHead, kFence, kArgs, kParam, kBroken };
  CallState call_state_ = CallState::kBetween;
  size_t stream_pos_ = 0;
  std::vector<std::string> streamed_args_;  // per started call: the argument text sent so far
  bool params_started_ = false;             // DSML: the current call's "{" is sent
  bool param_is_string_ = false;            // DSML: the open parameter is a string (streamed escaped)
  bool v3_fenced_ = false;                  // V3: the arguments may end in a "\n```" fence
};

}  // namespace deepinfer::tokenizer
