// Sampler: one row of logits → one token (+ logprobs). Greedy when temperature is 0, otherwise inverse-CDF
// sampling of the processed distribution with one counter-based uniform (rng.h), walking tokens in id order.
// Each row depends only on its own logits, params, history and RNG key, which is what makes sampling
// batch-invariant: the engine may sample rows in any order or in parallel.
#pragma once

#include <span>
#include <vector>

#include "deepinfer/sampling/logits_processors.h"
#include "deepinfer/sampling/rng.h"
#include "deepinfer/sampling/sampling_params.h"

namespace deepinfer {

struct TokenLogprob {
  TokenId token = 0;
  float logprob = 0.0f;
};

struct SampleResult {
  TokenId token = 0;
  float logprob = 0.0f;                    // raw-model logprob of `token`; only filled when params.logprobs is set
  std::vector<TokenLogprob> top_logprobs;  // params.logprobs entries, most likely first (lower id on ties)
};

class Sampler {
 public:
  Sampler();

  // `position` is the position of the token being sampled (the sequence length before it), which keys the RNG.
  SampleResult sample(std::span<const float> logits, const SamplingParams& p, const SamplingContext& ctx,
                      const RngKey& key, int64_t position) const;
  // `sample` in two parts: the token alone, then the log-probabilities of params.logprobs (a pass over the whole
  // vocabulary per row, which the engine runs for many rows at once on several threads).
  SampleResult sample_token(std::span<const float> logits, const SamplingParams& p, const SamplingContext& ctx,
                            const RngKey& key, int64_t position) const;
  static void add_logprobs(SampleResult& r, std::span<const float> logits, const SamplingParams& p);

  // The logits after the processor chain that `sample` would use (greedy: mask and penalties only). For tests
  // and for the speculative verifier, which needs the processed distribution itself.
  std::vector<float> process(std::span<const float> logits, const SamplingParams& p, const SamplingContext& ctx) const;

 private:
  LogitsProcessorChain standard_;
  LogitsProcessorChain greedy_;
};

// What sampling reports for a row with no token left (every logit -inf or NaN); the greedy fast path reports it too.
inline constexpr const char* kNoTokenLeft = "no token left to sample (all logits -inf or NaN)";

// argmax, lowest id on ties; -1 if every entry is -inf.
TokenId argmax(std::span<const float> logits);
// The first token whose cumulative probability exceeds u * total, walking ids in order. `u` in [0, 1).
TokenId sample_from_logits(std::span<const float> logits, double u);
// log_softmax(logits)[token] without the vocabulary-sized output: the float max, then the sum of exp(x - max) over
// the entries that are not -inf in double, in id order, and (x[token] - (max + log(sum))) rounded to float — the
// same arithmetic as log_softmax, so bit-identical to it. -inf when the token's logit (or every logit) is -inf.
float token_logprob(std::span<const float> logits, TokenId token);
// The k most likely tokens of a row (descending, lower id on ties) with their log-probabilities.
std::vector<TokenLogprob> top_logprobs(std::span<const float> logprobs, int k);

}  // namespace deepinfer
