// Router, clamped-SwiGLU MoE and Engram ops against naive references.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "op_test_util.h"

namespace deepinfer {
namespace {

double silu(double x) { return x / (1 + std::exp(-x)); }

TEST(RouterOp, SqrtSoftplusBiasedSelectionAndHashRouting) {
  auto backend = make_cpu_backend(1);
  const int64_t T = 5, D = 24, E = 8, k = 3;
  HostTensor x = testing::random_tensor({T, D}, 1), w = testing::random_tensor({E, D}, 2),
             b = testing::random_tensor({E}, 3, 0.01f, 0.3f);
  HostTensor weights(DType::kF32, {T, k}), idx(DType::kI32, {T, k});
  RouterParams p;
  p.x = x.view();
  p.weight = w.view();
  p.bias = b.view();
  p.weights = weights.view();
  p.indices = idx.view();
  p.gate_temp = 1.3f;
  p.route_scale = 1.5f;
  backend->router(p);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> s(E), biased(E);
    for (int64_t e = 0; e < E; ++e) {
      double l = 0;
      for (int64_t i = 0; i < D; ++i) l += double(x.data<float>()[t * D + i]) * w.data<float>()[e * D + i];
      s[e] = std::sqrt(std::log1p(std::exp(l / 1.3)));
      biased[e] = s[e] + b.data<float>()[e];
    }
    std::vector<int64_t> order(E);
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int64_t a, int64_t c) { return biased[a] > biased[c]; });
    double sum = 0;
    for (int64_t j = 0; j < k; ++j) sum += s[order[j]];
    for (int64_t j = 0; j < k; ++j) {
      EXPECT_EQ(idx.data<int32_t>()[t * k + j], order[j]);
      EXPECT_NEAR(weights.data<float>()[t * k + j], s[order[j]] / sum * 1.5, 1e-5);
    }
  }
  // Hash routing: experts from the table, weights from the unbiased scores.
  HostTensor table(DType::kI64, {10, k}), tok = testing::positions_tensor({4, 0, 9, 4, 2});
  for (int64_t i = 0; i < table.numel(); ++i) table.data<int64_t>()[i] = (i * 5) % E;
  p.bias = Tensor{};
  p.hash_table = table.view();
  p.token_ids = tok.view();
  backend->router(p);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j)
      EXPECT_EQ(idx.data<int32_t>()[t * k + j], table.data<int64_t>()[tok.data<int64_t>()[t] * k + j]);
}

TEST(MoeOp, ClampedSwigluWeightBeforeAndAfterW2) {
  auto backend = make_cpu_backend(2);
  const int64_t T = 4, D = 16, I = 8, E = 3, k = 2;
  std::vector<HostTensor> storage;
  std::vector<ExpertWeights> experts;
  for (int64_t e = 0; e <= E; ++e) {                                        // the last one is the shared expert
    storage.push_back(testing::random_tensor({I, D}, 10 + e, 0.5f, 3.0f));  // large enough to hit the clamps
    storage.push_back(testing::random_tensor({I, D}, 20 + e, 0.5f, 3.0f));
    storage.push_back(testing::random_tensor({D, I}, 30 + e));
  }
  for (int64_t e = 0; e <= E; ++e)
    experts.push_back({storage[3 * e].view(), storage[3 * e + 1].view(), storage[3 * e + 2].view()});
  ExpertWeights shared = experts.back();
  experts.pop_back();
  HostTensor x = testing::random_tensor({T, D}, 1), w = testing::random_tensor({T, k}, 2, 0.1f, 1.f);
  HostTensor idx(DType::kI32, {T, k}), out(DType::kF32, {T, D});
  for (int64_t i = 0; i < T * k; ++i) idx.data<int32_t>()[i] = static_cast<int32_t>((i * 2 + i / k) % E);
  const float limit = 4.0f;
  for (bool before : {false, true}) {
    MoeParams p;
    p.x = x.view();
    p.weights = w.view();
    p.indices = idx.view();
    p.experts = &experts;
    p.shared = &shared;
    p.out = out.view();
    p.swiglu_limit = limit;
    p.weight_before_w2 = before;
    backend->moe(p);
    std::vector<double> ref(T * D);
    auto expert = [&](const ExpertWeights& e, int64_t t, double weight) {
      std::vector<double> h(I);
      for (int64_t i = 0; i < I; ++i) {
        double g = 0, u = 0;
        for (int64_t d = 0; d < D; ++d) {
          g += double(e.w1.data_as<float>()[i * D + d]) * x.data<float>()[t * D + d];
          u += double(e.w3.data_as<float>()[i * D + d]) * x.data<float>()[t * D + d];
        }
        h[i] = silu(std::min(g, double(limit))) * std::clamp(u, -double(limit), double(limit));
      }
      for (int64_t d = 0; d < D; ++d) {
        double acc = 0;
        for (int64_t i = 0; i < I; ++i) acc += double(e.w2.data_as<float>()[d * I + i]) * h[i];
        ref[t * D + d] += acc * weight;  // linear in the weight: before/after w2 agree mathematically
      }
    };
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t j = 0; j < k; ++j) expert(experts[idx.data<int32_t>()[t * k + j]], t, w.data<float>()[t * k + j]);
      expert(shared, t, 1.0);
    }
    EXPECT_LT(testing::max_rel_error(out.data<float>(), ref), 1e-5) << "before_w2 " << before;
  }
}

