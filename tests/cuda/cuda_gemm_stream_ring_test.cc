// The streaming GEMM's ring form (ops/cuda/gemm_stream_ring_cuda.cu) called directly through GemmKernelParams on
// random MXFP4 problems (cuda_gemm_problem.h): against the double reference in full (1e-4 of Σ|a·w| an entry: A is
// bf16 and the weights exact, only the fp32 sums differ), the same bytes on a second run, and the same bytes as the
// register-prefetch streaming kernel where that one runs the same tiles (one K slice a warp). Shapes: grouped calls
// whose groups take several passes in one block, one row, none; the plan's pass table; 1, 2 and 4 tile groups a block
// with a partial last tile and group; K of 1, 2 and 9 stages (fewer stages than the ring holds in flight, so its
// first copies span passes and tile groups); dense calls; and what it declines.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "cuda/cuda_gemm_problem.h"
#include "cuda/cuda_test_util.h"
#include "deepinfer/ops/cuda/gemm_stream_mma.h"
#include "deepinfer/ops/cuda/gemm_stream_ring.h"
#include "deepinfer/ops/cuda/kernels.h"

namespace deepinfer {
namespace {

using testing::DeviceTensor;
using testing::GemmProblemTest;
using testing::Kind;

class CudaGemmStreamRingTest : public GemmProblemTest {
 protected:
  // The ring on l's call with `rows` a pass, `slots` grid rows and `tile_groups` groups of tiles a block: the reference
  // in full and the same bytes again. Returns C.
  HostTensor check(const std::string& what, const Problem& pr, Launch& l, int rows, int64_t slots, int tile_groups) {
    cudaStream_t s = gpu().stream();
    l.p.choices.stream_mma_ring = true;
    EXPECT_TRUE(cuda::gemm_stream_ring_takes(l.p)) << what << ": declined";
    const auto ring = [&](const cuda::GemmKernelParams& p) {
      cuda::run_gemm_stream_ring(p, rows, slots, tile_groups, s);
    };
    const std::string name = what + " rows " + std::to_string(rows) + " groups " + std::to_string(tile_groups);
    HostTensor got = run(l, pr, ring);
    check_reference(name, pr, got, /*full=*/true);
    expect_same_bytes((name + " repeated").c_str(), run(l, pr, ring), got);
    return got;
  }
};

// Groups of 8, 3, 0, 20, 1 and 17 rows (a block loops over up to three passes of 8 rows, or 20 of 1), N = 1000 (63
// tiles: a partial last tile, and the grid's last block holds fewer tile groups than the others), K = 256, 512 and
// 2304 (V4.1's expert inter): 1, 2 and 9 stages.
TEST_F(CudaGemmStreamRingTest, GroupedPassesAndTileGroupsMatchReference) {
  for (int64_t k : {256, 512, 2304}) {
    const Problem pr = grouped(Kind::kMxfp4, {8, 3, 0, 20, 1, 17}, 1000, k, 6);
    const std::unique_ptr<Launch> l = prepare(pr);
    for (auto [rows, groups] : {std::pair{8, 1}, {8, 2}, {4, 4}, {1, 1}})
      check("ring grouped K=" + std::to_string(k), pr, *l, rows, static_cast<int64_t>(pr.sizes.size()), groups);
  }
}

// The plan's pass table (MoePlanKernelParams::active_passes): a block a pass of 8 rows, entries group | pass << 16,
// the count after the capacity; the blocks past the count return before any copy.
TEST_F(CudaGemmStreamRingTest, PassTableMatchesReference) {
  const Problem pr = grouped(Kind::kMxfp4, {8, 30, 1, 0, 9}, 520, 768, 6);
  const std::unique_ptr<Launch> l = prepare(pr);
  std::vector<int32_t> table;
  for (size_t g = 0; g < pr.sizes.size(); ++g)
    for (int64_t q = 0; q * 8 < pr.sizes[g]; ++q) table.push_back(static_cast<int32_t>(g | (q << 16)));
  const int64_t count = static_cast<int64_t>(table.size()), cap = count + 3;
  table.resize(cap + 1, -1);
  table[cap] = static_cast<int32_t>(count);
  HostTensor ht(DType::kI32, {cap + 1});
  std::memcpy(ht.view().data(), table.data(), table.size() * 4);
  const DeviceTensor dt = up(ht);
  l->p.active_passes = static_cast<const int32_t*>(dt.data());
  l->p.pass_rows = 8;
  l->p.pass_capacity = cap;
  for (int groups : {1, 2}) check("ring pass table", pr, *l, 8, cap, groups);
}

// Dense calls (no groups): 5 rows and 1 row, N = 2100 (132 tiles, a partial tile group).
TEST_F(CudaGemmStreamRingTest, DenseMatchesReference) {
  for (int64_t m : {5, 1}) {
    const Problem pr = dense(Kind::kMxfp4, m, 2100, 512);
    const std::unique_ptr<Launch> l = prepare(pr);
    check("ring dense M=" + std::to_string(m), pr, *l, 8, 1, 2);
  }
}

// Where the register-prefetch kernel runs one K slice a warp (8 groups x 256 tiles fill its 2048 warps) in one tile
// group a block and 8-row passes (65 gathered rows: from kGroupedFullPassSlots), both issue the same mma sequence a
// tile: the same bytes, by the direct call and through run_gemm_stream_mma with the choice on. (Should the register
// kernel's launch rule change, this shape may need another to keep it at one slice and one group.)
TEST_F(CudaGemmStreamRingTest, EqualsTheRegisterKernel) {
  const Problem pr = grouped(Kind::kMxfp4, {9, 8, 8, 8, 8, 8, 8, 8}, 4096, 512, 6);
  const std::unique_ptr<Launch> l = prepare(pr);
  cudaStream_t s = gpu().stream();
  const HostTensor ring = check("ring vs register kernel", pr, *l, 8, 8, 1);
  for (bool on : {false, true}) {
    l->p.choices.stream_mma_ring = on;
    bool took = false;
    const HostTensor via =
        run(*l, pr, [&](const cuda::GemmKernelParams& p) { took = cuda::run_gemm_stream_mma(p, 8, s); });
    ASSERT_TRUE(took);
    expect_same_bytes(on ? "run_gemm_stream_mma, ring chosen = ring" : "register kernel = ring", via, ring);
  }
}

// What the ring declines: the choice off, K not a multiple of its 256-K stage, FP8 weights, batch-invariant mode, no
// bf16 copy of A, scales not 8-byte aligned.
TEST_F(CudaGemmStreamRingTest, DeclinesWhatItDoesNotTake) {
  const Problem pr = dense(Kind::kMxfp4, 4, 256, 512);
  const std::unique_ptr<Launch> l = prepare(pr);
  cuda::GemmKernelParams p = l->p;
  p.choices.stream_mma_ring = true;
  EXPECT_TRUE(cuda::gemm_stream_ring_takes(p));
  const auto declines = [&](const char* what, auto change) {
    cuda::GemmKernelParams q = p;
    change(q);
    EXPECT_FALSE(cuda::gemm_stream_ring_takes(q)) << what;
  };
  declines("choice off", [](cuda::GemmKernelParams& q) { q.choices.stream_mma_ring = false; });
  declines("K = 288", [](cuda::GemmKernelParams& q) { q.k = 288; });
  declines("FP8 blocks", [](cuda::GemmKernelParams& q) { q.format = QuantFormat::kFP8Block; });
  declines("batch-invariant", [](cuda::GemmKernelParams& q) { q.batch_invariant = true; });
  declines("no bf16 A", [](cuda::GemmKernelParams& q) { q.a_bf16 = nullptr; });
  declines("lda % 8", [](cuda::GemmKernelParams& q) { q.lda = 516; });
  declines("scales at 4 bytes", [](cuda::GemmKernelParams& q) { q.b_scale = static_cast<const uint8_t*>(q.b_scale) + 4; });
}

}  // namespace
}  // namespace deepinfer
