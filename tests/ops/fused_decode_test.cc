// The fused decode ops (hc_collapse_norm, norm_rope) on the CPU reference: byte-equal to the ops they compose, run
// one after the other, and rejected with a named error on bad params.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>

#include "deepinfer/core/error.h"
#include "forwarding_backend.h"
#include "op_test_util.h"

namespace deepinfer {
namespace {

using testing::copy_of;
using testing::random_tensor;

void expect_same_bytes(const HostTensor& got, const HostTensor& want, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  EXPECT_EQ(std::memcmp(got.view().data(), want.view().data(), want.view().nbytes()), 0) << what;
}

HostTensor inv_freq_of(int64_t rd) {
  HostTensor t(DType::kF32, {rd / 2});
  for (int64_t i = 0; i < rd / 2; ++i) t.data<float>()[i] = std::pow(10000.0f, -2.0f * i / rd);
  return t;
}

// The message of the Error `f` throws ("" when it throws none).
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(FusedDecodeOps, HcCollapseNormEqualsCollapseThenNorm) {
  auto be = make_cpu_backend(2);
  for (auto [t, hc, d] : {std::tuple{1, 4, 96}, {5, 4, 257}, {3, 1, 64}, {2, 8, 33}}) {
    HostTensor streams = random_tensor({t, hc, d}, 11, 0.05f, 3.0f), pre = random_tensor({t, hc}, 12);
    HostTensor w = random_tensor({d}, 13);
    for (bool weighted : {true, false}) {
      const Tensor weight = weighted ? w.view() : Tensor{};
      HostTensor want(DType::kF32, {t, d}), got(DType::kF32, {t, d});
      be->hc_collapse({streams.view(), pre.view(), want.view()});
      be->rms_norm({want.view(), weight, want.view(), 1e-6f});
      be->hc_collapse_norm({streams.view(), pre.view(), weight, got.view(), 1e-6f});
      expect_same_bytes(got, want, "t " + std::to_string(t) + " hc " + std::to_string(hc) + " d " + std::to_string(d));
      for (int64_t i = 0; i < got.numel(); ++i) ASSERT_TRUE(std::isfinite(got.data<float>()[i]));
    }
  }
}

TEST(FusedDecodeOps, NormRopeEqualsNormThenRopePerPart) {
  auto be = make_cpu_backend(2);
  const int64_t t = 4, h = 3, hd = 48, rd = 16;
  HostTensor inv = inv_freq_of(rd), pos = testing::positions_tensor({0, 5, 4095, 70000});
  HostTensor q0 = random_tensor({t, h, hd}, 21, 0.05f, 4.0f), kv0 = random_tensor({t, 1, hd}, 22, 0.05f, 4.0f);
  HostTensor w = random_tensor({hd}, 23);
  // (q norm, q rope, kv weighted, second part present)
  for (auto [qn, qr, kw, two] : {std::tuple{false, true, true, true},
                                 {true, true, true, true},
                                 {true, false, false, true},
                                 {true, true, false, false},
                                 {false, true, false, false}}) {
    HostTensor wq = copy_of(q0), wkv = copy_of(kv0);
    if (qn) be->rms_norm({wq.view().reshape({t * h, hd}), Tensor{}, wq.view().reshape({t * h, hd}), 1e-6f});
    if (qr) be->rope({wq.view(), pos.view(), inv.view(), false});
    if (two) {
      be->rms_norm({wkv.view().reshape({t, hd}), kw ? w.view() : Tensor{}, wkv.view().reshape({t, hd}), 1e-6f});
      be->rope({wkv.view(), pos.view(), inv.view(), false});
    }
    HostTensor gq = copy_of(q0), gkv = copy_of(kv0);
    NormRopeParams p;
    p.parts[0] = {gq.view(), Tensor{}, qn, qr};
    if (two) p.parts[1] = {gkv.view(), kw ? w.view() : Tensor{}, true, true};
    p.positions = pos.view();
    p.inv_freq = inv.view();
    p.eps = 1e-6f;
    be->norm_rope(p);
    const std::string what = std::string("q norm ") + (qn ? "1" : "0") + " rope " + (qr ? "1" : "0");
    expect_same_bytes(gq, wq, what + ": q");
    expect_same_bytes(gkv, wkv, what + ": kv");  // untouched when absent
  }
}

// The V4.1 parts with their fake-quant: the window row (norm, RoPE, FP8), the indexer queries (RoPE, FP4) and the
// compressor's keys and latent (norm + RoPE + FP4 / RoPE + FP4 block-16), each against rms_norm, rope, fake_quant in
// turn; a row that is not a whole number of blocks passes through the quantization as in fake_quant.
TEST(FusedDecodeOps, NormRopeFakeQuantEqualsTheThreeOps) {
  auto be = make_cpu_backend(2);
  const int64_t t = 3, rd = 16;
  HostTensor inv = inv_freq_of(rd), pos = testing::positions_tensor({2, 77, 4096});
  struct Case {
    int64_t h, hd;
    bool norm, weighted, rope;
    FakeQuantKind kind;
  };
  for (const Case& c : {Case{1, 64, true, true, true, FakeQuantKind::kFP8E4M3Ue8m0Block32},
                        Case{4, 32, false, false, true, FakeQuantKind::kFP4Ue8m0Block32},
                        Case{1, 48, true, true, true, FakeQuantKind::kFP4E4m3Block16},
                        Case{2, 48, false, false, false, FakeQuantKind::kFP4Ue8m0Block32},  // 48 % 32: unchanged
                        Case{1, 64, false, false, false, FakeQuantKind::kFP4E4m3Block16}}) {
    HostTensor x0 = random_tensor({t, c.h, c.hd}, 61, 0.01f, 5.0f), w = random_tensor({c.hd}, 62);
    HostTensor want = copy_of(x0), got = copy_of(x0);
    const Tensor rows = want.view().reshape({t * c.h, c.hd});
    if (c.norm) be->rms_norm({rows, c.weighted ? w.view() : Tensor{}, rows, 1e-6f});
    if (c.rope) be->rope({want.view(), pos.view(), inv.view(), false});
    be->fake_quant({rows, c.kind});
    NormRopeParams p;
    p.parts[0] = {got.view(), c.weighted ? w.view() : Tensor{}, c.norm, c.rope, true, c.kind};
    p.positions = pos.view();
    p.inv_freq = inv.view();
    be->norm_rope(p);
    const std::string what = "h " + std::to_string(c.h) + " hd " + std::to_string(c.hd) + " kind " +
                             std::to_string(static_cast<int>(c.kind));
    expect_same_bytes(got, want, what);
    if (c.hd % 32 != 0 && c.kind != FakeQuantKind::kFP4E4m3Block16)
      expect_same_bytes(got, x0, what + " unchanged");
    else
      EXPECT_NE(std::memcmp(got.view().data(), x0.view().data(), x0.view().nbytes()), 0) << what;
  }
}

// hc_expand_mix == hc_expand then hc_mix, with separate outputs and with the mix writing over the expand's post /
// comb (as the bench slice's single set of coefficient buffers does).
TEST(FusedDecodeOps, HcExpandMixEqualsExpandThenMix) {
  auto be = make_cpu_backend(2);
  const int64_t t = 3, hc = 4, d = 40, rows = (2 + hc) * hc;
  HostTensor s0 = random_tensor({t, hc, d}, 71), y = random_tensor({t, d}, 72), post0 = random_tensor({t, hc}, 73);
  HostTensor comb0 = random_tensor({t, hc, hc}, 74), fn = random_tensor({rows, hc * d}, 75, 0.01f, 0.1f);
  HostTensor base = random_tensor({rows}, 76), scale = random_tensor({3}, 77);
  for (bool alias : {false, true}) {
    HostTensor ws = copy_of(s0), wpost = copy_of(post0), wcomb = copy_of(comb0), wpre(DType::kF32, {t, hc});
    HostTensor wmpost(DType::kF32, {t, hc}), wmcomb(DType::kF32, {t, hc, hc});
    be->hc_expand({ws.view(), y.view(), wpost.view(), wcomb.view()});
    be->hc_mix({ws.view(), fn.view(), base.view(), scale.view(), wpre.view(), alias ? wpost.view() : wmpost.view(),
                alias ? wcomb.view() : wmcomb.view()});
    HostTensor gs = copy_of(s0), gpost = copy_of(post0), gcomb = copy_of(comb0), gpre(DType::kF32, {t, hc});
    HostTensor gmpost(DType::kF32, {t, hc}), gmcomb(DType::kF32, {t, hc, hc});
    be->hc_expand_mix({{gs.view(), y.view(), gpost.view(), gcomb.view()},
                       {gs.view(), fn.view(), base.view(), scale.view(), gpre.view(),
                        alias ? gpost.view() : gmpost.view(), alias ? gcomb.view() : gmcomb.view()}});
    const std::string what = alias ? "aliased" : "separate";
    expect_same_bytes(gs, ws, what + " streams");
    expect_same_bytes(gpre, wpre, what + " pre");
    expect_same_bytes(alias ? gpost : gmpost, alias ? wpost : wmpost, what + " post");
    expect_same_bytes(alias ? gcomb : gmcomb, alias ? wcomb : wmcomb, what + " comb");
  }
  // The mix must read the expanded streams, and its outputs must not land in them.
  HostTensor other = copy_of(s0), pre(DType::kF32, {t, hc}), mpost(DType::kF32, {t, hc});
  HostTensor mcomb(DType::kF32, {t, hc, hc}), st = copy_of(s0);
  const std::string e1 = error_of([&] {
    be->hc_expand_mix({{st.view(), y.view(), post0.view(), comb0.view()},
                       {other.view(), fn.view(), base.view(), scale.view(), pre.view(), mpost.view(), mcomb.view()}});
  });
  EXPECT_NE(e1.find("'mix.streams' must be 'expand.streams'"), std::string::npos) << e1;
  const Tensor inside = st.view().reshape({t * hc * d}).slice(0, t * hc).reshape({t, hc});
  const std::string e2 = error_of([&] {
    be->hc_expand_mix({{st.view(), y.view(), post0.view(), comb0.view()},
                       {st.view(), fn.view(), base.view(), scale.view(), inside, mpost.view(), mcomb.view()}});
  });
  EXPECT_NE(e2.find("must not overlap"), std::string::npos) << e2;
  HostTensor bad_y = random_tensor({t, d + 1}, 78);
  const std::string e3 = error_of([&] {
    be->hc_expand_mix({{st.view(), bad_y.view(), post0.view(), comb0.view()},
                       {st.view(), fn.view(), base.view(), scale.view(), pre.view(), mpost.view(), mcomb.view()}});
  });
  EXPECT_NE(e3.find("hc_expand: 'x'"), std::string::npos) << e3;
}

// A test backend forwards the fused ops to its inner backend (whose composition they are).
TEST(FusedDecodeOps, ForwardingBackendForwardsFusedOps) {
  testing::ForwardingBackend fwd(make_cpu_backend(1));
  auto be = make_cpu_backend(1);
  HostTensor streams = random_tensor({2, 4, 40}, 31), pre = random_tensor({2, 4}, 32);
  HostTensor a(DType::kF32, {2, 40}), b(DType::kF32, {2, 40});
  fwd.hc_collapse_norm({streams.view(), pre.view(), Tensor{}, a.view(), 1e-6f});
  be->hc_collapse_norm({streams.view(), pre.view(), Tensor{}, b.view(), 1e-6f});
  expect_same_bytes(a, b, "forwarded hc_collapse_norm");
}

TEST(FusedDecodeOps, HcCollapseNormRejectsBadParams) {
  auto be = make_cpu_backend(1);
  HostTensor streams = random_tensor({2, 4, 16}, 41), pre = random_tensor({2, 4}, 42), out(DType::kF32, {2, 16});
  HostTensor w = random_tensor({16}, 43), bad_w = random_tensor({15}, 44), bad_pre = random_tensor({2, 3}, 45);
  HostTensor bad_out(DType::kF32, {2, 17});
  auto run = [&](const Tensor& s, const Tensor& p, const Tensor& wt, const Tensor& o, float eps) {
    return error_of([&] { be->hc_collapse_norm({s, p, wt, o, eps}); });
  };
  EXPECT_EQ(run(streams.view(), pre.view(), w.view(), out.view(), 1e-6f), "");
  EXPECT_NE(run(streams.view(), bad_pre.view(), w.view(), out.view(), 1e-6f).find("'pre'"), std::string::npos);
  EXPECT_NE(run(streams.view(), pre.view(), bad_w.view(), out.view(), 1e-6f).find("'weight'"), std::string::npos);
  EXPECT_NE(run(streams.view(), pre.view(), w.view(), bad_out.view(), 1e-6f).find("'out'"), std::string::npos);
  EXPECT_NE(run(streams.view(), pre.view(), w.view(), out.view(), 0.0f).find("eps"), std::string::npos);
  EXPECT_NE(run(Tensor{}, pre.view(), w.view(), out.view(), 1e-6f).find("'streams' is required"), std::string::npos);
  // out inside the streams it reads: rejected, not silently computed from half-written rows.
  const Tensor alias = streams.view().reshape({8, 16}).slice(0, 2);
  EXPECT_NE(run(streams.view(), pre.view(), w.view(), alias, 1e-6f).find("must not overlap"), std::string::npos);
}

TEST(FusedDecodeOps, NormRopeRejectsBadParams) {
  auto be = make_cpu_backend(1);
  const int64_t t = 2, hd = 16;
  HostTensor q = random_tensor({t, 2, hd}, 51), kv = random_tensor({t, 1, hd}, 52), w = random_tensor({hd}, 53);
  HostTensor inv = inv_freq_of(8), big_inv = inv_freq_of(2 * hd + 2), pos = testing::positions_tensor({3, 9});
  HostTensor pos3 = testing::positions_tensor({1, 2, 3}), bad_w = random_tensor({hd + 1}, 54);
  auto base = [&] {
    NormRopeParams p;
    p.parts[0] = {q.view(), Tensor{}, true, true};
    p.parts[1] = {kv.view(), w.view(), true, true};
    p.positions = pos.view();
    p.inv_freq = inv.view();
    return p;
  };
  auto err = [&](const NormRopeParams& p) { return error_of([&] { be->norm_rope(p); }); };
  EXPECT_EQ(err(base()), "");
  NormRopeParams p = base();
  p.parts[0].x = Tensor{};
  EXPECT_NE(err(p).find("'parts[0].x' is required"), std::string::npos);
  p = base();
  p.positions = pos3.view();
  EXPECT_NE(err(p).find("parts[0].x"), std::string::npos);
  p = base();
  p.inv_freq = big_inv.view();
  EXPECT_NE(err(p).find("rope dim"), std::string::npos);
  p = base();
  p.parts[1].norm = false;
  EXPECT_NE(err(p).find("norm = false"), std::string::npos);
  p = base();
  p.parts[0].norm = p.parts[0].rope = false;
  EXPECT_NE(err(p).find("neither"), std::string::npos);
  p = base();
  p.parts[1].weight = bad_w.view();
  EXPECT_NE(err(p).find("'parts[1].weight'"), std::string::npos);
  p = base();
  p.parts[1] = {Tensor{}, w.view(), true, true};
  EXPECT_NE(err(p).find("without"), std::string::npos);
  p = base();
  p.parts[1] = {q.view(), Tensor{}, true, true};  // the same tensor twice
  EXPECT_NE(err(p).find("must not overlap"), std::string::npos);
  p = base();
  p.eps = -1.0f;
  EXPECT_NE(err(p).find("eps"), std::string::npos);
  // A part that only normalises may be narrower than the rotated slice.
  p = base();
  HostTensor narrow = random_tensor({t, 1, 4}, 55);
  p.parts[1] = {narrow.view(), Tensor{}, true, false};
  EXPECT_EQ(err(p), "");
}

}  // namespace
}  // namespace deepinfer
