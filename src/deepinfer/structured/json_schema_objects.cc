// The JSON Schema compiler's objects (json_schema_compiler.h): properties, required keys, additional and pattern
// properties, property names, and the orders in which members may come.
#include <algorithm>
#include <map>
#include <set>

#include "deepinfer/structured/compiled_grammar.h"
#include "deepinfer/structured/grammar_matcher.h"
#include "deepinfer/structured/json_schema_compiler.h"
#include "deepinfer/structured/regex.h"

namespace deepinfer::structured::json_internal {

int SchemaCompiler::object_rule(const json& s, const std::string& path) {
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
    ExprPtr tail = tail_max > 0 ? repeat_expr(seq_expr({sep, extra_kv}), 0, static_cast<int>(tail_max)) : empty_expr();
    return finish_object(id, props, kv, sep, extra_kv, tail);
  }
  ExprPtr extras_tail = is_nothing(extra_kv) ? empty_expr() : star_expr(seq_expr({sep, extra_kv}));
  if (any_order) return finish_object_any_order(id, props, kv, sep, extra_kv, extras_tail);
  if (required_any_order) return finish_object_required_any_order(id, props, kv, sep, extra_kv, extras_tail);
  return finish_object(id, props, kv, sep, extra_kv, extras_tail);
}

template <typename Prop>
bool SchemaCompiler::required_any_order_fits(const std::vector<Prop>& props, size_t num_required) {
  if (num_required == 0 || num_required > kMaxTrackedRequired) return false;
  const size_t optional = props.size() - num_required;
  // Rules x alternatives per rule: the grammar's size.
  return (size_t{1} << num_required) * (optional + 1) * (props.size() + 2) <= kMaxTrackedAlternatives;
}

template <typename Prop>
int SchemaCompiler::finish_object_required_any_order(int id, const std::vector<Prop>& props,
                                                     const std::vector<ExprPtr>& kv, const ExprPtr& sep,
                                                     const ExprPtr& extra_kv, const ExprPtr& extras_tail) {
  std::vector<size_t> req, opt;
  for (size_t i = 0; i < props.size(); ++i) (props[i].required ? req : opt).push_back(i);
  const size_t r = req.size(), u = opt.size();
  const uint32_t all = (uint32_t{1} << r) - 1;
  const std::string base = g_.rules()[id].name + "_q";
  // rest[S * (u + 1) + p]
  std::vector<int> rest((size_t{1} << r) * (u + 1));
  for (uint32_t seen = 0; seen <= all; ++seen)
    for (size_t p = 0; p <= u; ++p)
      rest[seen * (u + 1) + p] = g_.declare_rule(g_.fresh_name(base + std::to_string(seen) + "_" + std::to_string(p)));
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

template <typename Prop>
bool SchemaCompiler::any_order_fits(const std::vector<Prop>& props) const {
  return static_cast<int>(props.size()) <= std::min(opt_.any_order_max_properties, kMaxAnyOrderProperties);
}

template <typename Prop>
int SchemaCompiler::finish_object_any_order(int id, const std::vector<Prop>& props, const std::vector<ExprPtr>& kv,
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
int SchemaCompiler::finish_object(int id, const std::vector<Prop>& props, const std::vector<ExprPtr>& kv,
                                  const ExprPtr& sep, const ExprPtr& extra_kv, const ExprPtr& extras_tail) {
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

bool SchemaCompiler::expr_matches(const ExprPtr& e, const std::string& text) {
  Grammar g;
  g.set_root(g.add_rule("root", e));
  try {
    GrammarMatcher m(CompiledGrammar::compile(g));
    return m.accept_bytes(text) && m.can_terminate();
  } catch (const Error&) {
    return false;  // matches nothing
  }
}

bool SchemaCompiler::string_only(const json& s) {
  for (auto it = s.begin(); it != s.end(); ++it) {
    const std::string& k = it.key();
    if (is_annotation_keyword(k) || k == "pattern" || k == "minLength" || k == "maxLength" || k == "format") continue;
    if (k == "type" && it.value() == "string") continue;
    return false;
  }
  return true;
}

bool SchemaCompiler::string_schema_matches(const json& s, const std::string& quoted, const std::string& path) {
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

ExprPtr SchemaCompiler::escape_leaving(const std::set<unsigned char>& next) {
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

int SchemaCompiler::key_rule(const std::vector<std::string>& names) {
  std::string key = "key:";
  for (const auto& n : names) key += json_string_literal(n);
  return cached_rule(key, "key", [&] {
    // Once a key has left the trie of names, the rest is any string: one shared rule, not a copy per node.
    int rest = cached_rule("key_rest", "key_rest", [&] { return seq_expr({star_expr(json_char()), byte_expr('"')}); });
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

}  // namespace deepinfer::structured::json_internal
