// Number ranges, string formats and schema merging for the JSON Schema front end.
#include <charconv>
#include <cmath>
#include <cstdio>
#include <set>
#include <string>

#include "deepinfer/core/error.h"
#include "deepinfer/structured/json_schema_internal.h"

namespace deepinfer::structured::json_internal {
namespace {

ExprPtr digit_range(char lo, char hi) {
  return bytes_expr(ByteSet::range(static_cast<uint8_t>(lo), static_cast<uint8_t>(hi)));
}

// Equal-length decimal strings lo <= hi: every string of that length between them.
ExprPtr same_length_range(const std::string& lo, const std::string& hi) {
  size_t n = lo.size();
  if (n == 0) return empty_expr();
  if (lo[0] == hi[0])
    return seq_expr({byte_expr(static_cast<uint8_t>(lo[0])), same_length_range(lo.substr(1), hi.substr(1))});
  const std::string zeros(n - 1, '0'), nines(n - 1, '9');
  if (lo.substr(1) == zeros && hi.substr(1) == nines)
    return seq_expr({digit_range(lo[0], hi[0]),
                     repeat_expr(digit_range('0', '9'), static_cast<int>(n - 1), static_cast<int>(n - 1))});
  std::vector<ExprPtr> alts;
  alts.push_back(seq_expr({byte_expr(static_cast<uint8_t>(lo[0])), same_length_range(lo.substr(1), nines)}));
  if (lo[0] + 1 <= hi[0] - 1)
    alts.push_back(seq_expr({digit_range(static_cast<char>(lo[0] + 1), static_cast<char>(hi[0] - 1)),
                             repeat_expr(digit_range('0', '9'), static_cast<int>(n - 1), static_cast<int>(n - 1))}));
  alts.push_back(seq_expr({byte_expr(static_cast<uint8_t>(hi[0])), same_length_range(zeros, hi.substr(1))}));
  return alt_expr(std::move(alts));
}

uint64_t pow10(size_t n) {
  uint64_t v = 1;
  for (size_t i = 0; i < n; ++i) v *= 10;
  return v;
}

enum FracKind : int { kFracNone = 0, kFracZero = 1, kFracNonzero = 2, kFracAny = 3 };

ExprPtr frac_expr(int kind) {
  ExprPtr digits = plus_expr(digit_range('0', '9'));
  switch (kind) {
    case kFracZero:
      return opt_expr(seq_expr({byte_expr('.'), plus_expr(byte_expr('0'))}));
    case kFracNonzero:
      return seq_expr(
          {byte_expr('.'), star_expr(digit_range('0', '9')), digit_range('1', '9'), star_expr(digit_range('0', '9'))});
    case kFracAny:
      return opt_expr(seq_expr({byte_expr('.'), digits}));
    default:
      return nothing_expr();
  }
}

int64_t integral_bound(double v) {
  DI_CHECK_CODE(std::floor(v) == v && std::fabs(v) < 1e17, ErrorCode::kUnsupported)
      << "numeric bound " << v << " is not an integer (only integral minimum/maximum are supported)";
  return static_cast<int64_t>(v);
}

// Pieces of one sign: allowed (integer part I >= 0) -> fraction kinds, as intervals of I.
struct Piece {
  uint64_t lo;
  std::optional<uint64_t> hi;
  int frac;
};

// `lower(I)`/`upper(I)` give the fraction kinds allowed by each bound at integer part I; both are constant
// except at the special points, so evaluating at the points and between them covers everything.
template <typename F>
std::vector<Piece> pieces(std::vector<uint64_t> points, F kind_at) {
  std::set<uint64_t> pts(points.begin(), points.end());
  pts.insert(0);
  std::vector<Piece> out;
  auto add = [&](uint64_t lo, std::optional<uint64_t> hi, int frac) {
    if (frac == kFracNone || (hi && *hi < lo)) return;
    if (!out.empty() && out.back().frac == frac && out.back().hi && *out.back().hi + 1 == lo) {
      out.back().hi = hi;
      return;
    }
    out.push_back(Piece{lo, hi, frac});
  };
  std::vector<uint64_t> v(pts.begin(), pts.end());
  for (size_t i = 0; i < v.size(); ++i) {
    add(v[i], v[i], kind_at(v[i]));
    std::optional<uint64_t> end = i + 1 < v.size() ? std::optional<uint64_t>(v[i + 1] - 1) : std::nullopt;
    if (!end || *end >= v[i] + 1) add(v[i] + 1, end, kind_at(v[i] + 1));
  }
  return out;
}

// ---- decimal (non-integral) bounds -------------------------------------------------------------------------
// A bound c is taken as the exact decimal of its shortest round-trip spelling (0.1 is 1/10, as a reader of the
// schema means it), split into integer digits and fraction digits without trailing zeros.
struct Decimal {
  bool negative = false;
  std::string int_digits;   // no leading zeros ("0" for zero)
  std::string frac_digits;  // no trailing zeros; empty for an integral value
};

Decimal to_decimal(double v) {
  char buf[400];
  auto r = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::fixed);
  DI_CHECK_INTERNAL(r.ec == std::errc()) << "cannot format numeric bound " << v;
  std::string text(buf, r.ptr);
  Decimal d;
  if (!text.empty() && text[0] == '-') {
    d.negative = true;
    text.erase(0, 1);
  }
  const size_t dot = text.find('.');
  d.int_digits = text.substr(0, dot);
  if (dot != std::string::npos) d.frac_digits = text.substr(dot + 1);
  while (!d.frac_digits.empty() && d.frac_digits.back() == '0') d.frac_digits.pop_back();
  if (d.int_digits.empty()) d.int_digits = "0";
  if (d.int_digits == "0" && d.frac_digits.empty()) d.negative = false;  // -0
  return d;
}

// Digit strings D (empty allowed) compared as fractions 0.D against 0.F (F without trailing zeros), padding the
// shorter one with zeros. `greater`: keep D > F (or >= with `or_equal`); else D < F (or <=).
ExprPtr fraction_digits_cmp(const std::string& f, bool greater, bool or_equal) {
  ExprPtr any = star_expr(digit_range('0', '9'));
  ExprPtr nonzero = seq_expr({any, digit_range('1', '9'), any});
  // From the end backwards: tail = the strings for the suffix of F from position k on, after equal prefixes.
  // At k == |F| the rest of F is zeros: D's rest r compares as r vs 0.
  ExprPtr tail = greater ? (or_equal ? any : nonzero) : (or_equal ? star_expr(byte_expr('0')) : nothing_expr());
  for (size_t k = f.size(); k-- > 0;) {
    const char c = f[k];
    std::vector<ExprPtr> alts;
    // D ends here: its padding is zeros against F's nonzero rest, so D < F.
    if (!greater) alts.push_back(empty_expr());
    if (greater && c < '9') alts.push_back(seq_expr({digit_range(static_cast<char>(c + 1), '9'), any}));
    if (!greater && c > '0') alts.push_back(seq_expr({digit_range('0', static_cast<char>(c - 1)), any}));
    alts.push_back(seq_expr({byte_expr(static_cast<uint8_t>(c)), tail}));
    tail = alt_expr(std::move(alts));
  }
  return tail;
}

// Spellings "[.D]" (no fraction, or '.' and at least one digit) whose fraction digits satisfy the comparison.
ExprPtr fraction_cmp(const std::string& f, bool greater, bool or_equal) {
  ExprPtr digits = fraction_digits_cmp(f, greater, or_equal);
  // The empty D is in the language iff 0 compares as wanted against 0.F.
  const bool empty_ok = greater ? (or_equal && f.empty()) : (or_equal || !f.empty());
  ExprPtr dotted = seq_expr({byte_expr('.'), and_expr({digits, plus_expr(digit_range('0', '9'))})});
  return empty_ok ? alt_expr({empty_expr(), dotted}) : dotted;
}

uint64_t parse_u64(const std::string& digits) {
  DI_CHECK_CODE(digits.size() <= 17, ErrorCode::kUnsupported)
      << "numeric bound with " << digits.size() << " integer digits is too large";
  return std::stoull(digits);
}

// Magnitudes |x| = I.D (I without leading zeros) with |x| > m (greater) or < m, or equal too with or_equal.
ExprPtr magnitude_cmp(const Decimal& m, bool greater, bool or_equal) {
  const uint64_t i = parse_u64(m.int_digits);
  ExprPtr any_frac = opt_expr(seq_expr({byte_expr('.'), plus_expr(digit_range('0', '9'))}));
  std::vector<ExprPtr> alts;
  if (greater) {
    alts.push_back(seq_expr({nonneg_int_range_expr(i + 1, std::nullopt), any_frac}));
  } else if (i > 0) {
    alts.push_back(seq_expr({nonneg_int_range_expr(0, i - 1), any_frac}));
  }
  alts.push_back(seq_expr({literal_expr(m.int_digits), fraction_cmp(m.frac_digits, greater, or_equal)}));
  return alt_expr(std::move(alts));
}

// Number spellings without exponent whose value is >= c (lower) or <= c, strictly with `exclusive`.
ExprPtr decimal_bound_expr(double c, bool lower, bool exclusive) {
  const Decimal d = to_decimal(c);
  const bool or_equal = !exclusive;
  ExprPtr any_mag =
      seq_expr({alt_expr({byte_expr('0'), seq_expr({digit_range('1', '9'), star_expr(digit_range('0', '9'))})}),
                opt_expr(seq_expr({byte_expr('.'), plus_expr(digit_range('0', '9'))}))});
  ExprPtr minus = byte_expr('-');
  if (lower) {
    // x >= c. c >= 0: non-negative spellings with |x| >= c. c < 0: every non-negative spelling, and negative
    // ones with |x| <= |c|.
    if (!d.negative) return magnitude_cmp(d, true, or_equal);
    return alt_expr({any_mag, seq_expr({minus, magnitude_cmp(d, false, or_equal)})});
  }
  // x <= c. c >= 0: every negative spelling and non-negative ones with |x| <= c. c < 0: negative with |x| >= |c|.
  if (!d.negative) return alt_expr({seq_expr({minus, any_mag}), magnitude_cmp(d, false, or_equal)});
  return seq_expr({minus, magnitude_cmp(d, true, or_equal)});
}

}  // namespace

