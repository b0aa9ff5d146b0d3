#include "deepinfer/server/sample_output.h"

#include <algorithm>

namespace deepinfer::server {

namespace {
// Moves `cut` back to the start of a UTF-8 character so no chunk ends inside one.
size_t char_boundary(const std::string& s, size_t cut) {
  while (cut > 0 && cut < s.size() && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;
  return cut;
}
}  // namespace

SampleOutput::SampleOutput(const SampleOutputOptions& options) : opt_(options) {
  if (opt_.tok) decoder_.emplace(*opt_.tok, opt_.skip_special_tokens);
  if (opt_.chat) parser_.emplace(opt_.format, opt_.thinking);
  for (const auto& s : opt_.stop) hold_ = std::max(hold_, s.size() - 1);
}

std::string SampleOutput::release(bool final) {
  size_t cut = pending_.size();
  if (!final) cut = char_boundary(pending_, pending_.size() > hold_ ? pending_.size() - hold_ : 0);
  std::string out = pending_.substr(0, cut);
  pending_.erase(0, cut);
  return out;
}

tokenizer::ChatDelta SampleOutput::feed(const SequenceDelta& d) {
  tokenizer::ChatDelta out;
  if (finished_) return out;
  num_tokens_ += static_cast<int64_t>(d.new_token_ids.size());
  token_ids_.insert(token_ids_.end(), d.new_token_ids.begin(), d.new_token_ids.end());
  if (decoder_) {
    for (size_t i = 0; i < d.new_token_ids.size(); ++i) {
      const TokenId id = d.new_token_ids[i];
      const bool last = i + 1 == d.new_token_ids.size();
      // The EOS / stop token that ended the sample is not part of the text.
      if (d.finished && last &&
          (d.stop_reason == StopReason::kStopToken ||
           (d.stop_reason == StopReason::kEos &&
            std::find(opt_.eos_token_ids.begin(), opt_.eos_token_ids.end(), id) != opt_.eos_token_ids.end())))
        continue;
      if (opt_.tok->is_valid_id(id)) pending_ += decoder_->step(id);
    }
  }
  std::string text;
  if (d.finished) {
    if (decoder_) pending_ += decoder_->finish();
    if (d.stop_reason == StopReason::kStopString && !d.stop_string.empty()) {
      size_t at = pending_.find(d.stop_string);
      if (at != std::string::npos) pending_.resize(at);
    }
    text = release(true);
    finished_ = true;
    stop_reason_ = d.stop_reason;
    stop_string_ = d.stop_string;
  } else {
    text = release(false);
  }
  if (parser_) {
    out = parser_->feed(text);
    if (d.finished) {
      tokenizer::ChatDelta tail = parser_->finish();
      if (tail.streamed_block_at != std::string::npos)
        out.streamed_block_at = out.content.size() + tail.streamed_block_at;
      out.reasoning += tail.reasoning;
      out.content += tail.content;
      for (auto& c : tail.tool_calls) out.tool_calls.push_back(std::move(c));
      for (auto& c : tail.tool_call_deltas) out.tool_call_deltas.push_back(std::move(c));
    }
    saw_tool_calls_ = saw_tool_calls_ || !out.tool_calls.empty();
  } else {
    out.content = std::move(text);
  }
  return out;
}

std::string SampleOutput::finish_reason() const {
  if (saw_tool_calls_) return "tool_calls";
  switch (stop_reason_) {
    case StopReason::kMaxTokens:
    case StopReason::kMaxModelLen:
      return "length";
    case StopReason::kAborted:
      return "abort";
    case StopReason::kError:
      return "error";
    default:
      return "stop";
  }
}

}  // namespace deepinfer::server
