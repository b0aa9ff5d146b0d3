// Indexer family on the CPU: lightning-indexer scores with causal visibility, V4.1 candidate blocks, and
// the top-k selection mask. Ties in top-k go to the lower index (PyTorch leaves tie order unspecified).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "deepinfer/ops/cpu/cpu_backend.h"

namespace deepinfer {
namespace {

// Indices of the top `k` finite scores of a row (higher first, lower index first on ties).
std::vector<int64_t> top_finite(const float* scores, int64_t n, int64_t k) {
  std::vector<int64_t> idx(n);
  std::iota(idx.begin(), idx.end(), 0);
  k = std::min(k, n);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                    [&](int64_t a, int64_t b) { return scores[a] > scores[b] || (scores[a] == scores[b] && a < b); });
  idx.resize(k);
  // Picks beyond the finite entries come back −inf: they are not selections.
  idx.erase(std::remove_if(idx.begin(), idx.end(), [&](int64_t i) { return scores[i] == -INFINITY; }), idx.end());
  return idx;
}

}  // namespace

void CpuBackend::indexer_scores(const IndexerScoreParams& p) {
  validate(p);
  const int64_t tokens = p.q.dim(0), heads = p.q.dim(1), dim = p.q.dim(2), n = p.keys.dim(0);
  const float* q = p.q.data_as<float>();
  const float* keys = p.keys.data_as<float>();
  const float* w = p.weights.data_as<float>();
  const int64_t* pos = p.positions.data_as<int64_t>();
  float* out = p.out.data_as<float>();
  parallel_for(tokens, tokens * heads * n * dim, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t visible = (pos[t] + 1) / p.ratio;
      for (int64_t e = 0; e < n; ++e) {
        if (e >= visible) {
          out[t * n + e] = -INFINITY;
          continue;
        }
        float acc = 0.0f;
        for (int64_t h = 0; h < heads; ++h) {
          const float s = std::max(dot_f32(q + (t * heads + h) * dim, keys + e * dim, dim), 0.0f) * p.score_scale;
          acc += s * (w[t * heads + h] * p.weight_scale);
        }
        out[t * n + e] = acc;
      }
    }
  });
}

void CpuBackend::candidate_blocks(const CandidateBlocksParams& p) {
  validate(p);
  const int64_t tokens = p.scores.dim(0), n = p.scores.dim(1), bs = p.block_size;
  const int64_t blocks = (n + bs - 1) / bs;
  std::vector<float> block_score(blocks);
  for (int64_t t = 0; t < tokens; ++t) {
    const float* s = p.scores.data_as<float>() + t * n;
    for (int64_t b = 0; b < blocks; ++b) {
      float mx = -INFINITY;
      for (int64_t e = b * bs; e < std::min(n, (b + 1) * bs); ++e) mx = std::max(mx, s[e]);
      block_score[b] = mx;
    }
    // The block holding the newest visible entry is only partly filled; it is always kept.
    const int64_t visible = (p.positions.data_as<int64_t>()[t] + 1) / p.ratio;
    if (visible > 0 && (visible - 1) / bs < blocks) block_score[(visible - 1) / bs] = INFINITY;
    uint8_t* keep = p.keep.data_as<uint8_t>() + t * n;
    std::fill(keep, keep + n, 0);
    for (int64_t b : top_finite(block_score.data(), blocks, p.topk_blocks))
      for (int64_t e = b * bs; e < std::min(n, (b + 1) * bs); ++e) keep[e] = 1;
  }
}

void CpuBackend::topk_mask(const TopKMaskParams& p) {
  validate(p);
  const int64_t tokens = p.scores.dim(0), n = p.scores.dim(1);
  std::vector<float> row(n);
  for (int64_t t = 0; t < tokens; ++t) {
    const float* s = p.scores.data_as<float>() + t * n;
    const uint8_t* allowed = p.allowed.data() ? p.allowed.data_as<uint8_t>() + t * n : nullptr;
    for (int64_t e = 0; e < n; ++e) row[e] = (allowed && !allowed[e]) ? -INFINITY : s[e];
    uint8_t* out = p.out.data_as<uint8_t>() + t * n;
    std::fill(out, out + n, 0);
    for (int64_t e : top_finite(row.data(), n, p.k)) out[e] = 1;
  }
}

}  // namespace deepinfer
