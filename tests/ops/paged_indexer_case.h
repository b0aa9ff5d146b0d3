// A random decode batch for paged_indexer_scores (shared by the CPU op test and the CUDA op test): B sequences with
// different entry counts (one with none, one whose query sees fewer entries than it holds), pages handed out in a
// shuffled order, one query row per sequence, and an output wider than the longest sequence. Every pool row that no
// row may read (spare blocks, entries a query cannot see) is NaN, so reading one shows up in the scores. Also gives
// each sequence's keys gathered in order: the inputs of the per-sequence indexer_scores the batched op replaces.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "deepinfer/core/tensor.h"
#include "deepinfer/ops/ops.h"

namespace deepinfer::testing {

struct PagedIndexerSpec {
  int64_t seqs = 6, heads = 8, dim = 32, max_entries = 90, pad = 7;  // out width: the longest + pad
  int block_size = 16, ratio = 4;
};

inline PagedIndexerSpec make_indexer_spec(int64_t seqs, int64_t heads, int64_t dim, int64_t max_entries, int bs,
                                          int ratio) {
  PagedIndexerSpec s;
  s.seqs = seqs;
  s.heads = heads;
  s.dim = dim;
  s.max_entries = max_entries;
  s.block_size = bs;
  s.ratio = ratio;
  return s;
}

struct PagedIndexerCase {
  PagedIndexerSpec spec;
  int64_t n = 0;  // out width
  HostTensor q, weights, positions, q_seq, n_entries, tables, pool;
  std::vector<HostTensor> keys;  // per sequence: its entries gathered in order, [n_entries, dim]
  float score_scale = 1.0f, weight_scale = 1.0f;

  struct Inputs {
    Tensor q, weights, positions, q_seq, n_entries, block_tables, key_pool;
  };
  PagedIndexerScoreParams params(const Inputs& in, const Tensor& out) const {
    PagedIndexerScoreParams p;
    p.q = in.q;
    p.weights = in.weights;
    p.positions = in.positions;
    p.q_seq = in.q_seq;
    p.n_entries = in.n_entries;
    p.block_tables = in.block_tables;
    p.key_pool = in.key_pool;
    p.out = out;
    p.block_size = spec.block_size;
    p.key_ratio = spec.ratio;
    p.ratio = spec.ratio;
    p.score_scale = score_scale;
    p.weight_scale = weight_scale;
    return p;
  }
  PagedIndexerScoreParams params(const Tensor& out) const {
    return params(
        {q.view(), weights.view(), positions.view(), q_seq.view(), n_entries.view(), tables.view(), pool.view()}, out);
  }
  int64_t entries(int64_t t) const { return n_entries.data<int64_t>()[t]; }
};

inline PagedIndexerCase make_paged_indexer_case(const PagedIndexerSpec& s, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> val(-1.0f, 1.0f);
  auto fill = [&](HostTensor& t) {
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = val(rng);
  };
  PagedIndexerCase c;
  c.spec = s;
  const int64_t bs = s.block_size, per_block = bs / s.ratio, B = s.seqs;
  std::uniform_int_distribution<int64_t> count(1, s.max_entries);
  std::vector<int64_t> ne(B), pos(B);
  for (int64_t b = 0; b < B; ++b) {
    ne[b] = b == 2 % B ? 0 : (b == 0 ? s.max_entries : count(rng));
    // The query at the position that closed its last group (as decode is after its compressor ran), except
    // sequence 1, a replayed compressor's case: its entries run ahead of what the query sees.
    pos[b] = ne[b] * s.ratio + (b == 3 % B ? s.ratio - 1 : 0) - (b == 1 % B && ne[b] > 3 ? 3 * s.ratio : 0);
    pos[b] = std::max<int64_t>(pos[b], 0);
  }
  c.n = *std::max_element(ne.begin(), ne.end()) + s.pad;
  int64_t max_blocks = 1;
  for (int64_t b = 0; b < B; ++b) max_blocks = std::max(max_blocks, std::max(ne[b] * s.ratio, pos[b] + 1) / bs + 1);
  const int64_t pool_blocks = B * max_blocks + 3;  // spare blocks no table uses
  std::vector<int32_t> ids(pool_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  c.tables = HostTensor(DType::kI32, {B, max_blocks});
  int64_t next = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < max_blocks; ++j)
      c.tables.data<int32_t>()[b * max_blocks + j] = j * bs <= std::max(ne[b] * s.ratio, pos[b]) ? ids[next++] : -1;
  c.pool = HostTensor(DType::kF32, {pool_blocks * per_block, s.dim});
  for (int64_t i = 0; i < c.pool.numel(); ++i) c.pool.data<float>()[i] = NAN;
  c.q = HostTensor(DType::kF32, {B, s.heads, s.dim});
  c.weights = HostTensor(DType::kF32, {B, s.heads});
  fill(c.q);
  fill(c.weights);
  c.positions = HostTensor(DType::kI64, {B});
  c.q_seq = HostTensor(DType::kI32, {B});
  c.n_entries = HostTensor(DType::kI64, {B});
  for (int64_t b = 0; b < B; ++b) {
    c.positions.data<int64_t>()[b] = pos[b];
    c.q_seq.data<int32_t>()[b] = static_cast<int32_t>(b);
    c.n_entries.data<int64_t>()[b] = ne[b];
    const int64_t visible = std::min(ne[b], (pos[b] + 1) / s.ratio);
    HostTensor keys(DType::kF32, {ne[b], s.dim});
    for (int64_t g = 0; g < ne[b]; ++g) {
      const int32_t id = c.tables.data<int32_t>()[b * max_blocks + g * s.ratio / bs];
      float* row = c.pool.data<float>() + (id * per_block + (g * s.ratio % bs) / s.ratio) * s.dim;
      // Entries the query cannot see stay NaN in the pool: the op must not read them.
      for (int64_t i = 0; i < s.dim; ++i) row[i] = g < visible ? val(rng) : NAN;
      std::copy(row, row + s.dim, keys.data<float>() + g * s.dim);
    }
    c.keys.push_back(std::move(keys));
  }
  c.score_scale = 1.0f / std::sqrt(static_cast<float>(s.dim));
  c.weight_scale = 1.0f / std::sqrt(static_cast<float>(s.heads));
  return c;
}

}  // namespace deepinfer::testing
