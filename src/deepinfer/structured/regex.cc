#include "deepinfer/structured/regex.h"

#include <string>
#include <vector>

#include "deepinfer/core/error.h"

namespace deepinfer::structured {
namespace {

const CodepointRanges kDigit = {{'0', '9'}};
const CodepointRanges kWord = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
// ECMAScript WhiteSpace + LineTerminator.
const CodepointRanges kSpace = {{0x09, 0x0D},     {0x20, 0x20},     {0xA0, 0xA0},     {0x1680, 0x1680},
                                {0x2000, 0x200A}, {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F},
                                {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};
const CodepointRanges kDot = complement_ranges({{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}});

ExprPtr hex_digit_ci(uint8_t nibble) {
  ByteSet s;
  const char* lower = "0123456789abcdef";
  const char* upper = "0123456789ABCDEF";
  s.set(static_cast<uint8_t>(lower[nibble]));
  s.set(static_cast<uint8_t>(upper[nibble]));
  return bytes_expr(s);
}

constexpr int kMaxGroupDepth = 256;
constexpr int kMaxStackedQuantifiers = 4;

class RegexParser {
 public:
  RegexParser(std::string_view pattern, CharEncoding encoding) : pattern_(pattern), encoding_(encoding) {
    for (size_t i = 0; i < pattern.size();) {
      uint8_t c = static_cast<uint8_t>(pattern[i]);
      int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
      DI_CHECK(n > 0 && i + n <= pattern.size()) << "regex is not valid UTF-8 at byte " << i;
      uint32_t cp = n == 1 ? c : c & (0x7F >> n);
      for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<uint8_t>(pattern[i + k]) & 0x3F);
      cps_.push_back(cp);
      offsets_.push_back(i);
      i += n;
    }
    offsets_.push_back(pattern.size());
  }

  ExprPtr parse(RegexMatch match) {
    std::vector<ExprPtr> branches;
    do {
      bool anchored_start = false, anchored_end = false;
      if (peek('^')) {
        ++pos_;
        anchored_start = true;
      }
      ExprPtr body = parse_concat(&anchored_end);
      if (match == RegexMatch::kSearch) {
        ExprPtr any = star_expr(encode_chars({{0, kMaxCodepoint}}, encoding_));
        body = seq_expr({anchored_start ? empty_expr() : any, body, anchored_end ? empty_expr() : any});
      }
      branches.push_back(body);
    } while (eat('|'));
    if (pos_ < cps_.size()) fail_syntax("unbalanced ')'");
    return alt_expr(std::move(branches));
  }

 private:
  bool peek(uint32_t c) const { return pos_ < cps_.size() && cps_[pos_] == c; }
  bool eat(uint32_t c) {
    if (!peek(c)) return false;
    ++pos_;
    return true;
  }
  [[noreturn]] void fail_syntax(const std::string& what) const {
    DI_FAIL(ErrorCode::kInvalidArgument) << "regex syntax error at offset " << offsets_[std::min(pos_, cps_.size())]
                                         << ": " << what << " in /" << pattern_ << "/";
  }
  [[noreturn]] void fail_unsupported(const std::string& what) const {
    DI_FAIL(ErrorCode::kUnsupported) << "regex feature not supported at offset "
                                     << offsets_[std::min(pos_, cps_.size())] << ": " << what << " in /" << pattern_
                                     << "/";
  }

  ExprPtr chars(const CodepointRanges& r) { return encode_chars(r, encoding_); }

  ExprPtr parse_alternation() {
    std::vector<ExprPtr> branches;
    do {
      branches.push_back(parse_concat(nullptr));
    } while (eat('|'));
    return alt_expr(std::move(branches));
  }

  // `anchored_end` non-null: top level, where a final '$' is allowed.
  ExprPtr parse_concat(bool* anchored_end) {
    std::vector<ExprPtr> items;
    while (pos_ < cps_.size() && !peek('|') && !peek(')')) {
      if (peek('$')) {
        ++pos_;
        if (anchored_end && (pos_ == cps_.size() || peek('|'))) {
          *anchored_end = true;
          break;
        }
        --pos_;
        fail_unsupported("'$' anchor that does not end the pattern");
      }
      if (peek('^')) fail_unsupported("'^' anchor that does not start the pattern");
      ExprPtr atom = parse_atom();
      items.push_back(parse_quantifiers(atom));
    }
    return seq_expr(std::move(items));
  }

  bool parse_int(int* out) {
    size_t start = pos_;
    long v = 0;
    while (pos_ < cps_.size() && cps_[pos_] >= '0' && cps_[pos_] <= '9') {
      v = v * 10 + (cps_[pos_] - '0');
      if (v > 1'000'000) fail_unsupported("repetition count over 1000000");
      ++pos_;
    }
    *out = static_cast<int>(v);
    return pos_ > start;
  }

  ExprPtr parse_quantifiers(ExprPtr atom) {
    for (int stacked = 0;; ++stacked) {
      // Each quantifier wraps the expression once more: a long run of them ("a??????...") would build a tree deep
      // enough to overflow the stack of every recursive pass over it.
      if (stacked == kMaxStackedQuantifiers && pos_ < cps_.size() && (peek('*') || peek('+') || peek('?') || peek('{')))
        fail_syntax("quantifiers nested deeper than " + std::to_string(kMaxStackedQuantifiers) + " on one atom");
      int min = 0, max = 0;
      if (eat('*')) {
        min = 0, max = Expr::kUnbounded;
      } else if (eat('+')) {
        min = 1, max = Expr::kUnbounded;
      } else if (eat('?')) {
        min = 0, max = 1;
      } else if (peek('{')) {
        size_t save = pos_++;
        if (!parse_int(&min)) {
          pos_ = save;  // not a quantifier: '{' is a literal (as in ECMAScript's Annex B and Python)
          return atom;
        }
        max = min;
        if (eat(',')) {
          if (!parse_int(&max)) max = Expr::kUnbounded;
        }
        if (!eat('}')) {
          pos_ = save;
          return atom;
        }
        if (max != Expr::kUnbounded && max < min) fail_syntax("repetition {m,n} with n < m");
      } else {
        return atom;
      }
      if (eat('?')) {
        // Lazy: same language.
      } else if (peek('+')) {
        fail_unsupported("possessive quantifier");
      }
      atom = repeat_expr(atom, min, max);
    }
  }

  uint32_t parse_hex(int digits) {
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      if (pos_ >= cps_.size()) fail_syntax("truncated hex escape");
      uint32_t c = cps_[pos_++];
      int d = c >= '0' && c <= '9'   ? c - '0'
              : c >= 'a' && c <= 'f' ? c - 'a' + 10
              : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                     : -1;
      if (d < 0) fail_syntax("bad hex digit");
      v = v * 16 + d;
    }
    return v;
  }

