// End-to-end engine tests with a deterministic test ModelRunner. The runner is a real (tiny) model of a cache:
//   - a paged "persistent" kind: the token id at each position, stored at block_table[pos / bs] * bs + pos % bs;
//   - a per-slot state: a ring of the last kWindow tokens (like an SWA ring), reset when reset_state is set;
//   - logits of the last position = a hash of (every cached token read back through the block table, the ring,
//     the position), so a wrong block table, a stale or overwritten prefix block, a lost ring or a bad replay
//     changes the output. It also checks the batch against the engine's contract (budgets, slots, replay).
// Because logits are a function of the token history alone, outputs must be identical with and without
// preemption, chunking or prefix hits: that is what the tests assert.
#include "deepinfer/engine/engine.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <set>

#include "deepinfer/core/error.h"
#include "deepinfer/sampling/rng.h"

namespace deepinfer {
namespace {

constexpr int kVocab = 64;
constexpr int kWindow = 4;
constexpr int kBlockSize = 4;
constexpr TokenId kPoison = -1;

class TestRunner final : public ModelRunner {
 public:
  // ring_window 0: no per-sequence state (like V3's MLA, fully prefix-reusable).
  TestRunner(int32_t num_blocks, int32_t num_slots, const SchedulerConfig& sc, int ring_window = kWindow)
      : storage_(static_cast<size_t>(num_blocks) * kBlockSize, kPoison),
        rings_(num_slots),
        sc_(sc),
        window_(ring_window) {}

  int64_t vocab_size() const override { return kVocab; }

  void execute(const ModelBatch& batch, std::span<float> logits) override {
    // Before touching any state, as a workspace allocation at the start of a forward pass would fail.
    if (++steps == throw_on_step || (throw_from_step > 0 && steps >= throw_from_step)) {
      for (const BatchEntry& e : batch.entries) failed_seqs_.insert(e.seq_id);
      DI_FAIL(ErrorCode::kResourceExhausted) << "workspace allocation failed (injected) in step " << steps;
    }
    EXPECT_LE(batch.num_tokens, sc_.max_num_batched_tokens) << "token budget exceeded";
    EXPECT_LE(static_cast<int>(batch.entries.size()), sc_.max_num_seqs) << "max_num_seqs exceeded";
    EXPECT_EQ(batch.block_size, kBlockSize);
    max_batch_tokens = std::max(max_batch_tokens, batch.num_tokens);
    std::set<int32_t> slots;
    int64_t row = 0;
    for (const BatchEntry& e : batch.entries) {
      if (failed_seqs_.count(e.seq_id)) {
        // In a step launched behind the failed one (asynchronous scheduling): its cache was never written and the
        // engine discards this row, so only the row count matters.
        if (e.needs_logits) std::fill_n(logits.data() + row++ * kVocab, kVocab, 0.0f);
        continue;
      }
      if (seen_.insert(e.seq_id).second) admission_order.push_back(e.seq_id);
      EXPECT_TRUE(slots.insert(e.state_slot).second) << "two entries share state slot " << e.state_slot;
      EXPECT_GE(static_cast<int64_t>(e.block_table.size()) * kBlockSize, e.end()) << "block table too short";
      auto& ring = rings_.at(e.state_slot);
      if (e.reset_state) {
        ring.clear();
      } else {
        EXPECT_EQ(ring_end_.at(e.state_slot), e.start) << "slot state does not continue where it stopped";
      }
      const std::vector<int64_t> ids = resolve_token_ids(batch, e);  // a pending token comes from the last step
      if (e.pending_row >= 0) ++pending_inputs;
      for (int64_t i = 0; i < static_cast<int64_t>(ids.size()); ++i) {
        const int64_t pos = e.start + i;
        const TokenId tok = static_cast<TokenId>(ids[i]);
        EXPECT_TRUE(tok >= 0 && tok < kVocab) << "unresolved or invalid token " << tok << " at position " << pos;
        TokenId& cell = storage_[e.block_table[pos / kBlockSize] * kBlockSize + pos % kBlockSize];
        if (pos < e.persistent_until) {
          EXPECT_EQ(cell, tok) << "replayed position " << pos << " disagrees with the cached block";
          ++replayed_tokens;
        } else {
          cell = tok;
          ++computed_tokens;
        }
        ring.push_back(tok);
        if (static_cast<int>(ring.size()) > window_) ring.erase(ring.begin());
      }
      ring_end_[e.state_slot] = e.end();
      if (!e.needs_logits) continue;
      const int64_t last = e.end() - 1;
      // Read the whole history back through the block table.
      uint64_t h = mix64(static_cast<uint64_t>(last));
      for (int64_t pos = 0; pos <= last; ++pos) {
        const TokenId t = storage_[e.block_table[pos / kBlockSize] * kBlockSize + pos % kBlockSize];
        EXPECT_NE(t, kPoison) << "read of an unwritten cache position " << pos;
        h = mix64(h ^ static_cast<uint64_t>(t + 1));
      }
      // The ring must equal the last kWindow tokens, whatever path (chunks, replay) built it.
      const int64_t ring_from = std::max<int64_t>(0, last + 1 - window_);
      if (static_cast<int64_t>(ring.size()) != last + 1 - ring_from) {
        ++ring_violations;
        EXPECT_FALSE(strict) << "ring lost tokens: " << ring.size() << " of " << last + 1 - ring_from;
      }
      for (TokenId t : ring) h = mix64(h ^ static_cast<uint64_t>(t + 7));
      float* out = logits.data() + row++ * kVocab;
      for (int t = 0; t < kVocab; ++t) out[t] = static_cast<float>(mix64(h + t) % 1000) / 250.0f;  // [0, 4)
      if (force_next) out[(ids.back() + 1) % kVocab] = 50.0f;  // "counting" model: next = last + 1
      if (nan_for_seq == e.seq_id) out[0] = std::numeric_limits<float>::quiet_NaN();
    }
    EXPECT_EQ(row, batch.num_logits_rows);
  }

