// Expert parallelism (EP) and attention data parallelism (DP) behind the engine's ModelRunner interface. The
// engine, its scheduler and the sampler stay single, on rank 0 (the driver). Each step the driver places every new
// sequence on a DP shard (DpBalancer), and broadcasts the batch as a ParallelJob; every rank runs its shard's
// entries through its own SlotModelRunner, the MoE layers exchange tokens across the EP group (ExpertParallel), and
// one replica per shard sends its logits rows to rank 0. Ranks of an EP group run the same number of forwards per
// step: a rank with fewer sequences than the busiest shard of its group runs idle forwards (exchanges only).
//
// Two drivers share the rank code (RankWorker):
//   - ParallelModelRunner: in-process ranks (threads of an InProcessWorld), CPU backend; CI runs every path on it;
//   - DistributedModelRunner: this process is rank 0 of a multi-process world (NCCL, one process per GPU); the other
//     processes run run_parallel_worker().
//
// Each rank loads only its initial placement's routed experts (the model factory gets the filter), f32 or kept in
// their stored block format (keep_quant: MXFP4 / FP8 codes and scales, computed with Backend::moe_quant); EPLB
// (rebalance) re-plans the placement from the counted loads between steps and loads / frees experts to match, in
// the format the rank keeps them.
//
// Context parallelism (layout.cp > 1): the ranks of a DP shard are its CP group. The shard's first rank runs the
// entries; the others are CP followers (SlotModelRunner::set_context_parallel) that run their zig-zag rows of long
// prompt chunks and an idle forward for every entry the first rank runs alone. The shard's ranks then hold different
// tokens, so each dispatches its own rows to the EP group (no replica split).
//
// Prefix caching is off with dp > 1: a shard's paged rows exist on its own ranks only, and a prefix hit could come
// from another shard's blocks.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "deepinfer/core/error.h"
#include "deepinfer/core/logging.h"
#include "deepinfer/engine/slot_model_runner.h"
#include "deepinfer/model/model_config.h"
#include "deepinfer/ops/ops.h"
#include "deepinfer/parallel/communicator.h"
#include "deepinfer/parallel/cp_process_runner.h"
#include "deepinfer/parallel/dp_balancer.h"
#include "deepinfer/parallel/eplb.h"
#include "deepinfer/parallel/expert_parallel.h"
#include "deepinfer/parallel/in_process_communicator.h"
#include "deepinfer/parallel/parallel_job.h"

namespace deepinfer {

struct ParallelRunnerOptions {
  ParallelLayout layout;
  int32_t num_slots = 1;
  ModelRunnerOptions runner;
  std::string model_dir;  // EPLB reloads experts from here
  // EPLB: re-plan the placement after every eplb_interval steps (0: never) with eplb_slots expert slots per EP
  // rank (0: ceil(E / ep) + 1, i.e. one redundant replica per rank).
  int eplb_interval = 0;
  int eplb_slots = 0;
  // MoE dispatch in FP8 (ExpertParallel::set_fp8_dispatch): lossy, ~3.9x fewer dispatch bytes.
  bool fp8_dispatch = false;
  // Block-format weights (FP8 projections, MXFP4 / FP8 experts) stay quantized (--weight-format fp8): what
  // make_parallel_runner passes its loader; a custom ModelFactory applies it itself.
  bool keep_quant = false;
  // DeepseekV4Model::set_activation_quant on every rank's model (V4 family; kNone for V3).
  ActQuant act_quant = ActQuant::kNone;
  // set_kv_cache_dtype on every rank's model (--kv-cache-dtype): each rank's pages, hence the engine's blocks.
  DType kv_cache_dtype = DType::kF32;
};

// The MoE layers of a model config and their routed expert count (dense layers get an empty placement).
std::vector<ExpertPlacement> initial_placements(const ModelConfig& config, int ep_size);
// Default EPLB slots per rank (see ParallelRunnerOptions::eplb_slots), capped at E.
int default_eplb_slots(const ModelConfig& config, int ep_size);

// One rank: its backend, model (its experts only), slot runner and communicators.
template <typename Model>
class RankWorker {
 public:
  using BackendFactory = std::function<std::unique_ptr<Backend>(int rank)>;
  // Loads the model on `backend` with only the routed experts `resident` names (this rank's initial placement).
  using ModelFactory = std::function<std::unique_ptr<Model>(Backend& backend, const ExpertFilter& resident)>;

