// CudaBackend::sample against the CPU Sampler (sampling/sampler.h): the same rows, params, RNG keys and positions
// must give the same token ids, exactly, over random logits (several scales, exact ties, -inf entries), token
// masks, and every filter combination of the chain (temperature, top-k, top-p, min-p, greedy). A seeded row's
// token depends only on (seed, stream, position): re-running gives the same ids and other positions other draws.
#include <limits>
#include <set>

#include "cuda_test_util.h"
#include "deepinfer/sampling/sampler.h"

namespace deepinfer::testing {
namespace {

struct SampleRow {
  std::vector<float> logits;
  std::vector<uint32_t> mask;  // empty: every token allowed
  SamplingParams params;
  RngKey key;
  int64_t position = 0;
};

class CudaSampleTest : public CudaOpTest {
 protected:
  // Random logits of one of several shapes; at least one allowed finite token.
  SampleRow random_row(int64_t vocab) {
    SampleRow r;
    std::normal_distribution<float> nd(0.0f, 1.0f);
    const float scales[] = {0.3f, 1.0f, 4.0f, 12.0f};
    const float scale = scales[rng()() % 4];
    const bool ties = rng()() % 4 == 0, neg_inf = rng()() % 3 == 0;
    r.logits.resize(vocab);
    for (auto& v : r.logits) {
      v = nd(rng()) * scale;
      if (ties) v = std::round(v * 2.0f) / 2.0f;  // many exact ties (and ±0)
      if (neg_inf && rng()() % 10 == 0) v = -std::numeric_limits<float>::infinity();
    }
    const int64_t keep = static_cast<int64_t>(rng()() % vocab);
    if (rng()() % 3 == 0) {
      r.mask.assign((vocab + 31) / 32, 0u);
      for (int64_t t = 0; t < vocab; ++t)
        if (rng()() % 2) r.mask[t / 32] |= 1u << (t % 32);
      r.mask[keep / 32] |= 1u << (keep % 32);
    }
    if (std::isinf(r.logits[keep])) r.logits[keep] = 0.5f;
    const float temps[] = {0.0f, 0.25f, 0.7f, 1.0f, 1.0f, 1.6f};
    const int top_ks[] = {0, 0, 1, 3, 40, static_cast<int>(vocab) - 1, static_cast<int>(vocab) + 5};
    const float top_ps[] = {1.0f, 1.0f, 0.95f, 0.6f, 0.2f};
    const float min_ps[] = {0.0f, 0.0f, 0.02f, 0.3f};
    r.params.temperature = temps[rng()() % 6];
    r.params.top_k = top_ks[rng()() % 7];
    r.params.top_p = top_ps[rng()() % 5];
    r.params.min_p = min_ps[rng()() % 4];
    r.key = RngKey{rng()(), rng()()};
    r.position = static_cast<int64_t>(rng()() >> 32);
    return r;
  }

  std::vector<int32_t> cpu_tokens(const std::vector<SampleRow>& rows) {
    Sampler sampler;
    std::vector<int32_t> out;
    for (const auto& r : rows) {
      SamplingContext ctx;
      ctx.allowed_tokens = r.mask;
      out.push_back(sampler.sample(r.logits, r.params, ctx, r.key, r.position).token);
    }
    return out;
  }

  std::vector<int32_t> gpu_tokens(const std::vector<SampleRow>& rows) {
    const int64_t R = static_cast<int64_t>(rows.size()), V = static_cast<int64_t>(rows[0].logits.size());
    const int64_t W = (V + 31) / 32;
    HostTensor logits(DType::kF32, {R, V}), temp(DType::kF32, {R}), top_k(DType::kI32, {R}), top_p(DType::kF32, {R});
    HostTensor min_p(DType::kF32, {R}), key(DType::kI64, {R, 3}), allowed(DType::kI32, {R, W});
    for (int64_t i = 0; i < R; ++i) {
      const SampleRow& r = rows[i];
      std::copy(r.logits.begin(), r.logits.end(), logits.data<float>() + i * V);
      temp.data<float>()[i] = r.params.temperature;
      top_k.data<int32_t>()[i] = r.params.top_k;
      top_p.data<float>()[i] = r.params.top_p;
      min_p.data<float>()[i] = r.params.min_p;
      key.data<int64_t>()[i * 3 + 0] = static_cast<int64_t>(r.key.seed);
      key.data<int64_t>()[i * 3 + 1] = static_cast<int64_t>(r.key.stream);
      key.data<int64_t>()[i * 3 + 2] = r.position;
      for (int64_t w = 0; w < W; ++w)
        allowed.data<int32_t>()[i * W + w] = static_cast<int32_t>(r.mask.empty() ? ~0u : r.mask[w]);
    }
    DeviceTensor dl = up(logits), dt = up(temp), dk = up(top_k), dp = up(top_p), dm = up(min_p), dr = up(key);
    DeviceTensor da = up(allowed), dout = poisoned_bytes(DType::kI32, {R});
    gpu().sample({dl, dt, dk, dp, dm, dr, da, dout});
    HostTensor out = down(dout);
    return std::vector<int32_t>(out.data<int32_t>(), out.data<int32_t>() + R);
  }

