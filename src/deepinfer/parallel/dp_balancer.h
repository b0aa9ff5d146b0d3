// Attention data parallelism: which DP shard serves a sequence. A sequence is placed when its first chunk is
// scheduled, on the shard with the least outstanding work (prompt + max new tokens is unknown here, so the
// prompt length stands for it; ties go to the lowest shard), and stays there until its slot is released
// (finish or preemption: a preempted sequence may be placed elsewhere when it comes back, since it recomputes).
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

namespace deepinfer {

class DpBalancer {
 public:
  explicit DpBalancer(int shards);
  int shards() const { return static_cast<int>(load_.size()); }
  // The sequence's shard, placing it first when it has none.
  int assign(int64_t seq_id, int64_t tokens);
  // -1 when the sequence is not placed.
  int shard_of(int64_t seq_id) const;
  void release(int64_t seq_id);
  // Outstanding tokens and sequences per shard.
  const std::vector<int64_t>& load() const { return load_; }
  const std::vector<int64_t>& sequences() const { return sequences_; }

 private:
  struct Placed {
    int shard;
    int64_t tokens;
  };
  std::vector<int64_t> load_, sequences_;
  std::unordered_map<int64_t, Placed> placed_;
};

}  // namespace deepinfer
