// The JSON Schema front end's compiler (internal to json_schema.cc and json_schema_objects.cc, which define its
// members): a schema's keywords to the rules of one grammar, with $ref resolution, exact oneOf and the warnings of
// lenient mode.
#pragma once

#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "deepinfer/core/error.h"
#include "deepinfer/structured/grammar.h"
#include "deepinfer/structured/json_schema.h"
#include "deepinfer/structured/json_schema_internal.h"

namespace deepinfer::structured::json_internal {

using json = nlohmann::ordered_json;

// s as a JSON string literal (quoted, escaped).
inline std::string json_string_literal(const std::string& s) { return json(s).dump(); }

class SchemaCompiler {
 public:
  SchemaCompiler(const json& root, const JsonSchemaOptions& options);

  JsonSchemaGrammar run();

  Grammar any_grammar();

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
  ExprPtr ws();

  // One character of a JSON string: raw, a short escape or any `\uXXXX` (one automaton for every string; a
  // surrogate pair counts as two characters here - see docs/STRUCTURED.md "What is left").
  ExprPtr json_char();

  // One character as JSON Schema counts it (a code point after decoding): a surrogate pair `\uD83D\uDE00` is one;
  // a lone high surrogate is refused (were it one character, the pair would also parse as two); a lone low
  // surrogate is one. Refusing lone high surrogates costs false negatives only.
  ExprPtr counted_json_char();

  int cached_rule(const std::string& key, const std::string& name, const std::function<ExprPtr()>& body);

  int any_value_rule();

  // ---- $ref -----------------------------------------------------------------------------------------------
  void index_ids(const json& s, const std::string& path);

  static std::string percent_decode(const std::string& s);

  const json& resolve(const std::string& ref, const std::string& path);

  // A schema with its top-level $ref chain replaced by the target's keywords (for merging).
  json inline_ref(const json& s, const std::string& path);

  static bool only_annotations(const json& s) {
    for (auto it = s.begin(); it != s.end(); ++it)
      if (!is_annotation_keyword(it.key())) return false;
    return true;
  }

  // ---- values ---------------------------------------------------------------------------------------------
  ExprPtr value(const json& s, const std::string& path);

  // oneOf = for each branch i: base & B_i & not B_j for every j != i. Pairs proven disjoint need no negation; the
  // others are made exclusive with negate_schema's alternatives (required keys absent, other types, type-only
  // properties violated: the "exactly one of these keys" idiom) - exact, or stricter with a warning where B_j has
  // constraints its negation cannot write. nullopt when B_j's negation is nothing we can write at all.
  std::optional<ExprPtr> exact_one_of(const json& base, const json& branches, const std::string& path);

  // c & alt for one of negate_schema's alternatives. A member alternative ({type: object, [required: [k]],
  // properties: {k: X}}) is applied by declaring k in c with (c's schema for k) & X: declaring it is what
  // merge_schemas refuses next to c's additionalProperties in general (that keyword stops applying to k), but
  // here the declared schema is exactly what applied to k before, narrowed by X.
  static json apply_alternative(const json& c, const json& alt);

  // oneOf is exact as anyOf when no value can satisfy two branches; checked on explicit types and constants.
  bool types_disjoint(const json& branches);

  int ref_rule(const std::string& ref, const std::string& path);

  void check_keywords(const json& s, const std::string& path);

  std::vector<std::string> allowed_types(const json& s, const std::string& path);

  static bool type_allows(const std::vector<std::string>& types, const json& v);

  // A JSON value spelled as in the schema (compact, with optional whitespace between tokens); integral
  // numbers also match with a zero fraction (1 == 1.0 in JSON Schema).
  ExprPtr literal(const json& v);

  // A count keyword (minLength, maxItems, ...): a non-negative integer (3.0 counts, as JSON Schema allows) below
  // 2^31. A value outside int must be an error here: converting it is undefined (the fuzzer found
  // "minLength": 2.2e41).
  static int count_keyword(const json& s, const char* key, int absent, const std::string& path);

  // ---- strings --------------------------------------------------------------------------------------------
  static constexpr int kMaxLengthWithPattern = 256;
  int string_rule(const json& s, const std::string& path);

  // ---- numbers --------------------------------------------------------------------------------------------
  int number_rule(const json& s, bool integer, const std::string& path);

  // ---- objects --------------------------------------------------------------------------------------------
  int object_rule(const json& s, const std::string& path);

  // Objects too large for any order: the required keys may still come in any order when their sets, times the
  // positions among the optional keys, stay few (see finish_object_required_any_order).
  template <typename Prop>
  static bool required_any_order_fits(const std::vector<Prop>& props, size_t num_required);
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
                                       const ExprPtr& sep, const ExprPtr& extra_kv, const ExprPtr& extras_tail);

  // The any-order construction has one rule per set of seen declared keys (2^n), each a few states (the members
  // are calls): bounded by the property count.
  template <typename Prop>
  bool any_order_fits(const std::vector<Prop>& props) const;
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
                              const ExprPtr& sep, const ExprPtr& extra_kv, const ExprPtr& extras_tail);

  template <typename Prop>
  int finish_object(int id, const std::vector<Prop>& props, const std::vector<ExprPtr>& kv, const ExprPtr& sep,
                    const ExprPtr& extra_kv, const ExprPtr& extras_tail);

  // Does `text` (bytes) match `e` exactly? For compile-time checks of property names against key patterns.
  static bool expr_matches(const ExprPtr& e, const std::string& text);

  // A schema whose keywords all constrain strings (so it can describe property names).
  static bool string_only(const json& s);

  // Does the JSON string literal `quoted` satisfy the string schema `s`? Built in a throwaway compiler.
  bool string_schema_matches(const json& s, const std::string& quoted, const std::string& path);

  // The escapes that leave the names' trie at a node whose names continue with `next` (printable ASCII, never
  // '"' or '\\'). An escaped spelling of a `next` character must not leave - `{"\u0061": ...}` would pass as an
  // extra key beside a declared "a" (a duplicate, or a value checked against the wrong schema) - so inside the trie
  // only escapes of characters that no name has leave: the short escapes (`\/` unless '/' continues a name) and
  // `\uXXXX` from U+0080 up. `\u0000`-`\u007F` are refused there (false negatives only; declared keys are matched
  // in their canonical spelling, and escapes after the key has left the trie are free). One shape for every node
  // but `\/`: node-specific classes of hex digits made the key rules' DFAs ~2x costlier to build.
  static ExprPtr escape_leaving(const std::set<unsigned char>& next);

  // A JSON string that is none of `names` (ASCII names that need no escaping).
  int key_rule(const std::vector<std::string>& names);

  // ---- arrays ---------------------------------------------------------------------------------------------
  int array_rule(const json& s, const std::string& path);

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

}  // namespace deepinfer::structured::json_internal
