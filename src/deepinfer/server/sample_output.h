// SampleOutput: one sample's token stream → text the client sees. Tokens are detokenized incrementally (valid
// UTF-8 per chunk), the tail that could still become a stop string is held back (the stop string is cut from the
// output, as OpenAI does), and chat output is split into reasoning, content and tool calls by the model's
// ChatOutputParser. Runs on the connection's strand, not on the engine thread.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "deepinfer/engine/request.h"
#include "deepinfer/tokenizer/chat_output_parser.h"
#include "deepinfer/tokenizer/stream_decoder.h"
#include "deepinfer/tokenizer/tokenizer.h"

namespace deepinfer::server {

struct SampleOutputOptions {
  const tokenizer::Tokenizer* tok = nullptr;  // null: no text (token ids only)
  bool chat = false;                          // parse reasoning / tool calls
  tokenizer::ChatFormat format = tokenizer::ChatFormat::kV41;
  bool thinking = false;
  bool skip_special_tokens = true;  // completions; chat keeps them (the parser needs the markup)
  std::vector<std::string> stop;
  std::vector<TokenId> eos_token_ids;
};

class SampleOutput {
 public:
  explicit SampleOutput(const SampleOutputOptions& options);

  // The text this delta makes final. On the final delta everything held back is flushed.
  tokenizer::ChatDelta feed(const SequenceDelta& d);

  bool finished() const { return finished_; }
  StopReason stop_reason() const { return stop_reason_; }
  const std::string& stop_string() const { return stop_string_; }
  int64_t num_tokens() const { return num_tokens_; }
  bool saw_tool_calls() const { return saw_tool_calls_; }
  // OpenAI's finish_reason: stop / length / tool_calls / abort / error.
  std::string finish_reason() const;
  const std::vector<TokenId>& token_ids() const { return token_ids_; }

 private:
  std::string release(bool final);

  SampleOutputOptions opt_;
  std::optional<tokenizer::StreamDecoder> decoder_;
  std::optional<tokenizer::ChatOutputParser> parser_;
  size_t hold_ = 0;      // bytes held back for stop strings (longest stop - 1)
  std::string pending_;  // decoded, not yet released
  bool finished_ = false;
  StopReason stop_reason_ = StopReason::kNone;
  std::string stop_string_;
  int64_t num_tokens_ = 0;
  bool saw_tool_calls_ = false;
  std::vector<TokenId> token_ids_;
};

}  // namespace deepinfer::server
