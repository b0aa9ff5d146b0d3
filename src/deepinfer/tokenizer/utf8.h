// UTF-8 helpers shared by the tokenizer: code point iteration, validation and lossy repair.
//
// The reference (HF `tokenizers`, reached from Python) only ever sees valid Unicode strings. Bytes from our
// callers may be anything, so encode() first repairs input exactly like Python's
// `bytes.decode("utf-8", errors="replace")` and Rust's `String::from_utf8_lossy`: every maximal ill-formed
// subpart becomes one U+FFFD. The same rule turns decoded token bytes back into text.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace deepinfer::tokenizer {

inline constexpr char32_t kReplacementChar = 0xFFFD;

// Length of the well-formed UTF-8 sequence starting at s[0], or 0 if s starts with an ill-formed subpart.
// `*subpart` (optional) receives the length of the maximal ill-formed subpart in that case (>= 1), or the
// number of bytes that form a valid-but-truncated prefix when the string ends early.
size_t utf8_sequence_length(std::string_view s, size_t* subpart = nullptr);

// True when every byte belongs to a well-formed sequence.
bool is_valid_utf8(std::string_view s);

// Replaces each maximal ill-formed subpart with U+FFFD (Unicode's "substitution of maximal subparts").
std::string sanitize_utf8(std::string_view s);

// Length of the longest prefix of `s` after which an incomplete (but so far valid) sequence starts at the
// end, i.e. the bytes that can be emitted now without ever changing later. Ill-formed subparts in the middle
// are part of the prefix (they become U+FFFD whatever follows).
size_t utf8_stable_prefix(std::string_view s);

// Decodes the code point at s[*pos] (which must be valid UTF-8) and advances *pos.
inline char32_t next_code_point(std::string_view s, size_t* pos) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data()) + *pos;
  char32_t c = p[0];
  if (c < 0x80) {
    *pos += 1;
    return c;
  }
  if (c < 0xE0) {
    *pos += 2;
    return ((c & 0x1F) << 6) | (p[1] & 0x3F);
  }
  if (c < 0xF0) {
    *pos += 3;
    return ((c & 0x0F) << 12) | ((p[1] & 0x3F) << 6) | (p[2] & 0x3F);
  }
  *pos += 4;
  return ((c & 0x07) << 18) | ((p[1] & 0x3F) << 12) | ((p[2] & 0x3F) << 6) | (p[3] & 0x3F);
}

void append_utf8(char32_t c, std::string* out);

}  // namespace deepinfer::tokenizer
