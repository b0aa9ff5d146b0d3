#include "deepinfer/parallel/communicator.h"

#include <gtest/gtest.h>

#include <mutex>
#include <numeric>
#include <random>

#include "deepinfer/parallel/in_process_communicator.h"

namespace deepinfer {
namespace {

// Per-rank random data (never zeros) that every rank can regenerate for any peer.
std::vector<float> rank_data(int rank, int64_t n) {
  std::mt19937 gen(1234 + rank);
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

TEST(InProcessCommunicator, AllReduceSumMaxInRankOrder) {
  for (int n : {1, 2, 3, 4}) {
    InProcessWorld::run(n, [&](Communicator& comm) {
      EXPECT_EQ(comm.size(), n);
      std::vector<float> v = rank_data(comm.rank(), 37);
      comm.all_reduce(v.data(), 37, DType::kF32, ReduceOp::kSum);
      for (int64_t i = 0; i < 37; ++i) {
        float expect = rank_data(0, 37)[i];
        for (int r = 1; r < n; ++r) expect += rank_data(r, 37)[i];
        ASSERT_EQ(v[i], expect) << "element " << i;  // bitwise: summed in rank order
      }
      int64_t m = comm.all_reduce_max(10 * comm.rank() + 3);
      EXPECT_EQ(m, 10 * (n - 1) + 3);
      EXPECT_EQ(comm.all_reduce_sum(int64_t{1} << 40), n * (int64_t{1} << 40));  // exact beyond 2^32
    });
  }
}

TEST(InProcessCommunicator, AllReduceBf16RoundsOnce) {
  InProcessWorld::run(3, [](Communicator& comm) {
    const float vals[3] = {1.0f, 1.0f / 256, 1.0f / 256};  // bf16 steps: 1 + 2/256 is representable, 1 + 1/256 not
    uint16_t x = f32_to_bf16(vals[comm.rank()]);
    comm.all_reduce(&x, 1, DType::kBF16);
    EXPECT_EQ(bf16_to_f32(x), round_bf16(1.0f + 2.0f / 256));
  });
}

TEST(InProcessCommunicator, AllGatherAndBroadcast) {
  InProcessWorld::run(4, [](Communicator& comm) {
    std::vector<float> mine = rank_data(comm.rank(), 5), all(20);
    comm.all_gather(mine.data(), all.data(), 5, DType::kF32);
    for (int r = 0; r < 4; ++r)
      for (int i = 0; i < 5; ++i) ASSERT_EQ(all[r * 5 + i], rank_data(r, 5)[i]);
    // In place: the send buffer is this rank's slot of recv.
    std::vector<int32_t> ids(4, -1);
    ids[comm.rank()] = 100 + comm.rank();
    comm.all_gather(ids.data() + comm.rank(), ids.data(), 1, DType::kI32);
    EXPECT_EQ(ids, (std::vector<int32_t>{100, 101, 102, 103}));
    std::vector<float> b = comm.rank() == 2 ? rank_data(2, 7) : std::vector<float>(7, 0.0f);
    comm.broadcast(b.data(), 7, DType::kF32, 2);
    EXPECT_EQ(b, rank_data(2, 7));
  });
}

TEST(InProcessCommunicator, AllToAllVWithRaggedCounts) {
  const int n = 4;
  InProcessWorld::run(n, [&](Communicator& comm) {
    const int me = comm.rank();
    // Rank s sends (s + 2·d) % 3 elements to rank d (some zero), valued 1000·s + 10·d + j.
    std::vector<int64_t> send_counts(n);
    std::vector<float> send;
    for (int d = 0; d < n; ++d) {
      send_counts[d] = (me + 2 * d) % 3;
      for (int j = 0; j < send_counts[d]; ++j) send.push_back(1000.0f * me + 10.0f * d + j);
    }
    std::vector<int64_t> recv_counts = comm.exchange_counts(send_counts);
    std::vector<float> recv(std::accumulate(recv_counts.begin(), recv_counts.end(), int64_t{0}));
    comm.all_to_all_v(send.data(), send_counts, recv.data(), recv_counts, DType::kF32);
    std::vector<float> expect;
    for (int s = 0; s < n; ++s) {
      ASSERT_EQ(recv_counts[s], (s + 2 * me) % 3);
      for (int j = 0; j < recv_counts[s]; ++j) expect.push_back(1000.0f * s + 10.0f * me + j);
    }
    EXPECT_EQ(recv, expect);
  });
}

TEST(InProcessCommunicator, SplitIntoGroups) {
  // 6 ranks as 3 groups of 2 (EP groups) and, across them, 2 groups of 3; keys reverse the order in one split.
  InProcessWorld::run(6, [](Communicator& comm) {
    const int me = comm.rank();
    std::unique_ptr<Communicator> ep = comm.split(me / 2, me);
    std::unique_ptr<Communicator> across = comm.split(me % 2, -me);
    EXPECT_EQ(ep->size(), 2);
    EXPECT_EQ(ep->rank(), me % 2);
    EXPECT_EQ(across->size(), 3);
    EXPECT_EQ(across->rank(), 2 - me / 2);  // key -me: the highest old rank comes first
    int64_t s = ep->all_reduce_sum(me);
    EXPECT_EQ(s, (me / 2) * 4 + 1);
    int64_t t = across->all_reduce_sum(me);
    EXPECT_EQ(t, me % 2 == 0 ? 0 + 2 + 4 : 1 + 3 + 5);
    // Sub-groups and the world interleave freely.
    comm.barrier();
    std::unique_ptr<Communicator> nested = ep->split(0, 0);
    EXPECT_EQ(nested->size(), 2);
  });
}

TEST(InProcessCommunicator, MismatchedCollectivesThrowInsteadOfHanging) {
  try {
    InProcessWorld::run(2, [](Communicator& comm) {
      float x[4] = {1, 2, 3, 4};
      comm.all_reduce(x, comm.rank() == 0 ? 4 : 3, DType::kF32);
    });
    FAIL() << "expected a collective mismatch";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInternal);
    EXPECT_NE(std::string(e.what()).find("collective mismatch"), std::string::npos) << e.what();
  }
}

TEST(InProcessCommunicator, OneRankFailingReleasesThePeers) {
  try {
    InProcessWorld::run(3, [](Communicator& comm) {
      if (comm.rank() == 1) DI_FAIL(ErrorCode::kNotFound) << "rank 1 lost its checkpoint";
      comm.barrier();  // ranks 0 and 2 would wait forever without the failure flag
    });
    FAIL() << "expected rank 1's error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNotFound);  // the failing rank's own error, not "another rank failed"
  }
}

TEST(ParallelLayout, SizesAndErrors) {
  ParallelLayout l = ParallelLayout::make(2, 4);
  EXPECT_EQ(l.world, 4);
  EXPECT_EQ(l.replicas(), 1);
  EXPECT_EQ(l.ep_group(3), 1);
  EXPECT_EQ(l.ep_rank(3), 1);
  ParallelLayout e = ParallelLayout::make(4, 1);
  EXPECT_EQ(e.world, 4);
  EXPECT_EQ(e.replicas(), 4);
  EXPECT_EQ(e.dp_shard(3), 0);
  EXPECT_EQ(ParallelLayout::make(2, 8).world, 8);
  EXPECT_EQ(ParallelLayout::make(4, 6).world, 12);
  try {
    ParallelLayout::make(3, 1, 4);
    FAIL();
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("not divisible by the EP size 3"), std::string::npos) << err.what();
  }
  EXPECT_THROW(ParallelLayout::make(0, 1), Error);
}

}  // namespace
}  // namespace deepinfer
