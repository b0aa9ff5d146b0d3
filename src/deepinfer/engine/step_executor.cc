#include "deepinfer/engine/step_executor.h"

#include <algorithm>
#include <cmath>

#include "deepinfer/core/error.h"

namespace deepinfer {

StepExecutor::StepExecutor(ModelRunner& runner, std::vector<TokenId> eos_token_ids, bool async)
    : runner_(runner), eos_token_ids_(std::move(eos_token_ids)) {
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
    const int64_t rows = job.batch.num_logits_rows;
    DI_CHECK_INTERNAL(static_cast<int64_t>(job.samples.size()) == rows)
        << job.samples.size() << " samples for " << rows << " logits rows";
    job.batch.prev_sampled_tokens = last_sampled_;
    logits_.assign(static_cast<size_t>(rows * vocab), 0.0f);
    runner_.execute(job.batch, logits_);

    StepResult& res = out.result;
    res.work = runner_.work_stats();
    res.samples.resize(static_cast<size_t>(rows));
    res.outcomes.assign(static_cast<size_t>(rows), RowOutcome::kSampled);
    res.errors.resize(static_cast<size_t>(rows));
    std::vector<TokenId> sampled(static_cast<size_t>(rows), 0);
    for (int64_t row = 0; row < rows; ++row) {
      const StepJob::Sample& smp = job.samples[row];
      const auto it = seqs_.find(smp.seq_id);
      DI_CHECK_INTERNAL(it != seqs_.end()) << "sampling unregistered sequence " << smp.seq_id;
      SeqState& st = it->second;
      DI_CHECK_INTERNAL(static_cast<int64_t>(st.tokens.size()) == smp.position)
          << "sequence " << smp.seq_id << ": the executor's history has " << st.tokens.size()
          << " tokens but the step samples position " << smp.position;
      const std::span<const float> logits(logits_.data() + row * vocab, static_cast<size_t>(vocab));
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
          SampleResult r = sampler_.sample(logits, *st.params, ctx, st.key, smp.position);
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
    last_sampled_ = std::move(sampled);
  } catch (...) {
    out.error = std::current_exception();
  }
  return out;
}

}  // namespace deepinfer
