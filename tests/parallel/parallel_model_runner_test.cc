// EP / DP runs of the engine equal the single-rank run: every logits row the sampler saw is bit-identical (so the
// greedy outputs are too), on the golden-fixture models (V3, V4, V4.1), the committed tiny V3 model and a
// generated quantized V4.1 checkpoint (FP8 weights, MXFP4 experts). Prompts of different lengths make the DP
// shards uneven, so ranks run idle forwards; EPLB applied mid-run must not change a logit either. With block-format
// weights kept quantized (--weight-format fp8: MXFP4 / FP8 routed experts on each rank, moe_quant on the received
// rows) the EP run equals the single-rank run with the same kept weights, bit for bit.
#include "deepinfer/parallel/parallel_model_runner.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>

#include <nlohmann/json.hpp>

#include "deepinfer/engine/engine.h"
#include "deepinfer/engine/v3_model_runner.h"
#include "deepinfer/engine/v4_model_runner.h"
#include "deepinfer/io/safetensors.h"
#include "deepinfer/model/random_checkpoint.h"
#include "logits_recorder.h"
#include "random_checkpoint_util.h"
#include "test_util.h"
#include "v4_quant_config.h"

namespace deepinfer {
namespace {

using Recorder = testing::LogitsRecorder;

struct Model {
  std::string dir;
  std::optional<std::vector<int64_t>> token_map;
  bool v3 = false;
  bool quant = false;  // block-format weights kept quantized (--weight-format fp8)
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
std::unique_ptr<M> load_model(const Model& m, Backend& b, const ExpertFilter& resident = {}) {
  if constexpr (std::is_same_v<M, DeepseekV3Model>) {
    return DeepseekV3Model::load(m.dir, b, m.quant ? V3WeightStorage::kFP8 : V3WeightStorage::kAuto, resident);
  } else {
    return DeepseekV4Model::load(m.dir, b, m.token_map, m.quant, resident);
  }
}

// Whether the model's last layer keeps its routed experts in their block format.
template <typename M>
bool quantized_experts(const M& model) {
  return model.weights().layers.back().quant_experts;
}

template <typename M>
void check(const Model& m, const std::vector<std::pair<int, int>>& layouts, bool exact_prefill = true,
           int eplb_slots = 0, int cp = 1) {
  ModelRunnerOptions ro;
  ro.exact_prefill = exact_prefill;
  auto backend = make_cpu_backend(2);
  auto single_model = load_model<M>(m, *backend);
  EXPECT_EQ(quantized_experts(*single_model), m.quant) << "the fixture does not test what it should";
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
        po, [](int) { return make_cpu_backend(1); },
        [&](Backend& b, const ExpertFilter& resident) { return load_model<M>(m, b, resident); });
    // Each rank holds only its placement's experts, in the single-rank run's format.
    const int last = static_cast<int>(par.model(0).config().layers.size()) - 1;
    EXPECT_FALSE(par.model(0).has_expert(last, par.model(0).config().moe.n_routed_experts - 1));
    EXPECT_TRUE(par.model(0).has_expert(last, 0));
    EXPECT_EQ(quantized_experts(par.model(0)), m.quant);
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
      int moved = 0;
      for (const auto& l : report.layers) moved += l.experts_moved;
      EXPECT_GT(moved, 0) << "EPLB moved no expert: the reload path was not exercised";
      // Every expert the new placement puts on a rank is resident there (loaded in the rank's format), no other.
      for (int r = 0; r < par.layout().world; ++r) {
        const ExpertParallel& x = par.expert_parallel(r);
        for (int e = 0; e < x.placement(last).num_experts(); ++e)
          EXPECT_EQ(par.model(r).has_expert(last, e), x.placement(last).slot_of(x.ep_group().rank(), e) >= 0)
              << "rank " << r << " expert " << e;
      }
      EXPECT_EQ(quantized_experts(par.model(0)), m.quant);
    }
  }
}

