// Expert-parallel MoE against the single-rank CPU MoE op on random data: bit-identical outputs for EP1/2/4, with
// each rank holding its own tokens (attention DP), with replicated tokens (replicas split the work), with
// redundant expert replicas (EPLB placements), for both weight positions (V4: after w2, V4.1: before), with a
// shared expert and the SwiGLU clamp.
#include "deepinfer/parallel/expert_parallel.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "deepinfer/parallel/in_process_communicator.h"

namespace deepinfer {
namespace {

struct MoeCase {
  int64_t T = 11, D = 24, I = 16, E = 8, k = 3;
  bool before_w2 = false;
  float limit = 0.0f;
  uint32_t seed = 7;
};

struct MoeData {
  std::vector<HostTensor> storage;
  std::vector<ExpertWeights> experts;
  ExpertWeights shared;
  HostTensor x, weights, indices;
};

HostTensor random_tensor(Shape shape, std::mt19937& gen, float scale) {
  HostTensor t(DType::kF32, std::move(shape));
  std::uniform_real_distribution<float> dist(-scale, scale);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = dist(gen);
  return t;
}

MoeData make_data(const MoeCase& c) {
  std::mt19937 gen(c.seed);
  MoeData m;
  for (int64_t e = 0; e <= c.E; ++e) {  // the last one is the shared expert
    m.storage.push_back(random_tensor({c.I, c.D}, gen, 0.5f));
    m.storage.push_back(random_tensor({c.I, c.D}, gen, 0.5f));
    m.storage.push_back(random_tensor({c.D, c.I}, gen, 0.5f));
  }
  for (int64_t e = 0; e <= c.E; ++e) {
    ExpertWeights w{m.storage[3 * e].view(), m.storage[3 * e + 1].view(), m.storage[3 * e + 2].view()};
    if (e < c.E) {
      m.experts.push_back(w);
    } else {
      m.shared = w;
    }
  }
  m.x = random_tensor({c.T, c.D}, gen, 1.0f);
  m.weights = random_tensor({c.T, c.k}, gen, 1.0f);
  m.indices = HostTensor(DType::kI32, {c.T, c.k});
  for (int64_t t = 0; t < c.T; ++t) {
    std::vector<int32_t> all(c.E);
    for (int32_t e = 0; e < c.E; ++e) all[e] = e;
    std::shuffle(all.begin(), all.end(), gen);  // distinct experts per token, in random (not sorted) order
    for (int64_t j = 0; j < c.k; ++j) m.indices.data<int32_t>()[t * c.k + j] = all[j];
  }
  return m;
}

MoeParams params(const MoeCase& c, const MoeData& m, const Tensor& out) {
  MoeParams p;
  p.x = m.x.view();
  p.weights = m.weights.view();
  p.indices = m.indices.view();
  p.experts = &m.experts;
  p.shared = &m.shared;
  p.out = out;
  p.swiglu_limit = c.limit;
  p.weight_before_w2 = c.before_w2;
  return p;
}

HostTensor reference(const MoeCase& c, const MoeData& m) {
  auto backend = make_cpu_backend(1);
  HostTensor out(DType::kF32, {c.T, c.D});
  backend->moe(params(c, m, out.view()));
  return out;
}

// Runs the EP MoE on `world` ranks with EP group = world; `replicas` ranks share each token set. Returns each
// rank's output. Rank r's tokens: the rows [r·T/shards, (r+1)·T/shards) of its shard when DP, all when replicated.
std::vector<HostTensor> run_ep(const MoeCase& c, const MoeData& m, int world, int replicas,
                               const std::vector<ExpertPlacement>& placement_per_layer, bool fp8 = false) {
  std::vector<HostTensor> outs(world);
  const int shards = world / replicas;
  InProcessWorld::run(world, [&](Communicator& comm) {
    const int r = comm.rank(), shard = r / replicas;
    auto backend = make_cpu_backend(1);
    auto rep = comm.split(shard, r);
    ExpertParallel ep(comm, *rep, placement_per_layer);
    ep.set_fp8_dispatch(fp8);
    const int64_t t0 = c.T * shard / shards, t1 = c.T * (shard + 1) / shards;
    HostTensor out(DType::kF32, {t1 - t0, c.D});
    MoeParams p = params(c, m, out.view());
    p.x = m.x.view().slice(t0, t1);
    p.weights = m.weights.view().slice(t0, t1);
    p.indices = m.indices.view().slice(t0, t1);
    ep.moe(*backend, 0, p);
    ep.idle(*backend, 0, m.experts, c.limit, c.before_w2);  // a second, empty round must pair up too
    outs[r] = std::move(out);
  });
  return outs;
}

void expect_bitwise(const MoeCase& c, const HostTensor& ref, const std::vector<HostTensor>& outs, int replicas) {
  const int world = static_cast<int>(outs.size()), shards = world / replicas;
  for (int r = 0; r < world; ++r) {
    const int shard = r / replicas;
    const int64_t t0 = c.T * shard / shards;
    ASSERT_EQ(0, std::memcmp(outs[r].data<float>(), ref.data<float>() + t0 * c.D, outs[r].view().nbytes()))
        << "rank " << r << " differs from the single-rank MoE";
  }
}

TEST(ExpertPlacement, ContiguousAndExplicit) {
  ExpertPlacement p = ExpertPlacement::contiguous(6, 4);
  EXPECT_EQ(p.str(), "r0:[0] r1:[1 2] r2:[3] r3:[4 5]");
  EXPECT_EQ(p.ranks_of(2), std::vector<int>{1});
  EXPECT_EQ(p.slot_of(3, 5), 1);
  EXPECT_EQ(p.slot_of(0, 5), -1);
  ExpertPlacement q = ExpertPlacement::from_rank_experts(3, {{0, 2}, {1, 2}});
  EXPECT_EQ(q.ranks_of(2), (std::vector<int>{0, 1}));
  EXPECT_THROW(ExpertPlacement::from_rank_experts(3, {{0}, {1}}), Error);  // expert 2 nowhere
  EXPECT_THROW(ExpertPlacement::from_rank_experts(3, {{0, 3}, {1, 2}}), Error);
  EXPECT_THROW(ExpertPlacement::contiguous(2, 4), Error);
}

TEST(ExpertParallel, DataParallelTokensMatchSingleRankBitwise) {
  for (bool before : {false, true}) {
    MoeCase c;
    c.before_w2 = before;
    c.limit = before ? 0.7f : 0.0f;  // V4.1 form with the clamp; V4 form without
    const MoeData m = make_data(c);
    const HostTensor ref = reference(c, m);
    for (int world : {1, 2, 4}) {
      SCOPED_TRACE("EP" + std::to_string(world) + (before ? " before_w2" : ""));
      expect_bitwise(c, ref, run_ep(c, m, world, 1, {ExpertPlacement::contiguous(c.E, world)}), 1);
    }
  }
}

TEST(ExpertParallel, ReplicatedTokensSplitTheWork) {
  MoeCase c;
  const MoeData m = make_data(c);
  const HostTensor ref = reference(c, m);
  // 4 ranks, 2 shards of 2 replicas; and 4 replicas of one shard (--ep 4 without dp).
  expect_bitwise(c, ref, run_ep(c, m, 4, 2, {ExpertPlacement::contiguous(c.E, 4)}), 2);
  expect_bitwise(c, ref, run_ep(c, m, 4, 4, {ExpertPlacement::contiguous(c.E, 4)}), 4);
}

TEST(ExpertParallel, RedundantReplicasGiveTheSameOutput) {
  MoeCase c;
  const MoeData m = make_data(c);
  const HostTensor ref = reference(c, m);
  // Experts 0 and 5 on both ranks, slots in a non-sorted order.
  ExpertPlacement p = ExpertPlacement::from_rank_experts(8, {{5, 0, 1, 2, 3}, {0, 4, 5, 6, 7}});
  expect_bitwise(c, ref, run_ep(c, m, 2, 1, {p}), 1);
}

TEST(ExpertParallel, CountsLoadPerExpert) {
  MoeCase c;
  const MoeData m = make_data(c);
  std::vector<int64_t> expect(c.E, 0);
  for (int64_t i = 0; i < c.T * c.k; ++i) ++expect[m.indices.data<int32_t>()[i]];
  std::vector<std::vector<int64_t>> counted(2);
  InProcessWorld::run(2, [&](Communicator& comm) {
    auto backend = make_cpu_backend(1);
    auto rep = comm.split(comm.rank(), 0);
    ExpertParallel ep(comm, *rep, {ExpertPlacement::contiguous(c.E, 2)});
    const int64_t t0 = c.T * comm.rank() / 2, t1 = c.T * (comm.rank() + 1) / 2;
    HostTensor out(DType::kF32, {t1 - t0, c.D});
    MoeParams p = params(c, m, out.view());
    p.x = m.x.view().slice(t0, t1);
    p.weights = m.weights.view().slice(t0, t1);
    p.indices = m.indices.view().slice(t0, t1);
    ep.moe(*backend, 0, p);
    counted[comm.rank()] = ep.load().counts;
  });
  for (int e = 0; e < c.E; ++e) EXPECT_EQ(counted[0][e] + counted[1][e], expect[e]) << "expert " << e;
}

// FP8 dispatch rounds each dispatched row to e4m3 with one scale per 128 columns: within e4m3's half-ulp (2^-4
// relative, plus the subnormal floor of scale·2^-10) of the row, non-finite blocks arrive as NaN.
TEST(ExpertParallel, Fp8DispatchRowRoundTrip) {
  std::mt19937 gen(3);
  for (int64_t d : {1, 24, 128, 300}) {
    HostTensor x = random_tensor({d}, gen, 3.0f);
    x.data<float>()[d / 2] *= 50.0f;  // one large column: the other columns of its block use the same scale
    std::vector<float> packed(fp8_dispatch_row_floats(d)), back(d);
    EXPECT_LT(static_cast<int64_t>(packed.size()) * 4, d * 4 / 3 + 4 * ((d + 127) / 128) + 4) << d;
    fp8_dispatch_pack(x.data<float>(), d, packed.data());
    fp8_dispatch_unpack(packed.data(), d, back.data());
    for (int64_t i = 0; i < d; ++i) {
      const float v = x.data<float>()[i], scale = packed[i / 128];
      EXPECT_LE(std::fabs(back[i] - v), std::fabs(v) * 0.0625f + scale * 0.001f) << "d " << d << " col " << i;
    }
  }
  std::vector<float> x(200, 1.0f), packed(fp8_dispatch_row_floats(200)), back(200);
  x[150] = std::numeric_limits<float>::infinity();
  fp8_dispatch_pack(x.data(), 200, packed.data());
  fp8_dispatch_unpack(packed.data(), 200, back.data());
  EXPECT_NEAR(back[0], 1.0f, 1e-6f);  // a finite block is untouched by its neighbour
  for (int i = 128; i < 200; ++i) EXPECT_TRUE(std::isnan(back[i])) << i;
}

// The FP8-dispatch EP MoE is exactly the single-rank MoE whose routed experts read the e4m3-rounded rows (the
// shared expert reads the exact row): bitwise, for EP 1/2/4 and both weight positions.
TEST(ExpertParallel, Fp8DispatchEqualsTheMoeOfTheRoundedRows) {
  for (bool before : {false, true}) {
    MoeCase c;
    c.D = 160;  // two scale blocks, the second partial
    c.before_w2 = before;
    c.limit = before ? 0.7f : 0.0f;
    const MoeData m = make_data(c);
    auto backend = make_cpu_backend(1);
    MoeData rounded = make_data(c);
    for (int64_t t = 0; t < c.T; ++t) {
      std::vector<float> packed(fp8_dispatch_row_floats(c.D));
      fp8_dispatch_pack(m.x.data<float>() + t * c.D, c.D, packed.data());
      fp8_dispatch_unpack(packed.data(), c.D, rounded.x.data<float>() + t * c.D);
    }
    // Routed experts on the rounded rows, then (the op's order) the shared expert's output on the exact rows.
    HostTensor ref(DType::kF32, {c.T, c.D}), shared_out(DType::kF32, {c.T, c.D});
    MoeParams r = params(c, rounded, ref.view());
    r.shared = nullptr;
    backend->moe(r);
    std::vector<ExpertWeights> one{m.shared};
    HostTensor ones(DType::kF32, {c.T, 1}), zero(DType::kI32, {c.T, 1});
    std::fill(ones.data<float>(), ones.data<float>() + c.T, 1.0f);
    std::fill(zero.data<int32_t>(), zero.data<int32_t>() + c.T, 0);
    MoeParams s = params(c, m, shared_out.view());
    s.weights = ones.view();
    s.indices = zero.view();
    s.experts = &one;
    s.shared = nullptr;
    s.weight_before_w2 = true;
    backend->moe(s);
    for (int64_t i = 0; i < c.T * c.D; ++i) ref.data<float>()[i] += shared_out.data<float>()[i];
    bool differs_from_exact = false;
    const HostTensor exact = reference(c, m);
    for (int64_t i = 0; i < c.T * c.D; ++i) differs_from_exact |= exact.data<float>()[i] != ref.data<float>()[i];
    EXPECT_TRUE(differs_from_exact) << "the rounding must be visible, or this test proves nothing";
    for (int world : {1, 2, 4}) {
      SCOPED_TRACE("FP8 EP" + std::to_string(world) + (before ? " before_w2" : ""));
      expect_bitwise(c, ref, run_ep(c, m, world, 1, {ExpertPlacement::contiguous(c.E, world)}, /*fp8=*/true), 1);
    }
  }
}

}  // namespace
}  // namespace deepinfer
