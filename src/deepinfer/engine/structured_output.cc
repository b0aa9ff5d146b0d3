#include "deepinfer/engine/structured_output.h"

#include <algorithm>
#include <bit>
#include <cmath>

#include "deepinfer/core/error.h"
#include "deepinfer/core/logging.h"
#include "deepinfer/tokenizer/tokenizer.h"

namespace deepinfer {

namespace {

void clear_bit(std::vector<uint64_t>& mask, TokenId t) {
  if (t >= 0 && static_cast<size_t>(t) < mask.size() * 64) mask[t >> 6] &= ~(uint64_t{1} << (t & 63));
}

// Recompute after a preemption (or the first sample): replay the output the sequence already has.
void ensure_matcher(StructuredState& st, std::span<const TokenId> output) {
  if (st.matcher) return;
  st.matcher = std::make_unique<structured::GrammarMatcher>(st.constraint.masks);
  for (TokenId t : output)
    DI_CHECK_INTERNAL(st.matcher->accept_token(t))
        << "replaying the output into the grammar matcher failed: " << st.matcher->last_error();
}

}  // namespace

void check_structured_config(const structured::GrammarCompiler& compiler, std::span<const TokenId> eos_token_ids,
                             int64_t model_vocab_size) {
  const structured::Vocabulary& v = compiler.tokenizer().vocab;
  DI_CHECK(static_cast<int64_t>(v.size()) == model_vocab_size)
      << "the grammar compiler's vocabulary has " << v.size() << " ids but the model's has " << model_vocab_size;
  std::vector<TokenId> a(eos_token_ids.begin(), eos_token_ids.end());
  std::vector<TokenId> b(v.eos_ids().begin(), v.eos_ids().end());
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  DI_CHECK(a == b) << "the grammar compiler's EOS ids differ from the engine's eos_token_ids (EOS must be allowed "
                      "exactly where a grammar may end)";
}

structured::CompiledConstraint compile_structured(structured::GrammarCompiler& compiler, const std::string& request_id,
                                                  const StructuredOutputParams& params) {
  structured::CompiledConstraint c;
  try {
    c = compiler.compile(params);
  } catch (const Error& e) {
    DI_FAIL(e.code()) << "request '" << request_id << "': " << e.message();
  }
  for (const auto& w : c.warnings) DI_LOG_WARN("request '{}': structured output: {}", request_id, w);
  return c;
}

StructuredMaskOutcome prepare_structured_mask(StructuredState& st, const Sequence& s,
                                              std::span<const TokenId> eos_token_ids, std::span<const float> logits) {
  return prepare_structured_mask(st, *s.params, s.output(), eos_token_ids, logits);
}

StructuredMaskOutcome prepare_structured_mask(StructuredState& st, const SamplingParams& p,
                                              std::span<const TokenId> output, std::span<const TokenId> eos_token_ids,
                                              std::span<const float> logits) {
  ensure_matcher(st, output);
  const size_t vocab = logits.size();
  st.mask.resize(structured::mask_words(vocab));
  st.matcher->fill_mask(st.mask);
  const bool before_min = static_cast<int64_t>(output.size()) < p.min_tokens;
  if (p.ignore_eos || before_min)
    for (TokenId t : eos_token_ids) clear_bit(st.mask, t);
  if (before_min)
    for (TokenId t : p.stop_token_ids) clear_bit(st.mask, t);
  bool any = false;
  for (size_t w = 0; w < st.mask.size() && !any; ++w)
    for (uint64_t bits = st.mask[w]; bits && !any; bits &= bits - 1) {
      const size_t t = w * 64 + std::countr_zero(bits);
      any = t < vocab && logits[t] != -INFINITY;
    }
  if (!any)
    return st.matcher->can_terminate() ? StructuredMaskOutcome::kGrammarComplete : StructuredMaskOutcome::kDeadEnd;
  st.allowed.resize((vocab + 31) / 32);
  for (size_t i = 0; i < st.allowed.size(); ++i)
    st.allowed[i] = static_cast<uint32_t>(st.mask[i / 2] >> (32 * (i % 2)));
  return StructuredMaskOutcome::kSample;
}

void accept_structured_token(StructuredState& st, TokenId token) {
  DI_CHECK_INTERNAL(st.matcher != nullptr) << "accept before the grammar matcher was prepared";
  DI_CHECK_INTERNAL(st.matcher->accept_token(token))
      << "the grammar matcher rejected token " << token << " that its mask allowed: " << st.matcher->last_error();
}

std::shared_ptr<const structured::TokenizerInfo> make_structured_tokenizer_info(const tokenizer::Tokenizer& tok,
                                                                                std::span<const TokenId> eos_token_ids,
                                                                                int64_t model_vocab_size) {
  DI_CHECK_CODE(tok.token_separator().empty(), ErrorCode::kUnsupported)
      << "structured output needs a tokenizer whose tokens concatenate into the text (a ByteLevel decoder); this "
         "one puts '"
      << tok.token_separator() << "' between tokens";
  const int64_t n = std::max<int64_t>(model_vocab_size, tok.vocab_size());
  std::vector<std::string> bytes(static_cast<size_t>(tok.vocab_size()));
  std::vector<bool> special(bytes.size(), true);
  for (int32_t id = 0; id < tok.vocab_size(); ++id) {
    if (!tok.is_valid_id(id) || tok.is_special(id)) continue;
    bytes[id] = tok.token_bytes(id);
    special[id] = bytes[id].empty();  // a token that emits nothing could be repeated forever
  }
  std::vector<int32_t> eos;
  for (TokenId t : eos_token_ids) {
    DI_CHECK(t >= 0 && t < n) << "eos token id " << t << " outside the vocabulary (" << n << ")";
    eos.push_back(t);
    if (t < static_cast<TokenId>(special.size())) special[t] = true;
  }
  return std::make_shared<const structured::TokenizerInfo>(
      structured::Vocabulary(std::move(bytes), std::move(eos), std::move(special), static_cast<size_t>(n)));
}

}  // namespace deepinfer
