// The grammar IR that every structured-output front end (regex, JSON Schema, EBNF) compiles into.
//
// A Grammar is a set of named rules over *bytes*; each rule's body is an expression tree of byte sets,
// sequences, alternations, bounded/unbounded repetitions and references to other rules. References make it a
// context-free grammar (recursion for JSON Schema $ref and EBNF); everything inside one rule body is regular and
// becomes one DFA in CompiledGrammar. Intersection (kAnd) of regular operands is allowed too. Front ends work on code
// points and lower them to UTF-8 byte sequences with utf8_ranges(), so the matcher never needs to know about
// characters.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace deepinfer::structured {

// A set of byte values (256 bits).
class ByteSet {
 public:
  ByteSet() = default;
  static ByteSet single(uint8_t b) {
    ByteSet s;
    s.set(b);
    return s;
  }
  static ByteSet range(uint8_t lo, uint8_t hi) {
    ByteSet s;
    s.set_range(lo, hi);
    return s;
  }
  void set(uint8_t b) { bits_[b >> 6] |= uint64_t{1} << (b & 63); }
  void set_range(uint8_t lo, uint8_t hi) {
    for (int b = lo; b <= hi; ++b) set(static_cast<uint8_t>(b));
  }
  bool test(uint8_t b) const { return (bits_[b >> 6] >> (b & 63)) & 1; }
  bool empty() const { return (bits_[0] | bits_[1] | bits_[2] | bits_[3]) == 0; }
  ByteSet& operator|=(const ByteSet& o) {
    for (int i = 0; i < 4; ++i) bits_[i] |= o.bits_[i];
    return *this;
  }
  bool operator==(const ByteSet& o) const { return bits_ == o.bits_; }
  const std::array<uint64_t, 4>& words() const { return bits_; }

 private:
  std::array<uint64_t, 4> bits_{};
};

// Inclusive code point ranges, sorted and non-overlapping once normalized.
using CodepointRanges = std::vector<std::pair<uint32_t, uint32_t>>;
constexpr uint32_t kMaxCodepoint = 0x10FFFF;
CodepointRanges normalize_ranges(CodepointRanges ranges);
// Complement within the Unicode scalar values (surrogates D800-DFFF are never members).
CodepointRanges complement_ranges(const CodepointRanges& ranges);

enum class ExprKind : uint8_t { kEmpty, kBytes, kSeq, kAlt, kRepeat, kRule, kAnd };

struct Expr;
using ExprPtr = std::shared_ptr<const Expr>;

struct Expr {
  ExprKind kind = ExprKind::kEmpty;
  ByteSet bytes;                  // kBytes
  std::vector<ExprPtr> children;  // kSeq, kAlt (an empty kAlt matches nothing), kRepeat (exactly one), kAnd
  int min = 0;                    // kRepeat
  int max = 0;                    // kRepeat; kUnbounded for no upper limit
  int rule = -1;                  // kRule: index into Grammar::rules
  static constexpr int kUnbounded = -1;
};

// Constructors. They simplify trivial cases (a one-element seq is its element) so front ends can build freely.
ExprPtr empty_expr();
ExprPtr nothing_expr();  // the empty language
ExprPtr bytes_expr(const ByteSet& set);
ExprPtr byte_expr(uint8_t b);
ExprPtr literal_expr(std::string_view bytes);
ExprPtr seq_expr(std::vector<ExprPtr> items);
ExprPtr alt_expr(std::vector<ExprPtr> items);
ExprPtr repeat_expr(ExprPtr item, int min, int max);
inline ExprPtr opt_expr(ExprPtr item) { return repeat_expr(std::move(item), 0, 1); }
inline ExprPtr star_expr(ExprPtr item) { return repeat_expr(std::move(item), 0, Expr::kUnbounded); }
inline ExprPtr plus_expr(ExprPtr item) { return repeat_expr(std::move(item), 1, Expr::kUnbounded); }
ExprPtr rule_expr(int rule);
// The intersection of the operands' languages (e.g. a JSON Schema pattern and a length bound). The operands must
// not reference rules (they are regular): CompiledGrammar builds the product of their DFAs and rejects a rule
// reference inside with Unsupported.
ExprPtr and_expr(std::vector<ExprPtr> items);
// The UTF-8 encodings of every scalar value in `ranges` (surrogates excluded), as byte-set sequences.
ExprPtr utf8_ranges_expr(const CodepointRanges& ranges);
void append_utf8(std::string& out, uint32_t cp);

bool is_nothing(const ExprPtr& e);

struct Rule {
  std::string name;
  ExprPtr body;  // null until defined
};

class Grammar {
 public:
  // Declares a rule (body set later, which lets rules refer to each other recursively). Names must be unique.
  int declare_rule(std::string name);
  void define_rule(int id, ExprPtr body);
  int add_rule(std::string name, ExprPtr body) {
    int id = declare_rule(std::move(name));
    define_rule(id, std::move(body));
    return id;
  }
  // -1 when absent.
  int find_rule(std::string_view name) const;
  // A name not yet used, derived from `base`.
  std::string fresh_name(std::string_view base) const;

  void set_root(int rule) { root_ = rule; }
  int root() const { return root_; }
  const std::vector<Rule>& rules() const { return rules_; }

  // GBNF-like text, for error messages and tests.
  std::string to_string() const;

 private:
  std::vector<Rule> rules_;
  std::unordered_map<std::string, int> index_;
  int root_ = -1;
};

std::string expr_to_string(const Grammar& g, const ExprPtr& e);

}  // namespace deepinfer::structured
