// SchedulingPolicy: whom the scheduler serves first. The scheduler's mechanics (budgets, chunking, blocks,
// preemption by recompute) are the same for every policy; a policy only orders its two queues:
//   - running sequences: decodes and prefill chunks are scheduled in this order, and when blocks run out the
//     victim is the last one in it not yet scheduled this step;
//   - waiting sequences: admitted in this order, head-of-line (if the first cannot start, nobody behind it does).
// FCFS keeps the engine's orders (running: admission order; waiting: arrival order, a preempted sequence back in
// its arrival place). Priority (vLLM's "priority" policy) orders both by Request::priority, lower values first,
// ties in the FCFS order; a low-priority request can wait as long as higher-priority work keeps arriving, which is
// that policy's contract.
#pragma once

#include <memory>
#include <string_view>
#include <vector>

#include "deepinfer/engine/sequence.h"

namespace deepinfer {

enum class SchedulingPolicyKind : uint8_t { kFcfs, kPriority };
// "fcfs" | "priority"; InvalidArgument naming the allowed values otherwise.
SchedulingPolicyKind parse_scheduling_policy(std::string_view name);
std::string_view scheduling_policy_name(SchedulingPolicyKind kind);

class SchedulingPolicy {
 public:
  virtual ~SchedulingPolicy() = default;
  virtual SchedulingPolicyKind kind() const = 0;
  // Reorders `seqs` (given in the FCFS order of its queue), most urgent first.
  virtual void order(std::vector<const Sequence*>& seqs) const = 0;
};

class FcfsPolicy final : public SchedulingPolicy {
 public:
  SchedulingPolicyKind kind() const override { return SchedulingPolicyKind::kFcfs; }
  void order(std::vector<const Sequence*>&) const override {}
};

class PriorityPolicy final : public SchedulingPolicy {
 public:
  SchedulingPolicyKind kind() const override { return SchedulingPolicyKind::kPriority; }
  void order(std::vector<const Sequence*>& seqs) const override;
};

std::unique_ptr<SchedulingPolicy> make_scheduling_policy(SchedulingPolicyKind kind);

}  // namespace deepinfer
