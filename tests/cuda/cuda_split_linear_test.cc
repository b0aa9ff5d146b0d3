// linear_quant with split_in on CUDA (a bf16 weight, f32 activations as two bf16 terms on the tensor cores: the V4
// compressor projections of a prefill) against the CPU reference, which computes the exact f32 product.
//
// Tolerance, per output y_ij against a double-precision reference with mag_ij = Σ_k |x_ik·w_jk|: the split leaves
// |x − hi − lo| <= 2^-16·|x| per element (tests/ops/linear_test.cc checks it on the host), so the two GEMMs' exact
// sum is within 2^-16·mag; the tensor cores' fp32 accumulation adds its summation error, whose rigorous bound
// K·2^-24·mag (2.4e-4 at K = 4096) would not tell the split from a single bf16 term. In practice it is the rounding
// (or truncation, in the tensor cores' adders) of ~K/16 partial sums of the size of a random walk's, well under
// 2^-20·mag; the test allows 2^-18·mag for it: |y − ref| <= (2^-16 + 2^-18)·mag. The one-term path (split_in off:
// the input rounded to bf16, 2^-8 per element) is checked to miss that bound on the same data, so the test tells
// the two apart. The CPU op (the exact fp32 product) is checked against the same reference within 2^-20·mag, and
// norm-wise the GPU is within 5e-5 of the CPU (the split's ~2^-17/√3 relative error where products cancel, plus the
// accumulation's; the one term's is ~1e-3).
// Batch-invariant mode keeps the exact fp32 chain: the same bytes as linear() over the widened weight.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "cuda/cuda_test_util.h"
#include "deepinfer/core/dtype.h"
#include "deepinfer/ops/cuda/kernels.h"

