// The CUDA backend's batch-invariant mode through the Engine (tests/engine/batch_invariance_harness.h): on the
// golden V4.1, V4 and V3 models, with batched decode in CUDA graphs (the default runner), a greedy and a seeded
// request's logits at every sampled position are bit-identical alone and inside 64-request crowds whose prompts
// get chunked and whose decode steps have every batch size. The same run without the mode is reported (how many
// of those rows differ there), not asserted: the default kernels pick split sizes and GEMM paths by batch size.
#include <gtest/gtest.h>

#include <cstdio>

#include "deepinfer/engine/v3_model_runner.h"
#include "deepinfer/engine/v4_model_runner.h"
#include "deepinfer/model/deepseek_v3.h"
#include "deepinfer/model/deepseek_v4.h"
#include "deepinfer/ops/cuda/cuda_backend.h"
#include "deepinfer/ops/cuda/cuda_runtime.h"
#include "engine/batch_invariance_harness.h"
#include "test_util.h"

namespace deepinfer::testing {
namespace {

template <typename Model, typename Runner>
Compositions run_on_cuda(const std::string& family, bool invariant, ModelWorkStats* work = nullptr) {
  auto backend = make_cuda_backend(0);
  backend->set_batch_invariant(invariant);
  auto model = Model::load(test_data_dir() + "/golden/" + family, *backend);
  InvarianceModel m;
  m.make_runner = [&](int seqs) { return std::make_unique<Runner>(*model, seqs, ModelRunnerOptions{}); };
  m.vocab = model->config().vocab_size;
  for (int64_t e : model->config().eos_token_ids) m.eos.push_back(static_cast<TokenId>(e));
  Compositions c = run_compositions(m);
  if (work) *work = c.mixed.work;
  return c;
}

class CudaBatchInvariance : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  }
  Compositions run(bool invariant, ModelWorkStats* work = nullptr) {
    if (GetParam() == "deepseek_v3") return run_on_cuda<DeepseekV3Model, V3ModelRunner>(GetParam(), invariant, work);
    return run_on_cuda<DeepseekV4Model, V4ModelRunner>(GetParam(), invariant, work);
  }
};

TEST_P(CudaBatchInvariance, LogitsBitIdenticalAloneAndInCrowdsWithTheMode) {
  ModelWorkStats work;
  const Compositions on = run(true, &work);
  expect_batch_invariant(on);
  EXPECT_GT(work.batched_decodes, 0) << "decode steps should have run batched";
  EXPECT_GT(work.decode_graph_replays, 0) << "decode steps should have replayed CUDA graphs";
  int compared = 0;
  const int differ_on = differing_rows(on, &compared);
  const int differ_off = differing_rows(run(false), &compared);
  std::printf(
      "[batch-invariance] %s: rows differing alone vs in a crowd: %d of %d with --batch-invariant, %d of %d "
      "without\n",
      GetParam().c_str(), differ_on, compared, differ_off, compared);
  EXPECT_EQ(differ_on, 0);
}

INSTANTIATE_TEST_SUITE_P(Golden, CudaBatchInvariance,
                         ::testing::Values(std::string("deepseek_v41"), std::string("deepseek_v4"),
                                           std::string("deepseek_v3")),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace deepinfer::testing
