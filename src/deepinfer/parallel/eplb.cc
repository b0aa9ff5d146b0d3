#include "deepinfer/parallel/eplb.h"

#include <algorithm>
#include <cstdio>
#include <numeric>

#include "deepinfer/core/error.h"

namespace deepinfer {

std::vector<double> rank_loads(const ExpertPlacement& placement, const std::vector<int64_t>& loads) {
  DI_CHECK(static_cast<int>(loads.size()) == placement.num_experts())
      << "rank_loads: " << loads.size() << " loads for " << placement.num_experts() << " experts";
  std::vector<double> out(placement.ep_size(), 0.0);
  for (int r = 0; r < placement.ep_size(); ++r)
    for (int e : placement.experts_on(r))
      out[r] += static_cast<double>(loads[e]) / static_cast<double>(placement.ranks_of(e).size());
  return out;
}

double imbalance(const ExpertPlacement& placement, const std::vector<int64_t>& loads) {
  const std::vector<double> l = rank_loads(placement, loads);
  const double mean = std::accumulate(l.begin(), l.end(), 0.0) / static_cast<double>(l.size());
  if (mean <= 0.0) return 1.0;
  return *std::max_element(l.begin(), l.end()) / mean;
}

ExpertPlacement plan_placement(const std::vector<int64_t>& loads, int ep_size, int slots_per_rank) {
  const int E = static_cast<int>(loads.size());
  DI_CHECK(ep_size >= 1) << "EPLB: EP size must be >= 1, got " << ep_size;
  DI_CHECK(int64_t{ep_size} * slots_per_rank >= E)
      << "EPLB: " << ep_size << " ranks x " << slots_per_rank << " slots cannot hold " << E << " experts";
  DI_CHECK(slots_per_rank <= E) << "EPLB: " << slots_per_rank << " slots per rank for only " << E
                                << " experts (a rank holds an expert at most once)";
  for (int64_t l : loads) DI_CHECK(l >= 0) << "EPLB: negative expert load " << l;
  // (1) Replica counts: each spare slot to the expert with the highest load per replica.
  std::vector<int> replicas(E, 1);
  const int spare = ep_size * slots_per_rank - E;
  for (int s = 0; s < spare; ++s) {
    int best = -1;
    for (int e = 0; e < E; ++e) {
      if (replicas[e] >= ep_size) continue;  // one replica per rank at most
      // load[e]/replicas[e] > load[best]/replicas[best], compared without division.
      if (best < 0 || static_cast<double>(loads[e]) * replicas[best] > static_cast<double>(loads[best]) * replicas[e])
        best = e;
    }
    if (best < 0) break;
    ++replicas[best];
  }
  // (2) Replicas heaviest first onto the least-loaded rank with room that lacks the expert.
  struct Item {
    double load;
    int expert;
  };
  std::vector<Item> items;
  for (int e = 0; e < E; ++e)
    for (int i = 0; i < replicas[e]; ++i) items.push_back({static_cast<double>(loads[e]) / replicas[e], e});
  std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& b) { return a.load > b.load; });
  std::vector<std::vector<int>> lists(ep_size);
  std::vector<double> rank_load(ep_size, 0.0);
  for (const Item& it : items) {
    int best = -1;
    for (int r = 0; r < ep_size; ++r) {
      if (static_cast<int>(lists[r].size()) >= slots_per_rank) continue;
      if (std::find(lists[r].begin(), lists[r].end(), it.expert) != lists[r].end()) continue;
      if (best < 0 || rank_load[r] < rank_load[best]) best = r;
    }
    DI_CHECK_INTERNAL(best >= 0) << "EPLB: no rank can take a replica of expert " << it.expert;
    lists[best].push_back(it.expert);
    rank_load[best] += it.load;
  }
  for (auto& l : lists) std::sort(l.begin(), l.end());  // slot order = expert order (stable plans)
  return ExpertPlacement::from_rank_experts(E, std::move(lists));
}

namespace {
template <typename F>
double fold(const std::vector<EplbLayerReport>& layers, F get, bool worst) {
  if (layers.empty()) return 1.0;
  double acc = worst ? 0.0 : 0.0;
  for (const auto& l : layers) acc = worst ? std::max(acc, get(l)) : acc + get(l);
  return worst ? acc : acc / static_cast<double>(layers.size());
}
}  // namespace

double EplbReport::mean_before() const {
  return fold(
      layers, [](const EplbLayerReport& l) { return l.imbalance_before; }, false);
}
double EplbReport::mean_after() const {
  return fold(
      layers, [](const EplbLayerReport& l) { return l.imbalance_after; }, false);
}
double EplbReport::worst_before() const {
  return fold(
      layers, [](const EplbLayerReport& l) { return l.imbalance_before; }, true);
}
double EplbReport::worst_after() const {
  return fold(
      layers, [](const EplbLayerReport& l) { return l.imbalance_after; }, true);
}

std::string EplbReport::str() const {
  int moved = 0;
  for (const auto& l : layers) moved += l.experts_moved;
  char buf[256];
  std::snprintf(buf, sizeof(buf),
                "EPLB: %zu MoE layer(s), imbalance (max/mean rank load) mean %.3f -> %.3f, worst %.3f -> %.3f, %d "
                "replica(s) moved",
                layers.size(), mean_before(), mean_after(), worst_before(), worst_after(), moved);
  return buf;
}

}  // namespace deepinfer
