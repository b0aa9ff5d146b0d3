#include "deepinfer/parallel/communicator.h"

#include <algorithm>
#include <numeric>
#include <sstream>

#include "deepinfer/core/error.h"

namespace deepinfer {

int64_t comm_element_bytes(DType dtype) {
  const int bits = dtype_bits(dtype);
  DI_CHECK_CODE(bits % 8 == 0, ErrorCode::kUnsupported)
      << "communicator: dtype " << dtype_name(dtype) << " is not byte-addressable";
  return bits / 8;
}

std::vector<int64_t> Communicator::exchange_counts(std::span<const int64_t> send_counts) {
  const int n = size();
  DI_CHECK(static_cast<int>(send_counts.size()) == n)
      << "exchange_counts: " << send_counts.size() << " send counts for " << n << " ranks";
  // all_gather the count rows, then read column `rank`.
  std::vector<int64_t> all(static_cast<size_t>(n) * n);
  all_gather(send_counts.data(), all.data(), n, DType::kI64);
  std::vector<int64_t> recv(n);
  for (int p = 0; p < n; ++p) recv[p] = all[static_cast<size_t>(p) * n + rank()];
  return recv;
}

std::vector<float> Communicator::all_gather_v(std::span<const float> send, std::vector<int64_t>* counts) {
  const int n = size();
  std::vector<int64_t> sizes(n);
  const int64_t mine = static_cast<int64_t>(send.size());
  all_gather(&mine, sizes.data(), 1, DType::kI64);
  const int64_t longest = *std::max_element(sizes.begin(), sizes.end());
  // Pad to the longest piece so one fixed-size all_gather moves everything.
  std::vector<float> padded(longest, 0.0f), gathered(static_cast<size_t>(longest) * n);
  std::copy(send.begin(), send.end(), padded.begin());
  all_gather(padded.data(), gathered.data(), longest, DType::kF32);
  std::vector<float> out;
  out.reserve(std::accumulate(sizes.begin(), sizes.end(), int64_t{0}));
  for (int p = 0; p < n; ++p)
    out.insert(out.end(), gathered.begin() + p * longest, gathered.begin() + p * longest + sizes[p]);
  if (counts) *counts = sizes;
  return out;
}

int64_t Communicator::all_reduce_max(int64_t v) {
  all_reduce(&v, 1, DType::kI64, ReduceOp::kMax);
  return v;
}

int64_t Communicator::all_reduce_sum(int64_t v) {
  all_reduce(&v, 1, DType::kI64, ReduceOp::kSum);
  return v;
}

ParallelLayout ParallelLayout::make(int ep, int dp, int world, int cp) {
  DI_CHECK(ep >= 1) << "parallel layout: ep must be >= 1, got " << ep;
  DI_CHECK(dp >= 1) << "parallel layout: dp must be >= 1, got " << dp;
  DI_CHECK(cp >= 1) << "parallel layout: cp must be >= 1, got " << cp;
  DI_CHECK(world >= 0) << "parallel layout: world size must be >= 1, got " << world;
  ParallelLayout l;
  l.ep = ep;
  l.dp = dp;
  l.cp = cp;
  l.world = world == 0 ? std::lcm(ep, dp * cp) : world;
  DI_CHECK(l.world % ep == 0) << "parallel layout: world size " << l.world << " is not divisible by the EP size " << ep;
  DI_CHECK(l.world % dp == 0) << "parallel layout: world size " << l.world << " is not divisible by the DP size " << dp;
  DI_CHECK(cp == 1 || l.world == dp * cp)
      << "parallel layout: with cp " << cp << " every rank of a DP shard is a CP rank, so the world (" << l.world
      << " = lcm(ep " << ep << ", dp·cp " << dp * cp << ")) must be dp·cp = " << dp * cp << "; pick ep dividing dp·cp";
  return l;
}

std::string ParallelLayout::str() const {
  std::ostringstream s;
  s << "world " << world << " = " << world / ep << " EP group(s) of " << ep << ", " << dp << " DP shard(s) of "
    << replicas() << " rank(s)";
  if (cp > 1) s << " (each shard's ranks a CP group)";
  return s.str();
}

}  // namespace deepinfer
