// V4StepSelections against forward()'s per-sequence Selection logic (what batched decode ran per row before): random
// layer schedules over kv sources whose entry counts differ per row (rows without entries, rows whose query sees past
// their entries, reindex rows with and without covering candidates, reuse layers whose counts match an older
// selection), every attended mask compared row by row. Over all trials every path (published masks handed out
// directly, masks assembled row by row, a candidate row run alone) must have run.
#include "deepinfer/model/v4_step_selections.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>

namespace deepinfer {
namespace {

// forward()'s Selection of one sequence.
struct RowSelection {
  HostTensor topk, candidates;
  int64_t n_topk = -1, n_candidates = -1;
};

HostTensor u8_zeros(int64_t n) {
  HostTensor t(DType::kU8, {1, n});
  if (n > 0) std::memset(t.view().data(), 0, n);
  return t;
}

TEST(V4StepSelections, EveryRowMatchesThePerSequenceSelection) {
  auto backend = make_cpu_backend(1);
  TensorMemory& mem = host_memory();
  V4AttentionConfig ac;
  ac.index_topk = 5;
  ac.candidate_topk_blocks = 2;
  ac.candidate_block_size = 3;
  const int ratio = 1;
  V4StepSelections::Counts total;
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 60; ++trial) {
    const int64_t B = 1 + static_cast<int64_t>(rng() % 7);
    std::vector<int64_t> pos(B);
    for (int64_t b = 0; b < B; ++b) pos[b] = static_cast<int64_t>(rng() % 40);
    HostTensor positions(DType::kI64, {B});
    std::memcpy(positions.view().data(), pos.data(), sizeof(int64_t) * B);
    // Three kv sources: per row a count of at most what the position allows, sometimes past what the query sees
    // (a replayed compressor), sometimes none; trial 0 mod 4 gives all sources the same counts.
    std::vector<std::vector<int64_t>> source(3, std::vector<int64_t>(B));
    for (auto& ne : source)
      for (int64_t b = 0; b < B; ++b) {
        const int64_t visible = (pos[b] + 1) / ratio, kind = static_cast<int64_t>(rng() % 6);
        ne[b] = kind == 0 ? 0 : (kind == 1 ? visible + 2 : std::max<int64_t>(0, visible - (kind == 2 ? 3 : 0)));
      }
    if (trial % 4 == 0) source[1] = source[2] = source[0];
    // A schedule of (source, role): candidate source, reindex, index, reuse (no scoring).
    enum Role { kCandidates, kReindex, kIndex, kReuse };
    std::vector<std::pair<int, Role>> layers = {{0, kCandidates}, {0, kReindex}, {0, kReuse}};
    for (int i = 0; i < 6; ++i) layers.push_back({static_cast<int>(rng() % 3), static_cast<Role>(rng() % 4)});
    V4StepSelections sel;
    sel.reset(B);
    std::vector<RowSelection> ref(B);
    for (size_t l = 0; l < layers.size(); ++l) {
      const auto [src, role] = layers[l];
      const std::vector<int64_t>& ne = source[src];
      const int64_t n_max = *std::max_element(ne.begin(), ne.end());
      if (n_max == 0) continue;  // decode selects nothing then
      LayerPlan plan;
      plan.candidate_source = role == kCandidates;
      plan.csa2_role = role == kReindex ? Csa2Role::kReindex : Csa2Role::kIndex;
      if (role != kReuse) {
        // Scores: finite (with ties) where the row scores, −inf past its entries and where the query cannot see.
        HostTensor scores(DType::kF32, {B, n_max});
        for (int64_t b = 0; b < B; ++b)
          for (int64_t e = 0; e < n_max; ++e)
            scores.data<float>()[b * n_max + e] =
                e < std::min(ne[b], (pos[b] + 1) / ratio) ? static_cast<float>(rng() % 9) - 4.0f : -INFINITY;
        sel.select(*backend, mem, plan, ac, ratio, scores.view(), positions.view(), ne, pos);
        for (int64_t b = 0; b < B; ++b) {  // the per-sequence path
          if (ne[b] == 0) continue;
          HostTensor row(DType::kF32, {1, ne[b]});
          std::memcpy(row.view().data(), scores.data<float>() + b * n_max, sizeof(float) * ne[b]);
          RowSelection& r = ref[b];
          Tensor allowed;
          if (plan.candidate_source) {
            r.candidates = u8_zeros(ne[b]);
            backend->candidate_blocks({row.view(), positions.view().slice(b, b + 1), r.candidates.view(), ratio,
                                       ac.candidate_topk_blocks, ac.candidate_block_size});
            r.n_candidates = ne[b];
          } else if (plan.csa2_role == Csa2Role::kReindex && r.n_candidates == ne[b]) {
            allowed = r.candidates.view();
          }
          r.topk = u8_zeros(ne[b]);
          backend->topk_mask({row.view(), allowed, r.topk.view(), ac.index_topk});
          r.n_topk = ne[b];
        }
      }
      const Tensor got = sel.attended(mem, ne, n_max);
      ASSERT_EQ(got.shape(), (Shape{B, n_max}));
      for (int64_t b = 0; b < B; ++b) {
        const uint8_t* g = got.data_as<uint8_t>() + b * n_max;
        const RowSelection& r = ref[b];
        for (int64_t e = 0; e < n_max; ++e) {
          const uint8_t want = e < ne[b] && r.n_topk == ne[b] ? r.topk.data<uint8_t>()[e] : 0;
          ASSERT_EQ(g[e], want) << "trial " << trial << " layer " << l << " row " << b << " entry " << e;
        }
      }
    }
    const V4StepSelections::Counts& c = sel.counts();
    total.direct_masks += c.direct_masks;
    total.assembled_masks += c.assembled_masks;
    total.direct_allowed += c.direct_allowed;
    total.assembled_allowed += c.assembled_allowed;
    total.single_rows += c.single_rows;
  }
  EXPECT_GT(total.direct_masks, 0);
  EXPECT_GT(total.assembled_masks, 0);
  EXPECT_GT(total.direct_allowed, 0);
  EXPECT_GT(total.assembled_allowed, 0);
  EXPECT_GT(total.single_rows, 0);
}

}  // namespace
}  // namespace deepinfer
