// The CUDA step hooks (ops/cuda/cuda_step_hooks.h): the greedy fast path's device argmax against the CPU's
// sampling/sampler.h argmax and the executor's non-finite test, exactly, over random rows with exact ties (and
// ±0), -inf entries, all -inf rows, NaN and +inf rows, at several vocabulary sizes; the chosen token's logprob
// against the host's token_logprob (within one float ulp, see LogprobMatchesTheHost); and the GPU timeline's
// figures from real events around real kernels.
#include <bit>
#include <chrono>
#include <cmath>
#include <limits>
#include <thread>

#include "cuda_test_util.h"
#include "deepinfer/engine/greedy_argmax.h"
#include "deepinfer/ops/cuda/cuda_step_hooks.h"
#include "deepinfer/sampling/sampler.h"

namespace deepinfer::testing {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

class CudaArgmaxTest : public CudaOpTest {
 protected:
  // Row kinds: 0 plain, 1 coarse values (many exact ties, ±0), 2 with -inf entries, 3 all -inf, 4 a NaN,
  // 5 a +inf, 6 several +inf, 7 -inf everywhere but NaN, 8 a single finite entry among -inf.
  HostTensor rows(int64_t n, int64_t vocab, std::vector<int>& kinds) {
    HostTensor t(DType::kF32, {n, vocab});
    std::normal_distribution<float> nd(0.0f, 3.0f);
    for (int64_t r = 0; r < n; ++r) {
      const int kind = static_cast<int>(rng()() % 9);
      kinds.push_back(kind);
      float* x = t.data<float>() + r * vocab;
      for (int64_t i = 0; i < vocab; ++i) {
        float v = nd(rng());
        if (kind == 1) v = std::round(v) * 0.5f;  // ties, and -0 next to +0
        if (kind == 2 && rng()() % 4 == 0) v = -kInf;
        if (kind == 3 || kind == 7 || kind == 8) v = -kInf;
        x[i] = v;
      }
      const int64_t at = static_cast<int64_t>(rng()() % vocab);
      if (kind == 4 || kind == 7) x[at] = std::numeric_limits<float>::quiet_NaN();
      if (kind == 5) x[at] = kInf;
      if (kind == 6) x[at] = x[(at * 7 + 3) % vocab] = x[vocab - 1] = kInf;
      if (kind == 8) x[at] = -3.5f;
    }
    return t;
  }
};

TEST_F(CudaArgmaxTest, EqualsTheCpuArgmaxAndNonFiniteTestExactly) {
  auto hooks = make_cuda_step_hooks(gpu());
  int64_t checked = 0;
  for (int64_t vocab : {1, 7, 31, 32, 511, 512, 513, 4099, 129280}) {
    for (int64_t n : {1, 3, 17}) {
      std::vector<int> kinds;
      const HostTensor h = rows(n, vocab, kinds);
      const DeviceTensor d = up(h);
      std::vector<TokenId> tokens(n, -7);
      std::vector<uint8_t> non_finite(n, 7);
      hooks->argmax(d.view(), ArgmaxRows{tokens, non_finite, {}});
      for (int64_t r = 0; r < n; ++r) {
        const std::span<const float> row(h.data<float>() + r * vocab, static_cast<size_t>(vocab));
        const RowArgmax want = host_row_argmax(row);
        EXPECT_EQ(tokens[r], argmax(row)) << "vocab " << vocab << " row " << r << " kind " << kinds[r];
        EXPECT_EQ(tokens[r], want.token);
        EXPECT_EQ(non_finite[r] != 0, want.non_finite) << "vocab " << vocab << " row " << r << " kind " << kinds[r];
        ++checked;
      }
    }
  }
  std::printf("[cuda-argmax] %lld rows equal to the CPU argmax\n", static_cast<long long>(checked));
}

TEST_F(CudaArgmaxTest, HandCheckedRows) {
  auto hooks = make_cuda_step_hooks(gpu());
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<std::vector<float>> cases = {
      {1, 3, 3, 2},                  // tie: the lower id
      {-kInf, -kInf, -kInf, -kInf},  // nothing: -1
      {nan, 1, 5, 5},                // NaN skipped by argmax, flagged
      {0.0f, -0.0f, -1, -kInf},      // +0 / -0 tie: id 0
      {-kInf, -0.0f, 0.0f, -kInf},   // id 1
      {2, kInf, 1, kInf},            // the first +inf, flagged
  };
  const std::vector<TokenId> want_tokens = {1, -1, 2, 0, 1, 1};
  const std::vector<uint8_t> want_flags = {0, 0, 1, 0, 0, 1};
  HostTensor h(DType::kF32, {static_cast<int64_t>(cases.size()), 4});
  for (size_t r = 0; r < cases.size(); ++r) std::copy(cases[r].begin(), cases[r].end(), h.data<float>() + r * 4);
  const DeviceTensor d = up(h);
  std::vector<TokenId> tokens(cases.size());
  std::vector<uint8_t> flags(cases.size());
  hooks->argmax(d.view(), ArgmaxRows{tokens, flags, {}});
  EXPECT_EQ(tokens, want_tokens);
  EXPECT_EQ(flags, want_flags);
}

// The float spacing at x (its ulp; the smallest subnormal step at 0).
float ulp_of(float x) {
  const float a = std::fabs(x);
  return std::nextafter(a, kInf) - a;
}

// The chosen token's logprob on the device (argmax_cuda.h) against the host's sampling/sampler.h token_logprob, on
// random rows of real vocabulary sizes. Both compute the max in float, then sum = Σ exp(double(x) - max) over the
// entries that are not -inf in double, lse = max + log(sum) in double and float(x[id] - lse); only the order of the
// sum (the host adds in id order, the device a fixed tree) and the libraries' double exp / log differ. So the
// double lse values differ by a few double ulps at most in practice (and, bounding each sequential rounding,
// never by more than (V + 1024) * 2^-53 + 4 double ulps of max(|lse|, log V)), and after rounding to float the results
// are equal except where that tiny difference straddles a float rounding boundary: one float ulp. The assertion is "at
// most 1 float ulp" (with that double bound added, which only matters where the logprob is so close to 0 that its float
// ulp is below the double resolution of lse: a dominant token, p ≈ 1 - 1e-8; there both sides carry the same
// cancellation of max - (max + log(sum)) and differ by ~1e-14 absolute). Every row is also deterministic run to run
// (bit-equal on a second call) and batch-invariant (bit-equal alone), and the counts of bit-equal rows are printed.
TEST_F(CudaArgmaxTest, LogprobMatchesTheHost) {
  auto hooks = make_cuda_step_hooks(gpu());
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // Row kinds: 0 normal σ 3, 1 coarse (ties, ±0), 2 with -inf entries, 3 a dominant token (+20 .. +45 over N(0,1):
  // logprob ≈ -V e^-gap, near 0), 4 huge magnitudes (±3e4: every other exp underflows, logprob 0 or a tie's
  // -log(k)), 5 tiny magnitudes (|x| < 1e-30: ≈ -log V), 6 all equal (-log V exactly up to rounding), 7 a single
  // finite entry among -inf (0), 8 ties at the max with the rest N(0, 2), 9 NaN (flagged), 10 all -inf (no token),
  // 11 wide N(0, 12) with -inf entries.
  constexpr int kKinds = 12;
  int64_t total = 0, bit_equal = 0, one_ulp = 0, near_zero = 0;
  double worst_ulps = 0;
  for (int64_t vocab : {129280, 102400, 4099, 513, 1}) {
    const int64_t n = vocab > 1000 ? 2 * kKinds : kKinds;
    HostTensor h(DType::kF32, {n, vocab});
    std::vector<int> kinds;
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::uniform_real_distribution<float> ud(-1.0f, 1.0f);
    for (int64_t r = 0; r < n; ++r) {
      const int kind = static_cast<int>(r % kKinds);
      kinds.push_back(kind);
      float* x = h.data<float>() + r * vocab;
      for (int64_t i = 0; i < vocab; ++i) {
        float v = 3.0f * nd(rng());
        if (kind == 1) v = std::round(v) * 0.5f;
        if (kind == 2 && rng()() % 3 == 0) v = -kInf;
        if (kind == 3) v = nd(rng());
        if (kind == 4) v = 3e4f * ud(rng());
        if (kind == 5) v = 1e-30f * ud(rng());
        if (kind == 6) v = 0.75f;
        if (kind == 7 || kind == 10) v = -kInf;
        if (kind == 8) v = 2.0f * nd(rng());
        if (kind == 9) v = nd(rng());
        if (kind == 11) v = rng()() % 5 == 0 ? -kInf : 12.0f * nd(rng());
        x[i] = v;
      }
      const int64_t at = static_cast<int64_t>(rng()() % vocab);
      if (kind == 3) x[at] = 20.0f + static_cast<float>(rng()() % 26);
      if (kind == 4) x[at] = 3.1e4f;
      if (kind == 7) x[at] = -2.25f;
      if (kind == 8)
        for (int64_t k = 0; k < 5; ++k) x[(at + k * 7919) % vocab] = 9.5f;  // the lowest id of five is chosen
      if (kind == 9) x[at] = nan;
    }
    const DeviceTensor d = up(h);
    std::vector<TokenId> tokens(n, -7), tokens2(n, -7);
    std::vector<uint8_t> flags(n, 7), flags2(n, 7);
    std::vector<float> lp(n, nan), lp2(n, nan);
    hooks->argmax(d.view(), ArgmaxRows{tokens, flags, lp});
    hooks->argmax(d.view(), ArgmaxRows{tokens2, flags2, lp2});
    // Batch invariance: a row alone gives the same bits as in the batch (the sum's order depends on V only).
    for (int64_t r = 0; r < n; r += 5) {
      TokenId t1 = -7;
      uint8_t f1 = 7;
      float l1 = nan;
      hooks->argmax(d.view().slice(r, r + 1), ArgmaxRows{{&t1, 1}, {&f1, 1}, {&l1, 1}});
      EXPECT_EQ(t1, tokens[r]) << "vocab " << vocab << " row " << r << " alone";
      EXPECT_EQ(std::bit_cast<uint32_t>(l1), std::bit_cast<uint32_t>(lp[r])) << "vocab " << vocab << " row " << r;
    }
    for (int64_t r = 0; r < n; ++r) {
      const std::span<const float> row(h.data<float>() + r * vocab, static_cast<size_t>(vocab));
      const std::string where =
          "vocab " + std::to_string(vocab) + " row " + std::to_string(r) + " kind " + std::to_string(kinds[r]);
      const RowArgmax want = host_row_argmax(row, true);
      ASSERT_EQ(tokens[r], want.token) << where;
      ASSERT_EQ(flags[r] != 0, want.non_finite) << where;
      EXPECT_EQ(std::bit_cast<uint32_t>(lp[r]), std::bit_cast<uint32_t>(lp2[r])) << where << ": not deterministic";
      EXPECT_EQ(tokens2[r], tokens[r]) << where;
      if (want.non_finite || want.token < 0) {
        EXPECT_EQ(lp[r], 0.0f) << where << ": a row without a token to sample gives 0";
        continue;
      }
      const float host = token_logprob(row, want.token);
      ASSERT_EQ(host, want.logprob);
      ++total;
      if (std::bit_cast<uint32_t>(lp[r]) == std::bit_cast<uint32_t>(host)) {
        ++bit_equal;
        continue;
      }
      float mx = -kInf;
      for (float v : row) mx = std::max(mx, v);
      const double lse = static_cast<double>(mx) - static_cast<double>(host);
      const double scale = std::max(std::fabs(lse), std::log(static_cast<double>(vocab)));
      const double double_bound =
          static_cast<double>(vocab + 1024) * 0x1p-53 + 4.0 * (std::nextafter(scale, INFINITY) - scale);
      const double diff = std::fabs(static_cast<double>(lp[r]) - static_cast<double>(host));
      const double ulps = diff / ulp_of(host);
      worst_ulps = std::max(worst_ulps, ulps);
      if (ulps <= 1.0) {
        ++one_ulp;
      } else {
        ++near_zero;
        EXPECT_LE(diff, static_cast<double>(ulp_of(host)) + double_bound)
            << where << ": device " << lp[r] << " host " << host << " (" << ulps << " ulps)";
      }
    }
  }
  std::printf(
      "[cuda-argmax-logprob] %lld rows with a token: %lld bit-equal to the host, %lld one float ulp apart, %lld "
      "further apart within the double bound (near 0); worst %.2f float ulps\n",
      static_cast<long long>(total), static_cast<long long>(bit_equal), static_cast<long long>(one_ulp),
      static_cast<long long>(near_zero), worst_ulps);
  EXPECT_GE(total, 70);  // 60 rows of the three large vocabularies and 10 of 513 have a token to sample
}

// Logprobs whose values are known: a uniform row (-log V), a single finite entry (0), a tie of two at the max with
// everything else -inf (-log 2), a dominant token whose other entries all underflow (0), and the rows without a
// token (0).
TEST_F(CudaArgmaxTest, LogprobHandCheckedRows) {
  auto hooks = make_cuda_step_hooks(gpu());
  const int64_t V = 102400;
  HostTensor h(DType::kF32, {5, V});
  float* x = h.data<float>();
  std::fill(x, x + V, -1.5f);          // uniform
  std::fill(x + V, x + 2 * V, -kInf);  // a single finite entry
  x[V + 777] = 4.0f;
  std::fill(x + 2 * V, x + 3 * V, -kInf);  // a tie of two at the max (-0), nothing else
  x[2 * V + 5] = x[2 * V + 99999] = -0.0f;
  std::fill(x + 3 * V, x + 4 * V, -200.0f);  // dominant: the others add (V - 1) e^-400 ≈ 2e-169 to 1
  x[3 * V + 12] = 200.0f;
  std::fill(x + 4 * V, x + 5 * V, -kInf);  // no token
  const DeviceTensor d = up(h);
  std::vector<TokenId> tokens(5);
  std::vector<uint8_t> flags(5);
  std::vector<float> lp(5);
  hooks->argmax(d.view(), ArgmaxRows{tokens, flags, lp});
  EXPECT_EQ(tokens, (std::vector<TokenId>{0, 777, 5, 12, -1}));
  EXPECT_NEAR(lp[0], -std::log(static_cast<double>(V)), 2e-6);
  EXPECT_EQ(lp[1], 0.0f);
  EXPECT_NEAR(lp[2], -std::log(2.0), 1e-7);
  // 1 + (V - 1) e^-400 rounds to 1 in double: log 1 = 0, and 200 - (200 + 0) = 0.
  EXPECT_EQ(lp[3], 0.0f);
  EXPECT_EQ(lp[4], 0.0f);
  for (int r = 0; r < 4; ++r) {
    const std::span<const float> row(x + r * V, static_cast<size_t>(V));
    EXPECT_LE(std::fabs(lp[r] - token_logprob(row, tokens[r])), ulp_of(token_logprob(row, tokens[r]))) << r;
  }
}

// Steps of real kernels with host sleeps between them: the timeline counts the decode steps after the first and
// sees the sleeps as gaps.
TEST_F(CudaArgmaxTest, TimelineMeasuresTheGapsBetweenSteps) {
  auto hooks = make_cuda_step_hooks(gpu());
  const HostTensor h = rand({64, 129280});
  const DeviceTensor d = up(h);
  std::vector<TokenId> tokens(64);
  std::vector<uint8_t> flags(64);
  gpu().synchronize();
  for (int s = 0; s < 6; ++s) {
    hooks->step_begin();
    for (int k = 0; k < 5; ++k) hooks->argmax(d.view(), ArgmaxRows{tokens, flags, {}});  // GPU work, waited for
    hooks->step_end(/*decode=*/s != 1);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // host time between steps: idle GPU
  }
  // Read what has completed (the last step's end event is read at the next step, or by a poll through a new one).
  hooks->step_begin();
  hooks->step_end(false);
  const int64_t steps = hooks->timed_decode_steps();
  const double gap = hooks->decode_gap_seconds(), span = hooks->decode_span_seconds();
  std::printf("[cuda-timeline] %lld decode steps, gaps %.3f ms over span %.3f ms (%.1f%%)\n",
              static_cast<long long>(steps), 1e3 * gap, 1e3 * span, 100.0 * gap / span);
  // Steps 2..5 are decode steps after a step (step 0 has no predecessor, step 1 is not decode).
  EXPECT_EQ(steps, 4);
  EXPECT_GE(gap, 4 * 0.019);  // four 20 ms sleeps
  EXPECT_LT(gap, 4 * 0.5);
  EXPECT_GT(span, gap);
}

}  // namespace
}  // namespace deepinfer::testing