  // After a backslash. Returns a set of code points; `in_class` changes \b (backspace in a class).
  CodepointRanges parse_escape(bool in_class) {
    if (pos_ >= cps_.size()) fail_syntax("trailing backslash");
    uint32_t c = cps_[pos_++];
    switch (c) {
      case 'd':
        return kDigit;
      case 'D':
        return complement_ranges(kDigit);
      case 'w':
        return kWord;
      case 'W':
        return complement_ranges(kWord);
      case 's':
        return kSpace;
      case 'S':
        return complement_ranges(kSpace);
      case 'n':
        return {{'\n', '\n'}};
      case 'r':
        return {{'\r', '\r'}};
      case 't':
        return {{'\t', '\t'}};
      case 'f':
        return {{'\f', '\f'}};
      case 'v':
        return {{'\v', '\v'}};
      case '0':
        if (pos_ < cps_.size() && cps_[pos_] >= '0' && cps_[pos_] <= '9') fail_unsupported("octal escape");
        return {{0, 0}};
      case 'x': {
        uint32_t v = parse_hex(2);
        return {{v, v}};
      }
      case 'u': {
        uint32_t v;
        if (eat('{')) {
          v = 0;
          int n = 0;
          while (!eat('}')) {
            v = v * 16 + parse_hex(1);
            if (++n > 6) fail_syntax("bad \\u{...} escape");
          }
        } else {
          v = parse_hex(4);
          // A UTF-16 surrogate pair spelled as two escapes is one code point.
          if (v >= 0xD800 && v <= 0xDBFF && pos_ + 1 < cps_.size() && cps_[pos_] == '\\' && cps_[pos_ + 1] == 'u') {
            size_t save = pos_;
            pos_ += 2;
            uint32_t lo = parse_hex(4);
            if (lo >= 0xDC00 && lo <= 0xDFFF) {
              v = 0x10000 + ((v - 0xD800) << 10) + (lo - 0xDC00);
            } else {
              pos_ = save;
            }
          }
        }
        if (v > kMaxCodepoint) fail_syntax("code point out of range");
        return {{v, v}};
      }
      case 'b':
        if (in_class) return {{8, 8}};
        --pos_;
        fail_unsupported("word boundary \\b");
      case 'B':
        --pos_;
        fail_unsupported("word boundary \\B");
      case 'p':
      case 'P':
        --pos_;
        fail_unsupported("Unicode property escape \\p{...}");
      case 'k':
        --pos_;
        fail_unsupported("named backreference \\k<...>");
      case 'c':
        --pos_;
        fail_unsupported("control escape \\cX");
      default:
        if (c >= '1' && c <= '9') {
          --pos_;
          fail_unsupported("backreference \\" + std::string(1, static_cast<char>(c)));
        }
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
          --pos_;
          fail_unsupported(std::string("unknown escape \\") + static_cast<char>(c));
        }
        return {{c, c}};  // escaped punctuation or any other literal
    }
  }

