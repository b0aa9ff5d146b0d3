// The regex engine behind Split pre-tokenizers and Replace normalizers: PCRE2 (JIT) with UTF + UCP.
//
// HF `tokenizers` compiles these patterns with Oniguruma (Ruby syntax). The two engines agree on the syntax
// DeepSeek uses (alternation, classes, \p{..}, {m,n}, lookahead) with one known difference that we translate
// away: Oniguruma's \s is the Unicode White_Space property while PCRE2's UCP \s also matches U+180E.
// Oniguruma in `tokenizers` 0.23 knows Unicode 16.0 and Debian's PCRE2 10.42 Unicode 14.0, so \p{L|N|P|S|M}
// are widened with the code points those categories gained since (unicode_additions.cc, generated).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "deepinfer/tokenizer/function_ref.h"

struct pcre2_real_code_8;

namespace deepinfer::tokenizer {

// A [begin, end) byte range.
using Span = std::pair<uint32_t, uint32_t>;

// PCRE2 class items ("\\x{..}-\\x{..}...") for the code points that joined General Category `category`
// (one of L N P S M) between Unicode 14.0 and 16.0; empty for other letters.
std::string_view unicode16_additions(char category);

// What a Split pre-tokenizer needs from a pattern: all its matches in a piece. Regex is the general
// implementation; split_matchers.h has exact hand-written ones for DeepSeek's patterns.
class SpanMatcher {
 public:
  virtual ~SpanMatcher() = default;
  // Appends every match in `subject` (valid UTF-8) to *out, left to right, with Oniguruma's iteration rule
  // for empty matches (one right after the previous match is skipped by advancing one code point).
  // The subject is matched on its own: lookarounds do not see text around it. Thread-safe.
  virtual void find_all(std::string_view subject, std::vector<Span>* out) const = 0;
  // The same matches, handed to `on_match(begin, end)` one by one as they are found.
  virtual void for_each_match(std::string_view subject, FunctionRef<void(uint32_t, uint32_t)> on_match) const {
    std::vector<Span> spans;
    find_all(subject, &spans);
    for (const auto& [b, e] : spans) on_match(b, e);
  }
};

class Regex : public SpanMatcher {
 public:
  // Throws InvalidArgument with PCRE2's message and the offset in the pattern.
  explicit Regex(std::string_view pattern);
  // A pattern that matches `literal` verbatim (Split / Replace with {"String": ...}).
  static std::unique_ptr<Regex> literal(std::string_view literal);
  ~Regex() override;
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  const std::string& pattern() const { return pattern_; }

  void find_all(std::string_view subject, std::vector<Span>* out) const override;

  // The Oniguruma-compatible PCRE2 pattern (exposed for tests).
  static std::string translate_onig(std::string_view pattern);

 private:
  std::string pattern_;
  pcre2_real_code_8* code_ = nullptr;
  bool jit_ = false;
};

}  // namespace deepinfer::tokenizer
