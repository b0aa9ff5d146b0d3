// Content slices (vocabulary.h, content_slices.h): the trie's slice annotations, the per-config bounds, and masks
// that take slice tokens from precomputed masks equal to the uncached reference walk - on a toy vocabulary (always
// runs) and on DeepSeek-V3's 128k vocabulary (skipped when ../shared is absent) along strings filled to their
// maxLength, with ASCII and multi-byte characters.
#include <gtest/gtest.h>

#include <bit>
#include <random>

#include "deepinfer/structured/json_schema.h"
#include "deepinfer/structured/regex.h"
#include "deepinfer/structured/token_mask_cache.h"
#include "structured_test_helpers.h"

namespace deepinfer::structured {
namespace {

int popcount(const uint64_t* m, size_t words) {
  int n = 0;
  for (size_t w = 0; w < words; ++w) n += std::popcount(m[w]);
  return n;
}

TEST(ContentSlicesTest, Utf8AutomatonAcceptsExactlyWellFormedSliceCharacters) {
  auto run = [](const std::string& s) {
    int st = 0;
    for (unsigned char b : s) {
      st = slice_utf8_next(st, b);
      if (st < 0) return -1;
    }
    return st;
  };
  EXPECT_EQ(run("a b~"), 0);
  EXPECT_EQ(run("\xC3\xA9"), 0);          // é
  EXPECT_EQ(run("\xE4\xB8\xAD"), 0);      // 中
  EXPECT_EQ(run("\xF0\x9F\x98\x80"), 0);  // emoji
  EXPECT_EQ(run("\xE4\xB8"), 1);          // incomplete: not at a boundary
  EXPECT_EQ(run("\""), -1);               // needs escaping in JSON
  EXPECT_EQ(run("\\"), -1);
  EXPECT_EQ(run("\n"), -1);
  EXPECT_EQ(run("\x7F"), -1);
  EXPECT_EQ(run("\xC0\x80"), -1);          // overlong
  EXPECT_EQ(run("\xE0\x80\x80"), -1);      // overlong
  EXPECT_EQ(run("\xED\xA0\x80"), -1);      // surrogate
  EXPECT_EQ(run("\xF4\x90\x80\x80"), -1);  // above U+10FFFF
  EXPECT_EQ(run("\x80"), -1);              // continuation without a lead
  // The line separators ECMAScript's '.' refuses are not slice characters; their neighbours are.
  EXPECT_EQ(run("\xE2\x80\xA8"), -1);  // U+2028
  EXPECT_EQ(run("\xE2\x80\xA9"), -1);  // U+2029
  EXPECT_EQ(run("\xE2\x80\xA7"), 0);   // U+2027
  EXPECT_EQ(run("\xE2\x80\xAA"), 0);   // U+202A
  EXPECT_EQ(run("\xE2\x80\x94"), 0);   // em dash
  EXPECT_EQ(run("\xE2\x82\xAC"), 0);   // euro sign
  EXPECT_EQ(run("\xE2\x80"), 9);
  EXPECT_EQ(run("\xE2\x81"), 1);
}

// A vocabulary with slice tokens of several lengths (ASCII and multi-byte) and others (quotes, escapes, partial
// UTF-8, newlines), so that subtrees mix both kinds.
std::shared_ptr<const TokenizerInfo> toy_tokenizer() {
  std::vector<std::string> t = {"<eos>",
                                "a",
                                "ab",
                                "abc",
                                "abcd",
                                "abcdefgh",
                                "a\"",
                                "a\",",
                                "\"",
                                "\",",
                                "\\",
                                "\\n",
                                "\\u00e9",
                                " ",
                                "  ",
                                "        ",
                                "\n",
                                "x",
                                "xy",
                                "xyz\"",
                                "\xE4",
                                "\xE4\xB8",
                                "\xE4\xB8\xAD",
                                "\xE4\xB8\xAD\xE6\x96\x87",
                                "\xC3\xA9t\xC3\xA9",
                                "0",
                                "12",
                                "-",
                                "\xC3",
                                "b\xC3",
                                "}",
                                ",\"",
                                "\":",
                                "\"}",
                                "q\x7F",
                                "\xE2\x80\x94",               // em dash
                                "\xE2\x80\x94x",              // em dash, x
                                "\xE2\x80\xA8",               // U+2028: not a slice token
                                "x\xE2\x80\xA9",              // x, U+2029
                                "\xE2\x80\x94\xE2\x80\xA8"};  // em dash, U+2028
  for (int c = 'a'; c <= 'z'; ++c) t.push_back(std::string(1, static_cast<char>(c)) + "_");
  std::vector<bool> special(t.size(), false);
  special[0] = true;
  return std::make_shared<const TokenizerInfo>(Vocabulary(t, {0}, special));
}

TEST(ContentSlicesTest, TrieKnowsSliceSubtreesAndLengths) {
  auto tok = toy_tokenizer();
  const TokenTrie& trie = tok->trie;
  const Vocabulary& v = tok->vocab;
  // Find the node of a byte string by walking the pre-order layout.
  auto node_of = [&](const std::string& s) {
    uint32_t lo = 1, hi = trie.num_nodes();
    uint32_t found = 0;
    for (size_t d = 0; d < s.size(); ++d) {
      found = 0;
      for (uint32_t i = lo; i < hi; i = trie.subtree_end(i))
        if (trie.byte(i) == static_cast<uint8_t>(s[d])) {
          found = i;
          break;
        }
      if (!found) return 0u;
      lo = found + 1;
      hi = trie.subtree_end(found);
    }
    return found;
  };
  EXPECT_EQ(trie.slice_max_chars(node_of("a")), 0);   // "a\"" below: not a slice subtree
  EXPECT_EQ(trie.slice_max_chars(node_of("ab")), 8);  // ab abc abcd abcdefgh
  EXPECT_EQ(trie.slice_min_chars(node_of("ab")), 2);
  EXPECT_EQ(trie.slice_max_chars(node_of("\xE4")), 0);  // partial characters
  EXPECT_EQ(trie.slice_max_chars(node_of("\xE4\xB8\xAD")), 2);
  EXPECT_EQ(trie.slice_min_chars(node_of("\xE4\xB8\xAD")), 1);
  EXPECT_EQ(trie.slice_max_chars(node_of("\xC3\xA9")), 3);  // "été": 3 characters, 5 bytes
  EXPECT_EQ(trie.slice_max_chars(node_of("q")), 0);         // q\x7F
  EXPECT_EQ(trie.slice_max_chars(node_of("\xE2\x80\x94x")), 2);
  EXPECT_EQ(trie.slice_max_chars(node_of("\xE2\x80\x94")), 0);  // em dash + U+2028 below
  EXPECT_EQ(trie.slice_max_chars(node_of("\xE2\x80\xA8")), 0);
  EXPECT_EQ(trie.max_slice_chars(), 8u);
  // Cumulative masks: every slice token of at most L characters, nothing else.
  const size_t words = mask_words(v.size());
  for (uint32_t L = 0; L <= trie.max_slice_chars() + 1; ++L) {
    int expected = 0;
    for (size_t id = 0; id < v.num_bytes_tokens(); ++id) {
      if (v.is_special(static_cast<int32_t>(id))) continue;
      int st = 0;
      uint32_t chars = 0;
      for (unsigned char b : v.token_bytes(static_cast<int32_t>(id))) {
        if (st < 0) break;
        st = slice_utf8_next(st, b);
        chars += st == 0;
      }
      const bool slice = st == 0 && chars <= L;
      expected += slice;
      EXPECT_EQ(test_token_bit(std::span<const uint64_t>(trie.slice_mask_upto(L), words), static_cast<int32_t>(id)),
                slice)
          << "L=" << L << " token " << id;
    }
    EXPECT_EQ(popcount(trie.slice_mask_upto(L), words), expected);
  }
}

// The residual trie (TokenTrie::residual) is the full trie minus exactly the subtrees whose tokens are all slice
// tokens of at most residual_slice_chars() characters, in pre-order, with subtree ends that match the full trie's.
void expect_residual_trie_exact(const TokenTrie& trie) {
  const auto& res = trie.residual();
  const uint32_t T = trie.residual_slice_chars();
  auto dropped = [&](uint32_t i) { return i > 0 && trie.slice_max_chars(i) != 0 && trie.slice_max_chars(i) <= T; };
  std::vector<int32_t> index(trie.num_nodes(), -1);
  ASSERT_FALSE(res.empty());
  EXPECT_EQ(res[0].node, 0u);
  for (size_t r = 0; r < res.size(); ++r) {
    if (r > 0) ASSERT_LT(res[r - 1].node, res[r].node);
    index[res[r].node] = static_cast<int32_t>(r);
    EXPECT_EQ(res[r].depth, trie.depth(res[r].node));
    EXPECT_EQ(res[r].byte, trie.byte(res[r].node));
  }
  size_t kept = 0;
  for (uint32_t i = 0; i < trie.num_nodes();) {
    if (dropped(i)) {  // the whole subtree is gone
      for (uint32_t j = i; j < trie.subtree_end(i); ++j) ASSERT_EQ(index[j], -1) << j;
      i = trie.subtree_end(i);
      continue;
    }
    ASSERT_GE(index[i], 0) << "node " << i << " should be kept";
    ++kept;
    // The residual subtree ends at the first kept node past the full subtree.
    uint32_t next = trie.subtree_end(i);
    while (next < trie.num_nodes() && index[next] < 0) ++next;
    const uint32_t expected_end = next < trie.num_nodes() ? static_cast<uint32_t>(index[next]) : res.size();
    EXPECT_EQ(res[index[i]].subtree_end, expected_end) << "node " << i;
    ++i;
  }
  EXPECT_EQ(kept, res.size());
}

TEST(ContentSlicesTest, ResidualTrieDropsExactlyTheShortSliceSubtrees) {
  auto tok = toy_tokenizer();
  EXPECT_EQ(tok->trie.residual_slice_chars(), 8u);  // min(32, the longest slice token)
  expect_residual_trie_exact(tok->trie);
  EXPECT_LT(tok->trie.residual().size(), tok->trie.num_nodes());
  auto ds = testing::deepseek_v3_tokenizer();
  if (!ds) GTEST_SKIP() << "DeepSeek-V3 tokenizer.json absent";
  expect_residual_trie_exact(ds->trie);
  EXPECT_EQ(ds->trie.residual_slice_chars(), 32u);
  EXPECT_LT(ds->trie.residual().size() * 10, ds->trie.num_nodes());  // ~20k of 272k nodes
}

TEST(ContentSlicesTest, BoundsOfStringStates) {
  auto bounds_after = [](const std::string& schema, const std::string& prefix) {
    auto g = testing::compile(json_schema_to_grammar(std::string_view(schema)).grammar);
    StackGraph graph(g.get());
    uint32_t c = graph.start_config();
    for (unsigned char b : prefix) c = graph.step(c, b);
    EXPECT_NE(c, StackGraph::kDead) << prefix;
    ContentSliceAnalyzer a(&graph, 32);
    return a.bounds(c);
  };
  // Inside a bounded string: exactly the remaining characters are alive, one more is dead.
  SliceBounds b = bounds_after(R"({"type":"string","maxLength":5})", "\"ab");
  EXPECT_EQ(b.all_alive, 3u);
  EXPECT_EQ(b.all_dead, 4u);
  b = bounds_after(R"({"type":"string","maxLength":5})", "\"\xC3\xA9\xE4\xB8\xAD");  // two multi-byte characters
  EXPECT_EQ(b.all_alive, 3u);
  EXPECT_EQ(b.all_dead, 4u);
  // Unbounded string: everything alive (up to the examined length), nothing known dead.
  b = bounds_after(R"({"type":"string"})", "\"x");
  EXPECT_EQ(b.all_alive, 32u);
  EXPECT_EQ(b.all_dead, SliceBounds::kUnlimited);
  // minLength does not restrict content (the closing quote is not a slice character).
  b = bounds_after(R"({"type":"string","minLength":3,"maxLength":40})", "\"");
  EXPECT_EQ(b.all_alive, 32u);
  // A pattern that refuses some characters: nothing is known alive; some runs live on, so nothing known dead.
  b = bounds_after(R"({"type":"string","pattern":"^[a-z]+$"})", "\"");
  EXPECT_EQ(b.all_alive, 0u);
  EXPECT_EQ(b.all_dead, SliceBounds::kUnlimited);
  // '.' refuses only line terminators, none of them a slice character: `.` strings are closed like plain ones,
  // as keys too (patternProperties "^.*$").
  b = bounds_after(R"({"type":"string","pattern":"^.*$"})", "\"");
  EXPECT_EQ(b.all_alive, 32u);
  EXPECT_EQ(b.all_dead, SliceBounds::kUnlimited);
  b = bounds_after(R"({"type":"string","pattern":"^.{0,3}$"})", "\"a");
  EXPECT_EQ(b.all_alive, 2u);
  EXPECT_EQ(b.all_dead, 3u);
  b = bounds_after(R"({"type":"object","patternProperties":{"^.*$":{"type":"integer"}},
      "additionalProperties":false})",
                   "{\"k");
  EXPECT_EQ(b.all_alive, 32u);
  // Outside a string only '"' (not a slice character) or whitespace may come: nothing alive for sure.
  b = bounds_after(R"({"type":"string"})", "");
  EXPECT_EQ(b.all_alive, 0u);
  // "Any key but the declared names" (one DFA state per name prefix): every run stays alive (a longer name is
  // always allowed), inside a declared name's prefix too - the closure check proves it without levels.
  const std::string keys = R"({"type":"object","properties":{"alpha":{},"alps":{},"beta":{}}})";
  b = bounds_after(keys, "{\"al");
  EXPECT_EQ(b.all_alive, 32u);
  EXPECT_EQ(b.all_dead, SliceBounds::kUnlimited);
  b = bounds_after(keys, "{\"alph");
  EXPECT_EQ(b.all_alive, 32u);
  // A const string: one run lives, the others die; after the const's length everything is dead.
  // Through a config (not a detached DFA state) the levels stop once S = 0 is known: D is only looked for when
  // every run dies at once.
  b = bounds_after(R"({"const":"abc"})", "\"");
  EXPECT_EQ(b.all_alive, 0u);
  EXPECT_EQ(b.all_dead, SliceBounds::kUnlimited);
  b = bounds_after(R"({"const":"abc"})", "\"abc");
  EXPECT_EQ(b.all_alive, 0u);
  EXPECT_EQ(b.all_dead, 1u);
}

