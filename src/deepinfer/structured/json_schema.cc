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
#include "deepinfer/structured/json_schema_compiler.h"
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

}  // namespace

namespace json_internal {
bool is_validation_keyword(std::string_view key) {
  return kSupported.count(key) > 0 || kStandardUnsupported.count(key) > 0;
}

SchemaCompiler::SchemaCompiler(const json& root, const JsonSchemaOptions& options) : root_(root), opt_(options) {
  index_ids(root_, "#");
  // Drafts 3 and 4 define an integer as a number "without a fraction or exponent part": 1.0 is not one there
  // (from draft 6 on it is). maskbench labels follow the declared draft.
  if (root_.is_object() && root_.contains("$schema") && root_["$schema"].is_string()) {
    const std::string d = root_["$schema"].get<std::string>();
    integer_without_fraction_ = d.find("draft-04") != std::string::npos || d.find("draft-03") != std::string::npos;
    // Up to draft 7, keywords next to $ref are ignored; this compiler merges them (stricter, so harmless for a
    // plain schema), which would make oneOf's disjointness proofs and negations unsound: see exact_one_of.
    ref_siblings_ignored_ =
        integer_without_fraction_ || d.find("draft-06") != std::string::npos || d.find("draft-07") != std::string::npos;
  }
}

JsonSchemaGrammar SchemaCompiler::run() {
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

Grammar SchemaCompiler::any_grammar() {
  int root_rule = g_.declare_rule("root");
  g_.set_root(root_rule);
  g_.define_rule(root_rule, seq_expr({ws(), rule_expr(any_value_rule()), ws()}));
  return std::move(g_);
}

ExprPtr SchemaCompiler::ws() {
  ByteSet s;
  for (char c : std::string(" \t\n\r")) s.set(static_cast<uint8_t>(c));
  if (opt_.max_whitespace == 0) return empty_expr();
  if (opt_.max_whitespace < 0) return star_expr(bytes_expr(s));
  if (ws_rule_ < 0) ws_rule_ = g_.add_rule(g_.fresh_name("ws"), repeat_expr(bytes_expr(s), 0, opt_.max_whitespace));
  return rule_expr(ws_rule_);
}

ExprPtr SchemaCompiler::json_char() {
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

ExprPtr SchemaCompiler::counted_json_char() {
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

int SchemaCompiler::cached_rule(const std::string& key, const std::string& name, const std::function<ExprPtr()>& body) {
  auto it = rule_cache_.find(key);
  if (it != rule_cache_.end()) return it->second;
  int id = g_.declare_rule(g_.fresh_name(name));
  rule_cache_[key] = id;
  g_.define_rule(id, body());
  return id;
}

int SchemaCompiler::any_value_rule() {
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

void SchemaCompiler::index_ids(const json& s, const std::string& path) {
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

std::string SchemaCompiler::percent_decode(const std::string& s) {
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

const json& SchemaCompiler::resolve(const std::string& ref, const std::string& path) {
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

json SchemaCompiler::inline_ref(const json& s, const std::string& path) {
  json cur = s;
  for (int hops = 0; cur.is_object() && cur.contains("$ref"); ++hops) {
    DI_CHECK_CODE(hops < 32, ErrorCode::kUnsupported) << "JSON Schema: $ref chain too long at " << path;
    json target = resolve(cur["$ref"].get<std::string>(), path);
    cur.erase("$ref");
    cur = merge_schemas(cur, target);
  }
  return cur;
}

ExprPtr SchemaCompiler::value(const json& s, const std::string& path) {
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

std::optional<ExprPtr> SchemaCompiler::exact_one_of(const json& base, const json& branches, const std::string& path) {
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

json SchemaCompiler::apply_alternative(const json& c, const json& alt) {
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

bool SchemaCompiler::types_disjoint(const json& branches) {
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
  return all.size() == total && (!mixed || std::all_of(all.begin(), all.end(),
                                                       [](const std::string& x) { return x.rfind("const:", 0) != 0; }));
}

int SchemaCompiler::ref_rule(const std::string& ref, const std::string& path) {
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

void SchemaCompiler::check_keywords(const json& s, const std::string& path) {
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

std::vector<std::string> SchemaCompiler::allowed_types(const json& s, const std::string& path) {
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

bool SchemaCompiler::type_allows(const std::vector<std::string>& types, const json& v) {
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

ExprPtr SchemaCompiler::literal(const json& v) {
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

int SchemaCompiler::count_keyword(const json& s, const char* key, int absent, const std::string& path) {
  if (!s.contains(key)) return absent;
  const json& v = s[key];
  const double d = v.is_number() ? v.get<double>() : -1.0;
  DI_CHECK(v.is_number() && d >= 0 && d < 2147483647.0 && std::floor(d) == d)
      << "JSON Schema: '" << key << "' at " << path << " must be a non-negative integer below 2^31, got " << v.dump();
  return static_cast<int>(d);
}

int SchemaCompiler::string_rule(const json& s, const std::string& path) {
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
    unsupported("minLength/maxLength above " + std::to_string(kMaxLengthWithPattern) + " together with pattern/format",
                path);
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

int SchemaCompiler::number_rule(const json& s, bool integer, const std::string& path) {
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

int SchemaCompiler::array_rule(const json& s, const std::string& path) {
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

}  // namespace json_internal

JsonSchemaGrammar json_schema_to_grammar(const nlohmann::ordered_json& schema, const JsonSchemaOptions& options) {
  try {
    json_internal::SchemaCompiler compiler(schema, options);
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
  json_internal::SchemaCompiler compiler(kEmpty, options);
  return compiler.any_grammar();
}

}  // namespace deepinfer::structured
