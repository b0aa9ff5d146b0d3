#include "deepinfer/parallel/cp_process_runner.h"

#include "deepinfer/core/error.h"
#include "deepinfer/parallel/parallel_job.h"

namespace deepinfer {

CpLauncher make_communicator_cp_launcher(Communicator& comm) {
  return [&comm](int n, const std::function<void(int rank, const AllGatherBytes&)>& fn) {
    DI_CHECK_INTERNAL(n == comm.size()) << "CP launch over " << n << " ranks on a communicator of " << comm.size();
    const AllGatherBytes all_gather = [&comm](const void* send, void* recv, size_t bytes) {
      comm.all_gather(send, recv, static_cast<int64_t>(bytes), DType::kU8);
    };
    fn(comm.rank(), all_gather);
  };
}

CpDriverRunner::CpDriverRunner(Communicator& world, std::unique_ptr<ModelRunner> inner)
    : world_(world), inner_(std::move(inner)) {
  DI_CHECK_INTERNAL(world.rank() == 0) << "CpDriverRunner runs on rank 0 only";
  DI_CHECK_INTERNAL(inner_ != nullptr) << "CpDriverRunner: no runner";
}

CpDriverRunner::~CpDriverRunner() {
  try {
    ParallelJob stop;
    stop.kind = ParallelJob::Kind::kStop;
    broadcast_job(world_, stop);
  } catch (...) {
    // The followers are gone or broken already; nothing left to stop.
  }
}

void CpDriverRunner::execute(const ModelBatch& batch, std::span<float> logits) {
  ParallelJob job;
  job.kind = ParallelJob::Kind::kStep;
  job.block_size = batch.block_size;
  job.prev_sampled_tokens.assign(batch.prev_sampled_tokens.begin(), batch.prev_sampled_tokens.end());
  for (const BatchEntry& e : batch.entries) job.entries.push_back(job_entry(e));  // all on shard 0
  broadcast_job(world_, job);
  inner_->execute(batch, logits);
}

void CpDriverRunner::release_slot(int32_t slot) {
  ParallelJob job;
  job.kind = ParallelJob::Kind::kRelease;
  job.slot = slot;
  broadcast_job(world_, job);
  inner_->release_slot(slot);
}

void run_cp_follower(Communicator& world, ModelRunner& follower) {
  DI_CHECK_INTERNAL(world.rank() != 0) << "run_cp_follower: rank 0 is the driver";
  while (true) {
    ParallelJob job;
    broadcast_job(world, job);
    switch (job.kind) {
      case ParallelJob::Kind::kStop:
        return;
      case ParallelJob::Kind::kStep:
        follower.execute(job.shard_batch(0), {});
        break;
      case ParallelJob::Kind::kRelease:
        follower.release_slot(job.slot);
        break;
      case ParallelJob::Kind::kRebalance:
        DI_FAIL(ErrorCode::kInternal) << "context-parallel follower: unexpected EPLB job";
    }
  }
}

}  // namespace deepinfer
