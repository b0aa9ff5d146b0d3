#include "deepinfer/tokenizer/utf8.h"

namespace deepinfer::tokenizer {

size_t utf8_sequence_length(std::string_view s, size_t* subpart) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  if (n == 0) return 0;
  const unsigned char b0 = p[0];
  if (b0 < 0x80) return 1;
  // Table 3-7 of the Unicode standard: allowed range of the second byte depends on the first.
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;  // surrogates are ill-formed
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    if (subpart) *subpart = 1;
    return 0;
  }
  size_t i = 1;
  for (; i < need; ++i) {
    if (i >= n) {
      if (subpart) *subpart = i;  // truncated: the caller decides whether more bytes may come
      return 0;
    }
    const unsigned char lim_lo = (i == 1) ? lo : 0x80;
    const unsigned char lim_hi = (i == 1) ? hi : 0xBF;
    if (p[i] < lim_lo || p[i] > lim_hi) {
      if (subpart) *subpart = i;
      return 0;
    }
  }
  return need;
}

bool is_valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    // ASCII fast path, 8 bytes at a time.
    while (i + 8 <= s.size()) {
      uint64_t w;
      __builtin_memcpy(&w, s.data() + i, 8);
      if (w & 0x8080808080808080ULL) break;
      i += 8;
    }
    if (i >= s.size()) break;
    const size_t len = utf8_sequence_length(s.substr(i));
    if (len == 0) return false;
    i += len;
  }
  return true;
}

std::string sanitize_utf8(std::string_view s) {
  if (is_valid_utf8(s)) return std::string(s);
  std::string out;
  out.reserve(s.size() + 16);
  size_t i = 0;
  while (i < s.size()) {
    size_t bad = 0;
    const size_t len = utf8_sequence_length(s.substr(i), &bad);
    if (len > 0) {
      out.append(s.data() + i, len);
      i += len;
    } else {
      append_utf8(kReplacementChar, &out);
      i += bad;
    }
  }
  return out;
}

size_t utf8_stable_prefix(std::string_view s) {
  // Only the last <= 3 bytes can be the start of an unfinished sequence.
  const size_t n = s.size();
  const size_t from = n > 3 ? n - 3 : 0;
  for (size_t start = from; start < n; ++start) {
    const auto b = static_cast<unsigned char>(s[start]);
    if (b < 0xC2 || b > 0xF4) continue;  // not a lead byte
    size_t bad = 0;
    const std::string_view tail = s.substr(start);
    if (utf8_sequence_length(tail, &bad) == 0 && bad == tail.size()) return start;  // truncated, not broken
  }
  return n;
}

void append_utf8(char32_t c, std::string* out) {
  if (c < 0x80) {
    out->push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (c >> 6)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (c >> 12)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (c >> 18)));
    out->push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

}  // namespace deepinfer::tokenizer
