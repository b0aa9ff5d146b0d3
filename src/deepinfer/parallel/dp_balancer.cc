#include "deepinfer/parallel/dp_balancer.h"

#include "deepinfer/core/error.h"

namespace deepinfer {

DpBalancer::DpBalancer(int shards) {
  DI_CHECK(shards >= 1) << "DP balancer: shards must be >= 1, got " << shards;
  load_.assign(shards, 0);
  sequences_.assign(shards, 0);
}

int DpBalancer::assign(int64_t seq_id, int64_t tokens) {
  auto it = placed_.find(seq_id);
  if (it != placed_.end()) return it->second.shard;
  int best = 0;
  for (int s = 1; s < shards(); ++s) {
    if (load_[s] < load_[best] || (load_[s] == load_[best] && sequences_[s] < sequences_[best])) best = s;
  }
  load_[best] += tokens;
  ++sequences_[best];
  placed_[seq_id] = {best, tokens};
  return best;
}

int DpBalancer::shard_of(int64_t seq_id) const {
  auto it = placed_.find(seq_id);
  return it == placed_.end() ? -1 : it->second.shard;
}

void DpBalancer::release(int64_t seq_id) {
  auto it = placed_.find(seq_id);
  if (it == placed_.end()) return;
  load_[it->second.shard] -= it->second.tokens;
  --sequences_[it->second.shard];
  placed_.erase(it);
}

}  // namespace deepinfer
