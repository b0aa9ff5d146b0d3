#include "deepinfer/structured/grammar.h"

#include <algorithm>

#include "deepinfer/core/error.h"

namespace deepinfer::structured {

CodepointRanges normalize_ranges(CodepointRanges ranges) {
  std::sort(ranges.begin(), ranges.end());
  CodepointRanges out;
  for (auto [lo, hi] : ranges) {
    if (lo > hi) continue;
    if (!out.empty() && lo <= out.back().second + 1) {
      out.back().second = std::max(out.back().second, hi);
    } else {
      out.emplace_back(lo, hi);
    }
  }
  return out;
}

CodepointRanges complement_ranges(const CodepointRanges& ranges) {
  CodepointRanges norm = normalize_ranges(ranges);
  CodepointRanges out;
  uint32_t next = 0;
  for (auto [lo, hi] : norm) {
    if (lo > next) out.emplace_back(next, lo - 1);
    next = hi + 1;
  }
  if (next <= kMaxCodepoint) out.emplace_back(next, kMaxCodepoint);
  return out;
}

namespace {

ExprPtr make(ExprKind kind) {
  auto e = std::make_shared<Expr>();
  e->kind = kind;
  return e;
}

void encode(uint32_t cp, uint8_t* out, int* n) {
  if (cp < 0x80) {
    out[0] = static_cast<uint8_t>(cp);
    *n = 1;
  } else if (cp < 0x800) {
    out[0] = static_cast<uint8_t>(0xC0 | (cp >> 6));
    out[1] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
    *n = 2;
  } else if (cp < 0x10000) {
    out[0] = static_cast<uint8_t>(0xE0 | (cp >> 12));
    out[1] = static_cast<uint8_t>(0x80 | ((cp >> 6) & 0x3F));
    out[2] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
    *n = 3;
  } else {
    out[0] = static_cast<uint8_t>(0xF0 | (cp >> 18));
    out[1] = static_cast<uint8_t>(0x80 | ((cp >> 12) & 0x3F));
    out[2] = static_cast<uint8_t>(0x80 | ((cp >> 6) & 0x3F));
    out[3] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
    *n = 4;
  }
}

// [lo, hi] share one encoded length. Splits until every position is an independent byte range (the classic
// UTF-8 range compilation: a range is a product of per-byte ranges once the trailing parts are full).
void utf8_sequences(uint32_t lo, uint32_t hi, std::vector<ExprPtr>& out) {
  for (int i = 1; i < 4; ++i) {
    uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        utf8_sequences(lo, lo | m, out);
        utf8_sequences((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        utf8_sequences(lo, (hi & ~m) - 1, out);
        utf8_sequences(hi & ~m, hi, out);
        return;
      }
    }
  }
  uint8_t a[4], b[4];
  int n = 0, n2 = 0;
  encode(lo, a, &n);
  encode(hi, b, &n2);
  std::vector<ExprPtr> items;
  for (int i = 0; i < n; ++i) items.push_back(bytes_expr(ByteSet::range(a[i], b[i])));
  out.push_back(seq_expr(std::move(items)));
}

}  // namespace

void append_utf8(std::string& out, uint32_t cp) {
  uint8_t buf[4];
  int n = 0;
  encode(cp, buf, &n);
  out.append(reinterpret_cast<const char*>(buf), n);
}

ExprPtr empty_expr() {
  static const ExprPtr e = make(ExprKind::kEmpty);
  return e;
}

ExprPtr nothing_expr() { return make(ExprKind::kAlt); }

bool is_nothing(const ExprPtr& e) { return e->kind == ExprKind::kAlt && e->children.empty(); }

ExprPtr bytes_expr(const ByteSet& set) {
  if (set.empty()) return nothing_expr();
  auto e = std::make_shared<Expr>();
  e->kind = ExprKind::kBytes;
  e->bytes = set;
  return e;
}

ExprPtr byte_expr(uint8_t b) { return bytes_expr(ByteSet::single(b)); }

ExprPtr literal_expr(std::string_view bytes) {
  std::vector<ExprPtr> items;
  for (char c : bytes) items.push_back(byte_expr(static_cast<uint8_t>(c)));
  return seq_expr(std::move(items));
}

ExprPtr seq_expr(std::vector<ExprPtr> items) {
  std::vector<ExprPtr> flat;
  for (auto& it : items) {
    if (is_nothing(it)) return nothing_expr();
    if (it->kind == ExprKind::kEmpty) continue;
    if (it->kind == ExprKind::kSeq) {
      flat.insert(flat.end(), it->children.begin(), it->children.end());
    } else {
      flat.push_back(std::move(it));
    }
  }
  if (flat.empty()) return empty_expr();
  if (flat.size() == 1) return flat[0];
  auto e = std::make_shared<Expr>();
  e->kind = ExprKind::kSeq;
  e->children = std::move(flat);
  return e;
}

ExprPtr alt_expr(std::vector<ExprPtr> items) {
  std::vector<ExprPtr> flat;
  for (auto& it : items) {
    if (is_nothing(it)) continue;
    if (it->kind == ExprKind::kAlt) {
      flat.insert(flat.end(), it->children.begin(), it->children.end());
    } else {
      flat.push_back(std::move(it));
    }
  }
  if (flat.size() == 1) return flat[0];
  auto e = std::make_shared<Expr>();
  e->kind = ExprKind::kAlt;
  e->children = std::move(flat);
  return e;
}

ExprPtr repeat_expr(ExprPtr item, int min, int max) {
  DI_CHECK(min >= 0 && (max == Expr::kUnbounded || max >= min))
      << "invalid repetition bounds {" << min << "," << max << "}";
  if (max == 0) return empty_expr();
  if (is_nothing(item)) return min == 0 ? empty_expr() : nothing_expr();
  if (item->kind == ExprKind::kEmpty) return item;
  if (min == 1 && max == 1) return item;
  auto e = std::make_shared<Expr>();
  e->kind = ExprKind::kRepeat;
  e->children = {std::move(item)};
  e->min = min;
  e->max = max;
  return e;
}

ExprPtr and_expr(std::vector<ExprPtr> items) {
  DI_CHECK(!items.empty()) << "and_expr needs at least one operand";
  for (const auto& it : items)
    if (is_nothing(it)) return it;
  if (items.size() == 1) return items[0];
  auto e = std::make_shared<Expr>();
  e->kind = ExprKind::kAnd;
  e->children = std::move(items);
  return e;
}

ExprPtr rule_expr(int rule) {
  auto e = std::make_shared<Expr>();
  e->kind = ExprKind::kRule;
  e->rule = rule;
  return e;
}

ExprPtr utf8_ranges_expr(const CodepointRanges& ranges) {
  // Surrogates are not scalar values: UTF-8 must never encode them.
  CodepointRanges scalar;
  for (auto [lo, hi] : normalize_ranges(ranges)) {
    hi = std::min(hi, kMaxCodepoint);
    if (lo > hi) continue;
    if (lo < 0xD800 && hi >= 0xD800) {
      scalar.emplace_back(lo, 0xD7FF);
      if (hi > 0xDFFF) scalar.emplace_back(0xE000, hi);
    } else if (lo >= 0xD800 && lo <= 0xDFFF) {
      if (hi > 0xDFFF) scalar.emplace_back(0xE000, hi);
    } else {
      scalar.emplace_back(lo, hi);
    }
  }
  std::vector<ExprPtr> alts;
  ByteSet ascii;
  static constexpr uint32_t kLengthEnds[] = {0x7F, 0x7FF, 0xFFFF, kMaxCodepoint};
  for (auto [lo, hi] : scalar) {
    uint32_t start = 0;
    for (uint32_t end : kLengthEnds) {
      uint32_t a = std::max(lo, start), b = std::min(hi, end);
      if (a <= b) {
        if (end == 0x7F) {
          ascii.set_range(static_cast<uint8_t>(a), static_cast<uint8_t>(b));
        } else {
          utf8_sequences(a, b, alts);
        }
      }
      start = end + 1;
    }
  }
  if (!ascii.empty()) alts.insert(alts.begin(), bytes_expr(ascii));
  return alt_expr(std::move(alts));
}

int Grammar::declare_rule(std::string name) {
  DI_CHECK(!index_.count(name)) << "grammar rule '" << name << "' is defined twice";
  int id = static_cast<int>(rules_.size());
  index_[name] = id;
  rules_.push_back(Rule{std::move(name), nullptr});
  return id;
}

void Grammar::define_rule(int id, ExprPtr body) {
  DI_CHECK(id >= 0 && id < static_cast<int>(rules_.size())) << "no grammar rule " << id;
  rules_[id].body = std::move(body);
}

int Grammar::find_rule(std::string_view name) const {
  auto it = index_.find(std::string(name));
  return it == index_.end() ? -1 : it->second;
}

std::string Grammar::fresh_name(std::string_view base) const {
  std::string name(base);
  for (int i = 1; index_.count(name); ++i) name = std::string(base) + "_" + std::to_string(i);
  return name;
}

namespace {

void byte_to_string(std::string& out, int b) {
  static const char* kHex = "0123456789ABCDEF";
  if (b >= 0x21 && b < 0x7F && b != '\\' && b != ']' && b != '-' && b != '"' && b != '^' && b != '[') {
    out += static_cast<char>(b);
  } else {
    out += "\\x";
    out += kHex[b >> 4];
    out += kHex[b & 15];
  }
}

void print_expr(const Grammar& g, const Expr& e, std::string& out) {
  switch (e.kind) {
    case ExprKind::kEmpty:
      out += "\"\"";
      break;
    case ExprKind::kBytes: {
      out += '[';
      for (int b = 0; b < 256; ++b) {
        if (!e.bytes.test(static_cast<uint8_t>(b))) continue;
        int end = b;
        while (end + 1 < 256 && e.bytes.test(static_cast<uint8_t>(end + 1))) ++end;
        byte_to_string(out, b);
        if (end > b) {
          out += '-';
          byte_to_string(out, end);
        }
        b = end;
      }
      out += ']';
      break;
    }
    case ExprKind::kSeq:
    case ExprKind::kAlt:
    case ExprKind::kAnd: {
      if (e.children.empty()) {
        out += "(!)";
        break;
      }
      out += '(';
      for (size_t i = 0; i < e.children.size(); ++i) {
        if (i) out += e.kind == ExprKind::kAlt ? " | " : e.kind == ExprKind::kAnd ? " & " : " ";
        print_expr(g, *e.children[i], out);
      }
      out += ')';
      break;
    }
    case ExprKind::kRepeat:
      print_expr(g, *e.children[0], out);
      out += '{' + std::to_string(e.min) + ',' + (e.max == Expr::kUnbounded ? "" : std::to_string(e.max)) + '}';
      break;
    case ExprKind::kRule:
      out += g.rules()[e.rule].name;
      break;
  }
}

}  // namespace

std::string expr_to_string(const Grammar& g, const ExprPtr& e) {
  std::string out;
  print_expr(g, *e, out);
  return out;
}

std::string Grammar::to_string() const {
  std::string out;
  for (const Rule& r : rules_) {
    out += r.name + " ::= ";
    if (r.body) print_expr(*this, *r.body, out);
    out += '\n';
  }
  return out;
}

}  // namespace deepinfer::structured
