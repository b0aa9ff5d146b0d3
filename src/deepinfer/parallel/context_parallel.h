// Balanced context parallelism (CP) for prefill: one prompt chunk split across the ranks of a CP group.
//
// Split: the chunk's T tokens are cut into 2n nearly equal pieces (sizes differ by at most one); rank r owns
// pieces r and 2n−1−r ("zig-zag"). Under a causal mask the work of a query grows with its position, so pairing an
// early piece with the mirrored late one gives every rank about the same attention work; projections, MoE and the
// head are per token and split evenly anyway. Rank 0 owns the last piece, hence the chunk's last token: the rank
// that keeps the sequence for decode has the logits it samples from.
//
// Exchange: a model's forward under CP computes everything per token for its own tokens only and all-gathers what
// other tokens' queries read — the rows that enter a cache (V3: MLA latent rows; V4/V4.1: sliding-window rows and
// the compressors' per-token projections, so groups that straddle piece or rank boundaries pool exactly the rows a
// single rank would). Every rank therefore builds the same cache state a single rank would, and every op sees the
// same inputs per row, so the CPU results are bit-identical to one rank (the ops are row-independent).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "deepinfer/core/tensor.h"

namespace deepinfer {

class TensorMemory;

// Tokens [begin, end) of a chunk (offsets from its first token).
struct TokenRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

// Piece i of 2n over `tokens`: [⌊i·T/2n⌋, ⌊(i+1)·T/2n⌋).
TokenRange zigzag_piece(int64_t tokens, int cp_size, int piece);
// The two pieces of `rank` in chunk order: {piece rank, piece 2n−1−rank}.
std::vector<TokenRange> zigzag_ranges(int64_t tokens, int cp_size, int rank);
// Offsets of the tokens `rank` owns, ascending.
std::vector<int64_t> zigzag_indices(int64_t tokens, int cp_size, int rank);
// Every rank gets at least one token iff tokens >= 2n; a CP forward needs that (a caller runs shorter chunks on
// one rank).
inline bool cp_splittable(int64_t tokens, int cp_size) { return cp_size > 1 && tokens >= 2 * int64_t{cp_size}; }

// Equal-size all-gather of raw bytes over the CP group: every rank passes `bytes` at `send`; `recv` receives
// size·bytes, rank i's block at i·bytes. Blocking and collective (every rank calls it in the same order). Backed by
// a Communicator (in-process threads on the CPU, NCCL on GPUs; pointers are then device pointers).
using AllGatherBytes = std::function<void(const void* send, void* recv, size_t bytes)>;

// Runs fn(rank, all_gather) on `n` ranks of a CP group and returns when all are done (rethrowing a rank's
// error): the runner's handle on whatever hosts the ranks (in-process threads over a Communicator on the CPU).
using CpLauncher = std::function<void(int n, const std::function<void(int rank, const AllGatherBytes&)>& fn)>;

// A launcher over `cp` persistent in-process rank threads (InProcessWorld) whose all-gather is the world
// communicator's: how the engine runs CP on the CPU backend (the ranks share the model's weights and backend).
// Calls with n != cp throw.
CpLauncher make_in_process_cp_launcher(int cp);

// One rank's view of a CP group for one forward call over a chunk of `total_tokens` tokens.
class CpShard {
 public:
  CpShard(int rank, int size, int64_t total_tokens, AllGatherBytes all_gather);

  int rank() const { return rank_; }
  int size() const { return size_; }
  int64_t total_tokens() const { return total_; }
  // Chunk offsets of this rank's tokens (ascending); the forward's rows are in this order.
  const std::vector<int64_t>& local() const { return local_; }
  int64_t local_tokens() const { return static_cast<int64_t>(local_.size()); }

  // Rows of this rank's tokens `mine` [local_tokens, ...] -> every token's rows `all` [total_tokens, ...] in chunk
  // order (contiguous, same dtype and trailing shape, in `mem`). Collective.
  void all_gather_rows(TensorMemory& mem, const Tensor& mine, const Tensor& all) const;
  // This rank's rows of a whole-chunk tensor `all` [total_tokens, ...] -> `mine` [local_tokens, ...]. Local.
  void select_rows(TensorMemory& mem, const Tensor& all, const Tensor& mine) const;

 private:
  int rank_ = 0;
  int size_ = 1;
  int64_t total_ = 0;
  std::vector<int64_t> local_;
  std::vector<std::vector<TokenRange>> ranges_;  // per rank, its pieces
  int64_t max_local_ = 0;                        // gather blocks are padded to the largest rank's rows
  AllGatherBytes all_gather_;
};

}  // namespace deepinfer