  // Collective over `world` (the sub-groups are split here).
  RankWorker(Communicator& world, const ParallelRunnerOptions& options, const BackendFactory& make_backend,
             const ModelFactory& load)
      : world_(world), options_(options) {
    const ParallelLayout& L = options_.layout;
    DI_CHECK(world.size() == L.world) << "parallel runner: a world of " << world.size() << " for " << L.str();
    const int r = world.rank();
    ep_group_ = world.split(L.ep_group(r), r);
    // The initial placement from config.json, so that the loader reads only this rank's experts.
    std::vector<ExpertPlacement> placements;
    if (!options_.model_dir.empty())
      placements = initial_placements(load_model_config(options_.model_dir + "/config.json"), L.ep);
    backend_ = make_backend(r);
    model_ =
        load(*backend_, placements.empty() ? ExpertFilter() : placed_experts_filter(placements, ep_group_->rank()));
    replicas_ = world.split(L.ep_group(r) * L.dp + L.dp_shard(r), r);  // the shard's replicas in this EP group
    // With CP the replicas of a shard do not hold the same tokens (each runs its zig-zag rows, or rank 0 runs a chunk
    // alone): every rank dispatches its own tokens (a group of one), and the whole shard is the CP group.
    if (L.cp > 1) {
      cp_group_ = world.split(L.dp_shard(r), r);
      self_ = world.split(r, 0);
      DI_CHECK_INTERNAL(cp_group_->size() == L.cp)
          << "parallel runner: a CP group of " << cp_group_->size() << " ranks for cp " << L.cp;
    }
    if (placements.empty()) placements = initial_placements(model_->config(), L.ep);
    ep_ = std::make_unique<ExpertParallel>(*ep_group_, L.cp > 1 ? *self_ : *replicas_, std::move(placements));
    ep_->set_fp8_dispatch(options_.fp8_dispatch);
    model_->set_expert_parallel(ep_.get());
    keep_placed_experts();
    runner_ = std::make_unique<SlotModelRunner<Model>>(*model_, options_.num_slots, options_.runner);
    if (L.cp > 1) {
      const bool follower = cp_group_->rank() != 0;
      runner_->set_context_parallel(
          L.cp, make_communicator_cp_launcher(*cp_group_), follower,
          follower ? std::function<void()>([this] { model_->idle_forward(); }) : std::function<void()>());
    }
  }

  // Runs a job (every rank, collective). kStep: rank 0's `logits` receives every shard's rows
  // [job.num_logits_rows, vocab]. kRebalance: rank 0's `report` is filled.
  void handle(const ParallelJob& job, std::span<float> logits, EplbReport* report) {
    switch (job.kind) {
      case ParallelJob::Kind::kStep:
        step(job, logits);
        break;
      case ParallelJob::Kind::kRelease:
        runner_->release_slot(job.slot);
        break;
      case ParallelJob::Kind::kRebalance:
        rebalance(job.slots_per_rank, report);
        break;
      case ParallelJob::Kind::kStop:
        break;
    }
  }

  const Model& model() const { return *model_; }
  const ExpertParallel& expert_parallel() const { return *ep_; }
  const SlotModelRunner<Model>& runner() const { return *runner_; }
  int64_t vocab_size() const { return model_->config().vocab_size; }