ExprPtr nonneg_int_range_expr(uint64_t lo, std::optional<uint64_t> hi) {
  std::vector<ExprPtr> alts;
  std::string a = std::to_string(lo);
  size_t max_len = hi ? std::to_string(*hi).size() : a.size();
  for (size_t len = a.size(); len <= max_len; ++len) {
    uint64_t l = len == a.size() ? lo : pow10(len - 1);
    uint64_t h = (hi && len == max_len) ? *hi : pow10(len) - 1;
    if (l > h) continue;
    alts.push_back(same_length_range(std::to_string(l), std::to_string(h)));
  }
  if (!hi)
    alts.push_back(seq_expr(
        {digit_range('1', '9'), repeat_expr(digit_range('0', '9'), static_cast<int>(a.size()), Expr::kUnbounded)}));
  return alt_expr(std::move(alts));
}

ExprPtr decimal_places_expr(int k) {
  ExprPtr digit = digit_range('0', '9');
  ExprPtr int_part = alt_expr({byte_expr('0'), seq_expr({digit_range('1', '9'), star_expr(digit)})});
  ExprPtr frac = and_expr({plus_expr(digit), seq_expr({repeat_expr(digit, 0, k), star_expr(byte_expr('0'))})});
  return seq_expr({opt_expr(byte_expr('-')), int_part, opt_expr(seq_expr({byte_expr('.'), frac}))});
}

