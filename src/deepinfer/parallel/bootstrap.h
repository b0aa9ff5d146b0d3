// Process bootstrap for multi-process runs (one process per GPU): where this process sits in the job, read from
// the launcher's environment, and a small TCP rendezvous that hands one blob (NCCL's unique id) from rank 0 to
// every rank.
//
// Launchers:
//   - torchrun (and anything torchrun-compatible): RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE (optional),
//     MASTER_ADDR, MASTER_PORT;
//   - mpirun (OpenMPI): OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK,
//     OMPI_COMM_WORLD_LOCAL_SIZE; MASTER_ADDR / MASTER_PORT when set (else 127.0.0.1:29500, one node);
//   - neither: a single process (rank 0 of 1).
// The environment is passed in as a lookup function so that the parsing is tested without touching the process's.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "deepinfer/parallel/communicator.h"

namespace deepinfer {

struct LaunchEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string launcher = "single";  // "torchrun", "mpirun", "single"
};

using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;

// Throws InvalidArgument naming the variable for a non-integer or out-of-range value, or for a half-set launcher
// (RANK without WORLD_SIZE, ...).
LaunchEnv launch_env_from(const EnvLookup& env);
LaunchEnv launch_env_from_process();  // std::getenv

// Checks a launch against the requested layout and the GPUs this process sees: world size == layout.world
// (InvalidArgument naming both), local_rank < visible_devices (NotFound: "rank 3 needs GPU 3, 2 visible
// (CUDA_VISIBLE_DEVICES)").
void validate_launch(const LaunchEnv& env, const ParallelLayout& layout, int visible_devices);

// Rank 0 listens on master_port and sends `blob` to every other rank once each has connected; the others connect
// (retrying until timeout_s) and return what they received. Rank 0 returns its own blob. Fails with a clear error
// on timeout or a short read.
std::vector<uint8_t> tcp_share_blob(const LaunchEnv& env, const std::vector<uint8_t>& blob, double timeout_s = 300);

}  // namespace deepinfer
