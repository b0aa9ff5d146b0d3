// The logits-processor chain: each processor rewrites one row of logits in place, in a fixed order
//
//   token mask (grammar) → min-tokens → penalties → temperature → top-k → top-p → min-p
//
// The mask comes first so that the penalties and filters only ever see allowed tokens (a top-k applied before
// a grammar mask could leave nothing to sample). Filters drop a token by setting its logit to -inf; at least one
// token always survives. Every processor is a pure function of (logits, params, context), so a row's result
// does not depend on the other rows of the batch.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "deepinfer/sampling/sampling_params.h"

namespace deepinfer {

// What a processor may read about the sequence being sampled.
struct SamplingContext {
  std::span<const TokenId> prompt;  // prompt token ids
  std::span<const TokenId> output;  // tokens generated so far
  // Allowed-token bitmask from a grammar matcher, bit t of word t/32 set = allowed (xgrammar's layout). Empty:
  // every token allowed.
  std::span<const uint32_t> allowed_tokens;
  // The model's EOS ids: suppressed (with stop_token_ids) until min_tokens outputs exist.
  std::span<const TokenId> eos_token_ids;
};

class LogitsProcessor {
 public:
  virtual ~LogitsProcessor() = default;
  virtual std::string_view name() const = 0;
  // False when the params make this processor the identity (skipped, saving a pass over the vocabulary).
  virtual bool enabled(const SamplingParams& p, const SamplingContext& ctx) const = 0;
  virtual void apply(std::span<float> logits, const SamplingParams& p, const SamplingContext& ctx) const = 0;
};

// Sets disallowed tokens to -inf. If the mask allows nothing the row is left unchanged and an Internal error is
// raised: a grammar that admits no token is a matcher bug, not something to sample around.
class TokenMaskProcessor final : public LogitsProcessor {
 public:
  std::string_view name() const override { return "token_mask"; }
  bool enabled(const SamplingParams&, const SamplingContext& ctx) const override { return !ctx.allowed_tokens.empty(); }
  void apply(std::span<float> logits, const SamplingParams& p, const SamplingContext& ctx) const override;
};

// While fewer than min_tokens outputs exist, EOS and stop_token_ids get -inf so the sequence cannot stop early.
class MinTokensProcessor final : public LogitsProcessor {
 public:
  std::string_view name() const override { return "min_tokens"; }
  bool enabled(const SamplingParams& p, const SamplingContext& ctx) const override {
    return static_cast<int64_t>(ctx.output.size()) < p.min_tokens;
  }
  void apply(std::span<float> logits, const SamplingParams& p, const SamplingContext& ctx) const override;
};

// vLLM/HF semantics: repetition divides positive logits (multiplies negative ones) of every token seen in the
// prompt or output; presence subtracts once and frequency per occurrence, counting output tokens only.
class PenaltyProcessor final : public LogitsProcessor {
 public:
  std::string_view name() const override { return "penalties"; }
  bool enabled(const SamplingParams& p, const SamplingContext&) const override;
  void apply(std::span<float> logits, const SamplingParams& p, const SamplingContext& ctx) const override;
};

class TemperatureProcessor final : public LogitsProcessor {
 public:
  std::string_view name() const override { return "temperature"; }
  bool enabled(const SamplingParams& p, const SamplingContext&) const override {
    return p.temperature > 0.0f && p.temperature != 1.0f;
  }
  void apply(std::span<float> logits, const SamplingParams& p, const SamplingContext& ctx) const override;
};

// Keeps the k largest logits; ties at the boundary are broken toward the lower token id so the kept set is
// exactly k and deterministic.
class TopKProcessor final : public LogitsProcessor {
 public:
  std::string_view name() const override { return "top_k"; }
  bool enabled(const SamplingParams& p, const SamplingContext&) const override { return p.top_k > 0; }
  void apply(std::span<float> logits, const SamplingParams& p, const SamplingContext& ctx) const override;
};

// Keeps the most likely tokens (descending probability, lower id first on ties) until their cumulative
// probability reaches top_p; the token that crosses the threshold is kept.
class TopPProcessor final : public LogitsProcessor {
 public:
  std::string_view name() const override { return "top_p"; }
  bool enabled(const SamplingParams& p, const SamplingContext&) const override { return p.top_p < 1.0f; }
  void apply(std::span<float> logits, const SamplingParams& p, const SamplingContext& ctx) const override;
};

// Drops tokens whose probability is below min_p times the largest probability.
class MinPProcessor final : public LogitsProcessor {
 public:
  std::string_view name() const override { return "min_p"; }
  bool enabled(const SamplingParams& p, const SamplingContext&) const override { return p.min_p > 0.0f; }
  void apply(std::span<float> logits, const SamplingParams& p, const SamplingContext& ctx) const override;
};

class LogitsProcessorChain {
 public:
  // mask → min-tokens → penalties → temperature → top-k → top-p → min-p.
  static LogitsProcessorChain standard();
  // The part of the chain that can change an argmax: mask, min-tokens and penalties. Greedy sampling runs only this.
  static LogitsProcessorChain greedy();

  void add(std::unique_ptr<LogitsProcessor> p) { processors_.push_back(std::move(p)); }
  void apply(std::span<float> logits, const SamplingParams& p, const SamplingContext& ctx) const;
  size_t size() const { return processors_.size(); }

 private:
  std::vector<std::unique_ptr<LogitsProcessor>> processors_;
};

// Numerically stable softmax / log_softmax over a row (-inf entries get probability 0), accumulated in double.
std::vector<double> softmax(std::span<const float> logits);
std::vector<float> log_softmax(std::span<const float> logits);

}  // namespace deepinfer