 private:
  void step(const ParallelJob& job, std::span<float> logits) {
    const ParallelLayout& L = options_.layout;
    const int r = world_.rank(), shard = L.dp_shard(r);
    const int64_t vocab = vocab_size();
    const ModelBatch mine = job.shard_batch(shard);
    // Forwards every rank of this EP group runs: the busiest shard present in the group.
    size_t rounds = 0;
    const int first = L.ep_group(r) * L.ep;
    for (int q = first; q < first + L.ep; ++q) rounds = std::max(rounds, job.shard_size(L.dp_shard(q)));
    std::vector<float> rows(static_cast<size_t>(mine.num_logits_rows * vocab));
    runner_->execute(mine, rows);
    for (size_t i = mine.entries.size(); i < rounds; ++i) model_->idle_forward();
    // Logits to rank 0: one replica per shard sends its rows; rank 0 places them by logit_row.
    const bool sender = L.replica_index(r) == 0;
    std::vector<int64_t> send_counts(L.world, 0);
    send_counts[0] = sender ? static_cast<int64_t>(rows.size()) : 0;
    const std::vector<int64_t> recv_counts = world_.exchange_counts(send_counts);
    int64_t total = 0;
    for (int64_t c : recv_counts) total += c;
    std::vector<float> gathered(static_cast<size_t>(total));
    world_.all_to_all_v(rows.data(), send_counts, gathered.data(), recv_counts, DType::kF32);
    if (r != 0) return;
    DI_CHECK_INTERNAL(total == job.num_logits_rows * vocab)
        << "parallel runner: gathered " << total / std::max<int64_t>(vocab, 1) << " logits rows, expected "
        << job.num_logits_rows;
    // Pieces arrive in rank order; within a piece, in the shard's entry order.
    int64_t at = 0;
    for (int q = 0; q < L.world; ++q) {
      if (recv_counts[q] == 0) continue;
      for (const auto& e : job.entries) {
        if (e.shard != L.dp_shard(q) || e.logit_row < 0) continue;
        std::copy(gathered.begin() + at, gathered.begin() + at + vocab, logits.begin() + e.logit_row * vocab);
        at += vocab;
      }
    }
  }

  void rebalance(int slots_per_rank, EplbReport* report) {
    ExpertLoad& load = ep_->load();
    std::vector<int64_t> total(load.counts);
    world_.all_reduce(total.data(), static_cast<int64_t>(total.size()), DType::kI64, ReduceOp::kSum);
    EplbReport mine;
    for (int l = 0; l < ep_->num_layers(); ++l) {
      const ExpertPlacement& old = ep_->placement(l);
      if (old.num_experts() == 0) continue;
      const auto begin = total.begin() + static_cast<int64_t>(l) * load.num_experts;
      const std::vector<int64_t> loads(begin, begin + old.num_experts());
      ExpertPlacement next = plan_placement(loads, old.ep_size(), slots_per_rank);
      EplbLayerReport lr;
      lr.layer = l;
      lr.imbalance_before = imbalance(old, loads);
      lr.imbalance_after = imbalance(next, loads);
      for (int64_t v : loads) lr.tokens += v;
      for (int q = 0; q < old.ep_size(); ++q)
        for (int e : next.experts_on(q))
          if (old.slot_of(q, e) < 0) ++lr.experts_moved;
      // Load what this rank gains before freeing what it loses.
      std::vector<int> gained;
      for (int e : next.experts_on(ep_group_->rank()))
        if (!model_->has_expert(l, e)) gained.push_back(e);
      if (!gained.empty()) model_->load_experts(options_.model_dir, l, gained);
      ep_->set_placement(l, std::move(next));
      mine.layers.push_back(lr);
    }
    keep_placed_experts();
    ep_->clear_counters();
    if (report && world_.rank() == 0) *report = std::move(mine);
  }

  // Frees every routed expert the rank's placement does not hold.
  void keep_placed_experts() {
    for (int l = 0; l < ep_->num_layers(); ++l) {
      const ExpertPlacement& pl = ep_->placement(l);
      if (pl.num_experts() == 0) continue;
      std::vector<bool> keep(pl.num_experts(), false);
      for (int e : pl.experts_on(ep_group_->rank())) keep[e] = true;
      model_->retain_experts(l, keep);
    }
  }

