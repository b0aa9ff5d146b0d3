// The hand-written DeepSeek pre-tokenizer matchers and their Unicode 16 class table, checked against PCRE2
// running the same patterns (regex.h, with its Oniguruma/Unicode-16 rewrites). The corpus tests then check the
// whole tokenizer against HF `tokenizers`.
#include "deepinfer/tokenizer/split_matchers.h"

#include <gtest/gtest.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <random>

#include "deepinfer/tokenizer/pre_tokenizer.h"
#include "deepinfer/tokenizer/unicode_class.h"
#include "deepinfer/tokenizer/utf8.h"

namespace deepinfer::tokenizer {
namespace {

// Every scalar value once, in order; `starts[i]` is the byte offset of the i-th.
std::string all_code_points(std::vector<char32_t>* cps, std::vector<size_t>* starts) {
  std::string s;
  for (char32_t c = 0; c < 0x110000; ++c) {
    if (c >= 0xD800 && c <= 0xDFFF) continue;
    starts->push_back(s.size());
    cps->push_back(c);
    append_utf8(c, &s);
  }
  return s;
}

TEST(UnicodeClassTable, AgreesWithPcre2OnEveryCodePoint) {
  std::vector<char32_t> cps;
  std::vector<size_t> starts;
  const std::string text = all_code_points(&cps, &starts);
  const UnicodeClassTable& table = unicode_classes();
  const std::pair<const char*, uint8_t> classes[] = {{"\\p{L}", kClassL}, {"\\p{N}", kClassN}, {"\\p{P}", kClassP},
                                                     {"\\p{S}", kClassS}, {"\\p{M}", kClassM}, {"\\s", kClassSpace}};
  for (const auto& [pattern, bit] : classes) {
    std::vector<Span> spans;
    Regex(pattern).find_all(text, &spans);
    std::vector<bool> in_pcre(cps.size(), false);
    size_t k = 0;
    for (const auto& [b, e] : spans) {
      while (starts[k] < b) ++k;
      in_pcre[k] = true;
    }
    size_t differences = 0, members = 0;
    for (size_t i = 0; i < cps.size(); ++i) {
      const bool ours = (table(cps[i]) & bit) != 0;
      members += ours;
      if (ours != in_pcre[i] && ++differences <= 5)
        ADD_FAILURE() << pattern << " U+" << std::hex << static_cast<uint32_t>(cps[i]) << " table " << ours;
    }
    EXPECT_EQ(differences, 0u) << pattern;
    EXPECT_GT(members, 0u) << pattern;
  }
  EXPECT_EQ(table(0x1C89) & kClassL, kClassL);  // new in Unicode 16: the table is not Unicode 14's
  EXPECT_EQ(table(0x180E), 0);                  // Oniguruma's \s leaves out U+180E
}

// Random strings over characters that sit on every boundary of the three patterns.
std::string random_text(std::mt19937& rng) {
  static const char32_t kChars[] = {'a',    'Z',      'q',    '0',    '7',     '!',     '.',    '-',     '\'',   '_',
                                    '`',    '~',      '[',    '\\',   ' ',     '\t',    '\r',   '\n',    0x0B,   0x0C,
                                    0x85,   0xA0,     0x3000, 0x2028, 0x2029,  0x180E,  0x200B, 0x200D,  0xFEFF, 0x0301,
                                    0x20DD, 0x0E31,   0xE9,   0xDF,   0x4E00,  0x9FA5,  0x9FA6, 0x3040,  0x3042, 0x30A2,
                                    0x30FB, 0x30FC,   0x30FF, 0x3100, 0xAC00,  0x0663,  0xFF15, 0xBD,    0xB2,   0x2460,
                                    0x20AC, 0x2026,   0x300C, 0xFF01, 0x1F600, 0x1F3FD, 0x1C89, 0x10D40, 0x1B4E, 0xE000,
                                    0x0378, 0x10FFFF, 0x00AD, 0x0600, 0x16A0,  0x1680,  0x0410, 0x05D0};
  std::uniform_int_distribution<size_t> pick(0, std::size(kChars) - 1), len(1, 40), rep(1, 4);
  std::string s;
  const size_t n = len(rng);
  while (s.size() < n) {
    const char32_t c = kChars[pick(rng)];
    for (size_t r = rep(rng); r > 0; --r) append_utf8(c, &s);  // runs (digit groups, space runs, words)
  }
  return s;
}

TEST(SplitMatchers, EqualPcre2OnRandomText) {
  std::mt19937 rng(7);
  for (std::string_view pattern : {kDeepSeekDigitsPattern, kDeepSeekCjkPattern, kDeepSeekWordPattern}) {
    const auto fast = make_builtin_matcher(pattern);
    ASSERT_NE(fast, nullptr) << pattern;
    const Regex regex(pattern);
    int differences = 0;
    for (int i = 0; i < 40000; ++i) {
      const std::string text = random_text(rng);
      std::vector<Span> ours, ref;
      fast->find_all(text, &ours);
      regex.find_all(text, &ref);
      if (ours != ref && ++differences <= 5) {
        std::string spans;
        for (const auto& [b, e] : ref) spans += "[" + std::to_string(b) + "," + std::to_string(e) + ") ";
        spans += " ours: ";
        for (const auto& [b, e] : ours) spans += "[" + std::to_string(b) + "," + std::to_string(e) + ") ";
        ADD_FAILURE() << pattern << "\n  text bytes " << text.size() << ": " << spans;
      }
    }
    EXPECT_EQ(differences, 0) << pattern;
  }
  EXPECT_EQ(make_builtin_matcher("\\p{N}{1,4}"), nullptr);  // anything else goes to PCRE2
}

// The fused scan that encode uses for DeepSeek's pre_tokenizer gives the pieces of the general stage-by-stage
// path (three Split stages over PCRE2-equal matchers, then ByteLevel).
TEST(SplitMatchers, FusedDeepSeekSequenceEqualsStages) {
  using nlohmann::json;
  auto split = [](std::string_view pattern) {
    return json{{"type", "Split"}, {"pattern", {{"Regex", pattern}}}, {"behavior", "Isolated"}, {"invert", false}};
  };
  const json j = {
      {"type", "Sequence"},
      {"pretokenizers",
       {split(kDeepSeekDigitsPattern),
        split(kDeepSeekCjkPattern),
        split(kDeepSeekWordPattern),
        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}}}};
  const auto pre = parse_pre_tokenizer(j, "pre_tokenizer");
  std::mt19937 rng(11);
  int differences = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string text;
    for (int k = std::uniform_int_distribution<int>(1, 4)(rng); k > 0; --k) text += random_text(rng);
    Pieces staged;
    staged.views.push_back(text);
    pre->pre_tokenize(&staged);
    std::vector<std::string_view> fused;
    pre->for_each_piece(text, [&](std::string_view p) { fused.push_back(p); });
    if (fused != staged.views && ++differences <= 3) ADD_FAILURE() << "text of " << text.size() << " bytes";
  }
  EXPECT_EQ(differences, 0);
}

// Long runs stay linear (the adversarial inputs: a 1 MB word, 100k spaces, 100k newlines).
TEST(SplitMatchers, LongRunsAreLinear) {
  const auto word = make_builtin_matcher(kDeepSeekWordPattern);
  const auto digits = make_builtin_matcher(kDeepSeekDigitsPattern);
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<Span> spans;
  word->find_all(std::string(1 << 20, 'a'), &spans);
  ASSERT_EQ(spans, (std::vector<Span>{{0, 1u << 20}}));
  spans.clear();
  word->find_all(std::string(100000, ' ') + "x", &spans);
  ASSERT_EQ(spans, (std::vector<Span>{{0, 99999}, {99999, 100001}}));  // \s+(?!\S), then " x"
  spans.clear();
  word->find_all(std::string(100000, ' ') + "\n" + std::string(100000, ' '), &spans);
  ASSERT_EQ(spans, (std::vector<Span>{{0, 100001}, {100001, 200001}}));  // \s*[\r\n]+, then \s+ at the end
  spans.clear();
  digits->find_all(std::string(100001, '1'), &spans);
  EXPECT_EQ(spans.size(), 33334u);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 1.0);
}

}  // namespace
}  // namespace deepinfer::tokenizer
