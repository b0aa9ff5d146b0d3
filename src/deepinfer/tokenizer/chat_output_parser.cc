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
    // kToolBlock: wait for the whole block.
    auto close = b.find(block_close_);
    if (close == std::string_view::npos) {
      if (final) {  // truncated block: its text is content, as nothing can be called
        out->content += b;
        buf_.clear();
      }
      return;
    }
    parse_tool_block(b.substr(block_open_.size(), close - block_open_.size()), out);
    saw_tool_calls_ = true;
    buf_.clear();  // what follows the block (the end of sentence) is not content
    state_ = State::kDone;
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
