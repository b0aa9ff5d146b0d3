// Speculative decoding: how many draft tokens the target verifies per sequence in one step (docs/SPECULATIVE.md).
// A policy sees every speculating sequence of the step at once, because verification tokens share the step's
// token budget (each verified draft costs one target position, like a prefill token).
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>

#include "deepinfer/core/error.h"

namespace deepinfer::spec {

struct DraftCandidate {
  int num_drafted = 0;                // tokens the proposer returned
  std::span<const float> confidence;  // Draft::confidence (may be empty)
};

class VerifyPolicy {
 public:
  virtual ~VerifyPolicy() = default;
  // Writes out[i] in [0, cands[i].num_drafted]: the drafts of sequence i to verify; the sum stays <= budget.
  virtual void choose(std::span<const DraftCandidate> cands, int64_t budget, std::span<int> out) const = 0;
};

// Verify everything drafted (the proposer was already asked for at most k), in batch order until the budget
// is spent. The MTP default.
class FixedLengthPolicy final : public VerifyPolicy {
 public:
  void choose(std::span<const DraftCandidate> cands, int64_t budget, std::span<int> out) const override {
    DI_CHECK_INTERNAL(out.size() == cands.size()) << "policy: " << out.size() << " outputs for " << cands.size();
    for (size_t i = 0; i < cands.size(); ++i) {
      out[i] = static_cast<int>(std::clamp<int64_t>(budget, 0, cands[i].num_drafted));
      budget -= out[i];
    }
  }
};

// DSpark's adaptive length: verify the longest prefix whose survival product prod_{j<=n} c_j stays >= threshold
// (at least `min_tokens` when drafted); candidates without confidence verify all their drafts. Budget in batch
// order as above.
class ConfidencePolicy final : public VerifyPolicy {
 public:
  explicit ConfidencePolicy(double threshold, int min_tokens = 1) : threshold_(threshold), min_tokens_(min_tokens) {
    DI_CHECK(threshold >= 0.0 && threshold <= 1.0) << "confidence threshold " << threshold << " outside [0, 1]";
  }
  void choose(std::span<const DraftCandidate> cands, int64_t budget, std::span<int> out) const override {
    DI_CHECK_INTERNAL(out.size() == cands.size()) << "policy: " << out.size() << " outputs for " << cands.size();
    for (size_t i = 0; i < cands.size(); ++i) {
      int n = cands[i].num_drafted;
      if (!cands[i].confidence.empty()) {
        double survive = 1.0;
        n = 0;
        for (int j = 0; j < cands[i].num_drafted && j < static_cast<int>(cands[i].confidence.size()); ++j) {
          survive *= cands[i].confidence[j];
          if (survive < threshold_ && n >= min_tokens_) break;
          ++n;
        }
      }
      out[i] = static_cast<int>(std::clamp<int64_t>(budget, 0, n));
      budget -= out[i];
    }
  }

 private:
  double threshold_;
  int min_tokens_;
};

}  // namespace deepinfer::spec
