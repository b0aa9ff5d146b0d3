// Expert-parallel load balancing (EPLB): from the tokens each expert received, plan a placement of the routed
// experts of one layer over the EP ranks with `slots_per_rank` slots each; the ep·slots − E spare slots hold
// redundant replicas of the hottest experts. A token of a replicated expert goes to one replica (the dispatch
// spreads tokens round-robin), so a replica carries load / replicas.
//
// The plan is greedy, as DeepSeek's EPLB: (1) give each spare slot to the expert with the highest load per
// replica; (2) place replicas heaviest first on the least-loaded rank that still has a free slot and does not
// hold that expert yet. Ties go to the lower id, so every rank computes the same plan from the same loads.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "deepinfer/parallel/expert_parallel.h"

namespace deepinfer {

// Expected load per rank of `placement` under `loads` (tokens per expert): Σ load/replicas over its experts.
std::vector<double> rank_loads(const ExpertPlacement& placement, const std::vector<int64_t>& loads);
// max / mean of rank_loads (1 = perfectly balanced; 1 for no load at all).
double imbalance(const ExpertPlacement& placement, const std::vector<int64_t>& loads);

// Throws InvalidArgument when ep·slots_per_rank < number of experts or slots_per_rank > number of experts.
ExpertPlacement plan_placement(const std::vector<int64_t>& loads, int ep_size, int slots_per_rank);

struct EplbLayerReport {
  int layer = 0;
  double imbalance_before = 1.0, imbalance_after = 1.0;  // expected, from the counted loads
  int64_t tokens = 0;                                    // pairs counted on the layer
  int experts_moved = 0;                                 // replicas that changed rank
};

struct EplbReport {
  std::vector<EplbLayerReport> layers;
  double mean_before() const;
  double mean_after() const;
  double worst_before() const;
  double worst_after() const;
  std::string str() const;  // one line: "EPLB: N layers, imbalance (max/mean) mean a -> b, worst c -> d"
};

}  // namespace deepinfer
