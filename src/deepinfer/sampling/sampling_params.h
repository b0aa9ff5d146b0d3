// SamplingParams: how one request turns logits into tokens and when it stops. Plain data, validated once at the
// API boundary (Engine::add_request) so the sampler and the stop checks never see an out-of-range value.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace deepinfer {

using TokenId = int32_t;

// The most top logprobs a request may ask for (OpenAI's limit is 20).
inline constexpr int kMaxTopLogprobs = 20;
// Upper bound on `n` (parallel samples per request); each sample is a full sequence.
inline constexpr int kMaxSamplesPerRequest = 128;

// Structured output: the output must be a sentence of a JSON Schema, any JSON object, a regex or a GBNF
// grammar (src/deepinfer/structured, docs/STRUCTURED.md). The engine compiles each distinct constraint once per
// tokenizer, masks disallowed tokens before sampling and allows EOS only where the sentence may end.
enum class StructuredOutputKind : uint8_t {
  kNone,
  kJsonSchema,  // spec: JSON Schema text (draft 2020-12)
  kJsonObject,  // spec empty: any JSON object
  kRegex,       // spec: ECMAScript-flavoured pattern, matched against the whole output
  kGrammar,     // spec: GBNF text with a `root` rule
};
std::string_view structured_output_kind_name(StructuredOutputKind k);

struct StructuredOutputParams {
  StructuredOutputKind kind = StructuredOutputKind::kNone;
  std::string spec;
  // JSON Schema: an unsupported keyword is a warning (the keyword is not enforced) instead of an error.
  bool lenient = false;
  // JSON Schema / json_object: bytes of [ \t\n\r] allowed in each gap between tokens; -1 = unbounded.
  int max_whitespace = 16;

  bool active() const { return kind != StructuredOutputKind::kNone; }
  static StructuredOutputParams json_schema(std::string schema) {
    return {StructuredOutputKind::kJsonSchema, std::move(schema)};
  }
  static StructuredOutputParams json_object() { return {StructuredOutputKind::kJsonObject, ""}; }
  static StructuredOutputParams regex(std::string pattern) {
    return {StructuredOutputKind::kRegex, std::move(pattern)};
  }
  static StructuredOutputParams grammar(std::string gbnf) { return {StructuredOutputKind::kGrammar, std::move(gbnf)}; }
};

struct SamplingParams {
  // 0 selects greedy decoding (argmax after penalties); otherwise logits are divided by it.
  float temperature = 1.0f;
  int top_k = 0;                    // 0 or -1: disabled; otherwise keep the k most likely tokens
  float top_p = 1.0f;               // (0, 1]: keep the smallest top set whose probability reaches top_p
  float min_p = 0.0f;               // [0, 1]: drop tokens with probability below min_p * max probability
  float repetition_penalty = 1.0f;  // > 0; 1 = off. Applies to tokens seen in the prompt or the output
  float presence_penalty = 0.0f;    // [-2, 2]; subtracted once from every token seen in the output
  float frequency_penalty = 0.0f;   // [-2, 2]; subtracted per occurrence in the output
  // With a seed, the random stream depends only on (seed, sample index, position): the same request gives the
  // same tokens whatever else is in the batch. Without one, the engine's seed and the sequence id are used.
  std::optional<uint64_t> seed;

  std::optional<int> max_tokens;  // >= 1; unset: until max_model_len
  int min_tokens = 0;             // EOS and stop tokens are suppressed before this many output tokens
  int n = 1;                      // independent samples of the same prompt
  std::vector<TokenId> stop_token_ids;
  std::vector<std::string> stop;  // stop strings; matched on detokenized output text
  bool ignore_eos = false;
  // Unset: no logprobs. k >= 0: the chosen token's logprob plus the k most likely tokens'. Logprobs are those of
  // the model's raw distribution (log_softmax of the logits before any processor), as OpenAI/vLLM report them.
  std::optional<int> logprobs;
  // Constrained decoding; kind kNone = unconstrained.
  StructuredOutputParams structured;

  bool greedy() const { return temperature == 0.0f; }
};

// Throws InvalidArgument naming the parameter and its allowed range. `vocab_size` > 0 also checks token ids.
void validate(const SamplingParams& p, int64_t vocab_size = 0);

}  // namespace deepinfer
