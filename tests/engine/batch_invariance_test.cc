// Batch invariance on a real model, CPU reference: through the Engine, a request's logits at every sampled
// position are bit-identical whether it runs alone (whole-prompt prefill) or inside a batch of 64 mixed requests
// (different lengths, chunked prefill under a small token budget, greedy / seeded / unseeded / filtered /
// penalised sampling, asynchronous scheduling), and a seeded request samples the same tokens in every batch
// composition. Model: the DeepSeek-V4.1 golden fixture (paged caches, decoder bounded replay, batched decode).
#include <gtest/gtest.h>

#include "deepinfer/engine/v4_model_runner.h"
#include "deepinfer/model/deepseek_v4.h"
#include "deepinfer/ops/ops.h"
#include "engine/batch_invariance_harness.h"
#include "test_util.h"

namespace deepinfer {
namespace {

TEST(BatchInvariance, LogitsBitIdenticalAloneAndInABatchOf64AndSeededSamplingReproducible) {
  auto backend = make_cpu_backend(2);
  auto model = DeepseekV4Model::load(testing::test_data_dir() + "/golden/deepseek_v41", *backend);
  testing::InvarianceModel m;
  m.make_runner = [&](int seqs) { return std::make_unique<V4ModelRunner>(*model, seqs); };
  m.vocab = model->config().vocab_size;
  for (int64_t e : model->config().eos_token_ids) m.eos.push_back(static_cast<TokenId>(e));
  const testing::Compositions c = testing::run_compositions(m);
  testing::expect_batch_invariant(c);
  EXPECT_GT(c.mixed.work.batched_decodes, 0) << "decode steps should have run batched";
}

}  // namespace
}  // namespace deepinfer
