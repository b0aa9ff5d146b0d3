#include "deepinfer/engine/step_executor.h"

#include <algorithm>
#include <cmath>

#include "deepinfer/core/error.h"
#include "deepinfer/engine/greedy_argmax.h"
#include "deepinfer/spec/verifier.h"

namespace deepinfer {
namespace {

// Every per-sample field sized for n samples: sampled, no error, no drafts.
void size_result(StepResult& res, int64_t n) {
  const auto count = static_cast<size_t>(n);
  res.samples.resize(count);
  res.outcomes.assign(count, RowOutcome::kSampled);
  res.errors.resize(count);
  res.more.resize(count);
  res.drafted.assign(count, 0);
  res.accepted.assign(count, 0);
}

SampleResult with_logprobs(TokenId token, std::span<const float> raw, const SamplingParams& p) {
  SampleResult r;
  r.token = token;
  if (p.logprobs) {
    const std::vector<float> lp = log_softmax(raw);
    r.logprob = lp[token];
    r.top_logprobs = top_logprobs(lp, *p.logprobs);
  }
  return r;
}
}  // namespace

StepExecutor::StepExecutor(ModelRunner& runner, std::vector<TokenId> eos_token_ids, bool async,
                           std::unique_ptr<spec::VerifyPolicy> policy)
    : runner_(runner),
      eos_token_ids_(std::move(eos_token_ids)),
      policy_(policy ? std::move(policy) : std::make_unique<spec::FixedLengthPolicy>()) {
  if (async) worker_ = std::thread([this] { worker_loop(); });
}

StepExecutor::~StepExecutor() {
  if (!worker_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

void StepExecutor::submit(StepJob job) {
  if (!worker_.joinable()) {
    Outcome o = run(job);
    std::lock_guard<std::mutex> lock(mu_);
    outcomes_.push_back(std::move(o));
    ++outstanding_;
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.push_back(std::move(job));
    ++outstanding_;
  }
  cv_.notify_all();
}

StepResult StepExecutor::wait() {
  std::unique_lock<std::mutex> lock(mu_);
  DI_CHECK_INTERNAL(outstanding_ > 0) << "StepExecutor::wait without a submitted step";
  cv_.wait(lock, [this] { return !outcomes_.empty(); });
  Outcome o = std::move(outcomes_.front());
  outcomes_.pop_front();
  --outstanding_;
  lock.unlock();
  if (o.error) std::rethrow_exception(o.error);
  return std::move(o.result);
}

int64_t StepExecutor::num_submitted_not_returned() const {
  std::lock_guard<std::mutex> lock(mu_);
  return outstanding_;
}

void StepExecutor::worker_loop() {
  for (;;) {
    StepJob job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stop_ || !jobs_.empty(); });
      if (stop_) return;  // jobs still queued are abandoned: the engine is going away
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    Outcome o = run(job);
    {
      std::lock_guard<std::mutex> lock(mu_);
      outcomes_.push_back(std::move(o));
    }
    cv_.notify_all();
  }
}

StepExecutor::Outcome StepExecutor::run(StepJob& job) {
  Outcome out;
  try {
    for (int32_t slot : job.released_slots) runner_.release_slot(slot);
    for (int64_t id : job.drops) seqs_.erase(id);
    for (auto& r : job.registrations) {
      DI_CHECK_INTERNAL(!seqs_.count(r.seq_id)) << "sequence " << r.seq_id << " registered twice";
      seqs_[r.seq_id] =
          SeqState{std::move(r.tokens), r.prompt_len, std::move(r.params), r.key, std::move(r.structured)};
    }
    const int64_t vocab = runner_.vocab_size();
    const int64_t num_samples = static_cast<int64_t>(job.samples.size());
    DI_CHECK_INTERNAL(num_samples == job.batch.num_logits_rows)
        << job.samples.size() << " samples for " << job.batch.num_logits_rows << " logits rows";
    std::vector<int> verify(static_cast<size_t>(num_samples), 0);
    const std::vector<spec::Draft> drafts = draft(job, verify);
    const int64_t rows = job.batch.num_logits_rows;
    job.batch.prev_sampled_tokens = last_sampled_;
    if (greedy_fast_path(job)) {
      run_greedy(job, out.result);
      return out;
    }
    logits_.assign(static_cast<size_t>(rows * vocab), 0.0f);
    runner_.execute(job.batch, logits_);

    StepResult& res = out.result;
    res.work = runner_.work_stats();
    size_result(res, num_samples);
    std::vector<TokenId> sampled(static_cast<size_t>(num_samples), 0);
    std::vector<int64_t> kept_of_sample(static_cast<size_t>(num_samples), 1);  // positions its entry keeps
    int64_t first_row = 0;
    for (int64_t row = 0; row < num_samples; ++row) {
      const StepJob::Sample& smp = job.samples[row];
      const int64_t r0 = first_row;
      first_row += 1 + verify[row];
      const auto it = seqs_.find(smp.seq_id);
      DI_CHECK_INTERNAL(it != seqs_.end()) << "sampling unregistered sequence " << smp.seq_id;
      SeqState& st = it->second;
      DI_CHECK_INTERNAL(static_cast<int64_t>(st.tokens.size()) == smp.position)
          << "sequence " << smp.seq_id << ": the executor's history has " << st.tokens.size()
          << " tokens but the step samples position " << smp.position;
      if (verify[row] > 0) {
        try {
          verify_row(st, smp, drafts[row], verify[row], r0, vocab, res, row);
        } catch (const std::exception& e) {
          res.outcomes[row] = RowOutcome::kFailed;
          res.errors[row] = e.what();
        }
        const int64_t emitted = res.outcomes[row] == RowOutcome::kSampled ? 1 + res.more[row].size() : 0;
        if (emitted == 0) st.tokens.push_back(0);  // as below: the history grows by one token whatever happens
        kept_of_sample[row] = std::max<int64_t>(1, emitted);
        sampled[row] = st.tokens.back();
        continue;
      }
      const std::span<const float> logits(logits_.data() + r0 * vocab, static_cast<size_t>(vocab));
      // Whatever happens to this row, the history grows by one token, so a step launched behind this one (which
      // may feed this row's token to the model, its output then discarded) stays consistent: id 0 stands in.
      RowOutcome& outcome = res.outcomes[row];
      if (!std::all_of(logits.begin(), logits.end(), [](float v) { return std::isfinite(v) || v == -INFINITY; })) {
        outcome = RowOutcome::kNonFinite;
        st.tokens.push_back(0);
        continue;
      }
      try {
        const std::span<const TokenId> all(st.tokens);
        SamplingContext ctx{all.first(st.prompt_len), all.subspan(st.prompt_len), {}, eos_token_ids_};
        if (st.structured) {
          const StructuredMaskOutcome m =
              prepare_structured_mask(*st.structured, *st.params, ctx.output, eos_token_ids_, logits);
          if (m != StructuredMaskOutcome::kSample)
            outcome = m == StructuredMaskOutcome::kGrammarComplete ? RowOutcome::kGrammarComplete
                                                                   : RowOutcome::kGrammarDeadEnd;
          else
            ctx.allowed_tokens = st.structured->allowed;
        }
        if (outcome == RowOutcome::kSampled) {
          SampleResult r = sampler_.sample_token(logits, *st.params, ctx, st.key, smp.position);
          if (st.structured) accept_structured_token(*st.structured, r.token);
          sampled[row] = r.token;
          res.samples[row] = std::move(r);
        }
      } catch (const std::exception& e) {
        // A sequence that already stopped may be sampled once more (e.g. its grammar matcher has terminated):
        // only the engine knows whether this row still matters.
        outcome = RowOutcome::kFailed;
        res.errors[row] = e.what();
      }
      st.tokens.push_back(sampled[row]);
    }
    add_logprobs(job, verify, res);
    if (runner_.speculative()) {
      // Per entry: the positions kept (a verification chunk keeps one per emitted token) and the next token.
      std::vector<ModelRunner::Kept> kept(job.batch.entries.size());
      for (size_t i = 0; i < kept.size(); ++i)
        kept[i].positions = static_cast<int64_t>(job.batch.entries[i].token_ids.size());
      for (int64_t row = 0; row < num_samples; ++row) {
        const int32_t e = job.samples[row].entry;
        DI_CHECK_INTERNAL(e >= 0 && e < static_cast<int32_t>(kept.size())) << "sample without its batch entry";
        if (verify[row] > 0) kept[e].positions = kept_of_sample[row];
        if (res.outcomes[row] == RowOutcome::kSampled) kept[e].next_token = sampled[row];
      }
      runner_.commit_step(job.batch, kept);
    }
    last_sampled_ = std::move(sampled);
  } catch (...) {
    out.error = std::current_exception();
    // A step launched behind this one reads this step's samples (prev_sampled_tokens by row) and expects every
    // sampled sequence's history one token longer: keep both consistent with placeholders. The engine finishes
    // the failed step's sequences, so the placeholders are never part of an output.
    last_sampled_.assign(static_cast<size_t>(job.batch.num_logits_rows), 0);
    for (const StepJob::Sample& smp : job.samples) {
      const auto it = seqs_.find(smp.seq_id);
      if (it != seqs_.end() && static_cast<int64_t>(it->second.tokens.size()) == smp.position)
        it->second.tokens.push_back(0);
    }
  }
  return out;
}

bool StepExecutor::greedy_fast_path(const StepJob& job) const {
  if (runner_.speculative() || job.samples.empty()) return false;
  for (const StepJob::Sample& smp : job.samples) {
    const auto it = seqs_.find(smp.seq_id);
    if (it == seqs_.end()) return false;  // the general path raises the error
    const SeqState& st = it->second;
    if (st.structured || !greedy_fast_path_row(*st.params, smp.position - st.prompt_len)) return false;
  }
  return true;
}

void StepExecutor::run_greedy(StepJob& job, StepResult& res) {
  const int64_t n = static_cast<int64_t>(job.samples.size());
  std::vector<TokenId> tokens(static_cast<size_t>(n), -1);
  std::vector<uint8_t> non_finite(static_cast<size_t>(n), 0);
  // The chosen tokens' logprobs when a row asks for them (one more reduction of each raw row, on the device where
  // the runner reduces there).
  const bool want_logprobs = std::any_of(job.samples.begin(), job.samples.end(), [&](const StepJob::Sample& smp) {
    return greedy_row_wants_logprob(*seqs_.at(smp.seq_id).params);
  });
  std::vector<float> logprobs(want_logprobs ? static_cast<size_t>(n) : 0, 0.0f);
  runner_.execute_argmax(job.batch, ArgmaxRows{tokens, non_finite, logprobs});
  res.work = runner_.work_stats();
  size_result(res, n);
  std::vector<TokenId> sampled(static_cast<size_t>(n), 0);
  // As the general path: one logits row per sample, the history grows by one token whatever happens (id 0 stands
  // in for a row that gave none).
  for (int64_t row = 0; row < n; ++row) {
    const StepJob::Sample& smp = job.samples[row];
    SeqState& st = seqs_.at(smp.seq_id);
    DI_CHECK_INTERNAL(static_cast<int64_t>(st.tokens.size()) == smp.position)
        << "sequence " << smp.seq_id << ": the executor's history has " << st.tokens.size()
        << " tokens but the step samples position " << smp.position;
    if (non_finite[row]) {
      res.outcomes[row] = RowOutcome::kNonFinite;
    } else if (tokens[row] < 0) {
      // Sampler::sample_token's error for a row with nothing left (every logit -inf).
      res.outcomes[row] = RowOutcome::kFailed;
      res.errors[row] = kNoTokenLeft;
    } else {
      sampled[row] = tokens[row];
      res.samples[row].token = tokens[row];
      if (greedy_row_wants_logprob(*st.params)) res.samples[row].logprob = logprobs[row];
    }
    st.tokens.push_back(sampled[row]);
  }
  last_sampled_ = std::move(sampled);
}

void StepExecutor::add_logprobs(const StepJob& job, const std::vector<int>& verify, StepResult& res) {
  const int64_t vocab = runner_.vocab_size();
  std::vector<int64_t> rows;  // sampled rows that asked for log-probabilities
  std::vector<int64_t> first_row(job.samples.size());
  for (int64_t row = 0, r0 = 0; row < static_cast<int64_t>(job.samples.size()); r0 += 1 + verify[row], ++row) {
    first_row[row] = r0;
    if (verify[row] > 0 || res.outcomes[row] != RowOutcome::kSampled) continue;
    if (seqs_.at(job.samples[row].seq_id).params->logprobs) rows.push_back(row);
  }
  auto fill = [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t row = rows[i];
      const std::span<const float> logits(logits_.data() + first_row[row] * vocab, static_cast<size_t>(vocab));
      Sampler::add_logprobs(res.samples[row], logits, *seqs_.at(job.samples[row].seq_id).params);
    }
  };
  constexpr int64_t kMinParallelRows = 4;
  if (static_cast<int64_t>(rows.size()) < kMinParallelRows) return fill(0, static_cast<int64_t>(rows.size()));
  if (!logprob_pool_)
    logprob_pool_ =
        std::make_unique<ThreadPool>(static_cast<int>(std::clamp<unsigned>(std::thread::hardware_concurrency(), 1, 8)));
  logprob_pool_->parallel_for(static_cast<int64_t>(rows.size()), fill);
}