  void release_slot(int32_t slot) override { ring_end_.erase(slot); }

  std::vector<int64_t> admission_order;  // sequence ids in the order they first ran
  bool strict = true;                    // false: count ring violations instead of failing
  int64_t ring_violations = 0;
  bool force_next = false;
  int64_t nan_for_seq = -1;
  int64_t throw_on_step = -1;    // execute throws ResourceExhausted on this call (1-based)
  int64_t throw_from_step = -1;  // ... and on every call from this one on
  int64_t steps = 0;
  int64_t computed_tokens = 0;
  int64_t replayed_tokens = 0;
  int64_t max_batch_tokens = 0;
  int64_t pending_inputs = 0;  // entries whose input token came from the previous step's sampler output

 private:
  std::vector<TokenId> storage_;
  std::vector<std::vector<TokenId>> rings_;
  std::map<int32_t, int64_t> ring_end_;
  std::set<int64_t> seen_;
  std::set<int64_t> failed_seqs_;  // in the step that threw
  SchedulerConfig sc_;
  int window_;
};

struct RunSetup {
  int32_t num_blocks = 64;
  int max_num_seqs = 4;
  int64_t budget = 32;
  int64_t max_model_len = 64;
  bool prefix = true;
  int ring = kWindow;    // the runner's per-sequence state window
  int replay = kWindow;  // what the cache manager is told to replay (must cover `ring` for exact reuse)
  bool strict = true;
  bool async = true;  // asynchronous scheduling (the engine's default)
  // Abort a request once it has streamed this many tokens (checked between steps).
  std::map<std::string, size_t> abort_after = {};
  std::function<bool(int64_t)> allocation_fault = {};  // KvCacheConfig::allocation_fault
  int64_t throw_on_step = -1;                          // TestRunner::throw_on_step
  int64_t throw_from_step = -1;                        // TestRunner::throw_from_step
};

struct RunResult {
  std::map<std::string, std::vector<TokenId>> outputs;  // "id/sample" → tokens
  std::map<std::string, StopReason> reasons;
  std::map<std::string, std::vector<TokenId>> streamed;
  std::map<std::string, std::vector<float>> logprobs;
  std::map<std::string, std::string> stop_strings;
  int64_t pending_inputs = 0;
  EngineStats stats;
  int64_t computed_tokens = 0;
  int64_t replayed_tokens = 0;
  int64_t ring_violations = 0;
};

EngineConfig make_config(const RunSetup& s) {
  EngineConfig c;
  c.scheduler = {.max_num_seqs = s.max_num_seqs, .max_num_batched_tokens = s.budget, .max_model_len = s.max_model_len};
  c.kv = {.num_blocks = s.num_blocks,
          .block_size = kBlockSize,
          .num_state_slots = s.max_num_seqs,
          .enable_prefix_cache = s.prefix,
          .prefix_replay_tokens = s.replay};
  c.kv.allocation_fault = s.allocation_fault;
  c.seed = 1234;
  c.async_scheduling = s.async;
  c.eos_token_ids = {kVocab - 1};
  c.detokenize = [](std::span<const TokenId> ids) {
    std::string s;
    for (TokenId t : ids) s += static_cast<char>('a' + t % 26);
    return s;
  };
  return c;
}

std::string key(const std::string& id, int sample) { return id + "/" + std::to_string(sample); }

std::vector<TokenId> prompt_of(int len, TokenId base) {
  std::vector<TokenId> p;
  for (int i = 0; i < len; ++i) p.push_back((base + i * 7) % (kVocab - 1));
  return p;
}

// A mixed workload: shared prefixes, greedy and seeded/unseeded sampling, n > 1, penalties.
std::vector<Request> workload() {
  std::vector<Request> rs;
  const std::vector<TokenId> shared = prompt_of(13, 5);
  for (int i = 0; i < 8; ++i) {
    Request r;
    r.request_id = "r" + std::to_string(i);
    r.prompt_token_ids = i % 2 == 0 ? shared : prompt_of(3 + 5 * i, i);
    r.prompt_token_ids.push_back(static_cast<TokenId>(i));
    r.params.max_tokens = 6 + i;
    r.params.ignore_eos = true;
    if (i % 3 == 0) r.params.temperature = 0;
    if (i % 3 == 1) r.params.seed = 100 + i;
    if (i == 4) r.params.n = 3;
    if (i == 5) r.params.frequency_penalty = 0.5f;
    rs.push_back(std::move(r));
  }
  return rs;
}

RunResult run(const RunSetup& s, const std::vector<Request>& requests, bool add_all_first = true) {
  const EngineConfig cfg = make_config(s);
  TestRunner runner(s.num_blocks, s.max_num_seqs, cfg.scheduler, s.ring);
  runner.strict = s.strict;
  runner.throw_on_step = s.throw_on_step;
  runner.throw_from_step = s.throw_from_step;
  RunResult res;
  Engine engine(cfg, runner, [&](const SequenceDelta& d) {
    auto& v = res.streamed[key(d.request_id, d.sample_index)];
    v.insert(v.end(), d.new_token_ids.begin(), d.new_token_ids.end());
  });
  size_t next = 0;
  if (add_all_first)
    for (; next < requests.size(); ++next) engine.add_request(requests[next]);
  while (engine.has_unfinished() || next < requests.size()) {
    if (next < requests.size()) engine.add_request(requests[next++]);  // staggered arrivals
    engine.step();
    engine.check_invariants();
    for (const auto& [id, n] : s.abort_after)
      if (res.streamed[key(id, 0)].size() >= n) engine.abort(id);  // false once finished: harmless
    if (::testing::Test::HasFailure()) break;
  }
  for (auto& c : engine.take_finished()) {
    const std::string k = key(c.request_id, c.sample_index);
    res.outputs[k] = c.output_token_ids;
    res.reasons[k] = c.stop_reason;
    res.stop_strings[k] = c.stop_string;
    for (const auto& lp : c.logprobs) res.logprobs[k].push_back(lp.logprob);
  }
  res.pending_inputs = runner.pending_inputs;
  res.stats = engine.stats();
  res.computed_tokens = runner.computed_tokens;
  res.replayed_tokens = runner.replayed_tokens;
  res.ring_violations = runner.ring_violations;
  EXPECT_EQ(engine.kv_cache().num_available_blocks(), s.num_blocks) << "blocks leaked";
  EXPECT_EQ(engine.kv_cache().num_free_slots(), s.max_num_seqs) << "state slots leaked";
  return res;
}

// Log-probabilities of a step's rows are computed on a thread pool from 4 rows up: a wide batch (pool) must give
// the values of one sequence at a time (inline), bit for bit, for the chosen token only (logprobs = 0) and with
// top entries.
TEST(EngineLogprobs, ManyRowsOnThePoolEqualOneRowAtATime) {
  std::vector<Request> reqs;
  for (int i = 0; i < 12; ++i) {
    Request r;
    r.request_id = "l" + std::to_string(i);
    r.prompt_token_ids = prompt_of(3 + i % 5, 5 * i + 1);
    r.params.max_tokens = 6;
    r.params.logprobs = i % 3 == 0 ? 2 : 0;
    if (i % 2)
      r.params.seed = 77 + i;
    else
      r.params.temperature = 0;
    reqs.push_back(std::move(r));
  }
  RunSetup wide;
  wide.max_num_seqs = 12;
  wide.budget = 64;
  wide.num_blocks = 128;
  RunSetup narrow = wide;
  narrow.max_num_seqs = 1;
  const RunResult a = run(wide, reqs), b = run(narrow, reqs);
  ASSERT_EQ(a.outputs.size(), 12u);
  EXPECT_EQ(a.outputs, b.outputs);
  EXPECT_EQ(a.logprobs, b.logprobs);
  for (const auto& [k, lps] : a.logprobs) {
    EXPECT_EQ(lps.size(), a.outputs.at(k).size()) << k;
    for (float lp : lps) EXPECT_LE(lp, 0.0f) << k;
  }
}

TEST(EngineEndToEnd, StreamedTokensEqualFinalOutputsAndLengthsFollowMaxTokens) {
  const auto reqs = workload();
  const RunResult r = run({}, reqs);
  ASSERT_EQ(r.outputs.size(), 10u);  // 7 requests with n = 1, one with n = 3
  for (const auto& [k, out] : r.outputs) {
    EXPECT_EQ(r.streamed.at(k), out) << k;
    EXPECT_EQ(r.reasons.at(k), StopReason::kMaxTokens) << k;
  }
  EXPECT_EQ(r.outputs.at("r2/0").size(), 8u);
  // The n = 3 samples of r4 (unseeded) use different random streams.
  EXPECT_TRUE(r.outputs.at("r4/0") != r.outputs.at("r4/1") || r.outputs.at("r4/1") != r.outputs.at("r4/2"));
}

TEST(EngineEndToEnd, OutputsIndependentOfTokenBudgetAndChunking) {
  const auto reqs = workload();
  const RunResult base = run({.budget = 64, .prefix = false}, reqs);
  for (int64_t budget : {1, 3, 7, 16}) {
    const RunResult r = run({.budget = budget, .prefix = false}, reqs);
    EXPECT_EQ(r.outputs, base.outputs) << "budget " << budget;
  }
}

TEST(EngineEndToEnd, PreemptedAndResumedEqualsUninterrupted) {
  const auto reqs = workload();
  const RunResult base = run({.num_blocks = 256, .prefix = false}, reqs);
  EXPECT_EQ(base.stats.preemptions, 0);
  // 16 blocks = 64 tokens = exactly one max_model_len sequence: heavy preemption.
  const RunResult tight = run({.num_blocks = 16, .prefix = false}, reqs);
  EXPECT_GT(tight.stats.preemptions, 0);
  EXPECT_EQ(tight.outputs, base.outputs);
  const RunResult tight_prefix = run({.num_blocks = 16, .prefix = true}, reqs);
  EXPECT_EQ(tight_prefix.outputs, base.outputs);
}

TEST(EngineEndToEnd, PrefixHitsSaveComputeButNotChangeOutputs) {
  const auto reqs = workload();
  const RunResult off = run({.prefix = false}, reqs, /*add_all_first=*/false);
  const RunResult on = run({.prefix = true}, reqs, /*add_all_first=*/false);
  EXPECT_EQ(on.outputs, off.outputs);
  EXPECT_GT(on.stats.kv.prefix_hit_tokens, 0);
  EXPECT_GT(on.stats.kv.hit_rate(), 0.0);
  EXPECT_LT(on.computed_tokens, off.computed_tokens);
  EXPECT_LT(on.stats.prompt_tokens_computed, off.stats.prompt_tokens_computed);
}

TEST(EngineEndToEnd, BoundedReplayRebuildsPerSequenceStateExactly) {
  // Replay of kWindow tokens rebuilds the ring; the runner checks replayed tokens against the cached blocks.
  const auto reqs = workload();
  const RunResult off = run({.prefix = false}, reqs, false);
  const RunResult replay = run({.prefix = true}, reqs, false);
  EXPECT_EQ(replay.outputs, off.outputs);
  EXPECT_GT(replay.replayed_tokens, 0);
  EXPECT_LT(replay.computed_tokens, off.computed_tokens);
}

TEST(EngineEndToEnd, ExactPrefixReuseWithoutPerSequenceState) {
  // A V3-like model (no per-sequence state): hits need no replay at all.
  const auto reqs = workload();
  const RunResult off = run({.prefix = false, .ring = 0, .replay = 0}, reqs, false);
  const RunResult on = run({.prefix = true, .ring = 0, .replay = 0}, reqs, false);
  EXPECT_EQ(on.outputs, off.outputs);
  EXPECT_EQ(on.replayed_tokens, 0);
  EXPECT_GT(on.stats.kv.prefix_hit_tokens, 0);
  EXPECT_LT(on.computed_tokens, off.computed_tokens);
}

TEST(EngineEndToEnd, ReplayShorterThanTheStateIsDetected) {
  // Telling the cache manager to replay less than the model's state window loses state: the runner notices.
  // (This is what prefix_replay_tokens protects; KvLayout sets it from the SWA window.)
  const auto reqs = workload();
  const RunResult r = run({.prefix = true, .ring = kWindow, .replay = 0, .strict = false}, reqs, false);
  EXPECT_GT(r.ring_violations, 0);
}

TEST(EngineEndToEnd, SeededSamplingIsBatchInvariant) {
  Request x;
  x.request_id = "x";
  x.prompt_token_ids = prompt_of(9, 3);
  x.params.seed = 77;
  x.params.temperature = 1.3f;
  x.params.top_p = 0.95f;
  x.params.max_tokens = 12;
  x.params.ignore_eos = true;
  const RunResult alone = run({}, {x});
  // With seven others, added before and after, and a different request id.
  std::vector<Request> crowd = workload();
  Request y = x;
  y.request_id = "renamed";
  crowd.insert(crowd.begin() + 3, y);
  const RunResult mixed = run({.budget = 5}, crowd);
  EXPECT_EQ(mixed.outputs.at("renamed/0"), alone.outputs.at("x/0"));
  std::reverse(crowd.begin(), crowd.end());
  const RunResult reversed = run({.num_blocks = 16}, crowd);
  EXPECT_EQ(reversed.outputs.at("renamed/0"), alone.outputs.at("x/0"));
}

TEST(EngineEndToEnd, FcfsAdmissionAndNoStarvationUnderLoad) {
  EngineConfig cfg = make_config({.num_blocks = 20, .max_num_seqs = 3, .budget = 6, .max_model_len = 64});
  TestRunner runner(20, 3, cfg.scheduler);
  Engine engine(cfg, runner);
  constexpr int kN = 40;
  int64_t steps = 0;
  for (int i = 0; i < kN; ++i) {
    Request r;
    r.request_id = std::to_string(i);
    r.prompt_token_ids = prompt_of(1 + (i * 37) % 30, i);
    r.params.max_tokens = 1 + (i * 13) % 20;
    r.params.ignore_eos = true;
    engine.add_request(r);
  }
  std::vector<bool> done(kN, false);
  while (engine.has_unfinished()) {
    engine.step();
    ++steps;
    ASSERT_LT(steps, 5000) << "no progress";
    for (const auto& c : engine.take_finished()) done[std::stoi(c.request_id)] = true;
  }
  EXPECT_TRUE(std::all_of(done.begin(), done.end(), [](bool d) { return d; }));
  EXPECT_LE(runner.max_batch_tokens, 6);
  // Strict FCFS: sequences start in arrival order (ids increase with arrival).
  ASSERT_EQ(runner.admission_order.size(), static_cast<size_t>(kN));
  EXPECT_TRUE(std::is_sorted(runner.admission_order.begin(), runner.admission_order.end()));
  EXPECT_GT(engine.stats().preemptions, 0) << "the load should exercise preemption";
}

TEST(EngineStops, EosStopTokenStopStringMaxModelLenAndIgnoreEos) {
  EngineConfig cfg = make_config({.max_model_len = 20});
  TestRunner runner(64, 4, cfg.scheduler);
  runner.force_next = true;  // next token = last + 1 (mod vocab)
  Engine engine(cfg, runner);
  auto req = [](const std::string& id, TokenId last, std::function<void(SamplingParams&)> f) {
    Request r;
    r.request_id = id;
    r.prompt_token_ids = {1, 2, last};
    r.params.temperature = 0;
    f(r.params);
    return r;
  };
  engine.add_request(req("eos", kVocab - 4, [](SamplingParams&) {}));  // 61, 62, 63 = EOS
  engine.add_request(req("stop_token", 10, [](SamplingParams& p) { p.stop_token_ids = {13}; }));
  engine.add_request(req("stop_string", 0, [](SamplingParams& p) { p.stop = {"def"}; }));  // a..: 'b','c','d','e','f'
  engine.add_request(req("ignore_eos", kVocab - 4, [](SamplingParams& p) {
    p.ignore_eos = true;
    p.max_tokens = 5;
  }));
  engine.add_request(req("model_len", 20, [](SamplingParams&) {}));  // 3 prompt + 17 = 20
  engine.add_request(req("min_tokens", kVocab - 3, [](SamplingParams& p) {
    p.min_tokens = 3;
    p.max_tokens = 3;
  }));
  engine.run_to_completion(1000);
  std::map<std::string, CompletedSequence> got;
  for (auto& c : engine.take_finished()) got[c.request_id] = c;
  EXPECT_EQ(got["eos"].stop_reason, StopReason::kEos);
  EXPECT_EQ(got["eos"].output_token_ids, (std::vector<TokenId>{61, 62, 63}));
  EXPECT_EQ(got["stop_token"].stop_reason, StopReason::kStopToken);
  EXPECT_EQ(got["stop_token"].output_token_ids, (std::vector<TokenId>{11, 12, 13}));
  EXPECT_EQ(got["stop_string"].stop_reason, StopReason::kStopString);
  EXPECT_EQ(got["stop_string"].stop_string, "def");
  EXPECT_EQ(got["stop_string"].output_token_ids, (std::vector<TokenId>{1, 2, 3, 4, 5}));
  EXPECT_EQ(got["ignore_eos"].stop_reason, StopReason::kMaxTokens);
  EXPECT_EQ(got["ignore_eos"].output_token_ids.size(), 5u);
  EXPECT_EQ(got["ignore_eos"].output_token_ids[2], kVocab - 1);
  EXPECT_EQ(got["model_len"].stop_reason, StopReason::kMaxModelLen);
  EXPECT_EQ(got["model_len"].prompt_len + static_cast<int64_t>(got["model_len"].output_token_ids.size()), 20);
  // EOS (63) would be next after 62 but min_tokens suppresses it: the second output is something else.
  EXPECT_EQ(got["min_tokens"].output_token_ids.size(), 3u);
  EXPECT_EQ(got["min_tokens"].output_token_ids[0], kVocab - 2);
  EXPECT_NE(got["min_tokens"].output_token_ids[1], kVocab - 1);
  EXPECT_EQ(got["min_tokens"].stop_reason, StopReason::kMaxTokens);
}

TEST(EngineRequests, OverLongPromptsAndBadRequestsAreRejectedWithClearErrors) {
  EngineConfig cfg = make_config({.max_model_len = 16});
  TestRunner runner(64, 4, cfg.scheduler);
  Engine engine(cfg, runner);
  auto message_of = [&](Request r) -> std::string {
    try {
      engine.add_request(std::move(r));
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      return e.message();
    }
    return "";
  };
  Request r;
  r.request_id = "long";
  r.prompt_token_ids = prompt_of(17, 0);
  EXPECT_NE(message_of(r).find("the prompt has 17 tokens, more than max_model_len 16"), std::string::npos);
  r.prompt_token_ids = {};
  EXPECT_NE(message_of(r).find("prompt is empty"), std::string::npos);
  r.prompt_token_ids = {1, kVocab};
  EXPECT_NE(message_of(r).find("outside the vocabulary"), std::string::npos);
  r.prompt_token_ids = {1};
  r.params.top_p = 0;
  EXPECT_NE(message_of(r).find("top_p must be in (0, 1]"), std::string::npos);
  r.params = {};
  r.request_id = "";
  EXPECT_NE(message_of(r).find("request_id"), std::string::npos);
  EXPECT_EQ(engine.num_waiting(), 0);
  // Exactly max_model_len is accepted: it yields one token and stops on the length limit.
  r.request_id = "exact";
  r.prompt_token_ids = prompt_of(16, 0);
  EXPECT_EQ(message_of(r), "");
  EXPECT_NE(message_of(r).find("already in use"), std::string::npos);
  engine.run_to_completion(100);
  auto done = engine.take_finished();
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].output_token_ids.size(), 1u);
  EXPECT_EQ(done[0].stop_reason, StopReason::kMaxModelLen);
}

