#include "deepinfer/structured/dfa_minimize.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "deepinfer/core/error.h"
#include "deepinfer/structured/json_schema.h"
#include "structured/structured_test_helpers.h"

namespace deepinfer::structured {
namespace {

// Moore's refinement, written independently: split by (block, labels with their target blocks) until the number
// of blocks stops growing; blocks numbered by their smallest state.
std::vector<int32_t> moore(int32_t n, const std::vector<uint8_t>& accepting, const std::vector<DfaEdge>& edges) {
  std::vector<std::map<int32_t, int32_t>> out(n);
  for (const DfaEdge& e : edges) out[e.from][e.label] = e.to;
  std::vector<int32_t> block(n);
  for (int32_t s = 0; s < n; ++s) block[s] = accepting[s];
  for (int32_t count = -1;;) {
    std::map<std::vector<int32_t>, int32_t> ids;
    std::vector<int32_t> next(n);
    for (int32_t s = 0; s < n; ++s) {
      std::vector<int32_t> sig{block[s]};
      for (auto [label, to] : out[s]) {
        sig.push_back(label);
        sig.push_back(block[to]);
      }
      next[s] = ids.emplace(sig, static_cast<int32_t>(ids.size())).first->second;
    }
    std::map<int32_t, int32_t> renumber;
    for (int32_t s = 0; s < n; ++s)
      next[s] = renumber.emplace(next[s], static_cast<int32_t>(renumber.size())).first->second;
    block = next;
    if (static_cast<int32_t>(ids.size()) == count) return block;
    count = static_cast<int32_t>(ids.size());
  }
}

// Accepted words of length <= depth from `s` (labels as characters).
void words(const std::vector<std::map<int32_t, int32_t>>& out, const std::vector<uint8_t>& accepting, int32_t s,
           int depth, std::string& prefix, std::vector<std::string>& into) {
  if (accepting[s]) into.push_back(prefix);
  if (depth == 0) return;
  for (auto [label, to] : out[s]) {
    prefix.push_back(static_cast<char>('a' + label));
    words(out, accepting, to, depth - 1, prefix, into);
    prefix.pop_back();
  }
}

TEST(DfaMinimizeTest, RandomPartialDfasMatchMooreAndKeepEveryStatesLanguage) {
  std::mt19937 rng(1234);
  int merged_somewhere = 0;
  for (int iter = 0; iter < 400; ++iter) {
    const int32_t n = 1 + static_cast<int32_t>(rng() % 40);
    const int32_t labels = 1 + static_cast<int32_t>(rng() % 4);
    const int density = 30 + static_cast<int>(rng() % 70);  // percent of (state, label) pairs with an edge
    // Few distinct targets make equal futures likely (a reachability shape like the compiler's rules).
    const int32_t targets = 1 + static_cast<int32_t>(rng() % n);
    std::vector<uint8_t> accepting(n);
    for (auto& a : accepting) a = rng() % 3 == 0;
    std::vector<DfaEdge> edges;
    for (int32_t s = 0; s < n; ++s)
      for (int32_t l = 0; l < labels; ++l)
        if (static_cast<int>(rng() % 100) < density)
          edges.push_back(DfaEdge{s, l * 7 - 3, static_cast<int32_t>(rng() % targets)});
    std::shuffle(edges.begin(), edges.end(), rng);
    const std::vector<int32_t> got = minimize_dfa(n, accepting, edges);
    ASSERT_EQ(got, moore(n, accepting, edges)) << "iteration " << iter;
    const int32_t blocks = *std::max_element(got.begin(), got.end()) + 1;
    merged_somewhere += blocks < n;
    // The quotient automaton: every state accepts what its block does.
    std::vector<std::map<int32_t, int32_t>> out(n), qout(blocks);
    std::vector<uint8_t> qacc(blocks);
    for (const DfaEdge& e : edges) {
      out[e.from][(e.label + 3) / 7] = e.to;
      qout[got[e.from]][(e.label + 3) / 7] = got[e.to];
    }
    for (int32_t s = 0; s < n; ++s) qacc[got[s]] = accepting[s];
    for (int32_t s = 0; s < n; ++s) {
      std::vector<std::string> a, b;
      std::string p;
      words(out, accepting, s, 5, p, a);
      words(qout, qacc, got[s], 5, p, b);
      ASSERT_EQ(a, b) << "iteration " << iter << " state " << s;
    }
  }
  EXPECT_GT(merged_somewhere, 100);  // the cases exercise merging, not only the identity
}

TEST(DfaMinimizeTest, EdgeCases) {
  EXPECT_EQ(minimize_dfa(0, {}, {}), std::vector<int32_t>{});
  EXPECT_EQ(minimize_dfa(1, {1}, {{0, 0, 0}}), std::vector<int32_t>{0});
  // Two accepting sinks merge; a state without edges differs from one with a loop.
  EXPECT_EQ(minimize_dfa(3, {0, 1, 1}, {{0, 0, 1}, {0, 1, 2}}), (std::vector<int32_t>{0, 1, 1}));
  EXPECT_EQ(minimize_dfa(3, {0, 1, 1}, {{0, 0, 1}, {0, 1, 2}, {2, 0, 2}}), (std::vector<int32_t>{0, 1, 2}));
  // Same labels, different calls (labels) keep states apart.
  EXPECT_EQ(minimize_dfa(3, {0, 0, 1}, {{0, 5, 2}, {1, 6, 2}}), (std::vector<int32_t>{0, 1, 2}));
  EXPECT_THROW(minimize_dfa(2, {0, 0}, {{0, 0, 2}}), deepinfer::Error);
}

// The compiler's rule DFAs are minimal: the "any key but the names" rule no longer has a copy of the UTF-8 and
// \uXXXX states that leave the names for every name prefix.
TEST(DfaMinimizeTest, KeyRuleOfManyNamesHasAboutOneStatePerPrefix) {
  nlohmann::ordered_json props = nlohmann::ordered_json::object();
  std::set<std::string> prefixes;  // the nodes of the names' trie
  for (int i = 0; i < 40; ++i) {
    const std::string name = "property_name_" + std::to_string(i * 37);
    props[name] = {{"type", "integer"}};
    for (size_t k = 0; k <= name.size(); ++k) prefixes.insert(name.substr(0, k));
  }
  nlohmann::ordered_json schema = {{"type", "object"}, {"properties", props}};
  const auto g = testing::compile(json_schema_to_grammar(schema).grammar);
  int key_states = -1;
  for (size_t r = 0; r < g->num_rules(); ++r) {
    if (g->rule_name(static_cast<int>(r)).rfind("key", 0) != 0 || g->rule_name(static_cast<int>(r)) == "key_rest")
      continue;
    const int32_t begin = g->rule_start(static_cast<int>(r));
    const int32_t end =
        r + 1 < g->num_rules() ? g->rule_start(static_cast<int>(r) + 1) : static_cast<int32_t>(g->num_states());
    key_states = std::max(key_states, end - begin);
  }
  ASSERT_GT(key_states, 0) << "no key rule found";
  // One state per trie node, plus a handful on the shared leave path (UTF-8 continuation levels, \uXXXX, the
  // return of the rest) and the opening quote; unminimized every node had its own ~10.
  EXPECT_LE(key_states, static_cast<int>(prefixes.size()) + 24) << prefixes.size() << " trie nodes";
  EXPECT_TRUE(testing::matches(g, R"({"property_name_37":1,"property_name_3":2,"x\u00e9":3})"));
  EXPECT_TRUE(testing::matches(g, "{\"property_name_37\":1,\"property_name_3\xC3\xA9\":4}"));
  EXPECT_FALSE(testing::matches(g, R"({"property_name_37":"s"})"));
  EXPECT_FALSE(testing::matches(g, "{\"property_name_3\xC3\":4}"));
}

}  // namespace
}  // namespace deepinfer::structured
