#include "deepinfer/tokenizer/split_matchers.h"

#include "deepinfer/tokenizer/unicode_class.h"

namespace deepinfer::tokenizer {

const std::string_view kDeepSeekDigitsPattern = "\\p{N}{1,3}";
const std::string_view kDeepSeekCjkPattern = "[一-龥぀-ゟ゠-ヿ]+";
const std::string_view kDeepSeekWordPattern =
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| "
    "?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+";

namespace {

// Class bits of the code point at s[pos]; *len gets its byte length.
inline uint8_t class_at(const UnicodeClassTable& t, std::string_view s, size_t pos, size_t* len) {
  const auto b = static_cast<unsigned char>(s[pos]);
  if (b < 0x80) {
    *len = 1;
    return t.bits[b];  // block 0 is stored first
  }
  return t(decode_at(s, pos, len));
}

// End of the run of code points starting at `pos` whose classes intersect `mask`.
inline size_t run_end(const UnicodeClassTable& t, std::string_view s, size_t pos, uint8_t mask) {
  size_t len = 0;
  while (pos < s.size() && (class_at(t, s, pos, &len) & mask)) pos += len;
  return pos;
}

// find_all and for_each_match over Derived::scan(subject, emit(begin, end)).
template <typename Derived>
class ScanMatcher : public SpanMatcher {
 public:
  void find_all(std::string_view s, std::vector<Span>* out) const override {
    Derived::scan(s,
                  [out](size_t b, size_t e) { out->emplace_back(static_cast<uint32_t>(b), static_cast<uint32_t>(e)); });
  }
  void for_each_match(std::string_view s, FunctionRef<void(uint32_t, uint32_t)> on_match) const override {
    Derived::scan(s, [&on_match](size_t b, size_t e) { on_match(static_cast<uint32_t>(b), static_cast<uint32_t>(e)); });
  }
};

// \p{N}{1,3}: greedy, so every maximal run of N is cut into threes from its start.
class DigitsMatcher : public ScanMatcher<DigitsMatcher> {
 public:
  template <typename Emit>
  static void scan(std::string_view s, Emit&& emit) {
    const UnicodeClassTable& t = unicode_classes();
    size_t pos = 0, len = 0;
    while (pos < s.size()) {
      const auto b = static_cast<unsigned char>(s[pos]);
      if (b < 0x80 && (b < '0' || b > '9')) {  // the only ASCII N are the digits
        ++pos;
        continue;
      }
      if (!(class_at(t, s, pos, &len) & kClassN)) {
        pos += len;
        continue;
      }
      const size_t begin = pos;
      pos += len;
      for (int k = 1; k < 3 && pos < s.size() && (class_at(t, s, pos, &len) & kClassN); ++k) pos += len;
      emit(begin, pos);
    }
  }
};

// [一-龥぀-ゟ゠-ヿ]+ = maximal runs of U+4E00..U+9FA5, U+3040..U+30FF (all three-byte sequences E3..E9).
class CjkMatcher : public ScanMatcher<CjkMatcher> {
 public:
  static bool in_set(char32_t c) { return (c >= 0x4E00 && c <= 0x9FA5) || (c >= 0x3040 && c <= 0x30FF); }
  template <typename Emit>
  static void scan(std::string_view s, Emit&& emit) {
    size_t pos = 0, len = 0;
    while (pos < s.size()) {
      const auto b = static_cast<unsigned char>(s[pos]);
      if (b < 0xE3 || b > 0xE9) {
        ++pos;  // not the lead byte of a member; continuation bytes are skipped the same way
        continue;
      }
      if (!in_set(decode_at(s, pos, &len))) {
        pos += len;
        continue;
      }
      const size_t begin = pos;
      pos += len;
      while (pos < s.size() && in_set(decode_at(s, pos, &len))) pos += len;
      emit(begin, pos);
    }
  }
};

// Pattern 3. No alternative can match empty, so at each position the first alternative that matches there
// (with backtracking inside it) wins, and the scan resumes after it; with none, the scan moves one code point.
// What backtracking makes of each alternative at position p (c = the code point at p, c' the next one):
//   A  [punct][A-Za-z]+             c ASCII punctuation and c' an ASCII letter: c + the run of ASCII letters.
//   B  [^\r\n LPS]?[LM]+            c not CR/LF/L/P/S and c' in LM: c + the LM run after it; else c in LM:
//                                   the LM run from p.
//   C   ?[PS]+[\r\n]*               c == ' ' and c' in PS: ' ' + the PS run + the CR/LF run; else c in PS:
//                                   the PS run + the CR/LF run.
//   D  \s*[\r\n]+                   \s* backs off until [\r\n]+ fits: up to and including the last CR/LF of
//                                   the white-space run from p (CR and LF are themselves \s).
//   E  \s+(?!\S)                    (no CR/LF in the run) the whole run if it ends the piece, else the run
//                                   minus its last code point if that leaves at least one.
//   F  \s+                          the single white-space code point.
class WordMatcher : public ScanMatcher<WordMatcher> {
 public:
  template <typename Emit>
  static void scan(std::string_view s, Emit&& on_match) {
    const UnicodeClassTable& t = unicode_classes();
    const size_t n = s.size();
    size_t p = 0;
    auto emit = [&](size_t b, size_t e) {
      on_match(b, e);
      p = e;
    };
    while (p < n) {
      size_t l0 = 0;
      const auto b0 = static_cast<unsigned char>(s[p]);
      const uint8_t f0 = class_at(t, s, p, &l0);
      const size_t p1 = p + l0;
      // A
      if (b0 < 0x80 && is_ascii_punct(b0) && p1 < n && is_ascii_letter(static_cast<unsigned char>(s[p1]))) {
        size_t e = p1 + 1;
        while (e < n && is_ascii_letter(static_cast<unsigned char>(s[e]))) ++e;
        emit(p, e);
        continue;
      }
      // B
      size_t l1 = 0;
      const uint8_t f1 = p1 < n ? class_at(t, s, p1, &l1) : 0;
      if (b0 != '\r' && b0 != '\n' && !(f0 & (kClassL | kClassP | kClassS)) && (f1 & (kClassL | kClassM))) {
        emit(p, run_end(t, s, p1 + l1, kClassL | kClassM));
        continue;
      }
      if (f0 & (kClassL | kClassM)) {
        emit(p, run_end(t, s, p1, kClassL | kClassM));
        continue;
      }
      // C
      if (b0 == ' ' && (f1 & (kClassP | kClassS))) {
        emit(p, crlf_run_end(s, run_end(t, s, p1 + l1, kClassP | kClassS)));
        continue;
      }
      if (f0 & (kClassP | kClassS)) {
        emit(p, crlf_run_end(s, run_end(t, s, p1, kClassP | kClassS)));
        continue;
      }
      // D, E, F
      if (f0 & kClassSpace) {
        size_t e = p, last_start = p, len = 0, last_crlf = SIZE_MAX;
        while (e < n && (class_at(t, s, e, &len) & kClassSpace)) {
          if (s[e] == '\r' || s[e] == '\n') last_crlf = e;
          last_start = e;
          e += len;
        }
        if (last_crlf != SIZE_MAX) {
          emit(p, last_crlf + 1);
        } else if (e == n) {
          emit(p, n);
        } else if (last_start > p) {
          emit(p, last_start);
        } else {
          emit(p, e);
        }
        continue;
      }
      p = p1;  // nothing matches here
    }
  }