TEST(EngineRequests, CacheTooSmallForOneSequenceIsRejectedAtConstruction) {
  EngineConfig cfg = make_config({.num_blocks = 15, .max_model_len = 64});
  TestRunner runner(15, 4, cfg.scheduler);
  try {
    Engine engine(cfg, runner);
    FAIL() << "expected ResourceExhausted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kResourceExhausted);
    EXPECT_NE(e.message().find("needs 16"), std::string::npos) << e.message();
  }
}

TEST(EngineAbort, AbortFreesBlocksAndStreamsAFinalDelta) {
  EngineConfig cfg = make_config({.prefix = false});
  TestRunner runner(64, 4, cfg.scheduler);
  std::vector<SequenceDelta> finals;
  Engine engine(cfg, runner, [&](const SequenceDelta& d) {
    if (d.finished) finals.push_back(d);
  });
  for (const auto& r : workload()) engine.add_request(r);
  engine.step();
  engine.step();
  const int32_t before = engine.kv_cache().num_available_blocks();
  EXPECT_TRUE(engine.abort("r0"));  // running
  EXPECT_GT(engine.kv_cache().num_available_blocks(), before);
  EXPECT_TRUE(engine.abort("r7"));  // still waiting (max_num_seqs 4)
  EXPECT_TRUE(engine.abort("r4"));  // n = 3: all samples
  EXPECT_FALSE(engine.abort("r0"));
  EXPECT_FALSE(engine.abort("nope"));
  engine.check_invariants();
  int aborted = 0;
  for (const auto& d : finals) aborted += d.stop_reason == StopReason::kAborted;
  EXPECT_EQ(aborted, 5);
  engine.run_to_completion(1000);
  EXPECT_EQ(engine.kv_cache().num_available_blocks(), 64);
  for (const auto& c : engine.take_finished())
    if (c.request_id == "r0" || c.request_id == "r7" || c.request_id == "r4") {
      EXPECT_EQ(c.stop_reason, StopReason::kAborted);
    }
}