ExprPtr number_expr(const NumberBounds& b, bool integer) {
  ExprPtr int_part = alt_expr({byte_expr('0'), seq_expr({digit_range('1', '9'), star_expr(digit_range('0', '9'))})});
  if (!b.any()) {
    if (integer) return seq_expr({opt_expr(byte_expr('-')), int_part, frac_expr(kFracZero)});
    ExprPtr exp = opt_expr(seq_expr({bytes_expr([] {
                                       ByteSet s;
                                       s.set('e');
                                       s.set('E');
                                       return s;
                                     }()),
                                     opt_expr(bytes_expr([] {
                                       ByteSet s;
                                       s.set('+');
                                       s.set('-');
                                       return s;
                                     }())),
                                     plus_expr(digit_range('0', '9'))}));
    return seq_expr({opt_expr(byte_expr('-')), int_part, frac_expr(kFracAny), exp});
  }
  const bool integral = (!b.min || std::floor(*b.min) == *b.min) && (!b.max || std::floor(*b.max) == *b.max);
  if (!integral) {
    DI_CHECK_INTERNAL(!integer) << "integer bounds are rounded to integers before number_expr";
    // Each bound is a language of spellings; the number is in their intersection (no exponent form).
    std::vector<ExprPtr> parts;
    if (b.min) parts.push_back(decimal_bound_expr(*b.min, true, b.min_exclusive));
    if (b.max) parts.push_back(decimal_bound_expr(*b.max, false, b.max_exclusive));
    return and_expr(std::move(parts));
  }
  std::optional<int64_t> lo, hi;
  if (b.min) lo = integral_bound(*b.min);
  if (b.max) hi = integral_bound(*b.max);
  const int all = integer ? kFracZero : kFracAny;
  // Non-negative x = I.F: x >= lo <=> I >= lo (or I == lo and F != 0 when exclusive); x <= hi <=> I < hi,
  // or I == hi with F == 0 (inclusive).
  auto pos_kind = [&](uint64_t i) {
    int k = all;
    if (lo && *lo >= 0) {
      uint64_t l = static_cast<uint64_t>(*lo);
      if (i < l)
        k = kFracNone;
      else if (i == l && b.min_exclusive)
        k &= kFracNonzero;
    }
    if (hi) {
      if (*hi < 0) return static_cast<int>(kFracNone);
      uint64_t h = static_cast<uint64_t>(*hi);
      if (i > h)
        k = kFracNone;
      else if (i == h)
        k &= b.max_exclusive ? kFracNone : kFracZero;
    }
    return k & all;
  };
  // Negative x = -(I.F), I.F > 0: x >= lo (lo < 0, m = -lo) <=> I < m, or I == m with F == 0 (inclusive);
  // x <= hi (hi < 0, m = -hi) <=> I > m, or I == m (any F when inclusive, F != 0 when exclusive).
  auto neg_kind = [&](uint64_t i) {
    int k = all;
    if (lo) {
      if (*lo >= 0) return static_cast<int>(kFracNone);
      uint64_t m = static_cast<uint64_t>(-*lo);
      if (i > m)
        k = kFracNone;
      else if (i == m)
        k &= b.min_exclusive ? kFracNone : kFracZero;
    }
    if (hi && *hi <= 0) {
      uint64_t m = static_cast<uint64_t>(-*hi);
      if (*hi == 0) {
        if (i == 0) k &= kFracNonzero;  // x < 0 or x <= 0: -0.x must be nonzero (-0 is 0: allowed only inclusive)
      } else if (i < m) {
        k = kFracNone;
      } else if (i == m && b.max_exclusive) {
        k &= kFracNonzero;
      }
    }
    if (i == 0) k &= kFracNonzero;  // "-0" / "-0.0" is zero, not negative; leave it out
    return k & all;
  };
  std::vector<uint64_t> pos_points, neg_points;
  if (lo && *lo >= 0) pos_points.push_back(static_cast<uint64_t>(*lo));
  if (hi && *hi >= 0) pos_points.push_back(static_cast<uint64_t>(*hi));
  if (lo && *lo < 0) neg_points.push_back(static_cast<uint64_t>(-*lo));
  if (hi && *hi < 0) neg_points.push_back(static_cast<uint64_t>(-*hi));
  std::vector<ExprPtr> alts;
  for (const Piece& p : pieces(pos_points, pos_kind))
    alts.push_back(seq_expr({nonneg_int_range_expr(p.lo, p.hi), frac_expr(p.frac)}));
  for (const Piece& p : pieces(neg_points, neg_kind))
    alts.push_back(seq_expr({byte_expr('-'), nonneg_int_range_expr(p.lo, p.hi), frac_expr(p.frac)}));
  return alt_expr(std::move(alts));
}

