// Structured output in the engine: per-sequence grammar state and the two hooks around sampling.
//
//   add_request:  compile the request's constraint once (GrammarCompiler cache) -> StructuredState per sample
//   each step:    prepare_structured_mask (token mask of the matcher, EOS only where the grammar may end)
//                 -> sampler (the mask sets disallowed logits to -inf, greedy or random)
//                 -> accept_structured_token
//   preemption:   the matcher is dropped with the cache and rebuilt from the output tokens when the sequence
//                 samples again (recompute keeps the tokens, so the replay reaches the same state).
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "deepinfer/engine/sequence.h"
#include "deepinfer/structured/grammar_compiler.h"
#include "deepinfer/structured/grammar_matcher.h"

namespace deepinfer {
namespace tokenizer {
class Tokenizer;
}

struct StructuredState {
  structured::CompiledConstraint constraint;
  std::unique_ptr<structured::GrammarMatcher> matcher;  // null until first use and after a preemption
  std::vector<uint64_t> mask;                           // the matcher's layout (64 tokens per word)
  std::vector<uint32_t> allowed;                        // the sampler's layout (SamplingContext::allowed_tokens)
};

enum class StructuredMaskOutcome {
  kSample,           // `allowed` holds the mask; sample under it
  kGrammarComplete,  // the output is a complete sentence, nothing may follow and EOS is not allowed now
  kDeadEnd,          // the output is incomplete and no token that could be sampled continues it
};

// Engine construction: the compiler's vocabulary must match the model (vocab size) and the engine (EOS ids).
void check_structured_config(const structured::GrammarCompiler& compiler, std::span<const TokenId> eos_token_ids,
                             int64_t model_vocab_size);

// add_request: the request's constraint from the compiler's cache, errors prefixed with the request id (the
// front end's code is kept: InvalidArgument, Unsupported or ResourceExhausted). Warnings (lenient) are logged.
structured::CompiledConstraint compile_structured(structured::GrammarCompiler& compiler, const std::string& request_id,
                                                  const StructuredOutputParams& params);

// Fills st.allowed for the next token of `s` (whose output so far the matcher has accepted). EOS is allowed only
// where the grammar may end, and not at all under ignore_eos or before min_tokens outputs (nor are
// stop_token_ids then), so that the sampler never faces an empty row: that case is reported instead. Tokens
// whose logit is -inf do not count as samplable.
StructuredMaskOutcome prepare_structured_mask(StructuredState& st, const Sequence& s,
                                              std::span<const TokenId> eos_token_ids, std::span<const float> logits);
// The same from the sequence's params and output tokens (the step executor's own history, which it samples from
// on its worker thread without touching the engine's Sequence).
StructuredMaskOutcome prepare_structured_mask(StructuredState& st, const SamplingParams& p,
                                              std::span<const TokenId> output, std::span<const TokenId> eos_token_ids,
                                              std::span<const float> logits);

// Advances the matcher over the sampled token (an Internal error if the mask allowed a token it then rejects).
void accept_structured_token(StructuredState& st, TokenId token);

// The vocabulary a GrammarCompiler needs, from a Hugging Face tokenizer: each id's bytes, control tokens (and
// ids without a token, up to the model's padded vocabulary) never allowed, `eos_token_ids` allowed exactly where
// a grammar may end. Throws Unsupported for a tokenizer whose decoder puts separators between tokens (a token's
// bytes would depend on its neighbours).
std::shared_ptr<const structured::TokenizerInfo> make_structured_tokenizer_info(const tokenizer::Tokenizer& tok,
                                                                                std::span<const TokenId> eos_token_ids,
                                                                                int64_t model_vocab_size);

}  // namespace deepinfer
