// Token masks over DeepSeek-V3's real 128k vocabulary (../shared; skipped when absent): exactness against a
// per-token brute-force check along sampled decoding paths, and (disabled by default) the mask benchmark.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "deepinfer/core/error.h"
#include "deepinfer/structured/ebnf.h"
#include "deepinfer/structured/json_schema.h"
#include "deepinfer/structured/regex.h"
#include "structured_test_helpers.h"

namespace deepinfer::structured {
namespace {

using json = nlohmann::ordered_json;

std::shared_ptr<const TokenizerInfo> tokenizer_or_skip() { return testing::deepseek_v3_tokenizer(); }

// Process CPU time in microseconds: the benchmark runs on a shared machine, where wall time includes waiting
// for a core. The peers' script measures the same clock.
double cpu_now_us() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
}

// Compares fill_mask with accepting each token's bytes one by one (and rolling back).
int check_mask_exact(GrammarMatcher& m, const TokenizerInfo& tok, std::vector<uint64_t>& mask) {
  m.fill_mask(mask);
  int mismatches = 0;
  for (size_t t = 0; t < tok.vocab.size(); ++t) {
    int32_t id = static_cast<int32_t>(t);
    bool expected = m.accept_token(id);
    if (expected) m.rollback(1);
    if (test_token_bit(mask, id) != expected && ++mismatches <= 5)
      ADD_FAILURE() << "token " << id << " '" << tok.vocab.token_bytes(id) << "': mask says "
                    << test_token_bit(mask, id) << ", brute force " << expected;
  }
  return mismatches;
}

// Random decoding: pick a random allowed token (preferring EOS late) and check every mask on the way.
void random_walk_exact(const std::shared_ptr<const CompiledGrammar>& g, const std::shared_ptr<const TokenizerInfo>& tok,
                       int steps, uint32_t seed) {
  auto cache = std::make_shared<TokenMaskCache>(g, tok);
  GrammarMatcher m(cache);
  std::vector<uint64_t> mask(mask_words(tok->vocab.size()));
  std::mt19937 rng(seed);
  for (int step = 0; step < steps && !m.is_terminated(); ++step) {
    ASSERT_EQ(check_mask_exact(m, *tok, mask), 0) << "step " << step;
    std::vector<int32_t> allowed;
    for (size_t t = 0; t < tok->vocab.size(); ++t)
      if (test_token_bit(mask, static_cast<int32_t>(t))) allowed.push_back(static_cast<int32_t>(t));
    ASSERT_FALSE(allowed.empty()) << "dead end at step " << step;
    int32_t pick = allowed[rng() % allowed.size()];
    ASSERT_TRUE(m.accept_token(pick)) << m.last_error();
  }
}

// The scratch form of detached_signature (arrays instead of hash maps, plus the memo of states known to reach
// more than max_states) gives the plain form's signatures, in any order of calls.
TEST(StructuredTokenMaskTest, DetachedSignatureScratchMatchesPlain) {
  auto g = testing::compile(
      json_schema_to_grammar(std::string_view(
                                 R"({"type":"object","properties":{"a":{"type":"string","maxLength":40},
                                "b":{"type":"array","items":{"type":"integer","minimum":-5,"maximum":900}},
                                "c":{"enum":["x","yy","zzz"]}},"required":["a"]})"))
          .grammar);
  const size_t n = g->num_states();
  for (const size_t max_states : {size_t{8}, size_t{64}, size_t{100000}}) {
    std::vector<uint32_t> scratch;
    int empty = 0;
    for (int pass = 0; pass < 2; ++pass)
      for (size_t k = 0; k < n; ++k) {
        const int32_t s = static_cast<int32_t>(pass == 0 ? k : n - 1 - k);
        const std::string plain = g->detached_signature(s, max_states);
        EXPECT_EQ(g->detached_signature(s, max_states, &scratch), plain) << "state " << s << " max " << max_states;
        empty += plain.empty();
      }
    if (max_states == 8) EXPECT_GT(empty, 0);  // the memo is exercised
    if (max_states == 100000) EXPECT_EQ(empty, 0);
  }
}