std::string format_regex(std::string_view format) {
  // Days per month, with 29 February only in leap years (divisible by 4, centuries only by 400).
  static const std::string kDate =
      R"((?:\d{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12]\d|3[01])|(?:0[469]|11)-(?:0[1-9]|[12]\d|30)|)"
      R"(02-(?:0[1-9]|1\d|2[0-8]))|(?:\d\d(?:0[48]|[2468][048]|[13579][26])|(?:[02468][048]|[13579][26])00)-02-29))";
  static const std::string kTime =
      R"((?:[01]\d|2[0-3]):[0-5]\d:(?:[0-5]\d|60)(?:\.\d+)?(?:[Zz]|[+-](?:[01]\d|2[0-3]):[0-5]\d))";
  static const std::string kOctet = R"((?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d))";
  static const std::string kIpv4 = kOctet + R"((?:\.)" + kOctet + "){3}";
  static const std::string kH16 = "[0-9a-fA-F]{1,4}";
  static const std::string kLs32 = "(?:" + kH16 + ":" + kH16 + "|" + kIpv4 + ")";
  static const std::string kIpv6 =
      "(?:(?:" + kH16 + ":){6}" + kLs32 + "|::(?:" + kH16 + ":){5}" + kLs32 + "|(?:" + kH16 + ")?::(?:" + kH16 +
      ":){4}" + kLs32 + "|(?:(?:" + kH16 + ":){0,1}" + kH16 + ")?::(?:" + kH16 + ":){3}" + kLs32 + "|(?:(?:" + kH16 +
      ":){0,2}" + kH16 + ")?::(?:" + kH16 + ":){2}" + kLs32 + "|(?:(?:" + kH16 + ":){0,3}" + kH16 + ")?::" + kH16 +
      ":" + kLs32 + "|(?:(?:" + kH16 + ":){0,4}" + kH16 + ")?::" + kLs32 + "|(?:(?:" + kH16 + ":){0,5}" + kH16 +
      ")?::" + kH16 + "|(?:(?:" + kH16 + ":){0,6}" + kH16 + ")?::)";
  static const std::string kLabel = "[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?";
  static const std::string kHostname = kLabel + R"((?:\.)" + kLabel + ")*";
  static const std::string kDurTime = R"(T(?:\d+H(?:\d+M(?:\d+S)?)?|\d+M(?:\d+S)?|\d+S))";
  static const std::string kDurDate = R"((?:\d+D|\d+M(?:\d+D)?|\d+Y(?:\d+M(?:\d+D)?)?))";
  if (format == "date") return kDate;
  if (format == "time") return kTime;
  if (format == "date-time") return kDate + "[Tt]" + kTime;
  if (format == "duration") return "P(?:" + kDurDate + "(?:" + kDurTime + ")?|" + kDurTime + R"(|\d+W))";
  if (format == "ipv4") return kIpv4;
  if (format == "ipv6") return kIpv6;
  if (format == "hostname") return kHostname;
  if (format == "uuid") return "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}";
  // A practical email subset: local part of atext/dots, '@', a hostname.
  if (format == "email") return R"([A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(?:\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*@)" + kHostname;
  // URI (RFC 3986) and IRI (RFC 3987, the same grammar with `ucschar` among the unreserved characters and
  // `iprivate` in queries): the generic syntax exactly - authority (userinfo, IP literal, port), the path forms,
  // query and fragment.
  static const std::string kUcschar = [] {
    std::string r = R"(\u00A0-\uD7FF\uF900-\uFDCF\uFDF0-\uFFEF)";
    for (int plane = 1; plane <= 14; ++plane) {
      char buf[40];
      std::snprintf(buf, sizeof buf, "\\u{%X0000}-\\u{%XFFFD}", plane, plane);
      if (plane == 14) std::snprintf(buf, sizeof buf, "\\u{E1000}-\\u{EFFFD}");
      r += buf;
    }
    return r;
  }();
  static const std::string kIprivate = R"(\uE000-\uF8FF\u{F0000}-\u{FFFFD}\u{100000}-\u{10FFFD})";
  auto uri_regex = [&](bool iri, bool reference) {
    const std::string u = iri ? kUcschar : "";  // extra unreserved characters
    const std::string pct = "%[0-9A-Fa-f]{2}";
    auto cls = [&](const std::string& extra) {
      return "(?:[A-Za-z0-9\\-._~!$&'()*+,;=" + u + extra + "]|" + pct + ")";
    };
    const std::string pchar = cls(":@");
    const std::string segment = pchar + "*", segment_nz = pchar + "+";
    const std::string ip_literal = R"(\[(?:)" + kIpv6 + R"(|[vV][0-9A-Fa-f]+\.[A-Za-z0-9\-._~!$&'()*+,;=:]+)\])";
    const std::string authority = "(?:" + cls(":") + "*@)?(?:" + ip_literal + "|" + cls("") + "*)(?::[0-9]*)?";
    const std::string abempty = "(?:/" + segment + ")*";
    const std::string absolute = "/(?:" + segment_nz + abempty + ")?";
    const std::string rootless = segment_nz + abempty;
    const std::string noscheme = cls("@") + "+" + abempty;
    const std::string query = "(?:[A-Za-z0-9\\-._~!$&'()*+,;=:@/?" + u + (iri ? kIprivate : "") + "]|" + pct + ")*";
    const std::string fragment = "(?:[A-Za-z0-9\\-._~!$&'()*+,;=:@/?" + u + "]|" + pct + ")*";
    const std::string tail = R"((?:\?)" + query + ")?(?:#" + fragment + ")?";
    const std::string absolute_uri =
        "[A-Za-z][A-Za-z0-9+.\\-]*:(?://" + authority + abempty + "|" + absolute + "|" + rootless + ")?" + tail;
    if (!reference) return absolute_uri;
    return "(?:" + absolute_uri + "|(?://" + authority + abempty + "|" + absolute + "|" + noscheme + ")?" + tail + ")";
  };
  if (format == "uri") return uri_regex(false, false);
  if (format == "uri-reference") return uri_regex(false, true);
  if (format == "iri") return uri_regex(true, false);
  if (format == "iri-reference") return uri_regex(true, true);
  // URI Template (RFC 6570, level 4): literals and {operator varspec,...} expressions, braces balanced.
  if (format == "uri-template") {
    const std::string pct = "%[0-9A-Fa-f]{2}";
    const std::string varchar = "(?:[A-Za-z0-9_]|" + pct + ")";
    const std::string varspec = varchar + R"((?:\.?)" + varchar + R"()*(?::[1-9][0-9]{0,3}|\*)?)";
    return R"((?:[!#$&(-;=?-\[\]_a-z~)" + kUcschar + kIprivate + "]|" + pct + R"(|\{[+#./;?&=,!@|]?)" + varspec +
           "(?:," + varspec + R"()*\})*)";
  }
  // JSON Pointer (RFC 6901) and Relative JSON Pointer.
  static const std::string kPointer = "(?:/(?:[^~/]|~[01])*)*";
  if (format == "json-pointer") return kPointer;
  if (format == "relative-json-pointer") return "(?:0|[1-9][0-9]*)(?:#|" + kPointer + ")";
  return {};
}

