// Engine: requests in, streamed tokens out. One step = schedule (pure) → commit the plan to the cache manager →
// launch (ModelRunner::execute + sampling, on the StepExecutor) → append / stop / free → stream deltas.
//
// Asynchronous scheduling (EngineConfig::async_scheduling, the default): step() plans and launches step N+1 while
// step N still runs on the executor's worker thread, assuming each sequence N samples grows by one token (its
// value reaches N+1 through a placeholder, see BatchEntry::pending_row); then it waits for N and processes N's
// tokens. A sequence that stops at N is still in N+1: that extra token is discarded, never emitted. Outputs are
// identical with it on and off. The engine's own API is single-threaded either way: add_request, abort and step
// must not run concurrently (an async front end queues calls between steps).
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "deepinfer/engine/model_runner.h"
#include "deepinfer/engine/request.h"
#include "deepinfer/engine/scheduler.h"
#include "deepinfer/engine/sequence.h"
#include "deepinfer/engine/step_executor.h"
#include "deepinfer/engine/stop_checker.h"
#include "deepinfer/kv/kv_cache_manager.h"
#include "deepinfer/sampling/sampler.h"

namespace deepinfer {
namespace structured {
class GrammarCompiler;
}

struct EngineConfig {
  SchedulerConfig scheduler;
  KvCacheConfig kv;   // from KvLayout + size_kv_cache; num_state_slots >= scheduler.max_num_seqs
  uint64_t seed = 0;  // the random stream of requests without their own seed
  std::vector<TokenId> eos_token_ids;
  DetokenizeFn detokenize;  // needed only by requests with stop strings
  // Compiles requests' structured-output constraints (and caches them); needed only by such requests. Its
  // vocabulary must have the runner's vocab size and EOS ids = eos_token_ids (make_structured_tokenizer_info).
  std::shared_ptr<structured::GrammarCompiler> grammar_compiler;
  bool async_scheduling = true;  // plan step N+1 while step N executes (see the file comment)
  // Speculative decoding (docs/SPECULATIVE.md): drafts verified per decode step, 0 = off. Needs a runner with a
  // draft proposer (ModelRunner::speculative) and runs with synchronous scheduling (the number of tokens a step
  // adds is known only after it ran). confidence_threshold > 0 picks the verification lengths from the drafts'
  // confidences (DsparkBudgetPolicy: per request the prefix whose survival stays above the threshold, the step's
  // draft tokens to the largest expected gain), else every draft is verified (FixedLengthPolicy).
  // draft_token_budget > 0 caps the draft tokens one step verifies across the batch.
  int num_draft_tokens = 0;
  double draft_confidence_threshold = 0.0;
  int64_t draft_token_budget = 0;
};

struct StepStats {
  int num_decodes = 0;
  int num_prefills = 0;
  int64_t num_batched_tokens = 0;
  int num_preempted = 0;
  int num_finished = 0;
  int num_discarded = 0;  // samples of sequences that had stopped one step earlier (asynchronous scheduling)
};

struct EngineStats {
  int64_t steps = 0;
  int64_t prompt_tokens_computed = 0;  // prefill positions run (including recompute after preemption)
  int64_t generated_tokens = 0;
  int64_t preemptions = 0;
  int64_t discarded_tokens = 0;  // sampled after their sequence had already stopped (asynchronous scheduling)
  // Block allocations that failed although the plan had room (KvCacheConfig::allocation_fault): the sequence was
  // preempted and retried, or after kMaxAllocationFailures in a row finished with StopReason::kError.
  int64_t allocation_failures = 0;
  // Steps whose execution threw (e.g. ResourceExhausted from a workspace): their sequences finished with
  // StopReason::kError; every other sequence carried on.
  int64_t failed_steps = 0;
  KvCacheStats kv;
  ModelWorkStats model;  // the runner's layer-token counts (bounded replay's saved prefill work)
  SpecStats spec;        // speculative decoding (all zero when off)
};

class Engine {
 public:
  // `runner` must outlive the engine. Throws InvalidArgument on an inconsistent config and ResourceExhausted if
  // one sequence of max_model_len tokens cannot fit the cache (progress would not be guaranteed).
  Engine(EngineConfig config, ModelRunner& runner, StreamCallback on_delta = {});
  ~Engine();

