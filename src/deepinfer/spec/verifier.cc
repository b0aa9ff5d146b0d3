#include "deepinfer/spec/verifier.h"

#include <cmath>
#include <limits>

#include "deepinfer/core/error.h"
#include "deepinfer/sampling/sampler.h"

namespace deepinfer::spec {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// softmax of a processed row in double (-inf entries get 0).
std::vector<double> probabilities(std::span<const float> row) {
  const TokenId best = argmax(row);
  DI_CHECK_INTERNAL(best >= 0) << "verifier: no token left in the target distribution";
  const double mx = row[best];
  std::vector<double> p(row.size(), 0.0);
  double total = 0;
  for (size_t i = 0; i < row.size(); ++i)
    if (row[i] != kNegInf) total += (p[i] = std::exp(static_cast<double>(row[i]) - mx));
  for (double& v : p) v /= total;
  return p;
}

// Inverse CDF over weights in id order (weights need not be normalised); -1 if they are all zero.
TokenId sample_weights(const std::vector<double>& w, double u) {
  double total = 0;
  for (double v : w) total += v;
  if (!(total > 0)) return -1;
  const double target = u * total;
  double cum = 0;
  TokenId last = -1;
  for (size_t i = 0; i < w.size(); ++i) {
    if (w[i] <= 0) continue;
    cum += w[i];
    last = static_cast<TokenId>(i);
    if (cum > target) return last;
  }
  return last;
}

}  // namespace

VerifyResult verify_draft(const Draft& draft, int n, bool greedy, const ProcessedRowFn& row, const StopFn& stop,
                          const RngKey& key, int64_t position) {
  DI_CHECK_INTERNAL(n >= 0 && n <= static_cast<int>(draft.tokens.size()))
      << "verify " << n << " of " << draft.tokens.size() << " drafts";
  DI_CHECK_INTERNAL(draft.probs.empty() || draft.probs.size() >= static_cast<size_t>(n))
      << "draft has " << draft.probs.size() << " distributions for " << n << " tokens";
  VerifyResult res;
  for (int i = 0; i <= n; ++i) {
    const std::vector<float> r = row(i);
    if (r.empty()) break;
    const int64_t pos = position + i;
    TokenId emit = -1;
    bool accepted = false;
    if (greedy) {
      emit = argmax(r);
      DI_CHECK_INTERNAL(emit >= 0) << "verifier: no token left in the target row";
      accepted = i < n && draft.tokens[i] == emit;
    } else if (i == n) {
      emit = sample_from_logits(r, rng_uniform(key, pos, 0));  // the bonus: exactly the plain sampler's draw
      DI_CHECK_INTERNAL(emit >= 0) << "verifier: no token left in the target row";
    } else {
      const TokenId d = draft.tokens[i];
      DI_CHECK_INTERNAL(d >= 0 && static_cast<size_t>(d) < r.size()) << "draft token " << d << " outside the vocab";
      const std::vector<double> p = probabilities(r);
      const double qd = draft.probs.empty() ? 1.0 : static_cast<double>(draft.probs[i][d]);
      // Accept with probability min(1, p(d)/q(d)): u·q(d) < p(d) for u uniform in [0, 1).
      if (rng_uniform(key, pos, 1) * qd < p[d]) {
        emit = d;
        accepted = true;
      } else {
        std::vector<double> residual = p;
        if (draft.probs.empty()) {
          residual[d] = 0;  // max(0, p - onehot(d))
        } else {
          const std::vector<float>& q = draft.probs[i];
          DI_CHECK_INTERNAL(q.size() == p.size())
              << "draft distribution over " << q.size() << " tokens, target " << p.size();
          for (size_t t = 0; t < p.size(); ++t) residual[t] = std::max(0.0, p[t] - static_cast<double>(q[t]));
        }
        emit = sample_weights(residual, rng_uniform(key, pos, 2));
        // A rejection has probability 0 when the residual is empty (p <= q everywhere means p == q); rounding can
        // still get here, and then p itself is the right distribution.
        if (emit < 0) emit = sample_weights(p, rng_uniform(key, pos, 2));
      }
    }
    res.tokens.push_back(emit);
    if (accepted) ++res.num_accepted;
    const bool end = stop(i, emit);
    if (!accepted || end || i == n) break;
  }
  return res;
}

}  // namespace deepinfer::spec
