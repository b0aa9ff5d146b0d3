// paged_indexer_scores on the CPU: against a naive double reference, bit-identical to indexer_scores of each row over
// its sequence's gathered keys (the per-sequence path it replaces in batched decode), and top-k / candidate blocks
// over the padded [B, N] scores selecting exactly what they select per row over [1, n_entries]. Bad pages, sequence
// indices and entry counts raise errors naming the op.
#include <gtest/gtest.h>

#include <cstring>

#include "deepinfer/core/error.h"
#include "op_test_util.h"
#include "ops/paged_indexer_case.h"

namespace deepinfer {
namespace {

using testing::make_indexer_spec;
using testing::make_paged_indexer_case;
using testing::PagedIndexerCase;
using testing::PagedIndexerSpec;

// indexer_scores of row t alone over its sequence's gathered keys: [1, n_entries[t]].
HostTensor per_row_scores(Backend& be, const PagedIndexerCase& c, int64_t t) {
  const int64_t ne = c.entries(t);
  HostTensor out(DType::kF32, {1, ne});
  if (ne == 0) return out;
  const PagedIndexerSpec& s = c.spec;
  IndexerScoreParams p{c.q.view().slice(t, t + 1),
                       c.keys[t].view(),
                       c.weights.view().slice(t, t + 1),
                       c.positions.view().slice(t, t + 1),
                       out.view(),
                       s.ratio,
                       c.score_scale,
                       c.weight_scale};
  be.indexer_scores(p);
  return out;
}

TEST(PagedIndexerScoresOp, MatchesNaiveReferenceAndPerSequenceScoresBitwise) {
  auto backend = make_cpu_backend(2);
  for (const PagedIndexerSpec& s : {make_indexer_spec(6, 8, 32, 90, 16, 4), make_indexer_spec(9, 5, 20, 40, 8, 1),
                                    make_indexer_spec(4, 16, 64, 200, 64, 2), make_indexer_spec(1, 4, 16, 30, 4, 4)}) {
    const PagedIndexerCase c = make_paged_indexer_case(s, 17 + s.seqs);
    HostTensor out(DType::kF32, {s.seqs, c.n});
    backend->paged_indexer_scores(c.params(out.view()));
    for (int64_t t = 0; t < s.seqs; ++t) {
      const int64_t ne = c.entries(t), visible = (c.positions.data<int64_t>()[t] + 1) / s.ratio;
      const float* got = out.data<float>() + t * c.n;
      // Naive reference: Σ_h relu(q·k)·score_scale · w·weight_scale over the keys, −inf past what the row scores.
      for (int64_t e = 0; e < c.n; ++e) {
        if (e >= ne || e >= visible) {
          EXPECT_EQ(got[e], -INFINITY) << "row " << t << " entry " << e;
          continue;
        }
        double ref = 0;
        for (int64_t h = 0; h < s.heads; ++h) {
          double d = 0;
          for (int64_t i = 0; i < s.dim; ++i)
            d += double(c.q.data<float>()[(t * s.heads + h) * s.dim + i]) * c.keys[t].data<float>()[e * s.dim + i];
          ref += std::max(d, 0.0) * c.score_scale * c.weights.data<float>()[t * s.heads + h] * c.weight_scale;
        }
        EXPECT_NEAR(got[e], ref, 1e-5 * std::max(1.0, std::fabs(ref))) << "row " << t << " entry " << e;
      }
      // The per-sequence path: byte for byte.
      const HostTensor want = per_row_scores(*backend, c, t);
      if (ne > 0) EXPECT_EQ(std::memcmp(got, want.data<float>(), sizeof(float) * ne), 0) << "row " << t;
    }
  }
}

// The batched selection of decode: one topk_mask (with and without an allowed mask) and one candidate_blocks over the
// padded [B, N] scores give each row what they give over its own [1, n_entries] scores.
TEST(PagedIndexerScoresOp, PaddedTopKAndCandidateBlocksMatchPerRow) {
  auto backend = make_cpu_backend(1);
  const PagedIndexerSpec s = make_indexer_spec(7, 4, 16, 120, 16, 1);
  const PagedIndexerCase c = make_paged_indexer_case(s, 5);
  const int64_t B = s.seqs, N = c.n;
  HostTensor scores(DType::kF32, {B, N});
  backend->paged_indexer_scores(c.params(scores.view()));
  HostTensor allowed(DType::kU8, {B, N});
  for (int64_t i = 0; i < B * N; ++i) allowed.data<uint8_t>()[i] = (i * 7 % 5) != 0;
  for (int k : {1, 8, 50, 200}) {
    for (bool with_allowed : {false, true}) {
      HostTensor mask(DType::kU8, {B, N});
      backend->topk_mask({scores.view(), with_allowed ? allowed.view() : Tensor{}, mask.view(), k});
      for (int64_t t = 0; t < B; ++t) {
        const int64_t ne = c.entries(t);
        for (int64_t e = ne; e < N; ++e) EXPECT_EQ(mask.data<uint8_t>()[t * N + e], 0) << t << "," << e;
        if (ne == 0) continue;
        HostTensor row_allowed(DType::kU8, {1, ne}), want(DType::kU8, {1, ne});
        std::memcpy(row_allowed.data<uint8_t>(), allowed.data<uint8_t>() + t * N, ne);
        const HostTensor row = per_row_scores(*backend, c, t);
        backend->topk_mask({row.view(), with_allowed ? row_allowed.view() : Tensor{}, want.view(), k});
        EXPECT_EQ(std::memcmp(mask.data<uint8_t>() + t * N, want.data<uint8_t>(), ne), 0)
            << "topk k=" << k << (with_allowed ? " allowed" : "") << " row " << t;
      }
    }
  }
  for (int block : {1, 4, 16}) {
    HostTensor keep(DType::kU8, {B, N});
    backend->candidate_blocks({scores.view(), c.positions.view(), keep.view(), s.ratio, 3, block});
    for (int64_t t = 0; t < B; ++t) {
      const int64_t ne = c.entries(t), visible = (c.positions.data<int64_t>()[t] + 1) / s.ratio;
      // A row whose query sees past its entries (visible > ne) forces a padding block over [B, N] but none over
      // [1, ne]: decode keeps such rows per sequence (the model checks visible <= ne before batching them).
      if (ne == 0 || visible > ne) continue;
      HostTensor want(DType::kU8, {1, ne});
      const HostTensor row = per_row_scores(*backend, c, t);
      backend->candidate_blocks({row.view(), c.positions.view().slice(t, t + 1), want.view(), s.ratio, 3, block});
      EXPECT_EQ(std::memcmp(keep.data<uint8_t>() + t * N, want.data<uint8_t>(), ne), 0)
          << "candidate_blocks block=" << block << " row " << t;
    }
  }
}

// --kv-cache-dtype bf16: a bf16 key pool scores as the f32 pool holding the same rounded keys, bit for bit (the
// unread rows are NaN in both), and not as the unrounded keys; an f16 pool is refused.
TEST(PagedIndexerScoresOp, Bf16PoolEqualsF32PoolOfTheRoundedRows) {
  auto backend = make_cpu_backend(2);
  const PagedIndexerCase c = make_paged_indexer_case(make_indexer_spec(6, 8, 32, 90, 16, 4), 61);
  const HostTensor pool16 = testing::bf16_of(c.pool), rounded = testing::rounded_f32_of(c.pool);
  HostTensor got(DType::kF32, {c.spec.seqs, c.n}), want(DType::kF32, {c.spec.seqs, c.n}),
      exact(DType::kF32, {c.spec.seqs, c.n});
  PagedIndexerScoreParams p = c.params(got.view());
  p.key_pool = pool16.view();
  backend->paged_indexer_scores(p);
  PagedIndexerScoreParams r = c.params(want.view());
  r.key_pool = rounded.view();
  backend->paged_indexer_scores(r);
  backend->paged_indexer_scores(c.params(exact.view()));
  for (int64_t i = 0; i < got.numel(); ++i) ASSERT_FALSE(std::isnan(got.data<float>()[i])) << "score " << i;
  EXPECT_EQ(std::memcmp(got.data<float>(), want.data<float>(), got.view().nbytes()), 0);
  EXPECT_NE(std::memcmp(got.data<float>(), exact.data<float>(), got.view().nbytes()), 0)
      << "a bf16 pool gave the unrounded keys' scores: it was not read as bf16";
  HostTensor f16(DType::kF16, c.pool.shape());
  p.key_pool = f16.view();
  EXPECT_THROW(backend->paged_indexer_scores(p), Error);
}

// --kv-cache-dtype fp8: a pool of FP4 key records scores as the f32 pool holding the keys' quantized values, bit for
// bit, and not as the unquantized keys.
TEST(PagedIndexerScoresOp, RecordPoolEqualsF32PoolOfTheQuantizedRows) {
  auto backend = make_cpu_backend(2);
  const PagedIndexerCase c = make_paged_indexer_case(make_indexer_spec(6, 8, 32, 90, 16, 4), 67);
  const testing::RecordPool keys = testing::records_of(c.pool, kIndexKeyRecord);
  HostTensor got(DType::kF32, {c.spec.seqs, c.n}), want(DType::kF32, {c.spec.seqs, c.n}),
      exact(DType::kF32, {c.spec.seqs, c.n});
  PagedIndexerScoreParams p = c.params(got.view());
  p.key_pool = keys.records.view();
  backend->paged_indexer_scores(p);
  PagedIndexerScoreParams r = c.params(want.view());
  r.key_pool = keys.values.view();
  backend->paged_indexer_scores(r);
  backend->paged_indexer_scores(c.params(exact.view()));
  for (int64_t i = 0; i < got.numel(); ++i) ASSERT_FALSE(std::isnan(got.data<float>()[i])) << "score " << i;
  EXPECT_EQ(std::memcmp(got.data<float>(), want.data<float>(), got.view().nbytes()), 0);
  EXPECT_NE(std::memcmp(got.data<float>(), exact.data<float>(), got.view().nbytes()), 0)
      << "a record pool gave the unquantized keys' scores";
}

TEST(PagedIndexerScoresOp, BadInputsRaise) {
  auto backend = make_cpu_backend(1);
  const PagedIndexerSpec s;
  auto expect_error = [&](PagedIndexerCase c, const char* what) {
    HostTensor out(DType::kF32, {s.seqs, c.n});
    try {
      backend->paged_indexer_scores(c.params(out.view()));
      ADD_FAILURE() << "no error for " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("paged_indexer_scores"), std::string::npos) << e.what();
    }
  };
  PagedIndexerCase c = make_paged_indexer_case(s, 3);
  c.q_seq.data<int32_t>()[1] = static_cast<int32_t>(s.seqs);
  expect_error(std::move(c), "q_seq outside [0, B)");
  c = make_paged_indexer_case(s, 3);
  c.n_entries.data<int64_t>()[0] = c.n + 1;
  expect_error(std::move(c), "n_entries beyond the output");
  c = make_paged_indexer_case(s, 3);
  c.tables.data<int32_t>()[0] = 1 << 20;
  expect_error(std::move(c), "a block id outside the pool");
  c = make_paged_indexer_case(s, 3);
  c.tables.data<int32_t>()[0] = -1;
  expect_error(std::move(c), "an unassigned block");
  c = make_paged_indexer_case(s, 3);
  c.tables = HostTensor(DType::kI32, {s.seqs, 1});
  for (int64_t i = 0; i < s.seqs; ++i) c.tables.data<int32_t>()[i] = static_cast<int32_t>(i);
  expect_error(std::move(c), "entries beyond the block table");
  c = make_paged_indexer_case(s, 3);
  HostTensor out(DType::kF32, {s.seqs, c.n});
  PagedIndexerScoreParams p = c.params(out.view());
  p.key_ratio = 3;  // does not divide the block size
  EXPECT_THROW(backend->paged_indexer_scores(p), Error);
}

}  // namespace
}  // namespace deepinfer