TEST(EngineStops, NonFiniteLogitsFinishOnlyThatSequenceWithError) {
  EngineConfig cfg = make_config({});
  TestRunner runner(64, 4, cfg.scheduler);
  runner.nan_for_seq = 1;
  Engine engine(cfg, runner);
  for (int i = 0; i < 3; ++i) {
    Request r;
    r.request_id = std::to_string(i);
    r.prompt_token_ids = prompt_of(5, i);
    r.params.max_tokens = 4;
    r.params.ignore_eos = true;
    engine.add_request(r);
  }
  engine.run_to_completion(100);
  for (const auto& c : engine.take_finished())
    EXPECT_EQ(c.stop_reason, c.request_id == "1" ? StopReason::kError : StopReason::kMaxTokens) << c.request_id;
}

TEST(EngineLogprobs, ChosenAndTopLogprobsPerToken) {
  EngineConfig cfg = make_config({});
  TestRunner runner(64, 4, cfg.scheduler);
  Engine engine(cfg, runner);
  Request r;
  r.request_id = "lp";
  r.prompt_token_ids = prompt_of(6, 1);
  r.params.max_tokens = 4;
  r.params.logprobs = 3;
  r.params.ignore_eos = true;
  r.params.seed = 3;
  engine.add_request(r);
  engine.run_to_completion(100);
  const auto done = engine.take_finished();
  ASSERT_EQ(done.size(), 1u);
  ASSERT_EQ(done[0].logprobs.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    const auto& lp = done[0].logprobs[i];
    EXPECT_EQ(lp.token, done[0].output_token_ids[i]);
    ASSERT_EQ(lp.top_logprobs.size(), 3u);
    EXPECT_GE(lp.top_logprobs[0].logprob, lp.top_logprobs[1].logprob);
    EXPECT_LE(lp.logprob, lp.top_logprobs[0].logprob);
    EXPECT_LE(lp.logprob, 0.0f);
  }
}

