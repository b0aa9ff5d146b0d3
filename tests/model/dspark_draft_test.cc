// The DSpark draft (model/dspark_draft.h) on generated V4.1 and V4-0731-shaped checkpoints that carry `mtp.*`
// draft weights: the target's stream capture, the draft block against a straightforward host computation
// (non-causal within the block, window context), the sequential Markov head, the confidence head, cache
// rollback, loading without / with partial draft weights, and a greedy speculative loop that must reproduce
// greedy decoding token for token.
#include "deepinfer/model/dspark_draft.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>

#include <nlohmann/json.hpp>

#include "deepinfer/io/safetensors.h"
#include "deepinfer/model/random_checkpoint.h"
#include "model/dspark_fixture.h"
#include "test_util.h"

namespace deepinfer {
namespace {

// ---------------------------------------------------------------------------------------------------------------
// Host reference: the DSpark formulas written out directly (RoPE, FP8 fake-quant, mHC coefficients and MoE come
// from the tested CPU ops; everything DSpark-specific is spelled out here).

using Mat = std::vector<float>;  // row-major

Mat host(const Tensor& t) {
  HostTensor h = host_memory().to_host(t);
  return Mat(h.data<float>(), h.data<float>() + h.numel());
}

// y[i] = W · x[i]: x [n, k], W [o, k].
Mat matmul(const Mat& x, int64_t n, const Tensor& w) {
  const int64_t o = w.dim(0), k = w.dim(1);
  const float* W = w.data_as<float>();
  Mat y(static_cast<size_t>(n * o));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t r = 0; r < o; ++r) {
      double s = 0;
      for (int64_t j = 0; j < k; ++j) s += double(x[i * k + j]) * W[r * k + j];
      y[i * o + r] = static_cast<float>(s);
    }
  return y;
}

void rmsnorm(Mat& x, int64_t n, const Tensor* w, float eps) {
  const int64_t d = static_cast<int64_t>(x.size()) / n;
  for (int64_t i = 0; i < n; ++i) {
    double ss = 0;
    for (int64_t j = 0; j < d; ++j) ss += double(x[i * d + j]) * x[i * d + j];
    const float inv = static_cast<float>(1.0 / std::sqrt(ss / d + eps));
    for (int64_t j = 0; j < d; ++j) x[i * d + j] = x[i * d + j] * inv * (w ? w->data_as<float>()[j] : 1.0f);
  }
}

struct Reference {
  const DeepseekV4Model& m;
  Backend& b;
  const ModelConfig& c = m.config();
  const V4DsparkWeights& w = *m.weights().dspark;