// The multi-process driver/worker protocol (DistributedModelRunner on rank 0, run_parallel_worker on the others),
// here with the in-process communicator standing in for NCCL: the engine runs on rank 0's thread.
void check_distributed(const Model& m) {
  auto backend = make_cpu_backend(2);
  auto single_model = load_model<DeepseekV4Model>(m, *backend);
  EXPECT_EQ(quantized_experts(*single_model), m.quant);
  SlotModelRunner<DeepseekV4Model> single(*single_model, 4, {});
  const auto ref = run(single, 24);
  ParallelRunnerOptions po;
  po.layout = ParallelLayout::make(2, 2);
  po.num_slots = 4;
  po.model_dir = m.dir;
  po.eplb_interval = 4;
  po.eplb_slots = 5;
  auto make_backend = [](int) { return make_cpu_backend(1); };
  auto load = [&](Backend& b, const ExpertFilter& resident) { return load_model<DeepseekV4Model>(m, b, resident); };
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

TEST(DistributedModelRunner, DriverAndWorkersEqualSingleRank) { check_distributed(golden("deepseek_v41")); }

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

// A generated block-quantized checkpoint of a golden config (FP8 e4m3 projections; V4 family: MXFP4 routed
// experts, V3 family: FP8 experts), loaded with its block-format weights kept (--weight-format fp8).
Model quantized(const testing::TempDir& tmp, const std::string& family) {
  nlohmann::json cfg = nlohmann::json::parse(
      testing::read_file_or_empty(testing::test_data_dir() + "/golden/" + family + "/config.json"));
  Model m;
  m.v3 = family == "deepseek_v3";
  m.quant = true;
  if (m.v3) {
    cfg["quantization_config"] = {
        {"quant_method", "fp8"}, {"fmt", "e4m3"}, {"activation_scheme", "dynamic"}, {"weight_block_size", {32, 32}}};
  } else {
    cfg["quantization_config"] = testing::v4_quantization_config();
  }
  m.dir = testing::write_random_checkpoint_of(tmp, cfg, 7, family, family + ".json");
  const nlohmann::json& text = cfg.contains("text_config") ? cfg["text_config"] : cfg;
  if (family == "deepseek_v41") {
    std::vector<int64_t> map(text["vocab_size"].get<int64_t>());
    for (size_t i = 0; i < map.size(); ++i) map[i] = static_cast<int64_t>(i % 256);
    m.token_map = map;
  }
  return m;
}

// --weight-format fp8 under EP / EP x DP: every rank keeps its MXFP4 experts; logits equal the one-rank run's with
// the same kept weights; EPLB mid-run moves quantized experts (codes and scales) without changing a logit.
TEST(ParallelModelRunner, QuantizedV4ExpertsEpDpEqualSingleRank) {
  testing::TempDir tmp;
  const Model m = quantized(tmp, "deepseek_v4");
  check<DeepseekV4Model>(m, {{2, 1}, {2, 2}, {4, 1}});
  check<DeepseekV4Model>(m, {{2, 1}, {2, 2}}, true, /*eplb_slots=*/5);
}

TEST(ParallelModelRunner, QuantizedV41ExpertsEpDpBoundedPrefill) {
  testing::TempDir tmp;
  check<DeepseekV4Model>(quantized(tmp, "deepseek_v41"), {{2, 2}}, /*exact_prefill=*/false, /*eplb_slots=*/4);
}

// CP inside EP / EP x DP with every rank's weights quantized (projections FP8, experts MXFP4 / FP8).
TEST(ParallelModelRunner, QuantizedWeightsWithContextParallelEqualSingleRank) {
  testing::TempDir tmp;
  check<DeepseekV4Model>(quantized(tmp, "deepseek_v41"), {{2, 1}, {2, 2}}, /*exact_prefill=*/false, 0, /*cp=*/2);
  check<DeepseekV4Model>(quantized(tmp, "deepseek_v4"), {{2, 1}}, true, /*eplb_slots=*/5, /*cp=*/2);
  check<DeepseekV3Model>(quantized(tmp, "deepseek_v3"), {{2, 1}}, true, 0, /*cp=*/2);
}

// V3 family: FP8 experts (and the dense layer's FP8 MLP, which stays local).
TEST(ParallelModelRunner, QuantizedV3ExpertsEpDpWithEplbEqualSingleRank) {
  testing::TempDir tmp;
  const Model m = quantized(tmp, "deepseek_v3");
  check<DeepseekV3Model>(m, {{2, 1}, {4, 2}});
  check<DeepseekV3Model>(m, {{2, 2}}, true, /*eplb_slots=*/9);
}

// The one-process-per-GPU protocol (what runs over NCCL) with every rank's experts kept MXFP4, EPLB included.
TEST(DistributedModelRunner, QuantizedExpertsEqualSingleRank) {
  testing::TempDir tmp;
  check_distributed(quantized(tmp, "deepseek_v41"));
}

// The FP8 dispatch with quantized experts: the same rows travel as e4m3 either way, so EP with f32 and with
// quantized experts differ only by the experts' weights; here the run is checked to be close to the exact one
// (greedy ids equal on the tiny model) and different from it (the dispatch really was lossy).
TEST(ParallelModelRunner, QuantizedExpertsWithFp8Dispatch) {
  testing::TempDir tmp;
  const Model m = quantized(tmp, "deepseek_v4");
  auto run_ep = [&](bool fp8) {
    ParallelRunnerOptions po;
    po.layout = ParallelLayout::make(2, 1);
    po.num_slots = 4;
    po.model_dir = m.dir;
    po.fp8_dispatch = fp8;
    ParallelModelRunner<DeepseekV4Model> par(
        po, [](int) { return make_cpu_backend(1); },
        [&](Backend& b, const ExpertFilter& resident) { return load_model<DeepseekV4Model>(m, b, resident); });
    return run(par, 24);
  };
  const auto exact = run_ep(false), lossy = run_ep(true);
  ASSERT_EQ(exact.size(), lossy.size());
  double worst = 0.0;
  bool differs = false;
  for (const auto& [seq, rows] : exact) {
    ASSERT_EQ(lossy.at(seq).size(), rows.size());
    // The first row of each sequence follows the same prompt in both runs (later rows may follow other tokens).
    const std::vector<float>& a = rows[0];
    const std::vector<float>& b = lossy.at(seq)[0];
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < a.size(); ++i) {
      num = std::max(num, static_cast<double>(std::fabs(a[i] - b[i])));
      den = std::max(den, static_cast<double>(std::fabs(a[i])));
      differs = differs || a[i] != b[i];
    }
    worst = std::max(worst, num / std::max(den, 1e-30));
  }
  EXPECT_TRUE(differs) << "--ep-fp8-dispatch changed no logit";
  EXPECT_LT(worst, 0.1) << "FP8 dispatch moved the first logits rows by more than 10% of their range";
}