TEST(EngramOps, HashMatchesRollingXorAndGateMatchesFormula) {
  auto backend = make_cpu_backend(1);
  const int64_t T = 4, n = 4, heads = 2;
  HostTensor tokens(DType::kI64, {T, n}), mult(DType::kI64, {n}), primes(DType::kI64, {n - 1, heads});
  HostTensor offsets(DType::kI64, {(n - 1) * heads}), out(DType::kI64, {T, (n - 1) * heads});
  const int64_t m[4] = {36028797018963971LL, 1234567891011LL, 987654321987LL, 55555555555555LL};
  const int64_t pr[6] = {67, 71, 73, 79, 83, 89};
  for (int64_t i = 0; i < n; ++i) mult.data<int64_t>()[i] = m[i];
  for (int64_t i = 0; i < 6; ++i) {
    primes.data<int64_t>()[i] = pr[i];
    offsets.data<int64_t>()[i] = 1000 * i;
  }
  for (int64_t i = 0; i < T * n; ++i) tokens.data<int64_t>()[i] = (i * 37) % 255;
  backend->engram_hash({tokens.view(), mult.view(), primes.view(), offsets.view(), out.view()});
  for (int64_t t = 0; t < T; ++t) {
    uint64_t h = uint64_t(tokens.data<int64_t>()[t * n]) * uint64_t(m[0]);
    for (int64_t s = 1; s < n; ++s) {
      h ^= uint64_t(tokens.data<int64_t>()[t * n + s]) * uint64_t(m[s]);
      for (int64_t hh = 0; hh < heads; ++hh)
        EXPECT_EQ(out.data<int64_t>()[t * 6 + (s - 1) * heads + hh],
                  int64_t(h % pr[(s - 1) * heads + hh]) + 1000 * ((s - 1) * heads + hh));
    }
  }
  const int64_t hc = 4, D = 32;
  HostTensor streams = testing::random_tensor({T, hc, D}, 1), key = testing::random_tensor({T, hc, D}, 2);
  HostTensor value = testing::random_tensor({T, D}, 3), weight = testing::random_tensor({hc, D}, 4);
  HostTensor orig = testing::copy_of(streams);
  backend->engram_gate({streams.view(), key.view(), value.view(), weight.view(), 1e-6f});
  std::vector<double> ref(T * hc * D);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < hc; ++k) {
      const float* xs = orig.data<float>() + (t * hc + k) * D;
      const float* ks = key.data<float>() + (t * hc + k) * D;
      double dot = 0, xx = 0, kk = 0;
      for (int64_t i = 0; i < D; ++i) {
        dot += double(xs[i]) * weight.data<float>()[k * D + i] * ks[i];
        xx += double(xs[i]) * xs[i];
        kk += double(ks[i]) * ks[i];
      }
      dot = dot / std::sqrt(xx / D + 1e-6) / std::sqrt(kk / D + 1e-6) / std::sqrt(double(D));
      const double g = 1 / (1 + std::exp(-std::copysign(std::sqrt(std::max(std::fabs(dot), 1e-6)), dot)));
      for (int64_t i = 0; i < D; ++i) ref[(t * hc + k) * D + i] = xs[i] + g * value.data<float>()[t * D + i];
    }
  EXPECT_LT(testing::max_rel_error(streams.data<float>(), ref), 1e-6);
}

}  // namespace
}  // namespace deepinfer
