#include "deepinfer/structured/json_schema.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <optional>
#include <set>

#include "deepinfer/core/error.h"
#include "deepinfer/structured/compiled_grammar.h"
#include "deepinfer/structured/grammar_matcher.h"
#include "deepinfer/structured/json_schema_internal.h"
#include "deepinfer/structured/regex.h"

namespace deepinfer::structured {
namespace {

using json = nlohmann::ordered_json;
using namespace json_internal;

const std::set<std::string, std::less<>> kSupported = {"type",
                                                       "enum",
                                                       "const",
                                                       "properties",
                                                       "required",
                                                       "additionalProperties",
                                                       "items",
                                                       "prefixItems",
                                                       "additionalItems",
                                                       "minItems",
                                                       "maxItems",
                                                       "minLength",
                                                       "maxLength",
                                                       "pattern",
                                                       "format",
                                                       "minimum",
                                                       "maximum",
                                                       "exclusiveMinimum",
                                                       "exclusiveMaximum",
                                                       "multipleOf",
                                                       "anyOf",
                                                       "oneOf",
                                                       "allOf",
                                                       "$ref",
                                                       "minProperties",
                                                       "maxProperties",
                                                       "uniqueItems",
                                                       "unevaluatedProperties",
                                                       "if",
                                                       "then",
                                                       "else",
                                                       "patternProperties",
                                                       "propertyNames"};
// Validation keywords of drafts 4..2020-12 that this front end does not implement.
const std::set<std::string, std::less<>> kStandardUnsupported = {
    "not",         "dependentSchemas", "dependentRequired", "dependencies",   "contains",      "minContains",
    "maxContains", "unevaluatedItems", "$dynamicRef",       "$dynamicAnchor", "$recursiveRef", "$recursiveAnchor"};

std::string json_string_literal(const std::string& s) { return json(s).dump(); }

}  // namespace

namespace json_internal {
bool is_validation_keyword(std::string_view key) {
  return kSupported.count(key) > 0 || kStandardUnsupported.count(key) > 0;
}
}  // namespace json_internal

namespace {

class SchemaCompiler {
 public:
  SchemaCompiler(const json& root, const JsonSchemaOptions& options) : root_(root), opt_(options) {
    index_ids(root_, "#");
    // Drafts 3 and 4 define an integer as a number "without a fraction or exponent part": 1.0 is not one there
    // (from draft 6 on it is). maskbench labels follow the declared draft.
    if (root_.is_object() && root_.contains("$schema") && root_["$schema"].is_string()) {
      const std::string d = root_["$schema"].get<std::string>();
      integer_without_fraction_ = d.find("draft-04") != std::string::npos || d.find("draft-03") != std::string::npos;
      // Up to draft 7, keywords next to $ref are ignored; this compiler merges them (stricter, so harmless for a
      // plain schema), which would make oneOf's disjointness proofs and negations unsound: see exact_one_of.
      ref_siblings_ignored_ = integer_without_fraction_ || d.find("draft-06") != std::string::npos ||
                              d.find("draft-07") != std::string::npos;
    }
  }

  JsonSchemaGrammar run() {
    int root_rule = g_.declare_rule("root");
    g_.set_root(root_rule);
    g_.define_rule(root_rule, seq_expr({ws(), value(root_, "#"), ws()}));
    if (stricter_oneof_) {
      // A oneOf branch made stricter than the schema (its negation of another branch could not be expressed) can
      // leave no instance at all; that is this compiler's limitation, not an unsatisfiable schema.
      try {
        CompiledGrammar::compile(g_);
      } catch (const Error& e) {
        if (e.code() == ErrorCode::kInvalidArgument &&
            std::string_view(e.what()).find("matches no string") != std::string_view::npos)
          DI_FAIL(ErrorCode::kUnsupported) << "JSON Schema: oneOf branches made exclusive more strictly than the "
                                              "schema (negations it cannot express) leave no instance";
      }
    }
    return JsonSchemaGrammar{std::move(g_), std::move(warnings_)};
  }

  Grammar any_grammar() {
    int root_rule = g_.declare_rule("root");
    g_.set_root(root_rule);
    g_.define_rule(root_rule, seq_expr({ws(), rule_expr(any_value_rule()), ws()}));
    return std::move(g_);
  }

 private:
  // ---- helpers -------------------------------------------------------------------------------------------
  void warn(const std::string& msg) {
    if (warned_.insert(msg).second) warnings_.push_back(msg);
  }
  void unsupported(const std::string& what, const std::string& path) {
    if (!opt_.lenient)
      DI_FAIL(ErrorCode::kUnsupported) << "JSON Schema: " << what << " at " << path << " is not supported";
    warn(what + " at " + path + " is not supported and was ignored (lenient)");
  }

  // Unbounded whitespace is one self-loop and is inlined; bounded whitespace needs max+1 states, so it is one
  // shared rule rather than a copy in every gap (that kept compile time linear in the schema size).
  ExprPtr ws() {
    ByteSet s;
    for (char c : std::string(" \t\n\r")) s.set(static_cast<uint8_t>(c));
    if (opt_.max_whitespace == 0) return empty_expr();
    if (opt_.max_whitespace < 0) return star_expr(bytes_expr(s));
    if (ws_rule_ < 0) ws_rule_ = g_.add_rule(g_.fresh_name("ws"), repeat_expr(bytes_expr(s), 0, opt_.max_whitespace));
    return rule_expr(ws_rule_);
  }

  // One character of a JSON string: raw, a short escape or any `\uXXXX` (one automaton for every string; a
  // surrogate pair counts as two characters here - see docs/STRUCTURED.md "What is left").
  ExprPtr json_char() {
    ByteSet simple;
    for (char c : std::string("\"\\/bfnrt")) simple.set(static_cast<uint8_t>(c));
    ByteSet hex;
    hex.set_range('0', '9');
    hex.set_range('a', 'f');
    hex.set_range('A', 'F');
    ExprPtr escape =
        seq_expr({byte_expr('\\'),
                  alt_expr({bytes_expr(simple), seq_expr({byte_expr('u'), repeat_expr(bytes_expr(hex), 4, 4)})})});
    return alt_expr({utf8_ranges_expr({{0x20, 0x21}, {0x23, 0x5B}, {0x5D, kMaxCodepoint}}), escape});
  }

  // One character as JSON Schema counts it (a code point after decoding): a surrogate pair `\uD83D\uDE00` is one;
  // a lone high surrogate is refused (were it one character, the pair would also parse as two); a lone low
  // surrogate is one. Refusing lone high surrogates costs false negatives only.
  ExprPtr counted_json_char() {
    auto set_of = [](const char* chars) {
      ByteSet s;
      for (const char* c = chars; *c; ++c) s.set(static_cast<uint8_t>(*c));
      return s;
    };
    const ByteSet hex = set_of("0123456789abcdefABCDEF"), not_d = set_of("0123456789abcefABCEF"), d = set_of("dD");
    const ByteSet below_surrogates = set_of("01234567"), high = set_of("89abAB"), low = set_of("cdefCDEF");
    auto hex2 = [&] { return repeat_expr(bytes_expr(hex), 2, 2); };
    ExprPtr u = alt_expr({seq_expr({bytes_expr(not_d), repeat_expr(bytes_expr(hex), 3, 3)}),
                          seq_expr({bytes_expr(d), bytes_expr(below_surrogates), hex2()}),
                          seq_expr({bytes_expr(d), bytes_expr(low), hex2()}),
                          seq_expr({bytes_expr(d), bytes_expr(high), hex2(), literal_expr("\\u"), bytes_expr(d),
                                    bytes_expr(low), hex2()})});
    ExprPtr escape = seq_expr(
        {byte_expr('\\'), alt_expr({bytes_expr(set_of("\"\\/bfnrt")), seq_expr({byte_expr('u'), std::move(u)})})});
    return alt_expr({utf8_ranges_expr({{0x20, 0x21}, {0x23, 0x5B}, {0x5D, kMaxCodepoint}}), std::move(escape)});
  }

