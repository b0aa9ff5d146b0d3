// Speculative decoding through the Engine: greedy output with drafts equals greedy output without, token for
// token, with batching, chunked prefill, prefix cache, preemption and stop conditions inside an accepted run; on the
// tiny model with its trained MTP layer, on a random V3 checkpoint with MTP weights, and with a scripted proposer
// (exact continuations with deliberate mistakes) on the V3, V4 and V4.1 golden fixtures, which exercises partial
// acceptance and so the rollback; and with the DSpark proposer on generated V4.1 / V4-0731-shaped checkpoints that
// carry draft weights (confidence-scheduled lengths, a per-step draft budget, lossless sampling).
#include <gtest/gtest.h>

#include <functional>

#include <algorithm>
#include <array>
#include <cmath>
#include <iostream>
#include <map>
#include <regex>
#include <set>

#include "deepinfer/core/error.h"
#include "deepinfer/engine/engine.h"
#include "deepinfer/engine/v3_model_runner.h"
#include "deepinfer/engine/v4_model_runner.h"
#include "deepinfer/model/deepseek_v3.h"
#include "deepinfer/model/deepseek_v4.h"
#include "deepinfer/model/random_checkpoint.h"
#include "deepinfer/sampling/rng.h"
#include "deepinfer/spec/dspark_proposer.h"
#include "deepinfer/spec/mtp_proposer.h"
#include "deepinfer/structured/grammar_compiler.h"
#include "model/dspark_fixture.h"
#include "test_util.h"

