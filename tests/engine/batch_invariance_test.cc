// Batch invariance on a real model: through the Engine, a request's logits at every sampled position are
// bit-identical whether it runs alone (whole-prompt prefill) or inside a batch of 64 mixed requests (different
// lengths, chunked prefill under a small token budget, greedy / seeded / unseeded / filtered / penalised
// sampling, asynchronous scheduling), and a seeded request samples the same tokens in every batch composition.
// Model: the DeepSeek-V4.1 golden fixture (CPU reference forward, paged caches, decoder bounded replay).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>

#include "deepinfer/engine/engine.h"
#include "deepinfer/engine/v4_model_runner.h"
#include "deepinfer/model/deepseek_v4.h"
#include "deepinfer/ops/ops.h"
#include "deepinfer/sampling/rng.h"
#include "test_util.h"

namespace deepinfer {
namespace {

struct Fixture {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<DeepseekV4Model> model;
};

const Fixture& fixture() {
  static Fixture f = [] {
    Fixture x;
    x.backend = make_cpu_backend(2);
    x.model = DeepseekV4Model::load(testing::test_data_dir() + "/golden/deepseek_v41", *x.backend);
    return x;
  }();
  return f;
}

// Passes everything to the real runner and keeps a copy of every logits row, by (sequence id, position + 1).
class RecordingRunner final : public ModelRunner {
 public:
  explicit RecordingRunner(ModelRunner& inner) : inner_(inner) {}
  int64_t vocab_size() const override { return inner_.vocab_size(); }
  void execute(const ModelBatch& batch, std::span<float> logits) override {
    inner_.execute(batch, logits);
    const int64_t vocab = vocab_size();
    int64_t row = 0;
    for (const BatchEntry& e : batch.entries) {
      if (e.start < e.prompt_len) ++prefill_chunks[e.seq_id];
      if (!e.needs_logits) continue;
      const float* r = logits.data() + row++ * vocab;
      rows[{e.seq_id, e.end()}].assign(r, r + vocab);
    }
  }
  void release_slot(int32_t slot) override { inner_.release_slot(slot); }
  ModelWorkStats work_stats() const override { return inner_.work_stats(); }

  std::map<std::pair<int64_t, int64_t>, std::vector<float>> rows;
  std::map<int64_t, int> prefill_chunks;  // by sequence id