  Communicator& world_;
  ParallelRunnerOptions options_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Communicator> ep_group_, replicas_, cp_group_, self_;
  std::unique_ptr<ExpertParallel> ep_;
  std::unique_ptr<SlotModelRunner<Model>> runner_;
};

// The driver side shared by both runners: shard placement, the step's job, EPLB cadence.
class ParallelDriver {
 public:
  explicit ParallelDriver(const ParallelRunnerOptions& options) : options_(options), balancer_(options.layout.dp) {}
  ParallelJob step_job(const ModelBatch& batch);
  // The slot's sequence leaves its shard.
  void released(int32_t slot);
  // After a step: the rebalance job when EPLB is due (slots from the options or the default).
  std::optional<ParallelJob> eplb_job(const ModelConfig& config);
  const DpBalancer& balancer() const { return balancer_; }

 private:
  ParallelRunnerOptions options_;
  DpBalancer balancer_;
  std::unordered_map<int32_t, int64_t> slot_seq_;
  int64_t steps_ = 0;
};

// In-process ranks (threads), CPU backend.
template <typename Model>
class ParallelModelRunner final : public ModelRunner {
 public:
  using Worker = RankWorker<Model>;

  ParallelModelRunner(ParallelRunnerOptions options, const typename Worker::BackendFactory& make_backend,
                      const typename Worker::ModelFactory& load)
      : options_(std::move(options)), world_(options_.layout.world), driver_(options_) {
    workers_.resize(options_.layout.world);
    world_.run_on_all([&](Communicator& comm) {
      workers_[comm.rank()] = std::make_unique<Worker>(comm, options_, make_backend, load);
    });
  }

  const ParallelLayout& layout() const { return options_.layout; }
  int64_t vocab_size() const override { return workers_[0]->vocab_size(); }
  bool prefix_cache_supported() const override {
    return options_.layout.dp == 1 && workers_[0]->runner().prefix_cache_supported();
  }
  int prefix_replay_tokens() const override { return workers_[0]->runner().prefix_replay_tokens(); }
  int prefix_replay_tokens_past_prompt() const override {
    return workers_[0]->runner().prefix_replay_tokens_past_prompt();
  }

  void execute(const ModelBatch& batch, std::span<float> logits) override {
    DI_CHECK(static_cast<int64_t>(logits.size()) >= batch.num_logits_rows * vocab_size())
        << "logits buffer holds " << logits.size() << " values, need " << batch.num_logits_rows * vocab_size();
    run(driver_.step_job(batch), logits);
    if (auto job = driver_.eplb_job(workers_[0]->model().config())) {
      run(*job, {});
      DI_LOG_INFO("{}", last_eplb_.str());
    }
  }

  void release_slot(int32_t slot) override {
    ParallelJob job;
    job.kind = ParallelJob::Kind::kRelease;
    job.slot = slot;
    run(job, {});
    driver_.released(slot);
  }

  ModelWorkStats work_stats() const override {
    ModelWorkStats s;
    for (int r = 0; r < options_.layout.world; ++r) {
      if (options_.layout.replica_index(r) != 0) continue;
      const ModelWorkStats w = workers_[r]->runner().work_stats();
      s.layer_tokens += w.layer_tokens;
      s.layer_tokens_skipped += w.layer_tokens_skipped;
      s.batched_decodes += w.batched_decodes;
    }
    return s;
  }

  // EPLB now (between steps).
  EplbReport rebalance(int slots_per_rank) {
    ParallelJob job;
    job.kind = ParallelJob::Kind::kRebalance;
    job.slots_per_rank = slots_per_rank;
    run(job, {});
    return last_eplb_;
  }
  const EplbReport& last_eplb_report() const { return last_eplb_; }
  const Model& model(int rank) const { return workers_.at(rank)->model(); }
  const SlotModelRunner<Model>& rank_runner(int rank) const { return workers_.at(rank)->runner(); }
  const ExpertParallel& expert_parallel(int rank) const { return workers_.at(rank)->expert_parallel(); }
  const DpBalancer& balancer() const { return driver_.balancer(); }