namespace deepinfer {
namespace {

using testing::CudaOpTest;
using testing::DeviceTensor;

class CudaSplitLinearTest : public CudaOpTest {
 protected:
  // Activations over 16 binades (a normed hidden state spans a few; the split is relative, so this costs nothing).
  HostTensor spread(Shape shape) {
    HostTensor t = rand(std::move(shape));
    std::uniform_int_distribution<int> e(-8, 8);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = std::ldexp(t.data<float>()[i], e(rng()));
    return t;
  }
  // The bf16 weight and its exact f32 widening.
  std::pair<HostTensor, HostTensor> bf16_weight(int64_t n, int64_t k) {
    HostTensor wf = rand({n, k}, -0.5f, 0.5f), w(DType::kBF16, {n, k});
    for (int64_t i = 0; i < wf.numel(); ++i) {
      w.data<uint16_t>()[i] = f32_to_bf16(wf.data<float>()[i]);
      wf.data<float>()[i] = bf16_to_f32(w.data<uint16_t>()[i]);
    }
    return {std::move(w), std::move(wf)};
  }
  // max_ij |y_ij − ref_ij| / mag_ij, printed for the device log.
  static double worst_ratio(const char* what, const HostTensor& y, const std::vector<double>& ref,
                            const std::vector<double>& mag) {
    double worst = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      const double v = y.data<float>()[i];
      worst = std::isfinite(v) ? std::max(worst, std::fabs(v - ref[i]) / mag[i]) : INFINITY;
    }
    std::printf("[cuda-op] %-40s max |y - ref| / sum|x*w| = %.3e (2^%.1f)\n", what, worst, std::log2(worst));
    std::fflush(stdout);
    return worst;
  }
};

// run_split_f32_to_bf16 byte for byte against the host's RNE: hi = bf16(x), lo = bf16(x − hi); both kernels (the
// 8-values-a-thread one and the grid-stride one for unaligned or n % 8 != 0), with infinities, NaN, the largest
// floats (hi rounds to inf: lo = 0), subnormals and ties among random values over many magnitudes.
TEST_F(CudaSplitLinearTest, SplitKernelMatchesHostRounding) {
  std::vector<float> specials = testing::f32_rounding_specials();
  specials.push_back(1.00390625f);       // 1 + 2^-8: a tie for hi
  specials.push_back(1.0000019073486f);  // 1 + 2^-19: lo = 2^-19 exactly
  std::uniform_real_distribution<float> mant(-1.0f, 1.0f);
  std::uniform_int_distribution<int> expo(-120, 120);
  for (auto [n, off] : {std::tuple<int64_t, int64_t>{8, 0}, {300 * 4096, 0}, {4096 + 3, 0}, {4096, 1}}) {
    HostTensor x(DType::kF32, {n + off});
    float* xv = x.data<float>();
    for (int64_t i = 0; i < n + off; ++i) xv[i] = std::ldexp(mant(rng()), expo(rng()));
    for (size_t s = 0; s < specials.size() && static_cast<int64_t>(s) < n; ++s)
      xv[off + static_cast<int64_t>(s) * std::max<int64_t>(1, n / 11) % n] = specials[s];
    DeviceTensor dx = up(x), hi = poisoned_bytes(DType::kBF16, {n}), lo = poisoned_bytes(DType::kBF16, {n});
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    cuda::run_split_f32_to_bf16(static_cast<const float*>(dx.data()) + off, hi.data(), lo.data(), n, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const HostTensor h = down(hi), l = down(lo);
    int64_t wrong = 0;
    for (int64_t i = 0; i < n; ++i) {
      const float v = xv[off + i], hv = bf16_to_f32(f32_to_bf16(v));
      const float gh = bf16_to_f32(h.data<uint16_t>()[i]), gl = bf16_to_f32(l.data<uint16_t>()[i]);
      if (std::isnan(v)) {
        wrong += !std::isnan(gh) || gl != 0.0f;
        continue;
      }
      const uint16_t want_lo = std::isfinite(hv) ? f32_to_bf16(v - hv) : f32_to_bf16(0.0f);
      wrong += h.data<uint16_t>()[i] != f32_to_bf16(v) || l.data<uint16_t>()[i] != want_lo;
    }
    std::printf("[cuda-op] split f32->bf16 hi+lo n%-10lld%s wrong=%lld\n", static_cast<long long>(n),
                off ? " in+1" : "     ", static_cast<long long>(wrong));
    EXPECT_EQ(wrong, 0) << "n " << n << " off " << off << " (seed " << seed_ << ")";
  }
}

// Prefill-like shapes: the V4-Flash CSA compressor (K = 4096 -> 2·512) at 300 rows, its indexer compressor
// (-> 2·128) at 1000 rows (neither a multiple of 64), and a small odd one (77 rows, below the model's 128-row
// threshold, N = 200, K = 520) where the op must be as right.
TEST_F(CudaSplitLinearTest, SplitInIsNearF32AtPrefillShapes) {
  const double tol = std::ldexp(1.0, -16) + std::ldexp(1.0, -18);
  for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{300, 1024, 4096}, {1000, 256, 4096}, {77, 200, 520}}) {
    const std::string shape = " " + std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k);
    const HostTensor x = spread({m, k});
    const auto [w, wf] = bf16_weight(n, k);
    std::vector<double> ref(m * n, 0.0), mag(m * n, 0.0);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double s = 0, a = 0;
        const float* xr = x.data<float>() + i * k;
        const float* wr = wf.data<float>() + j * k;
        for (int64_t q = 0; q < k; ++q) {
          const double p = double(xr[q]) * wr[q];
          s += p;
          a += std::fabs(p);
        }
        ref[i * n + j] = s;
        mag[i * n + j] = a;
      }
    HostTensor want(DType::kF32, {m, n});
    QuantLinearParams cp{x, QuantMatrix{w, Tensor{}, QuantFormat::kFloat}, want};
    cp.split_in = true;
    cpu().linear_quant(cp);
    EXPECT_LE(worst_ratio(("cpu exact f32" + shape).c_str(), want, ref, mag), std::ldexp(1.0, -20));

    DeviceTensor dx = up(x), dw = up(w), dout = poisoned({m, n});
    QuantLinearParams gp{dx, QuantMatrix{dw, Tensor{}, QuantFormat::kFloat}, dout};
    gp.split_in = true;
    gpu().linear_quant(gp);
    const HostTensor got = down(dout);
    EXPECT_LE(worst_ratio(("gpu split_in" + shape).c_str(), got, ref, mag), tol) << "seed " << seed_;
    rel_err(("linear_quant split_in vs cpu" + shape).c_str(), got, want, 5e-5);

    gp.split_in = false;  // one bf16 term: must miss the bound, or the test could not see a lost lo term
    gpu().linear_quant(gp);
    EXPECT_GT(worst_ratio(("gpu one term" + shape).c_str(), down(dout), ref, mag), tol);

    // Batch-invariant mode: the exact fp32 chain over the widened weight, split_in or not.
    DeviceTensor dwf = up(wf), dlin = poisoned({m, n});
    gpu().set_batch_invariant(true);
    gp.split_in = true;
    gpu().linear_quant(gp);
    gpu().linear({dx, dwf, dlin});
    gpu().set_batch_invariant(false);
    expect_same_bytes(("batch-invariant split_in = linear" + shape).c_str(), down(dout), down(dlin));
  }
}

}  // namespace
}  // namespace deepinfer
