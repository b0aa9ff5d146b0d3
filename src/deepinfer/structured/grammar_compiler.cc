#include "deepinfer/structured/grammar_compiler.h"

#include "deepinfer/core/error.h"
#include "deepinfer/structured/ebnf.h"
#include "deepinfer/structured/json_schema.h"
#include "deepinfer/structured/regex.h"

namespace deepinfer::structured {
namespace {

Grammar front_end(const StructuredOutputParams& p, std::vector<std::string>* warnings) {
  JsonSchemaOptions jo;
  jo.lenient = p.lenient;
  jo.max_whitespace = p.max_whitespace;
  switch (p.kind) {
    case StructuredOutputKind::kJsonSchema: {
      JsonSchemaGrammar g = json_schema_to_grammar(std::string_view(p.spec), jo);
      if (warnings) *warnings = std::move(g.warnings);
      return std::move(g.grammar);
    }
    case StructuredOutputKind::kJsonObject: {
      JsonSchemaGrammar g = json_schema_to_grammar(std::string_view(R"({"type":"object"})"), jo);
      return std::move(g.grammar);
    }
    case StructuredOutputKind::kRegex:
      return grammar_from_regex(p.spec);
    case StructuredOutputKind::kGrammar:
      return grammar_from_ebnf(p.spec);
    case StructuredOutputKind::kNone:
      break;
  }
  DI_FAIL(ErrorCode::kInvalidArgument) << "structured output: no constraint kind given";
}

std::string cache_key(const StructuredOutputParams& p) {
  std::string key;
  key += static_cast<char>(p.kind);
  key += p.lenient ? '1' : '0';
  key += std::to_string(p.max_whitespace);
  key += '\0';
  key += p.spec;
  return key;
}

}  // namespace

std::shared_ptr<const CompiledGrammar> compile_constraint_grammar(const StructuredOutputParams& params,
                                                                  std::vector<std::string>* warnings,
                                                                  const CompileLimits& limits) {
  try {
    return CompiledGrammar::compile(front_end(params, warnings), limits);
  } catch (const Error& e) {
    // Say which request option was wrong; keep the front end's code (InvalidArgument / Unsupported / ...).
    DI_FAIL(e.code()) << "structured output (" << structured_output_kind_name(params.kind) << "): " << e.message();
  }
}

GrammarCompiler::GrammarCompiler(std::shared_ptr<const TokenizerInfo> tokenizer, size_t max_entries,
                                 CompileLimits limits)
    : tokenizer_(std::move(tokenizer)), max_entries_(max_entries), limits_(limits) {
  DI_CHECK(tokenizer_ != nullptr) << "GrammarCompiler needs a tokenizer";
  mask_store_ = std::make_shared<SharedMaskStore>(tokenizer_.get());
  DI_CHECK(max_entries_ >= 1) << "GrammarCompiler: max_entries must be >= 1";
}

CompiledConstraint GrammarCompiler::compile(const StructuredOutputParams& params) {
  const std::string key = cache_key(params);
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = index_.find(key);
    if (it != index_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      ++stats_.hits;
      return it->second->value;
    }
    ++stats_.misses;
  }
  // Compile outside the lock: a large schema must not stall other requests' lookups. Two threads compiling the
  // same new spec at once both compile; the second insert is dropped.
  CompiledConstraint c;
  try {
    auto grammar = compile_constraint_grammar(params, &c.warnings, limits_);
    c.masks = std::make_shared<TokenMaskCache>(std::move(grammar), tokenizer_, mask_store_);
  } catch (...) {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.failures;
    throw;
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (index_.count(key)) return c;
  lru_.push_front(Slot{key, c});
  index_[key] = lru_.begin();
  while (lru_.size() > max_entries_) {
    index_.erase(lru_.back().key);
    lru_.pop_back();
  }
  return c;
}

GrammarCompilerStats GrammarCompiler::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

size_t GrammarCompiler::num_cached() const {
  std::lock_guard<std::mutex> lock(mu_);
  return lru_.size();
}

}  // namespace deepinfer::structured
