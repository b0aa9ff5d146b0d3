// One process per GPU for `--device cuda --ep N [--dp M]`: under torchrun or mpirun the launcher started the
// processes (bootstrap.h reads where this one sits); started alone, rank 0 spawns world-1 copies of its own command
// line on this node (RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT set for each) and waits for them at exit.
// All ranks then join one NCCL communicator.
#pragma once

#include <memory>
#include <vector>

#include "deepinfer/parallel/bootstrap.h"
#include "deepinfer/parallel/communicator.h"

namespace deepinfer::cli {

class ProcessWorld {
 public:
  // Unsupported without NCCL; NotFound when the node has fewer GPUs than the processes it must run.
  static std::unique_ptr<ProcessWorld> start(const ParallelLayout& layout);
  ~ProcessWorld();  // waits for spawned workers (they exit when rank 0's runner sends stop)

  const LaunchEnv& env() const { return env_; }
  Communicator& comm() { return *comm_; }
  bool is_driver() const { return env_.rank == 0; }

 private:
  LaunchEnv env_;
  std::unique_ptr<Communicator> comm_;
  std::vector<int> children_;
};

}  // namespace deepinfer::cli