  ExprPtr parse_class() {
    bool negate = eat('^');
    CodepointRanges set;
    bool first = true;
    while (true) {
      if (pos_ >= cps_.size()) fail_syntax("unterminated character class");
      if (peek(']') && !first) {
        ++pos_;
        break;
      }
      if (peek(']') && first) {
        // ECMAScript: [] matches nothing, [^] anything.
        ++pos_;
        return chars(negate ? CodepointRanges{{0, kMaxCodepoint}} : CodepointRanges{});
      }
      first = false;
      CodepointRanges lo_set = class_atom();
      if (peek('-') && pos_ + 1 < cps_.size() && cps_[pos_ + 1] != ']') {
        ++pos_;
        CodepointRanges hi_set = class_atom();
        if (lo_set.size() != 1 || hi_set.size() != 1 || lo_set[0].first != lo_set[0].second ||
            hi_set[0].first != hi_set[0].second) {
          fail_syntax("character class range with a class escape as an end point");
        }
        if (lo_set[0].first > hi_set[0].first) fail_syntax("character class range out of order");
        set.emplace_back(lo_set[0].first, hi_set[0].first);
      } else {
        set.insert(set.end(), lo_set.begin(), lo_set.end());
      }
    }
    return chars(negate ? complement_ranges(set) : normalize_ranges(set));
  }

  CodepointRanges class_atom() {
    uint32_t c = cps_[pos_++];
    if (c == '\\') return parse_escape(true);
    if (c == '[' && peek(':')) fail_unsupported("POSIX character class [:...:]");
    return {{c, c}};
  }

