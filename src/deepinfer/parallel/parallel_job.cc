#include "deepinfer/parallel/parallel_job.h"

#include "deepinfer/core/error.h"

namespace deepinfer {

ModelBatch ParallelJob::shard_batch(int shard) const {
  ModelBatch b;
  b.block_size = block_size;
  b.prev_sampled_tokens = prev_sampled_tokens;
  for (const Entry& e : entries) {
    if (e.shard != shard) continue;
    BatchEntry be;
    be.seq_id = e.seq_id;
    be.token_ids = e.token_ids;
    be.start = e.start;
    be.block_table = e.block_table;
    be.state_slot = e.state_slot;
    be.reset_state = e.reset_state;
    be.persistent_until = e.persistent_until;
    be.prefix_token_ids = e.prefix_token_ids;
    be.prompt_len = e.prompt_len;
    be.needs_logits = e.needs_logits;
    be.pending_row = e.pending_row;
    b.entries.push_back(be);
    b.num_tokens += static_cast<int64_t>(e.token_ids.size());
    if (e.needs_logits) ++b.num_logits_rows;
  }
  return b;
}

size_t ParallelJob::shard_size(int shard) const {
  size_t n = 0;
  for (const Entry& e : entries) n += e.shard == shard;
  return n;
}

ParallelJob::Entry job_entry(const BatchEntry& e) {
  ParallelJob::Entry j;
  j.seq_id = e.seq_id;
  j.start = e.start;
  j.persistent_until = e.persistent_until;
  j.prompt_len = e.prompt_len;
  j.state_slot = e.state_slot;
  j.pending_row = e.pending_row;
  j.reset_state = e.reset_state;
  j.needs_logits = e.needs_logits;
  j.token_ids.assign(e.token_ids.begin(), e.token_ids.end());
  j.prefix_token_ids.assign(e.prefix_token_ids.begin(), e.prefix_token_ids.end());
  j.block_table.assign(e.block_table.begin(), e.block_table.end());
  return j;
}

namespace {

template <typename T>
void put_list(std::vector<int64_t>& out, const std::vector<T>& v) {
  out.push_back(static_cast<int64_t>(v.size()));
  for (const T& x : v) out.push_back(static_cast<int64_t>(x));
}

class Reader {
 public:
  explicit Reader(const std::vector<int64_t>& d) : d_(d) {}
  int64_t next() {
    DI_CHECK_INTERNAL(at_ < d_.size()) << "parallel job: truncated at " << at_;
    return d_[at_++];
  }
  template <typename T>
  std::vector<T> list() {
    const int64_t n = next();
    DI_CHECK_INTERNAL(n >= 0 && at_ + static_cast<size_t>(n) <= d_.size()) << "parallel job: bad list length " << n;
    std::vector<T> v(static_cast<size_t>(n));
    for (auto& x : v) x = static_cast<T>(d_[at_++]);
    return v;
  }
  bool done() const { return at_ == d_.size(); }

 private:
  const std::vector<int64_t>& d_;
  size_t at_ = 0;
};

}  // namespace

std::vector<int64_t> serialize(const ParallelJob& job) {
  std::vector<int64_t> out{static_cast<int64_t>(job.kind), job.block_size, job.num_logits_rows, job.slot,
                           job.slots_per_rank};
  put_list(out, job.prev_sampled_tokens);
  out.push_back(static_cast<int64_t>(job.entries.size()));
  for (const auto& e : job.entries) {
    out.insert(out.end(), {e.seq_id, e.start, e.persistent_until, e.prompt_len, e.state_slot, e.pending_row,
                           e.reset_state ? 1 : 0, e.needs_logits ? 1 : 0, e.shard, e.logit_row});
    put_list(out, e.token_ids);
    put_list(out, e.prefix_token_ids);
    put_list(out, e.block_table);
  }
  return out;
}

ParallelJob deserialize(const std::vector<int64_t>& data) {
  Reader r(data);
  ParallelJob job;
  const int64_t kind = r.next();
  DI_CHECK_INTERNAL(kind >= 0 && kind <= 3) << "parallel job: kind " << kind;
  job.kind = static_cast<ParallelJob::Kind>(kind);
  job.block_size = static_cast<int>(r.next());
  job.num_logits_rows = r.next();
  job.slot = static_cast<int32_t>(r.next());
  job.slots_per_rank = static_cast<int>(r.next());
  job.prev_sampled_tokens = r.list<TokenId>();
  const int64_t n = r.next();
  DI_CHECK_INTERNAL(n >= 0) << "parallel job: " << n << " entries";
  for (int64_t i = 0; i < n; ++i) {
    ParallelJob::Entry e;
    e.seq_id = r.next();
    e.start = r.next();
    e.persistent_until = r.next();
    e.prompt_len = r.next();
    e.state_slot = static_cast<int32_t>(r.next());
    e.pending_row = static_cast<int32_t>(r.next());
    e.reset_state = r.next() != 0;
    e.needs_logits = r.next() != 0;
    e.shard = static_cast<int>(r.next());
    e.logit_row = r.next();
    e.token_ids = r.list<TokenId>();
    e.prefix_token_ids = r.list<TokenId>();
    e.block_table = r.list<BlockId>();
    job.entries.push_back(std::move(e));
  }
  DI_CHECK_INTERNAL(r.done()) << "parallel job: trailing data";
  return job;
}

void broadcast_job(Communicator& world, ParallelJob& job) {
  std::vector<int64_t> data;
  if (world.rank() == 0) data = serialize(job);
  int64_t n = static_cast<int64_t>(data.size());
  world.broadcast(&n, 1, DType::kI64, 0);
  data.resize(static_cast<size_t>(n));
  world.broadcast(data.data(), n, DType::kI64, 0);
  if (world.rank() != 0) job = deserialize(data);
}

}  // namespace deepinfer