  void expect_same_tokens(const char* what, const std::vector<SampleRow>& rows) {
    const auto want = cpu_tokens(rows), got = gpu_tokens(rows);
    int64_t diff = 0, first = -1;
    for (size_t i = 0; i < rows.size(); ++i)
      if (got[i] != want[i]) {
        if (first < 0) first = static_cast<int64_t>(i);
        ++diff;
      }
    std::printf("[cuda-op] %-40s exact: %lld of %zu tokens differ %s\n", what, static_cast<long long>(diff),
                rows.size(), diff == 0 ? "ok" : "FAIL");
    std::fflush(stdout);
    if (first >= 0) {
      const SampleRow& r = rows[first];
      ADD_FAILURE() << what << ": row " << first << " gpu " << got[first] << " cpu " << want[first] << " (temperature "
                    << r.params.temperature << ", top_k " << r.params.top_k << ", top_p " << r.params.top_p
                    << ", min_p " << r.params.min_p << ", mask " << !r.mask.empty() << ", seed " << seed_ << ")";
    }
  }
};

TEST_F(CudaSampleTest, MatchesCpuSamplerOnRandomRowsAndParams) {
  std::vector<SampleRow> rows;
  for (int i = 0; i < 400; ++i) rows.push_back(random_row(1000));
  expect_same_tokens("sample V=1000 x400 rows (all filters)", rows);
  std::vector<SampleRow> odd;  // a vocabulary that is not a multiple of 32 or of the block
  for (int i = 0; i < 100; ++i) odd.push_back(random_row(37));
  expect_same_tokens("sample V=37 x100 rows", odd);
}

TEST_F(CudaSampleTest, MatchesCpuSamplerAtRealVocabulary) {
  std::vector<SampleRow> rows;
  for (int i = 0; i < 24; ++i) rows.push_back(random_row(129280));
  expect_same_tokens("sample V=129280 x24 rows", rows);
}

// One distribution sampled at 300 positions with one seed: the tokens follow the counter (many distinct ids, so
// the draw is really used), equal the CPU's, and repeat exactly on a second run; another seed gives other draws.
TEST_F(CudaSampleTest, SeededDrawsFollowPositionAndSeed) {
  SampleRow base = random_row(512);
  base.mask.clear();
  for (auto& v : base.logits) v = std::isinf(v) ? 0.1f : v * 0.05f;  // nearly flat
  base.params = SamplingParams{};
  base.params.temperature = 0.9f;
  base.params.top_p = 0.9f;
  base.key = RngKey{12345, 0};
  std::vector<SampleRow> rows(300, base);
  for (int i = 0; i < 300; ++i) rows[i].position = i;
  expect_same_tokens("sample seeded, 300 positions", rows);
  const auto a = gpu_tokens(rows), b = gpu_tokens(rows);
  EXPECT_EQ(a, b);
  EXPECT_GT(std::set<int32_t>(a.begin(), a.end()).size(), 100u);
  for (auto& r : rows) r.key.seed = 54321;
  const auto c = gpu_tokens(rows);
  int same = 0;
  for (size_t i = 0; i < a.size(); ++i) same += a[i] == c[i];
  EXPECT_LT(same, 30) << "another seed should give other draws";
  expect_same_tokens("sample seeded (other seed)", rows);
}

TEST_F(CudaSampleTest, NonFiniteRowsAndBadInputs) {
  std::vector<SampleRow> rows;
  for (int i = 0; i < 4; ++i) rows.push_back(random_row(100));
  rows[1].logits[7] = std::numeric_limits<float>::quiet_NaN();
  rows[2].logits[9] = std::numeric_limits<float>::infinity();
  const auto got = gpu_tokens(rows);
  EXPECT_EQ(got[1], -1);
  EXPECT_EQ(got[2], -1);
  EXPECT_GE(got[0], 0);
  EXPECT_GE(got[3], 0);
  // A position outside the counter's range is reported at the next synchronize.
  rows.resize(1);
  rows[0].position = int64_t{1} << 32;
  try {
    gpu_tokens(rows);
    ADD_FAILURE() << "a position of 2^32 was not reported";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("sample"), std::string::npos) << e.what();
  }
  // Wrong dtype of a param: a clear error naming the field.
  auto filled = [&](float v) {
    HostTensor h(DType::kF32, {2});
    h.data<float>()[0] = h.data<float>()[1] = v;
    return up(h);
  };
  DeviceTensor logits = up(rand({2, 10})), one = filled(1.0f), off = filled(0.0f);
  DeviceTensor key = up(ints(DType::kI64, {2, 3}, 0, 100)), topk = up(ints(DType::kI32, {2}, 0, 5));
  DeviceTensor out = poisoned_bytes(DType::kI32, {2});
  try {
    gpu().sample({logits, one, one /* top_k must be i32 */, one, off, key, Tensor{}, out});
    ADD_FAILURE() << "an f32 top_k was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("top_k"), std::string::npos) << e.what();
  }
  gpu().sample({logits, one, topk, one, off, key, Tensor{}, out});  // no mask: every token allowed
  const HostTensor h = down(out);
  for (int i = 0; i < 2; ++i) EXPECT_TRUE(h.data<int32_t>()[i] >= 0 && h.data<int32_t>()[i] < 10);
}

}  // namespace
}  // namespace deepinfer::testing
