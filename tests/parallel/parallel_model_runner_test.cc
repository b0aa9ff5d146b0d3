// EP / DP runs of the engine equal the single-rank run: every logits row the sampler saw is bit-identical (so the
// greedy outputs are too), on the golden-fixture models (V3, V4, V4.1), the committed tiny V3 model and a
// generated quantized V4.1 checkpoint (FP8 weights, MXFP4 experts). Prompts of different lengths make the DP
// shards uneven, so ranks run idle forwards; EPLB applied mid-run must not change a logit either.
#include "deepinfer/parallel/parallel_model_runner.h"

#include <gtest/gtest.h>

#include <cstring>
#include <map>

#include <nlohmann/json.hpp>

#include "deepinfer/engine/engine.h"
#include "deepinfer/engine/v3_model_runner.h"
#include "deepinfer/engine/v4_model_runner.h"
#include "deepinfer/io/safetensors.h"
#include "deepinfer/model/random_checkpoint.h"
#include "logits_recorder.h"
#include "test_util.h"
#include "v4_quant_config.h"

namespace deepinfer {
namespace {

using Recorder = testing::LogitsRecorder;

struct Model {
  std::string dir;
  std::optional<std::vector<int64_t>> token_map;
  bool v3 = false;
};

Model golden(const std::string& family) {
  Model m;
  m.dir = testing::test_data_dir() + "/golden/" + family;
  m.v3 = family == "deepseek_v3";
  if (!m.v3) {
    auto g = SafetensorsFile::open(m.dir + "/golden.safetensors");
    if (g->find("engram.token_map")) {
      Tensor t = g->tensor("engram.token_map");
      m.token_map = std::vector<int64_t>(t.data_as<int64_t>(), t.data_as<int64_t>() + t.numel());
    }
  }
  return m;
}

// Requests of different lengths (token ids below 256 fit every fixture's vocabulary).
std::vector<std::vector<TokenId>> prompts() {
  std::vector<std::vector<TokenId>> out;
  for (int len : {23, 5, 41, 12, 9}) {
    std::vector<TokenId> p;
    for (int i = 0; i < len; ++i) p.push_back(static_cast<TokenId>((i * 37 + len * 11) % 251 + 1));
    out.push_back(p);
  }
  return out;
}

std::map<int64_t, std::vector<std::vector<float>>> run(ModelRunner& runner, int64_t budget,
                                                       const std::function<void(int)>& after_step = {}) {
  Recorder rec(runner);
  rec.after_step = after_step;
  EngineConfig ec;
  ec.scheduler.max_num_seqs = 4;
  ec.scheduler.max_model_len = 128;
  ec.scheduler.max_num_batched_tokens = budget;  // small: chunked prefill mixed with decodes
  ec.kv.num_blocks = 64;
  ec.kv.block_size = 16;
  ec.kv.num_state_slots = 4;
  ec.kv.enable_prefix_cache = false;
  ec.kv.prefix_replay_tokens = runner.prefix_replay_tokens();
  Engine engine(ec, rec);
  int n = 0;
  for (const auto& p : prompts()) {
    Request q;
    q.request_id = "r" + std::to_string(n++);
    q.prompt_token_ids = p;
    q.params.max_tokens = 4;
    q.params.temperature = 0.0f;
    q.params.ignore_eos = true;
    engine.add_request(std::move(q));
  }
  while (engine.has_unfinished()) engine.step();
  return rec.rows;
}

template <typename M>
std::unique_ptr<M> load_model(const Model& m, Backend& b) {
  if constexpr (std::is_same_v<M, DeepseekV3Model>) {
    return DeepseekV3Model::load(m.dir, b);
  } else {
    return DeepseekV4Model::load(m.dir, b, m.token_map);
  }
}

template <typename M>
void check(const Model& m, const std::vector<std::pair<int, int>>& layouts, bool exact_prefill = true,
           int eplb_slots = 0, int cp = 1) {
  ModelRunnerOptions ro;
  ro.exact_prefill = exact_prefill;
  auto backend = make_cpu_backend(2);
  auto single_model = load_model<M>(m, *backend);
  SlotModelRunner<M> single(*single_model, 4, ro);
  const auto ref = run(single, 24);
  ASSERT_FALSE(ref.empty());
  for (auto [ep, dp] : layouts) {
    SCOPED_TRACE("ep " + std::to_string(ep) + " dp " + std::to_string(dp) + " cp " + std::to_string(cp));
    ParallelRunnerOptions po;
    po.layout = ParallelLayout::make(ep, dp, 0, cp);
    po.num_slots = 4;
    po.runner = ro;
    po.model_dir = m.dir;
    ParallelModelRunner<M> par(
        po, [](int) { return make_cpu_backend(1); }, [&](Backend& b) { return load_model<M>(m, b); });
    // Each rank holds only its placement's experts.
    EXPECT_FALSE(par.model(0).has_expert(par.model(0).config().layers.size() - 1,
                                         par.model(0).config().moe.n_routed_experts - 1));
    EplbReport report;
    auto got = run(par, 24, [&](int step) {
      if (eplb_slots > 0 && step == 3) report = par.rebalance(eplb_slots);
    });
    ASSERT_EQ(got.size(), ref.size());
    for (const auto& [seq, rows] : ref) {
      ASSERT_EQ(got.at(seq).size(), rows.size()) << "sequence " << seq;
      for (size_t i = 0; i < rows.size(); ++i)
        ASSERT_EQ(0, std::memcmp(rows[i].data(), got.at(seq)[i].data(), rows[i].size() * sizeof(float)))
            << "sequence " << seq << " logits row " << i << " differs from the single-rank run";
    }
    if (cp > 1) {
      // Rank 0 and the last rank of shard 0 (its last CP rank) split the same prompt chunks.
      const int64_t chunks = par.rank_runner(0).cp_chunks();
      EXPECT_GE(chunks, 2) << "too few prompt chunks ran context-parallel for the test to mean anything";
      EXPECT_EQ(par.rank_runner(cp - 1).cp_chunks(), chunks);
    }
    if (eplb_slots > 0) {
      ASSERT_FALSE(report.layers.empty());
      EXPECT_LE(report.mean_after(), report.mean_before() + 1e-9) << report.str();
      EXPECT_GT(report.layers[0].tokens, 0);
    }
  }
}

// The multi-process driver/worker protocol (DistributedModelRunner on rank 0, run_parallel_worker on the others),
// here with the in-process communicator standing in for NCCL: the engine runs on rank 0's thread.
TEST(DistributedModelRunner, DriverAndWorkersEqualSingleRank) {
  const Model m = golden("deepseek_v41");
  auto backend = make_cpu_backend(2);
  auto single_model = load_model<DeepseekV4Model>(m, *backend);
  SlotModelRunner<DeepseekV4Model> single(*single_model, 4, {});
  const auto ref = run(single, 24);
  ParallelRunnerOptions po;
  po.layout = ParallelLayout::make(2, 2);
  po.num_slots = 4;
  po.model_dir = m.dir;
  po.eplb_interval = 4;
  po.eplb_slots = 5;
  auto make_backend = [](int) { return make_cpu_backend(1); };
  auto load = [&](Backend& b) { return load_model<DeepseekV4Model>(m, b); };
  std::map<int64_t, std::vector<std::vector<float>>> got;
  InProcessWorld::run(2, [&](Communicator& world) {
    if (world.rank() == 0) {
      DistributedModelRunner<DeepseekV4Model> runner(world, po, make_backend, load);
      got = run(runner, 24);
      EXPECT_FALSE(runner.last_eplb_report().layers.empty()) << "EPLB ran every 4 steps";
    } else {
      run_parallel_worker<DeepseekV4Model>(world, po, make_backend, load);
    }
  });
  ASSERT_EQ(got.size(), ref.size());
  for (const auto& [seq, rows] : ref) {
    ASSERT_EQ(got.at(seq).size(), rows.size());
    for (size_t i = 0; i < rows.size(); ++i)
      ASSERT_EQ(0, std::memcmp(rows[i].data(), got.at(seq)[i].data(), rows[i].size() * sizeof(float)))
          << "sequence " << seq << " row " << i;
  }
}

TEST(ParallelJob, SerializeRoundTrip) {
  ParallelJob j;
  j.block_size = 16;
  j.num_logits_rows = 1;
  j.prev_sampled_tokens = {7, 8};
  ParallelJob::Entry e;
  e.seq_id = 42;
  e.start = 3;
  e.state_slot = 2;
  e.pending_row = 1;
  e.reset_state = true;
  e.needs_logits = true;
  e.token_ids = {5, kPendingToken};
  e.prefix_token_ids = {1, 2, 3};
  e.block_table = {9};
  e.shard = 1;
  e.logit_row = 0;
  j.entries.push_back(e);
  ParallelJob k = deserialize(serialize(j));
  EXPECT_EQ(serialize(k), serialize(j));
  EXPECT_EQ(k.entries[0].token_ids, e.token_ids);
  EXPECT_EQ(k.shard_batch(1).entries.size(), 1u);
  EXPECT_EQ(k.shard_batch(0).entries.size(), 0u);
  std::vector<int64_t> bad = serialize(j);
  bad.pop_back();
  EXPECT_THROW(deserialize(bad), Error);
}

TEST(ParallelModelRunner, GoldenV3EpDpEqualsSingleRank) {
  check<DeepseekV3Model>(golden("deepseek_v3"), {{2, 1}, {4, 1}, {2, 2}, {4, 2}});
}

// V4 CSA layers (r = 4) under chunked prefill: some sequences' first chunk is shorter than one compress group.
TEST(ParallelModelRunner, GoldenV4EpDpEqualsSingleRank) {
  check<DeepseekV4Model>(golden("deepseek_v4"), {{2, 1}, {2, 2}, {4, 2}});
}

TEST(ParallelModelRunner, GoldenV41EpDpEqualsSingleRankExactAndBounded) {
  check<DeepseekV4Model>(golden("deepseek_v41"), {{4, 1}, {2, 2}}, /*exact_prefill=*/true);
  check<DeepseekV4Model>(golden("deepseek_v41"), {{2, 2}}, /*exact_prefill=*/false);
}

// CP with EP (and DP): each DP shard's ranks are its CP group; the MoE exchange runs per rank's own rows, and a
// follower pairs the chunks rank 0 runs alone with idle forwards.
TEST(ParallelModelRunner, GoldenContextWithExpertParallelEqualsSingleRank) {
  check<DeepseekV3Model>(golden("deepseek_v3"), {{2, 1}, {2, 2}}, true, 0, /*cp=*/2);
  check<DeepseekV4Model>(golden("deepseek_v4"), {{2, 1}}, true, 0, /*cp=*/2);
  check<DeepseekV4Model>(golden("deepseek_v41"), {{2, 1}, {2, 2}}, /*exact_prefill=*/false, 0, /*cp=*/2);
  check<DeepseekV4Model>(golden("deepseek_v41"), {{2, 1}}, /*exact_prefill=*/true, /*eplb_slots=*/5, /*cp=*/2);
}

TEST(ParallelLayout, ContextParallelNeedsTheShardRanks) {
  const ParallelLayout l = ParallelLayout::make(2, 1, 0, 2);
  EXPECT_EQ(l.world, 2);
  EXPECT_EQ(l.replicas(), 2);
  EXPECT_EQ(ParallelLayout::make(2, 4, 0, 2).world, 8);
  EXPECT_EQ(ParallelLayout::make(2, 1, 0, 8).world, 8);  // the reference's --ep 2 --cp 8
  try {
    ParallelLayout::make(4, 1, 0, 2);  // world lcm(4, 2) = 4 but a shard's CP group has 2 ranks
    FAIL() << "expected InvalidArgument";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("dp·cp"), std::string::npos) << e.what();
  }
}

TEST(ParallelModelRunner, TinyV3WithEplbMidRun) {
  Model m;
  m.dir = DEEPINFER_SOURCE_DIR "/models/deepinfer-tiny-v3";
  m.v3 = true;
  check<DeepseekV3Model>(m, {{2, 2}}, true, /*eplb_slots=*/3);
}

TEST(ParallelModelRunner, GeneratedQuantizedV41WithEplbMidRun) {
  testing::TempDir tmp;
  nlohmann::json cfg =
      nlohmann::json::parse(testing::read_file_or_empty(testing::test_data_dir() + "/golden/deepseek_v41/config.json"));
  cfg["quantization_config"] = testing::v4_quantization_config();
  testing::write_file(tmp.file("in.json"), cfg.dump());
  RandomCheckpointOptions opts;
  opts.config_path = tmp.file("in.json");
  opts.out_dir = tmp.path() + "/ckpt";
  opts.seed = 5;
  write_random_checkpoint(opts);
  Model m;
  m.dir = opts.out_dir;
  std::vector<int64_t> map(cfg["text_config"]["vocab_size"].get<int64_t>());
  for (size_t i = 0; i < map.size(); ++i) map[i] = static_cast<int64_t>(i % 256);
  m.token_map = map;
  check<DeepseekV4Model>(m, {{2, 2}}, true, /*eplb_slots=*/4);
}

}  // namespace
}  // namespace deepinfer
