// Backend::linear_quant / moe_quant on the CPU reference (the Backend defaults): FP8 block-scaled weights are
// dequantized exactly and run through the f32 op, so the result equals dequantize + linear / moe bit for bit;
// a bad weight is rejected by name. act_quant (the reference's MXFP8 activations): each GEMM equals the same GEMM
// over fake_quant-rounded inputs, composed here from separate ops.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>

#include "deepinfer/core/dtype.h"
#include "op_test_util.h"

namespace deepinfer {
namespace {

using testing::random_tensor;

struct Fp8 {
  HostTensor q, s, f32;
  QuantMatrix m() const { return QuantMatrix{q.view(), s.view(), QuantFormat::kFP8Block, 32, 32}; }
};

// Random finite e4m3 codes with 32×32 E8M0 scales (partial edge tiles), and their exact f32 values.
Fp8 fp8(Backend& be, int64_t n, int64_t k, uint32_t seed) {
  Fp8 w{HostTensor(DType::kF8E4M3, {n, k}), HostTensor(DType::kE8M0, {(n + 31) / 32, (k + 31) / 32}),
        HostTensor(DType::kF32, {n, k})};
  std::mt19937 rng(seed);
  for (int64_t i = 0; i < n * k; ++i) w.q.data<uint8_t>()[i] = static_cast<uint8_t>(rng() % 0x7E);
  for (int64_t i = 0; i < w.s.numel(); ++i) w.s.data<uint8_t>()[i] = static_cast<uint8_t>(118 + rng() % 4);
  be.dequantize({w.q.view(), w.s.view(), QuantFormat::kFP8Block, 32, 32, w.f32.view()});
  return w;
}

bool same_bits(const HostTensor& a, const HostTensor& b) {
  return a.numel() == b.numel() && std::memcmp(a.data<float>(), b.data<float>(), a.numel() * sizeof(float)) == 0;
}

TEST(QuantOps, LinearQuantIsDequantizePlusLinear) {
  auto be = make_cpu_backend(1);
  const Fp8 w = fp8(*be, 70, 50, 1);
  HostTensor x = random_tensor({5, 50}, 2), y(DType::kF32, {5, 70}), ref(DType::kF32, {5, 70});
  be->linear_quant({x.view(), w.m(), y.view()});
  be->linear({x.view(), w.f32.view(), ref.view()});
  EXPECT_TRUE(same_bits(y, ref));
  double sum = 0;
  for (int64_t i = 0; i < y.numel(); ++i) sum += std::fabs(y.data<float>()[i]);
  EXPECT_GT(sum, 0.0);
  // bf16 weights (kFloat) take the same path.
  HostTensor wb(DType::kBF16, {70, 50}), wf(DType::kF32, {70, 50});
  for (int64_t i = 0; i < wb.numel(); ++i) {
    wb.data<uint16_t>()[i] = f32_to_bf16(w.f32.data<float>()[i]);
    wf.data<float>()[i] = bf16_to_f32(wb.data<uint16_t>()[i]);
  }
  be->linear_quant({x.view(), QuantMatrix{wb.view(), Tensor{}, QuantFormat::kFloat}, y.view()});
  be->linear({x.view(), wf.view(), ref.view()});
  EXPECT_TRUE(same_bits(y, ref));
}

// e FP8 routed experts and a shared one ([inter, d] gate / up, [d, inter] down), quantized and as exact f32 views.
struct Fp8Moe {
  std::vector<Fp8> store;
  std::vector<QuantExpertWeights> q;
  std::vector<ExpertWeights> f;
  QuantExpertWeights qs;
  ExpertWeights fs;
};
std::unique_ptr<Fp8Moe> fp8_moe(Backend& be, int64_t e, int64_t d, int64_t inter, uint32_t seed) {
  auto m = std::make_unique<Fp8Moe>();
  for (int64_t i = 0; i < 3 * (e + 1); ++i)
    m->store.push_back(i % 3 == 2 ? fp8(be, d, inter, seed + i) : fp8(be, inter, d, seed + i));
  auto quant = [&](int64_t i) {
    return QuantExpertWeights{m->store[3 * i].m(), m->store[3 * i + 1].m(), m->store[3 * i + 2].m()};
  };
  auto exact = [&](int64_t i) {
    return ExpertWeights{m->store[3 * i].f32.view(), m->store[3 * i + 1].f32.view(), m->store[3 * i + 2].f32.view()};
  };
  for (int64_t i = 0; i < e; ++i) {
    m->q.push_back(quant(i));
    m->f.push_back(exact(i));
  }
  m->qs = quant(e);
  m->fs = exact(e);
  return m;
}

TEST(QuantOps, MoeQuantIsDequantizePlusMoe) {
  auto be = make_cpu_backend(1);
  const int64_t e = 4, d = 48, inter = 40, t = 6, k = 2;
  const std::unique_ptr<Fp8Moe> m = fp8_moe(*be, e, d, inter, 10);
  const std::vector<QuantExpertWeights>& q = m->q;
  const std::vector<ExpertWeights>& f = m->f;
  const QuantExpertWeights& qs = m->qs;
  const ExpertWeights& fs = m->fs;
  HostTensor x = random_tensor({t, d}, 3), wts = random_tensor({t, k}, 4), idx(DType::kI32, {t, k});
  for (int64_t i = 0; i < t * k; ++i) idx.data<int32_t>()[i] = static_cast<int32_t>((i * 3 + i / k) % e);
  HostTensor y(DType::kF32, {t, d}), ref(DType::kF32, {t, d});
  be->moe_quant({x.view(), wts.view(), idx.view(), &q, &qs, y.view(), 7.0f, false});
  be->moe({x.view(), wts.view(), idx.view(), &f, &fs, ref.view(), 7.0f, false});
  EXPECT_TRUE(same_bits(y, ref));
}

// Only the selected experts are dequantized: an expert no token picks may be absent (not resident, as under expert
// parallelism) and the result is still the full expansion's; selecting an absent one is an error by name.
TEST(QuantOps, MoeQuantExpandsOnlyTheSelectedExperts) {
  auto be = make_cpu_backend(1);
  const int64_t e = 6, d = 32, inter = 64, t = 3, k = 2;
  std::vector<Fp8> store;
  for (int64_t i = 0; i < 3 * e; ++i)
    store.push_back(i % 3 == 2 ? fp8(*be, d, inter, 40 + i) : fp8(*be, inter, d, 40 + i));
  std::vector<QuantExpertWeights> q;
  std::vector<ExpertWeights> f;
  for (int64_t i = 0; i < e; ++i) {
    q.push_back({store[3 * i].m(), store[3 * i + 1].m(), store[3 * i + 2].m()});
    f.push_back({store[3 * i].f32.view(), store[3 * i + 1].f32.view(), store[3 * i + 2].f32.view()});
  }
  HostTensor x = random_tensor({t, d}, 5), wts = random_tensor({t, k}, 6), idx(DType::kI32, {t, k});
  const int32_t picks[] = {4, 1, 1, 5, 4, 5};  // experts 0, 2 and 3 unused; unsorted within a token
  std::memcpy(idx.data<int32_t>(), picks, sizeof(picks));
  HostTensor y(DType::kF32, {t, d}), ref(DType::kF32, {t, d});
  be->moe({x.view(), wts.view(), idx.view(), &f, nullptr, ref.view(), 0.0f, true});
  for (int64_t unused : {0, 2, 3}) q[unused] = QuantExpertWeights{};
  be->moe_quant({x.view(), wts.view(), idx.view(), &q, nullptr, y.view(), 0.0f, true});
  EXPECT_TRUE(same_bits(y, ref));
  idx.data<int32_t>()[3] = 2;
  try {
    be->moe_quant({x.view(), wts.view(), idx.view(), &q, nullptr, y.view(), 0.0f, true});
    ADD_FAILURE() << "an absent expert was selected without an error";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("expert 2 is not resident"), std::string::npos) << err.what();
  }
}

TEST(QuantOps, BadQuantWeightIsRejected) {
  auto be = make_cpu_backend(1);
  const Fp8 w = fp8(*be, 70, 50, 1);
  QuantMatrix bad = w.m();
  bad.scale = Tensor{};  // FP8 without its scales
  HostTensor x = random_tensor({2, 50}, 2), y(DType::kF32, {2, 70});
  EXPECT_THROW(be->linear_quant({x.view(), bad, y.view()}), Error);
  HostTensor x_bad = random_tensor({2, 49}, 2);
  EXPECT_THROW(be->linear_quant({x_bad.view(), w.m(), y.view()}), Error);
}

// Rows whose values span several binades, so that rounding to e4m3 (3 mantissa bits) changes most of them.
HostTensor spread_rows(int64_t rows, int64_t cols, uint32_t seed) {
  return random_tensor({rows, cols}, seed, 0.01f, 4.0f);
}

HostTensor rounded(Backend& be, const HostTensor& x) {
  HostTensor r = testing::copy_of(x);
  be.fake_quant({r.view(), FakeQuantKind::kFP8E4M3Ue8m0Block32});
  return r;
}

TEST(QuantOps, ActQuantLinearIsLinearOverRoundedInputs) {
  auto be = make_cpu_backend(1);
  const Fp8 w = fp8(*be, 70, 64, 21);
  HostTensor x = spread_rows(5, 64, 22), x0 = testing::copy_of(x);
  HostTensor y(DType::kF32, {5, 70}), ref(DType::kF32, {5, 70}), plain(DType::kF32, {5, 70});
  const HostTensor xq = rounded(*be, x);
  be->linear({x.view(), w.f32.view(), y.view(), ActQuant::kMxfp8});
  be->linear({xq.view(), w.f32.view(), ref.view()});
  be->linear({x.view(), w.f32.view(), plain.view()});
  EXPECT_TRUE(same_bits(y, ref));
  EXPECT_FALSE(same_bits(y, plain)) << "the rounding changed nothing: the test inputs are too tame";
  EXPECT_TRUE(same_bits(x, x0)) << "act_quant modified the input tensor";
  QuantLinearParams q{x.view(), w.m(), y.view()};
  q.act_quant = ActQuant::kMxfp8;
  be->linear_quant(q);
  EXPECT_TRUE(same_bits(y, ref));
  // K not a multiple of 32: rows pass unrounded, as fake_quant leaves them.
  const Fp8 w50 = fp8(*be, 70, 50, 23);
  HostTensor x50 = spread_rows(5, 50, 24);
  be->linear({x50.view(), w50.f32.view(), y.view(), ActQuant::kMxfp8});
  be->linear({x50.view(), w50.f32.view(), ref.view()});
  EXPECT_TRUE(same_bits(y, ref));
  // split_in asks for near-f32 products of unrounded inputs: the two do not combine.
  QuantLinearParams both{x.view(), QuantMatrix{w.f32.view(), Tensor{}, QuantFormat::kFloat}, y.view(), true};
  both.act_quant = ActQuant::kMxfp8;
  EXPECT_THROW(be->linear_quant(both), Error);
}

float silu_ref(float v) { return v / (1.0f + std::exp(-v)); }

// moe with act_quant against the composition of single-row linears: x rounded once per token, h rounded per expert
// after the SwiGLU (and after the routing weight when it comes before w2), the shared expert alike. The CPU moe sums
// a token's experts in increasing id order, then the shared expert, and so does this reference.
TEST(QuantOps, ActQuantMoeRoundsXAndHBeforeEachGemm) {
  auto be = make_cpu_backend(1);
  const int64_t e = 4, d = 64, inter = 96, t = 5, k = 2;
  const float limit = 3.0f;
  const std::unique_ptr<Fp8Moe> m = fp8_moe(*be, e, d, inter, 60);
  const std::vector<QuantExpertWeights>& q = m->q;
  const std::vector<ExpertWeights>& f = m->f;
  const QuantExpertWeights& qs = m->qs;
  const ExpertWeights& fs = m->fs;
  HostTensor x = spread_rows(t, d, 70), wts = random_tensor({t, k}, 71), idx(DType::kI32, {t, k});
  for (int64_t i = 0; i < t * k; ++i) idx.data<int32_t>()[i] = static_cast<int32_t>((i * 3 + i / k) % e);
  for (bool before_w2 : {false, true}) {
    SCOPED_TRACE(before_w2 ? "weight before w2" : "weight after w2");
    HostTensor y(DType::kF32, {t, d}), yq(DType::kF32, {t, d}), plain(DType::kF32, {t, d});
    HostTensor ref(DType::kF32, {t, d});
    MoeParams p{x.view(), wts.view(), idx.view(), &f, &fs, y.view(), limit, before_w2, ActQuant::kMxfp8};
    be->moe(p);
    be->moe_quant({x.view(), wts.view(), idx.view(), &q, &qs, yq.view(), limit, before_w2, ActQuant::kMxfp8});
    p.act_quant = ActQuant::kNone;
    p.out = plain.view();
    be->moe(p);
    for (int64_t tok = 0; tok < t; ++tok) {
      HostTensor xt(DType::kF32, {1, d});
      std::memcpy(xt.data<float>(), x.data<float>() + tok * d, sizeof(float) * d);
      const HostTensor xq = rounded(*be, xt);
      float* out = ref.data<float>() + tok * d;
      std::fill(out, out + d, 0.0f);
      auto add_expert = [&](const ExpertWeights& w, float weight, bool weight_first) {
        HostTensor g(DType::kF32, {1, inter}), u(DType::kF32, {1, inter}), h(DType::kF32, {1, inter});
        be->linear({xq.view(), w.w1, g.view()});
        be->linear({xq.view(), w.w3, u.view()});
        for (int64_t i = 0; i < inter; ++i) {
          const float gi = std::min(g.data<float>()[i], limit), ui = std::clamp(u.data<float>()[i], -limit, limit);
          h.data<float>()[i] = silu_ref(gi) * ui * (weight_first ? weight : 1.0f);
        }
        const HostTensor hq = rounded(*be, h);
        HostTensor v(DType::kF32, {1, d});
        be->linear({hq.view(), w.w2, v.view()});
        for (int64_t o = 0; o < d; ++o) out[o] += weight_first ? v.data<float>()[o] : v.data<float>()[o] * weight;
      };
      std::vector<int64_t> order{0, 1};
      const int32_t* ti = idx.data<int32_t>() + tok * k;
      std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return ti[a] < ti[b]; });
      for (int64_t j : order) add_expert(f[ti[j]], wts.data<float>()[tok * k + j], before_w2);
      add_expert(fs, 1.0f, true);
    }
    EXPECT_TRUE(same_bits(y, ref));
    EXPECT_TRUE(same_bits(yq, ref));
    EXPECT_FALSE(same_bits(y, plain)) << "the rounding changed nothing: the test inputs are too tame";
  }
}

}  // namespace
}  // namespace deepinfer