// Cached masks (slice-accelerated entries) against the uncached walk at every position of `text`.
void expect_masks_equal_along(const std::shared_ptr<const CompiledGrammar>& g,
                              const std::shared_ptr<const TokenizerInfo>& tok, const std::string& text) {
  auto cache = std::make_shared<TokenMaskCache>(g, tok);
  GrammarMatcher m(cache);
  std::vector<uint64_t> cached(mask_words(tok->vocab.size())), uncached(cached.size());
  for (size_t i = 0; i <= text.size(); ++i) {
    m.fill_mask(cached);
    m.fill_mask_uncached(uncached);
    size_t diff = 0;
    for (size_t w = 0; w < cached.size(); ++w) diff += std::popcount(cached[w] ^ uncached[w]);
    ASSERT_EQ(diff, 0u) << "after " << i << " bytes of '" << text << "'";
    if (i < text.size()) {
      ASSERT_TRUE(m.accept_bytes(text.substr(i, 1))) << m.last_error();
    }
  }
}

TEST(ContentSlicesTest, ToyVocabularyMasksEqualUncached) {
  auto tok = toy_tokenizer();
  auto js = [](const char* s) { return testing::compile(json_schema_to_grammar(std::string_view(s)).grammar); };
  expect_masks_equal_along(js(R"({"type":"string","maxLength":6})"), tok,
                           "\"ab\xE4\xB8\xAD"
                           "cd\"");
  expect_masks_equal_along(js(R"({"type":"string","minLength":2,"maxLength":3})"), tok, "\"xyz\"");
  expect_masks_equal_along(js(R"({"type":"string"})"), tok, "\"abc \\n\xC3\xA9t\xC3\xA9\"");
  expect_masks_equal_along(js(R"({"type":"string","pattern":"^[a-z_]{2,4}$"})"), tok, "\"ab_\"");
  expect_masks_equal_along(js(R"({"type":"object","properties":{"ab":{"type":"string","maxLength":2}},
      "additionalProperties":{"type":"string","maxLength":1}})"),
                           tok, "{\"ab\":\"xy\",\"abc\":\"q\"}");
  expect_masks_equal_along(testing::compile(grammar_from_regex("\"[^\"]{0,3}\"x")), tok, "\"a b\"x");
  // '.' strings and keys take slices; the tokens with U+2028 / U+2029 are walked and refused, those with other
  // E2 80 xx characters taken.
  expect_masks_equal_along(js(R"({"type":"string","pattern":"^.*$"})"), tok, "\"a\xE2\x80\x94x\"");
  expect_masks_equal_along(js(R"({"type":"string","pattern":"^.{1,3}$"})"), tok,
                           "\"\xE2\x80\x94"
                           "ab\"");
  expect_masks_equal_along(js(R"({"type":"object","patternProperties":{"^.*$":{"type":"string","pattern":"^.+$"}},
      "additionalProperties":false})"),
                           tok, "{\"x\xE2\x80\x94\":\"\xE2\x80\x94\",\"ab\":\"c\"}");
  // A plain string still takes U+2028 (JSON allows it unescaped): through the walk now.
  expect_masks_equal_along(js(R"({"type":"string"})"), tok, "\"\xE2\x80\xA8x\xE2\x80\xA9\"");
}

