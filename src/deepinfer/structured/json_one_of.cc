// Exact oneOf: disjointness proofs between branches, and the negation of simple branches (json_schema_internal.h).
//
// Soundness argument used throughout: every keyword of a schema object is a conjunct, so any subset of a schema's
// keywords is a weaker schema. Proving that the weaker forms of A and B have no common instance proves it for A and
// B; the proofs below only ever drop keywords (or read one property's schema), never add any.
#include <algorithm>
#include <set>

#include "deepinfer/core/error.h"
#include "deepinfer/structured/json_schema_internal.h"

namespace deepinfer::structured::json_internal {
namespace {

using json = nlohmann::ordered_json;

const std::vector<std::string> kKinds = {"object", "array", "string", "number", "boolean", "null"};

std::string kind_of(const json& v) {
  if (v.is_object()) return "object";
  if (v.is_array()) return "array";
  if (v.is_string()) return "string";
  if (v.is_number()) return "number";
  if (v.is_boolean()) return "boolean";
  return "null";
}

// The JSON kinds (integer counted as number) a schema admits, from `type`, `const` and `enum` only.
std::set<std::string> kinds_of(const json& s) {
  std::set<std::string> all(kKinds.begin(), kKinds.end());
  if (s.is_boolean()) return s.get<bool>() ? all : std::set<std::string>{};
  if (!s.is_object()) return all;
  std::set<std::string> k = all;
  auto narrow = [&](const std::set<std::string>& by) {
    std::set<std::string> out;
    for (const auto& x : k)
      if (by.count(x)) out.insert(x);
    k = std::move(out);
  };
  if (s.contains("type")) {
    std::set<std::string> t;
    for (const auto& x : s["type"].is_array() ? s["type"] : json::array({s["type"]})) {
      if (!x.is_string()) return all;  // malformed: the compiler reports it
      t.insert(x == "integer" ? std::string("number") : x.get<std::string>());
    }
    narrow(t);
  }
  if (s.contains("const")) narrow({kind_of(s["const"])});
  if (s.contains("enum") && s["enum"].is_array()) {
    std::set<std::string> t;
    for (const auto& v : s["enum"]) t.insert(kind_of(v));
    narrow(t);
  }
  return k;
}

// Could two constants be the same JSON Schema value? Numbers compare by value (1 == 1.0); containers are assumed
// equal (their numbers could be spelled differently), which only weakens the proofs.
bool possibly_equal(const json& x, const json& y) {
  if (x.is_number() && y.is_number()) return x.get<double>() == y.get<double>();
  if (kind_of(x) != kind_of(y)) return false;
  if (x.is_structured()) return true;
  return x == y;
}

std::optional<std::vector<json>> finite_values(const json& s) {
  if (!s.is_object()) return std::nullopt;
  if (s.contains("const")) return std::vector<json>{s["const"]};
  if (s.contains("enum") && s["enum"].is_array()) return std::vector<json>(s["enum"].begin(), s["enum"].end());
  return std::nullopt;
}

// The schema a member `k` of an instance of `s` must satisfy (weakened where patternProperties could apply).
json member_schema(const json& s, const std::string& k) {
  if (s.contains("properties") && s["properties"].is_object() && s["properties"].contains(k)) return s["properties"][k];
  if (s.contains("patternProperties") && !s["patternProperties"].empty()) return true;
  if (s.contains("additionalProperties")) return s["additionalProperties"];
  return true;
}

bool disjoint(const json& a0, const json& b0, const RefInliner& inline_ref, int depth);

// Every instance of `a` (an object) has a member that no instance of `b` can have.
bool object_excludes(const json& a, const json& b, const RefInliner& inline_ref, int depth) {
  if (!a.contains("required") || !a["required"].is_array()) return false;
  for (const auto& r : a["required"]) {
    if (!r.is_string()) continue;
    const std::string k = r.get<std::string>();
    if (disjoint(member_schema(a, k), member_schema(b, k), inline_ref, depth + 1)) return true;
  }
  return false;
}

bool disjoint(const json& a0, const json& b0, const RefInliner& inline_ref, int depth) {
  if (depth > 8) return false;
  json a, b;
  try {
    a = inline_ref(a0);
    b = inline_ref(b0);
  } catch (const Error&) {
    return false;
  }
  if ((a.is_boolean() && !a.get<bool>()) || (b.is_boolean() && !b.get<bool>())) return true;
  if (!a.is_object() || !b.is_object()) return false;
  const std::set<std::string> ka = kinds_of(a), kb = kinds_of(b);
  std::set<std::string> common;
  for (const auto& x : ka)
    if (kb.count(x)) common.insert(x);
  if (common.empty()) return true;
  const auto va = finite_values(a), vb = finite_values(b);
  auto outside = [](const std::vector<json>& vals, const std::set<std::string>& kinds) {
    return std::all_of(vals.begin(), vals.end(), [&](const json& v) { return !kinds.count(kind_of(v)); });
  };
  if ((va && outside(*va, kb)) || (vb && outside(*vb, ka))) return true;
  if (va && vb) {
    bool meet = false;
    for (const auto& x : *va)
      for (const auto& y : *vb) meet |= possibly_equal(x, y);
    if (!meet) return true;
  }
  if (common == std::set<std::string>{"object"})
    return object_excludes(a, b, inline_ref, depth) || object_excludes(b, a, inline_ref, depth);
  return false;
}

// The kinds outside a `type` value, as a `type` value; nullopt when it cannot be written (integer without number:
// "a number with a fraction" is not a type).
std::optional<json> type_complement(const json& t) {
  std::set<std::string> in;
  for (const auto& x : t.is_array() ? t : json::array({t})) {
    if (!x.is_string()) return std::nullopt;
    in.insert(x.get<std::string>());
  }
  if (in.count("integer") && !in.count("number")) return std::nullopt;
  json out = json::array();
  for (const auto& k : kKinds)
    if (!in.count(k)) out.push_back(k);
  return out;
}

bool trivially_true(const json& s) {
  if (s.is_boolean()) return s.get<bool>();
  if (!s.is_object()) return false;
  for (auto it = s.begin(); it != s.end(); ++it)
    if (!is_annotation_keyword(it.key()) && is_validation_keyword(it.key())) return false;
  return true;
}

}  // namespace

bool schemas_disjoint(const json& a, const json& b, const RefInliner& inline_ref) {
  return disjoint(a, b, inline_ref, 0);
}

static std::vector<json> negate(const json& b0, const json& context, const RefInliner& inline_ref, bool* approximate,
                                int depth) {
  json b;
  try {
    b = inline_ref(b0);
  } catch (const Error&) {
    *approximate = true;
    return {};
  }
  if (b.is_boolean()) {
    if (b.get<bool>()) return {};  // not(true): nothing
    return {json(true)};
  }
  if (!b.is_object()) {
    *approximate = true;
    return {};
  }
  std::vector<json> members;  // alternatives that apply to objects only
  std::optional<json> not_type;
  bool allows_objects = true;
  for (auto it = b.begin(); it != b.end(); ++it) {
    const std::string& k = it.key();
    const json& v = it.value();
    if (is_annotation_keyword(k) || !is_validation_keyword(k)) continue;
    if (k == "type") {
      not_type = type_complement(v);
      if (!not_type) {
        *approximate = true;  // integer without number: non-integral numbers are left out
        continue;
      }
      allows_objects = std::find(not_type->begin(), not_type->end(), "object") == not_type->end();
    } else if (k == "required" && v.is_array()) {
      for (const auto& r : v)
        if (r.is_string()) members.push_back(json{{"type", "object"}, {"properties", {{r.get<std::string>(), false}}}});
    } else if (k == "properties" && v.is_object()) {
      for (auto p = v.begin(); p != v.end(); ++p) {
        json ps;
        try {
          ps = inline_ref(p.value());
        } catch (const Error&) {
          *approximate = true;
          continue;
        }
        if (trivially_true(ps)) continue;
        std::vector<json> bad_values;
        bool type_only = ps.is_object() && ps.contains("type");
        if (ps.is_object())
          for (auto q = ps.begin(); q != ps.end(); ++q)
            type_only &= q.key() == "type" || is_annotation_keyword(q.key()) || !is_validation_keyword(q.key());
        const json member = member_schema(context, p.key());
        if (ps.is_boolean()) {
          bad_values.push_back(true);  // properties {k: false}: not(b) has k present with any value
        } else if (type_only && type_complement(ps["type"])) {
          const json c = *type_complement(ps["type"]);
          if (c.empty()) continue;
          bad_values.push_back(json{{"type", c}});
        } else if (schemas_disjoint(member, ps, inline_ref)) {
          bad_values.push_back(true);  // in this context every value of the member already fails ps
        } else if (depth < 3) {
          bad_values = negate(ps, member, inline_ref, approximate, depth + 1);  // present, and failing ps
        } else {
          *approximate = true;  // "present with a value outside ps" is not written this deep: left out
          continue;
        }
        for (json& bad : bad_values)
          members.push_back(
              json{{"type", "object"}, {"required", {p.key()}}, {"properties", {{p.key(), std::move(bad)}}}});
      }
    } else {
      *approximate = true;  // a keyword whose failure cannot be written: instances failing only by it are left out
    }
  }
  std::vector<json> out;
  if (not_type && !not_type->empty()) out.push_back(json{{"type", *not_type}});
  if (allows_objects)
    for (auto& m : members) out.push_back(std::move(m));
  return out;
}

std::vector<json> negate_schema(const json& b, const json& context, const RefInliner& inline_ref, bool* approximate) {
  return negate(b, context, inline_ref, approximate, 0);
}

}  // namespace deepinfer::structured::json_internal