std::vector<spec::Draft> StepExecutor::draft(StepJob& job, std::vector<int>& verify) {
  std::vector<spec::Draft> drafts(job.samples.size());
  if (!runner_.speculative()) return drafts;
  std::vector<spec::DraftCandidate> cands(job.samples.size());
  for (size_t i = 0; i < job.samples.size(); ++i) {
    const StepJob::Sample& smp = job.samples[i];
    if (smp.max_drafts <= 0) continue;
    const auto it = seqs_.find(smp.seq_id);
    DI_CHECK_INTERNAL(it != seqs_.end()) << "drafting for unregistered sequence " << smp.seq_id;
    const BatchEntry& e = job.batch.entries.at(static_cast<size_t>(smp.entry));
    DI_CHECK_INTERNAL(e.token_ids.size() == 1 && e.pending_row < 0)
        << "sequence " << smp.seq_id << ": drafts need a one-token decode with a known token";
    spec::DraftRequest req;
    req.slot = e.state_slot;
    req.max_tokens = smp.max_drafts;
    // The sample's position is where the token this step samples lands, so the first draft (a guess for that
    // token) is at the same position: the sequence length after the previous step's sampled token.
    req.position = smp.position;
    req.params = it->second.params.get();
    req.key = it->second.key;
    drafts[i] = runner_.propose(req);
    if (static_cast<int>(drafts[i].tokens.size()) > smp.max_drafts) drafts[i].tokens.resize(smp.max_drafts);
    cands[i] = {static_cast<int>(drafts[i].tokens.size()), drafts[i].confidence};
  }
  policy_->choose(cands, job.draft_budget, verify);
  for (size_t i = 0; i < job.samples.size(); ++i) {
    if (verify[i] <= 0) continue;
    const size_t ei = static_cast<size_t>(job.samples[i].entry);
    std::vector<TokenId>& ids = job.token_storage.at(ei);
    ids.insert(ids.end(), drafts[i].tokens.begin(), drafts[i].tokens.begin() + verify[i]);
    BatchEntry& e = job.batch.entries[ei];
    e.token_ids = ids;
    e.num_logits = 1 + verify[i];
    job.batch.num_tokens += verify[i];
    job.batch.num_logits_rows += verify[i];
  }
  return drafts;
}