  int cached_rule(const std::string& key, const std::string& name, const std::function<ExprPtr()>& body) {
    auto it = rule_cache_.find(key);
    if (it != rule_cache_.end()) return it->second;
    int id = g_.declare_rule(g_.fresh_name(name));
    rule_cache_[key] = id;
    g_.define_rule(id, body());
    return id;
  }

  int any_value_rule() {
    if (any_rule_ >= 0) return any_rule_;
    any_rule_ = g_.declare_rule(g_.fresh_name("value"));
    int str = string_rule(json::object(), "#");
    int num = cached_rule("number:any", "number", [&] { return number_expr({}, false); });
    ExprPtr v = rule_expr(any_rule_);
    ExprPtr member = seq_expr({rule_expr(str), ws(), byte_expr(':'), ws(), v});
    ExprPtr sep = seq_expr({ws(), byte_expr(','), ws()});
    int obj =
        g_.add_rule(g_.fresh_name("object"),
                    seq_expr({byte_expr('{'), ws(), opt_expr(seq_expr({member, star_expr(seq_expr({sep, member}))})),
                              ws(), byte_expr('}')}));
    int arr = g_.add_rule(
        g_.fresh_name("array"),
        seq_expr({byte_expr('['), ws(), opt_expr(seq_expr({v, star_expr(seq_expr({sep, v}))})), ws(), byte_expr(']')}));
    g_.define_rule(any_rule_, alt_expr({rule_expr(obj), rule_expr(arr), rule_expr(str), rule_expr(num),
                                        literal_expr("true"), literal_expr("false"), literal_expr("null")}));
    return any_rule_;
  }

  // ---- $ref -----------------------------------------------------------------------------------------------
  void index_ids(const json& s, const std::string& path) {
    if (s.is_object()) {
      if (s.contains("$anchor") && s["$anchor"].is_string()) anchors_["#" + s["$anchor"].get<std::string>()] = &s;
      if (s.contains("$id") && s["$id"].is_string() && path != "#") ids_[s["$id"].get<std::string>()] = &s;
      for (auto it = s.begin(); it != s.end(); ++it)
        if (it.key() != "enum" && it.key() != "const" && it.key() != "examples" && it.key() != "default")
          index_ids(it.value(), path + "/" + it.key());
    } else if (s.is_array()) {
      for (size_t i = 0; i < s.size(); ++i) index_ids(s[i], path + "/" + std::to_string(i));
    }
  }

  static std::string percent_decode(const std::string& s) {
    std::string out;
    for (size_t i = 0; i < s.size(); ++i) {
      if (s[i] == '%' && i + 2 < s.size() && isxdigit(static_cast<unsigned char>(s[i + 1])) &&
          isxdigit(static_cast<unsigned char>(s[i + 2]))) {
        out += static_cast<char>(std::stoi(s.substr(i + 1, 2), nullptr, 16));
        i += 2;
      } else {
        out += s[i];
      }
    }
    return out;
  }

  const json& resolve(const std::string& ref, const std::string& path) {
    std::string r = ref;
    if (root_.is_object() && root_.contains("$id") && root_["$id"].is_string()) {
      const std::string base = root_["$id"].get<std::string>();
      if (r.rfind(base, 0) == 0) r = r.substr(base.size());
    }
    if (r.empty()) r = "#";
    if (r[0] != '#') {
      auto it = ids_.find(r);
      if (it != ids_.end()) return *it->second;
      DI_FAIL(ErrorCode::kUnsupported) << "JSON Schema: $ref '" << ref << "' at " << path
                                       << " points outside the document (remote references are not supported)";
    }
    if (r.size() > 1 && r[1] != '/') {
      auto it = anchors_.find(r);
      DI_CHECK_CODE(it != anchors_.end(), ErrorCode::kUnsupported)
          << "JSON Schema: unknown anchor $ref '" << ref << "' at " << path;
      return *it->second;
    }
    const json* cur = &root_;
    size_t pos = 1;
    while (pos < r.size()) {
      size_t next = r.find('/', pos + 1);
      std::string token =
          percent_decode(r.substr(pos + 1, next == std::string::npos ? std::string::npos : next - pos - 1));
      for (size_t i; (i = token.find("~1")) != std::string::npos;) token.replace(i, 2, "/");
      for (size_t i; (i = token.find("~0")) != std::string::npos;) token.replace(i, 2, "~");
      if (cur->is_object() && cur->contains(token)) {
        cur = &(*cur)[token];
      } else if (cur->is_array() && !token.empty() && token.find_first_not_of("0123456789") == std::string::npos &&
                 std::stoul(token) < cur->size()) {
        cur = &(*cur)[std::stoul(token)];
      } else {
        DI_FAIL(ErrorCode::kInvalidArgument) << "JSON Schema: $ref '" << ref << "' at " << path << " does not resolve";
      }
      pos = next == std::string::npos ? r.size() : next;
    }
    return *cur;
  }

  // A schema with its top-level $ref chain replaced by the target's keywords (for merging).
  json inline_ref(const json& s, const std::string& path) {
    json cur = s;
    for (int hops = 0; cur.is_object() && cur.contains("$ref"); ++hops) {
      DI_CHECK_CODE(hops < 32, ErrorCode::kUnsupported) << "JSON Schema: $ref chain too long at " << path;
      json target = resolve(cur["$ref"].get<std::string>(), path);
      cur.erase("$ref");
      cur = merge_schemas(cur, target);
    }
    return cur;
  }

  static bool only_annotations(const json& s) {
    for (auto it = s.begin(); it != s.end(); ++it)
      if (!is_annotation_keyword(it.key())) return false;
    return true;
  }

  // ---- values ---------------------------------------------------------------------------------------------
  ExprPtr value(const json& s, const std::string& path) {
    DI_CHECK_CODE(++depth_ < 400, ErrorCode::kUnsupported) << "JSON Schema nesting too deep at " << path;
    struct DepthGuard {
      int& d;
      ~DepthGuard() { --d; }
    } guard{depth_};
    if (s.is_boolean()) return s.get<bool>() ? rule_expr(any_value_rule()) : nothing_expr();
    DI_CHECK(s.is_object()) << "JSON Schema: a schema must be an object or a boolean at " << path;
    if (s.contains("$ref")) {
      DI_CHECK(s["$ref"].is_string()) << "JSON Schema: $ref must be a string at " << path;
      const std::string ref = s["$ref"].get<std::string>();
      json rest = s;
      rest.erase("$ref");
      if (only_annotations(rest)) return rule_expr(ref_rule(ref, path));
      return value(inline_ref(s, path), path);
    }
    if (s.contains("allOf")) {
      json merged = s;
      merged.erase("allOf");
      for (const auto& sub : s["allOf"]) merged = merge_schemas(merged, inline_ref(sub, path + "/allOf"));
      return value(merged, path);
    }
    for (const char* key : {"anyOf", "oneOf"}) {
      if (!s.contains(key)) continue;
      json base = s;
      base.erase(key);
      std::vector<ExprPtr> alts;
      const json& branches = s[key];
      DI_CHECK(branches.is_array() && !branches.empty())
          << "JSON Schema: " << key << " must be a non-empty array at " << path;
      if (std::string(key) == "oneOf" && !types_disjoint(branches)) {
        if (opt_.oneof_as_anyof) {
          warn("oneOf at " + path + " is matched as anyOf (its branches may overlap)");
        } else if (auto exact = exact_one_of(base, branches, path)) {
          return *exact;
        } else {
          unsupported("oneOf with branches that may overlap", path);
        }
      }
      for (size_t i = 0; i < branches.size(); ++i) {
        std::string p = path + "/" + key + "/" + std::to_string(i);
        alts.push_back(only_annotations(base) ? value(branches[i], p)
                                              : value(merge_schemas(base, inline_ref(branches[i], p)), p));
      }
      return alt_expr(std::move(alts));
    }
    check_keywords(s, path);
    std::vector<std::string> types = allowed_types(s, path);
    if (s.contains("const") || s.contains("enum")) {
      json values = s.contains("const") ? json::array({s["const"]}) : s["enum"];
      if (s.contains("const") && s.contains("enum")) {
        bool found = false;
        for (const auto& v : s["enum"]) found |= v == s["const"];
        if (!found) return nothing_expr();
      }
      std::vector<ExprPtr> alts;
      for (const auto& v : values)
        if (type_allows(types, v)) alts.push_back(literal(v));
      return alt_expr(std::move(alts));
    }
    std::vector<ExprPtr> alts;
    for (const std::string& t : types) {
      if (t == "null")
        alts.push_back(literal_expr("null"));
      else if (t == "boolean")
        alts.push_back(alt_expr({literal_expr("true"), literal_expr("false")}));
      else if (t == "string")
        alts.push_back(rule_expr(string_rule(s, path)));
      else if (t == "number" || t == "integer")
        alts.push_back(rule_expr(number_rule(s, t == "integer", path)));
      else if (t == "object")
        alts.push_back(rule_expr(object_rule(s, path)));
      else if (t == "array")
        alts.push_back(rule_expr(array_rule(s, path)));
    }
    return alt_expr(std::move(alts));
  }

