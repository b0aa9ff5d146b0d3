// Pieces of the JSON Schema front end shared between its files (not a public API).
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "deepinfer/structured/grammar.h"

namespace deepinfer::structured::json_internal {

struct NumberBounds {
  std::optional<double> min, max;
  bool min_exclusive = false, max_exclusive = false;
  bool any() const { return min.has_value() || max.has_value(); }
};

// JSON number text in [min, max] (integer: only integral values, spelled `12` or `12.0`; integer bounds must be
// integral). A non-integral bound on a number is compared as the exact decimal of its shortest spelling. With
// bounds, exponent notation is not generated.
ExprPtr number_expr(const NumberBounds& bounds, bool integer);

// Number spellings without exponent whose value has at most `k` decimal places (trailing zeros allowed): the
// multiples of 10^-k.
ExprPtr decimal_places_expr(int k);

// Decimal spellings (no sign, no leading zeros) of the integers in [lo, hi]; hi = nullopt means unbounded.
ExprPtr nonneg_int_range_expr(uint64_t lo, std::optional<uint64_t> hi);

// A regular expression (full match) for a string `format`, or empty when the format is unknown.
std::string format_regex(std::string_view format);

// allOf: one schema equivalent to both (for the keywords this front end supports). Throws Unsupported when
// the combination cannot be expressed (e.g. two different patterns).
nlohmann::ordered_json merge_schemas(const nlohmann::ordered_json& a, const nlohmann::ordered_json& b);

// Keywords with no effect on validation (annotations, identifiers, containers handled elsewhere).
bool is_annotation_keyword(std::string_view key);

// A validation keyword of some draft (supported or not); other keys are ignored with a warning (json_schema.cc).
bool is_validation_keyword(std::string_view key);

// ---- exact oneOf (json_one_of.cc) ----
// Replaces a schema's top-level $ref chain by the target's keywords (SchemaCompiler::inline_ref); may throw.
using RefInliner = std::function<nlohmann::ordered_json(const nlohmann::ordered_json&)>;

// True only when no JSON value satisfies both schemas: a sound, incomplete proof from `type`, `const`/`enum`, and
// required object members whose schemas are (recursively) disjoint or forbidden on the other side.
bool schemas_disjoint(const nlohmann::ordered_json& a, const nlohmann::ordered_json& b, const RefInliner& inline_ref);

// Alternatives whose union lies inside not(b), within `context` (the schema they will be merged into): "required
// member k absent", "not of b's type", "member k present with a value outside b's schema for it" (when that schema
// is type-only, or disjoint from the context's schema for k). Exactly not(b) unless *approximate is set: then the
// instances that fail b only through another keyword (a pattern, a nested constraint, ...) are missing - sound for
// oneOf (its branch accepts fewer instances), never more. An empty list with *approximate unset: b accepts all.
std::vector<nlohmann::ordered_json> negate_schema(const nlohmann::ordered_json& b,
                                                  const nlohmann::ordered_json& context, const RefInliner& inline_ref,
                                                  bool* approximate);

}  // namespace deepinfer::structured::json_internal
