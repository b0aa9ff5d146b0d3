// Communicator: the collectives the parallel paths (expert parallelism, attention data parallelism, context
// parallelism) are written against. Two implementations:
//   - InProcessWorld (in_process_communicator.h): one thread per rank in one process, buffers exchanged through
//     shared memory. CI runs every parallel path with it on the CPU backend.
//   - NcclCommunicator (nccl_communicator.h, CUDA builds only): one process per GPU.
//
// Conventions
// - Every call is collective over the communicator: all ranks call it, in the same order, with matching sizes
//   (mismatched sizes are caught by the in-process implementation and named in the error).
// - Sizes are element counts of `dtype`; buffers are contiguous. Which memory a buffer may live in is the
//   implementation's `accepts()`: host memory always works (NCCL stages it through the device), device memory
//   only where the communicator is device-backed.
// - Sub-groups (the EP group, the DP replicas, a CP group) come from split(color, key), MPI_Comm_split style.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "deepinfer/core/dtype.h"
#include "deepinfer/core/tensor.h"

namespace deepinfer {

enum class ReduceOp { kSum, kMax, kMin };

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // True when buffers in `device` memory may be passed directly (host memory is always accepted).
  virtual bool accepts(Device device) const = 0;
  virtual std::string name() const = 0;  // "in-process", "nccl"

  // In place: data[i] = op over ranks of data[i]. f32, bf16 (reduced in f32, rounded once), i32, i64.
  virtual void all_reduce(void* data, int64_t count, DType dtype, ReduceOp op = ReduceOp::kSum) = 0;
  // recv [size * count] = concat over ranks of each rank's send [count]. send may alias recv + rank * count.
  virtual void all_gather(const void* send, void* recv, int64_t count, DType dtype) = 0;
  // Each rank sends send_counts[p] elements to rank p (from send at the prefix sum of send_counts) and receives
  // recv_counts[p] from rank p (into recv at the prefix sum of recv_counts). recv_counts[p] must equal rank p's
  // send_counts[this rank]; exchange_counts() below computes them.
  virtual void all_to_all_v(const void* send, std::span<const int64_t> send_counts, void* recv,
                            std::span<const int64_t> recv_counts, DType dtype) = 0;
  // data [count] from `root` to every rank.
  virtual void broadcast(void* data, int64_t count, DType dtype, int root) = 0;
  virtual void barrier() = 0;
  // Ranks calling with the same color form a new communicator, ordered by (key, old rank). Collective.
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;

  // ---- conveniences built on the above (host memory) ----
  // recv_counts for all_to_all_v: what every peer will send to this rank.
  std::vector<int64_t> exchange_counts(std::span<const int64_t> send_counts);
  // all_gather of variable-length pieces: returns the concatenation and fills `counts` (per rank).
  std::vector<float> all_gather_v(std::span<const float> send, std::vector<int64_t>* counts = nullptr);
  int64_t all_reduce_max(int64_t v);
  int64_t all_reduce_sum(int64_t v);
};

// The layout of a parallel run: world = ep groups × ep ranks; attention data-parallel shards across it. See
// docs/PARALLEL.md. All sizes >= 1; world % ep == 0 and world % dp == 0 (validated by make()).
struct ParallelLayout {
  int world = 1;
  int ep = 1;  // expert-parallel group size: the routed experts are partitioned across ep ranks
  int dp = 1;  // attention data-parallel shards: a rank serves the requests of shard dp_shard(rank)
  // Context parallelism with EP/DP: the replicas of a DP shard form its CP group (cp == replicas()): long prompt
  // chunks of the shard's sequences are split zig-zag across them; 1 = off.
  int cp = 1;

  // world defaults to lcm(ep, dp·cp) when 0; cp > 1 needs world == dp·cp (InvalidArgument naming the sizes).
  static ParallelLayout make(int ep, int dp, int world = 0, int cp = 1);
  int ep_group(int rank) const { return rank / ep; }  // EP groups are contiguous rank ranges
  int ep_rank(int rank) const { return rank % ep; }
  int replicas() const { return world / dp; }                 // ranks serving the same requests
  int dp_shard(int rank) const { return rank / replicas(); }  // replicas of a shard are contiguous
  int replica_index(int rank) const { return rank % replicas(); }
  std::string str() const;
};

// Element size in bytes of a dtype a communicator moves (whole-byte types only).
int64_t comm_element_bytes(DType dtype);

}  // namespace deepinfer