bool is_annotation_keyword(std::string_view key) {
  static const std::set<std::string, std::less<>> kKeys = {
      "title",           "description",   "default",     "examples",   "$comment",
      "$schema",         "$id",           "id",          "deprecated", "readOnly",
      "writeOnly",       "$defs",         "definitions", "$anchor",    "contentMediaType",
      "contentEncoding", "contentSchema", "$vocabulary", "example"};
  return kKeys.count(key) > 0;
}

namespace {

nlohmann::ordered_json type_list(const nlohmann::ordered_json& t) {
  return t.is_array() ? t : nlohmann::ordered_json::array({t});
}

bool json_equal_numbers(const nlohmann::ordered_json& a, const nlohmann::ordered_json& b) {
  if (a.is_number() && b.is_number()) return a.get<double>() == b.get<double>();
  return a == b;
}

}  // namespace

nlohmann::ordered_json merge_schemas(const nlohmann::ordered_json& a, const nlohmann::ordered_json& b) {
  using json = nlohmann::ordered_json;
  if (a.is_boolean()) return a.get<bool>() ? b : a;
  if (b.is_boolean()) return b.get<bool>() ? a : b;
  for (const json* s : {&a, &b})
    for (const char* k : {"unevaluatedProperties", "unevaluatedItems"})
      DI_CHECK_CODE(!s->contains(k), ErrorCode::kUnsupported)
          << "JSON Schema: '" << k << "' combined with allOf/anyOf/oneOf/$ref siblings is not supported";
  // additionalProperties / items only see the properties / prefixItems of their own schema object: merging
  // would let them see the other side's too.
  for (auto [x, y] : {std::pair{&a, &b}, std::pair{&b, &a}}) {
    if (x->contains("additionalProperties") && y->contains("properties")) {
      for (auto it = (*y)["properties"].begin(); it != (*y)["properties"].end(); ++it)
        DI_CHECK_CODE(x->contains("properties") && (*x)["properties"].contains(it.key()), ErrorCode::kUnsupported)
            << "JSON Schema: additionalProperties combined (allOf/anyOf/$ref) with properties declared elsewhere";
    }
    if (x->contains("items") && !(*x)["items"].is_array() && !x->contains("prefixItems") &&
        (y->contains("prefixItems") || (y->contains("items") && (*y)["items"].is_array())))
      DI_FAIL(ErrorCode::kUnsupported) << "JSON Schema: items combined with prefixItems declared elsewhere";
  }
  json out = a;
  for (auto it = b.begin(); it != b.end(); ++it) {
    const std::string& k = it.key();
    const json& v = it.value();
    if (!out.contains(k)) {
      out[k] = v;
      continue;
    }
    json& cur = out[k];
    if (cur == v || is_annotation_keyword(k) || k == "$ref") {
      if (k == "$ref" && cur != v)
        DI_FAIL(ErrorCode::kUnsupported) << "allOf of two different $ref targets that could not be inlined";
      continue;
    }
    if (k == "properties" || k == "patternProperties") {
      for (auto p = v.begin(); p != v.end(); ++p)
        cur[p.key()] = cur.contains(p.key()) ? merge_schemas(cur[p.key()], p.value()) : p.value();
    } else if (k == "required") {
      std::set<std::string> have;
      for (const auto& r : cur) have.insert(r.get<std::string>());
      for (const auto& r : v)
        if (!have.count(r.get<std::string>())) cur.push_back(r);
    } else if (k == "type") {
      json result = json::array();
      for (const auto& x : type_list(cur))
        for (const auto& y : type_list(v)) {
          if (x == y)
            result.push_back(x);
          else if ((x == "integer" && y == "number") || (x == "number" && y == "integer"))
            result.push_back("integer");
        }
      cur = result;
    } else if (k == "minimum" || k == "minLength" || k == "minItems" || k == "minProperties" ||
               k == "exclusiveMinimum") {
      if (cur.is_number() && v.is_number())
        cur = cur.get<double>() >= v.get<double>() ? cur : v;
      else
        DI_FAIL(ErrorCode::kUnsupported) << "allOf merge of '" << k << "'";
    } else if (k == "maximum" || k == "maxLength" || k == "maxItems" || k == "maxProperties" ||
               k == "exclusiveMaximum") {
      if (cur.is_number() && v.is_number())
        cur = cur.get<double>() <= v.get<double>() ? cur : v;
      else
        DI_FAIL(ErrorCode::kUnsupported) << "allOf merge of '" << k << "'";
    } else if (k == "enum") {
      json result = json::array();
      for (const auto& x : cur)
        for (const auto& y : v)
          if (json_equal_numbers(x, y)) {
            result.push_back(x);
            break;
          }
      cur = result;
    } else if (k == "const") {
      if (!json_equal_numbers(cur, v)) return false;
    } else if (k == "items" || k == "additionalProperties" || k == "additionalItems" || k == "propertyNames") {
      if (cur.is_array() || v.is_array()) DI_FAIL(ErrorCode::kUnsupported) << "allOf merge of array-form '" << k << "'";
      cur = merge_schemas(cur, v);
    } else if (k == "anyOf" || k == "oneOf") {
      // (a1 | a2) & (b1 | b2) = a1&b1 | a1&b2 | ...
      DI_CHECK_CODE(cur.size() * v.size() <= 64, ErrorCode::kUnsupported) << "allOf of two large " << k << " lists";
      json result = json::array();
      for (const auto& x : cur)
        for (const auto& y : v) result.push_back(json{{"allOf", json::array({x, y})}});
      cur = result;
    } else if (k == "allOf") {
      for (const auto& x : v) cur.push_back(x);
    } else if (k == "uniqueItems") {
      cur = cur.get<bool>() || v.get<bool>();
    } else {
      DI_FAIL(ErrorCode::kUnsupported) << "allOf with two different values of '" << k << "'";
    }
  }
  return out;
}

}  // namespace deepinfer::structured::json_internal
