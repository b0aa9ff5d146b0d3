#include "deepinfer/sampling/sampling_params.h"

#include <cmath>

#include "deepinfer/core/error.h"

namespace deepinfer {

std::string_view structured_output_kind_name(StructuredOutputKind k) {
  switch (k) {
    case StructuredOutputKind::kNone:
      return "none";
    case StructuredOutputKind::kJsonSchema:
      return "json_schema";
    case StructuredOutputKind::kJsonObject:
      return "json_object";
    case StructuredOutputKind::kRegex:
      return "regex";
    case StructuredOutputKind::kGrammar:
      return "grammar";
  }
  return "?";
}

void validate(const SamplingParams& p, int64_t vocab_size) {
  DI_CHECK(std::isfinite(p.temperature) && p.temperature >= 0.0f)
      << "temperature must be a finite value >= 0 (0 = greedy), got " << p.temperature;
  DI_CHECK(p.top_k >= -1) << "top_k must be -1 or 0 (disabled) or >= 1, got " << p.top_k;
  DI_CHECK(std::isfinite(p.top_p) && p.top_p > 0.0f && p.top_p <= 1.0f) << "top_p must be in (0, 1], got " << p.top_p;
  DI_CHECK(std::isfinite(p.min_p) && p.min_p >= 0.0f && p.min_p <= 1.0f) << "min_p must be in [0, 1], got " << p.min_p;
  DI_CHECK(std::isfinite(p.repetition_penalty) && p.repetition_penalty > 0.0f)
      << "repetition_penalty must be a finite value > 0 (1 = off), got " << p.repetition_penalty;
  DI_CHECK(std::isfinite(p.presence_penalty) && p.presence_penalty >= -2.0f && p.presence_penalty <= 2.0f)
      << "presence_penalty must be in [-2, 2], got " << p.presence_penalty;
  DI_CHECK(std::isfinite(p.frequency_penalty) && p.frequency_penalty >= -2.0f && p.frequency_penalty <= 2.0f)
      << "frequency_penalty must be in [-2, 2], got " << p.frequency_penalty;
  if (p.max_tokens) DI_CHECK(*p.max_tokens >= 1) << "max_tokens must be >= 1, got " << *p.max_tokens;
  DI_CHECK(p.min_tokens >= 0) << "min_tokens must be >= 0, got " << p.min_tokens;
  if (p.max_tokens)
    DI_CHECK(p.min_tokens <= *p.max_tokens)
        << "min_tokens must be <= max_tokens (" << *p.max_tokens << "), got " << p.min_tokens;
  DI_CHECK(p.n >= 1 && p.n <= kMaxSamplesPerRequest)
      << "n must be in [1, " << kMaxSamplesPerRequest << "], got " << p.n;
  if (p.logprobs)
    DI_CHECK(*p.logprobs >= 0 && *p.logprobs <= kMaxTopLogprobs)
        << "logprobs must be in [0, " << kMaxTopLogprobs << "], got " << *p.logprobs;
  for (size_t i = 0; i < p.stop.size(); ++i) DI_CHECK(!p.stop[i].empty()) << "stop[" << i << "] must not be empty";
  const StructuredOutputParams& so = p.structured;
  if (so.kind == StructuredOutputKind::kJsonObject || so.kind == StructuredOutputKind::kNone) {
    DI_CHECK(so.spec.empty()) << "structured output " << structured_output_kind_name(so.kind)
                              << " takes no spec text, got " << so.spec.size() << " bytes";
  } else {
    DI_CHECK(!so.spec.empty()) << "structured output " << structured_output_kind_name(so.kind)
                               << ": the spec text is empty";
  }
  DI_CHECK(so.max_whitespace >= -1) << "structured output max_whitespace must be >= -1 (-1 = unbounded), got "
                                    << so.max_whitespace;
  for (size_t i = 0; i < p.stop_token_ids.size(); ++i) {
    const TokenId t = p.stop_token_ids[i];
    DI_CHECK(t >= 0 && (vocab_size <= 0 || t < vocab_size))
        << "stop_token_ids[" << i << "] must be in [0, " << (vocab_size > 0 ? std::to_string(vocab_size) : "vocab")
        << "), got " << t;
  }
}

}  // namespace deepinfer