 private:
  ModelRunner& inner_;
};

struct Outcome {
  std::map<std::string, std::vector<TokenId>> tokens;             // request id → output
  std::map<std::string, std::vector<std::vector<float>>> logits;  // request id → logits row per output token
  std::map<std::string, int> prefill_chunks;                      // request id → chunks its prompt took
  EngineStats stats;
};

// Runs `requests` (n = 1 each) in this order; sequence ids follow the order of add_request.
Outcome run(const std::vector<Request>& requests, int max_num_seqs, int64_t budget) {
  const DeepseekV4Model& m = *fixture().model;
  V4ModelRunner inner(m, max_num_seqs);
  RecordingRunner runner(inner);
  EngineConfig c;
  c.scheduler = {.max_num_seqs = max_num_seqs, .max_num_batched_tokens = budget, .max_model_len = 256};
  // The prefix cache stays off: with it, a V4.1 request's logits would depend on which other request computed
  // its prefix (decoder bounded replay is the documented approximation, not bit-exact).
  c.kv = {.num_blocks = 4 * max_num_seqs + 8,
          .block_size = 64,
          .num_state_slots = max_num_seqs,
          .enable_prefix_cache = false};
  c.seed = 99;
  for (int64_t e : m.config().eos_token_ids) c.eos_token_ids.push_back(static_cast<TokenId>(e));
  Engine engine(c, runner);
  std::map<std::string, int64_t> seq_of;
  for (size_t i = 0; i < requests.size(); ++i) {
    engine.add_request(requests[i]);
    seq_of[requests[i].request_id] = static_cast<int64_t>(i);
  }
  engine.run_to_completion();
  Outcome o;
  for (auto& d : engine.take_finished()) {
    const int64_t id = seq_of.at(d.request_id);
    for (size_t k = 0; k < d.output_token_ids.size(); ++k)
      o.logits[d.request_id].push_back(runner.rows.at({id, d.prompt_len + static_cast<int64_t>(k)}));
    o.tokens[d.request_id] = std::move(d.output_token_ids);
    o.prefill_chunks[d.request_id] = runner.prefill_chunks[id];
  }
  o.stats = engine.stats();
  return o;
}

std::vector<TokenId> random_prompt(int len, uint64_t seed, int64_t vocab) {
  std::vector<TokenId> p;
  for (int i = 0; i < len; ++i) p.push_back(static_cast<TokenId>(mix64(seed * 1000 + i) % vocab));
  return p;
}

// 62 mixed requests plus the two under test, "x" (greedy) and "y" (seeded sampling), at positions 20 and 41.
std::vector<Request> crowd(const Request& x, const Request& y, int64_t vocab) {
  std::vector<Request> rs;
  for (int i = 0; i < 62; ++i) {
    Request r;
    r.request_id = "c" + std::to_string(i);
    r.prompt_token_ids = random_prompt(1 + static_cast<int>(mix64(i) % 70), 500 + i, vocab);
    r.params.max_tokens = 1 + i % 7;
    switch (i % 5) {
      case 0:
        r.params.temperature = 0;
        break;
      case 1:
        r.params.seed = i;
        break;
      case 2:
        r.params.temperature = 1.3f;
        break;  // unseeded
      case 3:
        r.params.top_k = 20;
        r.params.top_p = 0.8f;
        r.params.seed = 7 * i;
        break;
      case 4:
        r.params.repetition_penalty = 1.3f;
        r.params.frequency_penalty = 0.5f;
        r.params.min_tokens = 1;
        break;
    }
    rs.push_back(std::move(r));
    if (i == 19) rs.push_back(x);
    if (i == 39) rs.push_back(y);
  }
  return rs;
}

bool bit_identical(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(BatchInvariance, LogitsBitIdenticalAloneAndInABatchOf64AndSeededSamplingReproducible) {
  const int64_t vocab = fixture().model->config().vocab_size;
  Request x;
  x.request_id = "x";
  x.prompt_token_ids = random_prompt(45, 1, vocab);
  x.params.temperature = 0;
  x.params.max_tokens = 8;
  x.params.ignore_eos = true;
  Request y;
  y.request_id = "y";
  y.prompt_token_ids = random_prompt(29, 2, vocab);
  y.params.temperature = 0.9f;
  y.params.top_p = 0.9f;
  y.params.seed = 5;
  y.params.max_tokens = 8;
  y.params.ignore_eos = true;

  // Alone: the whole prompt in one chunk, one sequence.
  const Outcome x_alone = run({x}, 1, 2048);
  const Outcome y_alone = run({y}, 1, 2048);
  ASSERT_EQ(x_alone.tokens.at("x").size(), 8u);
  ASSERT_EQ(y_alone.tokens.at("y").size(), 8u);

  // In a batch of 64: 16 sequences at a time, 48 tokens per step, so prompts are split into chunks that
  // depend on everything around them.
  const std::vector<Request> batch = crowd(x, y, vocab);
  ASSERT_EQ(batch.size(), 64u);
  const Outcome mixed = run(batch, 16, 48);
  EXPECT_GT(mixed.stats.steps, 20) << "the crowd should need many steps";
  EXPECT_EQ(x_alone.prefill_chunks.at("x"), 1);
  EXPECT_GT(mixed.prefill_chunks.at("x"), 1) << "x's prompt should be split by the batch around it";
  EXPECT_EQ(mixed.tokens.at("x"), x_alone.tokens.at("x"));
  EXPECT_EQ(mixed.tokens.at("y"), y_alone.tokens.at("y"));
  for (const char* id : {"x", "y"}) {
    const auto& alone = (std::string(id) == "x" ? x_alone : y_alone).logits.at(id);
    const auto& in_batch = mixed.logits.at(id);
    ASSERT_EQ(alone.size(), in_batch.size());
    for (size_t k = 0; k < alone.size(); ++k)
      EXPECT_TRUE(bit_identical(alone[k], in_batch[k])) << id << ": logits of output token " << k << " differ";
  }

  // Another composition: reversed arrival order, 8 at a time, 19-token steps.
  std::vector<Request> reversed(batch.rbegin(), batch.rend());
  const Outcome other = run(reversed, 8, 19);
  EXPECT_EQ(other.tokens.at("y"), y_alone.tokens.at("y")) << "seeded sampling must not depend on the batch";
  EXPECT_EQ(other.tokens.at("x"), x_alone.tokens.at("x"));
  EXPECT_GT(other.prefill_chunks.at("y"), 1);
  for (size_t k = 0; k < y_alone.logits.at("y").size(); ++k)
    EXPECT_TRUE(bit_identical(other.logits.at("y")[k], y_alone.logits.at("y")[k])) << "y, output token " << k;
  // Every seeded crowd member also agrees between the two compositions.
  for (int i = 1; i < 62; i += 5)
    EXPECT_EQ(other.tokens.at("c" + std::to_string(i)), mixed.tokens.at("c" + std::to_string(i))) << "c" << i;
}

}  // namespace
}  // namespace deepinfer
