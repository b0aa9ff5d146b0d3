// The scheduler: a pure step, (sequences, cache view, config) → StepPlan. It reads and never mutates; the
// Engine commits the plan (releases preempted sequences, adopts prefix hits, allocates blocks) and runs it.
//
// Steps, in order (the queues ordered by the SchedulingPolicy, scheduling_policy.h; "oldest" below is FCFS's
// order, priority puts lower Request::priority values first):
//   1. decodes of running sequences, oldest first (one token each: cheap, and latency-critical);
//   2. prefill chunks of running sequences (admitted earlier, or recomputing after preemption), oldest first;
//   3. admission of waiting sequences in strict queue order (head-of-line: a later arrival never overtakes an
//      earlier one, so under FCFS nothing starves), each starting after its longest cached prefix, while
//      max_num_seqs and the token budget allow. No admissions in a step that had to preempt (they would be
//      preempted next).
// Chunked prefill: a prefill takes min(remaining tokens, remaining budget) and continues next step.
// Preemption by recompute: when a running sequence needs a block and none is available, the newest running
// sequence (the last in the policy's running order) not yet scheduled in this step drops its cache and waits
// again (ahead of newer arrivals); if that is the needy sequence itself, it is the one preempted. The oldest running
// sequence therefore always progresses, and since the engine checks that one max_model_len sequence fits the
// cache, every sequence finishes.
// Asynchronous scheduling: the plan may be made while the previous step runs. Sequences then count their pending
// (sampled, value unknown) tokens in num_tokens(); one whose pending token ends it (final_pending) is skipped.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "deepinfer/engine/scheduling_policy.h"
#include "deepinfer/engine/sequence.h"
#include "deepinfer/kv/kv_cache_manager.h"

namespace deepinfer {

struct SchedulerConfig {
  int max_num_seqs = 4;                   // running sequences (each holds a state slot)
  int64_t max_num_batched_tokens = 2048;  // tokens computed per step, prefill and decode together
  int64_t max_model_len = 32768;          // prompt + output tokens of one sequence
  bool enable_chunked_prefill = true;     // false: a prefill runs whole or waits
  SchedulingPolicyKind policy = SchedulingPolicyKind::kFcfs;
  // Speculative decoding: positions a decode may verify beyond its token (drafts), reserved in the token budget
  // and in blocks when they fit without preempting anyone (else fewer, down to none).
  int num_lookahead_tokens = 0;
};
void validate(const SchedulerConfig& c);

struct SchedulerInput {
  std::span<const Sequence* const> running;  // admission order, oldest first
  std::span<const Sequence* const> waiting;  // FCFS order (preempted sequences keep their place by id)
};

struct ScheduledSeq {
  const Sequence* seq = nullptr;
  int64_t start = 0;  // compute positions [start, end)
  int64_t end = 0;
  bool sample = false;         // end == num_tokens: the last position's logits are sampled
  bool admitted = false;       // waiting → running this step: adopt `prefix`, take a state slot, reset its state
  PrefixMatch prefix;          // admitted only
  int64_t num_new_blocks = 0;  // blocks to allocate after adopting the prefix (lookahead included)
  int64_t lookahead = 0;       // decodes: draft positions reserved after `end` (num_lookahead_tokens)
  int64_t num_tokens() const { return end - start; }
};

struct StepPlan {
  std::vector<ScheduledSeq> scheduled;     // decodes first, then running prefills, then admissions
  std::vector<const Sequence*> preempted;  // newest first; released before anything is allocated
  int64_t num_batched_tokens = 0;
  int num_decodes = 0;
  int num_prefills = 0;
  bool empty() const { return scheduled.empty() && preempted.empty(); }
};

// With the policy config.policy names, or the one given (the engine keeps one).
StepPlan schedule(const SchedulerInput& in, const CacheView& cache, const SchedulerConfig& config);
StepPlan schedule(const SchedulerInput& in, const CacheView& cache, const SchedulerConfig& config,
                  const SchedulingPolicy& policy);

}  // namespace deepinfer
