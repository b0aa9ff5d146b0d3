// The engine with context-parallel prefill (SlotModelRunner::set_context_parallel, in-process ranks): every logits
// row the sampler sees and every output id are bit-identical to the same engine without CP, on the golden models,
// with chunked prefill (budget 48 → chunks of varying length), several sequences per step, a prompt too short to
// split, and prefix-cache hits (which run on one rank). The "processes" cases run the one-process-per-rank protocol
// (CpDriverRunner on rank 0, followers on the others) over the in-process communicator.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <memory>

#include "deepinfer/engine/engine.h"
#include "deepinfer/engine/v3_model_runner.h"
#include "deepinfer/engine/v4_model_runner.h"
#include "deepinfer/io/safetensors.h"
#include "deepinfer/parallel/cp_process_runner.h"
#include "deepinfer/parallel/in_process_communicator.h"
#include "logits_recorder.h"
#include "parallel/cp_test_group.h"
#include "test_util.h"

namespace deepinfer {
namespace {

using Recorder = testing::LogitsRecorder;

CpLauncher thread_launcher() {
  return [](int n, const std::function<void(int, const AllGatherBytes&)>& fn) {
    testing::CpTestGroup group(n);
    group.run([&](int rank) { fn(rank, group.all_gather(rank)); });
  };
}

struct Case {
  std::string family;
  int cp = 2;
  bool exact_prefill = true;
  // One "process" per rank (CpDriverRunner + followers, parallel/cp_process_runner.h) with the in-process
  // communicator standing in for NCCL, instead of the runner hosting every rank.
  bool processes = false;
  std::string name() const {
    return family + "_cp" + std::to_string(cp) + (exact_prefill ? "" : "_bounded") + (processes ? "_processes" : "");
  }
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.name(); }

struct Result {
  std::map<int64_t, std::vector<std::vector<float>>> rows;
  std::map<std::string, std::vector<TokenId>> out;
  int64_t cp_chunks = 0;
};

class CpRunner : public ::testing::TestWithParam<Case> {};

TEST_P(CpRunner, EngineOutputsEqualOneRank) {
  const Case& c = GetParam();
  const std::string dir = testing::test_data_dir() + "/golden/" + c.family;
  auto backend = make_cpu_backend(0);
  auto golden = SafetensorsFile::open(dir + "/golden.safetensors");
  auto ids = [&](const std::string& n) {
    Tensor t = golden->tensor(n);
    return std::vector<int64_t>(t.data_as<int64_t>(), t.data_as<int64_t>() + t.numel());
  };
  std::unique_ptr<DeepseekV3Model> v3;
  std::unique_ptr<DeepseekV4Model> v4;
  if (c.family == "deepseek_v3") {
    v3 = DeepseekV3Model::load(dir, *backend);
  } else {
    std::optional<std::vector<int64_t>> map;
    if (golden->find("engram.token_map")) map = ids("engram.token_map");
    v4 = DeepseekV4Model::load(dir, *backend, map);
  }
  std::vector<TokenId> base;
  for (int64_t t : ids("prompt2.input_ids")) base.push_back(static_cast<TokenId>(t));
  // a: 97 tokens; b: shares a's first 64 (a prefix hit once a is cached: one rank); s: 5 tokens (< 2·cp for cp 4);
  // d: 131 tokens, submitted with a.
  const std::vector<std::pair<std::string, std::vector<TokenId>>> first = {
      {"a", std::vector<TokenId>(base.begin(), base.begin() + 97)},
      {"s", std::vector<TokenId>(base.begin() + 7, base.begin() + 12)},
      {"d", std::vector<TokenId>(base.begin() + 100, base.begin() + 231)}};
  std::vector<TokenId> b(base.begin(), base.begin() + 64);
  b.insert(b.end(), base.begin() + 240, base.begin() + 280);

  ModelRunnerOptions o;
  o.exact_prefill = c.exact_prefill;
  // A runner hosting rank 0 (or every rank) of `cp`, or a follower; cp_chunks() of the runner.
  auto make_runner = [&](int cp, CpLauncher launcher, bool follower) -> std::unique_ptr<ModelRunner> {
    if (v3) {
      auto r = std::make_unique<V3ModelRunner>(*v3, 8, o);
      r->set_context_parallel(cp, std::move(launcher), follower);
      return r;
    }
    auto r = std::make_unique<V4ModelRunner>(*v4, 8, o);
    r->set_context_parallel(cp, std::move(launcher), follower);
    return r;
  };
  auto chunks = [&](ModelRunner& m) {
    return v3 ? static_cast<V3ModelRunner&>(m).cp_chunks() : static_cast<V4ModelRunner&>(m).cp_chunks();
  };
  auto engine_run = [&](ModelRunner& inner, ModelRunner& counted) {
    Recorder rec(inner);
    EngineConfig ec;
    ec.scheduler.max_num_seqs = 4;
    ec.scheduler.max_model_len = 320;
    ec.scheduler.max_num_batched_tokens = 48;
    ec.kv.num_blocks = 128;
    ec.kv.block_size = 16;
    ec.kv.num_state_slots = 8;
    ec.kv.enable_prefix_cache = true;
    ec.kv.prefix_replay_tokens = inner.prefix_replay_tokens();
    Engine engine(ec, rec);
    Result r;
    for (const auto& wave : {first, std::vector<std::pair<std::string, std::vector<TokenId>>>{{"b", b}}}) {
      for (const auto& [id, prompt] : wave) {
        Request q;
        q.request_id = id;
        q.prompt_token_ids = prompt;
        q.params.max_tokens = 5;
        q.params.temperature = 0.0f;
        q.params.ignore_eos = true;
        engine.add_request(std::move(q));
      }
      while (engine.has_unfinished()) engine.step();
      for (auto& d : engine.take_finished()) r.out[d.request_id] = d.output_token_ids;
    }
    r.rows = std::move(rec.rows);
    r.cp_chunks = chunks(counted);
    return r;
  };
  auto run = [&](int cp) {
    if (!c.processes || cp == 1) {
      auto inner = make_runner(cp, cp > 1 ? thread_launcher() : CpLauncher{}, false);
      return engine_run(*inner, *inner);
    }
    Result r;
    int64_t follower_chunks = -1;
    InProcessWorld::run(cp, [&](Communicator& world) {
      auto runner = make_runner(cp, make_communicator_cp_launcher(world), world.rank() != 0);
      if (world.rank() == 0) {
        ModelRunner& rank0 = *runner;
        CpDriverRunner driver(world, std::move(runner));
        r = engine_run(driver, rank0);
      } else {
        run_cp_follower(world, *runner);
        if (world.rank() == cp - 1) follower_chunks = chunks(*runner);
      }
    });
    EXPECT_EQ(follower_chunks, r.cp_chunks) << "the last follower ran a different number of CP chunks";
    return r;
  };
  const Result one = run(1), par = run(c.cp);
  EXPECT_EQ(one.cp_chunks, 0);
  EXPECT_GE(par.cp_chunks, 4) << "too few prompt chunks ran context-parallel for the test to mean anything";
  ASSERT_EQ(one.out, par.out);
  ASSERT_EQ(one.rows.size(), par.rows.size());
  for (const auto& [seq, rows] : one.rows) {
    const auto& other = par.rows.at(seq);
    ASSERT_EQ(rows.size(), other.size()) << "sequence " << seq;
    for (size_t i = 0; i < rows.size(); ++i)
      EXPECT_EQ(0, std::memcmp(rows[i].data(), other[i].data(), rows[i].size() * sizeof(float)))
          << "sequence " << seq << " logits row " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Golden, CpRunner,
                         ::testing::Values(Case{"deepseek_v3", 2}, Case{"deepseek_v4", 4}, Case{"deepseek_v41", 2},
                                           Case{"deepseek_v41", 4, false}, Case{"deepseek_v3", 2, true, true},
                                           Case{"deepseek_v4", 3, true, true}, Case{"deepseek_v41", 2, false, true}),
                         [](const auto& info) { return info.param.name(); });

}  // namespace
}  // namespace deepinfer
