// The prefill-sized mHC kernels (hc_cuda.cu): the staged hc_mix partial kernel (cp.async ring, 4 warps, rows reduced
// together, two tokens a warp; a warp per token for the head) and the float4 hc_expand, each against the kernel it
// replaced, which still runs where the fast path's conditions fail — the same data 4 bytes off a 16-byte boundary
// takes it — byte for byte (the raw split-K partials as well as pre / post / comb, since decode, prefill and
// batch-invariant mode rely on the same bits for the same token), at V4-Flash / V4.1-Flash prefill sizes, on shapes
// past the fast paths' conditions (a padded last split, hc > 4), and against the CPU op; hc_collapse_norm's kPer = 8
// register kernel against hc_collapse then rms_norm.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "cuda/cuda_test_util.h"
#include "deepinfer/ops/cuda/kernels.h"

namespace deepinfer {
namespace {

using testing::CudaOpTest;
using testing::DeviceTensor;

struct MixCase {
  int64_t hc, d;
  bool head;
  std::vector<int64_t> tokens;
};

// The two-launch hc_mix (no arrival counters: the prefill path) with the staged partial kernel (16-byte-aligned
// streams) and with the unstaged one (the same streams one float further: not 16-byte aligned). Partials and outputs
// are NaN-poisoned before each run, so an unwritten value shows.
TEST_F(CudaOpTest, HcMixStagedPartialsMatchPreviousKernelBitwise) {
  const std::vector<MixCase> cases = {
      {4, 4096, false, {3000, 9000}},             // V4-Flash site
      {4, 4096, true, {3000}},                    // V4-Flash head
      {4, 5120, false, {3000, 9000}},             // V4.1-Flash site
      {4, 5120, true, {9000}},                    // V4.1-Flash head
      {4, 4096, false, {1, 7, 9, 97, 100, 513}},  // 97: 12 ranges of 9, the last one empty
      {3, 1000, false, {1, 7, 100, 2500}},        // hc·D = 3000: the last split is 440 columns + zero padding
      {3, 1000, true, {33}},
      {2, 6, false, {5, 40}},  // one split of 12 columns
      {6, 512, false, {100}},  // 48 rows: past the staged kernel (the unstaged kernel both ways)
  };
  for (const MixCase& mc : cases) {
    const int64_t hc = mc.hc, d = mc.d, rows = mc.head ? hc : (2 + hc) * hc;
    HostTensor fn = rand({rows, hc * d}, -0.05f, 0.05f), base = rand({rows}, -0.5f, 0.5f), scale = rand({3});
    DeviceTensor dfn = up(fn), dbase = up(base), dscale = up(scale);
    for (int64_t t : mc.tokens) {
      HostTensor streams = rand({t * hc * d + 1}, -2, 2);
      HostTensor aligned(DType::kF32, {t * hc * d});  // the same values from the buffer's start
      std::memcpy(aligned.data<float>(), streams.data<float>() + 1, sizeof(float) * t * hc * d);
      DeviceTensor ds_off = up(streams), ds = up(aligned);
      const int splits = cuda::hc_mix_splits(hc, d);
      HostTensor out[2][4];  // [unstaged (unaligned streams), staged][partial, pre, post, comb]
      for (int staged = 0; staged < 2; ++staged) {
        DeviceTensor partial = poisoned({splits * t * (rows + 1)});
        DeviceTensor pre = poisoned({t, hc}), post = poisoned({t, hc}), comb = poisoned({t, hc, hc});
        cuda::HcMixKernelParams k;
        k.streams = staged ? static_cast<const float*>(ds.data()) : static_cast<const float*>(ds_off.data()) + 1;
        k.fn = static_cast<const float*>(dfn.data());
        k.base = static_cast<const float*>(dbase.data());
        k.scale = static_cast<const float*>(dscale.data());
        k.pre = static_cast<float*>(pre.data());
        k.post = mc.head ? nullptr : static_cast<float*>(post.data());
        k.comb = mc.head ? nullptr : static_cast<float*>(comb.data());
        k.tokens = t;
        k.hc = hc;
        k.d = d;
        k.head = mc.head;
        k.partial = static_cast<float*>(partial.data());
        k.splits = splits;
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // the poisoning uploads have landed
        cuda::run_hc_mix(k, nullptr);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        out[staged][0] = down(partial);
        out[staged][1] = down(pre);
        if (!mc.head) {
          out[staged][2] = down(post);
          out[staged][3] = down(comb);
        }
      }
      const std::string what = "hc_mix staged hc" + std::to_string(hc) + " d" + std::to_string(d) +
                               (mc.head ? " head" : "") + " t" + std::to_string(t);
      const char* names[4] = {" partials", " pre", " post", " comb"};
      for (int i = 0; i < (mc.head ? 2 : 4); ++i) expect_same_bytes((what + names[i]).c_str(), out[1][i], out[0][i]);
      // Every partial written (a NaN would also compare equal byte for byte if both kernels left it).
      for (int form = 0; form < 2; ++form) {
        int64_t nan = 0;
        for (int64_t i = 0; i < out[form][0].numel(); ++i) nan += std::isnan(out[form][0].data<float>()[i]);
        EXPECT_EQ(nan, 0) << what << ": unwritten partials (" << (form ? "staged" : "unstaged") << ")";
      }
    }
  }
}

// The backend's hc_mix / hc_head past the one-launch sizes (the staged kernel) against the CPU op, at the
// tolerance of HcMixRealSizeSplitK.
TEST_F(CudaOpTest, HcMixHeadPrefillMatchCpu) { expect_hc_mix_and_head_match_cpu(3000, 4096, 0.01f, " T=3000"); }

// hc_expand with float4 loads against the scalar kernel (the same x one float off a 16-byte boundary), byte for byte
// (in place: the streams after the call), and against the CPU op exactly (the same operations with rounding after
// each). d % 4 != 0 and unaligned x take the scalar kernel both ways.
TEST_F(CudaOpTest, HcExpandVecMatchesScalarBitwise) {
  for (auto [hc, d, t, offset] : {std::tuple<int64_t, int64_t, int64_t, int64_t>{4, 4096, 3000, 0},
                                  {4, 5120, 9000, 0},
                                  {4, 4096, 1, 0},
                                  {3, 1000, 77, 0},
                                  {8, 256, 100, 0},
                                  {1, 12, 5, 0},
                                  {4, 6, 5, 0},
                                  {4, 1024, 33, 1}}) {
    const Shape y_shape = offset ? Shape{t * d + offset} : Shape{t, d};
    HostTensor s0 = rand({t, hc, d}, -2, 2), y = rand(y_shape, -2, 2), post = rand({t, hc}, 0.1f, 2.0f);
    HostTensor comb = rand({t, hc, hc}, 0.0f, 1.0f);
    HostTensor y_off(DType::kF32, {t * d + 1});  // y's values one float after the buffer's start
    std::memcpy(y_off.data<float>() + 1, y.data<float>() + offset, sizeof(float) * t * d);
    y_off.data<float>()[0] = 0.0f;
    DeviceTensor dy = up(y), dy_off = up(y_off), dpost = up(post), dcomb = up(comb);
    HostTensor out[2];
    for (int vec = 0; vec < 2; ++vec) {
      DeviceTensor ds = up(s0);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      cuda::HcExpandKernelParams k;
      k.streams = static_cast<float*>(ds.data());
      k.x = vec ? static_cast<const float*>(dy.data()) + offset : static_cast<const float*>(dy_off.data()) + 1;
      k.post = static_cast<const float*>(dpost.data());
      k.comb = static_cast<const float*>(dcomb.data());
      k.tokens = t;
      k.hc = hc;
      k.d = d;
      cuda::run_hc_expand(k, nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      out[vec] = down(ds);
    }
    const std::string what = "hc_expand vec hc" + std::to_string(hc) + " d" + std::to_string(d) + " t" +
                             std::to_string(t) + (offset ? " unaligned" : "");
    expect_same_bytes(what.c_str(), out[1], out[0]);
    if (t <= 100 && offset == 0) {  // the CPU op (single-threaded reference: small shapes only)
      HostTensor want(DType::kF32, s0.shape());
      std::memcpy(want.view().data(), s0.view().data(), s0.view().nbytes());
      cpu().hc_expand({want, y, post, comb});
      rel_err((what + " vs cpu").c_str(), out[1], want, 1e-6);
    }
  }
}

// hc_collapse_norm's row-in-registers kernel with 8 values a thread where they cover the row (D <= 4096 at 512
// threads, and the smaller D's thread counts; D = 5120 takes 16) against hc_collapse then rms_norm, byte for byte,
// with and without the norm weight.
TEST_F(CudaOpTest, HcCollapseNormKper8MatchesUnfusedBitwise) {
  const int64_t hc = 4;
  for (auto [d, t] :
       {std::pair<int64_t, int64_t>{4096, 3000}, {4096, 1}, {2048, 33}, {1000, 77}, {300, 9}, {200, 5}, {5120, 20}}) {
    HostTensor streams = rand({t, hc, d}, -2, 2), pre = rand({t, hc}, 0.1f, 1.5f), weight = rand({d}, 0.5f, 1.5f);
    DeviceTensor ds = up(streams), dpre = up(pre), dw = up(weight);
    for (bool with_weight : {true, false}) {
      const Tensor wt = with_weight ? dw.view() : Tensor{};
      DeviceTensor fused = poisoned({t, d}), unfused = poisoned({t, d});
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      gpu().hc_collapse_norm({ds, dpre, wt, fused, 1e-6f});
      gpu().hc_collapse({ds, dpre, unfused});
      gpu().rms_norm({unfused, wt, unfused, 1e-6f});
      const HostTensor out[2] = {down(unfused), down(fused)};
      const std::string what =
          "hc_collapse_norm kPer 8 d" + std::to_string(d) + " t" + std::to_string(t) + (with_weight ? " weight" : "");
      expect_same_bytes(what.c_str(), out[1], out[0]);
      int64_t nan = 0;
      for (int64_t i = 0; i < out[1].numel(); ++i) nan += std::isnan(out[1].data<float>()[i]);
      EXPECT_EQ(nan, 0) << what << ": unwritten outputs";
    }
  }
}

}  // namespace
}  // namespace deepinfer
