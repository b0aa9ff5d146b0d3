#include "deepinfer/engine/scheduling_policy.h"

#include <algorithm>

#include "deepinfer/core/error.h"

namespace deepinfer {

SchedulingPolicyKind parse_scheduling_policy(std::string_view name) {
  if (name == "fcfs") return SchedulingPolicyKind::kFcfs;
  if (name == "priority") return SchedulingPolicyKind::kPriority;
  DI_FAIL(ErrorCode::kInvalidArgument) << "scheduling policy must be 'fcfs' or 'priority', got '" << name << "'";
}

std::string_view scheduling_policy_name(SchedulingPolicyKind kind) {
  return kind == SchedulingPolicyKind::kPriority ? "priority" : "fcfs";
}

void PriorityPolicy::order(std::vector<const Sequence*>& seqs) const {
  // Stable: equal priorities keep the queue's FCFS order.
  std::stable_sort(seqs.begin(), seqs.end(),
                   [](const Sequence* a, const Sequence* b) { return a->priority < b->priority; });
}

std::unique_ptr<SchedulingPolicy> make_scheduling_policy(SchedulingPolicyKind kind) {
  if (kind == SchedulingPolicyKind::kPriority) return std::make_unique<PriorityPolicy>();
  return std::make_unique<FcfsPolicy>();
}

}  // namespace deepinfer
