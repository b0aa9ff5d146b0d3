// The CUDA step hooks (ops/cuda/cuda_step_hooks.h): the greedy fast path's device argmax against the CPU's
// sampling/sampler.h argmax and the executor's non-finite test, exactly, over random rows with exact ties (and
// ±0), -inf entries, all -inf rows, NaN and +inf rows, at several vocabulary sizes; and the GPU timeline's figures
// from real events around real kernels.
#include <chrono>
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
      hooks->argmax(d.view(), tokens, non_finite);
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
  hooks->argmax(d.view(), tokens, flags);
  EXPECT_EQ(tokens, want_tokens);
  EXPECT_EQ(flags, want_flags);
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
    for (int k = 0; k < 5; ++k) hooks->argmax(d.view(), tokens, flags);  // GPU work, waited for
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