TEST(StructuredTokenMaskTest, DeepSeekVocabularyDecodes) {
  auto tok = tokenizer_or_skip();
  if (!tok) GTEST_SKIP() << "DeepSeek-V3 tokenizer.json absent";
  EXPECT_GE(tok->vocab.size(), 128000u);
  ASSERT_EQ(tok->vocab.eos_ids().size(), 1u);
  EXPECT_TRUE(tok->vocab.is_special(tok->vocab.eos_ids()[0]));
  int with_space = 0;
  for (size_t t = 0; t < tok->vocab.num_bytes_tokens(); ++t)
    with_space += !tok->vocab.token_bytes(static_cast<int32_t>(t)).empty() &&
                  tok->vocab.token_bytes(static_cast<int32_t>(t))[0] == ' ';
  EXPECT_GT(with_space, 10000);  // leading-space tokens decoded from the byte-level space
}

TEST(StructuredTokenMaskTest, JsonSchemaMasksExactAlongRandomPaths) {
  auto tok = tokenizer_or_skip();
  if (!tok) GTEST_SKIP() << "DeepSeek-V3 tokenizer.json absent";
  auto g = testing::compile(json_schema_to_grammar(std::string_view(R"({"type":"object","properties":{
      "name":{"type":"string","maxLength":12},"age":{"type":"integer","minimum":0,"maximum":150},
      "tags":{"type":"array","items":{"enum":["a","b c","\"q\""]},"maxItems":3},
      "next":{"$ref":"#"}},"required":["name"],"additionalProperties":false})"))
                                .grammar);
  random_walk_exact(g, tok, 6, 1);
  random_walk_exact(g, tok, 6, 2);
  // Keys in any order with extras between them (the set-of-seen-keys rules): random tokens reach other orders.
  auto any_order = testing::compile(json_schema_to_grammar(std::string_view(R"({"type":"object","properties":{
      "a":{"type":"integer"},"ab":{"type":"string","maxLength":3},"b":{"type":"boolean"}},"required":["b"],
      "additionalProperties":{"type":"null"}})"))
                                        .grammar);
  random_walk_exact(any_order, tok, 8, 5);
  random_walk_exact(any_order, tok, 8, 6);
}

TEST(StructuredTokenMaskTest, RegexAndEbnfMasksExact) {
  auto tok = tokenizer_or_skip();
  if (!tok) GTEST_SKIP() << "DeepSeek-V3 tokenizer.json absent";
  random_walk_exact(testing::compile(grammar_from_regex(R"((\d{3}-){2}[A-Za-z ]{1,10}\.)")), tok, 5, 3);
  random_walk_exact(testing::compile(grammar_from_ebnf(R"G(root ::= "(" expr ")"
      expr ::= term ( [+*] term )*
      term ::= [0-9]+ | "(" expr ")" | "x")G")),
                    tok, 5, 4);
}

// Masks against brute force at every byte of `text` (a text the grammar accepts), with a fresh cache.
void masks_exact_along(const std::shared_ptr<const CompiledGrammar>& g, const std::shared_ptr<const TokenizerInfo>& tok,
                       const std::string& text) {
  auto cache = std::make_shared<TokenMaskCache>(g, tok);
  GrammarMatcher m(cache);
  std::vector<uint64_t> mask(mask_words(tok->vocab.size()));
  for (size_t i = 0; i <= text.size(); ++i) {
    ASSERT_EQ(check_mask_exact(m, *tok, mask), 0) << "after " << i << " bytes of " << text;
    if (i < text.size()) ASSERT_TRUE(m.accept_bytes(text.substr(i, 1))) << m.last_error();
  }
}

// StackGraph::closed_class: the character class a pattern's state stays in, and the trie walk that takes whole
// subtrees of it (walk_trie's subtree sets). The uncached reference walk takes them too, so the masks are checked
// against brute force here, along strings of patterns and formats whose states are not self-loops: a URI (scheme,
// authority, port, path, query, fragment states), hex runs of a fixed length, `.` strings, a long counted
// repetition (one state per position).
TEST(StructuredTokenMaskTest, PatternClassesAndLongRepetitionsMasksExact) {
  auto js = [](const char* s) { return testing::compile(json_schema_to_grammar(std::string_view(s)).grammar); };
  {
    auto g = js(R"({"type":"string","pattern":"^[a-z0-9-]+$"})");
    StackGraph graph(g.get());
    uint32_t c = graph.start_config();
    for (char b : std::string("\"ab")) c = graph.step(c, static_cast<uint8_t>(b));
    ASSERT_EQ(graph.leaves(c).size(), 1u);
    const uint64_t* cls = graph.closed_class(graph.node_state(graph.leaves(c)[0]));
    for (int b = 0; b < 128; ++b) {
      const bool in = (b >= 'a' && b <= 'z') || (b >= '0' && b <= '9') || b == '-';
      EXPECT_EQ(b < 127 && ((cls[b >> 6] >> (b & 63)) & 1), in) << "byte " << b;
    }
    // Before the first character the state is not in the loop, but the class is the same: every run of it lives.
    const uint64_t* first =
        graph.closed_class(graph.node_state(graph.leaves(graph.step(graph.start_config(), '"'))[0]));
    EXPECT_EQ(first[0], cls[0]);
    EXPECT_EQ(first[1], cls[1]);
  }
  auto tok = tokenizer_or_skip();
  if (!tok) GTEST_SKIP() << "DeepSeek-V3 tokenizer.json absent";
  masks_exact_along(js(R"({"type":"string","format":"uri"})"), tok, "\"http://a.io:8/p%20?x#f\"");
  masks_exact_along(js(R"({"type":"string","pattern":"^[A-Fa-f\\d]{6}$"})"), tok, "\"0a1B2c\"");
  masks_exact_along(
      js(R"({"type":"object","patternProperties":{"^.*$":{"type":"string","pattern":"^[a-z]+(-[a-z]+)*$"}},
      "additionalProperties":false})"),
      tok, "{\"\xE2\x80\x94\":\"a-b\"}");
  masks_exact_along(js(R"({"type":"string","minLength":4,"maxLength":3000})"), tok, "\"ab\xC3\xA9 \"");
}