  // oneOf = for each branch i: base & B_i & not B_j for every j != i. Pairs proven disjoint need no negation; the
  // others are made exclusive with negate_schema's alternatives (required keys absent, other types, type-only
  // properties violated: the "exactly one of these keys" idiom) - exact, or stricter with a warning where B_j has
  // constraints its negation cannot write. nullopt when B_j's negation is nothing we can write at all.
  std::optional<ExprPtr> exact_one_of(const json& base, const json& branches, const std::string& path) {
    // Where the draft ignores $ref siblings, a schema with both is stronger here than in truth: proofs and
    // negations must not use it (the proof then fails, the negation leaves it out: both sound).
    auto merged_ref_siblings = [&](const json& x) {
      if (!ref_siblings_ignored_ || !x.is_object() || !x.contains("$ref")) return false;
      for (auto it = x.begin(); it != x.end(); ++it)
        if (it.key() != "$ref" && !is_annotation_keyword(it.key()) && is_validation_keyword(it.key())) return true;
      return false;
    };
    const RefInliner inliner = [&](const json& x) {
      DI_CHECK_CODE(!merged_ref_siblings(x), ErrorCode::kUnsupported) << "JSON Schema: $ref with siblings in oneOf";
      return inline_ref(x, path + "/oneOf");
    };
    const size_t n = branches.size();
    for (const auto& b : branches)
      if (merged_ref_siblings(b)) return std::nullopt;
    std::vector<json> merged(n);
    for (size_t i = 0; i < n; ++i)
      merged[i] = merge_schemas(base, inline_ref(branches[i], path + "/oneOf/" + std::to_string(i)));
    std::vector<std::vector<bool>> apart(n, std::vector<bool>(n, true));
    bool all_apart = true;
    for (size_t i = 0; i < n; ++i)
      for (size_t j = i + 1; j < n; ++j) {
        apart[i][j] = apart[j][i] = schemas_disjoint(merged[i], merged[j], inliner);
        all_apart &= apart[i][j];
      }
    std::vector<ExprPtr> alts;
    for (size_t i = 0; i < n; ++i) {
      const std::string p = path + "/oneOf/" + std::to_string(i);
      if (all_apart) {
        alts.push_back(only_annotations(base) ? value(branches[i], p) : value(merged[i], p));
        continue;
      }
      std::vector<json> conj{merged[i]};
      for (size_t j = 0; j < n; ++j) {
        if (j == i || apart[i][j]) continue;
        std::vector<json> next;
        for (const json& c : conj) {
          bool approximate = false;
          const std::vector<json> negated = negate_schema(branches[j], c, inliner, &approximate);
          if (approximate && negated.empty()) return std::nullopt;
          if (approximate) stricter_oneof_ = true;
          if (approximate)
            warn("oneOf at " + path + ": branch " + std::to_string(i) + " rejects instances that fail branch " +
                 std::to_string(j) + " only through keywords its negation cannot express (stricter, never looser)");
          for (const json& alt : negated) {
            json m = apply_alternative(c, alt);
            if (!(m.is_boolean() && !m.get<bool>())) next.push_back(std::move(m));
          }
        }
        DI_CHECK_CODE(next.size() <= 64, ErrorCode::kUnsupported)
            << "JSON Schema: oneOf at " << path << " needs more than 64 exclusive branches";
        conj = std::move(next);
      }
      for (size_t k = 0; k < conj.size(); ++k) alts.push_back(value(conj[k], p));
    }
    return alt_expr(std::move(alts));
  }

  // c & alt for one of negate_schema's alternatives. A member alternative ({type: object, [required: [k]],
  // properties: {k: X}}) is applied by declaring k in c with (c's schema for k) & X: declaring it is what
  // merge_schemas refuses next to c's additionalProperties in general (that keyword stops applying to k), but
  // here the declared schema is exactly what applied to k before, narrowed by X.
  static json apply_alternative(const json& c, const json& alt) {
    if (!c.is_object() || !alt.is_object() || !alt.contains("properties")) return merge_schemas(c, alt);
    json out = merge_schemas(c, json{{"type", "object"}});
    if (!out.is_object()) return out;
    for (auto p = alt["properties"].begin(); p != alt["properties"].end(); ++p) {
      const std::string& k = p.key();
      json current = true;
      if (out.contains("properties") && out["properties"].contains(k))
        current = out["properties"][k];
      else if (out.contains("additionalProperties") && !out.contains("patternProperties"))
        current = out["additionalProperties"];
      out["properties"][k] = apply_alternative(current, p.value());
    }
    if (alt.contains("required")) out = merge_schemas(out, json{{"required", alt["required"]}});
    return out;
  }

  // oneOf is exact as anyOf when no value can satisfy two branches; checked on explicit types and constants.
  bool types_disjoint(const json& branches) {
    std::vector<std::set<std::string>> kinds;
    for (const auto& b : branches) {
      std::set<std::string> k;
      if (!b.is_object()) return false;
      if (b.contains("const")) {
        k.insert("const:" + b["const"].dump());
      } else if (b.contains("enum") && b["enum"].is_array()) {
        for (const auto& v : b["enum"]) k.insert("const:" + v.dump());
      } else if (b.contains("type")) {
        for (const auto& t : b["type"].is_array() ? b["type"] : json::array({b["type"]}))
          k.insert(t == "integer" ? "number" : t.get<std::string>());
      } else {
        return false;
      }
      kinds.push_back(std::move(k));
    }
    std::set<std::string> all;
    size_t total = 0;
    for (const auto& k : kinds) {
      total += k.size();
      all.insert(k.begin(), k.end());
    }
    // Constants of different spellings could still be equal values (1 vs 1.0) or of a listed type; be strict.
    bool mixed = false;
    for (const auto& x : all) mixed |= x.rfind("const:", 0) != 0;
    return all.size() == total && (!mixed || std::all_of(all.begin(), all.end(), [](const std::string& x) {
             return x.rfind("const:", 0) != 0;
           }));
  }

  int ref_rule(const std::string& ref, const std::string& path) {
    auto it = ref_rules_.find(ref);
    if (it != ref_rules_.end()) return it->second;
    const json& target = resolve(ref, path);
    std::string name = ref.substr(ref.find_last_of("/#") + 1);
    for (char& c : name)
      if (!isalnum(static_cast<unsigned char>(c))) c = '_';
    int id = g_.declare_rule(g_.fresh_name(name.empty() ? "ref" : "ref_" + name));
    ref_rules_[ref] = id;
    g_.define_rule(id, value(target, ref));
    return id;
  }

