// GrammarMatcher: the per-request state of constrained decoding.
//
//   auto matcher = GrammarMatcher(cache);       // cache: TokenMaskCache for (grammar, tokenizer)
//   matcher.fill_mask(mask);                    // before sampling: bit t set iff token t may come next
//   matcher.accept_token(t);                    // after sampling (false + last_error() if t was not allowed)
//   matcher.rollback(k);                        // speculative decoding: undo the last k accepted tokens
//   matcher.is_terminated();                    // EOS was accepted
//
// Exactness: a token is allowed iff its bytes extend the input to a prefix of some sentence of the grammar
// (EOS: iff the input is a complete sentence). The grammar is trimmed at compile time, so "some parser stack
// survives" is the same thing as "can still complete".
// A matcher without a vocabulary works on bytes only (accept_bytes / can_terminate), e.g. for validation.
// Not thread-safe; one matcher per sequence. Memory grows with the input (stacks are hash-consed, never freed).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "deepinfer/structured/compiled_grammar.h"
#include "deepinfer/structured/stack_graph.h"
#include "deepinfer/structured/token_mask_cache.h"

namespace deepinfer::structured {

class GrammarMatcher {
 public:
  explicit GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar);
  explicit GrammarMatcher(std::shared_ptr<TokenMaskCache> masks);

  // All-or-nothing: on rejection the state is unchanged and last_error() says where and what was expected.
  // Each successful call is one step for rollback().
  bool accept_bytes(std::string_view bytes);
  bool accept_token(int32_t token);
  // Undoes the last n successful accept_* calls (n <= num_accepted()).
  void rollback(int n);
  int num_accepted() const { return static_cast<int>(history_.size()) - 1; }
  void reset();

  // The input so far is a complete sentence (EOS would be allowed).
  bool can_terminate() const { return graph_.can_end(history_.back().config); }
  bool is_terminated() const { return history_.back().terminated; }
  // mask.size() must be mask_words(vocab size). Needs the TokenMaskCache constructor.
  void fill_mask(std::span<uint64_t> mask);
  // The same mask computed without the per-state cache: one walk of the whole vocabulary trie from the current
  // parser stacks (milliseconds). The reference the cached path is tested against.
  void fill_mask_uncached(std::span<uint64_t> mask);
  // Bytes that every continuation must start with (jump-forward decoding); empty when there is a choice.
  std::string forced_bytes(size_t max_bytes = 256);

  const std::string& last_error() const { return error_; }
  const CompiledGrammar& grammar() const { return *grammar_; }
  size_t num_stack_nodes() const { return graph_.num_nodes(); }

 private:
  struct Step {
    uint32_t config;
    bool terminated;
  };

  std::shared_ptr<const CompiledGrammar> grammar_;
  std::shared_ptr<TokenMaskCache> masks_;
  StackGraph graph_;
  std::vector<Step> history_;
  std::string error_;
  std::vector<uint32_t> scratch_;
};

}  // namespace deepinfer::structured