// The cached mask (per-state entries shared through one SharedMaskStore by every grammar, as GrammarCompiler
// runs them) against the uncached reference (one walk of the whole trie from the real parser stacks), along
// random decoding paths over many real schemas: every 97th maskbench case that compiles, ~16 steps each. The
// store is shared, so later schemas run on entries made by earlier ones (the cross-grammar path is exercised).
TEST(StructuredTokenMaskTest, CachedMasksEqualUncachedOverManySchemas) {
  auto tok = tokenizer_or_skip();
  if (!tok) GTEST_SKIP() << "DeepSeek-V3 tokenizer.json absent";
  const std::string path = testing::shared_path("data/maskbench/cases.jsonl.gz");
  if (!testing::file_exists(path)) GTEST_SKIP() << "../shared/data/maskbench is absent";
  auto lines = testing::read_gzip_lines(path);
  auto store = std::make_shared<SharedMaskStore>(tok.get());
  std::vector<uint64_t> cached(mask_words(tok->vocab.size())), uncached(cached.size());
  std::mt19937 rng(7);
  int schemas = 0, steps = 0, shared_hits = 0;
  for (size_t i = 0; i < lines.size(); i += 97) {
    json c = json::parse(lines[i]);
    std::shared_ptr<TokenMaskCache> cache;
    try {
      cache = std::make_shared<TokenMaskCache>(CompiledGrammar::compile(json_schema_to_grammar(c["schema"]).grammar),
                                               tok, store);
    } catch (const Error&) {
      continue;  // unsupported schemas are counted by the JSON Schema tests
    }
    ++schemas;
    GrammarMatcher m(cache);
    for (int step = 0; step < 16 && !m.is_terminated(); ++step, ++steps) {
      m.fill_mask(cached);
      m.fill_mask_uncached(uncached);
      size_t diff = 0;
      for (size_t w = 0; w < cached.size(); ++w) diff += std::popcount(cached[w] ^ uncached[w]);
      ASSERT_EQ(diff, 0u) << c["id"] << " step " << step;
      std::vector<int32_t> allowed;
      for (size_t t = 0; t < tok->vocab.size(); ++t)
        if (test_token_bit(cached, static_cast<int32_t>(t))) allowed.push_back(static_cast<int32_t>(t));
      ASSERT_FALSE(allowed.empty()) << c["id"] << " dead end at step " << step;
      // Prefer long tokens half of the time, so that paths get deep into the schema within a few steps.
      int32_t pick = allowed[rng() % allowed.size()];
      if (rng() % 2)
        for (int k = 0; k < 8; ++k) {
          int32_t other = allowed[rng() % allowed.size()];
          if (tok->vocab.token_bytes(other).size() > tok->vocab.token_bytes(pick).size()) pick = other;
        }
      ASSERT_TRUE(m.accept_token(pick)) << m.last_error();
    }
    shared_hits += static_cast<int>(cache->num_entries() - cache->num_walks());
  }
  EXPECT_GE(schemas, 40);
  EXPECT_GT(shared_hits, schemas);  // entries really came from the store
  std::printf("[cached-vs-uncached] %d schemas, %d masks compared, %d entries reused from the store\n", schemas, steps,
              shared_hits);
}

