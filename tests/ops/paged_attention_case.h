// A random batch for paged_sink_attention (shared by the CPU test and the CUDA op test): B sequences with
// different contexts, blocks handed out in a shuffled order (so a sequence's pages are not contiguous),
// queries at the end of each sequence (decode: 1, prefill: several), a window floor on one sequence, and
// comp_idx rows with -1 padding and entries in random order. Every pool row that no query may read is NaN,
// so reading one shows up in the output. Also builds the gathered per-sequence inputs of sink_attention.
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

struct PagedAttentionSpec {
  int64_t seqs = 3, heads = 8, hd = 64, tokens_per_seq = 1, k_sel = 16;
  int block_size = 16, ratio = 4, window = 32;
  int64_t min_context = 20, max_context = 300;
};

struct PagedAttentionCase {
  PagedAttentionSpec spec;
  int64_t tokens = 0;
  HostTensor q, q_pos, q_seq, tables, window_pool, window_begin, comp_pool, comp_idx, sinks;
  std::vector<int64_t> context;  // per sequence
  PagedSinkAttentionParams params(const Tensor& out) const {
    PagedSinkAttentionParams p;
    p.q = q.view();
    p.q_positions = q_pos.view();
    p.q_seq = q_seq.view();
    p.block_tables = tables.view();
    p.window_pool = window_pool.view();
    p.window_begin = window_begin.view();
    if (spec.k_sel > 0) {
      p.comp_pool = comp_pool.view();
      p.comp_idx = comp_idx.view();
    }
    p.sinks = sinks.view();
    p.out = out;
    p.block_size = spec.block_size;
    p.comp_ratio = spec.ratio;
    p.window = spec.window;
    p.scale = 1.0f / std::sqrt(static_cast<float>(spec.hd));
    return p;
  }
  // params() over other (e.g. device) copies of the inputs; comp_pool / comp_idx only when the case selects any.
  struct Inputs {
    Tensor q, q_positions, q_seq, block_tables, window_pool, window_begin, comp_pool, comp_idx, sinks;
  };
  PagedSinkAttentionParams params(const Inputs& in, const Tensor& out) const {
    PagedSinkAttentionParams p = params(out);
    p.q = in.q;
    p.q_positions = in.q_positions;
    p.q_seq = in.q_seq;
    p.block_tables = in.block_tables;
    p.window_pool = in.window_pool;
    p.window_begin = in.window_begin;
    if (spec.k_sel > 0) {
      p.comp_pool = in.comp_pool;
      p.comp_idx = in.comp_idx;
    }
    p.sinks = in.sinks;
    return p;
  }
};

inline void fill_uniform(HostTensor& t, std::mt19937_64& rng, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  for (int64_t i = 0; i < t.numel(); ++i) {
    const float v = d(rng);
    t.data<float>()[i] = v == 0.0f ? 1e-3f : v;
  }
}

inline PagedAttentionCase make_paged_attention_case(const PagedAttentionSpec& s, uint64_t seed) {
  std::mt19937_64 rng(seed);
  PagedAttentionCase c;
  c.spec = s;
  const int64_t bs = s.block_size, per_block = bs / s.ratio;
  std::uniform_int_distribution<int64_t> ctx(s.min_context, s.max_context);
  int64_t max_blocks = 1;
  for (int64_t b = 0; b < s.seqs; ++b) {
    c.context.push_back(std::max(ctx(rng), s.tokens_per_seq));
    max_blocks = std::max(max_blocks, (c.context.back() + bs - 1) / bs);
  }
  // Shuffled block ids, with spare ones no table uses (their rows stay NaN).
  const int64_t pool_blocks = s.seqs * max_blocks + 3;
  std::vector<int32_t> ids(pool_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  c.tables = HostTensor(DType::kI32, {s.seqs, max_blocks});
  int64_t next = 0;
  for (int64_t b = 0; b < s.seqs; ++b)
    for (int64_t j = 0; j < max_blocks; ++j)
      // Blocks past a sequence's end are -1: nothing may read them.
      c.tables.data<int32_t>()[b * max_blocks + j] = j * bs < c.context[b] ? ids[next++] : -1;
  c.window_pool = HostTensor(DType::kF32, {pool_blocks * bs, s.hd});
  c.comp_pool = HostTensor(DType::kF32, {pool_blocks * per_block, s.hd});
  for (HostTensor* t : {&c.window_pool, &c.comp_pool})
    for (int64_t i = 0; i < t->numel(); ++i) t->data<float>()[i] = NAN;
  c.window_begin = HostTensor(DType::kI64, {s.seqs});
  c.tokens = s.seqs * s.tokens_per_seq;
  c.q = HostTensor(DType::kF32, {c.tokens, s.heads, s.hd});
  fill_uniform(c.q, rng, -1.0f, 1.0f);
  c.sinks = HostTensor(DType::kF32, {s.heads});
  fill_uniform(c.sinks, rng, -1.0f, 2.0f);
  c.q_pos = HostTensor(DType::kI64, {c.tokens});
  c.q_seq = HostTensor(DType::kI32, {c.tokens});
  c.comp_idx = HostTensor(DType::kI32, {c.tokens, std::max<int64_t>(s.k_sel, 1)});
  std::uniform_real_distribution<float> val(-1.0f, 1.0f);
  auto fill_row = [&](float* row) {
    for (int64_t i = 0; i < s.hd; ++i) row[i] = val(rng);
  };
  for (int64_t b = 0; b < s.seqs; ++b) {
    const int64_t n = c.context[b];
    // Sequence 1 keeps only its last few window rows (a bounded-replay floor inside the window).
    c.window_begin.data<int64_t>()[b] = b == 1 ? n - s.tokens_per_seq - 3 : 0;
    const int32_t* table = c.tables.data<int32_t>() + b * max_blocks;
    for (int64_t j = 0; j < s.tokens_per_seq; ++j) {
      const int64_t t = b * s.tokens_per_seq + j, pos = n - s.tokens_per_seq + j;
      c.q_pos.data<int64_t>()[t] = pos;
      c.q_seq.data<int32_t>()[t] = static_cast<int32_t>(b);
      // Window rows this query sees get values (rows below the floor stay NaN).
      const int64_t lo = std::max<int64_t>({pos - s.window + 1, c.window_begin.data<int64_t>()[b], 0});
      for (int64_t w = lo; w <= pos; ++w) {
        float* row = c.window_pool.data<float>() + (table[w / bs] * bs + w % bs) * s.hd;
        if (std::isnan(row[0])) fill_row(row);
      }
      // Selected entries: a random subset of the closed groups, in random order, padded with -1.
      const int64_t groups = (pos + 1) / s.ratio;
      std::vector<int32_t> pick(groups);
      std::iota(pick.begin(), pick.end(), 0);
      std::shuffle(pick.begin(), pick.end(), rng);
      for (int64_t k = 0; k < s.k_sel; ++k) {
        const bool use = k < groups && (k % 5 != 3);
        const int32_t e = use ? pick[k] : -1;
        c.comp_idx.data<int32_t>()[t * s.k_sel + k] = e;
        if (e < 0) continue;
        float* row =
            c.comp_pool.data<float>() + (table[e * s.ratio / bs] * per_block + (e * s.ratio % bs) / s.ratio) * s.hd;
        if (std::isnan(row[0])) fill_row(row);
      }
    }
  }
  return c;
}

}  // namespace deepinfer::testing
