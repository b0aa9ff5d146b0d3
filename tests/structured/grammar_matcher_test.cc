// The grammar IR, the pushdown matcher (bytes, rollback, errors) and the regex and EBNF front ends.
#include <gtest/gtest.h>

#include <random>
#include <set>

#include "deepinfer/core/error.h"
#include "deepinfer/structured/ebnf.h"
#include "deepinfer/structured/grammar_matcher.h"
#include "deepinfer/structured/regex.h"
#include "structured_test_helpers.h"

namespace deepinfer::structured {
namespace {

using testing::compile;
using testing::matches;

std::shared_ptr<const CompiledGrammar> regex(const std::string& re) { return compile(grammar_from_regex(re)); }
std::shared_ptr<const CompiledGrammar> ebnf(const std::string& text) { return compile(grammar_from_ebnf(text)); }

TEST(GrammarIrTest, Utf8RangesCoverExactlyTheScalarValues) {
  Grammar g;
  g.set_root(g.add_rule("root", utf8_ranges_expr({{0x7F, 0x10000}})));
  auto c = compile(g);
  for (uint32_t cp : {0x7Fu, 0x80u, 0x7FFu, 0x800u, 0xD7FFu, 0xE000u, 0xFFFFu, 0x10000u}) {
    std::string s;
    append_utf8(s, cp);
    EXPECT_TRUE(matches(c, s)) << std::hex << cp;
  }
  for (uint32_t cp : {0x7Eu, 0x10001u}) {
    std::string s;
    append_utf8(s, cp);
    EXPECT_FALSE(matches(c, s)) << std::hex << cp;
  }
  EXPECT_FALSE(matches(c, "\xED\xA0\x80"));  // an encoded surrogate
  EXPECT_FALSE(matches(c, "\xC1\xBF"));      // overlong
}

TEST(GrammarMatcherTest, RecursionAndRollback) {
  // Balanced parentheses: recursion through a rule.
  auto g = ebnf(R"G(root ::= item*
                   item ::= "(" item* ")" | "x")G");
  EXPECT_TRUE(matches(g, ""));
  EXPECT_TRUE(matches(g, "(x(x))x"));
  EXPECT_TRUE(matches(g, std::string(200, '(') + std::string(200, ')')));
  EXPECT_FALSE(matches(g, "(()"));
  EXPECT_FALSE(matches(g, "())"));
  GrammarMatcher m(g);
  ASSERT_TRUE(m.accept_bytes("(("));
  ASSERT_TRUE(m.accept_bytes("x)"));
  EXPECT_FALSE(m.can_terminate());
  EXPECT_FALSE(m.accept_bytes(")y"));  // all-or-nothing: the ')' is not consumed
  EXPECT_NE(m.last_error().find("byte 1"), std::string::npos) << m.last_error();
  ASSERT_TRUE(m.accept_bytes(")"));
  EXPECT_TRUE(m.can_terminate());
  m.rollback(2);
  EXPECT_EQ(m.num_accepted(), 1);
  EXPECT_FALSE(m.can_terminate());
  ASSERT_TRUE(m.accept_bytes("))"));
  EXPECT_TRUE(m.can_terminate());
  EXPECT_THROW(m.rollback(5), Error);
}

TEST(GrammarMatcherTest, LeftRecursionIsAClearError) {
  try {
    ebnf(R"(root ::= expr
            expr ::= expr "+" term | term
            term ::= [0-9]+)");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("left recursion"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("expr -> expr"), std::string::npos) << e.what();
  }
  // Indirect, through a nullable prefix.
  EXPECT_THROW(ebnf("root ::= a\na ::= \"x\"? b\nb ::= a \"y\" | \"z\""), Error);
}

TEST(GrammarMatcherTest, EmptyLanguageAndUndefinedRules) {
  EXPECT_THROW(ebnf("root ::= a\na ::= \"x\" a"), Error);  // never terminates: matches nothing
  EXPECT_THROW(ebnf("root ::= missing"), Error);
  EXPECT_THROW(ebnf("nothing ::= \"x\""), Error);  // no root
}

// Structurally equal rules compile once: every call goes to one of them (the copies get no states of their own),
// also for rules that become equal once the rules they call are merged; the language does not change. Recursive
// copies stay apart (conservative).
TEST(GrammarMatcherTest, EqualRulesAreCompiledOnce) {
  auto g = ebnf(R"G(root ::= "<" list1 "|" list2 "|" list3 "|" r1 "|" r2 ">"
                  list1 ::= "[" item1 ("," item1)* "]"
                  list2 ::= "[" item2 ("," item2)* "]"
                  list3 ::= "[" item2 ("," item2)* "]" "!"
                  item1 ::= "a" [0-9]*
                  item2 ::= "a" [0-9]*
                  r1 ::= "(" r1 ")" | "x"
                  r2 ::= "(" r2 ")" | "x")G");
  std::set<std::string> called;
  size_t states_of[16] = {};
  for (size_t s = 0; s < g->num_states(); ++s) {
    const int32_t st = static_cast<int32_t>(s);
    ++states_of[g->state(st).rule];
    for (const auto* c = g->calls_begin(st); c != g->calls_end(st); ++c) called.insert(g->rule_name(c->rule));
  }
  EXPECT_EQ(called, (std::set<std::string>{"list1", "list3", "item1", "r1", "r2"}));
  for (int r = 0; r < static_cast<int>(g->num_rules()); ++r)
    if (g->rule_name(r) == "list2" || g->rule_name(r) == "item2") EXPECT_LE(states_of[r], 1u) << g->rule_name(r);
  EXPECT_TRUE(matches(g, "<[a1,a]|[a]|[a2]!|((x))|x>"));
  EXPECT_FALSE(matches(g, "<[a1,a]|[a]|[a2]|((x))|x>"));
  EXPECT_FALSE(matches(g, "<[a1,a]|[b]|[a2]!|((x))|x>"));
}

TEST(GrammarMatcherTest, ForcedBytesJumpForward) {
  auto g = ebnf(R"(root ::= "{\"name\": \"" [a-z]+ "\"}")");
  GrammarMatcher m(g);
  EXPECT_EQ(m.forced_bytes(), "{\"name\": \"");
  ASSERT_TRUE(m.accept_bytes("{\"name\": \"ab"));
  EXPECT_EQ(m.forced_bytes(), "");
}

TEST(RegexTest, Basics) {
  auto g = regex(R"([a-c]+\d{2,3}(x|yz)?)");
  EXPECT_TRUE(matches(g, "ab12"));
  EXPECT_TRUE(matches(g, "c123yz"));
  EXPECT_FALSE(matches(g, "c1234"));
  EXPECT_FALSE(matches(g, "12"));
  EXPECT_FALSE(matches(g, "ab12y"));
  auto email = regex(R"(^[\w.+-]+@[\w-]+\.[\w.]+$)");
  EXPECT_TRUE(matches(email, "a.b+c@d-e.org"));
  EXPECT_FALSE(matches(email, "a@b"));
  auto neg = regex(R"([^"\\]*)");
  EXPECT_TRUE(matches(neg, "héllo wörld ✓"));
  EXPECT_FALSE(matches(neg, "a\"b"));
  auto dot = regex("a.c");
  EXPECT_TRUE(matches(dot, "a€c"));
  EXPECT_FALSE(matches(dot, "a\nc"));
}

TEST(RegexTest, UnicodeClassesAndEscapes) {
  auto g = regex(R"([\u4e00-\u9fff]{2}\x41\u{1F600}\s\S\.)");
  EXPECT_TRUE(matches(g, "中文A😀\u3000x."));
  EXPECT_FALSE(matches(g, "中A😀 x."));
  auto braces = regex(R"(a{,2}b{)");  // not quantifiers: literal braces
  EXPECT_TRUE(matches(braces, "a{,2}b{"));
  auto counted = regex("(ab){3}");
  EXPECT_TRUE(matches(counted, "ababab"));
  EXPECT_FALSE(matches(counted, "abab"));
}

TEST(RegexTest, UnsupportedConstructsAreRejectedClearly) {
  for (const char* re : {R"((a)\1)", "a(?=b)", "(?<!x)y", R"(\bword)", "(?i)abc", R"(\p{L}+)", "a$b"}) {
    try {
      grammar_from_regex(re);
      FAIL() << re << " should be rejected";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kUnsupported) << re << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find("not supported"), std::string::npos) << e.what();
    }
  }
  for (const char* re : {"(ab", "a)", "[a-", "*a", "a{3,2}", R"(\u12)"}) {
    try {
      grammar_from_regex(re);
      FAIL() << re << " should be rejected";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << re << ": " << e.what();
    }
  }
}

