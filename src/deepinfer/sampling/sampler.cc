#include "deepinfer/sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "deepinfer/core/error.h"

namespace deepinfer {

namespace {
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
}  // namespace

TokenId argmax(std::span<const float> logits) {
  TokenId best = -1;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (logits[i] == kNegInf || std::isnan(logits[i])) continue;
    if (best < 0 || logits[i] > logits[best]) best = static_cast<TokenId>(i);
  }
  return best;
}

TokenId sample_from_logits(std::span<const float> logits, double u) {
  const TokenId best = argmax(logits);
  if (best < 0) return -1;
  const double mx = logits[best];
  double total = 0;
  for (float v : logits)
    if (v != kNegInf) total += std::exp(static_cast<double>(v) - mx);
  const double target = u * total;
  double cum = 0;
  TokenId last = best;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (logits[i] == kNegInf) continue;
    cum += std::exp(static_cast<double>(logits[i]) - mx);
    last = static_cast<TokenId>(i);
    if (cum > target) return last;
  }
  return last;  // rounding left target at or above the sum: the last allowed token
}

std::vector<TokenLogprob> top_logprobs(std::span<const float> logprobs, int k) {
  std::vector<int32_t> ids(logprobs.size());
  std::iota(ids.begin(), ids.end(), 0);
  k = std::min<int>(k, static_cast<int>(ids.size()));
  if (k <= 0) return {};
  auto better = [&](int32_t a, int32_t b) { return logprobs[a] != logprobs[b] ? logprobs[a] > logprobs[b] : a < b; };
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), better);
  std::vector<TokenLogprob> out;
  out.reserve(k);
  for (int i = 0; i < k; ++i) out.push_back({ids[i], logprobs[ids[i]]});
  return out;
}

Sampler::Sampler() : standard_(LogitsProcessorChain::standard()), greedy_(LogitsProcessorChain::greedy()) {}

std::vector<float> Sampler::process(std::span<const float> logits, const SamplingParams& p,
                                    const SamplingContext& ctx) const {
  std::vector<float> row(logits.begin(), logits.end());
  (p.greedy() ? greedy_ : standard_).apply(row, p, ctx);
  return row;
}

SampleResult Sampler::sample(std::span<const float> logits, const SamplingParams& p, const SamplingContext& ctx,
                             const RngKey& key, int64_t position) const {
  SampleResult r = sample_token(logits, p, ctx, key, position);
  add_logprobs(r, logits, p);
  return r;
}

SampleResult Sampler::sample_token(std::span<const float> logits, const SamplingParams& p, const SamplingContext& ctx,
                                   const RngKey& key, int64_t position) const {
  DI_CHECK(!logits.empty()) << "cannot sample from an empty logits row";
  const std::vector<float> row = process(logits, p, ctx);
  SampleResult r;
  r.token = p.greedy() ? argmax(row) : sample_from_logits(row, rng_uniform(key, position));
  DI_CHECK_INTERNAL(r.token >= 0) << kNoTokenLeft;
  return r;
}

float token_logprob(std::span<const float> logits, TokenId token) {
  const float kNegInf = -std::numeric_limits<float>::infinity();
  float mx = kNegInf;
  for (float v : logits) mx = std::max(mx, v);
  if (mx == kNegInf || logits[token] == kNegInf) return kNegInf;
  double sum = 0;
  for (float v : logits)
    if (v != kNegInf) sum += std::exp(static_cast<double>(v) - mx);
  const double lse = mx + std::log(sum);
  return static_cast<float>(logits[token] - lse);
}

void Sampler::add_logprobs(SampleResult& r, std::span<const float> logits, const SamplingParams& p) {
  if (!p.logprobs) return;
  if (*p.logprobs == 0) {  // the chosen token's only (offline's decode perplexity)
    r.logprob = token_logprob(logits, r.token);
    return;
  }
  const std::vector<float> lp = log_softmax(logits);
  r.logprob = lp[r.token];
  r.top_logprobs = top_logprobs(lp, *p.logprobs);
}

}  // namespace deepinfer
