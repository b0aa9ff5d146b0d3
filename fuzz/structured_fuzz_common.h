// Shared oracle of the structured-output fuzz targets: a grammar that compiled must run consistently.
//   - the matcher accepts a byte prefix of the input, and rollback restores the previous state exactly;
//   - fill_mask over a small vocabulary equals accepting each token one by one (exactness, the property that
//     makes constrained decoding correct), at every step of a short decode driven by the input bytes.
// Any violation traps (libFuzzer reports it as a crash). Compile limits are small so that one input cannot
// spend the time budget building a huge automaton (that is a ResourceExhausted error, which is fine).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "deepinfer/core/error.h"
#include "deepinfer/structured/compiled_grammar.h"
#include "deepinfer/structured/grammar_matcher.h"
#include "deepinfer/structured/token_mask_cache.h"
#include "deepinfer/structured/vocabulary.h"

namespace deepinfer::structured::fuzz {

inline CompileLimits small_limits() {
  CompileLimits l;
  l.max_dfa_states = 20'000;
  l.max_nfa_states_per_rule = 40'000;
  return l;
}

// EOS, the 256 bytes and a few multi-byte tokens that cross JSON/regex structure.
inline std::shared_ptr<const TokenizerInfo> fuzz_vocabulary() {
  static std::shared_ptr<const TokenizerInfo> v = [] {
    std::vector<std::string> bytes{"<eos>"};
    for (int b = 0; b < 256; ++b) bytes.push_back(std::string(1, static_cast<char>(b)));
    for (const char* t : {"{\"", "\":", "\",\"", "\"}", "true", "null", "12", "ab", "\\u00", "\xC3\xA9", "]}", " \""})
      bytes.push_back(t);
    std::vector<bool> special(bytes.size(), false);
    special[0] = true;
    return std::make_shared<const TokenizerInfo>(Vocabulary(std::move(bytes), {0}, std::move(special)));
  }();
  return v;
}

inline void check(bool ok) {
  if (!ok) __builtin_trap();
}

inline void exercise(const Grammar& g, const uint8_t* data, size_t size) {
  std::shared_ptr<const CompiledGrammar> cg;
  try {
    cg = CompiledGrammar::compile(g, small_limits());
  } catch (const Error&) {
    return;  // left recursion, empty language, over the limits: clean errors
  }
  // Bytes: accept a prefix of the input one byte at a time; rollback(1) must restore can_terminate.
  GrammarMatcher bm(cg);
  for (size_t i = 0; i < size && i < 64; ++i) {
    const bool before = bm.can_terminate();
    if (!bm.accept_bytes(std::string(1, static_cast<char>(data[i])))) break;
    bm.rollback(1);
    check(bm.can_terminate() == before);
    check(bm.accept_bytes(std::string(1, static_cast<char>(data[i]))));
  }
  (void)bm.forced_bytes(32);
  // Tokens: masks vs brute force along a decode whose choices come from the input.
  auto tok = fuzz_vocabulary();
  auto cache = std::make_shared<TokenMaskCache>(cg, tok);
  GrammarMatcher m(cache);
  std::vector<uint64_t> mask(mask_words(tok->vocab.size()));
  for (size_t step = 0; step < 6 && !m.is_terminated(); ++step) {
    m.fill_mask(mask);
    std::vector<int32_t> allowed;
    for (size_t t = 0; t < tok->vocab.size(); ++t) {
      const int32_t id = static_cast<int32_t>(t);
      const bool ok = m.accept_token(id);
      if (ok) m.rollback(1);
      check(ok == test_token_bit(mask, id));
      if (ok) allowed.push_back(id);
    }
    // A trimmed grammar never dead-ends on bytes: every live state has a continuation or may end, and every byte
    // is a token here.
    check(!allowed.empty());
    const size_t pick = size ? data[step % size] : 0;
    check(m.accept_token(allowed[pick % allowed.size()]));
  }
}

}  // namespace deepinfer::structured::fuzz
