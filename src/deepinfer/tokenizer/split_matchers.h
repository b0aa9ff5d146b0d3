// Hand-written matchers for the Split patterns of DeepSeek's tokenizer.json (V3, R1, V3.1, V4 and V4.1 share
// them), exact replacements for running the patterns through a regex engine:
//
//   1. \p{N}{1,3}
//   2. [一-龥぀-ゟ゠-ヿ]+
//   3. [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+|
//      ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//
// Each scans the piece once with the Unicode 16.0 class table (unicode_class.h), deciding at every position
// which alternative Oniguruma's backtracking would take (derivations in split_matchers.cc). Any other pattern
// goes to PCRE2 (regex.h). Exactness is checked against PCRE2 on generated text and against `tokenizers` on
// the corpus (tests/tokenizer/split_matchers_test.cc, corpus_test.cc).
#pragma once

#include <memory>
#include <string_view>

#include "deepinfer/tokenizer/regex.h"

namespace deepinfer::tokenizer {

// The hand-written matcher for `pattern` (the tokenizer.json string, Oniguruma syntax), or nullptr when
// there is none.
std::unique_ptr<SpanMatcher> make_builtin_matcher(std::string_view pattern);

// The pieces of DeepSeek's whole Split sequence (patterns 1, 2 and 3 in turn, each Isolated, not inverted)
// handed to `sink` in order: the three matchers fused into one pass of inlined calls.
void deepseek_pieces(std::string_view text, FunctionRef<void(std::string_view)> sink);

// The patterns above, as they appear (after JSON unescaping) in tokenizer.json.
extern const std::string_view kDeepSeekDigitsPattern;
extern const std::string_view kDeepSeekCjkPattern;
extern const std::string_view kDeepSeekWordPattern;

}  // namespace deepinfer::tokenizer
