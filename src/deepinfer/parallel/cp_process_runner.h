// Context parallelism with one process per rank (one process per GPU, NCCL): rank 0's process runs the engine and
// its runner (a SlotModelRunner with CP on); every other process runs a follower SlotModelRunner on its own copy of
// the model (SlotModelRunner::set_context_parallel's `follower`). Each step the driver broadcasts the batch (the
// ParallelJob wire format of parallel_job.h) before running it, so every rank sees the same batches and slot
// releases in the same order and makes the same split decisions; the CP chunks' all-gathers then pair up across
// the processes. Decode and unsplit chunks run on rank 0 alone, as with in-process ranks.
//
// CI runs the same protocol with the in-process communicator standing in for NCCL
// (tests/engine/context_parallel_runner_test.cc).
#pragma once

#include <memory>

#include "deepinfer/engine/model_runner.h"
#include "deepinfer/parallel/communicator.h"
#include "deepinfer/parallel/context_parallel.h"

namespace deepinfer {

// A launcher that runs this process's one rank of a CP group spanning processes: fn(comm.rank(), all-gather over
// `comm`). `comm` spans the whole group (size n); it must outlive the launcher. Device pointers go to a
// communicator that accepts them (NCCL: this process's GPU).
CpLauncher make_communicator_cp_launcher(Communicator& comm);

// Rank 0's runner: broadcasts every batch and slot release to the followers, then runs it on `inner` (the
// SlotModelRunner hosting CP rank 0 with a make_communicator_cp_launcher launcher). Its destructor tells the
// followers to stop.
class CpDriverRunner final : public ModelRunner {
 public:
  CpDriverRunner(Communicator& world, std::unique_ptr<ModelRunner> inner);
  ~CpDriverRunner() override;

  int64_t vocab_size() const override { return inner_->vocab_size(); }
  void execute(const ModelBatch& batch, std::span<float> logits) override;
  void release_slot(int32_t slot) override;
  ModelWorkStats work_stats() const override { return inner_->work_stats(); }
  bool prefix_cache_supported() const override { return inner_->prefix_cache_supported(); }
  int prefix_replay_tokens() const override { return inner_->prefix_replay_tokens(); }
  int prefix_replay_tokens_past_prompt() const override { return inner_->prefix_replay_tokens_past_prompt(); }
  KvFootprint kv_footprint(int block_size) const override { return inner_->kv_footprint(block_size); }
  void set_num_blocks(int32_t num_blocks) override { inner_->set_num_blocks(num_blocks); }
  KvAllocation kv_allocation() const override { return inner_->kv_allocation(); }
  ModelRunner& inner() { return *inner_; }

 private:
  Communicator& world_;
  std::unique_ptr<ModelRunner> inner_;
};

// Ranks 1..n-1: run the driver's batches on `follower` (a SlotModelRunner set up as a CP follower) until the driver
// stops. Collective over `world`.
void run_cp_follower(Communicator& world, ModelRunner& follower);

}  // namespace deepinfer
