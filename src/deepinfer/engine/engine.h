// Engine: requests in, streamed tokens out. One step = schedule (pure) → commit the plan to the cache manager →
// ModelRunner::execute → sample → append / stop / free → stream deltas. Single-threaded: add_request, abort and
// step must not run concurrently (an async front end queues calls between steps).
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
#include "deepinfer/engine/stop_checker.h"
#include "deepinfer/kv/kv_cache_manager.h"
#include "deepinfer/sampling/sampler.h"

namespace deepinfer {
namespace structured {
class GrammarCompiler;
}

struct EngineConfig {
  SchedulerConfig scheduler;
  KvCacheConfig kv;  // from KvLayout + size_kv_cache; num_state_slots >= scheduler.max_num_seqs
  uint64_t seed = 0;  // the random stream of requests without their own seed
  std::vector<TokenId> eos_token_ids;
  DetokenizeFn detokenize;  // needed only by requests with stop strings
  // Compiles requests' structured-output constraints (and caches them); needed only by such requests. Its
  // vocabulary must have the runner's vocab size and EOS ids = eos_token_ids (make_structured_tokenizer_info).
  std::shared_ptr<structured::GrammarCompiler> grammar_compiler;
};

struct StepStats {
  int num_decodes = 0;
  int num_prefills = 0;
  int64_t num_batched_tokens = 0;
  int num_preempted = 0;
  int num_finished = 0;
};

struct EngineStats {
  int64_t steps = 0;
  int64_t prompt_tokens_computed = 0;  // prefill positions run (including recompute after preemption)
  int64_t generated_tokens = 0;
  int64_t preemptions = 0;
  KvCacheStats kv;
  ModelWorkStats model;  // the runner's layer-token counts (bounded replay's saved prefill work)
};

class Engine {
 public:
  // `runner` must outlive the engine. Throws InvalidArgument on an inconsistent config and ResourceExhausted if
  // one sequence of max_model_len tokens cannot fit the cache (progress would not be guaranteed).
  Engine(EngineConfig config, ModelRunner& runner, StreamCallback on_delta = {});

  // Validates and queues a request (params.n sequences). Throws InvalidArgument naming the problem: empty
  // prompt, token id outside the vocabulary, a prompt longer than max_model_len (never truncated), invalid
  // sampling params, duplicate request id, stop strings without a detokenizer, a structured-output constraint
  // that does not compile (Unsupported for constructs the front ends lack) or without a grammar compiler.
  void add_request(Request request);
  // Finishes every sample of the request with kAborted, frees its cache, streams a final delta. False if no
  // unfinished request has that id.
  bool abort(const std::string& request_id);
  // Runs one step; a no-op when nothing is unfinished.
  StepStats step();
  bool has_unfinished() const { return !running_.empty() || !waiting_.empty(); }
  // Steps until every request finished (or max_steps steps ran; 0 = no limit). Returns the steps run.
  int64_t run_to_completion(int64_t max_steps = 0);

  // Finished samples since the last call, in finishing order.
  std::vector<CompletedSequence> take_finished();

  const EngineStats& stats() const { return stats_; }
  const KvCacheManager& kv_cache() const { return kv_; }
  int num_running() const { return static_cast<int>(running_.size()); }
  int num_waiting() const { return static_cast<int>(waiting_.size()); }
  // For tests: the cache manager's invariants against every live sequence's block table.
  void check_invariants() const;

 private:
  Sequence& seq(int64_t id) { return *sequences_.at(id); }
  void commit(const StepPlan& plan);
  void preempt(Sequence& s);
  void finish(Sequence& s, StopReason reason, std::string stop_string, SequenceDelta* delta);
  void release_cache(Sequence& s);
  RngKey rng_key(const Sequence& s) const;

  EngineConfig config_;
  ModelRunner& runner_;
  StreamCallback on_delta_;
  KvCacheManager kv_;
  Sampler sampler_;
  int64_t next_seq_id_ = 0;
  std::unordered_map<int64_t, std::unique_ptr<Sequence>> sequences_;  // unfinished
  std::vector<Sequence*> running_;  // admission order
  std::deque<Sequence*> waiting_;   // ascending id (FCFS)
  std::unordered_map<std::string, std::vector<int64_t>> request_seqs_;
  std::vector<CompletedSequence> finished_;
  std::vector<float> logits_;
  EngineStats stats_;
};

}  // namespace deepinfer
