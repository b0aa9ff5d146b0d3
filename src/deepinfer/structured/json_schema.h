// JSON Schema front end (draft 2020-12, with the draft-04..07 spellings found in real schemas: `definitions`,
// array-form `items` + `additionalItems`, boolean exclusiveMinimum/Maximum).
//
// Supported: type (incl. unions), enum, const, properties, required, additionalProperties, items, prefixItems,
// minItems/maxItems, minLength/maxLength, pattern, format (date-time date time duration email hostname ipv4
// ipv6 uuid uri uri-reference), minimum/maximum/exclusiveMinimum/exclusiveMaximum (integral bounds),
// multipleOf 1 for integers, anyOf, oneOf (exact: disjoint or made exclusive, docs/STRUCTURED.md), allOf (merged),
// $ref/$defs (JSON pointers and $anchor, recursion allowed), boolean schemas; patternProperties (one pattern with
// additionalProperties false), propertyNames (enum/const, or a string schema), maxProperties (all declared
// properties required) - the exact subsets in docs/STRUCTURED.md.
//
// Rules the grammar imposes beyond the schema (documented, deliberate):
//   - objects with more than `any_order_max_properties` declared properties (or a bound on their additional
//     ones) take their keys in `properties` order, additional keys after the declared ones; smaller objects
//     take declared and additional keys in any order;
//   - whitespace between tokens is limited to `max_whitespace` bytes per gap (0 = compact JSON);
//   - strings use the canonical escapes (\u escapes only for control characters) inside patterns/enums.
// A validation keyword that is not supported is an error (ErrorCode::kUnsupported) - or, with `lenient`, a
// warning in the result while the keyword is ignored. Keywords unknown to every draft have no validation
// meaning and are ignored; each is reported as a warning.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "deepinfer/structured/grammar.h"

namespace deepinfer::structured {

struct JsonSchemaOptions {
  bool lenient = false;
  int max_whitespace = 16;      // bytes of [ \t\n\r] allowed in each gap between tokens; -1 = unbounded
  bool enforce_formats = true;  // false: `format` is an annotation (2020-12 default for validators)
  // oneOf whose branches are not provably disjoint and cannot be made exclusive (json_one_of.cc): unsupported
  // (false: exact), or matched as anyOf with a warning (true: accepts instances valid for two branches).
  bool oneof_as_anyof = false;
  // Objects with at most this many declared properties take them in any order (one grammar rule per set of seen
  // keys, also bounded by the bytes of the names); larger ones follow `properties` order. 0: always in order.
  int any_order_max_properties = 8;
};

struct JsonSchemaGrammar {
  Grammar grammar;
  std::vector<std::string> warnings;
};

JsonSchemaGrammar json_schema_to_grammar(const nlohmann::ordered_json& schema, const JsonSchemaOptions& options = {});
JsonSchemaGrammar json_schema_to_grammar(std::string_view schema_text, const JsonSchemaOptions& options = {});

// Any JSON value (the `json_object` request mode uses the object alternative via a schema {"type":"object"}).
Grammar any_json_grammar(const JsonSchemaOptions& options = {});

}  // namespace deepinfer::structured
