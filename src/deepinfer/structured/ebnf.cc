#include "deepinfer/structured/ebnf.h"

#include <map>
#include <string>

#include "deepinfer/core/error.h"

namespace deepinfer::structured {
namespace {

bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

constexpr int kMaxGroupDepth = 256;
constexpr int kMaxStackedQuantifiers = 4;

class EbnfParser {
 public:
  explicit EbnfParser(std::string_view text) : text_(text) {}

  Grammar parse(std::string_view root_name) {
    skip_space();
    while (pos_ < text_.size()) {
      size_t at = pos_;
      std::string name = parse_name();
      if (name.empty()) fail("expected a rule name");
      skip_space();
      if (!eat_str("::=")) fail("expected '::=' after rule name '" + name + "'");
      int id = rule_id(name);
      if (defined_.count(name)) {
        pos_ = at;
        fail("rule '" + name + "' is defined twice");
      }
      defined_[name] = at;
      g_.define_rule(id, parse_alternation(false));
      skip_space();
    }
    for (const auto& [name, at] : referenced_)
      if (!defined_.count(name)) {
        pos_ = at;
        fail("rule '" + name + "' is used but never defined");
      }
    int root = g_.find_rule(root_name);
    DI_CHECK(root >= 0 && defined_.count(std::string(root_name))) << "EBNF grammar has no '" << root_name << "' rule";
    g_.set_root(root);
    return std::move(g_);
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    int line = 1, col = 1;
    for (size_t i = 0; i < pos_ && i < text_.size(); ++i) {
      if (text_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    DI_FAIL(ErrorCode::kInvalidArgument) << "EBNF syntax error at " << line << ":" << col << ": " << what;
  }

  void skip_space() {
    while (pos_ < text_.size()) {
      char c = text_[pos_];
      if (c == '#') {
        while (pos_ < text_.size() && text_[pos_] != '\n') ++pos_;
      } else if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
        ++pos_;
      } else {
        break;
      }
    }
  }
  bool eat_str(std::string_view s) {
    if (text_.substr(pos_, s.size()) != s) return false;
    pos_ += s.size();
    return true;
  }
  std::string parse_name() {
    size_t start = pos_;
    while (pos_ < text_.size() && is_name_char(text_[pos_])) ++pos_;
    return std::string(text_.substr(start, pos_ - start));
  }
  // Is a new rule (`name ::=`) starting here?
  bool at_rule_start() {
    size_t save = pos_;
    std::string name = parse_name();
    skip_space();
    bool yes = !name.empty() && text_.substr(pos_, 3) == "::=";
    pos_ = save;
    return yes;
  }
  int rule_id(const std::string& name) {
    int id = g_.find_rule(name);
    return id >= 0 ? id : g_.declare_rule(name);
  }

  ExprPtr parse_alternation(bool nested) {
    std::vector<ExprPtr> alts{parse_sequence(nested)};
    while (pos_ < text_.size() && text_[pos_] == '|') {
      ++pos_;
      alts.push_back(parse_sequence(nested));
    }
    return alt_expr(std::move(alts));
  }

  ExprPtr parse_sequence(bool nested) {
    std::vector<ExprPtr> items;
    for (;;) {
      skip_space();
      if (pos_ >= text_.size()) break;
      char c = text_[pos_];
      if (c == '|' || c == ')') break;
      if (!nested && at_rule_start()) break;
      items.push_back(parse_quantified());
    }
    return seq_expr(std::move(items));
  }

  bool parse_uint(int* out) {
    size_t start = pos_;
    long v = 0;
    while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
      v = v * 10 + (text_[pos_++] - '0');
      if (v > 1'000'000) fail("repetition count too large");
    }
    *out = static_cast<int>(v);
    return pos_ > start;
  }

  ExprPtr parse_quantified() {
    ExprPtr e = parse_primary();
    for (int stacked = 0;; ++stacked) {
      if (pos_ >= text_.size()) return e;
      char c = text_[pos_];
      // Each quantifier wraps the expression once more: a long run of them would build a tree deep enough to
      // overflow the stack of every recursive pass over it.
      if (stacked == kMaxStackedQuantifiers && (c == '*' || c == '+' || c == '?' || c == '{'))
        fail("quantifiers nested deeper than " + std::to_string(kMaxStackedQuantifiers) + " on one item");
      if (c == '*') {
        ++pos_;
        e = star_expr(e);
      } else if (c == '+') {
        ++pos_;
        e = plus_expr(e);
      } else if (c == '?') {
        ++pos_;
        e = opt_expr(e);
      } else if (c == '{') {
        ++pos_;
        skip_space();
        int min = 0, max = 0;
        bool has_min = parse_uint(&min);
        skip_space();
        if (text_.substr(pos_, 1) == ",") {
          ++pos_;
          skip_space();
          if (!parse_uint(&max)) max = Expr::kUnbounded;
        } else {
          if (!has_min) fail("expected a number in {m,n}");
          max = min;
        }
        skip_space();
        if (!eat_str("}")) fail("expected '}'");
        if (max != Expr::kUnbounded && max < min) fail("repetition {m,n} with n < m");
        e = repeat_expr(e, min, max);
      } else {
        return e;
      }
    }
  }

