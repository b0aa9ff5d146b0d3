#include "deepinfer/tokenizer/added_vocabulary.h"

#include <unicode/uchar.h>

#include <cctype>
#include <cstring>

#include "deepinfer/tokenizer/utf8.h"

namespace deepinfer::tokenizer {
namespace {

// Rust's char::is_alphanumeric (Alphabetic or Numeric) plus '_'.
bool is_word_char(char32_t c) {
  if (c < 0x80) return std::isalnum(static_cast<int>(c)) || c == '_';
  return u_hasBinaryProperty(c, UCHAR_ALPHABETIC) || (U_GET_GC_MASK(c) & U_GC_N_MASK) != 0;
}

// Rust's char::is_whitespace (Unicode White_Space).
bool is_white_space(char32_t c) { return u_isUWhiteSpace(static_cast<UChar32>(c)); }

size_t previous_code_point_start(std::string_view s, size_t end) {
  size_t b = end - 1;
  while (b > 0 && (static_cast<unsigned char>(s[b]) & 0xC0) == 0x80) --b;
  return b;
}

}  // namespace

bool ends_with_word_char(std::string_view s) {
  if (s.empty()) return false;
  size_t p = previous_code_point_start(s, s.size());
  return is_word_char(next_code_point(s, &p));
}

bool starts_with_word_char(std::string_view s) {
  if (s.empty()) return false;
  size_t p = 0;
  return is_word_char(next_code_point(s, &p));
}

void TokenMatcher::add(std::string_view pattern, int32_t token_index) {
  if (pattern.empty()) return;  // an empty pattern would match everywhere; HF never matches it either
  int32_t node = 0;
  for (unsigned char b : pattern) {
    const uint64_t key = (static_cast<uint64_t>(node) << 8) | b;
    auto it = edges_.find(key);
    if (it == edges_.end()) {
      const auto child = static_cast<int32_t>(terminal_.size());
      terminal_.push_back(-1);
      it = edges_.emplace(key, child).first;
    }
    node = it->second;
  }
  // The first token listed keeps a duplicated pattern.
  if (terminal_[node] < 0) terminal_[node] = token_index;
  const auto first = static_cast<unsigned char>(pattern[0]);
  if (!first_byte_[first]) first_bytes_.push_back(first);
  first_byte_[first] = true;
  ++count_;
}

size_t TokenMatcher::next_candidate(std::string_view text, size_t pos) const {
  constexpr size_t kMemchrLimit = 3;
  if (first_bytes_.size() > kMemchrLimit) {
    while (pos < text.size() && !first_byte_[static_cast<unsigned char>(text[pos])]) ++pos;
    return pos;
  }
  size_t best = text.size();
  for (unsigned char b : first_bytes_) {
    const void* hit = std::memchr(text.data() + pos, b, best - pos);
    if (hit) best = static_cast<size_t>(static_cast<const char*>(hit) - text.data());
  }
  return best;
}

int32_t TokenMatcher::longest_at(std::string_view text, size_t pos, size_t* len) const {
  int32_t node = 0, best = -1;
  for (size_t i = pos; i < text.size(); ++i) {
    auto it = edges_.find((static_cast<uint64_t>(node) << 8) | static_cast<unsigned char>(text[i]));
    if (it == edges_.end()) break;
    node = it->second;
    if (terminal_[node] >= 0) {
      best = terminal_[node];
      *len = i + 1 - pos;
    }
  }
  return best;
}

void TokenMatcher::split(std::string_view text, const std::vector<AddedToken>& tokens, const std::vector<bool>& skip,
                         std::vector<Segment>* out) const {
  const auto n = static_cast<uint32_t>(text.size());
  uint32_t start_offset = 0;
  size_t pos = 0;
  while ((pos = next_candidate(text, pos)) < text.size()) {
    size_t len = 0;
    const int32_t t = longest_at(text, pos, &len);
    if (t < 0) {
      ++pos;
      continue;
    }
    if (skip[t]) {
      pos += len;  // HF's matcher consumed the match before discarding it
      continue;
    }
    const AddedToken& tok = tokens[t];
    auto start = static_cast<uint32_t>(pos);
    auto stop = static_cast<uint32_t>(pos + len);
    pos = stop;  // the matcher's own matches never overlap
    if (tok.single_word) {
      const bool start_ok = start == 0 || !ends_with_word_char(text.substr(0, start));
      const bool stop_ok = stop == n || !starts_with_word_char(text.substr(stop));
      if (!start_ok || !stop_ok) continue;
    }
    if (tok.lstrip) {
      // Take the white space before the token, but not what the previous match already took.
      while (start > start_offset) {
        const size_t b = previous_code_point_start(text, start);
        size_t p = b;
        if (!is_white_space(next_code_point(text, &p))) break;
        start = static_cast<uint32_t>(b);
      }
    }
    if (tok.rstrip) {
      size_t p = stop;
      while (p < text.size()) {
        size_t q = p;
        if (!is_white_space(next_code_point(text, &q))) break;
        p = q;
      }
      stop = static_cast<uint32_t>(p);
      pos = stop;
    }
    if (start > start_offset) out->push_back({-1, start_offset, start});
    out->push_back({tok.id, start, stop});
    start_offset = stop;
  }
  if (start_offset != n) out->push_back({-1, start_offset, n});
}

}  // namespace deepinfer::tokenizer
