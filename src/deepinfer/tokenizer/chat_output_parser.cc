#include "deepinfer/tokenizer/chat_output_parser.h"

#include <algorithm>

#include "deepinfer/core/error.h"

namespace deepinfer::tokenizer {

namespace {

constexpr std::string_view kThinkEnd = "</think>";

// Length of the longest suffix of `s` that is a proper prefix of one of `markers`: bytes that must wait.
size_t held_suffix(std::string_view s, std::initializer_list<std::string_view> markers) {
  size_t best = 0;
  for (auto m : markers) {
    for (size_t n = std::min(s.size(), m.size() - 1); n > best; --n) {
      if (s.substr(s.size() - n) == m.substr(0, n)) {
        best = n;
        break;
      }
    }
  }
  return best;
}

size_t trailing_newlines(std::string_view s) {
  size_t n = 0;
  while (n < s.size() && s[s.size() - 1 - n] == '\n') ++n;
  return n;
}

// Bytes of `s` up to the last complete UTF-8 character (an unfinished sequence at the end waits for its rest).
size_t complete_utf8(std::string_view s) {
  size_t n = s.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const auto c = static_cast<unsigned char>(s[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: look further back for the lead
    const size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return need > back ? n - back : n;
  }
  return n;
}

// JSON string body (no quotes) of `s`, escaped as nlohmann's dump escapes it, so pieces concatenate to the
// escape of the whole.
std::string json_escape(std::string_view s) {
  std::string q = nlohmann::ordered_json(std::string(s)).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return q.substr(1, q.size() - 2);
}

std::string attr(std::string_view tag, std::string_view key) {
  std::string k = std::string(key) + "=\"";
  auto p = tag.find(k);
  if (p == std::string_view::npos) return {};
  p += k.size();
  auto e = tag.find('"', p);
  return std::string(tag.substr(p, e == std::string_view::npos ? std::string_view::npos : e - p));
}

}  // namespace

ChatOutputParser::ChatOutputParser(ChatFormat format, bool thinking)
    : format_(format), thinking_(thinking), state_(thinking ? State::kReasoning : State::kContent) {
  switch (format) {
    case ChatFormat::kV4:
      block_open_ = "<｜DSML｜tool_calls>";
      block_close_ = "</｜DSML｜tool_calls>";
      break;
    case ChatFormat::kV41:
      block_open_ = "<｜DSML｜ calls>";
      block_close_ = "</｜DSML｜ calls>";
      break;
    default:
      block_open_ = "<｜tool▁calls▁begin｜>";
      block_close_ = "<｜tool▁calls▁end｜>";
  }
}

ChatDelta ChatOutputParser::feed(std::string_view text) {
  ChatDelta out;
  buf_ += text;
  step(&out, false);
  return out;
}

ChatDelta ChatOutputParser::finish() {
  ChatDelta out;
  step(&out, true);
  state_ = State::kDone;
  return out;
}

void ChatOutputParser::step(ChatDelta* out, bool final) {
  for (;;) {
    if (state_ == State::kDone) {
      buf_.clear();
      return;
    }
    std::string_view b = buf_;
    if (state_ == State::kReasoning) {
      if (!reasoning_started_) {
        size_t n = 0;
        while (n < b.size() && b[n] == '\n') ++n;
        buf_.erase(0, n);
        b = buf_;
        if (b.empty()) return;
        reasoning_started_ = true;
      }
      auto p = b.find(kThinkEnd);
      if (p != std::string_view::npos) {
        std::string_view r = b.substr(0, p);
        out->reasoning += r.substr(0, r.size() - trailing_newlines(r));
        buf_.erase(0, p + kThinkEnd.size());
        state_ = State::kContent;
        continue;
      }
      size_t hold = final ? 0 : held_suffix(b, {kThinkEnd});
      std::string_view safe = b.substr(0, b.size() - hold);
      size_t nl = trailing_newlines(safe);
      if (final) nl = 0;
      if (hold == 0 || true) safe = safe.substr(0, safe.size() - nl);
      out->reasoning += safe;
      buf_.erase(0, safe.size());
      return;
    }
    if (state_ == State::kContent) {
      // A `</think>` in the answer is dropped (deepseek-recipe does the same), but not one inside a tool-call
      // block: fed in pieces the block starts before that `</think>` arrives, so fed whole it must not matter.
      auto open = b.find(block_open_);
      if (auto t = b.find(kThinkEnd); t != std::string_view::npos && t < open) {
        // The text before it is final (but its trailing newlines, which a following block drops): erasing the
        // tag must not splice a marker out of the text around it (`<｜DSML</think>｜ calls>`), which fed in
        // pieces could already have been emitted.
        std::string_view c = b.substr(0, t);
        const size_t keep = trailing_newlines(c);
        out->content += c.substr(0, c.size() - keep);
        buf_.erase(0, c.size() - keep);
        buf_.erase(keep, kThinkEnd.size());
        continue;
      }
      if (open != std::string_view::npos) {
        std::string_view c = b.substr(0, open);
        out->content += c.substr(0, c.size() - trailing_newlines(c));
        buf_.erase(0, open);
        state_ = State::kToolBlock;
        continue;
      }
      size_t hold = final ? 0 : held_suffix(b, {std::string_view(block_open_), kThinkEnd});
      std::string_view safe = b.substr(0, b.size() - hold);
      if (!final) safe = safe.substr(0, safe.size() - trailing_newlines(safe));
      out->content += safe;
      buf_.erase(0, safe.size());
      return;
    }
    // kToolBlock: calls stream as they are written; the block's complete parse comes when it closes.
    auto close = b.find(block_close_);
    stream_tool_block(close == std::string_view::npos ? b : b.substr(0, close), out);
    if (close == std::string_view::npos) {
      if (final) {  // truncated block: its text is content, as nothing can be called
        if (!streamed_args_.empty()) out->streamed_block_at = out->content.size();
        out->content += b;
        buf_.clear();
      }
      return;
    }
    parse_tool_block(b.substr(block_open_.size(), close - block_open_.size()), out);
    // What the stream lacks of the complete calls (a malformed call the scan could not follow) is sent now.
    for (size_t i = 0; i < out->tool_calls.size(); ++i) {
      const ParsedToolCall& c = out->tool_calls[i];
      if (i >= streamed_args_.size()) {
        start_call(out, c.name);
        emit_arguments(out, c.arguments);
      } else if (c.arguments.size() > streamed_args_[i].size() && c.arguments.starts_with(streamed_args_[i])) {
        ToolCallDelta d;
        d.index = static_cast<int>(i);
        d.arguments = c.arguments.substr(streamed_args_[i].size());
        streamed_args_[i] = c.arguments;
        out->tool_call_deltas.push_back(std::move(d));
      }
    }
    saw_tool_calls_ = true;
    buf_.clear();  // what follows the block (the end of sentence) is not content
    state_ = State::kDone;
  }
}

void ChatOutputParser::start_call(ChatDelta* out, std::string name) {
  ToolCallDelta d;
  d.index = static_cast<int>(streamed_args_.size());
  d.name = std::move(name);
  streamed_args_.emplace_back();
  out->tool_call_deltas.push_back(std::move(d));
}

void ChatOutputParser::emit_arguments(ChatDelta* out, std::string_view piece) {
  if (piece.empty() || streamed_args_.empty()) return;
  const int index = static_cast<int>(streamed_args_.size()) - 1;
  streamed_args_.back() += piece;
  if (out->tool_call_deltas.empty() || out->tool_call_deltas.back().index != index) {
    ToolCallDelta d;
    d.index = index;
    out->tool_call_deltas.push_back(std::move(d));
  }
  out->tool_call_deltas.back().arguments += piece;
}

void ChatOutputParser::stream_tool_block(std::string_view block, ChatDelta* out) {
  if (stream_pos_ == 0) stream_pos_ = block_open_.size();
  if (stream_pos_ > block.size()) return;
  if (format_ == ChatFormat::kV4 || format_ == ChatFormat::kV41)
    stream_dsml(block, out);
  else
    stream_v3(block, out);
}

// DSML: <invoke name="f"> (<parameter name="k" string="true|false">value</parameter>)* </invoke>, arguments
// spelled as parse_tool_block spells them: {"k": value, ...}.
void ChatOutputParser::stream_dsml(std::string_view block, ChatDelta* out) {
  const bool v41 = format_ == ChatFormat::kV41;
  const std::string inv_open = v41 ? "<｜DSML｜ invoke" : "<｜DSML｜invoke";
  const std::string inv_close = v41 ? "</｜DSML｜ invoke>" : "</｜DSML｜invoke>";
  const std::string par_open = v41 ? "<｜DSML｜ parameter" : "<｜DSML｜parameter";
  const std::string par_close = v41 ? "</｜DSML｜ parameter>" : "</｜DSML｜parameter>";
  constexpr auto npos = std::string_view::npos;
  for (;;) {
    switch (call_state_) {
      case CallState::kBetween: {
        size_t p = block.find(inv_open, stream_pos_);
        if (p == npos) return;
        size_t te = block.find('>', p);
        if (te == npos) return;
        start_call(out, attr(block.substr(p, te - p), "name"));
        params_started_ = false;
        stream_pos_ = te + 1;
        call_state_ = CallState::kArgs;
        break;
      }
      case CallState::kArgs: {
        size_t p = block.find(par_open, stream_pos_);
        size_t e = block.find(inv_close, stream_pos_);
        if (e != npos && (p == npos || e < p)) {
          emit_arguments(out, params_started_ ? "}" : "{}");
          stream_pos_ = e + inv_close.size();
          call_state_ = CallState::kBetween;
          break;
        }
        if (p == npos) return;
        size_t te = block.find('>', p);
        if (te == npos) return;
        std::string_view tag = block.substr(p, te - p);
        param_is_string_ = attr(tag, "string") == "true";
        std::string head = params_started_ ? ", " : "{";
        head +=
            nlohmann::ordered_json(attr(tag, "name")).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
        head += ": ";
        if (param_is_string_) head += '"';
        emit_arguments(out, head);
        params_started_ = true;
        stream_pos_ = te + 1;
        call_state_ = CallState::kParam;
        break;
      }
      case CallState::kParam: {
        size_t pe = block.find(par_close, stream_pos_);
        if (pe == npos) {
          if (!param_is_string_) return;  // a number / object / ... is spelled once it is whole
          std::string_view rest = block.substr(stream_pos_);
          rest = rest.substr(0, rest.size() - held_suffix(rest, {std::string_view(par_close)}));
          rest = rest.substr(0, complete_utf8(rest));
          emit_arguments(out, json_escape(rest));
          stream_pos_ += rest.size();
          return;
        }
        std::string value(block.substr(stream_pos_, pe - stream_pos_));
        if (param_is_string_) {
          emit_arguments(out, json_escape(value) + "\"");
        } else {
          auto v = nlohmann::ordered_json::parse(value, nullptr, /*allow_exceptions=*/false);
          emit_arguments(out, chat_detail::dump_spaced(v.is_discarded() ? nlohmann::ordered_json(value) : v));
        }
        stream_pos_ = pe + par_close.size();
        call_state_ = CallState::kArgs;
        break;
      }
      default:
        return;
    }
  }
}

// V3 / V3.1: <call begin> [function <sep> name "\n" ["```json\n"] | name <sep>] arguments ["\n```"] <call end>.
void ChatOutputParser::stream_v3(std::string_view block, ChatDelta* out) {
  constexpr std::string_view kCallBegin = "<｜tool▁call▁begin｜>", kCallEnd = "<｜tool▁call▁end｜>",
                             kSep = "<｜tool▁sep｜>", kFenceOpen = "```json\n", kFenceClose = "\n```";
  static const std::string kFencedEnd = std::string(kFenceClose) + std::string(kCallEnd);
  constexpr auto npos = std::string_view::npos;
  for (;;) {
    switch (call_state_) {
      case CallState::kBetween: {
        size_t p = block.find(kCallBegin, stream_pos_);
        if (p == npos) return;
        stream_pos_ = p + kCallBegin.size();
        call_state_ = CallState::kHead;
        break;
      }
      case CallState::kHead: {
        size_t sep = block.find(kSep, stream_pos_);
        size_t end = block.find(kCallEnd, stream_pos_);
        if (end != npos && (sep == npos || end < sep)) {  // no separator: parse_tool_block stops here too
          call_state_ = CallState::kBroken;
          return;
        }
        if (sep == npos) return;
        std::string_view before = block.substr(stream_pos_, sep - stream_pos_);
        const size_t after = sep + kSep.size();
        if (before != "function") {  // V3.1: name <sep> arguments
          start_call(out, std::string(before));
          v3_fenced_ = false;
          stream_pos_ = after;
          call_state_ = CallState::kArgs;
          break;
        }
        size_t nl = block.find('\n', after);
        if (end != npos && (nl == npos || nl > end)) {  // a name and no arguments
          start_call(out, std::string(block.substr(after, end - after)));
          stream_pos_ = end + kCallEnd.size();
          call_state_ = CallState::kBetween;
          break;
        }
        if (nl == npos) return;
        start_call(out, std::string(block.substr(after, nl - after)));
        v3_fenced_ = true;
        stream_pos_ = nl + 1;
        call_state_ = CallState::kFence;
        break;
      }
      case CallState::kFence: {
        size_t end = block.find(kCallEnd, stream_pos_);
        std::string_view a = block.substr(stream_pos_, end == npos ? npos : end - stream_pos_);
        if (a.starts_with(kFenceOpen)) {
          stream_pos_ += kFenceOpen.size();
        } else if (end == npos && kFenceOpen.starts_with(a)) {
          return;  // could still become the fence
        }
        call_state_ = CallState::kArgs;
        break;
      }
      case CallState::kArgs: {
        size_t end = block.find(kCallEnd, stream_pos_);
        if (end == npos) {
          std::string_view rest = block.substr(stream_pos_);
          const size_t hold =
              v3_fenced_ ? held_suffix(rest, {kCallEnd, std::string_view(kFencedEnd)}) : held_suffix(rest, {kCallEnd});
          rest = rest.substr(0, rest.size() - hold);
          rest = rest.substr(0, complete_utf8(rest));
          emit_arguments(out, rest);
          stream_pos_ += rest.size();
          return;
        }
        std::string_view rest = block.substr(stream_pos_, end - stream_pos_);
        if (v3_fenced_ && (streamed_args_.back() + std::string(rest)).ends_with(kFenceClose) &&
            rest.size() >= kFenceClose.size())
          rest.remove_suffix(kFenceClose.size());
        emit_arguments(out, rest);
        stream_pos_ = end + kCallEnd.size();
        call_state_ = CallState::kBetween;
        break;
      }
      default:
        return;
    }
  }
}

void ChatOutputParser::parse_tool_block(std::string_view block, ChatDelta* out) const {
  if (format_ == ChatFormat::kV4 || format_ == ChatFormat::kV41) {
    const bool v41 = format_ == ChatFormat::kV41;
    const std::string inv_open = v41 ? "<｜DSML｜ invoke" : "<｜DSML｜invoke";
    const std::string inv_close = v41 ? "</｜DSML｜ invoke>" : "</｜DSML｜invoke>";
    const std::string par_open = v41 ? "<｜DSML｜ parameter" : "<｜DSML｜parameter";
    const std::string par_close = v41 ? "</｜DSML｜ parameter>" : "</｜DSML｜parameter>";
    size_t pos = 0;
    while ((pos = block.find(inv_open, pos)) != std::string_view::npos) {
      size_t tag_end = block.find('>', pos);
      size_t end = block.find(inv_close, pos);
      if (tag_end == std::string_view::npos || end == std::string_view::npos) break;
      ParsedToolCall call;
      call.name = attr(block.substr(pos, tag_end - pos), "name");
      nlohmann::ordered_json args = nlohmann::ordered_json::object();
      std::string_view body = block.substr(tag_end + 1, end - tag_end - 1);
      size_t p = 0;
      while ((p = body.find(par_open, p)) != std::string_view::npos) {
        size_t te = body.find('>', p);
        size_t pe = body.find(par_close, p);
        if (te == std::string_view::npos || pe == std::string_view::npos) break;
        std::string_view tag = body.substr(p, te - p);
        std::string value(body.substr(te + 1, pe - te - 1));
        std::string key = attr(tag, "name");
        if (attr(tag, "string") == "true") {
          args[key] = value;
        } else {
          auto v = nlohmann::ordered_json::parse(value, nullptr, /*allow_exceptions=*/false);
          args[key] = v.is_discarded() ? nlohmann::ordered_json(value) : v;
        }
        p = pe + par_close.size();
      }
      call.arguments = chat_detail::dump_spaced(args);
      out->tool_calls.push_back(std::move(call));
      pos = end + inv_close.size();
    }
    return;
  }
  // V3 / V3.1 markup.
  constexpr std::string_view kCallBegin = "<｜tool▁call▁begin｜>", kCallEnd = "<｜tool▁call▁end｜>",
                             kSep = "<｜tool▁sep｜>";
  size_t pos = 0;
  while ((pos = block.find(kCallBegin, pos)) != std::string_view::npos) {
    size_t end = block.find(kCallEnd, pos);
    if (end == std::string_view::npos) break;
    std::string_view call = block.substr(pos + kCallBegin.size(), end - pos - kCallBegin.size());
    ParsedToolCall pc;
    auto sep = call.find(kSep);
    if (sep == std::string_view::npos) break;
    std::string_view before = call.substr(0, sep), after = call.substr(sep + kSep.size());
    if (before == "function") {  // V3: type <sep> name \n ```json \n args \n ```
      auto nl = after.find('\n');
      pc.name = std::string(after.substr(0, nl));
      std::string_view a = nl == std::string_view::npos ? std::string_view() : after.substr(nl + 1);
      if (a.starts_with("```json\n")) a.remove_prefix(8);
      if (a.ends_with("\n```")) a.remove_suffix(4);
      pc.arguments = std::string(a);
    } else {  // V3.1: name <sep> args
      pc.name = std::string(before);
      pc.arguments = std::string(after);
    }
    out->tool_calls.push_back(std::move(pc));
    pos = end + kCallEnd.size();
  }
}

}  // namespace deepinfer::tokenizer