  void check_keywords(const json& s, const std::string& path) {
    for (auto it = s.begin(); it != s.end(); ++it) {
      const std::string& k = it.key();
      if (kSupported.count(k) || is_annotation_keyword(k)) continue;
      if (kStandardUnsupported.count(k)) {
        unsupported("keyword '" + k + "'", path);
      } else {
        warn("unknown keyword '" + k + "' at " + path + " ignored (no validation meaning)");
      }
    }
    if (s.contains("if") && (s.contains("then") || s.contains("else"))) unsupported("if/then/else", path);
    if (s.contains("uniqueItems") && s["uniqueItems"] == true) unsupported("uniqueItems: true", path);
  }

  std::vector<std::string> allowed_types(const json& s, const std::string& path) {
    static const std::vector<std::string> kAll = {"object", "array", "string", "number", "boolean", "null"};
    if (!s.contains("type")) return kAll;
    json t = s["type"].is_array() ? s["type"] : json::array({s["type"]});
    std::vector<std::string> out;
    bool has_number = false;
    for (const auto& x : t) {
      DI_CHECK(x.is_string()) << "JSON Schema: bad type at " << path;
      has_number |= x == "number";
    }
    for (const auto& x : t) {
      std::string name = x.get<std::string>();
      DI_CHECK(std::find(kAll.begin(), kAll.end(), name) != kAll.end() || name == "integer")
          << "JSON Schema: unknown type '" << name << "' at " << path;
      if (name == "integer" && has_number) continue;
      if (std::find(out.begin(), out.end(), name) == out.end()) out.push_back(name);
    }
    return out;
  }

  static bool type_allows(const std::vector<std::string>& types, const json& v) {
    auto has = [&](const char* t) { return std::find(types.begin(), types.end(), t) != types.end(); };
    if (v.is_null()) return has("null");
    if (v.is_boolean()) return has("boolean");
    if (v.is_string()) return has("string");
    if (v.is_object()) return has("object");
    if (v.is_array()) return has("array");
    if (v.is_number()) {
      double d = v.get<double>();
      return has("number") || (has("integer") && std::floor(d) == d);
    }
    return false;
  }

  // A JSON value spelled as in the schema (compact, with optional whitespace between tokens); integral
  // numbers also match with a zero fraction (1 == 1.0 in JSON Schema).
  ExprPtr literal(const json& v) {
    if (v.is_object()) {
      std::vector<ExprPtr> items{byte_expr('{'), ws()};
      bool first = true;
      for (auto it = v.begin(); it != v.end(); ++it) {
        if (!first) items.insert(items.end(), {ws(), byte_expr(','), ws()});
        first = false;
        items.insert(items.end(),
                     {literal_expr(json_string_literal(it.key())), ws(), byte_expr(':'), ws(), literal(it.value())});
      }
      items.insert(items.end(), {ws(), byte_expr('}')});
      return seq_expr(std::move(items));
    }
    if (v.is_array()) {
      std::vector<ExprPtr> items{byte_expr('['), ws()};
      for (size_t i = 0; i < v.size(); ++i) {
        if (i) items.insert(items.end(), {ws(), byte_expr(','), ws()});
        items.push_back(literal(v[i]));
      }
      items.insert(items.end(), {ws(), byte_expr(']')});
      return seq_expr(std::move(items));
    }
    if (v.is_number()) {
      double d = v.get<double>();
      if (std::floor(d) == d && std::fabs(d) < 1e15) {
        std::string text = std::to_string(static_cast<int64_t>(d));
        return seq_expr({literal_expr(text), opt_expr(seq_expr({byte_expr('.'), plus_expr(byte_expr('0'))}))});
      }
    }
    return literal_expr(v.dump());
  }

  // A count keyword (minLength, maxItems, ...): a non-negative integer (3.0 counts, as JSON Schema allows) below
  // 2^31. A value outside int must be an error here: converting it is undefined (the fuzzer found
  // "minLength": 2.2e41).
  static int count_keyword(const json& s, const char* key, int absent, const std::string& path) {
    if (!s.contains(key)) return absent;
    const json& v = s[key];
    const double d = v.is_number() ? v.get<double>() : -1.0;
    DI_CHECK(v.is_number() && d >= 0 && d < 2147483647.0 && std::floor(d) == d)
        << "JSON Schema: '" << key << "' at " << path << " must be a non-negative integer below 2^31, got " << v.dump();
    return static_cast<int>(d);
  }

  // ---- strings --------------------------------------------------------------------------------------------
  static constexpr int kMaxLengthWithPattern = 256;
  int string_rule(const json& s, const std::string& path) {
    int min_len = count_keyword(s, "minLength", 0, path);
    int max_len = count_keyword(s, "maxLength", Expr::kUnbounded, path);
    std::string pattern = s.contains("pattern") ? s["pattern"].get<std::string>() : "";
    std::string format = s.contains("format") && opt_.enforce_formats ? s["format"].get<std::string>() : "";
    std::string format_re;
    if (!format.empty()) {
      format_re = format_regex(format);
      // Formats of the standard vocabulary that have no exact grammar here are errors like any unsupported
      // keyword; formats outside it are annotations (the 2020-12 default for unknown formats) with a warning.
      if (format_re.empty() && (format == "regex" || format == "idn-email" || format == "idn-hostname"))
        unsupported("format '" + format + "'", path);
      else if (format_re.empty())
        warn("format '" + format + "' at " + path + " is not enforced (unknown format)");
    }
    bool has_len = min_len > 0 || max_len != Expr::kUnbounded;
    DI_CHECK(max_len == Expr::kUnbounded || max_len >= min_len) << "JSON Schema: maxLength < minLength at " << path;
    // A length bound next to a pattern/format is a product automaton: (pattern states) x (bound + 1). Keep it
    // small; larger bounds stay unsupported (a length of thousands next to a pattern would take seconds).
    if (has_len && (!pattern.empty() || !format_re.empty()) && std::max(min_len, max_len) > kMaxLengthWithPattern) {
      unsupported(
          "minLength/maxLength above " + std::to_string(kMaxLengthWithPattern) + " together with pattern/format", path);
      has_len = false;
    }
    std::string key =
        "string:" + std::to_string(min_len) + ":" + std::to_string(max_len) + ":" + pattern + ":" + format_re;
    return cached_rule(key, "string", [&] {
      // Each keyword is a language over the string's JSON-encoded bytes; several keywords = their intersection
      // (CompiledGrammar builds the product automaton). Lengths count characters: one json_char() each.
      std::vector<ExprPtr> parts;
      if (!pattern.empty()) parts.push_back(regex_to_expr(pattern, CharEncoding::kJsonString, RegexMatch::kSearch));
      if (!format_re.empty()) parts.push_back(regex_to_expr(format_re, CharEncoding::kJsonString, RegexMatch::kFull));
      // json_char() counts a surrogate pair as two characters, which is stricter for maxLength but would let
      // minLength 2 accept the one character "\ud83d\ude00": the first min_len characters are counted exactly.
      if (has_len || parts.empty())
        parts.push_back(
            min_len == 0 ? repeat_expr(json_char(), 0, max_len)
                         : seq_expr({repeat_expr(counted_json_char(), min_len, min_len),
                                     repeat_expr(json_char(), 0,
                                                 max_len == Expr::kUnbounded ? Expr::kUnbounded : max_len - min_len)}));
      return seq_expr({byte_expr('"'), and_expr(std::move(parts)), byte_expr('"')});
    });
  }