// 40 requests covering every stop kind (EOS, stop token, stop string, max_tokens, max_model_len; aborts come from
// the run), greedy / seeded / unseeded / filtered sampling, n > 1, penalties, min_tokens, logprobs, shared prefixes.
std::vector<Request> mixed_workload() {
  std::vector<Request> rs;
  const std::vector<TokenId> shared = prompt_of(9, 2);
  for (int i = 0; i < 40; ++i) {
    Request r;
    r.request_id = "m" + std::to_string(i);
    r.prompt_token_ids = prompt_of(1 + (i * 11) % 23, i);
    if (i % 5 == 0) r.prompt_token_ids.insert(r.prompt_token_ids.begin(), shared.begin(), shared.end());
    SamplingParams& p = r.params;
    switch (i % 4) {
      case 0:
        p.temperature = 0;
        break;
      case 1:
        p.seed = 1000 + i;
        break;
      case 2:
        break;  // unseeded: the engine seed and the sequence id
      case 3:
        p.temperature = 0.7f;
        p.top_p = 0.9f;
        p.top_k = 10;
        p.seed = i;
        break;
    }
    if (i % 6 == 1) p.stop_token_ids = {static_cast<TokenId>(i % 60), 7};
    if (i % 6 == 2) p.stop = {"e", "xy"};
    if (i % 6 == 3) p.ignore_eos = true;
    if (i % 7 == 0) p.n = 2;
    if (i % 5 == 4) p.max_tokens = 1 + i % 9;
    if (i % 5 == 1) p.max_tokens = 30;  // otherwise (no max_tokens): until max_model_len
    if (i % 8 == 5) p.min_tokens = std::min(3, p.max_tokens.value_or(3));
    if (i % 9 == 2) {
      p.presence_penalty = 0.5f;
      p.frequency_penalty = 0.3f;
      p.repetition_penalty = 1.2f;
    }
    if (i % 10 == 6) p.logprobs = 2;
    rs.push_back(std::move(r));
  }
  return rs;
}

