#include "deepinfer/engine/engine.h"

#include <algorithm>
#include <cmath>

#include "deepinfer/core/error.h"
#include "deepinfer/core/logging.h"
#include "deepinfer/engine/structured_output.h"
#include "deepinfer/spec/dspark_policy.h"

namespace deepinfer {

namespace {
// A hit past the prompt may need a longer replay than the config's (ModelRunner::prefix_replay_tokens_past_prompt).
EngineConfig with_runner_replay(EngineConfig c, const ModelRunner& runner) {
  if (c.kv.prefix_replay_tokens_past_prompt == 0)
    c.kv.prefix_replay_tokens_past_prompt = runner.prefix_replay_tokens_past_prompt();
  return c;
}

EngineConfig with_speculation(EngineConfig c) {
  DI_CHECK(c.num_draft_tokens >= 0) << "num_draft_tokens must be >= 0, got " << c.num_draft_tokens;
  DI_CHECK(c.draft_token_budget >= 0) << "draft_token_budget must be >= 0, got " << c.draft_token_budget;
  if (c.num_draft_tokens > 0) {
    c.async_scheduling = false;  // a step's token count is known only after verification
    c.scheduler.num_lookahead_tokens = c.num_draft_tokens;
  }
  return c;
}
}  // namespace

Engine::Engine(EngineConfig config, ModelRunner& runner, StreamCallback on_delta)
    : config_(with_runner_replay(with_speculation(std::move(config)), runner)),
      runner_(runner),
      on_delta_(std::move(on_delta)),
      kv_(config_.kv) {
  validate(config_.scheduler);
  DI_CHECK_CODE(config_.num_draft_tokens == 0 || runner_.speculative(), ErrorCode::kUnsupported)
      << "num_draft_tokens " << config_.num_draft_tokens << " needs a model runner with a draft proposer";
  DI_CHECK(config_.kv.num_state_slots >= config_.scheduler.max_num_seqs)
      << "num_state_slots (" << config_.kv.num_state_slots << ") must be >= max_num_seqs ("
      << config_.scheduler.max_num_seqs << ")";
  const int64_t blocks_per_seq = blocks_for_tokens(config_.scheduler.max_model_len, config_.kv.block_size);
  DI_CHECK_CODE(blocks_per_seq <= config_.kv.num_blocks, ErrorCode::kResourceExhausted)
      << "the KV cache has " << config_.kv.num_blocks << " blocks of " << config_.kv.block_size
      << " tokens but one sequence of max_model_len " << config_.scheduler.max_model_len << " needs " << blocks_per_seq
      << ": lower max_model_len or give the cache more memory";
  for (TokenId t : config_.eos_token_ids)
    DI_CHECK(t >= 0 && t < runner_.vocab_size()) << "eos token id " << t << " outside the vocabulary";
  if (config_.grammar_compiler)
    check_structured_config(*config_.grammar_compiler, config_.eos_token_ids, runner_.vocab_size());
  policy_ = make_scheduling_policy(config_.scheduler.policy);
  runner_.set_num_blocks(config_.kv.num_blocks);
  std::unique_ptr<spec::VerifyPolicy> policy;
  if (config_.draft_confidence_threshold > 0)
    policy = std::make_unique<spec::DsparkBudgetPolicy>(config_.draft_confidence_threshold);
  executor_ =
      std::make_unique<StepExecutor>(runner_, config_.eos_token_ids, config_.async_scheduling, std::move(policy));
}

Engine::~Engine() = default;

void Engine::add_request(Request r) {
  const int64_t vocab = runner_.vocab_size();
  const auto& sc = config_.scheduler;
  DI_CHECK(!r.request_id.empty()) << "request_id must not be empty";
  DI_CHECK(!request_seqs_.count(r.request_id)) << "request_id '" << r.request_id << "' is already in use";
  DI_CHECK(!r.prompt_token_ids.empty()) << "request '" << r.request_id << "': the prompt is empty";
  const int64_t len = static_cast<int64_t>(r.prompt_token_ids.size());
  DI_CHECK(len <= sc.max_model_len) << "request '" << r.request_id << "': the prompt has " << len
                                    << " tokens, more than max_model_len " << sc.max_model_len
                                    << " (prompts are rejected, never truncated)";
  for (int64_t i = 0; i < len; ++i) {
    const TokenId t = r.prompt_token_ids[i];
    DI_CHECK(t >= 0 && t < vocab) << "request '" << r.request_id << "': prompt token " << i << " is " << t
                                  << ", outside the vocabulary [0, " << vocab << ")";
  }
  validate(r.params, vocab);
  DI_CHECK(r.params.stop.empty() || config_.detokenize)
      << "request '" << r.request_id << "': stop strings need an engine configured with a detokenizer";

  structured::CompiledConstraint constraint;
  if (r.params.structured.active()) {
    DI_CHECK(config_.grammar_compiler != nullptr)
        << "request '" << r.request_id << "': structured output needs an engine configured with a tokenizer";
    constraint = compile_structured(*config_.grammar_compiler, r.request_id, r.params.structured);
  }
  auto params = std::make_shared<const SamplingParams>(std::move(r.params));
  auto& ids = request_seqs_[r.request_id];
  for (int i = 0; i < params->n; ++i) {
    auto s = std::make_unique<Sequence>();
    s->id = next_seq_id_++;
    s->request_id = r.request_id;
    s->sample_index = i;
    s->params = params;
    s->priority = r.priority;
    s->tokens = r.prompt_token_ids;
    s->prompt_len = len;
    if (constraint.masks) s->structured = std::make_shared<StructuredState>(StructuredState{constraint});
    waiting_.push_back(s.get());
    ids.push_back(s->id);
    sequences_.emplace(s->id, std::move(s));
  }
}

RngKey Engine::rng_key(const Sequence& s) const {
  if (s.params->seed) return {*s.params->seed, static_cast<uint64_t>(s.sample_index)};
  return {config_.seed, mix64(static_cast<uint64_t>(s.id))};
}

void Engine::release_cache(Sequence& s) {
  kv_.release(s.block_table);
  s.prefix_cursor = {};
  if (s.state_slot >= 0) {
    // The slot (and the blocks above) may be reused by the next plan at once: every step executes in launch
    // order, so a step still in flight that uses them runs before any later user. The runner hears of the
    // release with the next launched step, on the executing thread.
    kv_.free_slot(s.state_slot);
    released_slots_.push_back(s.state_slot);
    s.state_slot = -1;
  }
}

void Engine::preempt(Sequence& s) {
  release_cache(s);
  // A structured sequence's grammar matcher lives with the executor's history, which a preemption keeps.
  s.num_computed = 0;
  s.persistent_until = 0;
  s.status = SequenceStatus::kPreempted;
  ++s.num_preemptions;
  ++stats_.preemptions;
  running_.erase(std::find(running_.begin(), running_.end(), &s));
  // Back in FCFS position: ahead of every newer arrival.
  const auto pos = std::lower_bound(waiting_.begin(), waiting_.end(), &s,
                                    [](const Sequence* a, const Sequence* b) { return a->id < b->id; });
  waiting_.insert(pos, &s);
}

void Engine::finish(Sequence& s, StopReason reason, std::string stop_string, SequenceDelta* delta) {
  const bool was_waiting = s.waiting();
  release_cache(s);
  s.status = SequenceStatus::kFinished;
  s.stop_reason = reason;
  s.stop_string = stop_string;
  if (was_waiting) {
    waiting_.erase(std::find(waiting_.begin(), waiting_.end(), &s));
  } else {
    running_.erase(std::find(running_.begin(), running_.end(), &s));
  }
  delta->finished = true;
  delta->stop_reason = reason;
  delta->stop_string = std::move(stop_string);

  CompletedSequence c;
  c.request_id = s.request_id;
  c.sample_index = s.sample_index;
  c.prompt_len = s.prompt_len;
  c.output_token_ids.assign(s.output().begin(), s.output().end());
  c.logprobs = std::move(s.logprobs);
  c.stop_reason = reason;
  c.stop_string = s.stop_string;
  c.num_cached_prompt_tokens = s.num_cached_prompt_tokens;
  c.num_preemptions = s.num_preemptions;
  c.spec = s.spec;
  finished_.push_back(std::move(c));

  auto& ids = request_seqs_.at(s.request_id);
  ids.erase(std::find(ids.begin(), ids.end(), s.id));
  if (ids.empty()) request_seqs_.erase(s.request_id);
  if (s.registered) dropped_seqs_.push_back(s.id);
  sequences_.erase(s.id);  // `s` is gone after this line; a step in flight that has it is discarded
}

bool Engine::abort(const std::string& request_id) {
  const auto it = request_seqs_.find(request_id);
  if (it == request_seqs_.end()) return false;
  const std::vector<int64_t> ids = it->second;  // finish() edits the map
  for (int64_t id : ids) {
    Sequence& s = seq(id);
    SequenceDelta d;
    d.request_id = s.request_id;
    d.sample_index = s.sample_index;
    finish(s, StopReason::kAborted, "", &d);
    if (on_delta_) on_delta_(d);
  }
  return true;
}

namespace {
// Consecutive failed block allocations after which a sequence is given up on (finished with kError) rather than
// preempted once more: a fault that persists must not turn into a request that never ends.
constexpr int kMaxAllocationFailures = 8;
}  // namespace

void Engine::commit(StepPlan& plan) {
  for (const Sequence* p : plan.preempted) preempt(seq(p->id));
  // Adopt every prefix hit before allocating anything: allocation may evict parked blocks, and a block another
  // admission is about to share must be referenced first.
  for (const ScheduledSeq& e : plan.scheduled) {
    if (!e.admitted) continue;
    Sequence& s = seq(e.seq->id);
    s.prefix_cursor = kv_.adopt_prefix(e.prefix, s.num_tokens(), s.block_table);
    s.num_computed = e.start;
    s.persistent_until = e.prefix.cached_tokens;
    if (s.num_preemptions == 0) s.num_cached_prompt_tokens = e.prefix.cached_tokens;
    const auto slot = kv_.allocate_slot();
    DI_CHECK_INTERNAL(slot.has_value()) << "no free state slot although max_num_seqs allows admission";
    s.state_slot = *slot;
    s.reset_state = true;
    s.last_chunk_sampled = false;
    s.status = SequenceStatus::kRunning;
    waiting_.erase(std::find(waiting_.begin(), waiting_.end(), &s));
    running_.push_back(&s);
  }
  // The plan only asks for blocks that are available, so an allocation fails only when the pool says so
  // (KvCacheConfig::allocation_fault): that sequence sits this step out, preempted, and the rest run.
  std::vector<ScheduledSeq> kept;
  kept.reserve(plan.scheduled.size());
  for (const ScheduledSeq& e : plan.scheduled) {
    Sequence& s = seq(e.seq->id);
    if (kv_.allocate(s.block_table, e.num_new_blocks)) {
      s.num_allocation_failures = 0;
      kept.push_back(e);
      continue;
    }
    ++stats_.allocation_failures;
    if (++s.num_allocation_failures < kMaxAllocationFailures) {
      DI_LOG_WARN("request '{}': {} KV blocks could not be allocated; preempted, will retry", s.request_id,
                  e.num_new_blocks);
      preempt(s);
      continue;
    }
    DI_LOG_ERROR("request '{}': KV block allocation failed {} times in a row; finished with an error", s.request_id,
                 s.num_allocation_failures);
    SequenceDelta d;
    d.request_id = s.request_id;
    d.sample_index = s.sample_index;
    finish(s, StopReason::kError, "", &d);
    if (on_delta_) on_delta_(d);
  }
  plan.scheduled = std::move(kept);
}

void Engine::launch(const StepPlan& plan) {
  StepJob job;
  InflightStep meta;
  job.batch.block_size = kv_.block_size();
  job.released_slots = std::exchange(released_slots_, {});
  job.drops = std::exchange(dropped_seqs_, {});
  int64_t row = 0;
  for (const ScheduledSeq& e : plan.scheduled) {
    Sequence& s = seq(e.seq->id);
    if (!s.registered) {
      DI_CHECK_INTERNAL(s.num_pending == 0) << "sequence " << s.id << " has pending tokens before its first step";
      // The grammar state moves to the executor: from here on only the executing thread touches it.
      job.registrations.push_back({s.id, s.tokens, s.prompt_len, s.params, rng_key(s), std::move(s.structured)});
      s.registered = true;
    }
    // Copies: the engine edits tokens and block tables while the step runs.
    std::vector<TokenId> ids;
    ids.reserve(static_cast<size_t>(e.end - e.start));
    for (int64_t p = e.start; p < std::min(e.end, s.num_known()); ++p) ids.push_back(s.tokens[p]);
    BatchEntry b;
    if (e.end > s.num_known()) {
      // The last token is the previous step's sample, not processed yet (at most one is pending when planning).
      DI_CHECK_INTERNAL(e.end == s.num_known() + 1 && s.num_pending == 1 && s.pending_row >= 0)
          << "sequence " << s.id << ": chunk [" << e.start << ", " << e.end << ") but " << s.num_known()
          << " known tokens and " << s.num_pending << " pending";
      ids.push_back(kPendingToken);
      b.pending_row = s.pending_row;
    }
    job.token_storage.push_back(std::move(ids));
    job.table_storage.push_back(s.block_table);
    b.seq_id = s.id;
    b.start = e.start;
    b.state_slot = s.state_slot;
    b.reset_state = s.reset_state;
    b.persistent_until = s.persistent_until;
    b.prompt_len = s.prompt_len;
    // Only a chunk that starts the slot's state reads the prefix ids (all known: the sequence was waiting).
    job.prefix_storage.emplace_back();
    if (b.reset_state) job.prefix_storage.back().assign(s.tokens.begin(), s.tokens.begin() + e.start);
    b.needs_logits = e.sample;
    job.batch.num_tokens += e.end - e.start;
    job.batch.entries.push_back(b);
    if (!s.is_decode()) stats_.prompt_tokens_computed += e.end - e.start;

    // Optimistically, the step has run: the scheduler plans the next one from here.
    meta.push_back({s.id, e.end, s.num_preemptions, e.sample ? row : -1});
    s.num_computed = e.end;
    s.reset_state = false;
    s.last_chunk_sampled = e.sample;
    if (e.sample) {
      StepJob::Sample smp{s.id, e.end};
      smp.entry = static_cast<int32_t>(job.batch.entries.size() - 1);
      if (e.lookahead > 0) {
        // Drafts: at most the reserved positions, and never past max_tokens (the step emits drafts + 1 tokens).
        int64_t cap = e.lookahead;
        if (s.params->max_tokens) cap = std::min<int64_t>(cap, *s.params->max_tokens - (e.end + 1 - s.prompt_len));
        smp.max_drafts = static_cast<int>(std::max<int64_t>(0, cap));
        job.draft_budget += smp.max_drafts;
      }
      job.samples.push_back(smp);
      ++s.num_pending;
      s.pending_row = static_cast<int32_t>(row++);
      const int64_t len = e.end + 1;
      s.final_pending = (s.params->max_tokens && len - s.prompt_len >= *s.params->max_tokens) ||
                        len >= config_.scheduler.max_model_len;
    }
  }
  job.batch.num_logits_rows = row;
  if (config_.draft_token_budget > 0) job.draft_budget = std::min(job.draft_budget, config_.draft_token_budget);
  for (size_t i = 0; i < job.batch.entries.size(); ++i) {
    job.batch.entries[i].token_ids = job.token_storage[i];
    job.batch.entries[i].block_table = job.table_storage[i];
    job.batch.entries[i].prefix_token_ids = job.prefix_storage[i];
  }
  executor_->submit(std::move(job));
  inflight_.push_back(std::move(meta));
}

void Engine::process(StepStats& st) {
  StepResult res;
  std::string step_error;
  try {
    res = executor_->wait();
  } catch (const std::exception& e) {
    step_error = e.what();
  }
  const InflightStep meta = std::move(inflight_.front());
  inflight_.pop_front();
  std::vector<SequenceDelta> deltas;
  if (!step_error.empty()) {
    // The step's sequences lose their cache entries and pending samples: finish them with an error (the
    // executor kept their histories consistent for any step launched behind this one, whose rows for them are
    // then discarded). Sequences outside the step carry on.
    ++stats_.failed_steps;
    DI_LOG_ERROR("step failed, finishing its {} sequences: {}", meta.size(), step_error);
    for (const InflightEntry& m : meta) {
      const auto it = sequences_.find(m.seq_id);
      if (it == sequences_.end()) continue;
      SequenceDelta d;
      d.request_id = it->second->request_id;
      d.sample_index = it->second->sample_index;
      finish(*it->second, StopReason::kError, "", &d);
      ++st.num_finished;
      deltas.push_back(std::move(d));
    }
    stats_.kv = kv_.stats();
    if (on_delta_)
      for (const auto& d : deltas) on_delta_(d);
    return;
  }
  stats_.model = res.work;
  for (const InflightEntry& m : meta) {
    const auto it = sequences_.find(m.seq_id);
    if (it == sequences_.end()) {  // finished or aborted after this step was launched
      if (m.row >= 0) {
        ++st.num_discarded;
        ++stats_.discarded_tokens;
      }
      continue;
    }
    Sequence& s = *it->second;
    // A verification step also computed the positions of its accepted drafts (every emitted token but the last).
    const int64_t extra =
        m.row >= 0 && res.outcomes[m.row] == RowOutcome::kSampled ? static_cast<int64_t>(res.more[m.row].size()) : 0;
    // Preempted since launch: the chunk's cache entries were dropped with the blocks, only its token counts.
    const bool current = s.num_preemptions == m.num_preemptions;
    if (current && extra == 0) kv_.cache_full_blocks(s.tokens, m.end, s.block_table, s.prefix_cursor);
    if (m.row < 0) continue;
    --s.num_pending;
    SequenceDelta d;
    d.request_id = s.request_id;
    d.sample_index = s.sample_index;
    const RowOutcome outcome = res.outcomes[m.row];
    DI_CHECK_INTERNAL(outcome != RowOutcome::kFailed)
        << "request '" << s.request_id << "': sampling failed: " << res.errors[m.row];
    if (outcome != RowOutcome::kSampled) {
      StopReason reason = StopReason::kError;
      if (outcome == RowOutcome::kGrammarComplete) reason = StopReason::kGrammarComplete;
      if (outcome == RowOutcome::kGrammarDeadEnd) reason = StopReason::kGrammarDeadEnd;
      if (outcome == RowOutcome::kNonFinite)
        DI_LOG_ERROR("request '{}': non-finite logits at position {}", s.request_id, m.end - 1);
      finish(s, reason, "", &d);
      ++st.num_finished;
      deltas.push_back(std::move(d));
      continue;
    }
    DI_CHECK_INTERNAL(s.num_known() == m.end)
        << "sequence " << s.id << " has " << s.num_known() << " known tokens but its sample is for position " << m.end;
    s.spec.add(res.drafted[m.row], res.accepted[m.row]);
    stats_.spec.add(res.drafted[m.row], res.accepted[m.row]);
    if (extra > 0 && current) {
      // Synchronous only (speculation turns asynchronous scheduling off): nothing else is in flight.
      s.num_computed += extra;
    }
    StopCheck stop;
    for (int64_t k = 0; k <= extra && stop.reason == StopReason::kNone; ++k) {
      SampleResult& r = k == 0 ? res.samples[m.row] : res.more[m.row][k - 1];
      s.tokens.push_back(r.token);
      if (s.status == SequenceStatus::kRunning) s.status = SequenceStatus::kDecoding;
      ++stats_.generated_tokens;
      d.new_token_ids.push_back(r.token);
      if (s.params->logprobs) {
        s.logprobs.push_back(r);
        d.logprobs.push_back(std::move(r));
      }
      stop = check_stop(s, config_.eos_token_ids, config_.scheduler.max_model_len, config_.detokenize);
    }
    if (extra > 0 && current)  // a stop inside the accepted run leaves fewer known tokens than computed positions
      kv_.cache_full_blocks(s.tokens, std::min(s.num_computed, s.num_known()), s.block_table, s.prefix_cursor);
    if (stop.reason != StopReason::kNone) {
      finish(s, stop.reason, stop.stop_string, &d);
      ++st.num_finished;
    } else {
      DI_CHECK_INTERNAL(!s.final_pending || s.num_pending > 0)
          << "sequence " << s.id << " reached its length limit without stopping";
    }
    deltas.push_back(std::move(d));
  }
  stats_.kv = kv_.stats();
  if (on_delta_)
    for (const auto& d : deltas) on_delta_(d);
}

StepStats Engine::step() {
  StepStats st;
  if (!has_unfinished()) return st;
  bool launched = false;
  if (!running_.empty() || !waiting_.empty()) {
    const std::vector<const Sequence*> running(running_.begin(), running_.end());
    const std::vector<const Sequence*> waiting(waiting_.begin(), waiting_.end());
    StepPlan plan = schedule({running, waiting}, kv_, config_.scheduler, *policy_);
    st.num_preempted = static_cast<int>(plan.preempted.size());
    commit(plan);
    ++stats_.steps;
    st.num_decodes = plan.num_decodes;
    st.num_prefills = plan.num_prefills;
    st.num_batched_tokens = plan.num_batched_tokens;
    if (!plan.scheduled.empty()) {
      launch(plan);
      launched = true;
    }
  }
  // Synchronous: process the step just launched. Asynchronous: keep it running while the previous one is
  // processed; when nothing new could be launched, drain.
  const size_t keep = config_.async_scheduling && launched ? 1 : 0;
  while (inflight_.size() > keep) process(st);
  stats_.kv = kv_.stats();
  return st;
}

int64_t Engine::run_to_completion(int64_t max_steps) {
  int64_t n = 0;
  while (has_unfinished() && (max_steps == 0 || n < max_steps)) {
    step();
    ++n;
  }
  return n;
}

std::vector<CompletedSequence> Engine::take_finished() { return std::exchange(finished_, {}); }

void Engine::check_invariants() const {
  std::vector<const BlockTable*> tables;
  for (const auto& [id, s] : sequences_) tables.push_back(&s->block_table);
  kv_.check_invariants(tables);
}

}  // namespace deepinfer