TEST(ContentSlicesTest, DeepSeekVocabularyBoundedStringsMasksEqualUncached) {
  auto tok = testing::deepseek_v3_tokenizer();
  if (!tok) GTEST_SKIP() << "DeepSeek-V3 tokenizer.json absent";
  auto js = [](const char* s) { return testing::compile(json_schema_to_grammar(std::string_view(s)).grammar); };
  // Filled to the bound: every remaining length from 12 down to 0 is visited.
  expect_masks_equal_along(js(R"({"type":"string","maxLength":12})"), tok,
                           "\"ab \xE4\xB8\xAD\xE6\x96\x87"
                           "cd\xC3\xA9xyzw\"");
  expect_masks_equal_along(js(R"({"type":"object","properties":{"id":{"type":"string","minLength":2,"maxLength":4}},
      "required":["id"]})"),
                           tok, "{\"id\":\"a\xF0\x9F\x98\x80z\",\"extra\":1}");
  expect_masks_equal_along(js(R"({"type":"string","format":"email","maxLength":10})"), tok, "\"a.b@cd.io\"");
  expect_masks_equal_along(js(R"({"type":"object","patternProperties":{"^.*$":{"type":"string","pattern":"^.{2,}$"}},
      "additionalProperties":false})"),
                           tok, "{\"k\xE2\x80\x94y\":\"ab \xE4\xB8\xAD\",\"z\":\"..\"}");
  // Keys that are prefixes / extensions of declared names, through the residual walk of the key states.
  expect_masks_equal_along(js(R"({"type":"object","properties":{"name":{"type":"integer"},"names":{},"nameless":{}},
      "additionalProperties":{"type":"boolean"}})"),
                           tok, "{\"name\":1,\"nam\":true,\"namex\":false,\"n\\u00e9\":true}");
}

}  // namespace
}  // namespace deepinfer::structured