namespace deepinfer {
namespace {

struct Opts {
  int max_num_seqs = 4;
  int64_t budget = 64;
  int32_t num_blocks = 64;
  int block_size = 16;
  bool prefix_cache = true;
  int64_t max_model_len = 256;
  double threshold = 0;                                   // EngineConfig::draft_confidence_threshold
  int64_t draft_budget = 0;                               // EngineConfig::draft_token_budget
  std::shared_ptr<structured::GrammarCompiler> compiler;  // structured output (EngineConfig::grammar_compiler)
};

struct Result {
  std::map<std::string, std::vector<TokenId>> out;
  std::map<std::string, CompletedSequence> done;
  EngineStats stats;
};

template <typename Runner>
Result run_engine(Runner& runner, const ModelConfig& mc, const std::vector<Request>& reqs, int k, const Opts& o,
                  int stagger = 0) {
  EngineConfig c;
  c.scheduler = {.max_num_seqs = o.max_num_seqs, .max_num_batched_tokens = o.budget, .max_model_len = o.max_model_len};
  c.kv = {.num_blocks = o.num_blocks,
          .block_size = o.block_size,
          .num_state_slots = o.max_num_seqs,
          .enable_prefix_cache = o.prefix_cache,
          .prefix_replay_tokens = runner.prefix_replay_tokens()};
  c.seed = 3;
  for (int64_t e : mc.eos_token_ids) c.eos_token_ids.push_back(static_cast<TokenId>(e));
  c.num_draft_tokens = k;
  c.draft_confidence_threshold = o.threshold;
  c.draft_token_budget = o.draft_budget;
  c.grammar_compiler = o.compiler;
  Engine engine(c, runner);
  Result r;
  // `stagger` > 0: add one request every `stagger` steps (later requests can hit the prefix cache).
  size_t next = 0;
  while (next < reqs.size() || engine.has_unfinished()) {
    if (next < reqs.size()) {
      engine.add_request(reqs[next++]);
      if (stagger == 0) continue;
      for (int s = 0; s < stagger && engine.has_unfinished(); ++s) engine.step();
      continue;
    }
    engine.step();
    engine.check_invariants();
  }
  for (auto& d : engine.take_finished()) {
    r.out[d.request_id] = d.output_token_ids;
    r.done[d.request_id] = d;
  }
  r.stats = engine.stats();
  return r;
}

std::vector<TokenId> random_prompt(int len, uint64_t seed, int64_t vocab) {
  std::vector<TokenId> p;
  for (int i = 0; i < len; ++i) p.push_back(static_cast<TokenId>(2 + mix64(seed * 1000 + i) % (vocab - 2)));
  return p;
}

Request greedy_request(const std::string& id, std::vector<TokenId> prompt, int max_tokens) {
  Request r;
  r.request_id = id;
  r.prompt_token_ids = std::move(prompt);
  r.params.temperature = 0;
  r.params.max_tokens = max_tokens;
  r.params.ignore_eos = true;
  return r;
}

// `n` sampled requests "s0" .. of one prompt, request i seeded seed_base + i (top_k 0: no top-k), for the
// distribution tests.
std::vector<Request> seeded_requests(int n, const std::vector<TokenId>& prompt, int max_tokens, float temperature,
                                     int top_k, uint64_t seed_base) {
  std::vector<Request> reqs;
  for (int i = 0; i < n; ++i) {
    Request r = greedy_request("s" + std::to_string(i), prompt, max_tokens);
    r.params.temperature = temperature;
    r.params.top_k = top_k;
    r.params.seed = seed_base + i;
    reqs.push_back(r);
  }
  return reqs;
}

// ---------------------------------------------------------------------------------------------------------------
// Tiny model, MTP proposer.

struct Tiny {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<DeepseekV3Model> model;
};
const Tiny& tiny() {
  static Tiny t = [] {
    Tiny x;
    x.backend = make_cpu_backend(1);
    x.model = DeepseekV3Model::load(DEEPINFER_SOURCE_DIR "/models/deepinfer-tiny-v3", *x.backend);
    return x;
  }();
  return t;
}

Result run_mtp(const DeepseekV3Model& m, const std::vector<Request>& reqs, int k, const Opts& o, int stagger = 0,
               spec::MtpDraftSampling sampling = spec::MtpDraftSampling::kGreedy) {
  V3ModelRunner runner(m, o.max_num_seqs);
  if (k > 0) runner.set_proposer(std::make_unique<spec::MtpProposer>(m, o.max_num_seqs, sampling));
  return run_engine(runner, m.config(), reqs, k, o, stagger);
}

// V4-Flash base MTP (model/v4_mtp_draft.h) on a generated V4-shaped checkpoint with `mtp.0.*` weights.
Result run_v4_mtp(const DeepseekV4Model& m, const std::vector<Request>& reqs, int k, const Opts& o, int stagger = 0,
                  spec::MtpDraftSampling sampling = spec::MtpDraftSampling::kGreedy) {
  V4ModelRunner runner(m, o.max_num_seqs);
  if (k > 0) runner.set_proposer(std::make_unique<spec::V4MtpProposer>(m, o.max_num_seqs, sampling));
  return run_engine(runner, m.config(), reqs, k, o, stagger);
}

void print_acceptance(const std::string& what, const SpecStats& s) {
  std::cout << what << ": drafted " << s.drafted << ", accepted " << s.accepted << ", mean accepted length "
            << s.mean_accepted_length() << "\n";
}

const std::vector<TokenId> kText = {587, 2535, 305, 2607, 307};  // "The meaning of life is"

TEST(SpecEngineMtp, GreedyEqualsNonSpeculativeInABatch) {
  const DeepseekV3Model& m = *tiny().model;
  std::vector<Request> reqs;
  reqs.push_back(greedy_request("text", kText, 40));
  for (int i = 0; i < 5; ++i)
    reqs.push_back(
        greedy_request("r" + std::to_string(i), random_prompt(3 + 9 * i, i, m.config().vocab_size), 9 + 5 * i));
  Opts o;
  o.budget = 24;  // chunked prefill for the longer prompts
  const Result base = run_mtp(m, reqs, 0, o);
  for (int k : {1, 3}) {
    const Result spec = run_mtp(m, reqs, k, o);
    EXPECT_EQ(spec.out, base.out) << "k = " << k;
    EXPECT_GT(spec.stats.spec.accepted, 0);
    EXPECT_LT(spec.stats.steps, base.stats.steps) << "k = " << k;
    // Per-sequence counters add up to the engine's.
    int64_t drafted = 0, accepted = 0;
    for (const auto& [id, d] : spec.done) {
      drafted += d.spec.drafted;
      accepted += d.spec.accepted;
    }
    EXPECT_EQ(drafted, spec.stats.spec.drafted);
    EXPECT_EQ(accepted, spec.stats.spec.accepted);
    ASSERT_EQ(spec.stats.spec.drafted_at.size(), static_cast<size_t>(k));
    for (int j = 1; j < k; ++j) EXPECT_LE(spec.stats.spec.accepted_at[j], spec.stats.spec.accepted_at[j - 1]);
  }
}

// Four greedy requests of 30 tokens whose prompts share a 40-token prefix (prefix-cache hits under preemption).
std::vector<Request> shared_prefix_requests(uint64_t seed, int64_t vocab) {
  const std::vector<TokenId> shared = random_prompt(40, seed, vocab);
  std::vector<Request> reqs;
  for (int i = 0; i < 4; ++i) {
    std::vector<TokenId> p = shared;
    p.push_back(static_cast<TokenId>(100 + i));
    reqs.push_back(greedy_request("p" + std::to_string(i), p, 30));
  }
  return reqs;
}

// Speculation with k drafts under preemption and prefix-cache hits (shared_prefix_requests): the outputs of
// `run(reqs, k, opts)` equal those without speculation. Each sequence ends at 71 tokens = 5 blocks (2 of them the
// shared prefix), so 4 running sequences need 2 + 4 * 3 = 14 blocks; 8 hold one sequence's whole length
// (max_model_len 96 = 6 blocks) but not four. Returns the speculative run.
Result expect_lossless_under_preemption(const std::function<Result(const std::vector<Request>&, int, const Opts&)>& run,
                                        const std::vector<Request>& reqs, int k) {
  Opts o;
  o.num_blocks = 8;
  o.max_model_len = 96;
  const Result base = run(reqs, 0, o);
  Result spec = run(reqs, k, o);
  EXPECT_EQ(spec.out, base.out);
  EXPECT_GT(base.stats.preemptions, 0);
  EXPECT_GT(spec.stats.preemptions, 0);  // a speculating sequence was preempted and recomputed
  EXPECT_GT(spec.stats.spec.drafted, 0);
  int64_t cached = 0;
  for (const auto& [id, d] : spec.done) cached += d.num_cached_prompt_tokens;
  EXPECT_GT(cached, 0);
  return spec;
}

TEST(SpecEngineMtp, PreemptionAndPrefixCache) {
  const DeepseekV3Model& m = *tiny().model;
  const Result spec = expect_lossless_under_preemption(
      [&](const auto& reqs, int k, const Opts& o) { return run_mtp(m, reqs, k, o, /*stagger=*/1); },
      shared_prefix_requests(77, m.config().vocab_size), 2);
  EXPECT_GT(spec.stats.spec.accepted, 0);
}

TEST(SpecEngineMtp, StopsInsideAnAcceptedRun) {
  const DeepseekV3Model& m = *tiny().model;
  const Result free_run = run_mtp(m, {greedy_request("a", kText, 40)}, 0, {});
  const std::vector<TokenId>& g = free_run.out.at("a");
  ASSERT_EQ(g.size(), 40u);
  // Stop token ids: each of several generated tokens in turn; and max_tokens of every length 1..12.
  for (size_t at : {3u, 8u, 15u, 22u}) {
    Request r = greedy_request("a", kText, 40);
    r.params.stop_token_ids = {g[at]};
    const Result base = run_mtp(m, {r}, 0, {});
    const Result spec = run_mtp(m, {r}, 3, {});
    EXPECT_EQ(spec.out, base.out) << "stop token " << g[at];
    EXPECT_EQ(spec.done.at("a").stop_reason, StopReason::kStopToken);
  }
  for (int n = 1; n <= 12; ++n) {
    const Result spec = run_mtp(m, {greedy_request("a", kText, n)}, 3, {});
    EXPECT_EQ(spec.out.at("a"), std::vector<TokenId>(g.begin(), g.begin() + n)) << "max_tokens " << n;
    EXPECT_EQ(spec.done.at("a").stop_reason, StopReason::kMaxTokens);
  }
}

TEST(SpecEngineMtp, SeededSamplingIsDeterministicAndLogprobsMatch) {
  const DeepseekV3Model& m = *tiny().model;
  Request r = greedy_request("s", kText, 24);
  r.params.temperature = 0.8f;
  r.params.top_k = 20;
  r.params.seed = 11;
  r.params.logprobs = 2;
  const Result a = run_mtp(m, {r}, 2, {});
  const Result b = run_mtp(m, {r}, 2, {});
  EXPECT_EQ(a.out, b.out);
  ASSERT_EQ(a.done.at("s").logprobs.size(), 24u);
  // Greedy with logprobs: speculative logprobs equal the plain ones (same raw rows up to float noise).
  Request gq = greedy_request("g", kText, 16);
  gq.params.logprobs = 1;
  const Result gp = run_mtp(m, {gq}, 0, {}), gs = run_mtp(m, {gq}, 3, {});
  ASSERT_EQ(gs.out, gp.out);
  for (size_t i = 0; i < 16; ++i)
    EXPECT_NEAR(gs.done.at("g").logprobs[i].logprob, gp.done.at("g").logprobs[i].logprob, 1e-4);
}

// Lossless sampling through the engine: the MTP drafts are greedy point masses, accepted with probability p(d)
// and otherwise replaced by a draw from the residual, so the speculative outputs use other random draws than the
// plain sampler but must have the same distribution. Two-sample Pearson chi-square on the output tokens at the
// verified positions (1 and 2; position 0 comes from the prefill row) over 240 seeds per run (disjoint seeds, so
// the two samples are independent), against the 0.1%
// critical value; a run at another temperature shows the statistic does detect a different distribution.
double two_sample_chi_square(const std::vector<TokenId>& a, const std::vector<TokenId>& b, int* df) {
  std::map<TokenId, std::pair<int, int>> counts;
  for (TokenId t : a) ++counts[t].first;
  for (TokenId t : b) ++counts[t].second;
  // Rare tokens pooled into one bin so every bin has an expected count of at least 5 per run.
  std::vector<std::pair<int, int>> bins;
  std::pair<int, int> rare{0, 0};
  for (const auto& [t, c] : counts) {
    if (c.first + c.second >= 10) {
      bins.push_back(c);
    } else {
      rare.first += c.first;
      rare.second += c.second;
    }
  }
  if (rare.first + rare.second > 0) bins.push_back(rare);
  double chi2 = 0;
  for (const auto& [x, y] : bins) chi2 += static_cast<double>(x - y) * (x - y) / (x + y);
  *df = static_cast<int>(bins.size()) - 1;
  return chi2;
}

// Upper 0.1% point of chi-square with df degrees of freedom (Wilson-Hilferty).
double chi_square_critical(int df) {
  const double k = df, z = 3.09;
  const double c = 1 - 2 / (9 * k) + z * std::sqrt(2 / (9 * k));
  return k * c * c * c;
}

TEST(SpecEngineMtp, SampledOutputsKeepTheDistribution) {
  const DeepseekV3Model& m = *tiny().model;
  constexpr int kSeeds = 240;
  auto run = [&](int k, float temperature, uint64_t seed_base, int max_tokens = 3) {
    const std::vector<Request> reqs = seeded_requests(kSeeds, kText, max_tokens, temperature, 6, seed_base);
    Opts o;
    o.max_num_seqs = 32;
    o.budget = 256;
    o.num_blocks = 64;
    const Result res = run_mtp(m, reqs, k, o);
    std::array<std::vector<TokenId>, 3> at;
    for (const auto& [id, toks] : res.out) {
      EXPECT_EQ(toks.size(), static_cast<size_t>(max_tokens));
      for (size_t j = 0; j < toks.size() && j < 3; ++j) at[j].push_back(toks[j]);
    }
    return std::make_pair(at, res.stats.spec);
  };
  const auto [plain, plain_stats] = run(0, 1.0f, 1000);
  const auto [spec, spec_stats] = run(2, 1.0f, 5000);
  EXPECT_GT(spec_stats.accepted, 0);
  EXPECT_LT(spec_stats.accepted, spec_stats.drafted);  // rejections (residual draws) happened too
  for (int j = 1; j < 3; ++j) {
    int df = 0;
    const double chi2 = two_sample_chi_square(plain[j], spec[j], &df);
    ASSERT_GE(df, 3) << "position " << j;
    EXPECT_LT(chi2, chi_square_critical(df)) << "position " << j << ", df " << df;
    std::cout << "position " << j << ": chi-square " << chi2 << ", df " << df << ", 0.1% critical "
              << chi_square_critical(df) << "\n";
  }
  // Power: the same statistic separates temperature 1.0 from 0.5 at position 1.
  const auto [cold, cold_stats] = run(0, 0.5f, 9000, 2);
  int df = 0;
  const double chi2 = two_sample_chi_square(plain[1], cold[1], &df);
  EXPECT_GT(chi2, chi_square_critical(df));
  std::cout << "temperature 1.0 vs 0.5 at position 1: chi-square " << chi2 << ", df " << df << "\n";
}

// A random V3 checkpoint with MTP weights: drafts are mostly wrong, so almost every step rolls back.
TEST(SpecEngineMtp, RandomCheckpointGreedyEquals) {
  testing::TempDir dir;
  RandomCheckpointOptions ro;
  ro.config_path = testing::test_data_dir() + "/configs/deepseek_v3.json";
  ro.out_dir = dir.path();
  ro.seed = 21;
  write_random_checkpoint(ro);
  auto backend = make_cpu_backend(1);
  auto m = DeepseekV3Model::load(dir.path(), *backend);
  std::vector<Request> reqs;
  for (int i = 0; i < 3; ++i)
    reqs.push_back(greedy_request("r" + std::to_string(i), random_prompt(5 + 7 * i, 40 + i, 768), 12));
  const Result base = run_mtp(*m, reqs, 0, {});
  const Result spec = run_mtp(*m, reqs, 2, {});
  EXPECT_EQ(spec.out, base.out);
  EXPECT_GT(spec.stats.spec.drafted, 0);
}

// Sampled MTP drafts (MtpDraftSampling::kSampled): drafts drawn from the module's q = softmax(logits / T) and
// verified with q by the rejection sampler. The same two-sample chi-square test as above against plain sampling,
// at the verified positions 1 and 2; the trained tiny MTP layer's sampled drafts are accepted often and rejected
// often, so both branches of the sampler (min(1, p/q) acceptance, residual norm(max(0, p − q))) are exercised.
TEST(SpecEngineMtp, SampledDraftsKeepTheDistribution) {
  const DeepseekV3Model& m = *tiny().model;
  constexpr int kSeeds = 240;
  auto run = [&](int k, uint64_t seed_base, spec::MtpDraftSampling sampling) {
    const std::vector<Request> reqs = seeded_requests(kSeeds, kText, 3, 1.0f, 6, seed_base);
    Opts o;
    o.max_num_seqs = 32;
    o.budget = 256;
    const Result res = run_mtp(m, reqs, k, o, 0, sampling);
    std::array<std::vector<TokenId>, 3> at;
    for (const auto& [id, toks] : res.out)
      for (size_t j = 0; j < toks.size() && j < 3; ++j) at[j].push_back(toks[j]);
    return std::make_pair(at, res.stats.spec);
  };
  const auto [plain, plain_stats] = run(0, 1000, spec::MtpDraftSampling::kGreedy);
  const auto [spec, spec_stats] = run(2, 5000, spec::MtpDraftSampling::kSampled);
  print_acceptance("sampled MTP drafts", spec_stats);
  EXPECT_GT(spec_stats.accepted, spec_stats.drafted / 10);
  EXPECT_LT(spec_stats.accepted, spec_stats.drafted);
  for (int j = 1; j < 3; ++j) {
    int df = 0;
    const double chi2 = two_sample_chi_square(plain[j], spec[j], &df);
    ASSERT_GE(df, 3) << "position " << j;
    EXPECT_LT(chi2, chi_square_critical(df)) << "position " << j << ", df " << df;
    std::cout << "sampled drafts, position " << j << ": chi-square " << chi2 << ", df " << df << ", 0.1% critical "
              << chi_square_critical(df) << "\n";
  }
}

// V4-Flash base MTP through the engine: the target hands the module its final streams of every verified position,
// the module drafts (random weights: mostly wrong, so nearly every step rolls the target's V4 caches and the
// module's window back), and greedy output equals greedy output without speculation token for token, in a batch
// with chunked prefill across the module's window (16) and ring.
// On an 8-token vocabulary the random module's drafts are right now and then: partial acceptance and rollback of
// the rest.
TEST(SpecEngineMtp, V4FlashGreedyEqualsNonSpeculativeInABatch) {
  for (int64_t vocab : {0, 8}) {
    const DeepseekV4Model& m = *testing::v4_mtp_fixture(vocab).model;
    std::vector<Request> reqs;
    for (int i = 0; i < 4; ++i)
      reqs.push_back(greedy_request("r" + std::to_string(i), random_prompt(5 + 12 * i, 500 + i, m.config().vocab_size),
                                    14 + 3 * i));
    Opts o;
    o.budget = 16;  // chunked prefill
    const Result base = run_v4_mtp(m, reqs, 0, o);
    for (int k : {1, 3}) {
      const std::string what = "vocab " + std::to_string(m.config().vocab_size) + " k " + std::to_string(k);
      const Result spec = run_v4_mtp(m, reqs, k, o);
      EXPECT_EQ(spec.out, base.out) << what;
      EXPECT_GT(spec.stats.spec.drafted, 0) << what;
      if (vocab == 8) {
        EXPECT_GT(spec.stats.spec.accepted, 0) << what;
        EXPECT_LT(spec.stats.spec.accepted, spec.stats.spec.drafted) << what;
      }
      print_acceptance("V4 MTP " + what, spec.stats.spec);
    }
  }
}

TEST(SpecEngineMtp, V4FlashPreemptionAndPrefixCache) {
  const DeepseekV4Model& m = *testing::v4_mtp_fixture().model;
  expect_lossless_under_preemption(
      [&](const auto& reqs, int k, const Opts& o) { return run_v4_mtp(m, reqs, k, o, /*stagger=*/1); },
      shared_prefix_requests(73, m.config().vocab_size), 3);
}

// Sampled V4 MTP drafts on an 8-token vocabulary (so the random module's drafts are accepted a measurable fraction
// of the time): outputs keep the distribution of plain sampling.
TEST(SpecEngineMtp, V4FlashSampledDraftsKeepTheDistribution) {
  const DeepseekV4Model& m = *testing::v4_mtp_fixture(/*vocab=*/8).model;
  constexpr int kSeeds = 240;
  const std::vector<TokenId> prompt = random_prompt(9, 6, m.config().vocab_size);
  auto run = [&](int k, uint64_t seed_base) {
    const std::vector<Request> reqs = seeded_requests(kSeeds, prompt, 4, 1.5f, 0, seed_base);
    Opts o;
    o.max_num_seqs = 32;
    o.budget = 256;
    const Result res = run_v4_mtp(m, reqs, k, o, 0, spec::MtpDraftSampling::kSampled);
    std::array<std::vector<TokenId>, 3> at;
    for (const auto& [id, toks] : res.out)
      for (size_t j = 0; j < toks.size() && j < 3; ++j) at[j].push_back(toks[j]);
    return std::make_pair(at, res.stats.spec);
  };
  const auto [plain, plain_stats] = run(0, 1000);
  const auto [spec, spec_stats] = run(2, 5000);
  print_acceptance("V4 sampled MTP drafts", spec_stats);
  EXPECT_GT(spec_stats.accepted, 10);
  EXPECT_LT(spec_stats.accepted, spec_stats.drafted);
  for (int j = 1; j < 3; ++j) {
    int df = 0;
    const double chi2 = two_sample_chi_square(plain[j], spec[j], &df);
    ASSERT_GE(df, 3) << "position " << j;
    EXPECT_LT(chi2, chi_square_critical(df)) << "position " << j << ", df " << df;
    std::cout << "V4 sampled drafts, position " << j << ": chi-square " << chi2 << ", df " << df << "\n";
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Scripted proposer: knows each prompt's greedy continuation and drafts it, wrong at every third position. It
// tracks each slot's tokens from observe (reset prefix + kept ids + next token), as a real proposer must.

class ScriptedProposer final : public spec::Proposer {
 public:
  ScriptedProposer(std::map<std::vector<TokenId>, std::pair<size_t, std::vector<TokenId>>> script, int64_t vocab,
                   int slots)
      : script_(std::move(script)), vocab_(vocab), hist_(slots) {}
  std::string_view name() const override { return "scripted"; }
  int64_t feature_dim() const override { return 0; }
  void observe(const spec::TargetChunk& c) override {
    auto& h = hist_.at(c.slot);
    if (c.reset) h.assign(c.prefix_ids.begin(), c.prefix_ids.end());
    ASSERT_LE(c.start, static_cast<int64_t>(h.size()));
    h.resize(c.start);
    h.insert(h.end(), c.ids.begin(), c.ids.end());
    if (c.next_token) h.push_back(*c.next_token);
    ++observed;
  }
  spec::Draft propose(const spec::DraftRequest& req) override {
    const auto& h = hist_.at(req.slot);
    EXPECT_EQ(static_cast<int64_t>(h.size()), req.position);
    spec::Draft d;
    for (const auto& [prompt, cont] : script_) {
      const size_t plen = cont.first;
      if (h.size() < plen || !std::equal(prompt.begin(), prompt.end(), h.begin())) continue;
      for (int j = 0; j < req.max_tokens; ++j) {
        const size_t idx = h.size() - plen + j;
        TokenId t = idx < cont.second.size() ? cont.second[idx] : 0;
        if ((req.position + j) % 3 == 0) t = static_cast<TokenId>((t + 1) % vocab_);
        d.tokens.push_back(t);
      }
    }
    return d;
  }
  int observed = 0;

 private:
  std::map<std::vector<TokenId>, std::pair<size_t, std::vector<TokenId>>> script_;
  int64_t vocab_;
  std::vector<std::vector<TokenId>> hist_;
};

template <typename Model, typename Runner>
Result scripted_equals(const Model& m, const std::vector<Request>& reqs, const Opts& o, int stagger = 0,
                       ModelRunnerOptions ro = {}) {
  Runner plain(m, o.max_num_seqs, ro);
  const Result base = run_engine(plain, m.config(), reqs, 0, o, stagger);
  std::map<std::vector<TokenId>, std::pair<size_t, std::vector<TokenId>>> script;
  for (const Request& r : reqs) script[r.prompt_token_ids] = {r.prompt_token_ids.size(), base.out.at(r.request_id)};
  Runner runner(m, o.max_num_seqs, ro);
  auto p = std::make_unique<ScriptedProposer>(script, m.config().vocab_size, o.max_num_seqs);
  runner.set_proposer(std::move(p));
  Result spec = run_engine(runner, m.config(), reqs, 3, o, stagger);
  EXPECT_EQ(spec.out, base.out);
  EXPECT_GT(spec.stats.spec.accepted, 0);
  EXPECT_LT(spec.stats.spec.accepted, spec.stats.spec.drafted);  // partial acceptance: rollbacks happened
  return spec;
}

TEST(SpecEngineScripted, V3GoldenRollback) {
  auto backend = make_cpu_backend(1);
  auto m = DeepseekV3Model::load(testing::test_data_dir() + "/golden/deepseek_v3", *backend);
  std::vector<Request> reqs;
  for (int i = 0; i < 3; ++i)
    reqs.push_back(greedy_request("r" + std::to_string(i), random_prompt(4 + 11 * i, 60 + i, 768), 20));
  scripted_equals<DeepseekV3Model, V3ModelRunner>(*m, reqs, {});
  Opts o;
  o.budget = 16;
  scripted_equals<DeepseekV3Model, V3ModelRunner>(*m, reqs, o);
}

// V4 / V4.1 (DeepseekV4Model::truncate): paged windows, compressed entries and indexer keys, slot rings (V4.1 bounded
// replay's decoder windows), compressor state and Engram look-back rolled back after every partial acceptance, in a
// batch with chunked prefill.
std::vector<Request> golden_requests(int64_t vocab) {
  std::vector<Request> reqs;
  for (int i = 0; i < 3; ++i)
    reqs.push_back(greedy_request("r" + std::to_string(i), random_prompt(4 + 11 * i, 80 + i, vocab), 24));
  return reqs;
}

TEST(SpecEngineScripted, V4GoldenRollback) {
  auto backend = make_cpu_backend(1);
  auto m = DeepseekV4Model::load(testing::test_data_dir() + "/golden/deepseek_v4", *backend);
  Opts o;
  o.budget = 16;  // chunked prefill of the longer prompts
  scripted_equals<DeepseekV4Model, V4ModelRunner>(*m, golden_requests(m->config().vocab_size), o);
}

TEST(SpecEngineScripted, V41GoldenRollbackBoundedAndExact) {
  auto backend = make_cpu_backend(1);
  auto m = DeepseekV4Model::load(testing::test_data_dir() + "/golden/deepseek_v41", *backend);
  Opts o;
  o.budget = 16;
  for (bool exact : {false, true}) {
    SCOPED_TRACE(exact ? "exact prefill" : "bounded replay");
    ModelRunnerOptions ro;
    ro.exact_prefill = exact;
    scripted_equals<DeepseekV4Model, V4ModelRunner>(*m, golden_requests(m->config().vocab_size), o, 0, ro);
  }
}

// Prefix-cache hits (a shared 40-token prefix) and preemption with recompute while speculating on V4 and V4.1.
TEST(SpecEngineScripted, V4FamilyPreemptionAndPrefixCache) {
  for (const char* family : {"deepseek_v4", "deepseek_v41"}) {
    SCOPED_TRACE(family);
    auto backend = make_cpu_backend(1);
    auto m = DeepseekV4Model::load(testing::test_data_dir() + "/golden/" + family, *backend);
    const std::vector<TokenId> shared = random_prompt(40, 91, m->config().vocab_size);
    std::vector<Request> reqs;
    for (int i = 0; i < 4; ++i) {
      std::vector<TokenId> p = shared;
      p.push_back(static_cast<TokenId>(100 + i));
      reqs.push_back(greedy_request("p" + std::to_string(i), p, 30));
    }
    Opts o;
    o.num_blocks = 8;  // as in SpecEngineMtp.PreemptionAndPrefixCache: room for one whole sequence, not four
    o.max_model_len = 96;
    const Result spec = scripted_equals<DeepseekV4Model, V4ModelRunner>(*m, reqs, o, /*stagger=*/1);
    EXPECT_GT(spec.stats.preemptions, 0);
    int64_t cached = 0;
    for (const auto& [id, d] : spec.done) cached += d.num_cached_prompt_tokens;
    EXPECT_GT(cached, 0);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// DSpark proposer through the engine, on generated V4.1 and V4-Flash-0731-shaped checkpoints that carry DSpark draft
// weights (tests/model/dspark_fixture.h): the draft reads the target's captured layer streams of every verified
// position (V4.1 bounded replay: NaN rows for the prompt part the decoder skipped), drafts a block, the confidence
// policy picks each request's verification length within the step's draft budget, and the target rolls back.

Result run_dspark(const DeepseekV4Model& m, const std::vector<Request>& reqs, int k, const Opts& o, int stagger = 0) {
  V4ModelRunner runner(m, o.max_num_seqs);
  if (k > 0) runner.set_proposer(std::make_unique<spec::DsparkProposer>(m, o.max_num_seqs));
  return run_engine(runner, m.config(), reqs, k, o, stagger);
}

TEST(SpecEngineDspark, GreedyEqualsNonSpeculativeInABatch) {
  for (const char* family : {"deepseek_v41", "deepseek_v4"}) {
    SCOPED_TRACE(family);
    const DeepseekV4Model& m = *testing::dspark_fixture(family).model;
    std::vector<Request> reqs;
    for (int i = 0; i < 4; ++i)
      reqs.push_back(greedy_request("r" + std::to_string(i), random_prompt(5 + 12 * i, 300 + i, m.config().vocab_size),
                                    14 + 3 * i));
    Opts o;
    o.budget = 16;  // chunked prefill; V4.1 prompts longer than the decoder window run bounded replay
    const Result base = run_dspark(m, reqs, 0, o);
    struct Case {
      int k;
      double threshold;
      int64_t draft_budget;
    };
    for (const Case& c : {Case{4, 0.0, 0}, Case{5, 0.3, 3}, Case{3, 0.0, 1}}) {
      Opts so = o;
      so.threshold = c.threshold;
      so.draft_budget = c.draft_budget;
      const Result spec = run_dspark(m, reqs, c.k, so);
      const std::string what = std::string(family) + " k " + std::to_string(c.k) + " threshold " +
                               std::to_string(c.threshold) + " budget " + std::to_string(c.draft_budget);
      EXPECT_EQ(spec.out, base.out) << what;
      EXPECT_GT(spec.stats.spec.drafted, 0) << what;
      // Acceptance statistics per draft position, up to the longest run verified: k (DSpark drafts min(k, block
      // size 5)), or fewer when the per-step draft budget caps every verification below k.
      const size_t longest = static_cast<size_t>(c.draft_budget > 0 ? std::min<int64_t>(c.k, c.draft_budget) : c.k);
      ASSERT_GE(spec.stats.spec.drafted_at.size(), 1u) << what;
      ASSERT_LE(spec.stats.spec.drafted_at.size(), longest) << what;
      ASSERT_EQ(spec.stats.spec.accepted_at.size(), spec.stats.spec.drafted_at.size()) << what;
      if (c.threshold == 0 && c.draft_budget == 0)  // no policy cap: some step verified all k drafts
        EXPECT_EQ(spec.stats.spec.drafted_at.size(), static_cast<size_t>(c.k)) << what;
      for (size_t j = 1; j < spec.stats.spec.drafted_at.size(); ++j)
        EXPECT_LE(spec.stats.spec.drafted_at[j], spec.stats.spec.drafted_at[j - 1]);
      // A per-step cap of one draft token: never more drafts than steps.
      if (c.draft_budget == 1) EXPECT_LE(spec.stats.spec.drafted, spec.stats.steps) << what;
      print_acceptance(what, spec.stats.spec);
    }
  }
}

TEST(SpecEngineDspark, PreemptionAndPrefixCache) {
  const DeepseekV4Model& m = *testing::dspark_fixture("deepseek_v41").model;
  expect_lossless_under_preemption(
      [&](const auto& reqs, int k, const Opts& o) { return run_dspark(m, reqs, k, o, /*stagger=*/1); },
      shared_prefix_requests(71, m.config().vocab_size), 4);
}

// Lossless sampling with DSpark drafts (greedy point masses from the Markov head, accepted with probability p(d)):
// the same two-sample chi-square test as for MTP, at the verified output positions 1 and 2. The random drafter knows
// nothing of the random target, so on the golden 512-token vocabulary (with top-k 4) its drafts are practically never
// among the sampled tokens and nothing would be tested (0 accepted of ~500); on an 8-token vocabulary at temperature
// 1.5 without top-k a draft has probability ~1/8 under the target, so a measurable fraction is accepted and the rest
// take the residual path. The power check shows the statistic separates temperature 1.5 from 0.5 at position 1.
TEST(SpecEngineDspark, SampledOutputsKeepTheDistribution) {
  const DeepseekV4Model& m = *testing::dspark_fixture("deepseek_v41", /*vocab=*/8).model;
  constexpr int kSeeds = 240;
  const std::vector<TokenId> prompt = random_prompt(9, 5, m.config().vocab_size);
  auto run = [&](int k, float temperature, uint64_t seed_base, double threshold = 0) {
    const std::vector<Request> reqs = seeded_requests(kSeeds, prompt, 4, temperature, 0, seed_base);
    Opts o;
    o.max_num_seqs = 32;
    o.budget = 256;
    o.threshold = threshold;
    const Result res = run_dspark(m, reqs, k, o);
    std::array<std::vector<TokenId>, 3> at;
    for (const auto& [id, toks] : res.out) {
      EXPECT_EQ(toks.size(), 4u);
      for (size_t j = 0; j < toks.size() && j < 3; ++j) at[j].push_back(toks[j]);
    }
    return std::make_pair(at, res.stats.spec);
  };
  constexpr float kTemperature = 1.5f;
  const auto [plain, plain_stats] = run(0, kTemperature, 1000);
  EXPECT_EQ(plain_stats.drafted, 0);
  struct Case {
    int k;
    double threshold;
  };
  for (const Case c : {Case{2, 0.0}, Case{2, 0.3}}) {
    const auto [spec, spec_stats] = run(c.k, kTemperature, 5000, c.threshold);
    const std::string what = "k " + std::to_string(c.k) + " threshold " + std::to_string(c.threshold);
    print_acceptance("sampled " + what, spec_stats);
    // Drafts must be accepted a measurable fraction of the time (else the acceptance branch is untested) and
    // rejected too (the residual draws).
    EXPECT_GE(spec_stats.accepted, spec_stats.drafted / 20) << what;
    EXPECT_GT(spec_stats.accepted, 10) << what;
    EXPECT_LT(spec_stats.accepted, spec_stats.drafted) << what;
    for (int j = 1; j < 3; ++j) {
      int df = 0;
      const double chi2 = two_sample_chi_square(plain[j], spec[j], &df);
      ASSERT_GE(df, 3) << what << ", position " << j;
      EXPECT_LT(chi2, chi_square_critical(df)) << what << ", position " << j << ", df " << df;
      std::cout << what << " position " << j << ": chi-square " << chi2 << ", df " << df << ", 0.1% critical "
                << chi_square_critical(df) << "\n";
    }
  }
  // Power: the same statistic separates temperature 1.5 from 0.5 at position 1.
  const auto [cold, cold_stats] = run(0, 0.5f, 9000);
  int df = 0;
  const double chi2 = two_sample_chi_square(plain[1], cold[1], &df);
  EXPECT_GT(chi2, chi_square_critical(df));
  std::cout << "temperature 1.5 vs 0.5 at position 1: chi-square " << chi2 << ", df " << df << "\n";
}

// ---------------------------------------------------------------------------------------------------------------
// Structured output through the speculative engine: every verification row is masked exactly as the plain sampler
// masks it (the grammar matcher advanced over the accepted drafts), a draft the grammar forbids is rejected there,
// and the matcher only ever advances over emitted tokens, so rejected drafts leave no grammar state to roll back.
// Constrained greedy with drafts must equal constrained greedy without, token for token.

// A byte vocabulary over the model's ids: 0 <s>, 1 </s> (EOS), then printable ASCII; the other ids have no bytes
// (never allowed under a grammar).
std::shared_ptr<structured::GrammarCompiler> byte_compiler(int64_t model_vocab) {
  std::vector<std::string> bytes{"<s>", "</s>"};
  for (int c = 0x20; c < 0x7F; ++c) bytes.push_back(std::string(1, static_cast<char>(c)));
  std::vector<bool> special(bytes.size(), false);
  special[0] = special[1] = true;
  return std::make_shared<structured::GrammarCompiler>(std::make_shared<const structured::TokenizerInfo>(
      structured::Vocabulary(std::move(bytes), {1}, std::move(special), static_cast<size_t>(model_vocab))));
}

std::string bytes_of(const std::vector<TokenId>& ids) {
  std::string s;
  for (TokenId t : ids)
    if (t >= 2 && t < 2 + 0x5F) s.push_back(static_cast<char>(0x20 + t - 2));
  return s;
}

constexpr const char* kStructuredRegex = "[a-z]{2,6}@[a-z]{3,5}\\.(com|org|net); id=[0-9]{4,9}";

std::vector<Request> structured_requests(int64_t vocab) {
  std::vector<Request> reqs;
  for (int i = 0; i < 3; ++i) {
    Request r = greedy_request("g" + std::to_string(i), random_prompt(6 + 9 * i, 500 + i, vocab), 40);
    r.params.ignore_eos = false;  // the grammar decides where EOS is allowed
    r.params.structured = i == 2 ? StructuredOutputParams::json_schema(
                                       R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"string",)"
                                       R"("maxLength":6}},"required":["a","b"],"additionalProperties":false})")
                                 : StructuredOutputParams::regex(kStructuredRegex);
    r.params.structured.max_whitespace = 0;
    reqs.push_back(r);
  }
  return reqs;
}

void expect_structured(const Result& r) {
  for (const auto& [id, toks] : r.out) {
    const std::string text = bytes_of(toks);
    if (id == "g2") {
      const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
      // JSON Schema integers include numbers with a zero fraction (62.0); keys may come in any order.
      const bool integer_a = j.is_object() && j.contains("a") && j["a"].is_number() &&
                             std::floor(j["a"].get<double>()) == j["a"].get<double>();
      EXPECT_TRUE(integer_a && j.contains("b") && j["b"].is_string() && j.size() == 2) << id << ": " << text;
    } else {
      EXPECT_TRUE(std::regex_match(text, std::regex(kStructuredRegex))) << id << ": " << text;
    }
  }
}

// Scripted drafts (the constrained greedy continuation, wrong at every third position: often a token the grammar
// forbids) on the V3 golden fixture: partial acceptance, masked rejections, rollback.
TEST(SpecEngineStructured, ConstrainedGreedyEqualsPlainScripted) {
  auto backend = make_cpu_backend(1);
  auto m = DeepseekV3Model::load(testing::test_data_dir() + "/golden/deepseek_v3", *backend);
  Opts o;
  o.budget = 16;
  o.compiler = byte_compiler(m->config().vocab_size);
  const Result spec =
      scripted_equals<DeepseekV3Model, V3ModelRunner>(*m, structured_requests(m->config().vocab_size), o);
  expect_structured(spec);
  for (const auto& [id, d] : spec.done) EXPECT_EQ(d.stop_reason, StopReason::kEos) << id;
}

// DSpark drafts (random drafter: mostly forbidden or wrong tokens) on the V4.1 fixture, k 4 with the confidence
// policy, and with the MTP drafter on the tiny model.
TEST(SpecEngineStructured, ConstrainedGreedyEqualsPlainDsparkAndMtp) {
  {
    const DeepseekV4Model& m = *testing::dspark_fixture("deepseek_v41").model;
    Opts o;
    o.compiler = byte_compiler(m.config().vocab_size);
    const std::vector<Request> reqs = structured_requests(m.config().vocab_size);
    const Result base = run_dspark(m, reqs, 0, o);
    expect_structured(base);
    for (double threshold : {0.0, 0.3}) {
      o.threshold = threshold;
      const Result spec = run_dspark(m, reqs, 4, o);
      EXPECT_EQ(spec.out, base.out) << "threshold " << threshold;
      EXPECT_GT(spec.stats.spec.drafted, 0);
    }
  }
  {
    const DeepseekV3Model& m = *tiny().model;
    Opts o;
    o.compiler = byte_compiler(m.config().vocab_size);
    const std::vector<Request> reqs = structured_requests(m.config().vocab_size);
    const Result base = run_mtp(m, reqs, 0, o);
    expect_structured(base);
    const Result spec = run_mtp(m, reqs, 3, o);
    EXPECT_EQ(spec.out, base.out);
    EXPECT_GT(spec.stats.spec.drafted, 0);
  }
}

}  // namespace
}  // namespace deepinfer
