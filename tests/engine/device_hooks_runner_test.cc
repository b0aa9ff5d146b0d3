// SlotModelRunner's device hooks (engine/device_step_hooks.h) exercised on the CPU with fake hooks, so the plumbing
// that CUDA uses is tested where no GPU is: every step is bracketed by step_begin / step_end with the right decode
// flag, and a greedy step (without logprobs, or with the chosen token's) hands the batched decode logits to the
// hooks' argmax (the models' decode_batch DeviceLogitsFn) instead of returning them, with the ids and logprobs
// landing in the right logits rows. The engine's greedy outputs must equal those without hooks and with
// device_argmax off, and the logprobs those of the general path (top logprobs), on V3, V4 and V4.1.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>
#include <optional>

#include "deepinfer/engine/engine.h"
#include "deepinfer/engine/greedy_argmax.h"
#include "deepinfer/engine/v3_model_runner.h"
#include "deepinfer/engine/v4_model_runner.h"
#include "deepinfer/io/safetensors.h"
#include "test_util.h"

namespace deepinfer {
namespace {

// What the fake hooks saw (outlives them: the runner owns the hooks).
struct Seen {
  bool open = false;
  int begins = 0, ends = 0, decodes = 0, calls = 0, logprob_calls = 0;
  int64_t reduced_rows = 0;
};

// On the CPU backend the "device" logits are host tensors: the fake reduces them with the host reduction.
class FakeHooks final : public DeviceStepHooks {
 public:
  explicit FakeHooks(Seen& seen) : s_(seen) {}
  void step_begin() override {
    EXPECT_FALSE(s_.open) << "step_begin twice without step_end";
    s_.open = true;
    ++s_.begins;
  }
  void step_end(bool decode) override {
    EXPECT_TRUE(s_.open) << "step_end without step_begin";
    s_.open = false;
    ++s_.ends;
    s_.decodes += decode ? 1 : 0;
  }
  int64_t timed_decode_steps() const override { return 7; }
  double decode_gap_seconds() const override { return 0.25; }
  double decode_span_seconds() const override { return 2.0; }
  void argmax(const Tensor& logits, const ArgmaxRows& out) override {
    EXPECT_TRUE(s_.open) << "argmax outside a step";
    const int64_t rows = logits.dim(0), vocab = logits.dim(1);
    EXPECT_EQ(static_cast<int64_t>(out.tokens.size()), rows);
    if (out.wants_logprobs()) EXPECT_EQ(static_cast<int64_t>(out.logprobs.size()), rows);
    for (int64_t r = 0; r < rows; ++r) out.put(r, std::span<const float>(logits.data_as<float>() + r * vocab, vocab));
    ++s_.calls;
    s_.logprob_calls += out.wants_logprobs() ? 1 : 0;
    s_.reduced_rows += rows;
  }