  ExprPtr parse_atom() {
    uint32_t c = cps_[pos_];
    switch (c) {
      case '(': {
        ++pos_;
        if (eat('?')) {
          if (eat(':')) {
          } else if (peek('=') || peek('!')) {
            fail_unsupported("lookahead (?= / (?!");
          } else if (peek('<') && pos_ + 1 < cps_.size() && (cps_[pos_ + 1] == '=' || cps_[pos_ + 1] == '!')) {
            fail_unsupported("lookbehind (?<= / (?<!");
          } else if (eat('<') || (eat('P') && eat('<'))) {
            while (pos_ < cps_.size() && !peek('>')) ++pos_;
            if (!eat('>')) fail_syntax("unterminated group name");
          } else {
            fail_unsupported("inline flags or other (?...) group");
          }
        }
        // The parser recurses once per group level: bound it before the stack does.
        if (++group_depth_ > kMaxGroupDepth) fail_syntax("groups nested deeper than " + std::to_string(kMaxGroupDepth));
        ExprPtr inner = parse_alternation();
        --group_depth_;
        if (!eat(')')) fail_syntax("missing ')'");
        return inner;
      }
      case '[':
        ++pos_;
        return parse_class();
      case '.':
        ++pos_;
        return chars(kDot);
      case '\\':
        ++pos_;
        return chars(parse_escape(false));
      case '*':
      case '+':
      case '?':
        fail_syntax("quantifier without an operand");
      default:
        ++pos_;
        return chars({{c, c}});
    }
  }

  std::string_view pattern_;
  CharEncoding encoding_;
  std::vector<uint32_t> cps_;
  std::vector<size_t> offsets_;
  size_t pos_ = 0;
  int group_depth_ = 0;
};

}  // namespace

ExprPtr encode_chars(const CodepointRanges& input, CharEncoding encoding) {
  CodepointRanges ranges = normalize_ranges(input);
  if (encoding == CharEncoding::kUtf8) return utf8_ranges_expr(ranges);
  // JSON string body: raw characters except '"', '\\' and controls, which need escapes.
  auto contains = [&](uint32_t c) {
    for (auto [lo, hi] : ranges)
      if (c >= lo && c <= hi) return true;
    return false;
  };
  CodepointRanges raw;
  for (auto [lo, hi] : ranges) raw.emplace_back(std::max<uint32_t>(lo, 0x20), hi);
  raw = normalize_ranges(raw);
  CodepointRanges no_quote_backslash = complement_ranges({{'"', '"'}, {'\\', '\\'}});
  CodepointRanges raw_ok;
  for (auto [lo, hi] : raw)
    for (auto [a, b] : no_quote_backslash) {
      uint32_t x = std::max(lo, a), y = std::min(hi, b);
      if (x <= y) raw_ok.emplace_back(x, y);
    }
  std::vector<ExprPtr> alts{utf8_ranges_expr(raw_ok)};
  if (contains('"')) alts.push_back(literal_expr("\\\""));
  if (contains('\\')) alts.push_back(literal_expr("\\\\"));
  if (contains('/')) alts.push_back(literal_expr("\\/"));
  static const struct {
    uint32_t cp;
    char letter;
  } kShort[] = {{'\b', 'b'}, {'\f', 'f'}, {'\n', 'n'}, {'\r', 'r'}, {'\t', 't'}};
  for (auto [cp, letter] : kShort)
    if (contains(cp)) alts.push_back(literal_expr(std::string("\\") + letter));
  for (uint32_t cp = 0; cp < 0x20; ++cp)
    if (contains(cp))
      alts.push_back(seq_expr({literal_expr("\\u00"), hex_digit_ci(static_cast<uint8_t>(cp >> 4)),
                               hex_digit_ci(static_cast<uint8_t>(cp & 15))}));
  return alt_expr(std::move(alts));
}

ExprPtr regex_to_expr(std::string_view pattern, CharEncoding encoding, RegexMatch match) {
  RegexParser parser(pattern, encoding);
  return parser.parse(match);
}

Grammar grammar_from_regex(std::string_view pattern) {
  Grammar g;
  g.set_root(g.add_rule("root", regex_to_expr(pattern, CharEncoding::kUtf8, RegexMatch::kFull)));
  return g;
}

}  // namespace deepinfer::structured