void StepExecutor::verify_row(SeqState& st, const StepJob::Sample& smp, const spec::Draft& draft, int n, int64_t r0,
                              int64_t vocab, StepResult& res, int64_t sample) {
  const SamplingParams& p = *st.params;
  std::vector<SampleResult> emitted;
  RowOutcome first_outcome = RowOutcome::kSampled;
  auto raw = [&](int i) {
    return std::span<const float>(logits_.data() + (r0 + i) * vocab, static_cast<size_t>(vocab));
  };
  auto row = [&](int i) -> std::vector<float> {
    const std::span<const float> logits = raw(i);
    if (!finite_row(logits)) {
      if (i == 0) first_outcome = RowOutcome::kNonFinite;
      return {};
    }
    const std::span<const TokenId> all(st.tokens);
    SamplingContext ctx{all.first(st.prompt_len), all.subspan(st.prompt_len), {}, eos_token_ids_};
    if (st.structured) {
      const StructuredMaskOutcome m = prepare_structured_mask(*st.structured, p, ctx.output, eos_token_ids_, logits);
      if (m != StructuredMaskOutcome::kSample) {
        if (i == 0)
          first_outcome =
              m == StructuredMaskOutcome::kGrammarComplete ? RowOutcome::kGrammarComplete : RowOutcome::kGrammarDeadEnd;
        return {};
      }
      ctx.allowed_tokens = st.structured->allowed;
    }
    return sampler_.process(logits, p, ctx);
  };
  auto emit = [&](int i, TokenId t) {
    if (st.structured) accept_structured_token(*st.structured, t);
    st.tokens.push_back(t);
    emitted.push_back(with_logprobs(t, raw(i), p));
    const bool eos = std::find(eos_token_ids_.begin(), eos_token_ids_.end(), t) != eos_token_ids_.end();
    const int64_t outputs = static_cast<int64_t>(st.tokens.size()) - st.prompt_len;
    return (eos && !p.ignore_eos) ||
           std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), t) != p.stop_token_ids.end() ||
           (p.max_tokens && outputs >= *p.max_tokens);
  };
  const spec::VerifyResult v = spec::verify_draft(draft, n, p.greedy(), row, emit, st.key, smp.position);
  res.drafted[sample] = n;
  res.accepted[sample] = v.num_accepted;
  if (emitted.empty()) {
    res.outcomes[sample] = first_outcome == RowOutcome::kSampled ? RowOutcome::kNonFinite : first_outcome;
    return;
  }
  res.samples[sample] = std::move(emitted[0]);
  res.more[sample].assign(std::make_move_iterator(emitted.begin() + 1), std::make_move_iterator(emitted.end()));
}

}  // namespace deepinfer