  // ---- numbers --------------------------------------------------------------------------------------------
  int number_rule(const json& s, bool integer, const std::string& path) {
    NumberBounds b;
    if (s.contains("minimum")) b.min = s["minimum"].get<double>();
    if (s.contains("maximum")) b.max = s["maximum"].get<double>();
    for (auto [key, bound, excl] : {std::tuple{"exclusiveMinimum", &b.min, &b.min_exclusive},
                                    std::tuple{"exclusiveMaximum", &b.max, &b.max_exclusive}}) {
      if (!s.contains(key)) continue;
      const json& v = s[key];
      if (v.is_boolean()) {  // draft-04: modifies minimum/maximum
        *excl = v.get<bool>() && bound->has_value();
      } else {
        double x = v.get<double>();
        bool is_min = std::string(key) == "exclusiveMinimum";
        if (!bound->has_value() || (is_min ? x >= **bound : x <= **bound)) {
          *bound = x;
          *excl = true;
        }
      }
    }
    // multipleOf: 1 makes an integer; 1/n on an integer is no constraint; 10^-k on a number bounds the fraction
    // digits (the others are not regular over decimal spellings in a form we build: unsupported).
    const bool integer_type = integer;  // (multipleOf 1 on a number still admits 1.0 in every draft)
    int fraction_digits = -1;
    if (s.contains("multipleOf")) {
      const double m = s["multipleOf"].get<double>();
      DI_CHECK(m > 0) << "JSON Schema: multipleOf must be > 0 at " << path;
      const double inv = std::round(1.0 / m);
      int k = 0;
      for (double p = 1; p < inv && k < 18; p *= 10) ++k;
      if (m == 1.0) {
        integer = true;
      } else if (integer && std::floor(1.0 / m) == 1.0 / m) {
        // every integer qualifies
      } else if (!integer && m < 1 && std::pow(10.0, k) == inv && std::fabs(1.0 / m - inv) < 1e-9 * inv) {
        fraction_digits = k;
      } else {
        unsupported("multipleOf " + s["multipleOf"].dump(), path);
      }
    }
    auto spell = [](double v) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.17g", v);
      return std::string(buf);
    };
    if (integer && b.any()) {
      // Non-integral bounds on an integer can be rounded inward exactly.
      if (b.min && std::floor(*b.min) != *b.min) b.min = std::ceil(*b.min), b.min_exclusive = false;
      if (b.max && std::floor(*b.max) != *b.max) b.max = std::floor(*b.max), b.max_exclusive = false;
    }
    std::string key = std::string(integer ? "integer:" : "number:") + (b.min ? spell(*b.min) : "") + ":" +
                      (b.max ? spell(*b.max) : "") + ":" + std::to_string(b.min_exclusive) +
                      std::to_string(b.max_exclusive) + ":" + std::to_string(fraction_digits);
    if (fraction_digits >= 0)
      return cached_rule(key, "number", [&] {
        return and_expr({number_expr(b, false), decimal_places_expr(fraction_digits)});
      });
    if (integer_type && integer_without_fraction_) {
      // Drafts 3/4: the integer spellings without a fraction part.
      return cached_rule(key + ":plain", "integer", [&] {
        ExprPtr digits = plus_expr(bytes_expr([] {
          ByteSet d;
          for (int c = '0'; c <= '9'; ++c) d.set(c);
          return d;
        }()));
        return and_expr({number_expr(b, true), seq_expr({opt_expr(byte_expr('-')), digits})});
      });
    }
    return cached_rule(key, integer ? "integer" : "number", [&] { return number_expr(b, integer); });
  }

  // ---- objects --------------------------------------------------------------------------------------------
  int object_rule(const json& s, const std::string& path) {
    struct Prop {
      std::string name;
      const json* schema;
      bool required;
    };
    std::vector<Prop> props;
    std::set<std::string> required;
    if (s.contains("required"))
      for (const auto& r : s["required"]) required.insert(r.get<std::string>());
    static const json kTrue = true;
    const json* additional = &kTrue;
    if (s.contains("additionalProperties")) {
      additional = &s["additionalProperties"];
    } else if (s.contains("unevaluatedProperties")) {
      additional = &s["unevaluatedProperties"];  // no composition keywords here, so the same thing
    }
    std::set<std::string> declared;
    if (s.contains("properties"))
      for (auto it = s["properties"].begin(); it != s["properties"].end(); ++it) {
        props.push_back(Prop{it.key(), &it.value(), required.count(it.key()) > 0});
        declared.insert(it.key());
      }
    // Required keys without a `properties` entry must still appear: declare them with the additional schema.
    if (s.contains("required"))
      for (const auto& r : s["required"])
        if (!declared.count(r.get<std::string>())) {
          props.push_back(Prop{r.get<std::string>(), additional, true});
          declared.insert(r.get<std::string>());
        }
    bool extras = !(additional->is_boolean() && !additional->get<bool>());
    for (const auto& p : props)
      for (unsigned char c : p.name)
        if (c < 0x20 || c >= 0x7F || c == '"' || c == '\\') {
          if (extras) warn("additional properties disallowed at " + path + " (a declared name needs escaping)");
          extras = false;
        }
    size_t num_required = 0;
    for (const auto& p : props) num_required += p.required;
    // Extra members: by default any key but a declared one, valued by additionalProperties. patternProperties and
    // propertyNames narrow the keys (extra_key) in the cases that stay exact; the rest is unsupported.
    ExprPtr extra_key;
    const json* extra_value = additional;
    const bool additional_false = additional->is_boolean() && !additional->get<bool>();
    if (s.contains("patternProperties")) {
      const json& pp = s["patternProperties"];
      DI_CHECK(pp.is_object()) << "JSON Schema: patternProperties must be an object at " << path;
      if (pp.size() > 1) {
        unsupported("patternProperties with more than one pattern", path);
      } else if (pp.size() == 1 && !additional_false) {
        unsupported("patternProperties without additionalProperties: false", path);
      } else if (pp.size() == 1) {
        // Exact when no declared name matches the pattern: the extra keys are then exactly the matching keys.
        const std::string pattern = pp.begin().key();
        ExprPtr key = seq_expr(
            {byte_expr('"'), regex_to_expr(pattern, CharEncoding::kJsonString, RegexMatch::kSearch), byte_expr('"')});
        std::string clash;
        for (const auto& p : props)
          if (clash.empty() && expr_matches(key, json_string_literal(p.name))) clash = p.name;
        if (!clash.empty()) {
          unsupported("patternProperties whose pattern matches the declared property '" + clash + "'", path);
        } else {
          extra_key = key;
          extra_value = &pp.begin().value();
          extras = true;
        }
      }
    }
    if (s.contains("propertyNames")) {
      const json pn = inline_ref(s["propertyNames"], path + "/propertyNames");
      const bool trivial = (pn.is_boolean() && pn.get<bool>()) || (pn.is_object() && only_annotations(pn));
      if (!trivial) {
        if (extra_key) {
          unsupported("propertyNames together with patternProperties", path);
        } else if (pn.is_object() && (pn.contains("enum") || pn.contains("const"))) {
          // A finite set of names: declared names must be in it; extra keys are the rest of it.
          const json names = pn.contains("const") ? json::array({pn["const"]}) : pn["enum"];
          std::set<std::string> allowed;
          for (const auto& n : names)
            if (n.is_string() && (!pn.contains("const") || !pn.contains("enum") ||
                                  std::find(pn["enum"].begin(), pn["enum"].end(), n) != pn["enum"].end()))
              allowed.insert(n.get<std::string>());
          std::string outside;
          for (const auto& p : props)
            if (outside.empty() && !allowed.count(p.name)) outside = p.name;
          if (!outside.empty()) {
            unsupported("propertyNames that excludes the declared property '" + outside + "'", path);
          } else if (extras) {
            std::vector<ExprPtr> keys;
            for (const auto& n : allowed)
              if (!declared.count(n)) keys.push_back(literal_expr(json_string_literal(n)));
            extra_key = alt_expr(std::move(keys));
            extras = !is_nothing(extra_key);
          }
        } else if (pn.is_object() && string_only(pn)) {
          // Names constrained like a string value: exact for the extra keys when nothing is declared (no exclusion
          // needed), and for declared names by checking each one.
          std::string failing;
          for (const auto& p : props)
            if (failing.empty() && !string_schema_matches(pn, json_string_literal(p.name), path)) failing = p.name;
          if (!failing.empty()) {
            unsupported("propertyNames that excludes the declared property '" + failing + "'", path);
          } else if (extras && !props.empty()) {
            unsupported("propertyNames with both declared and additional properties", path);
          } else if (extras) {
            json as_string = pn;
            as_string["type"] = "string";
            extra_key = rule_expr(string_rule(as_string, path + "/propertyNames"));
          }
        } else {
          unsupported("propertyNames other than an enum/const or a string schema", path);
        }
      }
    }
    if (s.contains("minProperties") && s["minProperties"].get<double>() > static_cast<double>(num_required))
      unsupported("minProperties above the number of required properties (duplicate keys cannot be excluded)", path);
    // maxProperties: exact when every declared property is required (the optional part is then only the extras,
    // which a counted repetition bounds; a repeated key only lowers the real count).
    std::optional<int64_t> max_extra;
    if (s.contains("maxProperties")) {
      const double m = s["maxProperties"].get<double>();
      const bool all_required = num_required == props.size();
      if (m < static_cast<double>(num_required)) {
        if (all_required || !extras) return g_.add_rule(g_.fresh_name("object"), nothing_expr());
        unsupported("maxProperties that can bind", path);
      } else if (all_required) {
        if (extras) max_extra = static_cast<int64_t>(std::min(m, 1e6)) - static_cast<int64_t>(num_required);
      } else if (extras || m < static_cast<double>(props.size())) {
        unsupported("maxProperties that can bind (with optional properties)", path);
      }
    }

    int id = g_.declare_rule(g_.fresh_name("object"));
    ExprPtr sep = seq_expr({ws(), byte_expr(','), ws()});
    // Declared keys in any order when the set automaton stays small (no counted extras: those stay at the end).
    const bool any_order = !max_extra && !props.empty() && any_order_fits(props);
    const bool required_any_order =
        !any_order && !max_extra && opt_.any_order_max_properties > 0 && required_any_order_fits(props, num_required);
    std::vector<ExprPtr> kv;
    for (size_t i = 0; i < props.size(); ++i) {
      kv.push_back(seq_expr({literal_expr(json_string_literal(props[i].name)), ws(), byte_expr(':'), ws(),
                             value(*props[i].schema, path + "/properties/" + props[i].name)}));
      // The any-order rules refer to each member 2^(n-1) times: one rule per member, called from all of them.
      if ((any_order || required_any_order) && !is_nothing(kv.back()))
        kv.back() = rule_expr(g_.add_rule(g_.fresh_name(g_.rules()[id].name + "_m" + std::to_string(i)), kv.back()));
    }
    ExprPtr extra_kv = nothing_expr();
    if (extras && max_extra.value_or(1) > 0) {
      std::vector<std::string> names;
      for (const auto& p : props) names.push_back(p.name);
      ExprPtr v =
          value(*extra_value, path + (extra_value == additional ? "/additionalProperties" : "/patternProperties"));
      if (!is_nothing(v))
        extra_kv = seq_expr({extra_key ? extra_key : rule_expr(key_rule(names)), ws(), byte_expr(':'), ws(), v});
    }
    if (max_extra && !is_nothing(extra_kv)) {
      // With no declared property the first extra is emitted on its own (see below): the tail gets one less.
      const int64_t tail_max = props.empty() ? *max_extra - 1 : *max_extra;
      ExprPtr tail =
          tail_max > 0 ? repeat_expr(seq_expr({sep, extra_kv}), 0, static_cast<int>(tail_max)) : empty_expr();
      return finish_object(id, props, kv, sep, extra_kv, tail);
    }
    ExprPtr extras_tail = is_nothing(extra_kv) ? empty_expr() : star_expr(seq_expr({sep, extra_kv}));
    if (any_order) return finish_object_any_order(id, props, kv, sep, extra_kv, extras_tail);
    if (required_any_order) return finish_object_required_any_order(id, props, kv, sep, extra_kv, extras_tail);
    return finish_object(id, props, kv, sep, extra_kv, extras_tail);
  }

