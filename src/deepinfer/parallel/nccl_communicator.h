// The NCCL communicator: one process per GPU (CUDA builds with NCCL only: DEEPINFER_WITH_NCCL). Device buffers are
// used in place on the communicator's stream; host buffers are staged through a device scratch buffer, so the
// host-side EP exchange (parallel/expert_parallel.cc) runs unchanged. Every call returns once its result is in
// place (the stream is synchronised), like the in-process communicator.
//
// Bootstrap: create() reads the launch (bootstrap.h), selects GPU local_rank, and rank 0's ncclUniqueId reaches
// every rank through the TCP rendezvous at MASTER_ADDR:MASTER_PORT.
#pragma once

#include <memory>

#include "deepinfer/parallel/bootstrap.h"
#include "deepinfer/parallel/communicator.h"

namespace deepinfer {

// True when this build has NCCL.
bool nccl_available();

// Throws Unsupported without NCCL, NotFound when the launch needs more GPUs than are visible.
std::unique_ptr<Communicator> make_nccl_communicator(const LaunchEnv& env, const ParallelLayout& layout);

}  // namespace deepinfer