TEST(EngineAsync, OutputsIdenticalWithAsynchronousSchedulingOnAndOff) {
  const auto reqs = mixed_workload();
  const std::map<std::string, size_t> aborts = {{"m5", 3}, {"m12", 1}, {"m30", 6}};
  std::set<StopReason> reasons_seen;
  int64_t discarded = 0, preemptions = 0;
  const std::vector<RunSetup> setups = {
      {},
      {.num_blocks = 16, .prefix = false},  // one max_model_len sequence fits: constant preemption
      {.budget = 5},                        // chunked prefills interleaved with decodes
      {.num_blocks = 24, .max_num_seqs = 8, .budget = 64},
      {.num_blocks = 20, .max_num_seqs = 6, .budget = 7},
  };
  for (RunSetup s : setups) {
    for (bool staggered : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "blocks " << s.num_blocks << " seqs " << s.max_num_seqs << " budget "
                                        << s.budget << (staggered ? " staggered" : ""));
      s.abort_after = aborts;
      s.async = false;
      const RunResult sync = run(s, reqs, !staggered);
      s.async = true;
      const RunResult async = run(s, reqs, !staggered);
      ASSERT_EQ(sync.outputs.size(), 46u);  // 40 requests, 6 with n = 2
      EXPECT_EQ(async.outputs, sync.outputs);
      EXPECT_EQ(async.reasons, sync.reasons);
      EXPECT_EQ(async.stop_strings, sync.stop_strings);
      EXPECT_EQ(async.logprobs, sync.logprobs);
      EXPECT_EQ(async.streamed, async.outputs) << "a discarded token was streamed";
      EXPECT_EQ(async.stats.generated_tokens, sync.stats.generated_tokens);
      EXPECT_EQ(sync.pending_inputs, 0);
      EXPECT_GT(async.pending_inputs, 0) << "decodes should take their input from the previous step's samples";
      EXPECT_EQ(sync.stats.discarded_tokens, 0);
      for (const auto& [k, r] : sync.reasons) reasons_seen.insert(r);
      discarded += async.stats.discarded_tokens;
      preemptions += async.stats.preemptions;
      if (::testing::Test::HasFailure()) return;
    }
  }
  for (StopReason r : {StopReason::kEos, StopReason::kStopToken, StopReason::kStopString, StopReason::kMaxTokens,
                       StopReason::kMaxModelLen, StopReason::kAborted})
    EXPECT_TRUE(reasons_seen.count(r)) << "the workload never stopped with " << stop_reason_name(r);
  EXPECT_GT(discarded, 0) << "sequences stopping on their content should have had a late sample discarded";
  EXPECT_GT(preemptions, 0);
}