  void rope(Mat& x, int64_t n, int64_t heads, const std::vector<int64_t>& pos, bool inverse) {
    HostTensor t(DType::kF32, {n, heads, c.attn.head_dim});
    std::copy(x.begin(), x.end(), t.data<float>());
    HostTensor p(DType::kI64, {n});
    std::copy(pos.begin(), pos.end(), p.data<int64_t>());
    b.rope({t.view(), p.view(), m.main_inv_freq().view(), inverse});
    x.assign(t.data<float>(), t.data<float>() + t.numel());
  }
  void fake_quant(Mat& x, int64_t n) {
    if (c.family != ModelFamily::kDeepseekV41) return;
    HostTensor t(DType::kF32, {n, c.attn.head_dim});
    std::copy(x.begin(), x.end(), t.data<float>());
    b.fake_quant({t.view(), FakeQuantKind::kFP8E4M3Ue8m0Block32});
    x.assign(t.data<float>(), t.data<float>() + t.numel());
  }
  // Context K=V of draft layer l at positions pos from captured rows (one per position).
  Mat context_kv(int l, const Mat& rows, const std::vector<int64_t>& pos) {
    const int64_t n = static_cast<int64_t>(pos.size());
    const float eps = static_cast<float>(c.rms_norm_eps);
    Mat main_x = matmul(rows, n, w.main_proj.f32.view());
    rmsnorm(main_x, n, &w.main_norm.view(), eps);
    const auto& a = w.layers[l].attn;
    Mat kv = matmul(main_x, n, a.wkv.f32.view());
    rmsnorm(kv, n, &a.kv_norm.view(), eps);
    rope(kv, n, 1, pos, false);
    fake_quant(kv, n);
    return kv;
  }
  // The block pass: hidden [B, D] and base logits [B, V] for `anchor` at position P with the context rows of
  // positions [P - ctx_n, P).
  std::pair<Mat, Mat> block(const Mat& ctx_rows, int64_t ctx_n, int64_t P, int64_t anchor, bool causal) {
    const int64_t B = c.draft.block_size, D = c.hidden_size, hc = c.hc.hc_mult, H = c.num_heads;
    const int64_t hd = c.attn.head_dim, V = c.vocab_size;
    const float eps = static_cast<float>(c.rms_norm_eps);
    const bool v41 = c.family == ModelFamily::kDeepseekV41;
    std::vector<int64_t> ctx_pos, pos;
    for (int64_t p = P - ctx_n; p < P; ++p) ctx_pos.push_back(p);
    for (int64_t i = 0; i < B; ++i) pos.push_back(P + i);
    const Tensor& embed = m.weights().embed.view();
    HostTensor streams(DType::kF32, {B, hc, D});
    for (int64_t i = 0; i < B; ++i) {
      const int64_t id = i == 0 ? anchor : c.draft.noise_token_id;
      for (int64_t k = 0; k < hc; ++k)
        std::copy_n(embed.data_as<float>() + id * D, D, streams.data<float>() + (i * hc + k) * D);
    }
    Mat carried(static_cast<size_t>(B * hc), 0.0f);
    for (int64_t i = 0; i < B; ++i) carried[i * hc] = 1.0f;
    HostTensor pre(DType::kF32, {B, hc}), post(DType::kF32, {B, hc}), comb(DType::kF32, {B, hc, hc});
    auto mix = [&](const OwnedTensor& fn, const OwnedTensor& base, const OwnedTensor& scale) {
      b.hc_mix({streams.view(), fn.view(), base.view(), scale.view(), pre.view(), post.view(), comb.view(), eps,
                static_cast<float>(c.hc.eps), c.hc.sinkhorn_iters});
      return Mat(pre.data<float>(), pre.data<float>() + B * hc);
    };
    auto collapse = [&](const Mat& weights, const OwnedTensor* norm) {
      Mat h(static_cast<size_t>(B * D), 0.0f);
      for (int64_t i = 0; i < B; ++i)
        for (int64_t k = 0; k < hc; ++k)
          for (int64_t d = 0; d < D; ++d)
            h[i * D + d] += weights[i * hc + k] * streams.data<float>()[(i * hc + k) * D + d];
      if (norm) rmsnorm(h, B, &norm->view(), eps);
      return h;
    };
    auto expand = [&](const Mat& y) {
      Mat next(static_cast<size_t>(B * hc * D));
      const float* X = streams.data<float>();
      for (int64_t i = 0; i < B; ++i)
        for (int64_t k = 0; k < hc; ++k)
          for (int64_t d = 0; d < D; ++d) {
            double v = double(post.data<float>()[i * hc + k]) * y[i * D + d];
            for (int64_t j = 0; j < hc; ++j)
              v += double(comb.data<float>()[(i * hc + j) * hc + k]) * X[(i * hc + j) * D + d];
            next[(i * hc + k) * D + d] = static_cast<float>(v);
          }
      std::copy(next.begin(), next.end(), streams.data<float>());
    };
    for (int l = 0; l < c.draft.num_layers; ++l) {
      const V4LayerWeights& lw = w.layers[l];
      const auto& a = lw.attn;
      Mat attn_pre = mix(lw.hc_attn_fn, lw.hc_attn_base, lw.hc_attn_scale);
      Mat x = collapse(v41 ? carried : attn_pre, &lw.attn_norm);
      // Attention: queries of the block over [context window ; all block keys] (causal: block keys j <= i).
      Mat q_r = matmul(x, B, a.wq_a.f32.view());
      rmsnorm(q_r, B, &a.q_norm.view(), eps);
      Mat q = matmul(q_r, B, a.wq_b.f32.view());
      if (c.attn.q_head_norm) rmsnorm(q, B * H, nullptr, eps);
      rope(q, B, H, pos, false);
      Mat kv = matmul(x, B, a.wkv.f32.view());
      rmsnorm(kv, B, &a.kv_norm.view(), eps);
      rope(kv, B, 1, pos, false);
      fake_quant(kv, B);
      const Mat ctx_kv = context_kv(l, ctx_rows, ctx_pos);
      const float scale = static_cast<float>(1.0 / std::sqrt(double(hd)));
      Mat o(static_cast<size_t>(B * H * hd), 0.0f);
      for (int64_t i = 0; i < B; ++i)
        for (int64_t h = 0; h < H; ++h) {
          std::vector<const float*> keys;
          for (int64_t j = 0; j < ctx_n; ++j) keys.push_back(&ctx_kv[j * hd]);
          for (int64_t j = 0; j < B; ++j)
            if (!causal || j <= i) keys.push_back(&kv[j * hd]);
          const float* qv = &q[(i * H + h) * hd];
          std::vector<double> logit;
          double mx = a.sinks.view().data_as<float>()[h];
          for (const float* k : keys) {
            double s = 0;
            for (int64_t d = 0; d < hd; ++d) s += double(qv[d]) * k[d];
            logit.push_back(s * scale);
            mx = std::max(mx, logit.back());
          }
          double denom = std::exp(a.sinks.view().data_as<float>()[h] - mx);
          for (double& v : logit) denom += (v = std::exp(v - mx));
          for (size_t j = 0; j < keys.size(); ++j)
            for (int64_t d = 0; d < hd; ++d)
              o[(i * H + h) * hd + d] += static_cast<float>(logit[j] / denom * keys[j][d]);
        }
      rope(o, B, H, pos, true);
      const int64_t G = c.attn.o_groups, ol = c.attn.o_lora_rank, gw = H * hd / G;
      Mat z(static_cast<size_t>(B * G * ol));
      for (int64_t g = 0; g < G; ++g) {
        Mat og(static_cast<size_t>(B * gw));
        for (int64_t i = 0; i < B; ++i) std::copy_n(&o[i * H * hd + g * gw], gw, &og[i * gw]);
        Mat zg = matmul(og, B, a.wo_a.f32.view().slice(g * ol, (g + 1) * ol));
        for (int64_t i = 0; i < B; ++i) std::copy_n(&zg[i * ol], ol, &z[i * G * ol + g * ol]);
      }
      expand(matmul(z, B, a.wo_b.f32.view()));
      Mat ffn_pre = mix(lw.hc_ffn_fn, lw.hc_ffn_base, lw.hc_ffn_scale);
      x = collapse(v41 ? attn_pre : ffn_pre, &lw.ffn_norm);
      // MoE with the draft's own expert count and top-k (the router and experts are tested ops).
      HostTensor xin(DType::kF32, {B, D}), weights(DType::kF32, {B, c.draft.num_experts_per_tok}),
          indices(DType::kI32, {B, c.draft.num_experts_per_tok}), y(DType::kF32, {B, D});
      std::copy(x.begin(), x.end(), xin.data<float>());
      RouterParams r;
      r.x = xin.view();
      r.weight = lw.gate.view();
      r.bias = lw.gate_bias.view();
      r.weights = weights.view();
      r.indices = indices.view();
      r.scoring = RouterScoring::kSqrtSoftplus;
      r.gate_temp = static_cast<float>(v41 ? c.moe.gate_temp : 1.0);
      r.route_scale = static_cast<float>(c.moe.routed_scaling_factor);
      r.normalize = v41 ? (c.moe.norm_topk_prob && c.draft.num_experts_per_tok > 1) : true;
      b.router(r);
      MoeParams mp;
      mp.x = xin.view();
      mp.weights = weights.view();
      mp.indices = indices.view();
      mp.experts = &lw.experts;
      mp.shared = lw.has_shared ? &lw.shared : nullptr;
      mp.out = y.view();
      mp.swiglu_limit = static_cast<float>(c.moe.swiglu_limit);
      mp.weight_before_w2 = v41;
      b.moe(mp);
      expand(Mat(y.data<float>(), y.data<float>() + B * D));
      if (v41) carried = ffn_pre;
    }
    if (!v41) {
      b.hc_head({streams.view(), w.hc_head_fn.view(), w.hc_head_base.view(), w.hc_head_scale.view(), pre.view(), eps,
                 static_cast<float>(c.hc.eps)});
      carried.assign(pre.data<float>(), pre.data<float>() + B * hc);
    }
    Mat hidden = collapse(carried, &w.norm);
    Mat logits = matmul(hidden, B, m.weights().head.view());
    (void)V;
    return {hidden, logits};
  }
  Mat markov_bias(int64_t token) {
    const int64_t r = c.draft.markov_rank;
    Mat e(w.markov_embed.view().data_as<float>() + token * r, w.markov_embed.view().data_as<float>() + (token + 1) * r);
    return matmul(e, 1, w.markov_head.view());
  }
  double confidence(const float* hidden, int64_t token) {
    const int64_t D = c.hidden_size, r = c.draft.markov_rank;
    const float* p = w.confidence.view().data_as<float>();
    double z = 0;
    for (int64_t d = 0; d < D; ++d) z += double(p[d]) * hidden[d];
    for (int64_t j = 0; j < r; ++j) z += double(p[D + j]) * w.markov_embed.view().data_as<float>()[token * r + j];
    return 1.0 / (1.0 + std::exp(-z));
  }
};

double max_abs(const float* a, const float* b, size_t n) {
  double e = 0;
  for (size_t i = 0; i < n; ++i) e = std::max(e, std::fabs(double(a[i]) - b[i]));
  return e;
}
double max_abs(const Mat& a) {
  double e = 0;
  for (float v : a) e = std::max(e, std::fabs(double(v)));
  return e;
}

// ---------------------------------------------------------------------------------------------------------------

class DsparkDraftTest : public ::testing::TestWithParam<std::string> {};

TEST_P(DsparkDraftTest, CaptureIsTheMeanOfTheAttentionInputStreamsAndLeavesLogitsAlone) {
  testing::DraftFixture& f = testing::dspark_fixture(GetParam());
  const DeepseekV4Model& m = *f.model;
  const ModelConfig& c = m.config();
  ASSERT_EQ(c.draft.kind, DraftKind::kDSpark);
  ASSERT_TRUE(m.weights().dspark.has_value());
  const std::vector<int64_t> ids = testing::dspark_prompt(11, c.vocab_size);
  auto plain_seq = m.new_sequence();
  HostTensor plain = m.forward(plain_seq, ids);
  DsparkDraft draft(m);
  V4StreamCapture cap = draft.make_capture();
  V4ForwardTrace trace;
  auto seq = m.new_sequence();
  HostTensor logits = m.forward(seq, ids, &trace, &cap);
  ASSERT_EQ(logits.numel(), plain.numel());
  EXPECT_EQ(max_abs(logits.data<float>(), plain.data<float>(), logits.numel()), 0.0);
  const int64_t D = c.hidden_size, hc = c.hc.hc_mult, T = static_cast<int64_t>(ids.size());
  ASSERT_EQ(cap.first_position, 0);
  ASSERT_EQ(cap.rows.shape(), (Shape{T, static_cast<int64_t>(c.draft.target_layer_ids.size()) * D}));
  const Mat rows = host(cap.rows.view());
  int checked = 0;
  for (size_t i = 0; i < c.draft.target_layer_ids.size(); ++i) {
    const int l = c.draft.target_layer_ids[i];
    if (l == 0 || c.layers[l].engram) continue;  // the streams entering l are the previous layer's output
    const HostTensor& prev = trace.layer_outputs[l - 1];
    for (int64_t t = 0; t < T; ++t)
      for (int64_t d = 0; d < D; ++d) {
        double mean = 0;
        for (int64_t k = 0; k < hc; ++k) mean += prev.data<float>()[(t * hc + k) * D + d];
        ASSERT_NEAR(rows[t * c.draft.target_layer_ids.size() * D + i * D + d], mean / hc, 1e-5) << l << " " << t;
      }
    ++checked;
  }
  EXPECT_GE(checked, 2);
}

TEST_P(DsparkDraftTest, BlockMatchesTheReferenceAndIsNonCausal) {
  testing::DraftFixture& f = testing::dspark_fixture(GetParam());
  const DeepseekV4Model& m = *f.model;
  const ModelConfig& c = m.config();
  DsparkDraft draft(m);
  // A prompt longer than the draft window: only the last `window` positions are context.
  const int64_t N = draft.window() + 5, D = c.hidden_size, V = c.vocab_size;
  const std::vector<int64_t> ids = testing::dspark_prompt(static_cast<int>(N), V);
  V4StreamCapture cap = draft.make_capture();
  auto seq = m.new_sequence();
  m.forward(seq, ids, nullptr, &cap);
  DsparkContext ctx = draft.new_context();
  draft.append_context(ctx, cap);
  ASSERT_EQ(ctx.num_positions, N);
  const int64_t anchor = 17;
  const DsparkBlockOutput out = draft.block(ctx, anchor);

  Reference ref{m, *f.backend};
  const Mat all = host(cap.rows.view());
  const int64_t width = static_cast<int64_t>(c.draft.target_layer_ids.size()) * D, W = draft.window();
  const Mat ctx_rows(all.begin() + (N - W) * width, all.end());
  const auto [hidden, logits] = ref.block(ctx_rows, W, N, anchor, /*causal=*/false);
  const double scale = max_abs(logits);
  EXPECT_LE(max_abs(out.hidden.data<float>(), hidden.data(), hidden.size()), 1e-4 * max_abs(hidden));
  EXPECT_LE(max_abs(out.base_logits.data<float>(), logits.data(), logits.size()), 1e-4 * scale);
  // Causal attention inside the block would give a different first row: block keys after the anchor matter.
  const auto [causal_hidden, causal_logits] = ref.block(ctx_rows, W, N, anchor, /*causal=*/true);
  EXPECT_GT(max_abs(causal_logits.data(), logits.data(), V), 1e-2 * scale);
  // The context matters too: a shorter window changes the result.
  const Mat short_rows(all.end() - 4 * width, all.end());
  const auto [short_hidden, short_logits] = ref.block(short_rows, 4, N, anchor, false);
  EXPECT_GT(max_abs(short_logits.data(), logits.data(), logits.size()), 1e-2 * scale);
}

// The drafter reads no buffer that an op did not write: on a target loaded on a backend whose TensorMemory::empty fills
// with 0xFF bytes (NaN, -1), the captured context rows, the block's hidden rows and logits, the Markov bias and the
// confidence equal the zero-filling backend's bit for bit.
TEST_P(DsparkDraftTest, ReadsNoBufferNoOpWrote) {
  testing::DraftFixture& f = testing::dspark_fixture(GetParam());
  const std::unique_ptr<Backend> poison = make_cpu_backend(0, /*poison_empty=*/true);
  const std::unique_ptr<DeepseekV4Model> target = DeepseekV4Model::load(f.dir, *poison, f.token_map);
  const DeepseekV4Model* models[2] = {f.model.get(), target.get()};
  std::vector<float> got[2];
  for (int i = 0; i < 2; ++i) {
    const DeepseekV4Model& m = *models[i];
    DsparkDraft draft(m);
    const int64_t V = m.config().vocab_size, D = m.config().hidden_size;
    const std::vector<int64_t> ids = testing::dspark_prompt(static_cast<int>(draft.window() + 5), V);
    V4StreamCapture cap = draft.make_capture();
    auto seq = m.new_sequence();
    m.forward(seq, ids, nullptr, &cap);
    DsparkContext ctx = draft.new_context();
    draft.append_context(ctx, cap);
    const DsparkBlockOutput out = draft.block(ctx, 17);
    const HostTensor rows = m.memory().to_host(cap.rows.view());
    got[i].assign(rows.data<float>(), rows.data<float>() + rows.numel());
    got[i].insert(got[i].end(), out.hidden.data<float>(), out.hidden.data<float>() + out.hidden.numel());
    got[i].insert(got[i].end(), out.base_logits.data<float>(), out.base_logits.data<float>() + out.base_logits.numel());
    const std::vector<float> bias = draft.markov_bias(17);
    got[i].insert(got[i].end(), bias.begin(), bias.end());
    got[i].push_back(draft.confidence(std::span<const float>(out.hidden.data<float>(), D), 23));
  }
  ASSERT_EQ(got[1].size(), got[0].size());
  EXPECT_EQ(std::memcmp(got[1].data(), got[0].data(), got[0].size() * sizeof(float)), 0);
}

TEST_P(DsparkDraftTest, MarkovHeadIsSequentialAndConfidenceIsAProbability) {
  testing::DraftFixture& f = testing::dspark_fixture(GetParam());
  const DeepseekV4Model& m = *f.model;
  const ModelConfig& c = m.config();
  DsparkDraft draft(m);
  const int64_t V = c.vocab_size, D = c.hidden_size, B = draft.block_size();
  const std::vector<int64_t> ids = testing::dspark_prompt(9, V);
  V4StreamCapture cap = draft.make_capture();
  auto seq = m.new_sequence();
  m.forward(seq, ids, nullptr, &cap);
  DsparkContext ctx = draft.new_context();
  draft.append_context(ctx, cap);
  const int64_t anchor = 3;
  const DsparkBlockOutput base = draft.block(ctx, anchor);
  Reference ref{m, *f.backend};
  const DsparkProposal greedy = draft.propose(ctx, anchor, static_cast<int>(B),
                                              [](int, std::span<const float> row) { return testing::argmax_of(row); });
  ASSERT_EQ(greedy.tokens.size(), static_cast<size_t>(B));
  ASSERT_EQ(greedy.confidence.size(), static_cast<size_t>(B));
  int64_t x = anchor;
  for (int64_t i = 0; i < B; ++i) {
    // logits_i = U_i + head_M·embed_M[x_i], x_{i+1} = testing::argmax_of(logits_i), c_i = σ(proj·[h_i ; embed_M[x_i]]).
    const Mat bias = ref.markov_bias(x);
    const float* row = greedy.logits.data<float>() + i * V;
    for (int64_t v = 0; v < V; ++v)
      ASSERT_NEAR(row[v], base.base_logits.data<float>()[i * V + v] + bias[v], 1e-4 * (1 + std::fabs(row[v])));
    const double conf = ref.confidence(base.hidden.data<float>() + i * D, x);
    EXPECT_NEAR(greedy.confidence[i], conf, 1e-5);
    EXPECT_GT(greedy.confidence[i], 0.0f);
    EXPECT_LT(greedy.confidence[i], 1.0f);
    EXPECT_EQ(greedy.tokens[i], testing::argmax_of({row, static_cast<size_t>(V)}));
    x = greedy.tokens[i];
  }
  // Forcing another first token changes logits_1 by exactly the difference of the two Markov biases and leaves
  // logits_0 (and the shared block pass) alone.
  const int64_t other = (greedy.tokens[0] + 1) % V;
  const DsparkProposal forced = draft.propose(
      ctx, anchor, 2, [&](int i, std::span<const float> row) { return i == 0 ? other : testing::argmax_of(row); });
  EXPECT_EQ(max_abs(forced.logits.data<float>(), greedy.logits.data<float>(), V), 0.0);
  const Mat b0 = ref.markov_bias(greedy.tokens[0]), b1 = ref.markov_bias(other);
  double moved = 0;
  for (int64_t v = 0; v < V; ++v) {
    const double d = forced.logits.data<float>()[V + v] - greedy.logits.data<float>()[V + v];
    ASSERT_NEAR(d, double(b1[v]) - b0[v], 1e-4);
    moved = std::max(moved, std::fabs(d));
  }
  EXPECT_GT(moved, 1e-3);
}

TEST_P(DsparkDraftTest, RollbackLeavesTheCacheAsIfNeverAppended) {
  testing::DraftFixture& f = testing::dspark_fixture(GetParam());
  const DeepseekV4Model& m = *f.model;
  DsparkDraft draft(m, /*rollback_slack=*/6);
  const int64_t V = m.config().vocab_size, N = draft.window() + 3;
  const std::vector<int64_t> ids = testing::dspark_prompt(static_cast<int>(N + 4), V);
  V4StreamCapture cap = draft.make_capture();
  auto seq = m.new_sequence();
  m.forward(seq, ids, nullptr, &cap);
  DsparkContext clean = draft.new_context(), rolled = draft.new_context();
  draft.append_context(clean, cap.rows.view().slice(0, N), 0);
  draft.append_context(rolled, cap.rows.view().slice(0, N - 2), 0);
  draft.append_context(rolled, cap.rows.view().slice(N - 2, N + 4), N - 2);  // 4 positions past N ...
  draft.truncate(rolled, N);                                                 // ... dropped again
  ASSERT_EQ(rolled.num_positions, clean.num_positions);
  // Positions the next block can see (the window before N) are held identically; older ones may be overwritten.
  for (int64_t s = 0; s < clean.capacity; ++s) {
    if (clean.slot_position[s] < N - draft.window()) continue;
    ASSERT_EQ(rolled.slot_position[s], clean.slot_position[s]);
    for (size_t l = 0; l < clean.rings.size(); ++l)
      ASSERT_EQ(std::memcmp(rolled.rings[l].view().row(s).data(), clean.rings[l].view().row(s).data(),
                            sizeof(float) * m.config().attn.head_dim),
                0)
          << "layer " << l << " slot " << s;
  }
  const DsparkBlockOutput a = draft.block(clean, 42), b = draft.block(rolled, 42);
  EXPECT_EQ(
      std::memcmp(a.base_logits.data<float>(), b.base_logits.data<float>(), sizeof(float) * a.base_logits.numel()), 0);
  EXPECT_THROW(draft.truncate(rolled, N - 7), Error);                                 // beyond the slack
  EXPECT_THROW(draft.append_context(rolled, cap.rows.view().slice(0, 1), 0), Error);  // already cached
}

// Greedy speculative decoding with DSpark drafts (the target verifies [anchor, d_1 .. d_n] in one pass; the
// longest matching prefix is kept plus the target's own next token) reproduces plain greedy decoding exactly,
// whatever the (random) draft proposes. The target re-runs the kept sequence each step, so no target rollback is
// involved here: this checks the draft-side bookkeeping (context positions, anchor, acceptance).
TEST_P(DsparkDraftTest, GreedySpeculativeLoopEqualsGreedyDecoding) {
  testing::DraftFixture& f = testing::dspark_fixture(GetParam());
  const DeepseekV4Model& m = *f.model;
  const int64_t V = m.config().vocab_size;
  const std::vector<int64_t> ids = testing::dspark_prompt(12, V);
  const int kNew = 14;
  std::vector<int64_t> plain;
  {
    auto seq = m.new_sequence();
    HostTensor logits = m.forward(seq, ids);
    int64_t next = testing::argmax_of({logits.data<float>() + (logits.shape()[0] - 1) * V, static_cast<size_t>(V)});
    while (static_cast<int>(plain.size()) < kNew) {
      plain.push_back(next);
      logits = m.forward(seq, std::vector<int64_t>{next});
      next = testing::argmax_of({logits.data<float>(), static_cast<size_t>(V)});
    }
  }
  DsparkDraft draft(m);
  DsparkContext ctx = draft.new_context();
  std::vector<int64_t> kept = ids, spec;
  int64_t anchor = -1;
  {
    V4StreamCapture cap = draft.make_capture();
    auto seq = m.new_sequence();
    HostTensor logits = m.forward(seq, ids, nullptr, &cap);
    draft.append_context(ctx, cap);
    anchor = testing::argmax_of({logits.data<float>() + (logits.shape()[0] - 1) * V, static_cast<size_t>(V)});
  }
  int steps = 0, accepted = 0;
  while (static_cast<int>(spec.size()) < kNew) {
    const int64_t P = static_cast<int64_t>(kept.size());
    ASSERT_EQ(ctx.num_positions, P);
    const DsparkProposal d = draft.propose(ctx, anchor, draft.block_size(),
                                           [](int, std::span<const float> row) { return testing::argmax_of(row); });
    std::vector<int64_t> chunk = kept;
    chunk.push_back(anchor);
    chunk.insert(chunk.end(), d.tokens.begin(), d.tokens.end());
    V4StreamCapture cap = draft.make_capture();
    auto seq = m.new_sequence();
    HostTensor logits = m.forward(seq, chunk, nullptr, &cap);
    auto row = [&](int64_t pos) {
      return testing::argmax_of({logits.data<float>() + pos * V, static_cast<size_t>(V)});
    };
    size_t a = 0;
    while (a < d.tokens.size() && d.tokens[a] == row(P + static_cast<int64_t>(a))) ++a;
    const int64_t bonus = row(P + static_cast<int64_t>(a));
    kept.push_back(anchor);
    spec.push_back(anchor);
    for (size_t i = 0; i < a; ++i) {
      kept.push_back(d.tokens[i]);
      spec.push_back(d.tokens[i]);
    }
    draft.append_context(ctx, cap.rows.view().slice(P, P + 1 + static_cast<int64_t>(a)), P);
    anchor = bonus;
    accepted += static_cast<int>(a);
    ++steps;
  }
  spec.resize(kNew);
  EXPECT_EQ(spec, plain);
  EXPECT_LE(steps, kNew);
  RecordProperty("accepted_drafts", accepted);
}

// The engine runner's feature forward: same logits, the capture as host rows, NaN rows for positions that
// never reached the target layers (V4.1 bounded replay runs the decoder only on the prompt's last window).
TEST_P(DsparkDraftTest, ForwardFeaturesPadPositionsWithoutCapture) {
  testing::DraftFixture& f = testing::dspark_fixture(GetParam());
  const DeepseekV4Model& m = *f.model;
  const int64_t V = m.config().vocab_size, T = m.decoder_window() + 6;
  const int64_t F = static_cast<int64_t>(m.config().draft.target_layer_ids.size()) * m.config().hidden_size;
  const std::vector<int64_t> ids = testing::dspark_prompt(static_cast<int>(T), V);
  DsparkDraft draft(m);
  V4StreamCapture cap = draft.make_capture();
  auto seq = m.new_sequence();
  const HostTensor logits = m.forward(seq, ids, nullptr, &cap);
  const Mat rows = host(cap.rows.view());
  auto bounded = m.new_sequence();
  bounded.decoder_from = m.bounded_decoder_from(T);
  for (const int64_t from : {int64_t{0}, bounded.decoder_from}) {
    auto s = m.new_sequence();
    s.decoder_from = from;
    std::vector<float> features;
    const HostTensor out = m.forward_features(s, ids, &features);
    ASSERT_EQ(features.size(), static_cast<size_t>(T * F));
    EXPECT_EQ(out.shape()[0], T - from);
    for (int64_t t = 0; t < T; ++t) {
      if (t < from) {
        EXPECT_TRUE(std::isnan(features[t * F])) << t;
      } else if (from == 0) {
        EXPECT_EQ(std::memcmp(&features[t * F], &rows[t * F], sizeof(float) * F), 0) << t;
        EXPECT_EQ(std::memcmp(out.data<float>() + t * V, logits.data<float>() + t * V, sizeof(float) * V), 0) << t;
      } else {
        EXPECT_FALSE(std::isnan(features[t * F])) << t;
      }
    }
  }
  if (m.decoder_start() >= 0) EXPECT_GT(bounded.decoder_from, 0);
}

INSTANTIATE_TEST_SUITE_P(Families, DsparkDraftTest, ::testing::Values("deepseek_v41", "deepseek_v4"));

TEST(DsparkDraftLoad, WithoutDraftTensorsDsparkIsUnavailableAndPartialDraftFailsToLoad) {
  testing::DraftFixture& f = testing::dspark_fixture("deepseek_v41");
  auto file = SafetensorsFile::open(f.dir + "/model.safetensors");
  for (const bool partial : {false, true}) {
    testing::TempDir tmp;
    std::vector<SafetensorsWriteItem> items;
    for (const auto& e : file->entries()) {
      const bool draft = e.name.rfind("mtp.", 0) == 0;
      if (draft && (!partial || e.name == "mtp.2.markov_head.head.weight")) continue;
      items.push_back({e.name, e.dtype, e.shape, file->tensor(e).data()});
    }
    write_safetensors(tmp.file("model.safetensors"), items);
    testing::write_file(tmp.file("config.json"), testing::read_file_or_empty(f.dir + "/config.json"));
    auto backend = make_cpu_backend(1);
    if (partial) {
      try {
        DeepseekV4Model::load(tmp.path(), *backend, f.token_map);
        ADD_FAILURE() << "a checkpoint with part of the draft loaded";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("mtp.2.markov_head.head.weight"), std::string::npos) << e.what();
      }
      continue;
    }
    auto model = DeepseekV4Model::load(tmp.path(), *backend, f.token_map);
    EXPECT_FALSE(model->weights().dspark.has_value());
    EXPECT_NE(DsparkDraft::unavailable_reason(*model).find("no DSpark draft tensors"), std::string::npos);
    try {
      DsparkDraft d(*model);
      ADD_FAILURE() << "DSpark without draft weights";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    }
  }
  // A config without a DSpark draft says so.
  auto golden = DeepseekV4Model::load(testing::test_data_dir() + "/golden/deepseek_v41", *f.backend, f.token_map);
  EXPECT_NE(DsparkDraft::unavailable_reason(*golden).find("config has no DSpark draft"), std::string::npos);
}

}  // namespace
}  // namespace deepinfer

