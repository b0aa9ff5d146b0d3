// A random batch for paged_mla_attention (shared by the CPU test and the CUDA op test): B sequences with different
// contexts, blocks handed out in a shuffled order (a sequence's pages are not contiguous), sequence 1 sharing
// sequence 0's first block (a prefix-cache hit), queries at the end of each sequence (decode: 1, a few for a
// verify-like chunk). Every pool row no query may read is NaN, so reading one shows up in the output. Also builds
// one sequence's rows gathered in position order, the input of mla_attention_absorbed.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "deepinfer/core/tensor.h"
#include "deepinfer/ops/ops.h"
#include "op_test_util.h"

namespace deepinfer::testing {

struct PagedMlaSpec {
  int64_t seqs = 3, heads = 4, dn = 16, dr = 8, dv = 12, r = 64, tokens_per_seq = 1;
  int block_size = 16;
  int64_t min_context = 20, max_context = 300;
};

struct PagedMlaCase {
  PagedMlaSpec spec;
  int64_t tokens = 0, max_blocks = 0;
  HostTensor q, q_pos, q_seq, tables, pool, kv_b;
  std::vector<int64_t> context;  // per sequence
  float scale = 1.0f;

  PagedMlaAttentionParams params(const Tensor& out) const {
    PagedMlaAttentionParams p;
    p.q = q.view();
    p.q_positions = q_pos.view();
    p.q_seq = q_seq.view();
    p.block_tables = tables.view();
    p.kv_pool = pool.view();
    p.kv_b = kv_b.view();
    p.out = out;
    p.block_size = spec.block_size;
    p.rope_dim = static_cast<int>(spec.dr);
    p.scale = scale;
    return p;
  }
  // The pool as a bf16 cache holds it (each value rounded to nearest even), and as an f32 pool of those values
  // widened back: a bf16 pool must give exactly the latter's output.
  HostTensor bf16_pool() const { return bf16_of(pool); }
  HostTensor rounded_pool() const { return rounded_f32_of(pool); }
  // Rows of positions [0, n) of sequence b, in order: [n, r + dr].
  HostTensor gathered(int64_t b, int64_t n) const {
    const int64_t row = spec.r + spec.dr, bs = spec.block_size;
    HostTensor out(DType::kF32, {n, row});
    for (int64_t s = 0; s < n; ++s) {
      const int64_t id = tables.data<int32_t>()[b * max_blocks + s / bs];
      std::copy_n(pool.data<float>() + (id * bs + s % bs) * row, row, out.data<float>() + s * row);
    }
    return out;
  }
};

inline void fill_uniform_mla(HostTensor& t, std::mt19937_64& rng, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  for (int64_t i = 0; i < t.numel(); ++i) {
    const float v = d(rng);
    t.data<float>()[i] = v == 0.0f ? 1e-3f : v;
  }
}

inline PagedMlaCase make_paged_mla_case(const PagedMlaSpec& s, uint64_t seed) {
  std::mt19937_64 rng(seed);
  PagedMlaCase c;
  c.spec = s;
  const int64_t bs = s.block_size, row = s.r + s.dr;
  std::uniform_int_distribution<int64_t> ctx(s.min_context, s.max_context);
  c.max_blocks = 1;
  for (int64_t b = 0; b < s.seqs; ++b) {
    c.context.push_back(std::max(ctx(rng), s.tokens_per_seq));
    c.max_blocks = std::max(c.max_blocks, (c.context.back() + bs - 1) / bs);
  }
  // Shuffled block ids, with spare ones no table uses (their rows stay NaN).
  const int64_t pool_blocks = s.seqs * c.max_blocks + 3;
  std::vector<int32_t> ids(pool_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  c.tables = HostTensor(DType::kI32, {s.seqs, c.max_blocks});
  int64_t next = 0;
  for (int64_t b = 0; b < s.seqs; ++b)
    for (int64_t j = 0; j < c.max_blocks; ++j)
      // Blocks past a sequence's end are -1: nothing may read them.
      c.tables.data<int32_t>()[b * c.max_blocks + j] = j * bs < c.context[b] ? ids[next++] : -1;
  // Sequence 1 starts with sequence 0's first block (both long enough to fill it): shared prefix rows.
  if (s.seqs > 1 && c.context[0] > bs && c.context[1] > bs)
    c.tables.data<int32_t>()[c.max_blocks] = c.tables.data<int32_t>()[0];
  c.pool = HostTensor(DType::kF32, {pool_blocks * bs, row});
  for (int64_t i = 0; i < c.pool.numel(); ++i) c.pool.data<float>()[i] = NAN;
  std::uniform_real_distribution<float> val(-1.0f, 1.0f);
  for (int64_t b = 0; b < s.seqs; ++b)
    for (int64_t p = 0; p < c.context[b]; ++p) {
      float* r = c.pool.data<float>() + (c.tables.data<int32_t>()[b * c.max_blocks + p / bs] * bs + p % bs) * row;
      if (std::isnan(r[0]))
        for (int64_t i = 0; i < row; ++i) r[i] = val(rng);
    }
  c.tokens = s.seqs * s.tokens_per_seq;
  c.q = HostTensor(DType::kF32, {c.tokens, s.heads, s.dn + s.dr});
  fill_uniform_mla(c.q, rng, -1.0f, 1.0f);
  c.kv_b = HostTensor(DType::kF32, {s.heads * (s.dn + s.dv), s.r});
  const float w = 1.0f / std::sqrt(static_cast<float>(s.r));
  fill_uniform_mla(c.kv_b, rng, -w, w);
  c.q_pos = HostTensor(DType::kI64, {c.tokens});
  c.q_seq = HostTensor(DType::kI32, {c.tokens});
  for (int64_t b = 0; b < s.seqs; ++b)
    for (int64_t j = 0; j < s.tokens_per_seq; ++j) {
      const int64_t t = b * s.tokens_per_seq + j;
      c.q_pos.data<int64_t>()[t] = c.context[b] - s.tokens_per_seq + j;
      c.q_seq.data<int32_t>()[t] = static_cast<int32_t>(b);
    }
  c.scale = 1.0f / std::sqrt(static_cast<float>(s.dn + s.dr));
  return c;
}

}  // namespace deepinfer::testing
