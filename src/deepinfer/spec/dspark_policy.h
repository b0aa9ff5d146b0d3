// DSpark's confidence-scheduled verification (MODELS.md Part A §4): how many of each request's draft tokens the
// target verifies this step.
//
// The confidence head gives c_i ≈ P(draft i accepted | drafts < i accepted), so the survival of a prefix of
// length k is S(k) = c_0·…·c_{k-1}, and verifying k drafts yields Σ_{j<=k} S(j) accepted tokens in expectation.
// Per request the prefix stops before S drops below `threshold` (but keeps at least `min_tokens`); across the
// batch the step's `token_budget` draft tokens go greedily to the largest marginal gain S_r(k_r + 1). S is
// non-increasing in k, so the greedy allocation maximises the expected accepted tokens for the budget.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "deepinfer/spec/policy.h"

namespace deepinfer {

struct DsparkPolicyParams {
  double threshold = 0.3;     // smallest prefix survival worth verifying, in [0, 1]
  int min_tokens = 1;         // verified regardless of the threshold (when drafted and the budget allows)
  int64_t token_budget = -1;  // draft tokens per step across the batch; < 0: unlimited
  int max_draft_tokens = -1;  // per request; < 0: as many as it proposed
};

// confidences[r] = c_0 .. c_{n_r - 1} of request r (each in [0, 1]). Returns the draft tokens to verify per
// request (0 = plain decode for it this step).
std::vector<int> dspark_verify_lengths(std::span<const std::span<const float>> confidences,
                                       const DsparkPolicyParams& p);

// Expected accepted draft tokens when verifying the first k drafts: Σ_{j=1..k} Π_{i<j} c_i.
double dspark_expected_accepted(std::span<const float> confidence, int k);

namespace spec {

// The engine's VerifyPolicy for DSpark: dspark_verify_lengths over the step's candidates with the step's budget.
// A candidate without confidences counts every draft as sure (survival 1), so it verifies all it drafted first.
class DsparkBudgetPolicy final : public VerifyPolicy {
 public:
  explicit DsparkBudgetPolicy(double threshold, int min_tokens = 1);
  void choose(std::span<const DraftCandidate> cands, int64_t budget, std::span<int> out) const override;

 private:
  DsparkPolicyParams params_;
};

}  // namespace spec
}  // namespace deepinfer