  // Objects too large for any order: the required keys may still come in any order when their sets, times the
  // positions among the optional keys, stay few (see finish_object_required_any_order).
  template <typename Prop>
  static bool required_any_order_fits(const std::vector<Prop>& props, size_t num_required) {
    if (num_required == 0 || num_required > kMaxTrackedRequired) return false;
    const size_t optional = props.size() - num_required;
    // Rules x alternatives per rule: the grammar's size.
    return (size_t{1} << num_required) * (optional + 1) * (props.size() + 2) <= kMaxTrackedAlternatives;
  }
  static constexpr size_t kMaxTrackedRequired = 8;
  static constexpr size_t kMaxTrackedAlternatives = 40000;

  // Required keys in any order, each once; optional keys in `properties` order relative to each other, each at
  // most once, anywhere between the required ones; extra members anywhere. The state after a member is
  // (S = required keys seen, p = optional keys before index p of the optional list are behind us):
  //   rest(S, p) = (sep extra)* ( sep req_i rest(S + i, p)        for required i not in S
  //                             | sep opt_j rest(S, j + 1)        for optional j >= p
  //                             | empty                           if S holds every required key ).
  // Exact for the language it accepts, which is a superset of `properties` order and a subset of the valid
  // objects: no declared key twice (required ones are tracked, optional ones strictly increase, extra keys exclude
  // declared names), every required key present. 2^r * (optional + 1) rules for r required keys (bounded by
  // required_any_order_fits), where any order for all n keys needs 2^n.
  template <typename Prop>
  int finish_object_required_any_order(int id, const std::vector<Prop>& props, const std::vector<ExprPtr>& kv,
                                       const ExprPtr& sep, const ExprPtr& extra_kv, const ExprPtr& extras_tail) {
    std::vector<size_t> req, opt;
    for (size_t i = 0; i < props.size(); ++i) (props[i].required ? req : opt).push_back(i);
    const size_t r = req.size(), u = opt.size();
    const uint32_t all = (uint32_t{1} << r) - 1;
    const std::string base = g_.rules()[id].name + "_q";
    // rest[S * (u + 1) + p]
    std::vector<int> rest((size_t{1} << r) * (u + 1));
    for (uint32_t seen = 0; seen <= all; ++seen)
      for (size_t p = 0; p <= u; ++p)
        rest[seen * (u + 1) + p] =
            g_.declare_rule(g_.fresh_name(base + std::to_string(seen) + "_" + std::to_string(p)));
    auto at = [&](uint32_t seen, size_t p) { return rule_expr(rest[seen * (u + 1) + p]); };
    for (uint32_t seen = 0; seen <= all; ++seen)
      for (size_t p = 0; p <= u; ++p) {
        std::vector<ExprPtr> members;
        for (size_t k = 0; k < r; ++k)
          if (!(seen >> k & 1)) members.push_back(seq_expr({kv[req[k]], at(seen | uint32_t{1} << k, p)}));
        for (size_t j = p; j < u; ++j) members.push_back(seq_expr({kv[opt[j]], at(seen, j + 1)}));
        ExprPtr next = members.empty() ? nothing_expr() : seq_expr({sep, alt_expr(std::move(members))});
        if (seen == all) next = alt_expr({next, empty_expr()});
        g_.define_rule(rest[seen * (u + 1) + p], seq_expr({extras_tail, next}));
      }
    // The first member carries no separator (r >= 1: the object is never empty).
    std::vector<ExprPtr> firsts;
    for (size_t k = 0; k < r; ++k) firsts.push_back(seq_expr({kv[req[k]], at(uint32_t{1} << k, 0)}));
    for (size_t j = 0; j < u; ++j) firsts.push_back(seq_expr({kv[opt[j]], at(0, j + 1)}));
    if (!is_nothing(extra_kv)) firsts.push_back(seq_expr({extra_kv, at(0, 0)}));
    g_.define_rule(id, seq_expr({byte_expr('{'), ws(), alt_expr(std::move(firsts)), ws(), byte_expr('}')}));
    return id;
  }

