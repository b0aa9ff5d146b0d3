// GrammarCompiler: a request's structured-output constraint (sampling_params.h) -> the shared token-mask cache
// its matchers run on. One compiler per tokenizer (vocabulary + trie built once); each distinct constraint
// (kind, spec text, options) is compiled once and kept in an LRU cache, so many requests with the same schema
// share one CompiledGrammar and one TokenMaskCache (whose per-state masks warm up across requests); all caches share
// one SharedMaskStore, so states whose automaton another constraint already had start warm too.
//
//   auto compiler = std::make_shared<GrammarCompiler>(tokenizer_info);
//   CompiledConstraint c = compiler->compile(params.structured);   // throws on a bad spec
//   GrammarMatcher m(c.masks);
//
// Thread-safe. Evicting an entry does not invalidate matchers that still hold its cache (shared ownership).
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "deepinfer/sampling/sampling_params.h"
#include "deepinfer/structured/compiled_grammar.h"
#include "deepinfer/structured/token_mask_cache.h"
#include "deepinfer/structured/vocabulary.h"

namespace deepinfer::structured {

struct CompiledConstraint {
  std::shared_ptr<TokenMaskCache> masks;
  std::vector<std::string> warnings;  // lenient JSON Schema: keywords that were ignored, etc.
};

struct GrammarCompilerStats {
  int64_t hits = 0;
  int64_t misses = 0;  // compilations, successful or not
  int64_t failures = 0;
};

class GrammarCompiler {
 public:
  explicit GrammarCompiler(std::shared_ptr<const TokenizerInfo> tokenizer, size_t max_entries = 256,
                           CompileLimits limits = {});

  // Throws deepinfer::Error whose message starts with "structured output (<kind>): ": InvalidArgument for a
  // malformed spec (bad JSON, regex or GBNF syntax, undefined rule, left recursion, empty language), Unsupported
  // for a construct the front ends do not implement, ResourceExhausted for an automaton over the limits.
  // Failures are not cached (a retry compiles again).
  CompiledConstraint compile(const StructuredOutputParams& params);

  const TokenizerInfo& tokenizer() const { return *tokenizer_; }
  std::shared_ptr<const TokenizerInfo> tokenizer_ptr() const { return tokenizer_; }
  size_t vocab_size() const { return tokenizer_->vocab.size(); }
  GrammarCompilerStats stats() const;
  size_t num_cached() const;

 private:
  struct Slot {
    std::string key;
    CompiledConstraint value;
  };

  std::shared_ptr<const TokenizerInfo> tokenizer_;
  // Token-mask entries of every constraint compiled here, by state signature (token_mask_cache.h): the JSON
  // string/number rules of a new schema start warm.
  std::shared_ptr<SharedMaskStore> mask_store_;
  size_t max_entries_;
  CompileLimits limits_;
  mutable std::mutex mu_;
  std::list<Slot> lru_;  // most recently used first
  std::unordered_map<std::string, std::list<Slot>::iterator> index_;
  GrammarCompilerStats stats_;
};

// The grammar of a constraint without a vocabulary (validation, tests). Same errors as GrammarCompiler::compile.
std::shared_ptr<const CompiledGrammar> compile_constraint_grammar(const StructuredOutputParams& params,
                                                                  std::vector<std::string>* warnings = nullptr,
                                                                  const CompileLimits& limits = {});

}  // namespace deepinfer::structured
