// The in-process communicator: every rank is a thread of this process and collectives exchange host buffers
// through shared memory. It is the CI stand-in for NCCL: the parallel paths (EP dispatch/combine, DP, CP) run
// unchanged on it with the CPU backend.
//
//   InProcessWorld::run(4, [&](Communicator& comm) { ... comm.all_reduce(...) ... });
//
// Semantics match NCCL's where both define them; reductions run in rank order, so every rank gets bit-identical
// results. Mismatched collectives (different ops or sizes on different ranks) throw on every rank instead of
// hanging, and when one rank throws, the others are released with an error at their next collective; run()
// rethrows the first rank's own exception.
#pragma once

#include <functional>
#include <memory>

#include "deepinfer/parallel/communicator.h"

namespace deepinfer {

class InProcessWorld {
 public:
  // Runs fn(comm) on n threads (rank i on thread i) and joins them. Host memory only.
  static void run(int n, const std::function<void(Communicator&)>& fn);

  // A persistent world: n rank threads that live as long as the object, each with one world communicator, so
  // per-rank state built on them (sub-groups, models) survives between jobs (an engine's steps).
  explicit InProcessWorld(int n);
  ~InProcessWorld();
  InProcessWorld(const InProcessWorld&) = delete;
  InProcessWorld& operator=(const InProcessWorld&) = delete;
  int size() const;
  // Runs fn(comm) on every rank thread and waits for all; rethrows the first failing rank's error. After a
  // failure the world is broken (peers were released mid-collective) and every later call throws.
  void run_on_all(const std::function<void(Communicator&)>& fn);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace deepinfer