// The loader's expert filter: the experts a rank's placement names are loaded, in their block format; the others
// are not read at all (each rank's memory holds its share only, also while loading).
TEST(ParallelModelRunner, ResidentFilterLoadsOnlyPlacedExperts) {
  testing::TempDir tmp;
  const Model m = quantized(tmp, "deepseek_v4");
  auto b = make_cpu_backend(1);
  auto all = load_model<DeepseekV4Model>(m, *b);
  const std::vector<ExpertPlacement> pl = initial_placements(all->config(), 4);
  auto one = load_model<DeepseekV4Model>(m, *b, placed_experts_filter(pl, 1));
  const int E = all->config().moe.n_routed_experts, L = static_cast<int>(all->config().layers.size());
  for (int l = 0; l < L; ++l) {
    ASSERT_TRUE(one->weights().layers[l].quant_experts) << "layer " << l;
    for (int e = 0; e < E; ++e)
      EXPECT_EQ(one->has_expert(l, e), pl[l].slot_of(1, e) >= 0) << "layer " << l << " expert " << e;
  }
  EXPECT_LT(one->weight_bytes(), all->weight_bytes());
  // Reloading a missing expert brings it back in the stored format; freeing drops it.
  one->load_experts(m.dir, L - 1, {0});
  EXPECT_TRUE(one->has_expert(L - 1, 0));
  EXPECT_TRUE(one->weights().layers[L - 1].qexperts[0].w1.format == QuantFormat::kMXFP4);
  std::vector<bool> keep(E, false);
  one->retain_experts(L - 1, keep);
  EXPECT_FALSE(one->has_expert(L - 1, 0));
  EXPECT_FALSE(one->has_expert(L - 1, 2));
}

TEST(ParallelModelRunner, GeneratedQuantizedV41WithEplbMidRun) {
  testing::TempDir tmp;
  nlohmann::json cfg =
      nlohmann::json::parse(testing::read_file_or_empty(testing::test_data_dir() + "/golden/deepseek_v41/config.json"));
  cfg["quantization_config"] = testing::v4_quantization_config();
  Model m;
  m.dir = testing::write_random_checkpoint_of(tmp, cfg, 5);
  std::vector<int64_t> map(cfg["text_config"]["vocab_size"].get<int64_t>());
  for (size_t i = 0; i < map.size(); ++i) map[i] = static_cast<int64_t>(i % 256);
  m.token_map = map;
  check<DeepseekV4Model>(m, {{2, 2}}, true, /*eplb_slots=*/4);
}

}  // namespace
}  // namespace deepinfer