  uint32_t parse_hex(int digits) {
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      if (pos_ >= text_.size()) fail("truncated escape");
      char c = text_[pos_++];
      int d = c >= '0' && c <= '9'   ? c - '0'
              : c >= 'a' && c <= 'f' ? c - 'a' + 10
              : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                     : -1;
      if (d < 0) fail("bad hex digit in escape");
      v = v * 16 + d;
    }
    return v;
  }

  // One (possibly escaped) UTF-8 character inside a string or class.
  uint32_t parse_char() {
    if (pos_ >= text_.size()) fail("unexpected end of grammar");
    uint8_t c = static_cast<uint8_t>(text_[pos_]);
    if (c == '\\') {
      ++pos_;
      if (pos_ >= text_.size()) fail("trailing backslash");
      char e = text_[pos_++];
      switch (e) {
        case 'n':
          return '\n';
        case 'r':
          return '\r';
        case 't':
          return '\t';
        case 'x':
          return parse_hex(2);
        case 'u':
          return parse_hex(4);
        case 'U':
          return parse_hex(8);
        case '\\':
        case '"':
        case '\'':
        case '[':
        case ']':
        case '-':
        case '^':
        case '/':
          return static_cast<uint8_t>(e);
        default:
          --pos_;
          fail(std::string("unknown escape \\") + e);
      }
    }
    int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || pos_ + n > text_.size()) fail("invalid UTF-8");
    uint32_t cp = n == 1 ? c : c & (0x7F >> n);
    for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<uint8_t>(text_[pos_ + k]) & 0x3F);
    pos_ += n;
    return cp;
  }

  ExprPtr parse_primary() {
    char c = text_[pos_];
    if (c == '"') {
      ++pos_;
      std::string bytes;
      while (pos_ < text_.size() && text_[pos_] != '"') append_utf8(bytes, parse_char());
      if (!eat_str("\"")) fail("unterminated string");
      return literal_expr(bytes);
    }
    if (c == '[') {
      ++pos_;
      bool negate = eat_str("^");
      CodepointRanges set;
      while (pos_ < text_.size() && text_[pos_] != ']') {
        uint32_t lo = parse_char();
        uint32_t hi = lo;
        if (pos_ + 1 < text_.size() && text_[pos_] == '-' && text_[pos_ + 1] != ']') {
          ++pos_;
          hi = parse_char();
          if (hi < lo) fail("character range out of order");
        }
        set.emplace_back(lo, hi);
      }
      if (!eat_str("]")) fail("unterminated character class");
      return utf8_ranges_expr(negate ? complement_ranges(set) : normalize_ranges(set));
    }
    if (c == '(') {
      ++pos_;
      // The parser recurses once per group level: bound it before the stack does.
      if (++group_depth_ > kMaxGroupDepth) fail("groups nested deeper than " + std::to_string(kMaxGroupDepth));
      ExprPtr inner = parse_alternation(true);
      --group_depth_;
      skip_space();
      if (!eat_str(")")) fail("expected ')'");
      return inner;
    }
    if (c == '.') {
      ++pos_;
      return utf8_ranges_expr({{0, kMaxCodepoint}});
    }
    if (is_name_char(c)) {
      size_t at = pos_;
      std::string name = parse_name();
      referenced_.emplace(name, at);
      return rule_expr(rule_id(name));
    }
    fail(std::string("unexpected character '") + c + "'");
  }

  std::string_view text_;
  size_t pos_ = 0;
  int group_depth_ = 0;
  Grammar g_;
  std::map<std::string, size_t> defined_, referenced_;
};

}  // namespace

Grammar grammar_from_ebnf(std::string_view text, std::string_view root_rule) {
  EbnfParser parser(text);
  return parser.parse(root_rule);
}

}  // namespace deepinfer::structured