TEST(EngineAsync, LengthLimitedSequencesAreNotScheduledPastTheirLastToken) {
  // max_tokens and max_model_len are known before the token is: no step is wasted on them, nothing is discarded.
  RunSetup s{.max_model_len = 24};
  std::vector<Request> reqs;
  for (int i = 0; i < 6; ++i) {
    Request r;
    r.request_id = std::to_string(i);
    r.prompt_token_ids = prompt_of(i == 5 ? 24 : 3 + i, i);  // the last one is exactly max_model_len long
    r.params.ignore_eos = true;
    if (i % 2 == 0) r.params.max_tokens = 2 + i;
    reqs.push_back(r);
  }
  const RunResult async = run(s, reqs);
  s.async = false;
  const RunResult sync = run(s, reqs);
  EXPECT_EQ(async.outputs, sync.outputs);
  EXPECT_EQ(async.stats.discarded_tokens, 0);
  EXPECT_EQ(async.computed_tokens, sync.computed_tokens) << "no position may be computed twice or in vain";
  EXPECT_EQ(async.outputs.at("5/0").size(), 1u);
  EXPECT_EQ(async.reasons.at("5/0"), StopReason::kMaxModelLen);
  EXPECT_EQ(async.outputs.at("0/0").size(), 2u);
  EXPECT_EQ(async.reasons.at("1/0"), StopReason::kMaxModelLen);
}

