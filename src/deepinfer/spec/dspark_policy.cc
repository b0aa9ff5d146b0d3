#include "deepinfer/spec/dspark_policy.h"

#include <algorithm>
#include <queue>
#include <tuple>

#include "deepinfer/core/error.h"

namespace deepinfer {

double dspark_expected_accepted(std::span<const float> confidence, int k) {
  DI_CHECK(k >= 0 && k <= static_cast<int>(confidence.size()))
      << "dspark_expected_accepted: k " << k << " outside [0, " << confidence.size() << "]";
  double survival = 1.0, total = 0.0;
  for (int i = 0; i < k; ++i) total += (survival *= confidence[i]);
  return total;
}

std::vector<int> dspark_verify_lengths(std::span<const std::span<const float>> confidences,
                                       const DsparkPolicyParams& p) {
  DI_CHECK(p.threshold >= 0.0 && p.threshold <= 1.0)
      << "DSpark policy: threshold " << p.threshold << " must be in [0, 1]";
  DI_CHECK(p.min_tokens >= 0) << "DSpark policy: min_tokens " << p.min_tokens << " must be >= 0";
  const size_t R = confidences.size();
  // Per request: the survival of each prefix, cut where it falls below the threshold.
  std::vector<std::vector<double>> survival(R);
  for (size_t r = 0; r < R; ++r) {
    const auto& c = confidences[r];
    const size_t cap = p.max_draft_tokens < 0 ? c.size() : std::min(c.size(), static_cast<size_t>(p.max_draft_tokens));
    double s = 1.0;
    for (size_t i = 0; i < cap; ++i) {
      DI_CHECK(c[i] >= 0.0f && c[i] <= 1.0f)
          << "DSpark policy: confidence " << c[i] << " of request " << r << " at draft " << i << " outside [0, 1]";
      s *= c[i];
      if (s < p.threshold && static_cast<int>(i) >= p.min_tokens) break;
      survival[r].push_back(s);
    }
  }
  std::vector<int> len(R, 0);
  // Max-heap on the next token's marginal gain; ties go to the lower request index.
  using Item = std::tuple<double, int64_t>;  // gain, -request
  std::priority_queue<Item> heap;
  for (size_t r = 0; r < R; ++r)
    if (!survival[r].empty()) heap.emplace(survival[r][0], -static_cast<int64_t>(r));
  int64_t budget = p.token_budget;
  while (!heap.empty() && budget != 0) {
    const auto [gain, neg_r] = heap.top();
    heap.pop();
    const size_t r = static_cast<size_t>(-neg_r);
    const size_t k = static_cast<size_t>(++len[r]);
    if (budget > 0) --budget;
    if (k < survival[r].size()) heap.emplace(survival[r][k], neg_r);
  }
  return len;
}

namespace spec {

DsparkBudgetPolicy::DsparkBudgetPolicy(double threshold, int min_tokens) {
  DI_CHECK(threshold >= 0.0 && threshold <= 1.0) << "confidence threshold " << threshold << " outside [0, 1]";
  DI_CHECK(min_tokens >= 0) << "DSpark policy: min_tokens " << min_tokens << " must be >= 0";
  params_.threshold = threshold;
  params_.min_tokens = min_tokens;
}

void DsparkBudgetPolicy::choose(std::span<const DraftCandidate> cands, int64_t budget, std::span<int> out) const {
  DI_CHECK_INTERNAL(out.size() == cands.size()) << "policy: " << out.size() << " outputs for " << cands.size();
  std::vector<std::vector<float>> sure(cands.size());
  std::vector<std::span<const float>> conf(cands.size());
  for (size_t i = 0; i < cands.size(); ++i) {
    const size_t n = static_cast<size_t>(std::max(0, cands[i].num_drafted));
    if (cands[i].confidence.size() >= n) {
      conf[i] = cands[i].confidence.first(n);
    } else {
      sure[i].assign(n, 1.0f);
      conf[i] = sure[i];
    }
  }
  DsparkPolicyParams p = params_;
  p.token_budget = std::max<int64_t>(0, budget);
  const std::vector<int> len = dspark_verify_lengths(conf, p);
  std::copy(len.begin(), len.end(), out.begin());
}

}  // namespace spec
}  // namespace deepinfer
