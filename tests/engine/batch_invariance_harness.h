// Batch invariance through the Engine, for any model runner and backend: two requests under test, "x" (greedy)
// and "y" (seeded top-p sampling), run alone (whole-prompt prefill, one sequence) and inside a crowd of 64
// mixed requests in two compositions (16 sequences / 48-token steps, then reversed arrival with 8 / 19), so
// that their prompts are chunked by what is around them and their decode steps share batches of every size.
// Every logits row each sampled position saw is recorded. Used by the CPU reference's test
// (engine/batch_invariance_test.cc) and the CUDA backend's batch-invariant mode (cuda/cuda_batch_invariance_test.cc).
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "deepinfer/engine/engine.h"
#include "deepinfer/sampling/rng.h"

namespace deepinfer::testing {

struct InvarianceModel {
  std::function<std::unique_ptr<ModelRunner>(int max_num_seqs)> make_runner;
  int64_t vocab = 0;
  std::vector<TokenId> eos;
};

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
  ModelWorkStats work;
};

// Runs `requests` (n = 1 each) in this order; sequence ids follow the order of add_request.
inline Outcome run_requests(const InvarianceModel& m, const std::vector<Request>& requests, int max_num_seqs,
                            int64_t budget) {
  std::unique_ptr<ModelRunner> inner = m.make_runner(max_num_seqs);
  RecordingRunner runner(*inner);
  EngineConfig c;
  c.scheduler = {.max_num_seqs = max_num_seqs, .max_num_batched_tokens = budget, .max_model_len = 256};
  // The prefix cache stays off: with it, a V4.1 request's logits would depend on which other request computed
  // its prefix (decoder bounded replay is the documented approximation, not bit-exact).
  c.kv = {.num_blocks = 4 * max_num_seqs + 8,
          .block_size = 64,
          .num_state_slots = max_num_seqs,
          .enable_prefix_cache = false};
  c.seed = 99;
  c.eos_token_ids = m.eos;
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
  o.work = runner.work_stats();
  return o;
}

inline std::vector<TokenId> random_prompt(int len, uint64_t seed, int64_t vocab) {
  std::vector<TokenId> p;
  for (int i = 0; i < len; ++i) p.push_back(static_cast<TokenId>(mix64(seed * 1000 + i) % vocab));
  return p;
}

// 62 mixed requests plus the two under test, x and y, at positions 20 and 41.
inline std::vector<Request> crowd(const Request& x, const Request& y, int64_t vocab) {
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

inline bool bit_identical(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

struct Compositions {
  Outcome x_alone, y_alone, mixed, other;
};

inline Compositions run_compositions(const InvarianceModel& m) {
  Request x;
  x.request_id = "x";
  x.prompt_token_ids = random_prompt(45, 1, m.vocab);
  x.params.temperature = 0;
  x.params.max_tokens = 8;
  x.params.ignore_eos = true;
  Request y;
  y.request_id = "y";
  y.prompt_token_ids = random_prompt(29, 2, m.vocab);
  y.params.temperature = 0.9f;
  y.params.top_p = 0.9f;
  y.params.seed = 5;
  y.params.max_tokens = 8;
  y.params.ignore_eos = true;
  Compositions c;
  c.x_alone = run_requests(m, {x}, 1, 2048);
  c.y_alone = run_requests(m, {y}, 1, 2048);
  const std::vector<Request> batch = crowd(x, y, m.vocab);
  c.mixed = run_requests(m, batch, 16, 48);
  const std::vector<Request> reversed(batch.rbegin(), batch.rend());
  c.other = run_requests(m, reversed, 8, 19);
  return c;
}

// Logits rows of x and y (alone vs each composition) that are not bit-identical, out of `compared`.
inline int differing_rows(const Compositions& c, int* compared = nullptr) {
  int differ = 0, n = 0;
  for (const Outcome* batch : {&c.mixed, &c.other})
    for (const char* id : {"x", "y"}) {
      const auto& alone = (std::string(id) == "x" ? c.x_alone : c.y_alone).logits.at(id);
      const auto& in_batch = batch->logits.at(id);
      for (size_t k = 0; k < std::min(alone.size(), in_batch.size()); ++k, ++n)
        differ += !bit_identical(alone[k], in_batch[k]);
    }
  if (compared) *compared = n;
  return differ;
}

// The invariance claims, as gtest expectations.
inline void expect_batch_invariant(const Compositions& c) {
  ASSERT_EQ(c.x_alone.tokens.at("x").size(), 8u);
  ASSERT_EQ(c.y_alone.tokens.at("y").size(), 8u);
  EXPECT_GT(c.mixed.stats.steps, 20) << "the crowd should need many steps";
  EXPECT_EQ(c.x_alone.prefill_chunks.at("x"), 1);
  EXPECT_GT(c.mixed.prefill_chunks.at("x"), 1) << "x's prompt should be split by the batch around it";
  EXPECT_GT(c.other.prefill_chunks.at("y"), 1);
  for (const Outcome* batch : {&c.mixed, &c.other}) {
    EXPECT_EQ(batch->tokens.at("x"), c.x_alone.tokens.at("x"));
    EXPECT_EQ(batch->tokens.at("y"), c.y_alone.tokens.at("y")) << "seeded sampling must not depend on the batch";
    for (const char* id : {"x", "y"}) {
      const auto& alone = (std::string(id) == "x" ? c.x_alone : c.y_alone).logits.at(id);
      const auto& in_batch = batch->logits.at(id);
      ASSERT_EQ(alone.size(), in_batch.size());
      for (size_t k = 0; k < alone.size(); ++k)
        EXPECT_TRUE(bit_identical(alone[k], in_batch[k]))
            << id << ": logits of output token " << k << " differ (" << (batch == &c.mixed ? "16 x 48" : "8 x 19")
            << " composition)";
    }
  }
  // Every seeded crowd member also agrees between the two compositions.
  for (int i = 1; i < 62; i += 5)
    EXPECT_EQ(c.other.tokens.at("c" + std::to_string(i)), c.mixed.tokens.at("c" + std::to_string(i))) << "c" << i;
}

}  // namespace deepinfer::testing