// Fault injection: a step whose execution throws (a workspace allocation failing with ResourceExhausted) finishes
// the sequences in that step with StopReason::kError; every other sequence runs on to exactly the output of a run
// without the fault, and nothing leaks (run() checks blocks and slots).
TEST(EngineFaults, AFailedStepFinishesOnlyItsSequencesAndTheEngineServesOn) {
  const auto reqs = workload();
  for (bool async : {false, true}) {
    const RunResult clean = run({.max_num_seqs = 2, .async = async}, reqs, /*add_all_first=*/false);
    for (int64_t step : {1, 4, 9}) {
      const RunResult r = run({.max_num_seqs = 2, .async = async, .throw_on_step = step}, reqs, false);
      ASSERT_EQ(r.outputs.size(), clean.outputs.size());
      EXPECT_EQ(r.stats.failed_steps, 1) << "step " << step;
      int errors = 0;
      for (const auto& [k, out] : r.outputs) {
        const std::vector<TokenId>& want = clean.outputs.at(k);
        if (r.reasons.at(k) == StopReason::kError) {
          ++errors;
          ASSERT_LE(out.size(), want.size()) << k;
          EXPECT_TRUE(std::equal(out.begin(), out.end(), want.begin())) << k << ": not a prefix of the clean output";
        } else {
          EXPECT_EQ(r.reasons.at(k), clean.reasons.at(k)) << k;
          EXPECT_EQ(out, want) << k << " (step " << step << ", async " << async << ")";
        }
      }
      EXPECT_GE(errors, 1) << "the failed step had sequences";
      EXPECT_LE(errors, 2) << "max_num_seqs 2: at most two sequences were in the failed step";
    }
  }
}

// A fault that persists (every step from the first or the third on throws): every request ends with an error,
// none hangs and nothing leaks.
TEST(EngineFaults, PersistentStepFailuresEndEveryRequestWithoutLeaks) {
  for (bool async : {false, true}) {
    for (int64_t from : {1, 3}) {
      const RunResult r = run({.max_num_seqs = 2, .async = async, .throw_from_step = from}, workload(), false);
      ASSERT_EQ(r.outputs.size(), 10u);
      int errors = 0;
      for (const auto& [k, reason] : r.reasons) errors += reason == StopReason::kError;
      EXPECT_EQ(errors, from == 1 ? 10 : errors) << "async " << async;
      EXPECT_GE(errors, 8) << "async " << async << " from " << from;
    }
  }
}

// Fault injection in the KV block pool: allocations that fail (although the plan had room) preempt the sequence,
// which resumes later with the same output; a failure that persists finishes only that sequence with kError.
TEST(EngineFaults, KvAllocationFailuresPreemptAndResumeWithIdenticalOutputs) {
  const auto reqs = workload();
  for (bool async : {false, true}) {
    const RunResult clean = run({.async = async}, reqs);
    int64_t calls = 0;
    const RunResult r = run({.async = async, .allocation_fault = [&](int64_t) { return ++calls % 3 == 0; }}, reqs);
    EXPECT_GT(r.stats.allocation_failures, 0);
    EXPECT_GE(r.stats.preemptions, r.stats.allocation_failures);
    EXPECT_EQ(r.outputs, clean.outputs) << "async " << async;
    for (const auto& [k, reason] : r.reasons) EXPECT_EQ(reason, StopReason::kMaxTokens) << k;
  }
}

TEST(EngineFaults, PersistentKvAllocationFailureFailsOnlyThatRequest) {
  // "big" arrives first and its whole 59-token prompt fits the step budget, so every attempt to admit it asks for
  // 15 blocks (block size 4) at once; no other request ever needs more than 10. The fault hits exactly those.
  std::vector<Request> reqs = workload();
  Request big;
  big.request_id = "big";
  big.prompt_token_ids = prompt_of(59, 3);
  big.params.max_tokens = 4;
  big.params.ignore_eos = true;
  reqs.insert(reqs.begin(), big);
  const RunResult clean = run({.budget = 64}, reqs);
  ASSERT_EQ(clean.reasons.at("big/0"), StopReason::kMaxTokens);
  const RunResult r = run({.budget = 64, .allocation_fault = [](int64_t n) { return n >= 12; }}, reqs);
  EXPECT_EQ(r.reasons.at("big/0"), StopReason::kError);
  EXPECT_TRUE(r.outputs.at("big/0").empty());
  EXPECT_EQ(r.stats.allocation_failures, 8) << "kMaxAllocationFailures attempts, then given up";
  for (const auto& [k, out] : clean.outputs) {
    if (k == "big/0") continue;
    EXPECT_EQ(r.outputs.at(k), out) << k;
    EXPECT_EQ(r.reasons.at(k), StopReason::kMaxTokens) << k;
  }
}

TEST(ModelRunnerInterface, PendingTokensResolveFromThePreviousStepsSamples) {
  const std::vector<TokenId> tokens = {5, 6, kPendingToken};
  const std::vector<TokenId> prev = {40, 41, 42};
  ModelBatch b;
  b.prev_sampled_tokens = prev;
  BatchEntry e;
  e.token_ids = tokens;
  e.pending_row = 2;
  EXPECT_EQ(resolve_token_ids(b, e), (std::vector<int64_t>{5, 6, 42}));
  e.pending_row = -1;
  EXPECT_EQ(resolve_token_ids(b, e), (std::vector<int64_t>{5, 6, -1}));
  e.pending_row = 3;
  EXPECT_THROW(resolve_token_ids(b, e), Error);
}

}  // namespace
}  // namespace deepinfer