// ---- benchmark (not a timed test; run explicitly) ------------------------------------------------------------
//
// Reads the cases written by tools/structured_bench.py (schema + token ids of a valid instance, tokenized by
// the reference tokenizer) so that every engine replays the same token sequences, and prints one JSON line.
// Two passes over the same cases: each grammar with its own mask store (as if every schema were the first one
// this tokenizer sees), then one store shared by all grammars (as GrammarCompiler runs: JSON string/number
// states of later schemas start warm). The store is made outside the timing, like the vocabulary and its trie.
TEST(StructuredTokenMaskTest, DISABLED_Benchmark) {
  auto tok = tokenizer_or_skip();
  if (!tok) GTEST_SKIP() << "DeepSeek-V3 tokenizer.json absent";
  const char* path = std::getenv("DEEPINFER_STRUCTURED_BENCH_CASES");
  if (!path) GTEST_SKIP() << "set DEEPINFER_STRUCTURED_BENCH_CASES (tools/structured_bench.py writes it)";
  std::vector<json> cases;
  {
    std::ifstream in(path);
    for (std::string line; std::getline(in, line);) cases.push_back(json::parse(line));
  }
  // DEEPINFER_STRUCTURED_BENCH_ANY_ORDER=N overrides JsonSchemaOptions::any_order_max_properties (to compare).
  // DEEPINFER_STRUCTURED_BENCH_SLOW=1 prints every mask over 300 us after a case's first; =N (> 1) over N us.
  const char* slow_env = std::getenv("DEEPINFER_STRUCTURED_BENCH_SLOW");
  const double slow_us = slow_env == nullptr ? -1 : std::atoi(slow_env) > 1 ? std::atoi(slow_env) : 300;
  JsonSchemaOptions options;
  if (const char* v = std::getenv("DEEPINFER_STRUCTURED_BENCH_ANY_ORDER"))
    options.any_order_max_properties = std::atoi(v);
  std::vector<uint64_t> mask(mask_words(tok->vocab.size()));
  for (const bool shared : {false, true}) {
    auto store = shared ? std::make_shared<SharedMaskStore>(tok.get()) : nullptr;
    std::vector<double> compile_us, first_mask_us, mask_us;
    int failed = 0, rejected = 0;
    size_t walks = 0;
    for (const json& c : cases) {
      double t0 = cpu_now_us();
      std::shared_ptr<TokenMaskCache> cache;
      try {
        auto g = CompiledGrammar::compile(json_schema_to_grammar(c["schema"], options).grammar);
        cache = std::make_shared<TokenMaskCache>(g, tok, store);
      } catch (const Error&) {
        ++failed;
        continue;
      }
      compile_us.push_back(cpu_now_us() - t0);
      GrammarMatcher m(cache);
      bool first = true;
      int step = 0;
      for (const auto& t : c["tokens"]) {
        const size_t walks_before = cache->num_walks();
        double a = cpu_now_us();
        m.fill_mask(mask);
        double us = cpu_now_us() - a;
        (first ? first_mask_us : mask_us).push_back(us);
        if (!first && slow_us > 0 && us > slow_us)
          std::printf("slow mask %.0f us: %s step %d, %zu new walks\n", us, c["id"].get<std::string>().c_str(), step,
                      cache->num_walks() - walks_before);
        ++step;
        first = false;
        if (!m.accept_token(t.get<int32_t>())) {
          ++rejected;
          break;
        }
      }
      walks += cache->num_walks();
    }
    auto pct = [](std::vector<double> v, double p) {  // (see cpu_now: process CPU time)
      if (v.empty()) return 0.0;
      std::sort(v.begin(), v.end());
      return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
    };
    json out = {{"engine", shared ? "deepinfer (mask store shared by the schemas)" : "deepinfer (store per schema)"},
                {"cases", cases.size()},
                {"compile_failed", failed},
                {"rejected_valid", rejected},
                {"compile_us_p50", pct(compile_us, 0.5)},
                {"compile_us_p99", pct(compile_us, 0.99)},
                {"first_mask_us_p50", pct(first_mask_us, 0.5)},
                {"mask_us_p50", pct(mask_us, 0.5)},
                {"mask_us_p99", pct(mask_us, 0.99)},
                {"mask_us_max", pct(mask_us, 1.0)},
                {"masks", mask_us.size()},
                {"trie_walks", walks}};
    std::printf("%s\n", out.dump().c_str());
  }
}

}  // namespace
}  // namespace deepinfer::structured