 private:
  Seen& s_;
};

struct Loaded {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<DeepseekV3Model> v3;
  std::unique_ptr<DeepseekV4Model> v4;
  std::vector<std::vector<TokenId>> prompts;
};

Loaded& load(const std::string& family) {
  static std::map<std::string, std::unique_ptr<Loaded>> cache;
  auto& m = cache[family];
  if (!m) {
    m = std::make_unique<Loaded>();
    const std::string dir = testing::test_data_dir() + "/golden/" + family;
    m->backend = make_cpu_backend(0);
    auto golden = SafetensorsFile::open(dir + "/golden.safetensors");
    if (family == "deepseek_v3") {
      m->v3 = DeepseekV3Model::load(dir, *m->backend);
    } else {
      std::optional<std::vector<int64_t>> map;
      if (golden->find("engram.token_map")) {
        const Tensor t = golden->tensor("engram.token_map");
        map = std::vector<int64_t>(t.data_as<int64_t>(), t.data_as<int64_t>() + t.numel());
      }
      m->v4 = DeepseekV4Model::load(dir, *m->backend, map);
    }
    for (int p = 0; p < 3; ++p) {
      const Tensor t = golden->tensor("prompt" + std::to_string(p) + ".input_ids");
      std::vector<TokenId> ids;
      for (int64_t i = 0; i < std::min<int64_t>(t.numel(), 40); ++i)
        ids.push_back(static_cast<TokenId>(t.data_as<int64_t>()[i]));
      m->prompts.push_back(std::move(ids));
    }
  }
  return *m;
}

struct RunResult {
  std::map<std::string, std::vector<TokenId>> out;
  std::map<std::string, std::vector<float>> logprobs;  // the chosen tokens'
  EngineStats stats;
};

// `logprobs`: unset none, 0 the chosen token's (the fast path), k > 0 also the top k (the general path).
RunResult run(const std::string& family, Seen* hooks, bool device_argmax, std::optional<int> logprobs) {
  Loaded& m = load(family);
  ModelRunnerOptions o;
  o.device_argmax = device_argmax;
  std::unique_ptr<ModelRunner> runner;
  auto attach = [&](auto& r) {
    if (hooks) r.set_device_hooks(std::make_unique<FakeHooks>(*hooks));
  };
  if (m.v3) {
    auto r = std::make_unique<V3ModelRunner>(*m.v3, 4, o);
    attach(*r);
    runner = std::move(r);
  } else {
    auto r = std::make_unique<V4ModelRunner>(*m.v4, 4, o);
    attach(*r);
    runner = std::move(r);
  }
  EngineConfig ec;
  ec.scheduler.max_num_seqs = 3;
  ec.scheduler.max_model_len = 128;
  ec.scheduler.max_num_batched_tokens = 33;  // chunked prefill next to decodes
  ec.kv.num_blocks = 64;
  ec.kv.block_size = 16;
  ec.kv.num_state_slots = 4;
  ec.kv.prefix_replay_tokens = runner->prefix_replay_tokens();
  RunResult res;
  {
    Engine engine(ec, *runner);
    for (size_t i = 0; i < m.prompts.size(); ++i) {
      Request q;
      q.request_id = std::to_string(i);
      q.prompt_token_ids = m.prompts[i];
      q.params.max_tokens = 8;
      q.params.temperature = 0.0f;
      q.params.ignore_eos = true;
      q.params.logprobs = logprobs;
      engine.add_request(std::move(q));
    }
    while (engine.has_unfinished()) engine.step();
    for (auto& d : engine.take_finished()) {
      res.out[d.request_id] = d.output_token_ids;
      for (const SampleResult& r : d.logprobs) res.logprobs[d.request_id].push_back(r.logprob);
    }
    res.stats = engine.stats();
  }
  return res;
}

class DeviceHooksRunner : public ::testing::TestWithParam<std::string> {};

TEST_P(DeviceHooksRunner, GreedyStepsReduceOnTheHooksWithTheSameIds) {
  const RunResult plain = run(GetParam(), nullptr, true, std::nullopt);
  ASSERT_EQ(plain.out.size(), 3u);
  EXPECT_EQ(plain.stats.model.argmax_steps_device, 0) << "no hooks: nothing reduces on a device";
  EXPECT_GT(plain.stats.model.argmax_steps_host, 0);
  EXPECT_EQ(plain.stats.model.gpu_timed_decode_steps, 0);

  Seen seen;
  Seen* hooks = &seen;
  const RunResult fast = run(GetParam(), hooks, true, std::nullopt);
  EXPECT_EQ(fast.out, plain.out);
  EXPECT_EQ(hooks->begins, hooks->ends);
  EXPECT_GT(hooks->begins, 0);
  EXPECT_GT(hooks->decodes, 0) << "decode steps are flagged";
  EXPECT_LT(hooks->decodes, hooks->begins) << "prefill steps are not";
  EXPECT_GT(hooks->calls, 0) << "batched decode logits never reached the hooks";
  EXPECT_GE(hooks->reduced_rows, hooks->calls);
  EXPECT_EQ(fast.stats.model.argmax_steps_device, hooks->calls);
  EXPECT_EQ(fast.stats.model.gpu_timed_decode_steps, 7);  // the hooks' timeline figures pass through
  EXPECT_DOUBLE_EQ(fast.stats.model.gpu_decode_gap_seconds, 0.25);
  EXPECT_DOUBLE_EQ(fast.stats.model.gpu_decode_span_seconds, 2.0);

  Seen off_seen;
  Seen* off = &off_seen;
  const RunResult host = run(GetParam(), off, false, std::nullopt);  // device_argmax off: the rows come back
  EXPECT_EQ(host.out, plain.out);
  EXPECT_EQ(off->calls, 0);
  EXPECT_EQ(off->begins, off->ends);
  EXPECT_EQ(host.stats.model.argmax_steps_device, 0);
  EXPECT_GT(host.stats.model.argmax_steps_host, 0);

  Seen general_seen;
  Seen* general = &general_seen;
  const RunResult top = run(GetParam(), general, true, 1);  // top logprobs: the general path, rows on the host
  EXPECT_EQ(top.out, plain.out);
  EXPECT_EQ(general->calls, 0);
  EXPECT_GT(general->begins, 0) << "the timeline covers every step, fast path or not";
  EXPECT_EQ(top.stats.model.argmax_steps_device + top.stats.model.argmax_steps_host, 0);
  ASSERT_EQ(top.logprobs.size(), 3u);

  // The chosen token's logprob only: the fast path, the batched decode rows reduced (logprobs too) by the hooks.
  Seen lp_seen;
  Seen* lp_hooks = &lp_seen;
  const RunResult lp = run(GetParam(), lp_hooks, true, 0);
  EXPECT_EQ(lp.out, plain.out);
  EXPECT_GT(lp_hooks->calls, 0) << "the chosen tokens' logprobs keep the batched decode rows on the hooks";
  EXPECT_EQ(lp_hooks->logprob_calls, lp_hooks->calls);
  EXPECT_EQ(lp.stats.model.argmax_steps_device, lp_hooks->calls);
  EXPECT_EQ(lp.logprobs, top.logprobs) << "the host reduction is the general path's arithmetic, bit for bit";
  // And with device_argmax off (the rows copied back, the host reduction of ModelRunner::execute_argmax).
  Seen lp_off_seen;
  Seen* lp_off = &lp_off_seen;
  const RunResult lp_host = run(GetParam(), lp_off, false, 0);
  EXPECT_EQ(lp_host.out, plain.out);
  EXPECT_EQ(lp_off->calls, 0);
  EXPECT_GT(lp_host.stats.model.argmax_steps_host, 0);
  EXPECT_EQ(lp_host.logprobs, top.logprobs);
  for (const auto& [id, v] : lp.logprobs) {
    EXPECT_EQ(v.size(), lp.out.at(id).size()) << "one logprob per token";
    for (float x : v) EXPECT_TRUE(std::isfinite(x) && x <= 0.0f) << x;
  }
}

INSTANTIATE_TEST_SUITE_P(Golden, DeviceHooksRunner, ::testing::Values("deepseek_v3", "deepseek_v4", "deepseek_v41"));

}  // namespace
}  // namespace deepinfer
