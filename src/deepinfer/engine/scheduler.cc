#include "deepinfer/engine/scheduler.h"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "deepinfer/core/error.h"

namespace deepinfer {

void validate(const SchedulerConfig& c) {
  DI_CHECK(c.max_num_seqs >= 1) << "max_num_seqs must be >= 1, got " << c.max_num_seqs;
  DI_CHECK(c.max_num_batched_tokens >= 1) << "max_num_batched_tokens must be >= 1, got " << c.max_num_batched_tokens;
  DI_CHECK(c.max_model_len >= 1) << "max_model_len must be >= 1, got " << c.max_model_len;
  DI_CHECK(c.num_lookahead_tokens >= 0) << "num_lookahead_tokens must be >= 0, got " << c.num_lookahead_tokens;
  DI_CHECK(c.enable_chunked_prefill || c.max_num_batched_tokens >= c.max_model_len)
      << "without chunked prefill max_num_batched_tokens (" << c.max_num_batched_tokens
      << ") must be >= max_model_len (" << c.max_model_len << ") or long prompts could never run";
}

namespace {

// The planning state of one step: budgets left and the block references the plan has already moved.
class Planner {
 public:
  Planner(const SchedulerInput& in, const CacheView& cache, const SchedulerConfig& config,
          const SchedulingPolicy& policy)
      : running_(in.running.begin(), in.running.end()),
        waiting_(in.waiting.begin(), in.waiting.end()),
        cache_(cache),
        config_(config) {
    policy.order(running_);
    policy.order(waiting_);
    budget_ = config.max_num_batched_tokens;
    available_ = cache.num_available_blocks();
  }

  StepPlan run() {
    for (const Sequence* s : running_)
      if (s->is_decode()) schedule_running(s);
    for (const Sequence* s : running_)
      if (!s->is_decode()) schedule_running(s);
    if (plan_.preempted.empty()) admit_waiting();
    return std::move(plan_);
  }

 private:
  int bs() const { return cache_.block_size(); }
  bool done(const Sequence* s) const { return scheduled_.count(s) || preempted_.count(s); }

  // Blocks that become used again if `b` is referenced once more: 1 if it is currently available (free would
  // be impossible for a cached block; parked, or all its references released by this plan's preemptions).
  bool is_available(BlockId b) const {
    const auto it = released_.find(b);
    return cache_.ref_count(b) - (it == released_.end() ? 0 : it->second) == 0 && !revived_.count(b);
  }

  // Preempts the last running sequence in the policy's order (FCFS: the newest) not yet scheduled this step.
  // Returns it, or nullptr if none.
  const Sequence* preempt_newest() {
    for (auto it = running_.rbegin(); it != running_.rend(); ++it) {
      const Sequence* v = *it;
      if (done(v)) continue;
      preempted_.insert(v);
      plan_.preempted.push_back(v);
      for (BlockId b : v->block_table)
        if (cache_.ref_count(b) - ++released_[b] == 0) ++available_;
      return v;
    }
    return nullptr;
  }

  // Makes `need` blocks available by preempting, unless `s` itself gets preempted. Returns false then.
  bool make_room(const Sequence* s, int64_t need) {
    while (need > available_) {
      const Sequence* v = preempt_newest();
      if (v == nullptr || v == s) return false;
    }
    return true;
  }

  void add(const Sequence* s, int64_t start, int64_t end, int64_t new_blocks, bool admitted, PrefixMatch prefix) {
    DI_CHECK_INTERNAL(end > start && end <= s->num_tokens() && end <= config_.max_model_len)
        << "bad chunk [" << start << ", " << end << ") for sequence " << s->id << " of " << s->num_tokens()
        << " tokens";
    ScheduledSeq e;
    e.seq = s;
    e.start = start;
    e.end = end;
    e.sample = end == s->num_tokens();
    e.admitted = admitted;
    e.prefix = std::move(prefix);
    e.num_new_blocks = new_blocks;
    budget_ -= end - start;
    available_ -= new_blocks;
    plan_.num_batched_tokens += end - start;
    (end - start == 1 && s->is_decode() ? plan_.num_decodes : plan_.num_prefills) += 1;
    scheduled_.insert(s);
    plan_.scheduled.push_back(std::move(e));
  }