namespace deepinfer {
namespace {

std::string config_error(const nlohmann::json& j) {
  try {
    parse_model_config(j.dump());
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(DsparkConfig, DraftLayersFromTrailingRatiosAndBadFields) {
  nlohmann::json root = testing::dspark_config("deepseek_v41");
  nlohmann::json& t = root["text_config"];
  // V4.1 / V4-0731 configs list one compress ratio per draft layer after the main layers.
  t["num_nextn_predict_layers"] = 0;
  t["compress_ratios"] = {0, 4, 4, 1, 1, 1, 0, 0, 0};
  ModelConfig c = parse_model_config(root.dump());
  EXPECT_EQ(c.draft.kind, DraftKind::kDSpark);
  EXPECT_EQ(c.draft.num_layers, 3);
  EXPECT_EQ(c.draft.n_routed_experts, 4);
  EXPECT_EQ(c.draft.num_experts_per_tok, 2);
  nlohmann::json bad = root;
  bad["text_config"]["dspark_target_layer_ids"] = {4, 3};
  EXPECT_NE(config_error(bad).find("strictly increasing"), std::string::npos);
  bad = root;
  bad["text_config"]["dspark_markov_rank"] = 0;
  EXPECT_NE(config_error(bad).find("dspark_markov_rank"), std::string::npos);
  bad = root;
  bad["text_config"]["dspark_num_experts_per_tok"] = 9;
  EXPECT_NE(config_error(bad).find("dspark_num_experts_per_tok"), std::string::npos);
  // Without a block size there is no DSpark draft.
  bad = root;
  bad["text_config"].erase("dspark_block_size");
  EXPECT_EQ(parse_model_config(bad.dump()).draft.kind, DraftKind::kNone);
}

}  // namespace
}  // namespace deepinfer