 private:
  // Rank 0's thread broadcasts the driver's job (the same path as across processes), then every rank runs it.
  void run(const ParallelJob& driver_job, std::span<float> logits) {
    world_.run_on_all([&](Communicator& comm) {
      ParallelJob job;
      if (comm.rank() == 0) job = driver_job;
      broadcast_job(comm, job);
      workers_[comm.rank()]->handle(job, comm.rank() == 0 ? logits : std::span<float>(),
                                    comm.rank() == 0 ? &last_eplb_ : nullptr);
    });
  }

  ParallelRunnerOptions options_;
  InProcessWorld world_;
  ParallelDriver driver_;
  std::vector<std::unique_ptr<Worker>> workers_;
  EplbReport last_eplb_;
};

// Rank 0 of a multi-process world (one process per GPU): the engine's runner; the other processes run
// run_parallel_worker() with the same options until this runner is destroyed (it sends them kStop).
template <typename Model>
class DistributedModelRunner final : public ModelRunner {
 public:
  using Worker = RankWorker<Model>;
  DistributedModelRunner(Communicator& world, ParallelRunnerOptions options,
                         const typename Worker::BackendFactory& make_backend, const typename Worker::ModelFactory& load)
      : world_(world), options_(std::move(options)), driver_(options_) {
    DI_CHECK_INTERNAL(world.rank() == 0) << "DistributedModelRunner runs on rank 0 only";
    worker_ = std::make_unique<Worker>(world, options_, make_backend, load);
  }
  ~DistributedModelRunner() override {
    try {
      ParallelJob stop;
      stop.kind = ParallelJob::Kind::kStop;
      broadcast_job(world_, stop);
    } catch (...) {
      // The peers are gone or broken already; nothing left to stop.
    }
  }
  int64_t vocab_size() const override { return worker_->vocab_size(); }
  bool prefix_cache_supported() const override {
    return options_.layout.dp == 1 && worker_->runner().prefix_cache_supported();
  }
  int prefix_replay_tokens() const override { return worker_->runner().prefix_replay_tokens(); }
  int prefix_replay_tokens_past_prompt() const override { return worker_->runner().prefix_replay_tokens_past_prompt(); }
  void execute(const ModelBatch& batch, std::span<float> logits) override {
    run(driver_.step_job(batch), logits);
    if (auto job = driver_.eplb_job(worker_->model().config())) {
      run(*job, {});
      DI_LOG_INFO("{}", last_eplb_.str());
    }
  }
  void release_slot(int32_t slot) override {
    ParallelJob job;
    job.kind = ParallelJob::Kind::kRelease;
    job.slot = slot;
    run(job, {});
    driver_.released(slot);
  }
  const EplbReport& last_eplb_report() const { return last_eplb_; }

 private:
  void run(ParallelJob job, std::span<float> logits) {
    broadcast_job(world_, job);
    worker_->handle(job, logits, &last_eplb_);
  }
  Communicator& world_;
  ParallelRunnerOptions options_;
  ParallelDriver driver_;
  std::unique_ptr<Worker> worker_;
  EplbReport last_eplb_;
};

// Ranks 1..world-1 of a multi-process world: build this rank and run the driver's jobs until kStop.
template <typename Model>
void run_parallel_worker(Communicator& world, const ParallelRunnerOptions& options,
                         const typename RankWorker<Model>::BackendFactory& make_backend,
                         const typename RankWorker<Model>::ModelFactory& load) {
  RankWorker<Model> worker(world, options, make_backend, load);
  while (true) {
    ParallelJob job;
    broadcast_job(world, job);
    if (job.kind == ParallelJob::Kind::kStop) return;
    worker.handle(job, {}, nullptr);
  }
}

// The in-process EP/DP runner for the model in options.model_dir (family from its config.json), one CPU backend of
// max(1, threads / world) threads per rank (threads 0: all cores). V4.1 Engram models take `token_map` when given.
std::unique_ptr<ModelRunner> make_parallel_runner(const ParallelRunnerOptions& options, int threads,
                                                  std::optional<std::vector<int64_t>> token_map = std::nullopt);

}  // namespace deepinfer
