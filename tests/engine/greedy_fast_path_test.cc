// The greedy fast path (engine/greedy_argmax.h, ModelRunner::execute_argmax, StepExecutor): which steps take it,
// and that taking it changes nothing — the same tokens and row outcomes as the general path's Sampler, over rows
// with ties, -inf entries, NaN and +inf (kNonFinite) and all -inf (kFailed).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <memory>

#include "deepinfer/engine/greedy_argmax.h"
#include "deepinfer/engine/step_executor.h"
#include "deepinfer/sampling/logits_processors.h"
#include "deepinfer/sampling/sampler.h"

namespace deepinfer {
namespace {

constexpr int64_t kVocab = 16;
constexpr float kInf = std::numeric_limits<float>::infinity();

// Logits that depend only on (sequence, position); some sequences have special rows.
std::vector<float> row_for(int64_t seq, int64_t pos) {
  std::vector<float> r(kVocab);
  for (int64_t t = 0; t < kVocab; ++t) r[t] = static_cast<float>(((seq * 7 + pos * 3 + t * 5) % 11) / 2);  // ties
  switch (seq) {
    case 100:  // NaN: kNonFinite
      r[3] = std::numeric_limits<float>::quiet_NaN();
      break;
    case 101:  // +inf: kNonFinite
      r[5] = kInf;
      break;
    case 102:  // every entry -inf: nothing to sample
      std::fill(r.begin(), r.end(), -kInf);
      break;
    case 103:  // -inf entries and -0 / +0 ties
      for (int64_t t = 0; t < kVocab; ++t) r[t] = t % 3 == 0 ? -kInf : (t % 2 ? -0.0f : 0.0f);
      break;
    default:
      break;
  }
  return r;
}

class FakeRunner final : public ModelRunner {
 public:
  int64_t vocab_size() const override { return kVocab; }
  void execute(const ModelBatch& batch, std::span<float> logits) override {
    ++executes;
    int64_t row = 0;
    for (const BatchEntry& e : batch.entries) {
      if (!e.needs_logits) continue;
      const std::vector<float> r = row_for(e.seq_id, e.end());
      std::copy(r.begin(), r.end(), logits.begin() + row++ * kVocab);
    }
  }
  void execute_argmax(const ModelBatch& batch, const ArgmaxRows& out) override {
    ++argmax_calls;
    logprob_calls += out.wants_logprobs() ? 1 : 0;
    ModelRunner::execute_argmax(batch, out);  // the default: execute + the host reduction
  }
  bool speculative() const override { return spec; }
  int executes = 0, argmax_calls = 0, logprob_calls = 0;
  bool spec = false;
};

struct Seq {
  int64_t id;
  SamplingParams params;
  int64_t outputs = 0;  // tokens already sampled after the 3-token prompt
};

// One step over `seqs` (each a one-token decode or its first step), registering them first.
StepResult run_step(StepExecutor& ex, const std::vector<Seq>& seqs) {
  StepJob job;
  job.token_storage.resize(seqs.size());
  for (const Seq& s : seqs) {
    std::vector<TokenId> history = {1, 2, 3};
    for (int64_t i = 0; i < s.outputs; ++i) history.push_back(4);
    StepJob::Registration r;
    r.seq_id = s.id;
    r.tokens = history;
    r.prompt_len = 3;
    r.params = std::make_shared<SamplingParams>(s.params);
    job.registrations.push_back(std::move(r));
    job.token_storage[job.batch.entries.size()] = {history.back()};
    BatchEntry e;
    e.seq_id = s.id;
    e.token_ids = job.token_storage[job.batch.entries.size()];
    e.start = static_cast<int64_t>(history.size()) - 1;
    e.state_slot = static_cast<int32_t>(job.batch.entries.size());
    e.needs_logits = true;
    e.prompt_len = 3;
    job.batch.entries.push_back(e);
    job.samples.push_back({s.id, static_cast<int64_t>(history.size()), static_cast<int32_t>(job.samples.size()), 0});
  }
  job.batch.num_tokens = static_cast<int64_t>(seqs.size());
  job.batch.num_logits_rows = static_cast<int64_t>(seqs.size());
  ex.submit(std::move(job));
  return ex.wait();
}

SamplingParams greedy() {
  SamplingParams p;
  p.temperature = 0.0f;
  return p;
}

TEST(GreedyFastPath, RowEligibility) {
  EXPECT_TRUE(greedy_fast_path_row(greedy(), 0));
  SamplingParams p = greedy();
  p.temperature = 0.7f;
  EXPECT_FALSE(greedy_fast_path_row(p, 0));
  p = greedy();
  p.logprobs = 0;  // the chosen token's logprob only: one more reduction of the raw row
  EXPECT_TRUE(greedy_fast_path_row(p, 0));
  EXPECT_TRUE(greedy_row_wants_logprob(p));
  EXPECT_FALSE(greedy_row_wants_logprob(greedy()));
  p.logprobs = 1;  // top logprobs: a log_softmax over the row on the host
  EXPECT_FALSE(greedy_fast_path_row(p, 0));
  p = greedy();
  p.repetition_penalty = 1.1f;
  EXPECT_FALSE(greedy_fast_path_row(p, 0));
  p = greedy();
  p.presence_penalty = 0.5f;
  EXPECT_FALSE(greedy_fast_path_row(p, 0));
  p = greedy();
  p.frequency_penalty = -0.5f;
  EXPECT_FALSE(greedy_fast_path_row(p, 0));
  p = greedy();
  p.structured = StructuredOutputParams::json_object();
  EXPECT_FALSE(greedy_fast_path_row(p, 0));
  p = greedy();
  p.min_tokens = 2;
  EXPECT_FALSE(greedy_fast_path_row(p, 1));  // EOS still suppressed
  EXPECT_TRUE(greedy_fast_path_row(p, 2));
  p = greedy();
  p.top_k = 5;  // filters after the temperature: greedy ignores them
  p.top_p = 0.5f;
  EXPECT_TRUE(greedy_fast_path_row(p, 0));
}

TEST(GreedyFastPath, HostRowArgmaxIsTheSamplersArgmaxAndFlagsNaNAndPlusInf) {
  for (int64_t seq : {1, 2, 100, 101, 102, 103}) {
    const std::vector<float> r = row_for(seq, 9);
    const RowArgmax a = host_row_argmax(r);
    EXPECT_EQ(a.token, argmax(r)) << "sequence " << seq;
    EXPECT_EQ(a.non_finite, seq == 100 || seq == 101) << "sequence " << seq;
  }
  EXPECT_EQ(host_row_argmax(row_for(102, 9)).token, -1);
  EXPECT_EQ(host_row_argmax(row_for(103, 9)).token, 1);  // the lowest id of the +0 / -0 tie
}

TEST(GreedyFastPath, TheExecutorTakesItOnlyWhenEveryRowQualifies) {
  struct Case {
    std::string name;
    std::function<void(SamplingParams&, int64_t&)> change;  // applied to the second sequence
    bool fast;
  };
  const std::vector<Case> cases = {
      {"all greedy", [](SamplingParams&, int64_t&) {}, true},
      {"sampled row", [](SamplingParams& p, int64_t&) { p.temperature = 0.8f; }, false},
      {"chosen token's logprob", [](SamplingParams& p, int64_t&) { p.logprobs = 0; }, true},
      {"top logprobs", [](SamplingParams& p, int64_t&) { p.logprobs = 3; }, false},
      {"repetition penalty", [](SamplingParams& p, int64_t&) { p.repetition_penalty = 1.2f; }, false},
      {"min_tokens ahead", [](SamplingParams& p, int64_t&) { p.min_tokens = 3; }, false},
      {"min_tokens reached",
       [](SamplingParams& p, int64_t& outputs) {
         p.min_tokens = 3;
         outputs = 3;
       },
       true},
  };
  for (const Case& c : cases) {
    FakeRunner runner;
    StepExecutor ex(runner, {0}, /*async=*/false);
    std::vector<Seq> seqs = {{1, greedy()}, {2, greedy()}};
    c.change(seqs[1].params, seqs[1].outputs);
    const StepResult res = run_step(ex, seqs);
    EXPECT_EQ(runner.argmax_calls, c.fast ? 1 : 0) << c.name;
    EXPECT_EQ(runner.executes, 1) << c.name;
    ASSERT_EQ(res.outcomes.size(), 2u);
    EXPECT_EQ(res.outcomes[0], RowOutcome::kSampled) << c.name;
  }
  // A speculative runner verifies drafts from the processed rows: never the fast path.
  FakeRunner runner;
  runner.spec = true;
  StepExecutor ex(runner, {0}, false);
  run_step(ex, {{1, greedy()}});
  EXPECT_EQ(runner.argmax_calls, 0);
}

TEST(GreedyFastPath, SameTokensAndOutcomesAsTheSampler) {
  // The same rows once through the fast path and once through the general path (a top-logprobs request in the step
  // keeps it there).
  const std::vector<int64_t> ids = {1, 2, 3, 100, 101, 102, 103};
  FakeRunner fast_runner, slow_runner;
  StepExecutor fast(fast_runner, {0}, false), slow(slow_runner, {0}, false);
  std::vector<Seq> seqs;
  for (int64_t id : ids) seqs.push_back({id, greedy()});
  std::vector<Seq> with_logprobs = seqs;
  with_logprobs.push_back({50, greedy()});
  with_logprobs.back().params.logprobs = 2;
  const StepResult a = run_step(fast, seqs), b = run_step(slow, with_logprobs);
  EXPECT_EQ(fast_runner.argmax_calls, 1);
  EXPECT_EQ(slow_runner.argmax_calls, 0);
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(a.outcomes[i], b.outcomes[i]) << "sequence " << ids[i];
    if (a.outcomes[i] == RowOutcome::kSampled) {
      EXPECT_EQ(a.samples[i].token, b.samples[i].token) << ids[i];
    }
  }
  EXPECT_EQ(a.outcomes[3], RowOutcome::kNonFinite);
  EXPECT_EQ(a.outcomes[4], RowOutcome::kNonFinite);
  EXPECT_EQ(a.outcomes[5], RowOutcome::kFailed);
  EXPECT_FALSE(a.errors[5].empty());
  EXPECT_EQ(a.outcomes[6], RowOutcome::kSampled);
  EXPECT_EQ(a.samples[6].token, 1);
  EXPECT_EQ(a.samples[0].token, argmax(row_for(1, 3)));  // the entry ends at position 3
}

TEST(GreedyFastPath, ChosenTokenLogprobsEqualTheGeneralPathsBitForBit) {
  // Every row asks for its chosen token's logprob: the fast path, reducing on the host here (sampler.h token_logprob
  // per row). The general path gets the same rows with one top-logprobs row added; its chosen-token logprobs come
  // from Sampler::add_logprobs. Rows without logprobs in a fast step that has some keep logprob 0, as there.
  const std::vector<int64_t> ids = {1, 2, 3, 100, 101, 102, 103, 4};
  FakeRunner fast_runner, slow_runner;
  StepExecutor fast(fast_runner, {0}, false), slow(slow_runner, {0}, false);
  std::vector<Seq> seqs;
  for (int64_t id : ids) {
    seqs.push_back({id, greedy()});
    if (id != 4) seqs.back().params.logprobs = 0;  // sequence 4: no logprobs
  }
  std::vector<Seq> general = seqs;
  general.push_back({50, greedy()});
  general.back().params.logprobs = 2;
  const StepResult a = run_step(fast, seqs), b = run_step(slow, general);
  EXPECT_EQ(fast_runner.argmax_calls, 1);
  EXPECT_EQ(fast_runner.logprob_calls, 1);
  EXPECT_EQ(slow_runner.argmax_calls, 0);
  int sampled = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    ASSERT_EQ(a.outcomes[i], b.outcomes[i]) << "sequence " << ids[i];
    if (a.outcomes[i] != RowOutcome::kSampled) continue;
    ++sampled;
    EXPECT_EQ(a.samples[i].token, b.samples[i].token) << ids[i];
    // Bit for bit: the same float arithmetic in the same order.
    EXPECT_EQ(std::bit_cast<uint32_t>(a.samples[i].logprob), std::bit_cast<uint32_t>(b.samples[i].logprob))
        << "sequence " << ids[i] << ": " << a.samples[i].logprob << " vs " << b.samples[i].logprob;
    EXPECT_TRUE(a.samples[i].top_logprobs.empty());
    if (ids[i] == 4) {
      EXPECT_EQ(a.samples[i].logprob, 0.0f);
    } else {
      EXPECT_LT(a.samples[i].logprob, 0.0f) << "ties: the chosen token's probability is below 1";
      EXPECT_EQ(a.samples[i].logprob, token_logprob(row_for(ids[i], 3), a.samples[i].token));
    }
  }
  EXPECT_EQ(sampled, 5);  // all but the NaN / +inf rows (kNonFinite) and the all -inf row (kFailed)
}

// The host reduction: the logprob only when asked, 0 for rows without a token or with NaN / +inf.
TEST(GreedyFastPath, HostRowArgmaxLogprob) {
  const std::vector<float> r = row_for(1, 9);
  EXPECT_EQ(host_row_argmax(r).logprob, 0.0f);
  const RowArgmax a = host_row_argmax(r, true);
  EXPECT_EQ(a.logprob, token_logprob(r, a.token));
  EXPECT_EQ(a.logprob, log_softmax(r)[a.token]);
  for (int64_t seq : {100, 101, 102}) EXPECT_EQ(host_row_argmax(row_for(seq, 9), true).logprob, 0.0f) << seq;
  // -inf entries and a -0 / +0 tie: the max is 0, ten tokens of 16 share it, the others are -inf: log(1/10).
  const std::vector<float> z = row_for(103, 9);
  EXPECT_EQ(host_row_argmax(z, true).logprob, log_softmax(z)[1]);
  EXPECT_NEAR(host_row_argmax(z, true).logprob, -std::log(10.0), 1e-6);
}

}  // namespace
}  // namespace deepinfer