  // Validates and queues a request (params.n sequences). Throws InvalidArgument naming the problem: empty
  // prompt, token id outside the vocabulary, a prompt longer than max_model_len (never truncated), invalid
  // sampling params, duplicate request id, stop strings without a detokenizer, a structured-output constraint
  // that does not compile (Unsupported for constructs the front ends lack) or without a grammar compiler.
  void add_request(Request request);
  // Finishes every sample of the request with kAborted, frees its cache, streams a final delta. False if no
  // unfinished request has that id.
  bool abort(const std::string& request_id);
  // Runs one step; a no-op when nothing is unfinished. Synchronous: plan, execute, process. Asynchronous: plan and
  // launch the next step, then process the previous one (so the first call emits nothing).
  StepStats step();
  bool has_unfinished() const { return !running_.empty() || !waiting_.empty() || !inflight_.empty(); }
  // Steps until every request finished (or max_steps steps ran; 0 = no limit). Returns the steps run.
  int64_t run_to_completion(int64_t max_steps = 0);

  // Finished samples since the last call, in finishing order.
  std::vector<CompletedSequence> take_finished();

  const EngineStats& stats() const { return stats_; }
  // Whether step() waits for the previous launch rather than its own (EngineConfig::async_scheduling after
  // speculation, which turns it off).
  bool async_scheduling() const { return config_.async_scheduling; }
  const KvCacheManager& kv_cache() const { return kv_; }
  int num_running() const { return static_cast<int>(running_.size()); }
  int num_waiting() const { return static_cast<int>(waiting_.size()); }
  // For tests: the cache manager's invariants against every live sequence's block table.
  void check_invariants() const;

 private:
  Sequence& seq(int64_t id) { return *sequences_.at(id); }
  // What the engine remembers of a launched step to process its results.
  struct InflightEntry {
    int64_t seq_id = 0;
    int64_t end = 0;          // positions below are computed once the step ran
    int num_preemptions = 0;  // the sequence's count at launch: a preemption since makes the chunk stale
    int64_t row = -1;         // logits row, -1 if nothing is sampled
  };
  using InflightStep = std::vector<InflightEntry>;

  // Drops from `plan` the sequences whose blocks could not be allocated (see allocation failures below).
  void commit(StepPlan& plan);
  void launch(const StepPlan& plan);
  void process(StepStats& st);
  void preempt(Sequence& s);
  void finish(Sequence& s, StopReason reason, std::string stop_string, SequenceDelta* delta);
  void release_cache(Sequence& s);
  RngKey rng_key(const Sequence& s) const;

  EngineConfig config_;
  ModelRunner& runner_;
  StreamCallback on_delta_;
  KvCacheManager kv_;
  int64_t next_seq_id_ = 0;
  std::unordered_map<int64_t, std::unique_ptr<Sequence>> sequences_;  // unfinished
  std::vector<Sequence*> running_;                                    // admission order
  std::deque<Sequence*> waiting_;                                     // ascending id (FCFS)
  std::unordered_map<std::string, std::vector<int64_t>> request_seqs_;
  std::vector<CompletedSequence> finished_;
  EngineStats stats_;
  std::deque<InflightStep> inflight_;    // launched, not processed; oldest first
  std::vector<int32_t> released_slots_;  // for the runner, with the next launched step
  std::vector<int64_t> dropped_seqs_;    // for the executor, with the next launched step
  std::unique_ptr<SchedulingPolicy> policy_;
  std::unique_ptr<StepExecutor> executor_;  // last: its worker stops before anything above goes away
};

}  // namespace deepinfer