  // The any-order construction has one rule per set of seen declared keys (2^n), each a few states (the members
  // are calls): bounded by the property count.
  template <typename Prop>
  bool any_order_fits(const std::vector<Prop>& props) const {
    return static_cast<int>(props.size()) <= std::min(opt_.any_order_max_properties, kMaxAnyOrderProperties);
  }
  static constexpr int kMaxAnyOrderProperties = 16;

  // Declared properties in any order, each at most once, every required one present; extra members (keys that
  // are no declared name) anywhere between them. With member_i = "name_i" ws : ws value_i (a rule) and S = the
  // declared keys seen so far,
  //   rest(S) = (sep extra)* ( sep member_i rest(S + i)  for i not in S  |  empty if S holds every required key ).
  // Exact: a sentence is a permutation of a subset of the members containing the required ones, with extras
  // interleaved, and every such object is a sentence (no declared key twice: extra keys exclude declared names).
  // After a separator the parser holds one stack per unseen member until the key's bytes tell them apart; the
  // members' mask entries are shared by every position.
  template <typename Prop>
  int finish_object_any_order(int id, const std::vector<Prop>& props, const std::vector<ExprPtr>& kv,
                              const ExprPtr& sep, const ExprPtr& extra_kv, const ExprPtr& extras_tail) {
    const size_t n = props.size();
    uint32_t required = 0;
    for (size_t i = 0; i < n; ++i)
      if (props[i].required) required |= uint32_t{1} << i;
    const std::string base = g_.rules()[id].name + "_r";
    std::vector<int> rest(size_t{1} << n, -1);
    auto define_rest = [&](uint32_t seen) {
      std::vector<ExprPtr> members;
      for (size_t i = 0; i < n; ++i)
        if (!(seen >> i & 1)) members.push_back(seq_expr({kv[i], rule_expr(rest[seen | uint32_t{1} << i])}));
      ExprPtr next = seq_expr({sep, alt_expr(std::move(members))});
      if ((seen & required) == required) next = alt_expr({next, empty_expr()});
      // Names derived from the object's (unique) name: fresh_name("object_rest") would probe every earlier one.
      rest[seen] = g_.add_rule(g_.fresh_name(base + std::to_string(seen)), seq_expr({extras_tail, next}));
    };
    // Sets in decreasing order, so rest(S + i) exists when rest(S) is built.
    for (uint32_t seen = (uint32_t{1} << n); seen-- > 1;) define_rest(seen);
    // The first member carries no separator; with extras first, the seen set is still empty.
    std::vector<ExprPtr> firsts;
    if (required == 0) firsts.push_back(empty_expr());
    for (size_t i = 0; i < n; ++i) firsts.push_back(seq_expr({kv[i], rule_expr(rest[uint32_t{1} << i])}));
    if (!is_nothing(extra_kv)) {
      define_rest(0);
      firsts.push_back(seq_expr({extra_kv, rule_expr(rest[0])}));
    }
    g_.define_rule(id, seq_expr({byte_expr('{'), ws(), alt_expr(std::move(firsts)), ws(), byte_expr('}')}));
    return id;
  }

  template <typename Prop>
  int finish_object(int id, const std::vector<Prop>& props, const std::vector<ExprPtr>& kv, const ExprPtr& sep,
                    const ExprPtr& extra_kv, const ExprPtr& extras_tail) {
    ExprPtr body;
    size_t first_req = props.size();
    for (size_t i = 0; i < props.size(); ++i)
      if (props[i].required) {
        first_req = i;
        break;
      }
    if (first_req < props.size()) {
      // Optional properties before the first required one each carry their own trailing comma.
      std::vector<ExprPtr> items;
      for (size_t i = 0; i < first_req; ++i) items.push_back(opt_expr(seq_expr({kv[i], sep})));
      items.push_back(kv[first_req]);
      for (size_t i = first_req + 1; i < props.size(); ++i) {
        ExprPtr item = seq_expr({sep, kv[i]});
        items.push_back(props[i].required ? item : opt_expr(item));
      }
      items.push_back(extras_tail);
      body = seq_expr(std::move(items));
    } else {
      // Nothing required: the first emitted member has no comma. tail[i] = the members after i, as rules
      // chained right to left so the grammar stays linear in the number of properties.
      std::vector<ExprPtr> tail(props.size() + 1);
      tail[props.size()] = extras_tail;
      for (size_t i = props.size(); i-- > 0;) {
        ExprPtr t = seq_expr({opt_expr(seq_expr({sep, kv[i]})), tail[i + 1]});
        if (props.size() - i > 4) t = rule_expr(g_.add_rule(g_.fresh_name("object_tail"), t));
        tail[i] = t;
      }
      std::vector<ExprPtr> firsts{empty_expr()};
      for (size_t i = 0; i < props.size(); ++i) firsts.push_back(seq_expr({kv[i], tail[i + 1]}));
      if (!is_nothing(extra_kv)) firsts.push_back(seq_expr({extra_kv, extras_tail}));
      body = alt_expr(std::move(firsts));
    }
    g_.define_rule(id, seq_expr({byte_expr('{'), ws(), body, ws(), byte_expr('}')}));
    return id;
  }

  // Does `text` (bytes) match `e` exactly? For compile-time checks of property names against key patterns.
  static bool expr_matches(const ExprPtr& e, const std::string& text) {
    Grammar g;
    g.set_root(g.add_rule("root", e));
    try {
      GrammarMatcher m(CompiledGrammar::compile(g));
      return m.accept_bytes(text) && m.can_terminate();
    } catch (const Error&) {
      return false;  // matches nothing
    }
  }

  // A schema whose keywords all constrain strings (so it can describe property names).
  static bool string_only(const json& s) {
    for (auto it = s.begin(); it != s.end(); ++it) {
      const std::string& k = it.key();
      if (is_annotation_keyword(k) || k == "pattern" || k == "minLength" || k == "maxLength" || k == "format") continue;
      if (k == "type" && it.value() == "string") continue;
      return false;
    }
    return true;
  }

  // Does the JSON string literal `quoted` satisfy the string schema `s`? Built in a throwaway compiler.
  bool string_schema_matches(const json& s, const std::string& quoted, const std::string& path) {
    json as_string = s;
    as_string["type"] = "string";
    JsonSchemaOptions o = opt_;
    o.lenient = false;
    try {
      SchemaCompiler sub(as_string, o);
      Grammar g = sub.run().grammar;
      GrammarMatcher m(CompiledGrammar::compile(g));
      return m.accept_bytes(quoted) && m.can_terminate();
    } catch (const Error&) {
      unsupported("propertyNames that cannot be checked", path);
      return true;
    }
  }

