#include "deepinfer/parallel/context_parallel.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "deepinfer/core/error.h"
#include "deepinfer/ops/memory.h"
#include "deepinfer/parallel/in_process_communicator.h"

namespace deepinfer {

TokenRange zigzag_piece(int64_t tokens, int cp_size, int piece) {
  DI_CHECK(cp_size >= 1) << "context parallel: cp size " << cp_size << " must be >= 1";
  DI_CHECK(tokens >= 0) << "context parallel: negative token count " << tokens;
  const int64_t pieces = 2 * int64_t{cp_size};
  DI_CHECK(piece >= 0 && piece < pieces) << "context parallel: piece " << piece << " of " << pieces;
  return {piece * tokens / pieces, (piece + 1) * tokens / pieces};
}

std::vector<TokenRange> zigzag_ranges(int64_t tokens, int cp_size, int rank) {
  DI_CHECK(rank >= 0 && rank < cp_size) << "context parallel: rank " << rank << " outside a group of " << cp_size;
  return {zigzag_piece(tokens, cp_size, rank), zigzag_piece(tokens, cp_size, 2 * cp_size - 1 - rank)};
}

std::vector<int64_t> zigzag_indices(int64_t tokens, int cp_size, int rank) {
  std::vector<int64_t> out;
  for (const TokenRange& r : zigzag_ranges(tokens, cp_size, rank))
    for (int64_t t = r.begin; t < r.end; ++t) out.push_back(t);
  return out;
}

CpShard::CpShard(int rank, int size, int64_t total_tokens, AllGatherBytes all_gather)
    : rank_(rank), size_(size), total_(total_tokens), all_gather_(std::move(all_gather)) {
  DI_CHECK(size >= 1) << "context parallel: cp size " << size << " must be >= 1";
  DI_CHECK(rank >= 0 && rank < size) << "context parallel: rank " << rank << " outside a group of " << size;
  DI_CHECK(cp_splittable(total_tokens, size) || size == 1)
      << "context parallel: a chunk of " << total_tokens << " tokens cannot give each of " << size
      << " ranks a token (needs >= " << 2 * size << ")";
  DI_CHECK(all_gather_ != nullptr) << "context parallel: no all-gather";
  for (int r = 0; r < size; ++r) {
    ranges_.push_back(zigzag_ranges(total_tokens, size, r));
    int64_t n = 0;
    for (const TokenRange& p : ranges_.back()) n += p.size();
    max_local_ = std::max(max_local_, n);
  }
  local_ = zigzag_indices(total_tokens, size, rank);
}

namespace {

Shape with_rows(const Shape& s, int64_t rows) {
  Shape out = s;
  out[0] = rows;
  return out;
}

}  // namespace

void CpShard::all_gather_rows(TensorMemory& mem, const Tensor& mine, const Tensor& all) const {
  DI_CHECK_INTERNAL(mine.rank() >= 1 && mine.dim(0) == local_tokens())
      << "cp all-gather: " << mine.str() << " for " << local_tokens() << " local tokens";
  DI_CHECK_INTERNAL(all.dim(0) == total_ && all.dtype() == mine.dtype() &&
                    with_rows(mine.shape(), total_) == all.shape())
      << "cp all-gather: " << all.str() << " for " << mine.str();
  // Equal blocks: every rank sends max_local_ rows (the tail of a shorter rank's block is padding).
  OwnedTensor send = mem.zeros(mine.dtype(), with_rows(mine.shape(), max_local_));
  OwnedTensor recv = mem.zeros(mine.dtype(), with_rows(mine.shape(), max_local_ * size_));
  mem.copy(send.view().slice(0, local_tokens()), mine);
  mem.synchronize();  // a device communicator reads `send` outside the memory's stream
  all_gather_(send.view().data(), recv.view().data(), static_cast<size_t>(send.view().nbytes()));
  for (int r = 0; r < size_; ++r) {
    int64_t at = r * max_local_;
    for (const TokenRange& p : ranges_[r]) {
      if (p.size() == 0) continue;
      mem.copy(all.slice(p.begin, p.end), recv.view().slice(at, at + p.size()));
      at += p.size();
    }
  }
}

void CpShard::select_rows(TensorMemory& mem, const Tensor& all, const Tensor& mine) const {
  DI_CHECK_INTERNAL(all.dim(0) == total_ && mine.dim(0) == local_tokens())
      << "cp select: " << all.str() << " -> " << mine.str();
  int64_t at = 0;
  for (const TokenRange& p : ranges_[rank_]) {
    if (p.size() == 0) continue;
    mem.copy(mine.slice(at, at + p.size()), all.slice(p.begin, p.end));
    at += p.size();
  }
}

CpLauncher make_in_process_cp_launcher(int cp) {
  DI_CHECK(cp >= 1) << "context-parallel size " << cp << " must be >= 1";
  auto world = std::make_shared<InProcessWorld>(cp);
  return [world](int n, const std::function<void(int rank, const AllGatherBytes&)>& fn) {
    DI_CHECK_INTERNAL(n == world->size()) << "CP launch over " << n << " ranks on a world of " << world->size();
    world->run_on_all([&fn](Communicator& comm) {
      const AllGatherBytes all_gather = [&comm](const void* send, void* recv, size_t bytes) {
        comm.all_gather(send, recv, static_cast<int64_t>(bytes), DType::kU8);
      };
      fn(comm.rank(), all_gather);
    });
  };
}

}  // namespace deepinfer