 private:
  static bool is_ascii_punct(unsigned char b) {
    return (b >= 0x21 && b <= 0x2F) || (b >= 0x3A && b <= 0x40) || (b >= 0x5B && b <= 0x60) || (b >= 0x7B && b <= 0x7E);
  }
  static bool is_ascii_letter(unsigned char b) { return (b | 0x20) >= 'a' && (b | 0x20) <= 'z'; }
  static size_t crlf_run_end(std::string_view s, size_t pos) {
    while (pos < s.size() && (s[pos] == '\r' || s[pos] == '\n')) ++pos;
    return pos;
  }
};

// Split(Isolated) of `text` by Matcher: each gap and each match, in order, as one piece.
template <typename Matcher, typename Sink>
inline void isolated_pieces(std::string_view text, Sink&& sink) {
  size_t prev = 0;
  Matcher::scan(text, [&](size_t b, size_t e) {
    if (b > prev) sink(text.substr(prev, b - prev));
    sink(text.substr(b, e - b));  // never empty: no pattern here matches empty
    prev = e;
  });
  if (prev < text.size()) sink(text.substr(prev));
}

}  // namespace

void deepseek_pieces(std::string_view text, FunctionRef<void(std::string_view)> sink) {
  isolated_pieces<DigitsMatcher>(text, [&](std::string_view a) {
    isolated_pieces<CjkMatcher>(a, [&](std::string_view b) { isolated_pieces<WordMatcher>(b, sink); });
  });
}

std::unique_ptr<SpanMatcher> make_builtin_matcher(std::string_view pattern) {
  if (pattern == kDeepSeekDigitsPattern) return std::make_unique<DigitsMatcher>();
  if (pattern == kDeepSeekCjkPattern) return std::make_unique<CjkMatcher>();
  if (pattern == kDeepSeekWordPattern) return std::make_unique<WordMatcher>();
  return nullptr;
}

}  // namespace deepinfer::tokenizer