TEST(RegexTest, SearchSemanticsAndJsonEscaping) {
  Grammar g;
  g.set_root(g.add_rule(
      "root", seq_expr({byte_expr('"'), regex_to_expr(R"(^a"b\n)", CharEncoding::kJsonString, RegexMatch::kSearch),
                        byte_expr('"')})));
  auto c = compile(g);
  EXPECT_TRUE(matches(c, R"("a\"b\nxyz")"));
  EXPECT_TRUE(matches(c, R"("a\"b\u000A")"));
  EXPECT_FALSE(matches(c, "\"a\"b\n\""));    // raw quote/newline inside a JSON string
  EXPECT_FALSE(matches(c, R"("xa\"b\n")"));  // anchored at the start
  Grammar g2;
  g2.set_root(g2.add_rule("root", regex_to_expr("b+", CharEncoding::kUtf8, RegexMatch::kSearch)));
  EXPECT_TRUE(matches(compile(g2), "aabbcc"));
  EXPECT_FALSE(matches(compile(g2), "aacc"));
}

TEST(EbnfTest, GbnfFeatures) {
  auto g = ebnf(R"(
    # a tiny JSON-ish object
    root   ::= "{" ws ( pair ( "," ws pair )* )? "}"
    pair   ::= key ws ":" ws val ws
    key    ::= [a-z_] [a-z0-9_]{0,7}
    val    ::= [0-9]{1,3} | "null" | "\u00e9\x41" | [^\x00-\x7F]+
    ws     ::= [ \t\n]*
  )");
  EXPECT_TRUE(matches(g, "{}"));
  EXPECT_TRUE(matches(g, "{a: 12, b_2 : null}"));
  EXPECT_TRUE(matches(g, "{x:éA,y:日本}"));
  EXPECT_FALSE(matches(g, "{a: 1234}"));
  EXPECT_FALSE(matches(g, "{abcdefghi: 1}"));
  EXPECT_FALSE(matches(g, "{a: 1,}"));
}

TEST(EbnfTest, SyntaxErrorsHaveLineAndColumn) {
  try {
    grammar_from_ebnf("root ::= \"a\"\nx ::= ( \"b\"");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("2:"), std::string::npos) << e.what();
  }
  EXPECT_THROW(grammar_from_ebnf("root ::= \"a\"\nroot ::= \"b\""), Error);
  EXPECT_THROW(grammar_from_ebnf("root ::= [z-a]"), Error);
  EXPECT_THROW(grammar_from_ebnf("root ::= \"abc"), Error);
}

// A small vocabulary where every mask can be checked against brute force.
std::shared_ptr<const TokenizerInfo> toy_tokenizer() {
  std::vector<std::string> tokens = {"<eos>", "{",    "}",     "\"", "\":", "\",", "\"}", "a",     "ab",   "abc",
                                     ":",     ",",    " ",     "1",  "12",  "1.",  ".5",  "e",     "null", "nu",
                                     "ll",    "true", "[",     "]",  "],",  "\\",  "\\n", "\"a\"", "é",    "\xC3",
                                     "\xA9",  "{\"",  "\":\"", "0",  "-",   "x y", "\n  "};
  std::vector<bool> special(tokens.size(), false);
  special[0] = true;
  return std::make_shared<const TokenizerInfo>(Vocabulary(tokens, {0}, special, 70));
}

void expect_masks_exact(const std::shared_ptr<const CompiledGrammar>& g,
                        const std::shared_ptr<const TokenizerInfo>& tok, const std::vector<std::string>& prefixes) {
  auto cache = std::make_shared<TokenMaskCache>(g, tok);
  std::vector<uint64_t> mask(mask_words(tok->vocab.size()));
  for (const std::string& prefix : prefixes) {
    GrammarMatcher m(cache);
    ASSERT_TRUE(m.accept_bytes(prefix)) << prefix;
    m.fill_mask(mask);
    for (size_t t = 0; t < tok->vocab.size(); ++t) {
      int32_t id = static_cast<int32_t>(t);
      bool expected;
      if (id == 0) {
        expected = m.can_terminate();
      } else if (tok->vocab.is_special(id)) {
        expected = false;
      } else {
        expected = testing::token_allowed_bruteforce(g, prefix, tok->vocab.token_bytes(id));
      }
      EXPECT_EQ(test_token_bit(mask, id), expected)
          << "prefix '" << prefix << "' token " << t << " '" << (id < 37 ? tok->vocab.token_bytes(id) : "") << "'";
    }
  }
}

TEST(GrammarMatcherTest, MasksMatchBruteForceOnToyVocabulary) {
  auto g = ebnf(R"(
    root  ::= value
    value ::= obj | arr | str | num | "null" | "true"
    obj   ::= "{" ( str ":" value ( "," str ":" value )* )? "}"
    arr   ::= "[" ( value ( "," value )* )? "]"
    str   ::= "\"" ( [^"\\] | "\\" ["\\n] )* "\""
    num   ::= "-"? [0-9]+ ( "." [0-9]+ )? )");
  expect_masks_exact(g, toy_tokenizer(),
                     {"", "{", "{\"", "{\"a", "{\"a\"", "{\"a\":", "{\"a\":[", "{\"a\":[1", "{\"a\":[12.", "{\"a\":[1]",
                      "{\"a\":[1]}", "[\"\\", "[\"é", "[\"\xC3", "[[[", "[nu"});
}

TEST(GrammarMatcherTest, AcceptTokenEosAndRollback) {
  auto g = ebnf(R"(root ::= "{" "\"a\"" ":" ("1" | "12") "}")");
  auto tok = toy_tokenizer();
  auto cache = std::make_shared<TokenMaskCache>(g, tok);
  GrammarMatcher m(cache);
  EXPECT_FALSE(m.accept_token(0));  // EOS too early
  EXPECT_TRUE(m.accept_token(31));  // {"
  EXPECT_TRUE(m.accept_token(7));   // a
  EXPECT_TRUE(m.accept_token(4));   // ":
  EXPECT_TRUE(m.accept_token(14));  // 12
  EXPECT_FALSE(m.accept_token(14));
  EXPECT_NE(m.last_error().find("token 14"), std::string::npos) << m.last_error();
  m.rollback(1);
  EXPECT_TRUE(m.accept_token(13));  // 1
  EXPECT_TRUE(m.accept_token(2));   // }
  EXPECT_TRUE(m.can_terminate());
  EXPECT_FALSE(m.is_terminated());
  EXPECT_TRUE(m.accept_token(0));
  EXPECT_TRUE(m.is_terminated());
  std::vector<uint64_t> mask(mask_words(tok->vocab.size()));
  m.fill_mask(mask);
  for (uint64_t w : mask) EXPECT_EQ(w, 0u);
  m.rollback(3);
  EXPECT_FALSE(m.is_terminated());
  EXPECT_TRUE(m.accept_token(14));
}

}  // namespace
}  // namespace deepinfer::structured
