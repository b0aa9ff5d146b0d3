// mHC ops against a naive double-precision implementation of MODELS.md §2.1.
#include <gtest/gtest.h>

#include "op_test_util.h"

namespace deepinfer {
namespace {

double sigmoid(double x) { return 1 / (1 + std::exp(-x)); }

TEST(HcOps, MixCollapseExpandAndHead) {
  auto backend = make_cpu_backend(2);
  const int64_t T = 3, hc = 4, D = 16, mix = (2 + hc) * hc;
  const float eps = 1e-6f, hc_eps = 1e-6f;
  const int iters = 20;
  HostTensor x = testing::random_tensor({T, hc, D}, 1), fn = testing::random_tensor({mix, hc * D}, 2, 0.01f, 0.2f);
  HostTensor base = testing::random_tensor({mix}, 3), scale = testing::random_tensor({3}, 4, 0.5f, 1.5f);
  HostTensor pre(DType::kF32, {T, hc}), post(DType::kF32, {T, hc}), comb(DType::kF32, {T, hc, hc});
  backend->hc_mix(
      {x.view(), fn.view(), base.view(), scale.view(), pre.view(), post.view(), comb.view(), eps, hc_eps, iters});
  std::vector<double> ref_pre(T * hc), ref_post(T * hc), ref_comb(T * hc * hc);
  for (int64_t t = 0; t < T; ++t) {
    const float* f = x.data<float>() + t * hc * D;
    double ss = 0;
    for (int64_t i = 0; i < hc * D; ++i) ss += double(f[i]) * f[i];
    const double inv = 1 / std::sqrt(ss / (hc * D) + eps);
    std::vector<double> m(mix);
    for (int64_t r = 0; r < mix; ++r)
      for (int64_t i = 0; i < hc * D; ++i) m[r] += double(fn.data<float>()[r * hc * D + i]) * f[i] * inv;
    const float* s = scale.data<float>();
    const float* b = base.data<float>();
    double c[4][4];
    for (int k = 0; k < hc; ++k) {
      ref_pre[t * hc + k] = sigmoid(m[k] * s[0] + b[k]) + hc_eps;
      ref_post[t * hc + k] = 2 * sigmoid(m[hc + k] * s[1] + b[hc + k]);
    }
    for (int j = 0; j < hc; ++j) {
      double mx = -1e300, sum = 0;
      for (int k = 0; k < hc; ++k) mx = std::max(mx, c[j][k] = m[2 * hc + j * hc + k] * s[2] + b[2 * hc + j * hc + k]);
      for (int k = 0; k < hc; ++k) sum += (c[j][k] = std::exp(c[j][k] - mx));
      for (int k = 0; k < hc; ++k) c[j][k] = c[j][k] / sum + hc_eps;
    }
    auto cols = [&] {
      for (int k = 0; k < hc; ++k) {
        double sum = 0;
        for (int j = 0; j < hc; ++j) sum += c[j][k];
        for (int j = 0; j < hc; ++j) c[j][k] /= sum + hc_eps;
      }
    };
    cols();
    for (int it = 1; it < iters; ++it) {
      for (int j = 0; j < hc; ++j) {
        double sum = 0;
        for (int k = 0; k < hc; ++k) sum += c[j][k];
        for (int k = 0; k < hc; ++k) c[j][k] /= sum + hc_eps;
      }
      cols();
    }
    for (int j = 0; j < hc; ++j)
      for (int k = 0; k < hc; ++k) ref_comb[(t * hc + j) * hc + k] = c[j][k];
  }
  EXPECT_LT(testing::max_rel_error(pre.data<float>(), ref_pre), 1e-5);
  EXPECT_LT(testing::max_rel_error(post.data<float>(), ref_post), 1e-5);
  EXPECT_LT(testing::max_rel_error(comb.data<float>(), ref_comb), 1e-5);

  // collapse: out = Σ_k pre_k X_k; expand: X'_k = post_k y + Σ_j comb[j][k] X_j.
  HostTensor y(DType::kF32, {T, D});
  backend->hc_collapse({x.view(), pre.view(), y.view()});
  std::vector<double> ref_y(T * D), ref_x(T * hc * D);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < D; ++i)
      for (int64_t k = 0; k < hc; ++k)
        ref_y[t * D + i] += double(pre.data<float>()[t * hc + k]) * x.data<float>()[(t * hc + k) * D + i];
  EXPECT_LT(testing::max_rel_error(y.data<float>(), ref_y), 1e-6);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < hc; ++k)
      for (int64_t i = 0; i < D; ++i) {
        double acc = double(post.data<float>()[t * hc + k]) * y.data<float>()[t * D + i];
        for (int64_t j = 0; j < hc; ++j)
          acc += double(comb.data<float>()[(t * hc + j) * hc + k]) * x.data<float>()[(t * hc + j) * D + i];
        ref_x[(t * hc + k) * D + i] = acc;
      }
  backend->hc_expand({x.view(), y.view(), post.view(), comb.view()});
  EXPECT_LT(testing::max_rel_error(x.data<float>(), ref_x), 1e-6);

  // V4 head: pre = σ(fn·f̂·scale + base) + eps.
  HostTensor hfn = testing::random_tensor({hc, hc * D}, 7, 0.01f, 0.2f), hb = testing::random_tensor({hc}, 8);
  HostTensor hs = testing::random_tensor({1}, 9), hpre(DType::kF32, {T, hc});
  backend->hc_head({x.view(), hfn.view(), hb.view(), hs.view(), hpre.view(), eps, hc_eps});
  std::vector<double> ref_h(T * hc);
  for (int64_t t = 0; t < T; ++t) {
    const float* f = x.data<float>() + t * hc * D;
    double ss = 0;
    for (int64_t i = 0; i < hc * D; ++i) ss += double(f[i]) * f[i];
    const double inv = 1 / std::sqrt(ss / (hc * D) + eps);
    for (int64_t k = 0; k < hc; ++k) {
      double m = 0;
      for (int64_t i = 0; i < hc * D; ++i) m += double(hfn.data<float>()[k * hc * D + i]) * f[i] * inv;
      ref_h[t * hc + k] = sigmoid(m * hs.data<float>()[0] + hb.data<float>()[k]) + hc_eps;
    }
  }
  EXPECT_LT(testing::max_rel_error(hpre.data<float>(), ref_h), 1e-5);
}

}  // namespace
}  // namespace deepinfer
