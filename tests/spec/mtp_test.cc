// The V3 MTP module and V3 rollback, on the committed tiny model (models/deepinfer-tiny-v3, trained MTP layer) and
// on a random checkpoint of the V3 test config (MTP weights written by the generator).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "deepinfer/core/error.h"
#include "deepinfer/io/checkpoint.h"
#include "deepinfer/model/deepseek_v3.h"
#include "deepinfer/model/deepseek_v3_weights.h"
#include "deepinfer/model/random_checkpoint.h"
#include "deepinfer/sampling/rng.h"
#include "deepinfer/sampling/sampling_params.h"
#include "deepinfer/spec/mtp_proposer.h"
#include "test_util.h"

namespace deepinfer {
namespace {

const std::string kTinyDir = DEEPINFER_SOURCE_DIR "/models/deepinfer-tiny-v3";

struct Tiny {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<DeepseekV3Model> model;
};
const Tiny& tiny() {
  static Tiny t = [] {
    Tiny x;
    x.backend = make_cpu_backend(1);
    x.model = DeepseekV3Model::load(kTinyDir, *x.backend);
    return x;
  }();
  return t;
}

const std::vector<int64_t> kPrompt = {587, 2535, 305, 2607, 307, 412, 201, 259, 263, 291, 489};

std::vector<double> rms_norm_ref(const float* x, const float* w, int64_t D, double eps) {
  double ss = 0;
  for (int64_t i = 0; i < D; ++i) ss += static_cast<double>(x[i]) * x[i];
  const double inv = 1.0 / std::sqrt(ss / D + eps);
  std::vector<double> out(D);
  for (int64_t i = 0; i < D; ++i) out[i] = x[i] * inv * w[i];
  return out;
}

TEST(MtpModule, LoadsTheTinyModelsMtpLayer) { EXPECT_EQ(tiny().model->num_mtp_layers(), 1); }

// Independent composition: z_i = eh_proj([enorm(E[t_{i+1}]) ; hnorm(h_i)]) computed here with plain loops in double,
// then a one-layer V3 model whose "embedding" table is the z rows, whose layer is the MTP block and whose final
// norm is shared_head.norm (the main forward, which matches transformers). Its logits at positions 0..T-1 must be
// the MTP logits. Tolerance 2e-4 absolute on logits of magnitude ~10 (fp32 vs the double z).
TEST(MtpModule, MatchesAnIndependentComposition) {
  const DeepseekV3Model& m = *tiny().model;
  const ModelConfig& c = m.config();
  const int64_t T = static_cast<int64_t>(kPrompt.size()), D = c.hidden_size, V = c.vocab_size;
  auto seq = m.new_sequence();
  std::vector<float> h;
  m.forward_features(seq, kPrompt, &h);
  ASSERT_EQ(static_cast<int64_t>(h.size()), T * D);
  std::vector<int64_t> next(kPrompt.begin() + 1, kPrompt.end());
  next.push_back(1998);
  auto mtp = m.new_mtp_sequence();
  const HostTensor got = m.mtp_forward(mtp, h, next);
  ASSERT_EQ(got.shape()[0], T);

  // The reference model: fresh weights from the checkpoint, rearranged.
  auto ck = Checkpoint::open(kTinyDir);
  V3Weights w = load_v3_weights(c, *ck, *tiny().backend);
  ASSERT_EQ(w.mtp.size(), 1u);
  V3MtpWeights& mw = w.mtp[0];
  HostTensor ztab(DType::kF32, {T, D});
  const double eps = c.rms_norm_eps;
  for (int64_t t = 0; t < T; ++t) {
    const std::vector<double> e = rms_norm_ref(w.embed.data<float>() + next[t] * D, mw.enorm.data<float>(), D, eps);
    const std::vector<double> hn = rms_norm_ref(h.data() + t * D, mw.hnorm.data<float>(), D, eps);
    for (int64_t o = 0; o < D; ++o) {
      const float* row = mw.eh_proj.data<float>() + o * 2 * D;
      double acc = 0;
      for (int64_t i = 0; i < D; ++i) acc += row[i] * e[i] + row[D + i] * hn[i];
      ztab.data<float>()[t * D + o] = static_cast<float>(acc);
    }
  }
  V3Weights r;
  r.embed = std::move(ztab);
  r.norm = std::move(mw.head_norm);
  r.head = std::move(w.head);
  r.layers.push_back(std::move(mw.block));
  ModelConfig rc = c;
  rc.num_layers = 1;
  rc.layers = {mtp_layer_plan(c, 0)};
  rc.vocab_size = V;
  DeepseekV3Model ref(rc, std::move(r), *tiny().backend);
  auto rs = ref.new_sequence();
  std::vector<int64_t> rows(T);
  for (int64_t t = 0; t < T; ++t) rows[t] = t;
  const HostTensor want = ref.forward(rs, rows);
  double worst = 0;
  for (int64_t i = 0; i < T * V; ++i)
    worst = std::max(worst, std::abs(static_cast<double>(got.data<float>()[i]) - want.data<float>()[i]));
  EXPECT_LT(worst, 2e-4);

  // Chunked through the cache (two calls) equals one call.
  auto mtp2 = m.new_mtp_sequence();
  const int64_t split = 4;
  const HostTensor a =
      m.mtp_forward(mtp2, std::span<const float>(h).first(split * D), std::span<const int64_t>(next).first(split));
  const HostTensor b =
      m.mtp_forward(mtp2, std::span<const float>(h).subspan(split * D), std::span<const int64_t>(next).subspan(split));
  double chunk_diff = 0;
  for (int64_t i = 0; i < (T - split) * V; ++i)
    chunk_diff =
        std::max(chunk_diff, std::abs(static_cast<double>(b.data<float>()[i]) - got.data<float>()[split * V + i]));
  EXPECT_LT(chunk_diff, 1e-4);
}

// Greedy acceptance of one MTP draft along a greedy generation (the quantity docs/PERF.md measured in PyTorch as
// 75% over 64 held-out prompts): on this one prompt it must be well above chance (a miswired module is ~0%).
TEST(MtpModule, DraftsAreUsefulOnTheTinyModel) {
  const DeepseekV3Model& m = *tiny().model;
  const int64_t D = m.config().hidden_size, V = m.config().vocab_size;
  auto seq = m.new_sequence();
  auto mtp = m.new_mtp_sequence();
  std::vector<float> h;
  HostTensor logits = m.forward_features(seq, kPrompt, &h);
  std::vector<int64_t> ids = kPrompt;
  auto argmax_row = [&](const HostTensor& l) {
    const float* r = l.data<float>() + (l.shape()[0] - 1) * V;
    return static_cast<int64_t>(std::max_element(r, r + V) - r);
  };
  int hits = 0, drafts = 0;
  int64_t draft = -1;
  for (int step = 0; step < 40; ++step) {
    const int64_t t = argmax_row(logits);
    if (draft >= 0) {
      ++drafts;
      hits += draft == t;
    }
    // The MTP rows of the last chunk: next ids are the chunk's tokens shifted by one, then t.
    std::vector<int64_t> next(ids.end() - static_cast<int64_t>(h.size() / D) + 1, ids.end());
    next.push_back(t);
    const HostTensor ml = m.mtp_forward(mtp, h, next);
    draft = argmax_row(ml);
    ids.push_back(t);
    logits = m.forward_features(seq, std::vector<int64_t>{t}, &h);
  }
  EXPECT_GE(hits, drafts / 2) << hits << " of " << drafts << " drafts accepted";
}

// Rollback: after a chunk [t, d1, d2, d3] truncated to [t, d1], the cache rows and the next logits are
// bit-identical to running [t, d1] alone (nothing of d2, d3 survives).
TEST(MtpModule, TruncateIsBitIdenticalToNeverDrafting) {
  const DeepseekV3Model& m = *tiny().model;
  for (MlaForm form : {MlaForm::kAbsorbed, MlaForm::kNaive}) {
    const_cast<DeepseekV3Model&>(m).set_mla_form(form);
    auto a = m.new_sequence(), b = m.new_sequence();
    m.forward(a, kPrompt);
    m.forward(b, kPrompt);
    m.forward(a, std::vector<int64_t>{412, 201, 1000, 77});
    m.truncate(a, static_cast<int64_t>(kPrompt.size()) + 2);
    m.forward(b, std::vector<int64_t>{412, 201});
    ASSERT_EQ(a.num_tokens, b.num_tokens);
    for (size_t l = 0; l < a.kv.size(); ++l) {
      ASSERT_EQ(a.kv[l].rows, b.kv[l].rows);
      EXPECT_EQ(std::memcmp(a.kv[l].view().data(), b.kv[l].view().data(), a.kv[l].view().nbytes()), 0) << "layer " << l;
    }
    const HostTensor la = m.forward(a, std::vector<int64_t>{259});
    const HostTensor lb = m.forward(b, std::vector<int64_t>{259});
    EXPECT_EQ(std::memcmp(la.data<float>(), lb.data<float>(), la.view().nbytes()), 0);
  }
  const_cast<DeepseekV3Model&>(m).set_mla_form(MlaForm::kAuto);
}

TEST(MtpModule, RandomCheckpointCarriesMtpWeightsAndProposerNeedsThem) {
  testing::TempDir dir;
  RandomCheckpointOptions o;
  o.config_path = testing::test_data_dir() + "/configs/deepseek_v3.json";
  o.out_dir = dir.path();
  o.seed = 5;
  write_random_checkpoint(o);
  auto backend = make_cpu_backend(1);
  auto with = DeepseekV3Model::load(dir.path(), *backend);
  EXPECT_EQ(with->num_mtp_layers(), 1);
  // The golden fixture is an HF export: no MTP layer. It still loads; the proposer refuses it clearly.
  auto without = DeepseekV3Model::load(testing::test_data_dir() + "/golden/deepseek_v3", *backend);
  EXPECT_EQ(without->num_mtp_layers(), 0);
  try {
    spec::MtpProposer p(*without, 1);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("no MTP weights"), std::string::npos) << e.what();
  }
}

// Sampled drafts (MtpDraftSampling::kSampled): the proposer reports q = softmax(module logits / T) with every draft
// and draws the draft from it with the sequence's random stream. Over many streams the first draft's frequencies fit
// q (Pearson goodness of fit against the 0.1% critical value; q's tail pooled so every bin expects >= 5). A greedy
// request still gets the argmax point mass; a greedy proposer never reports q.
TEST(MtpProposer, SampledDraftsFollowTheReportedDistribution) {
  const DeepseekV3Model& m = *tiny().model;
  const int64_t V = m.config().vocab_size;
  spec::MtpProposer sampled(m, 1, spec::MtpDraftSampling::kSampled), greedy(m, 1);
  auto seq = m.new_sequence();
  std::vector<float> h;
  const HostTensor logits = m.forward_features(seq, kPrompt, &h);
  const float* last = logits.data<float>() + (logits.shape()[0] - 1) * V;
  const TokenId next = static_cast<TokenId>(std::max_element(last, last + V) - last);
  const std::vector<TokenId> ids(kPrompt.begin(), kPrompt.end());
  spec::TargetChunk c;
  c.slot = 0;
  c.reset = true;
  c.ids = ids;
  c.features = h;
  c.feature_dim = m.config().hidden_size;
  c.next_token = next;
  sampled.observe(c);
  greedy.observe(c);
  SamplingParams params;
  params.temperature = 0.9f;
  spec::DraftRequest req;
  req.slot = 0;
  req.max_tokens = 2;
  req.position = static_cast<int64_t>(kPrompt.size()) + 1;
  req.params = &params;

  const spec::Draft g = greedy.propose(req);
  ASSERT_EQ(g.tokens.size(), 2u);
  EXPECT_TRUE(g.probs.empty());
  std::vector<float> q0;
  constexpr int kDraws = 2000;
  std::vector<int> counts(static_cast<size_t>(V), 0);
  for (int i = 0; i < kDraws; ++i) {
    req.key = RngKey{17, static_cast<uint64_t>(i)};
    const spec::Draft d = sampled.propose(req);
    ASSERT_EQ(d.tokens.size(), 2u);
    ASSERT_EQ(d.probs.size(), 2u);
    for (const auto& q : d.probs) {
      ASSERT_EQ(static_cast<int64_t>(q.size()), V);
      double sum = 0;
      for (float v : q) sum += v;
      ASSERT_NEAR(sum, 1.0, 1e-4);
    }
    EXPECT_GT(d.probs[1][d.tokens[1]], 0.0f);
    if (q0.empty()) q0 = d.probs[0];
    ASSERT_EQ(d.probs[0], q0);  // the first draft's q depends only on the observed state
    ++counts[d.tokens[0]];
  }
  // q0 is the module's softmax at the request's temperature (the greedy draft is its mode).
  EXPECT_EQ(std::max_element(q0.begin(), q0.end()) - q0.begin(), g.tokens[0]);
  double chi2 = 0, tail_expected = 0;
  int tail_count = 0, bins = 0;
  for (int64_t t = 0; t < V; ++t) {
    const double e = q0[t] * kDraws;
    if (e >= 5) {
      chi2 += (counts[t] - e) * (counts[t] - e) / e;
      ++bins;
    } else {
      tail_expected += e;
      tail_count += counts[t];
    }
  }
  if (tail_expected > 0) {
    chi2 += (tail_count - tail_expected) * (tail_count - tail_expected) / tail_expected;
    ++bins;
  }
  const double k = bins - 1, z = 3.09, cw = 1 - 2 / (9 * k) + z * std::sqrt(2 / (9 * k));
  ASSERT_GE(bins, 4);
  EXPECT_LT(chi2, k * cw * cw * cw) << bins << " bins";
  // A greedy request gets the argmax even from the sampling proposer.
  params.temperature = 0;
  const spec::Draft gs = sampled.propose(req);
  EXPECT_EQ(gs.tokens, g.tokens);
  EXPECT_TRUE(gs.probs.empty());
}

}  // namespace
}  // namespace deepinfer
