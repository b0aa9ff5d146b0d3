// Indexer family on the CPU: lightning-indexer scores with causal visibility (over contiguous keys, or over
// paged keys for a batch of sequences), V4.1 candidate blocks, and the top-k selection mask. Ties in top-k go to the
// lower index (PyTorch leaves tie order unspecified).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "deepinfer/core/error.h"
#include "deepinfer/ops/cpu/cpu_backend.h"
#include "deepinfer/ops/cpu/pool_rows.h"

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

void CpuBackend::paged_indexer_scores(const PagedIndexerScoreParams& p) {
  validate(p);
  const int64_t tokens = p.q.dim(0), heads = p.q.dim(1), dim = p.q.dim(2), n = p.out.dim(1);
  const int64_t seqs = p.block_tables.dim(0), max_blocks = p.block_tables.dim(1);
  const int64_t bs = p.block_size, kr = p.key_ratio, per_block = bs / kr, pool_rows = p.key_pool.dim(0);
  const float* q = p.q.data_as<float>();
  const float* w = p.weights.data_as<float>();
  const int64_t* pos = p.positions.data_as<int64_t>();
  const int32_t* seq = p.q_seq.data_as<int32_t>();
  const int64_t* entries = p.n_entries.data_as<int64_t>();
  const int32_t* tables = p.block_tables.data_as<int32_t>();
  float* out = p.out.data_as<float>();
  // Row t scores entries [0, count[t]); the pool row of each is checked (and, in a bf16 pool, widened once) before
  // any work. Tokens of one sequence share its rows: handles per sequence, as far as its tokens score.
  std::vector<int64_t> count(tokens);
  PoolRows pool(p.key_pool, p.q.dim(2), kIndexKeyRecord);
  std::vector<std::vector<int64_t>> handles(static_cast<size_t>(seqs));
  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t b = seq[t];
    DI_CHECK(b >= 0 && b < seqs) << "paged_indexer_scores: q_seq[" << t << "] = " << b << " outside [0, " << seqs
                                 << ")";
    DI_CHECK(entries[t] >= 0 && entries[t] <= n)
        << "paged_indexer_scores: n_entries[" << t << "] = " << entries[t] << " outside [0, " << n << "]";
    count[t] = std::min(entries[t], (pos[t] + 1) / p.ratio);
    for (int64_t g = static_cast<int64_t>(handles[b].size()); g < count[t]; ++g) {
      const int64_t blk = g * kr / bs;
      DI_CHECK(blk < max_blocks) << "paged_indexer_scores: entry " << g << " of sequence " << b
                                 << " is beyond its block table (" << max_blocks << " blocks)";
      const int64_t id = tables[b * max_blocks + blk], row = id * per_block + (g * kr % bs) / kr;
      DI_CHECK(id >= 0 && row < pool_rows) << "paged_indexer_scores: block id " << id << " of sequence " << b
                                           << " is outside the pool of " << pool_rows << " rows";
      handles[b].push_back(pool.add(row));
    }
  }
  pool.seal();
  // The arithmetic of indexer_scores per entry (bit-identical to it over the same keys gathered in order).
  parallel_for(tokens, tokens * heads * n * dim, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      for (int64_t e = 0; e < n; ++e) {
        if (e >= count[t]) {
          out[t * n + e] = -INFINITY;
          continue;
        }
        float acc = 0.0f;
        for (int64_t h = 0; h < heads; ++h) {
          const float* key = pool.row(handles[seq[t]][e]);
          const float s = std::max(dot_f32(q + (t * heads + h) * dim, key, dim), 0.0f) * p.score_scale;
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
