#include "deepinfer/sampling/logits_processors.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <unordered_map>

#include "deepinfer/core/error.h"

namespace deepinfer {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Token ids sorted by descending logit, lower id first on ties: the one order every filter agrees on.
std::vector<int32_t> sorted_by_logit(std::span<const float> logits) {
  std::vector<int32_t> order;
  order.reserve(logits.size());
  for (size_t i = 0; i < logits.size(); ++i)
    if (logits[i] != kNegInf) order.push_back(static_cast<int32_t>(i));
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
  });
  return order;
}

}  // namespace

std::vector<double> softmax(std::span<const float> logits) {
  std::vector<double> p(logits.size(), 0.0);
  float mx = kNegInf;
  for (float v : logits) mx = std::max(mx, v);
  if (mx == kNegInf) return p;
  double sum = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    p[i] = logits[i] == kNegInf ? 0.0 : std::exp(static_cast<double>(logits[i]) - mx);
    sum += p[i];
  }
  for (double& v : p) v /= sum;
  return p;
}

std::vector<float> log_softmax(std::span<const float> logits) {
  std::vector<float> out(logits.size(), kNegInf);
  float mx = kNegInf;
  for (float v : logits) mx = std::max(mx, v);
  if (mx == kNegInf) return out;
  double sum = 0;
  for (float v : logits)
    if (v != kNegInf) sum += std::exp(static_cast<double>(v) - mx);
  const double lse = mx + std::log(sum);
  for (size_t i = 0; i < logits.size(); ++i)
    if (logits[i] != kNegInf) out[i] = static_cast<float>(logits[i] - lse);
  return out;
}

void TokenMaskProcessor::apply(std::span<float> logits, const SamplingParams&, const SamplingContext& ctx) const {
  const auto& mask = ctx.allowed_tokens;
  DI_CHECK(mask.size() * 32 >= logits.size())
      << "token mask has " << mask.size() << " words, too few for a vocabulary of " << logits.size();
  bool any = false;
  for (size_t t = 0; t < logits.size() && !any; ++t) any = (mask[t / 32] >> (t % 32)) & 1u;
  DI_CHECK_INTERNAL(any) << "the token mask allows no token";
  for (size_t t = 0; t < logits.size(); ++t)
    if (!((mask[t / 32] >> (t % 32)) & 1u)) logits[t] = kNegInf;
}

void MinTokensProcessor::apply(std::span<float> logits, const SamplingParams& p, const SamplingContext& ctx) const {
  const int64_t vocab = static_cast<int64_t>(logits.size());
  auto suppress = [&](TokenId t) {
    if (t >= 0 && t < vocab) logits[t] = kNegInf;
  };
  for (TokenId t : ctx.eos_token_ids) suppress(t);
  for (TokenId t : p.stop_token_ids) suppress(t);
}

bool PenaltyProcessor::enabled(const SamplingParams& p, const SamplingContext& ctx) const {
  const bool any = p.repetition_penalty != 1.0f || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f;
  return any && (!ctx.prompt.empty() || !ctx.output.empty());
}

void PenaltyProcessor::apply(std::span<float> logits, const SamplingParams& p, const SamplingContext& ctx) const {
  const int64_t vocab = static_cast<int64_t>(logits.size());
  // Counts over the output only; `seen` also covers the prompt (repetition penalty). Maps, not vocab-sized
  // arrays: sequences are far shorter than the 129k vocabulary.
  std::unordered_map<TokenId, int> output_counts;
  for (TokenId t : ctx.output) ++output_counts[t];
  if (p.repetition_penalty != 1.0f) {
    std::unordered_map<TokenId, bool> seen;
    for (TokenId t : ctx.prompt) seen[t] = true;
    for (TokenId t : ctx.output) seen[t] = true;
    for (const auto& [t, unused] : seen) {
      if (t < 0 || t >= vocab || logits[t] == kNegInf) continue;
      logits[t] = logits[t] > 0 ? logits[t] / p.repetition_penalty : logits[t] * p.repetition_penalty;
    }
  }
  for (const auto& [t, count] : output_counts) {
    if (t < 0 || t >= vocab || logits[t] == kNegInf) continue;
    logits[t] -= p.frequency_penalty * static_cast<float>(count) + p.presence_penalty;
  }
}

void TemperatureProcessor::apply(std::span<float> logits, const SamplingParams& p, const SamplingContext&) const {
  const float inv = 1.0f / p.temperature;
  for (float& v : logits)
    if (v != kNegInf) v *= inv;
}

void TopKProcessor::apply(std::span<float> logits, const SamplingParams& p, const SamplingContext&) const {
  if (static_cast<size_t>(p.top_k) >= logits.size()) return;
  std::vector<int32_t> ids(logits.size());
  std::iota(ids.begin(), ids.end(), 0);
  auto better = [&](int32_t a, int32_t b) { return logits[a] != logits[b] ? logits[a] > logits[b] : a < b; };
  std::nth_element(ids.begin(), ids.begin() + p.top_k, ids.end(), better);
  for (size_t i = p.top_k; i < ids.size(); ++i) logits[ids[i]] = kNegInf;
}

void TopPProcessor::apply(std::span<float> logits, const SamplingParams& p, const SamplingContext&) const {
  const std::vector<int32_t> order = sorted_by_logit(logits);
  if (order.empty()) return;
  const float mx = logits[order[0]];
  double total = 0;
  for (int32_t t : order) total += std::exp(static_cast<double>(logits[t]) - mx);
  double cum = 0;
  size_t keep = 0;
  while (keep < order.size() && cum < p.top_p) cum += std::exp(static_cast<double>(logits[order[keep++]]) - mx) / total;
  for (size_t i = keep; i < order.size(); ++i) logits[order[i]] = kNegInf;
}

void MinPProcessor::apply(std::span<float> logits, const SamplingParams& p, const SamplingContext&) const {
  float mx = kNegInf;
  for (float v : logits) mx = std::max(mx, v);
  if (mx == kNegInf) return;
  // p_t >= min_p * p_max  <=>  logit_t - logit_max >= log(min_p). The max token always survives.
  const double threshold = std::log(static_cast<double>(p.min_p));
  for (float& v : logits)
    if (v != kNegInf && static_cast<double>(v) - mx < threshold) v = kNegInf;
}

LogitsProcessorChain LogitsProcessorChain::standard() {
  LogitsProcessorChain c;
  c.add(std::make_unique<TokenMaskProcessor>());
  c.add(std::make_unique<MinTokensProcessor>());
  c.add(std::make_unique<PenaltyProcessor>());
  c.add(std::make_unique<TemperatureProcessor>());
  c.add(std::make_unique<TopKProcessor>());
  c.add(std::make_unique<TopPProcessor>());
  c.add(std::make_unique<MinPProcessor>());
  return c;
}

LogitsProcessorChain LogitsProcessorChain::greedy() {
  LogitsProcessorChain c;
  c.add(std::make_unique<TokenMaskProcessor>());
  c.add(std::make_unique<MinTokensProcessor>());
  c.add(std::make_unique<PenaltyProcessor>());
  return c;
}

void LogitsProcessorChain::apply(std::span<float> logits, const SamplingParams& p, const SamplingContext& ctx) const {
  for (const auto& proc : processors_)
    if (proc->enabled(p, ctx)) proc->apply(logits, p, ctx);
}

}  // namespace deepinfer
