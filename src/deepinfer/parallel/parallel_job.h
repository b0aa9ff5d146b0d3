// What the driver (rank 0, where the engine runs) sends every rank each step: the batch with each entry's DP shard
// and logits row, or a slot release, an EPLB rebalance, or stop. The job is plain data, broadcast as one int64 array,
// so the same rank code serves in-process ranks (threads) and one process per GPU.
#pragma once

#include <cstdint>
#include <vector>

#include "deepinfer/engine/model_runner.h"
#include "deepinfer/parallel/communicator.h"

namespace deepinfer {

struct ParallelJob {
  enum class Kind : int64_t { kStep = 0, kRelease = 1, kRebalance = 2, kStop = 3 };
  struct Entry {
    int64_t seq_id = 0, start = 0, persistent_until = 0, prompt_len = 0;
    int32_t state_slot = -1, pending_row = -1;
    bool reset_state = false, needs_logits = false;
    std::vector<TokenId> token_ids, prefix_token_ids;
    std::vector<BlockId> block_table;
    int shard = 0;           // DP shard that runs it
    int64_t logit_row = -1;  // row in the step's logits, when needs_logits
  };
  Kind kind = Kind::kStep;
  // kStep
  int block_size = 0;
  int64_t num_logits_rows = 0;
  std::vector<TokenId> prev_sampled_tokens;
  std::vector<Entry> entries;
  // kRelease
  int32_t slot = -1;
  // kRebalance
  int slots_per_rank = 0;

  // The entries of one shard as a ModelBatch viewing this job's vectors (valid while the job lives).
  ModelBatch shard_batch(int shard) const;
  size_t shard_size(int shard) const;
};

// The batch entry as owned data.
ParallelJob::Entry job_entry(const BatchEntry& e);

std::vector<int64_t> serialize(const ParallelJob& job);
ParallelJob deserialize(const std::vector<int64_t>& data);  // Internal error on a malformed array
// Rank 0's job reaches every rank of `world` (collective; the others' `job` is replaced).
void broadcast_job(Communicator& world, ParallelJob& job);

}  // namespace deepinfer