  void schedule_running(const Sequence* s) {
    // A sequence whose pending token ends it (max_tokens / max_model_len) has nothing more to compute.
    if (done(s) || budget_ <= 0 || s->final_pending) return;
    const int64_t start = s->num_computed;
    const int64_t remaining = s->num_tokens() - start;
    DI_CHECK_INTERNAL(remaining >= 1) << "running sequence " << s->id << " has nothing to compute";
    int64_t n = std::min(remaining, budget_);
    if (!config_.enable_chunked_prefill && n < remaining) return;
    const int64_t held = static_cast<int64_t>(s->block_table.size());
    const int64_t need = std::max<int64_t>(0, blocks_for_tokens(start + n, bs()) - held);
    if (!make_room(s, need)) {
      if (preempted_.count(s)) return;
      // Nobody left to preempt (everything else is already scheduled): run what fits, or wait a step.
      n = std::min(n, (held + available_) * bs() - start);
      if (n <= 0 || (!config_.enable_chunked_prefill && n < remaining)) return;
    }
    const int64_t base_blocks = std::max<int64_t>(0, blocks_for_tokens(start + n, bs()) - held);
    add(s, start, start + n, base_blocks, false, {});
    if (config_.num_lookahead_tokens > 0 && remaining == 1 && n == 1 && s->is_decode() && s->last_chunk_sampled) {
      // Draft positions: within the budget, below max_model_len (the token after the last draft still fits),
      // and in blocks that are free now (never preempt for a speculation).
      int64_t look = std::min<int64_t>({config_.num_lookahead_tokens, budget_, config_.max_model_len - start - 2});
      const int64_t have = held + base_blocks;
      look = std::min(look, (have + available_) * bs() - (start + 1));
      if (look > 0) {
        const int64_t extra = std::max<int64_t>(0, blocks_for_tokens(start + 1 + look, bs()) - have);
        ScheduledSeq& e = plan_.scheduled.back();
        e.lookahead = look;
        e.num_new_blocks += extra;
        available_ -= extra;
        budget_ -= look;
        plan_.num_batched_tokens += look;
      }
    }
  }

  void admit_waiting() {
    int64_t running = static_cast<int64_t>(running_.size());
    for (const Sequence* s : waiting_) {
      if (running >= config_.max_num_seqs || budget_ <= 0) return;
      // A sequence preempted while one of its samples was in flight restarts once that token is known (its
      // prefix lookup needs the values). The engine processes that step before the next plan, so this is a guard.
      if (s->num_pending > 0) return;
      PrefixMatch m = cache_.match_prefix(s->tokens, s->prompt_len);
      const int64_t start = m.compute_from;
      const int64_t remaining = s->num_tokens() - start;
      int64_t n = std::min(remaining, budget_);
      if (!config_.enable_chunked_prefill && n < remaining) return;
      int64_t revive = 0;
      for (BlockId b : m.blocks) revive += is_available(b) ? 1 : 0;
      const int64_t held = static_cast<int64_t>(m.blocks.size());
      const int64_t room = available_ - revive;  // blocks left for new allocations after adopting the prefix
      n = std::min(n, (held + room) * bs() - start);
      // Strict queue order: if the head cannot start, nobody behind it may (under FCFS that prevents starvation).
      if (n <= 0 || (!config_.enable_chunked_prefill && n < remaining)) return;
      for (BlockId b : m.blocks)
        if (is_available(b)) revived_.insert(b);
      available_ -= revive;
      const int64_t need = std::max<int64_t>(0, blocks_for_tokens(start + n, bs()) - held);
      add(s, start, start + n, need, true, std::move(m));
      ++running;
    }
  }

  std::vector<const Sequence*> running_;  // in the policy's order
  std::vector<const Sequence*> waiting_;
  const CacheView& cache_;
  const SchedulerConfig& config_;
  StepPlan plan_;
  int64_t budget_ = 0;
  int64_t available_ = 0;
  std::unordered_set<const Sequence*> scheduled_;
  std::unordered_set<const Sequence*> preempted_;
  std::unordered_map<BlockId, int32_t> released_;  // references dropped by this plan's preemptions
  std::unordered_set<BlockId> revived_;            // available blocks this plan's admissions take back
};

}  // namespace

StepPlan schedule(const SchedulerInput& in, const CacheView& cache, const SchedulerConfig& config,
                  const SchedulingPolicy& policy) {
  return Planner(in, cache, config, policy).run();
}

StepPlan schedule(const SchedulerInput& in, const CacheView& cache, const SchedulerConfig& config) {
  return schedule(in, cache, config, *make_scheduling_policy(config.policy));
}

}  // namespace deepinfer