  // The escapes that leave the names' trie at a node whose names continue with `next` (printable ASCII, never
  // '"' or '\\'). An escaped spelling of a `next` character must not leave - `{"\u0061": ...}` would pass as an
  // extra key beside a declared "a" (a duplicate, or a value checked against the wrong schema) - so inside the trie
  // only escapes of characters that no name has leave: the short escapes (`\/` unless '/' continues a name) and
  // `\uXXXX` from U+0080 up. `\u0000`-`\u007F` are refused there (false negatives only; declared keys are matched
  // in their canonical spelling, and escapes after the key has left the trie are free). One shape for every node
  // but `\/`: node-specific classes of hex digits made the key rules' DFAs ~2x costlier to build.
  static ExprPtr escape_leaving(const std::set<unsigned char>& next) {
    auto hex_from = [](char first) {  // hex digits from `first` ('0'-'9') up, either case
      ByteSet s = ByteSet::range(static_cast<uint8_t>(first), '9');
      s.set_range('a', 'f');
      s.set_range('A', 'F');
      return s;
    };
    const ByteSet hex = hex_from('0'), hex_from_1 = hex_from('1'), hex_from_8 = hex_from('8');
    ByteSet simple;
    for (char c : std::string("\"\\bfnrt")) simple.set(static_cast<uint8_t>(c));
    if (!next.count('/')) simple.set('/');
    // U+0080 and up, factored so that the paths share their tails: (d1 != 0 hex | 0 d2 != 0) hex hex | 00 [8-f] hex.
    ExprPtr u = alt_expr({seq_expr({alt_expr({seq_expr({bytes_expr(hex_from_1), bytes_expr(hex)}),
                                              seq_expr({byte_expr('0'), bytes_expr(hex_from_1)})}),
                                    bytes_expr(hex), bytes_expr(hex)}),
                          seq_expr({literal_expr("00"), bytes_expr(hex_from_8), bytes_expr(hex)})});
    return seq_expr({byte_expr('\\'), alt_expr({bytes_expr(simple), seq_expr({byte_expr('u'), u})})});
  }

  // A JSON string that is none of `names` (ASCII names that need no escaping).
  int key_rule(const std::vector<std::string>& names) {
    std::string key = "key:";
    for (const auto& n : names) key += json_string_literal(n);
    return cached_rule(key, "key", [&] {
      // Once a key has left the trie of names, the rest is any string: one shared rule, not a copy per node.
      int rest = cached_rule("key_rest", "key_rest", [&] {
        return seq_expr({star_expr(json_char()), byte_expr('"')});
      });
      // Trie over the names; at each node: end here (if not a name), follow a name, or leave the trie.
      std::function<ExprPtr(const std::string&)> node = [&](const std::string& prefix) -> ExprPtr {
        std::set<unsigned char> next;
        bool is_name = false;
        for (const auto& n : names) {
          if (n.size() >= prefix.size() && n.compare(0, prefix.size(), prefix) == 0) {
            if (n.size() == prefix.size())
              is_name = true;
            else
              next.insert(static_cast<unsigned char>(n[prefix.size()]));
          }
        }
        std::vector<ExprPtr> alts;
        if (!is_name) alts.push_back(byte_expr('"'));
        for (unsigned char c : next) alts.push_back(seq_expr({byte_expr(c), node(prefix + static_cast<char>(c))}));
        CodepointRanges leave = {{0x20, 0x21}, {0x23, 0x5B}, {0x5D, kMaxCodepoint}};
        CodepointRanges excluded;
        for (unsigned char c : next) excluded.emplace_back(c, c);
        CodepointRanges allowed;
        for (auto [lo, hi] : complement_ranges(excluded))
          for (auto [a, b] : leave) {
            uint32_t x = std::max(lo, a), y = std::min(hi, b);
            if (x <= y) allowed.emplace_back(x, y);
          }
        alts.push_back(seq_expr({alt_expr({utf8_ranges_expr(allowed), escape_leaving(next)}), rule_expr(rest)}));
        return alt_expr(std::move(alts));
      };
      return seq_expr({byte_expr('"'), node("")});
    });
  }

  // ---- arrays ---------------------------------------------------------------------------------------------
  int array_rule(const json& s, const std::string& path) {
    std::vector<const json*> prefix;
    static const json kTrue = true;
    const json* rest = &kTrue;
    if (s.contains("prefixItems")) {
      for (const auto& p : s["prefixItems"]) prefix.push_back(&p);
      if (s.contains("items")) rest = &s["items"];
    } else if (s.contains("items") && s["items"].is_array()) {  // draft-04..2019 tuple form
      for (const auto& p : s["items"]) prefix.push_back(&p);
      if (s.contains("additionalItems")) rest = &s["additionalItems"];
    } else if (s.contains("items")) {
      rest = &s["items"];
    }
    int min_items = count_keyword(s, "minItems", 0, path);
    int max_items = count_keyword(s, "maxItems", Expr::kUnbounded, path);
    int id = g_.declare_rule(g_.fresh_name("array"));
    ExprPtr sep = seq_expr({ws(), byte_expr(','), ws()});
    ExprPtr rest_item = value(*rest, path + "/items");
    const int k = static_cast<int>(prefix.size());
    // After the prefix: (sep item){lo, hi}.
    int rest_lo = std::max(0, min_items - k);
    int rest_hi = max_items == Expr::kUnbounded ? Expr::kUnbounded : std::max(0, max_items - k);
    ExprPtr after_prefix = is_nothing(rest_item) ? (rest_lo == 0 ? empty_expr() : nothing_expr())
                                                 : repeat_expr(seq_expr({sep, rest_item}), rest_lo, rest_hi);
    ExprPtr body;
    if (k == 0) {
      if (is_nothing(rest_item) || max_items == 0) {
        body = min_items == 0 ? empty_expr() : nothing_expr();
      } else {
        int lo = std::max(0, min_items - 1);
        int hi = max_items == Expr::kUnbounded ? Expr::kUnbounded : max_items - 1;
        ExprPtr list = seq_expr({rest_item, repeat_expr(seq_expr({sep, rest_item}), lo, hi)});
        body = min_items == 0 ? opt_expr(list) : list;
      }
    } else {
      // e(i) = p_i (sep e(i+1))  with the tail optional once minItems is met and cut at maxItems.
      int limit = max_items == Expr::kUnbounded ? k : std::min(k, max_items);
      ExprPtr tail = limit == k ? after_prefix : empty_expr();
      for (int i = limit - 1; i >= 0; --i) {
        ExprPtr item = value(*prefix[i], path + "/prefixItems/" + std::to_string(i));
        ExprPtr next = i + 1 < limit ? seq_expr({sep, tail}) : tail;
        if (i + 1 < limit && i + 1 >= min_items) next = opt_expr(next);
        tail = seq_expr({item, next});
      }
      body = min_items == 0 ? opt_expr(tail) : tail;
    }
    g_.define_rule(id, seq_expr({byte_expr('['), ws(), body, ws(), byte_expr(']')}));
    return id;
  }

  const json& root_;
  bool integer_without_fraction_ = false;
  bool ref_siblings_ignored_ = false;
  JsonSchemaOptions opt_;
  Grammar g_;
  std::vector<std::string> warnings_;
  bool stricter_oneof_ = false;  // some oneOf branch rejects more than the schema does (see the warnings)
  std::set<std::string> warned_;
  std::map<std::string, int> ref_rules_;
  std::map<std::string, int> rule_cache_;
  std::map<std::string, const json*> anchors_, ids_;
  int any_rule_ = -1;
  int ws_rule_ = -1;
  int depth_ = 0;
};

}  // namespace

JsonSchemaGrammar json_schema_to_grammar(const nlohmann::ordered_json& schema, const JsonSchemaOptions& options) {
  try {
    SchemaCompiler compiler(schema, options);
    return compiler.run();
  } catch (const nlohmann::json::exception& e) {
    // A keyword with a value of the wrong JSON type (e.g. "minLength": "3").
    DI_FAIL(ErrorCode::kInvalidArgument) << "JSON Schema: malformed keyword value: " << e.what();
  }
}

JsonSchemaGrammar json_schema_to_grammar(std::string_view schema_text, const JsonSchemaOptions& options) {
  nlohmann::ordered_json schema;
  try {
    schema = nlohmann::ordered_json::parse(schema_text);
  } catch (const nlohmann::json::exception& e) {
    DI_FAIL(ErrorCode::kInvalidArgument) << "JSON Schema is not valid JSON: " << e.what();
  }
  return json_schema_to_grammar(schema, options);
}

Grammar any_json_grammar(const JsonSchemaOptions& options) {
  static const nlohmann::ordered_json kEmpty = nlohmann::ordered_json::object();
  SchemaCompiler compiler(kEmpty, options);
  return compiler.any_grammar();
}

}  // namespace deepinfer::structured
