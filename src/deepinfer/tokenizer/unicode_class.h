// Code point classes for the hand-written pre-tokenizer matchers (split_matchers.h): the major General
// Category of Unicode 16.0 (what Oniguruma in HF `tokenizers` 0.23 uses for \p{L} \p{N} \p{P} \p{S} \p{M}) and
// Oniguruma's \s (the White_Space property). One table lookup per code point, ASCII in the first block.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace deepinfer::tokenizer {

// Bits of unicode_class().
enum : uint8_t {
  kClassL = 1,      // \p{L}
  kClassN = 2,      // \p{N}
  kClassP = 4,      // \p{P}
  kClassS = 8,      // \p{S}
  kClassM = 16,     // \p{M}
  kClassSpace = 32  // \s: Unicode White_Space (PCRE2 UCP adds U+180E; Oniguruma does not)
};

// The generated data (unicode_categories.cc): runs of equal major category, category codes 0 (none) then L N P
// S M.
struct CategoryRun {
  uint32_t first;
  uint8_t category;
};
extern const CategoryRun kUnicode16CategoryRuns[];
extern const size_t kUnicode16CategoryRunCount;

// Two-level table: block index per 256 code points, then one byte of class bits per code point.
struct UnicodeClassTable {
  static constexpr uint32_t kBlocks = 0x110000 >> 8;
  uint16_t block[kBlocks];
  const uint8_t* bits;  // block b's classes are bits[block[b] * 256 + (c & 255)]

  uint8_t operator()(char32_t c) const { return c < 0x110000 ? bits[(size_t{block[c >> 8]} << 8) | (c & 255)] : 0; }
};

// Built on first use (thread-safe), then immutable.
const UnicodeClassTable& unicode_classes();

// Decodes the code point at s[pos] (valid UTF-8, pos < s.size()), stores its byte length in *len.
inline char32_t decode_at(std::string_view s, size_t pos, size_t* len) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data()) + pos;
  const char32_t c = p[0];
  if (c < 0x80) {
    *len = 1;
    return c;
  }
  if (c < 0xE0) {
    *len = 2;
    return ((c & 0x1F) << 6) | (p[1] & 0x3F);
  }
  if (c < 0xF0) {
    *len = 3;
    return ((c & 0x0F) << 12) | ((p[1] & 0x3F) << 6) | (p[2] & 0x3F);
  }
  *len = 4;
  return ((c & 0x07) << 18) | ((p[1] & 0x3F) << 12) | ((p[2] & 0x3F) << 6) | (p[3] & 0x3F);
}

}  // namespace deepinfer::tokenizer
