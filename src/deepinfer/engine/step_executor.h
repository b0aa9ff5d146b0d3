// StepExecutor: runs the engine's steps — ModelRunner::execute, then sampling of every logits row — in the order
// they are submitted, either inline (synchronous scheduling) or on one worker thread (asynchronous scheduling:
// the engine plans and launches step N+1 while step N runs, and processes N's results afterwards).
//
// A submitted StepJob owns copies of everything it reads (token ids, block tables), because the engine keeps
// mutating its sequences while the job runs. Sampling needs each sequence's history (penalties, min_tokens,
// grammar state), which the engine cannot hand over in time for a step that was launched before the previous
// step's tokens were known; so the executor keeps its own per-sequence history, registered when a sequence is
// first scheduled, extended with every token it samples, and dropped when the engine says the sequence is gone.
// Its history therefore runs ahead of the engine's by the tokens in flight; a token the engine later discards
// (its sequence stopped one step earlier) only ever lands in a history that is about to be dropped.
//
// Tokens sampled in step N feed step N+1 through BatchEntry::pending_row: the executor passes N's sampled-token
// buffer as ModelBatch::prev_sampled_tokens and the runner resolves the placeholder (resolve_token_ids), which on a
// device would be a gather from the sampler's output buffer.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "deepinfer/core/thread_pool.h"
#include "deepinfer/engine/model_runner.h"
#include "deepinfer/engine/structured_output.h"
#include "deepinfer/sampling/sampler.h"
#include "deepinfer/spec/policy.h"

namespace deepinfer {

struct StepJob {
  ModelBatch batch;  // its spans point into the storage below
  std::vector<std::vector<TokenId>> token_storage;
  std::vector<std::vector<BlockId>> table_storage;
  std::vector<std::vector<TokenId>> prefix_storage;  // BatchEntry::prefix_token_ids (chunks that reset state)
  // One per logits row, in row order: whose row it is and the position of the token to sample (the RNG counter).
  struct Sample {
    int64_t seq_id = 0;
    int64_t position = 0;
    // Speculative decoding: the batch entry (a one-token decode) and the most drafts it may verify (0: none).
    // The executor drafts (ModelRunner::propose), extends the entry to [t, d_1 .. d_n] and verifies.
    int32_t entry = -1;
    int max_drafts = 0;
  };
  std::vector<Sample> samples;
  int64_t draft_budget = 0;  // verification tokens the step may add (the scheduler reserved them)
  // Sequences scheduled for the first time: their token history so far, how to sample them.
  struct Registration {
    int64_t seq_id = 0;
    std::vector<TokenId> tokens;
    int64_t prompt_len = 0;
    std::shared_ptr<const SamplingParams> params;
    RngKey key;
    std::shared_ptr<StructuredState> structured;  // handed over: only the executing thread touches it from now on
  };
  std::vector<Registration> registrations;
  std::vector<int64_t> drops;           // sequences gone (finished, aborted): forget their history
  std::vector<int32_t> released_slots;  // ModelRunner::release_slot before this step executes
};

// What became of one logits row.
enum class RowOutcome : uint8_t {
  kSampled,
  kNonFinite,        // NaN or +inf logits: no token
  kGrammarComplete,  // structured output: nothing may follow (StopReason::kGrammarComplete)
  kGrammarDeadEnd,   // structured output: no token continues the output (StopReason::kGrammarDeadEnd)
  kFailed,           // sampling threw; `error` says why (an error only if the sequence is still alive)
};

struct StepResult {
  // Per sample (StepJob::samples; one logits row each without speculation).
  std::vector<SampleResult> samples;  // the first token sampled
  std::vector<RowOutcome> outcomes;
  std::vector<std::string> errors;  // for kFailed
  // Speculative decoding: the tokens emitted after the first (accepted drafts, then the correction or bonus), the
  // drafts verified and how many were accepted. Cache entries exist for every emitted token but the last.
  std::vector<std::vector<SampleResult>> more;
  std::vector<int> drafted, accepted;
  ModelWorkStats work;  // the runner's counters after this step
};

class StepExecutor {
 public:
  // `async` starts the worker thread. The runner is used only by the executing thread from then on.
  StepExecutor(ModelRunner& runner, std::vector<TokenId> eos_token_ids, bool async,
               std::unique_ptr<spec::VerifyPolicy> policy = nullptr);
  ~StepExecutor();
  StepExecutor(const StepExecutor&) = delete;
  StepExecutor& operator=(const StepExecutor&) = delete;

  // Queues the job (async) or runs it now (sync).
  void submit(StepJob job);
  // The result of the oldest submitted job not yet returned, waiting for it; rethrows the error it raised.
  StepResult wait();
  int64_t num_submitted_not_returned() const;

 private:
  struct SeqState {
    std::vector<TokenId> tokens;  // prompt + every token sampled for it (including ones still in flight)
    int64_t prompt_len = 0;
    std::shared_ptr<const SamplingParams> params;
    RngKey key;
    // Structured output: the grammar matcher follows this history (its mask fills SamplingContext::allowed_tokens,
    // it accepts each sampled token), so a preemption does not disturb it.
    std::shared_ptr<StructuredState> structured;
  };
  struct Outcome {
    StepResult result;
    std::exception_ptr error;
  };
  // Verifies n drafts of one sample against its logits rows r0 .. r0 + n, extending the history with every
  // emitted token; fills the sample's entries of `res`.
  void verify_row(SeqState& st, const StepJob::Sample& smp, const spec::Draft& draft, int n, int64_t r0, int64_t vocab,
                  StepResult& res, int64_t sample);

  Outcome run(StepJob& job);  // on the executing thread
  // The greedy fast path: every row of the step is the plain argmax of its logits (greedy_argmax.h), no drafts.
  bool greedy_fast_path(const StepJob& job) const;
  void run_greedy(StepJob& job, StepResult& res);
  // Speculative: drafts for the samples that may verify some, extending their batch entries. Returns per sample
  // the drafts to verify (those beyond the count are ignored).
  std::vector<spec::Draft> draft(StepJob& job, std::vector<int>& verify_counts);
  // The log-probabilities of the step's sampled (not verified) rows, on logprob_pool_ when there are several.
  void add_logprobs(const StepJob& job, const std::vector<int>& verify, StepResult& res);

  void worker_loop();

  ModelRunner& runner_;
  const std::vector<TokenId> eos_token_ids_;
  const Sampler sampler_;
  // Log-probabilities of a step's rows (a pass over the vocabulary each: ~20 ms for 64 rows of 32k on one
  // thread, on the critical path between two GPU steps). Made on the first step with enough rows.
  std::unique_ptr<ThreadPool> logprob_pool_;
  const std::unique_ptr<spec::VerifyPolicy> policy_;
  // Executing thread only.
  std::unordered_map<int64_t, SeqState> seqs_;
  std::vector<TokenId> last_sampled_;  // the previous step's sampled tokens, by logits row
  std::vector<float> logits_;

  // Shared between the engine thread and the worker.
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<StepJob> jobs_;
  std::deque<Outcome> outcomes_;
  int64_t outstanding_ = 0;  // submitted, not returned by wait()
  bool stop_ = false;
  std::thread worker_;  // last: started after everything above exists
};

}  // namespace deepinfer
