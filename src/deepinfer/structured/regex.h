// Regex front end: an ECMAScript-flavoured regular expression (the dialect of JSON Schema "pattern") compiled
// into the grammar IR.
//
// Supported: literals and escapes (\n \t \xHH \uHHHH \u{H..} \/ ...), classes with ranges and negation
// (Unicode code points), \d \w \s and their negations (ASCII \d \w as in ECMAScript; \s includes the Unicode
// spaces), '.', groups ((...), (?:...), named), alternation, ? * + {m} {m,} {m,n} (lazy forms match the same
// language), ^ and $ at the start/end of a top-level alternative.
// Rejected with a clear error (Unsupported): backreferences, lookahead/lookbehind, word boundaries, inline
// flags, Unicode property escapes, anchors in the middle of a pattern.
// Characters are lowered either to their UTF-8 bytes or, for a JSON string's contents, to the JSON-escaped
// spelling (so `"` must appear as \" and a newline as \n inside the quotes).
#pragma once

#include <string_view>

#include "deepinfer/structured/grammar.h"

namespace deepinfer::structured {

enum class CharEncoding {
  kUtf8,        // raw UTF-8 bytes
  kJsonString,  // the body of a JSON string literal: ", \ and control characters escaped
};

enum class RegexMatch {
  kFull,    // the whole input must match (^ and $ are implied)
  kSearch,  // JSON Schema semantics: the pattern may match anywhere unless anchored with ^ / $
};

// Throws deepinfer::Error: InvalidArgument for syntax errors, Unsupported for unsupported constructs; the
// message names the construct and its offset in the pattern.
ExprPtr regex_to_expr(std::string_view pattern, CharEncoding encoding, RegexMatch match);

// A one-rule grammar accepting exactly the strings the regex fully matches (UTF-8 bytes).
Grammar grammar_from_regex(std::string_view pattern);

// Lowers a code point set to bytes in the given encoding (shared with the JSON Schema front end).
ExprPtr encode_chars(const CodepointRanges& ranges, CharEncoding encoding);

}  // namespace deepinfer::structured
