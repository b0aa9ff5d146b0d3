// Pieces of the JSON Schema front end shared between its files (not a public API).
#pragma once

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

}  // namespace deepinfer::structured::json_internal
