// The fused decode ops on CUDA against the unfused kernels they replace, bit for bit (each fused kernel repeats
// the unfused kernels' fp32 arithmetic and reduction order), and against the CPU reference within rms_norm's / rope's
// own tolerance.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "cuda/cuda_decode_test_util.h"
#include "deepinfer/ops/cuda/kernels.h"

namespace deepinfer {
namespace {

using testing::CudaDecodeOpTest;
using testing::DeviceTensor;

HostTensor inv_freq_of(int64_t rd) {
  HostTensor t(DType::kF32, {rd / 2});
  for (int64_t i = 0; i < rd / 2; ++i) t.data<float>()[i] = std::pow(10000.0f, -2.0f * i / rd);
  return t;
}

// D = 4096 / 7168 (512 threads), 1000 / 300 (256), 200 (128); hc = 4 (V4), 1, 8; decode and prefill row counts.
TEST_F(CudaDecodeOpTest, HcCollapseNormMatchesUnfusedBitwise) {
  for (auto [t, hc, d] :
       {std::tuple{1, 4, 4096}, {16, 4, 4096}, {3, 4, 7168}, {37, 4, 1000}, {2, 1, 300}, {5, 8, 200}}) {
    HostTensor streams = rand({t, hc, d}, -3, 3), pre = rand({t, hc}, 0.1f, 2.0f), w = rand({d});
    DeviceTensor ds = up(streams), dp = up(pre), dw = up(w);
    for (bool weighted : {true, false}) {
      const std::string what = "hc_collapse_norm t" + std::to_string(t) + " hc" + std::to_string(hc) + " d" +
                               std::to_string(d) + (weighted ? " weighted" : "");
      const Tensor weight = weighted ? dw.view() : Tensor{};
      DeviceTensor unfused = poisoned({t, d}), fused = poisoned({t, d});
      gpu().hc_collapse({ds, dp, unfused});
      gpu().rms_norm({unfused, weight, unfused, 1e-6f});
      gpu().hc_collapse_norm({ds, dp, weight, fused, 1e-6f});
      const HostTensor got = down(fused);
      expect_same_bytes(what.c_str(), got, down(unfused));
      HostTensor want(DType::kF32, {t, d});
      cpu().hc_collapse_norm({streams, pre, weighted ? w.view() : Tensor{}, want, 1e-6f});
      rel_err((what + " vs cpu").c_str(), got, want, 1e-6);
    }
  }
}

// Both parts as the attention site has them (V4 query heads with and without the head norm, the weighted window
// row), the decode_middle's indexer keys alone (hd 128), parts whose norms reduce over different thread counts in
// one launch (hd 1024 and 128: the narrower part sums over its own 128 threads of a 512-thread block), and parts of
// >= 8192 rows, which take the warp-per-row kernel (both parts of the last case).
TEST_F(CudaDecodeOpTest, NormRopeMatchesUnfusedBitwise) {
  struct Case {
    int64_t t, h0, hd0, hd1, rd;
    bool norm0, two, weight1;
  };
  for (const Case& c : {Case{1, 64, 512, 512, 64, false, true, true}, Case{16, 64, 512, 512, 64, true, true, true},
                        Case{5, 8, 512, 512, 64, true, true, false}, Case{3, 1, 128, 0, 64, true, false, false},
                        Case{4, 3, 1024, 128, 64, true, true, true}, Case{7, 2, 96, 200, 32, false, true, true},
                        // Prefill-sized normed parts (>= 8192 rows): the warp-per-row kernel, the same bits; the
                        // window row part beside them stays on the block-per-row kernel.
                        Case{160, 64, 512, 512, 64, true, true, true}, Case{130, 64, 128, 0, 64, true, false, false},
                        Case{8, 1024, 1024, 128, 64, true, true, true}, Case{40, 256, 256, 256, 64, true, true, false},
                        Case{8192, 1, 512, 512, 64, true, true, true}}) {
    const std::string what = "norm_rope t" + std::to_string(c.t) + " h" + std::to_string(c.h0) + " hd" +
                             std::to_string(c.hd0) + "/" + std::to_string(c.hd1) + (c.norm0 ? " qnorm" : "");
    HostTensor q = rand({c.t, c.h0, c.hd0}, -4, 4), kv = rand({c.t, 1, c.two ? c.hd1 : 1}, -4, 4);
    HostTensor w0 = rand({c.hd0}), w1 = rand({c.two ? c.hd1 : 1});
    HostTensor pos = ints(DType::kI64, {c.t}, 0, 70000), inv = inv_freq_of(c.rd);
    DeviceTensor dpos = up(pos), dinv = up(inv), dw0 = up(w0), dw1 = up(w1);
    // Part 0 is weighted when it is the only part (the indexer keys' norm has a weight).
    const bool weight0 = !c.two && c.norm0;
    DeviceTensor uq = up(q), ukv = up(kv);
    if (c.norm0) {
      const Tensor rows = uq.view().reshape({c.t * c.h0, c.hd0});
      gpu().rms_norm({rows, weight0 ? dw0.view() : Tensor{}, rows, 1e-6f});
    }
    gpu().rope({uq, dpos, dinv, false});
    if (c.two) {
      const Tensor rows = ukv.view().reshape({c.t, c.hd1});
      gpu().rms_norm({rows, c.weight1 ? dw1.view() : Tensor{}, rows, 1e-6f});
      gpu().rope({ukv, dpos, dinv, false});
    }
    DeviceTensor fq = up(q), fkv = up(kv);
    NormRopeParams p;
    p.parts[0] = {fq.view(), weight0 ? dw0.view() : Tensor{}, c.norm0, true};
    if (c.two) p.parts[1] = {fkv.view(), c.weight1 ? dw1.view() : Tensor{}, true, true};
    p.positions = dpos;
    p.inv_freq = dinv;
    p.eps = 1e-6f;
    gpu().norm_rope(p);
    const HostTensor got_q = down(fq), got_kv = down(fkv);
    expect_same_bytes((what + " q").c_str(), got_q, down(uq));
    expect_same_bytes((what + " kv").c_str(), got_kv, down(ukv));
    // Against the CPU composition (rms_norm's and rope's own CUDA tolerance).
    HostTensor cq = clone(q), ckv = clone(kv);
    NormRopeParams cp = p;
    cp.parts[0] = {cq.view(), weight0 ? w0.view() : Tensor{}, c.norm0, true};
    if (c.two) cp.parts[1] = {ckv.view(), c.weight1 ? w1.view() : Tensor{}, true, true};
    cp.positions = pos;
    cp.inv_freq = inv;
    cpu().norm_rope(cp);
    rel_err((what + " q vs cpu").c_str(), got_q, cq, 2e-6);
    rel_err((what + " kv vs cpu").c_str(), got_kv, ckv, 2e-6);
  }
}

// A rope-only part and a norm-only part (no rotation of a latent narrower than the rope slice) in one launch.
TEST_F(CudaDecodeOpTest, NormRopeNormOnlyAndRopeOnlyParts) {
  const int64_t t = 3, h = 4, hd = 256;
  HostTensor q = rand({t, h, hd}, -2, 2), lat = rand({t, 1, 48}, -2, 2), w = rand({48});
  HostTensor pos = ints(DType::kI64, {t}, 0, 5000), inv = inv_freq_of(64);
  DeviceTensor dpos = up(pos), dinv = up(inv), dw = up(w), uq = up(q), ulat = up(lat), fq = up(q), flat = up(lat);
  gpu().rope({uq, dpos, dinv, false});
  gpu().rms_norm({ulat.view().reshape({t, 48}), dw, ulat.view().reshape({t, 48}), 1e-6f});
  NormRopeParams p;
  p.parts[0] = {fq.view(), Tensor{}, false, true};
  p.parts[1] = {flat.view(), dw.view(), true, false};
  p.positions = dpos;
  p.inv_freq = dinv;
  gpu().norm_rope(p);
  expect_same_bytes("norm_rope rope-only part", down(fq), down(uq));
  expect_same_bytes("norm_rope norm-only part", down(flat), down(ulat));
}

// The V4.1 parts with fake-quant, against rms_norm, rope and fake_quant launched one after the other, bit for bit:
// window row (norm + RoPE + FP8) with the query heads (RoPE), indexer queries (RoPE + FP4, 64 heads of 128), the
// compressor's keys (norm + RoPE + FP4) with its latent (RoPE + FP4 block 16), and a fake-quant-only part.
TEST_F(CudaDecodeOpTest, NormRopeFakeQuantMatchesUnfusedBitwise) {
  struct Part {
    int64_t h, hd;
    bool norm, weighted, rope, quant;
    FakeQuantKind kind;
  };
  using K = FakeQuantKind;
  const std::vector<std::pair<Part, Part>> cases = {
      {{1, 512, true, true, true, true, K::kFP8E4M3Ue8m0Block32},
       {64, 512, true, false, true, false, K::kFP8E4M3Ue8m0Block32}},
      {{64, 128, false, false, true, true, K::kFP4Ue8m0Block32},
       {0, 0, false, false, false, false, K::kFP4Ue8m0Block32}},
      {{1, 128, true, true, true, true, K::kFP4Ue8m0Block32}, {1, 512, false, false, true, true, K::kFP4E4m3Block16}},
      {{2, 96, false, false, false, true, K::kFP4E4m3Block16},
       {0, 0, false, false, false, false, K::kFP4Ue8m0Block32}}};
  for (int64_t t : {1, 5}) {
    for (size_t ci = 0; ci < cases.size(); ++ci) {
      const Part parts[2] = {cases[ci].first, cases[ci].second};
      HostTensor pos = ints(DType::kI64, {t}, 0, 70000), inv = inv_freq_of(64);
      DeviceTensor dpos = up(pos), dinv = up(inv);
      NormRopeParams p;
      p.positions = dpos;
      p.inv_freq = dinv;
      HostTensor x[2], w[2];
      DeviceTensor unfused[2], fused[2], dw[2];
      for (int i = 0; i < 2; ++i) {
        const Part& q = parts[i];
        if (q.h == 0) continue;
        x[i] = rand({t, q.h, q.hd}, -6, 6);
        w[i] = rand({q.hd});
        unfused[i] = up(x[i]);
        fused[i] = up(x[i]);
        dw[i] = up(w[i]);
        const Tensor rows = unfused[i].view().reshape({t * q.h, q.hd});
        if (q.norm) gpu().rms_norm({rows, q.weighted ? dw[i].view() : Tensor{}, rows, 1e-6f});
        if (q.rope) gpu().rope({unfused[i], dpos, dinv, false});
        if (q.quant) gpu().fake_quant({rows, q.kind});
        p.parts[i] = {fused[i].view(), q.weighted ? dw[i].view() : Tensor{}, q.norm, q.rope, q.quant, q.kind};
      }
      gpu().norm_rope(p);
      for (int i = 0; i < 2; ++i) {
        if (parts[i].h == 0) continue;
        const std::string what =
            "norm_rope+fake_quant t" + std::to_string(t) + " case " + std::to_string(ci) + " part " + std::to_string(i);
        const HostTensor got = down(fused[i]);
        expect_same_bytes(what.c_str(), got, down(unfused[i]));
        // Against the CPU composition: fake-quant is exact on both sides, so only the norm / rope ulps can move a
        // value across a rounding boundary of the quantizer (then by one quantization step: a loose bound).
        HostTensor want = clone(x[i]);
        NormRopeParams cp;
        cp.parts[0] = {want.view(),    parts[i].weighted ? w[i].view() : Tensor{},
                       parts[i].norm,  parts[i].rope,
                       parts[i].quant, parts[i].kind};
        cp.positions = pos;
        cp.inv_freq = inv;
        cpu().norm_rope(cp);
        rel_err((what + " vs cpu").c_str(), got, want, 5e-2);
      }
    }
  }
}

// hc_mix in one launch (the partial kernel's last block per token tile runs the finish) against the two-launch form,
// bit for bit: V4's hc = 4 site and head, a generic hc = 3 site, decode and prefill token counts (the latter past the
// arrival slots: two launches both ways). Twice in a row, so a counter left non-zero would show in the second call.
TEST_F(CudaDecodeOpTest, HcMixOneLaunchMatchesTwoLaunchesBitwise) {
  const int64_t d = 1024;
  DeviceTensor arrivals = hc_mix_arrivals();
  for (auto [hc, head] : {std::pair{4, false}, {4, true}, {3, false}}) {
    const int64_t rows = head ? hc : (2 + hc) * hc;
    HostTensor fn = rand({rows, hc * d}, -0.05f, 0.05f), base = rand({rows}, -0.5f, 0.5f), scale = rand({3});
    DeviceTensor dfn = up(fn), dbase = up(base), dscale = up(scale);
    for (int64_t t : {1, 3, 16, 100, 512, 600}) {
      HostTensor streams = rand({t, hc, d}, -2, 2);
      DeviceTensor ds = up(streams);
      std::vector<std::array<HostTensor, 3>> out;  // [two launches, one launch, one launch again][pre, post, comb]
      ASSERT_NO_FATAL_FAILURE(hc_mix_forms(3, ds, dfn, dbase, dscale, arrivals, t, hc, d, head, out));
      const std::string what =
          "hc_mix hc" + std::to_string(hc) + (head ? " head" : "") + " t" + std::to_string(t) + " one launch";
      for (int form = 1; form < 3; ++form)
        for (int i = 0; i < (head ? 1 : 3); ++i)
          expect_same_bytes((what + (form == 2 ? " again" : "") +
                             (i == 0   ? " pre"
                              : i == 1 ? " post"
                                       : " comb"))
                                .c_str(),
                            out[form][i], out[0][i]);
      for (int64_t i = 0; i < out[1][0].numel(); ++i) ASSERT_TRUE(std::isfinite(out[1][0].data<float>()[i])) << what;
    }
  }
  expect_arrivals_zero(arrivals);
}

// hc_expand_mix against hc_expand then hc_mix on the device, bit for bit: the one-launch kernel (hc <= 4, D a multiple
// of 512, <= 256 tokens: V4's hc = 4, D = 4096 / 7168 here at 1024 / 1536) and the two-call fallback (D = 1000, hc = 6,
// 300 tokens), with separate outputs and with the mix writing over the expand's post / comb as the bench slice does;
// each call after the first also checks that the one before left the backend's arrival counters at zero (a stuck one
// would skip the finish and leave the poisoned outputs).
TEST_F(CudaDecodeOpTest, HcExpandMixMatchesExpandThenMixBitwise) {
  for (auto [hc, d] : {std::pair{4, 1024}, {4, 1536}, {2, 512}, {4, 1000}, {6, 512}}) {
    const int64_t rows = (2 + hc) * hc;
    HostTensor fn = rand({rows, hc * d}, -0.05f, 0.05f), base = rand({rows}, -0.5f, 0.5f), scale = rand({3});
    DeviceTensor dfn = up(fn), dbase = up(base), dscale = up(scale);
    for (int64_t t : {1, 3, 4, 5, 16, 100, 256, 300}) {
      HostTensor s0 = rand({t, hc, d}, -2, 2), y = rand({t, d}, -2, 2), post0 = rand({t, hc}, 0.1f, 2.0f);
      HostTensor comb0 = rand({t, hc, hc}, 0.0f, 1.0f);
      DeviceTensor dy = up(y);
      for (bool alias : {false, true}) {
        HostTensor out[2][4];  // [unfused, fused][streams, pre, post, comb]
        for (int fused = 0; fused < 2; ++fused) {
          DeviceTensor ds = up(s0), dpost = up(post0), dcomb = up(comb0), pre = poisoned({t, hc});
          DeviceTensor mpost = poisoned({t, hc}), mcomb = poisoned({t, hc, hc});
          const HcExpandParams e{ds, dy, dpost, dcomb};
          const HcMixParams m{
              ds, dfn, dbase, dscale, pre, alias ? dpost.view() : mpost.view(), alias ? dcomb.view() : mcomb.view()};
          if (fused) {
            gpu().hc_expand_mix({e, m});
          } else {
            gpu().hc_expand(e);
            gpu().hc_mix(m);
          }
          out[fused][0] = down(ds);
          out[fused][1] = down(pre);
          out[fused][2] = down(alias ? dpost : mpost);
          out[fused][3] = down(alias ? dcomb : mcomb);
        }
        const std::string what = "hc_expand_mix hc" + std::to_string(hc) + " d" + std::to_string(d) + " t" +
                                 std::to_string(t) + (alias ? " aliased" : "");
        const char* names[4] = {" streams", " pre", " post", " comb"};
        for (int i = 0; i < 4; ++i) expect_same_bytes((what + names[i]).c_str(), out[1][i], out[0][i]);
      }
    }
  }
}

TEST_F(CudaDecodeOpTest, FusedDecodeOpsRejectHostTensors) {
  HostTensor streams = rand({1, 4, 64}), pre = rand({1, 4});
  DeviceTensor ds = up(streams), dout = poisoned({1, 64});
  EXPECT_THROW(gpu().hc_collapse_norm({ds, pre, Tensor{}, dout, 1e-6f}), Error);
  HostTensor q = rand({1, 2, 64}), pos = ints(DType::kI64, {1}, 0, 10), inv = inv_freq_of(16);
  DeviceTensor dpos = up(pos), dinv = up(inv);
  NormRopeParams p;
  p.parts[0] = {q.view(), Tensor{}, true, true};
  p.positions = dpos;
  p.inv_freq = dinv;
  EXPECT_THROW(gpu().norm_rope(p), Error);
}

}  // namespace
}  // namespace deepinfer
