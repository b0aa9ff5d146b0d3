// MLA (V3 family) ops against naive double-precision references: both attention forms, the group-limited and
// softmax-greedy routers, and the V3 YaRN rope table / softmax scale.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "deepinfer/model/model_config.h"
#include "deepinfer/ops/rope_table.h"
#include "op_test_util.h"
#include "paged_mla_case.h"

namespace deepinfer {
namespace {

struct MlaCase {
  int64_t T, H, S, dn, dr, dv, r;
  HostTensor q, kv, kv_b, q_pos, kv_pos;
};

// T queries at the last T positions of S cached rows (so each query sees a different causal prefix).
MlaCase make_case(int64_t T, int64_t H, int64_t S, int64_t dn, int64_t dr, int64_t dv, int64_t r, uint32_t seed) {
  MlaCase c{T, H, S, dn, dr, dv, r};
  c.q = testing::random_tensor({T, H, dn + dr}, seed);
  c.kv = testing::random_tensor({S, r + dr}, seed + 1);
  c.kv_b = testing::random_tensor({H * (dn + dv), r}, seed + 2, 0.05f, 0.5f);
  std::vector<int64_t> qp(T), kp(S);
  for (int64_t t = 0; t < T; ++t) qp[t] = S - T + t;
  std::iota(kp.begin(), kp.end(), 0);
  c.q_pos = testing::positions_tensor(qp);
  c.kv_pos = testing::positions_tensor(kp);
  return c;
}

// Textbook attention with explicitly expanded per-head keys and values, in double.
std::vector<double> reference(const MlaCase& c, double scale) {
  const int64_t qk = c.dn + c.dr, row = c.r + c.dr;
  const float* kv = c.kv.data<float>();
  const float* wb = c.kv_b.data<float>();
  std::vector<double> out(c.T * c.H * c.dv, 0.0);
  for (int64_t t = 0; t < c.T; ++t)
    for (int64_t h = 0; h < c.H; ++h) {
      const float* q = c.q.data<float>() + (t * c.H + h) * qk;
      std::vector<double> logits, probs;
      std::vector<std::vector<double>> values;
      for (int64_t s = 0; s < c.S; ++s) {
        if (c.kv_pos.data<int64_t>()[s] > c.q_pos.data<int64_t>()[t]) continue;
        double dot = 0;
        for (int64_t i = 0; i < c.dn; ++i) {
          double k = 0;
          for (int64_t j = 0; j < c.r; ++j) k += double(wb[(h * (c.dn + c.dv) + i) * c.r + j]) * kv[s * row + j];
          dot += q[i] * k;
        }
        for (int64_t i = 0; i < c.dr; ++i) dot += double(q[c.dn + i]) * kv[s * row + c.r + i];
        logits.push_back(dot * scale);
        std::vector<double> v(c.dv, 0.0);
        for (int64_t i = 0; i < c.dv; ++i)
          for (int64_t j = 0; j < c.r; ++j)
            v[i] += double(wb[(h * (c.dn + c.dv) + c.dn + i) * c.r + j]) * kv[s * row + j];
        values.push_back(v);
      }
      const double mx = *std::max_element(logits.begin(), logits.end());
      double denom = 0;
      for (double l : logits) denom += std::exp(l - mx);
      for (size_t s = 0; s < logits.size(); ++s)
        for (int64_t i = 0; i < c.dv; ++i)
          out[(t * c.H + h) * c.dv + i] += std::exp(logits[s] - mx) / denom * values[s][i];
    }
  return out;
}

MlaAttentionParams params(const MlaCase& c, HostTensor& out, float scale) {
  MlaAttentionParams p;
  p.q = c.q.view();
  p.q_positions = c.q_pos.view();
  p.kv = c.kv.view();
  p.kv_positions = c.kv_pos.view();
  p.kv_b = c.kv_b.view();
  p.out = out.view();
  p.rope_dim = static_cast<int>(c.dr);
  p.scale = scale;
  return p;
}

TEST(MlaAttentionOp, NaiveAndAbsorbedMatchTheReferenceAndEachOther) {
  auto backend = make_cpu_backend(2);
  // Prefill-like (T = S), chunk-like (T < S) and decode (T = 1); dn != dv so the split of kv_b is exercised.
  for (auto [T, S] : {std::pair<int64_t, int64_t>{9, 9}, {5, 13}, {1, 17}}) {
    MlaCase c = make_case(T, 3, S, 12, 8, 10, 16, static_cast<uint32_t>(T * 31 + S));
    const float scale = 0.23f;
    const std::vector<double> ref = reference(c, scale);
    HostTensor naive(DType::kF32, {T, 3, 10}), absorbed(DType::kF32, {T, 3, 10});
    backend->mla_attention_naive(params(c, naive, scale));
    backend->mla_attention_absorbed(params(c, absorbed, scale));
    EXPECT_LE(testing::max_rel_error(naive.data<float>(), ref), 2e-6) << T << "x" << S;
    EXPECT_LE(testing::max_rel_error(absorbed.data<float>(), ref), 2e-6) << T << "x" << S;
    for (int64_t i = 0; i < naive.numel(); ++i) ASSERT_NE(naive.data<float>()[i], 0.0f);
  }
}

TEST(MlaAttentionOp, RejectsInconsistentShapes) {
  auto backend = make_cpu_backend(1);
  MlaCase c = make_case(2, 2, 4, 8, 4, 8, 6, 7);
  HostTensor out(DType::kF32, {2, 2, 7});  // dv is 8
  EXPECT_THROW(backend->mla_attention_naive(params(c, out, 1.0f)), Error);
  HostTensor ok(DType::kF32, {2, 2, 8});
  MlaAttentionParams p = params(c, ok, 1.0f);
  p.rope_dim = 12;  // leaves no nope channels in q
  EXPECT_THROW(backend->mla_attention_absorbed(p), Error);
}

// A bf16 pool (--kv-cache-dtype bf16) is read as its values widened: the output equals the f32 pool's over the
// rounded rows bit for bit, and differs from the unrounded rows' (the rounding is real on random rows).
TEST(MlaAttentionOp, PagedBf16PoolEqualsF32PoolOfTheRoundedRows) {
  auto backend = make_cpu_backend(2);
  testing::PagedMlaSpec spec;
  spec.seqs = 3;
  spec.tokens_per_seq = 2;
  spec.min_context = 5;
  spec.max_context = 90;
  const testing::PagedMlaCase c = testing::make_paged_mla_case(spec, 31);
  const HostTensor bf16 = c.bf16_pool(), rounded = c.rounded_pool();
  const Shape shape{c.tokens, spec.heads, spec.dv};
  HostTensor got(DType::kF32, shape), want(DType::kF32, shape), exact(DType::kF32, shape);
  PagedMlaAttentionParams p = c.params(got.view());
  p.kv_pool = bf16.view();
  backend->paged_mla_attention(p);
  PagedMlaAttentionParams r = c.params(want.view());
  r.kv_pool = rounded.view();
  backend->paged_mla_attention(r);
  backend->paged_mla_attention(c.params(exact.view()));
  double diff = 0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    ASSERT_FALSE(std::isnan(got.data<float>()[i])) << "value " << i << " read an unused (NaN) pool row";
    ASSERT_EQ(got.data<float>()[i], want.data<float>()[i]) << "value " << i;
    diff = std::max(diff, static_cast<double>(std::fabs(got.data<float>()[i] - exact.data<float>()[i])));
  }
  EXPECT_GT(diff, 0.0) << "bf16 rows gave the unrounded rows' output: the pool was not read as bf16";
  HostTensor f16(DType::kF16, c.pool.shape());
  p.kv_pool = f16.view();
  EXPECT_THROW(backend->paged_mla_attention(p), Error) << "an f16 pool is neither f32 nor bf16";
}

// The paged op is the absorbed op over each sequence's rows gathered in position order, bit for bit (the CPU
// backend shares the arithmetic): decode (one query per sequence) and a few queries per sequence, shuffled
// non-contiguous pages, a shared first block, NaN in every pool row no query may read.
TEST(MlaAttentionOp, PagedEqualsAbsorbedOverGatheredRows) {
  auto backend = make_cpu_backend(2);
  for (int64_t per_seq : {1, 3}) {
    testing::PagedMlaSpec spec;
    spec.seqs = 4;
    spec.tokens_per_seq = per_seq;
    spec.min_context = 5;
    spec.max_context = 90;
    const testing::PagedMlaCase c = testing::make_paged_mla_case(spec, 17 + per_seq);
    HostTensor out(DType::kF32, {c.tokens, spec.heads, spec.dv});
    backend->paged_mla_attention(c.params(out.view()));
    for (int64_t b = 0; b < spec.seqs; ++b) {
      const int64_t n = c.context[b], t0 = b * per_seq;
      const HostTensor rows = c.gathered(b, n);
      std::vector<int64_t> kp(n);
      std::iota(kp.begin(), kp.end(), 0);
      const HostTensor kv_pos = testing::positions_tensor(kp);
      MlaAttentionParams p;
      p.q = c.q.view().slice(t0, t0 + per_seq);
      p.q_positions = c.q_pos.view().slice(t0, t0 + per_seq);
      p.kv = rows.view();
      p.kv_positions = kv_pos.view();
      p.kv_b = c.kv_b.view();
      HostTensor want(DType::kF32, {per_seq, spec.heads, spec.dv});
      p.out = want.view();
      p.rope_dim = static_cast<int>(spec.dr);
      p.scale = c.scale;
      backend->mla_attention_absorbed(p);
      const float* got = out.data<float>() + t0 * spec.heads * spec.dv;
      for (int64_t i = 0; i < want.numel(); ++i) {
        ASSERT_FALSE(std::isnan(got[i])) << "sequence " << b << " read an unused (NaN) pool row";
        ASSERT_EQ(got[i], want.data<float>()[i]) << "sequence " << b << " value " << i << " (" << per_seq << "/seq)";
      }
    }
  }
}

TEST(MlaAttentionOp, PagedRejectsBadTablesAndShapes) {
  auto backend = make_cpu_backend(1);
  testing::PagedMlaSpec spec;
  spec.seqs = 2;
  spec.min_context = 20;
  spec.max_context = 40;
  const testing::PagedMlaCase c = testing::make_paged_mla_case(spec, 5);
  HostTensor out(DType::kF32, {c.tokens, spec.heads, spec.dv});
  auto expect_invalid = [&](const PagedMlaAttentionParams& p, const char* what) {
    try {
      backend->paged_mla_attention(p);
      ADD_FAILURE() << "no error for " << what;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << what << ": " << e.what();
    }
  };
  {
    testing::PagedMlaCase bad = testing::make_paged_mla_case(spec, 5);
    bad.tables.data<int32_t>()[0] = 1 << 20;  // outside the pool
    expect_invalid(bad.params(out.view()), "a block id outside the pool");
  }
  {
    testing::PagedMlaCase bad = testing::make_paged_mla_case(spec, 5);
    for (int64_t t = 0; t < c.tokens; ++t) bad.q_pos.data<int64_t>()[t] = c.max_blocks * spec.block_size;
    expect_invalid(bad.params(out.view()), "a position beyond the block table");
  }
  {
    testing::PagedMlaCase bad = testing::make_paged_mla_case(spec, 5);
    for (int64_t t = 0; t < c.tokens; ++t) bad.q_seq.data<int32_t>()[t] = static_cast<int32_t>(spec.seqs);
    expect_invalid(bad.params(out.view()), "a sequence index outside the tables");
  }
  HostTensor wrong(DType::kF32, {c.tokens, spec.heads, spec.dv + 1});
  expect_invalid(c.params(wrong.view()), "an output of the wrong width");
  PagedMlaAttentionParams p = c.params(out.view());
  p.block_size = 0;
  expect_invalid(p, "block_size 0");
}

// Brute-force V3 routing in double: sigmoid, bias, group score = top-2 sum (or max), keep the best groups,
// top-k by biased score among them, unbiased weights normalised × scale.
void route_reference(const HostTensor& x, const HostTensor& w, const HostTensor* bias, int64_t t, int64_t k,
                     int n_group, int topk_group, bool top2, bool softmax, bool normalize, double scale,
                     std::vector<int64_t>& idx, std::vector<double>& weights) {
  const int64_t D = x.shape()[1], E = w.shape()[0], per = E / n_group;
  std::vector<double> s(E), b(E);
  for (int64_t e = 0; e < E; ++e) {
    double l = 0;
    for (int64_t i = 0; i < D; ++i) l += double(x.data<float>()[t * D + i]) * w.data<float>()[e * D + i];
    s[e] = softmax ? l : 1 / (1 + std::exp(-l));
  }
  if (softmax) {
    const double mx = *std::max_element(s.begin(), s.end());
    double sum = 0;
    for (double& v : s) sum += (v = std::exp(v - mx));
    for (double& v : s) v /= sum;
  }
  for (int64_t e = 0; e < E; ++e) b[e] = s[e] + (bias ? bias->data<float>()[e] : 0.0);
  std::vector<double> gs(n_group);
  for (int g = 0; g < n_group; ++g) {
    std::vector<double> m(b.begin() + g * per, b.begin() + (g + 1) * per);
    std::sort(m.rbegin(), m.rend());
    gs[g] = top2 ? m[0] + m[1] : m[0];
  }
  std::vector<int64_t> groups(n_group);
  std::iota(groups.begin(), groups.end(), 0);
  std::sort(groups.begin(), groups.end(), [&](int64_t a, int64_t c) { return gs[a] > gs[c]; });
  std::vector<int64_t> cand;
  for (int j = 0; j < topk_group; ++j)
    for (int64_t e = groups[j] * per; e < (groups[j] + 1) * per; ++e) cand.push_back(e);
  std::sort(cand.begin(), cand.end(), [&](int64_t a, int64_t c) { return b[a] > b[c]; });
  idx.assign(cand.begin(), cand.begin() + k);
  double sum = 0;
  for (int64_t e : idx) sum += s[e];
  weights.clear();
  for (int64_t e : idx) weights.push_back((normalize ? s[e] / sum : s[e]) * scale);
}

void expect_routing(const HostTensor& idx, const HostTensor& weights, int64_t t, int64_t k,
                    const std::vector<int64_t>& ref_idx, const std::vector<double>& ref_w) {
  for (int64_t j = 0; j < k; ++j) {
    EXPECT_EQ(idx.data<int32_t>()[t * k + j], ref_idx[j]) << "token " << t << " pick " << j;
    EXPECT_NEAR(weights.data<float>()[t * k + j], ref_w[j], 1e-5) << "token " << t << " pick " << j;
  }
}

TEST(RouterOp, V3GroupLimitedSigmoidWithBias) {
  auto backend = make_cpu_backend(1);
  const int64_t T = 12, D = 32, E = 16, k = 4;
  HostTensor x = testing::random_tensor({T, D}, 11), w = testing::random_tensor({E, D}, 12),
             b = testing::random_tensor({E}, 13, 0.01f, 0.4f);
  HostTensor weights(DType::kF32, {T, k}), idx(DType::kI32, {T, k});
  RouterParams p;
  p.x = x.view();
  p.weight = w.view();
  p.bias = b.view();
  p.weights = weights.view();
  p.indices = idx.view();
  p.scoring = RouterScoring::kSigmoid;
  p.route_scale = 2.5f;
  p.n_group = 4;
  p.topk_group = 2;
  backend->router(p);
  std::vector<int64_t> ref_idx;
  std::vector<double> ref_w;
  int differs_from_ungrouped = 0;
  for (int64_t t = 0; t < T; ++t) {
    route_reference(x, w, &b, t, k, 4, 2, true, false, true, 2.5, ref_idx, ref_w);
    expect_routing(idx, weights, t, k, ref_idx, ref_w);
    std::vector<int64_t> plain;
    std::vector<double> plain_w;
    route_reference(x, w, &b, t, k, 1, 1, true, false, true, 2.5, plain, plain_w);
    differs_from_ungrouped += plain != ref_idx;
  }
  EXPECT_GT(differs_from_ungrouped, 0) << "the data should make the group limit matter";
}

// With every biased score negative (large negative bias), a 0.0 fill of the dropped groups would pick
// dropped experts; −inf never does.
TEST(RouterOp, DroppedGroupsAreMinusInfinityNotZero) {
  auto backend = make_cpu_backend(1);
  const int64_t T = 6, D = 16, E = 8, k = 3;
  HostTensor x = testing::random_tensor({T, D}, 21), w = testing::random_tensor({E, D}, 22);
  HostTensor b(DType::kF32, {E});
  for (int64_t e = 0; e < E; ++e) b.data<float>()[e] = -5.0f - 0.1f * static_cast<float>(e);
  HostTensor weights(DType::kF32, {T, k}), idx(DType::kI32, {T, k});
  RouterParams p;
  p.x = x.view();
  p.weight = w.view();
  p.bias = b.view();
  p.weights = weights.view();
  p.indices = idx.view();
  p.scoring = RouterScoring::kSigmoid;
  p.n_group = 4;
  p.topk_group = 2;
  backend->router(p);
  std::vector<int64_t> ref_idx;
  std::vector<double> ref_w;
  for (int64_t t = 0; t < T; ++t) {
    route_reference(x, w, &b, t, k, 4, 2, true, false, true, 1.0, ref_idx, ref_w);
    expect_routing(idx, weights, t, k, ref_idx, ref_w);
  }
}

TEST(RouterOp, V2SoftmaxGreedyAndGroupMax) {
  auto backend = make_cpu_backend(1);
  const int64_t T = 7, D = 20, E = 12, k = 3;
  HostTensor x = testing::random_tensor({T, D}, 31), w = testing::random_tensor({E, D}, 32);
  HostTensor weights(DType::kF32, {T, k}), idx(DType::kI32, {T, k});
  RouterParams p;
  p.x = x.view();
  p.weight = w.view();
  p.weights = weights.view();
  p.indices = idx.view();
  p.scoring = RouterScoring::kSoftmax;
  p.normalize = false;
  p.route_scale = 1.0f;
  backend->router(p);  // V2-Lite: greedy top-k of the softmax, weights unnormalised
  std::vector<int64_t> ref_idx;
  std::vector<double> ref_w;
  for (int64_t t = 0; t < T; ++t) {
    route_reference(x, w, nullptr, t, k, 1, 1, false, true, false, 1.0, ref_idx, ref_w);
    expect_routing(idx, weights, t, k, ref_idx, ref_w);
  }
  p.n_group = 3;  // V2 group_limited_greedy: groups scored by their best expert
  p.topk_group = 1;
  p.group_score = GroupScore::kMax;
  backend->router(p);
  for (int64_t t = 0; t < T; ++t) {
    route_reference(x, w, nullptr, t, k, 3, 1, false, true, false, 1.0, ref_idx, ref_w);
    expect_routing(idx, weights, t, k, ref_idx, ref_w);
  }
}

TEST(RouterOp, RejectsBadGroups) {
  auto backend = make_cpu_backend(1);
  HostTensor x = testing::random_tensor({2, 8}, 41), w = testing::random_tensor({12, 8}, 42);
  HostTensor weights(DType::kF32, {2, 4}), idx(DType::kI32, {2, 4});
  RouterParams p;
  p.x = x.view();
  p.weight = w.view();
  p.weights = weights.view();
  p.indices = idx.view();
  p.n_group = 5;  // does not divide 12
  EXPECT_THROW(backend->router(p), Error);
  p.n_group = 6;
  p.topk_group = 1;  // keeps 2 experts < top-4
  EXPECT_THROW(backend->router(p), Error);
}

// V3's YaRN table (MODELS.md Part B §2): ramp between pair 10 and 23, interpolation ÷40 above; the softmax
// scale carries m² = (0.1·ln 40 + 1)²; the cos/sin magnitude is 1 when mscale == mscale_all_dim.
TEST(RopeTable, V3YarnTableScaleAndMagnitude) {
  ModelConfig c = parse_model_config(R"({"model_type": "deepseek_v3", "vocab_size": 100, "hidden_size": 64,
    "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64, "q_lora_rank": 16,
    "kv_lora_rank": 16, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
    "rope_theta": 10000, "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
    "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}})");
  const std::vector<float> inv = rope_inv_freq(c.rope);
  ASSERT_EQ(inv.size(), 32u);
  for (int i = 0; i < 32; ++i) {
    const double theta = std::pow(10000.0, -2.0 * i / 64);
    const double ramp = std::clamp((i - 10.0) / 13.0, 0.0, 1.0);
    EXPECT_NEAR(inv[i], theta * (1 - ramp) + theta / 40 * ramp, 1e-6 * theta) << i;
  }
  EXPECT_NEAR(attention_softmax_scale(c), 0.1352338, 1e-6);
  EXPECT_DOUBLE_EQ(yarn_attention_factor(c.rope), 1.0);
  c.rope.mscale = 0.707;
  c.rope.mscale_all_dim = 1.0;
  EXPECT_NEAR(yarn_attention_factor(c.rope), (0.0707 * std::log(40) + 1) / (0.1 * std::log(40) + 1), 1e-12);
}

}  // namespace
}  // namespace deepinfer
