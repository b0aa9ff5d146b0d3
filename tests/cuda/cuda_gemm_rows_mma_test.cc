// The dense decode GEMM of 9-64 rows (ops/cuda/gemm_rows_mma_cuda.cu) called directly through GemmKernelParams, on
// random data (cuda_gemm_problem.h): against the double reference in full (every output; tolerance 1e-4 of Σ|a·w|
// per entry, see there), bf16 A and f32 A (rounded to bf16 by the kernel: the same bytes), the same bytes on a second
// run (the cluster's partial tiles add in rank order), through run_gemm and as a programmatic launch after the copy
// that writes its A, C rows strided. Shapes: each row-group
// size (9-16, 17-32, 33-64 rows), partial 128-row weight blocks, K not a multiple of the 4-chunk step, K split over
// clusters of 2-8 blocks and not split; MXFP4, FP8 128x128 and 32x32 blocks, FP8 per-32 rows, all UE8M0.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>

#include "cuda/cuda_gemm_problem.h"
#include "cuda/cuda_test_util.h"
#include "deepinfer/ops/cuda/gemm_rows_mma.h"
#include "deepinfer/ops/cuda/gemm_stream_mma.h"
#include "deepinfer/ops/cuda/kernels.h"

namespace deepinfer {
namespace {

using testing::DeviceTensor;
using testing::GemmProblemTest;
using testing::Kind;
using testing::kind_name;

class CudaGemmRowsMmaTest : public GemmProblemTest {
 protected:
  // The whole check for one problem: taken, the reference in full, repeated bytes, run_gemm's dispatch, f32 A, and
  // C with rows 2N apart (the other N columns untouched). Returns the launch shape it ran with.
  // `pick`: a launch shape other than the rule's (its rows_mma_warps / _kw / _splits).
  cuda::RowsMmaShape check(Kind kind, int64_t m, int64_t n, int64_t k, const cuda::GemmChoices& pick = {}) {
    const Problem pr = dense(kind, m, n, k);
    const std::unique_ptr<Launch> l = prepare(pr);
    l->p.choices = pick;
    l->p.choices.rows_mma = cuda::KernelPick::kAlways;  // whatever the default rule says of the weight's size
    cudaStream_t s = gpu().stream();
    const std::string what = std::string("rows-mma ") + kind_name(kind) + " M=" + std::to_string(m) +
                             " N=" + std::to_string(n) + " K=" + std::to_string(k);
    const cuda::RowsMmaShape shape = cuda::gemm_rows_mma_shape(l->p.format, n, k, m, gpu().device_info().sm_count,
                                                               l->p.choices, cuda::gemm_rows_mma_cluster_slots);
    bool took = false;
    const HostTensor got = run(*l, pr, [&](const cuda::GemmKernelParams& p) { took = cuda::run_gemm_rows_mma(p, s); });
    EXPECT_TRUE(took) << what << ": declined";
    if (!took) return shape;
    std::printf("[cuda-op] %-48s warps %d (%d along K, %d steps each), splits %d x %d steps, smem %zu%s\n",
                what.c_str(), shape.warps, shape.kw, shape.warp_steps, shape.splits, shape.split_steps, shape.smem,
                shape.wg ? ", warpgroup form" : "");
    check_reference(what, pr, got, /*full=*/true);
    const HostTensor again = run(*l, pr, [&](const cuda::GemmKernelParams& p) { cuda::run_gemm_rows_mma(p, s); });
    expect_same_bytes((what + " repeated").c_str(), again, got);
    const HostTensor via = run(*l, pr, [&](const cuda::GemmKernelParams& p) { cuda::run_gemm(p, s); });
    expect_same_bytes((what + " run_gemm = run_gemm_rows_mma").c_str(), via, got);
    {
      // f32 A holding the bf16 values: rounding them again changes nothing, so the same bytes.
      HostTensor fa(DType::kF32, {m, k});
      for (int64_t i = 0; i < m * k; ++i) fa.data<float>()[i] = bf16_to_f32(pr.a[i]);
      DeviceTensor dfa = up(fa);
      const HostTensor f32 = run(*l, pr, [&](const cuda::GemmKernelParams& p) {
        cuda::GemmKernelParams q = p;
        q.a_bf16 = nullptr;
        q.a = static_cast<const float*>(dfa.data());
        ASSERT_TRUE(cuda::run_gemm_rows_mma(q, s)) << what << " f32 A";
      });
      expect_same_bytes((what + " f32 A = bf16 A").c_str(), f32, got);
      // A programmatic launch (rows_mma_pdl) right after the kernel that writes its A (the bf16 cast of those f32
      // rows over 0xAB bytes): the kernel must wait for that write before it stages A.
      DeviceTensor a2 = poisoned_bytes(DType::kBF16, {m, k});
      const HostTensor pdl = run(*l, pr, [&](const cuda::GemmKernelParams& p) {
        cuda::run_cast_f32_to_bf16(static_cast<const float*>(dfa.data()), a2.data(), m * k, s);
        cuda::GemmKernelParams q = p;
        q.a_bf16 = a2.data();
        q.choices.rows_mma_pdl = true;
        ASSERT_TRUE(cuda::run_gemm_rows_mma(q, s)) << what << " pdl";
      });
      expect_same_bytes((what + " programmatic launch after the write of A").c_str(), pdl, got);
    }
    expect_wide_c_same(what, *l, pr, got,
                       [&](const cuda::GemmKernelParams& q) { return cuda::run_gemm_rows_mma(q, s); });
    return shape;
  }
};

TEST_F(CudaGemmRowsMmaTest, EveryFormatAndRowGroupMatchesReference) {
  cuda::GemmChoices mma_sync;  // 33-64 rows take the warpgroup form by default: its own test below
  mma_sync.rows_mma_wgmma = cuda::KernelPick::kNever;
  for (Kind kind : {Kind::kMxfp4, Kind::kFp8E8m0_128, Kind::kFp8E8m0_32, Kind::kFp8Row32})
    for (int64_t m : {9, 16, 17, 33, 64}) EXPECT_FALSE(check(kind, m, 1000, 2048, mma_sync).wg);
}

// V4-Flash's projection shapes at decode batch 64 (q_a, kv, o_b, the shared expert's down, q_b), and one of 512 tiles
// that does not split, so that split and unsplit calls and both block sizes run.
TEST_F(CudaGemmRowsMmaTest, ProjectionShapesSplitOverClusters) {
  int split_calls = 0, unsplit_calls = 0;
  for (const auto& [n, k] : std::vector<std::pair<int64_t, int64_t>>{
           {1024, 4096}, {512, 4096}, {4096, 8192}, {4096, 2048}, {32768, 1024}, {65536, 512}}) {
    const cuda::RowsMmaShape shape = check(Kind::kFp8E8m0_128, 64, n, k);
    (shape.splits > 1 ? split_calls : unsplit_calls) += 1;
  }
  EXPECT_GT(split_calls, 0);
  EXPECT_GT(unsplit_calls, 0);
}

// K short of a whole step (K % 64 != 0 for FP8, % 128 for MXFP4) and splits whose last range is shorter or empty.
TEST_F(CudaGemmRowsMmaTest, OddStepCountsMatchReference) {
  check(Kind::kFp8E8m0_32, 24, 300, 4096 + 32);
  check(Kind::kFp8Row32, 40, 129, 1056);
  check(Kind::kMxfp4, 12, 520, 4096 + 96);
}

// Chosen launch shapes (the op bench's sweep): warps along K in a block (their partial tiles summed in shared
// memory before the cluster's sum), with and without cluster splits, at each row group; ranges that leave the last
// warps of a block few or no steps.
TEST_F(CudaGemmRowsMmaTest, ChosenShapesMatchReference) {
  const auto pick = [](int warps, int kw, int splits, int share = 1) {
    cuda::GemmChoices c;
    c.rows_mma_warps = warps;
    c.rows_mma_kw = kw;
    c.rows_mma_splits = splits;
    c.rows_mma_share = share;
    return c;
  };
  for (int kw : {2, 4, 8})
    for (int splits : {1, 2, 8}) {
      // (33 rows of K = 4096 fit a block's shared memory only when split 8 ways.)
      const int64_t m = kw == 4 && splits == 8 ? 33 : 16;
      const cuda::RowsMmaShape sh = check(Kind::kFp8E8m0_128, m, 1024, 4096, pick(8, kw, splits));
      EXPECT_EQ(sh.kw, kw);
      EXPECT_EQ(sh.splits, splits);
    }
  check(Kind::kFp8E8m0_128, 64, 4096, 2048, pick(8, 2, 4));
  check(Kind::kFp8E8m0_128, 20, 2048 + 64, 4096, pick(16, 1, 4));  // 512-thread blocks, the last one half full
  check(Kind::kMxfp4, 64, 1024, 2048, pick(16, 2, 2));
  check(Kind::kFp8E8m0_32, 24, 300, 4096 + 32, pick(8, 4, 2));  // 65 steps: 33 a block, 10 a warp
  check(Kind::kMxfp4, 12, 520, 4096 + 96, pick(4, 4, 8));       // 33 steps: 5 a block, 2 a warp (one warp idle)
  check(Kind::kFp8Row32, 40, 129, 1056, pick(4, 2, 1));
  // Blocks of a cluster along N staging A together: 2 / 4 of them, with and without K splits, tiles that do not fill
  // the last cluster (blocks past N only stage), each row group.
  for (const auto& [share, splits] : std::vector<std::pair<int, int>>{{2, 1}, {2, 4}, {4, 2}, {8, 1}}) {
    const cuda::RowsMmaShape sh = check(Kind::kFp8E8m0_128, 16, 1024 + 128, 4096, pick(8, 1, splits, share));
    EXPECT_EQ(sh.share, share);
    EXPECT_EQ(sh.splits, splits);
  }
  check(Kind::kFp8E8m0_128, 64, 4096, 2048, pick(16, 1, 4, 2));
  check(Kind::kMxfp4, 24, 520, 4096 + 96, pick(4, 2, 2, 4));
  check(Kind::kFp8Row32, 9, 129, 1056, pick(8, 1, 1, 2));
}

// The warpgroup form (rows_mma_wgmma: register-A wgmma over the staged rows) against the double reference in full,
// with the checks above: every format and row group (n16 / n32 / n64), the projection shapes (clusters of 8 splits,
// pairs of blocks staging A together), K short of a step, chosen shapes with warps along K whose warpgroups share a
// K range (8 warps, 2 along K: 4 tiles), and one that does not (8 warps, 4 along K: 2 tiles), which keeps mma.sync.
TEST_F(CudaGemmRowsMmaTest, WarpgroupFormMatchesReference) {
  const auto wg = [](int warps = 0, int kw = 0, int splits = 0, int share = 0) {
    cuda::GemmChoices c;
    c.rows_mma_wgmma = cuda::KernelPick::kAlways;
    c.rows_mma_warps = warps;
    c.rows_mma_kw = kw;
    c.rows_mma_splits = splits;
    c.rows_mma_share = share;
    return c;
  };
  for (Kind kind : {Kind::kMxfp4, Kind::kFp8E8m0_128, Kind::kFp8E8m0_32, Kind::kFp8Row32})
    for (int64_t m : {9, 16, 17, 33, 64}) EXPECT_TRUE(check(kind, m, 1000, 2048, wg()).wg);
  for (const auto& [n, k] :
       std::vector<std::pair<int64_t, int64_t>>{{1024, 4096}, {512, 4096}, {4096, 8192}, {4096, 2048}, {32768, 1024}}) {
    EXPECT_TRUE(check(Kind::kFp8E8m0_128, 64, n, k, wg()).wg);
    EXPECT_TRUE(check(Kind::kFp8E8m0_128, 16, n, k, wg()).wg);
  }
  check(Kind::kFp8E8m0_32, 24, 300, 4096 + 32, wg());
  check(Kind::kMxfp4, 12, 520, 4096 + 96, wg());
  EXPECT_TRUE(check(Kind::kFp8E8m0_128, 64, 4096, 2048, wg(8, 2, 4)).wg);
  EXPECT_TRUE(check(Kind::kMxfp4, 64, 1024, 2048, wg(16, 2, 2)).wg);
  EXPECT_TRUE(check(Kind::kFp8E8m0_128, 16, 1024 + 128, 4096, wg(8, 1, 2, 4)).wg);
  EXPECT_FALSE(check(Kind::kFp8E8m0_128, 33, 1024, 4096, wg(8, 4, 8)).wg);
}

// What it declines (nothing enqueued): rows outside 9-64, grouped calls, batch-invariant mode, f32 scales with
// f32_scale_mma off and the kNever choice.
TEST_F(CudaGemmRowsMmaTest, DeclinesWhatItDoesNotTake) {
  cudaStream_t s = gpu().stream();
  const Problem pr = dense(Kind::kFp8E8m0_128, 32, 256, 512);
  const std::unique_ptr<Launch> l = prepare(pr);
  DeviceTensor c = poisoned({32, 256});
  l->p.c = static_cast<float*>(c.data());
  cuda::GemmKernelParams q = l->p;
  q.m = cuda::kGemmStreamMmaMaxRows;
  EXPECT_FALSE(cuda::run_gemm_rows_mma(q, s));
  q.m = cuda::kGemmRowsMmaMaxRows + 1;
  q.choices.rows_mma = cuda::KernelPick::kAlways;
  EXPECT_FALSE(cuda::run_gemm_rows_mma(q, s));
  q = l->p;
  q.batch_invariant = true;
  EXPECT_FALSE(cuda::run_gemm_rows_mma(q, s));
  q = l->p;
  q.scale_e8m0 = false;  // f32 scales: taken by default (f32_scale_mma), declined with the choice off
  q.choices.f32_scale_mma = false;
  EXPECT_FALSE(cuda::run_gemm_rows_mma(q, s));
  q = l->p;
  q.choices.rows_mma = cuda::KernelPick::kNever;
  EXPECT_FALSE(cuda::run_gemm_rows_mma(q, s));
  const int32_t offsets[2] = {0, 32};  // never read: a grouped call declines first
  q = l->p;
  q.group_offsets = offsets;
  EXPECT_FALSE(cuda::run_gemm_rows_mma(q, s));
  gpu().synchronize();
  const HostTensor h = down(c);
  int64_t written = 0;
  for (int64_t i = 0; i < 32 * 256; ++i) written += !std::isnan(h.data<float>()[i]);
  EXPECT_EQ(written, 0) << "a declined call wrote C";
}

// The launch shape (host only): the widest block (16, 8, 4 warps) whose tiles and splits make a third of the SMs'
// worth of blocks; splits while the blocks stay under the SMs (16-warp blocks: under half) and each split keeps 8
// steps, more while a K range does not fit 200 KB.
TEST(CudaGemmRowsMmaShape, SplitsByTilesStepsAndSharedMemory) {
  using cuda::gemm_rows_mma_shape;
  const QuantFormat fp8 = QuantFormat::kFP8Block;
  cuda::GemmChoices always;
  always.rows_mma = cuda::KernelPick::kAlways;
  auto s = gemm_rows_mma_shape(fp8, 4096, 4096, 64, 132);  // 16 tiles of 256 rows, 64 steps: 4 splits make 64 blocks
  EXPECT_EQ(s.warps, 16);
  EXPECT_EQ(s.splits, 4);
  EXPECT_EQ(s.split_steps, 16);
  EXPECT_EQ(s.smem, size_t{16} * (128 * 64 + 16));     // 16 steps x (64 k x 64 rows x 2 bytes + the warpgroup pad)
  s = gemm_rows_mma_shape(fp8, 32768, 1024, 64, 132);  // 128 tiles: no split
  EXPECT_EQ(s.warps, 16);
  EXPECT_EQ(s.splits, 1);
  EXPECT_EQ(s.split_steps, 16);
  s = gemm_rows_mma_shape(fp8, 4096, 2048, 16, 132);  // 32 steps: 4 splits of 8 (8 would leave 4 a split)
  EXPECT_EQ(s.warps, 16);
  EXPECT_EQ(s.splits, 4);
  s = gemm_rows_mma_shape(fp8, 1024, 4096, 16, 132);  // 4 tiles of 256 x 8 splits < 132 / 3: 8 tiles of 128
  EXPECT_EQ(s.warps, 8);
  EXPECT_EQ(s.splits, 8);
  s = gemm_rows_mma_shape(fp8, 512, 4096, 16, 132);  // 4 tiles of 128 x 8 splits < 132 / 3: 64-row blocks
  EXPECT_EQ(s.warps, 4);
  EXPECT_EQ(s.splits, 8);
  s = gemm_rows_mma_shape(fp8, 2048, 512, 16, 132);  // 8 steps: no split, so 64-row blocks (32 of them)
  EXPECT_EQ(s.warps, 4);
  EXPECT_EQ(s.splits, 1);
  s = gemm_rows_mma_shape(fp8, 4096, 8192, 64, 132);  // 128 steps: 4 splits of 32 would be 256 KB, so 8 of 16
  EXPECT_EQ(s.warps, 16);
  EXPECT_EQ(s.splits, 8);
  EXPECT_EQ(s.share, 1);  // 8 splits fill the cluster: no pair along N
  EXPECT_EQ(s.smem, size_t{16} * (128 * 64 + 16));
  // Pairs of 16-warp blocks along N stage A together when they have at most 4 splits, 8- and 4-warp blocks never.
  s = gemm_rows_mma_shape(fp8, 32768, 1024, 16, 132);
  EXPECT_EQ(s.warps, 16);
  EXPECT_EQ(s.splits, 1);
  EXPECT_EQ(s.share, 2);
  s = gemm_rows_mma_shape(fp8, 4096, 8192, 16, 132);
  EXPECT_EQ(s.warps, 16);
  EXPECT_EQ(s.splits, 4);
  EXPECT_EQ(s.share, 2);
  EXPECT_EQ(gemm_rows_mma_shape(fp8, 1024, 4096, 16, 132).share, 1);  // 8 warps

  // Waves of clusters (cluster_slots as an H100's: 15 clusters of 8 or 7 blocks at once, 19 of 6): V4-Flash o_b at 64
  // rows (16 clusters of 8 splits: two waves) takes 6 splits of 22 steps (one wave); V4.1 o_b (5120 rows: 40 8-warp
  // clusters, three waves) 16-warp blocks in 8 splits (20 clusters: two waves of 16 steps, not two of 22); a shape of
  // one wave stays; rows_mma_waves = false keeps the shape.
  const cuda::ClusterSlots h100 = [](int size) { return size >= 7 ? 15 : (size == 6 ? 19 : 132 / size); };
  s = gemm_rows_mma_shape(fp8, 4096, 8192, 64, 132, {}, h100);
  EXPECT_EQ(s.warps, 16);
  EXPECT_EQ(s.splits, 6);
  EXPECT_EQ(s.split_steps, 22);
  EXPECT_EQ(s.share, 1);
  EXPECT_LE(s.smem, size_t{200} * 1024);
  s = gemm_rows_mma_shape(fp8, 5120, 8192, 64, 132, {}, h100);
  EXPECT_EQ(s.warps, 16);
  EXPECT_EQ(s.splits, 8);
  EXPECT_EQ(gemm_rows_mma_shape(fp8, 5120, 8192, 64, 132).warps, 8);
  s = gemm_rows_mma_shape(fp8, 4096, 4096, 64, 132, {}, h100);  // 8 clusters of 2 x 4 blocks: one wave
  EXPECT_EQ(s.splits, 4);
  EXPECT_EQ(s.share, 2);
  cuda::GemmChoices no_waves;
  no_waves.rows_mma_waves = false;
  EXPECT_EQ(gemm_rows_mma_shape(fp8, 4096, 8192, 64, 132, no_waves, h100).splits, 8);
  // V4-Flash q_b with the indexer's wq (40960 x 1024) at 64 rows: 80 pairs of 16 steps, two waves, stay so; 8 splits of
  // 2 steps (160 clusters of 8: eleven waves) cost more in the blocks' fixed work than the steps they save (H100,
  // session 44, ncu of the V4-Flash slice b64: 111 us against 54).
  s = gemm_rows_mma_shape(fp8, 40960, 1024, 64, 132, {}, h100);
  EXPECT_EQ(s.splits, 1);
  EXPECT_EQ(s.share, 2);

  // The warpgroup form: by default (kAuto) above 32 rows, whole warpgroups on one K range only, and kWgStepPad (16)
  // bytes after each staged step.
  s = gemm_rows_mma_shape(fp8, 4096, 4096, 64, 132);
  EXPECT_TRUE(s.wg);
  EXPECT_EQ(s.smem, size_t{16} * (128 * 64 + 16));
  EXPECT_TRUE(gemm_rows_mma_shape(fp8, 4096, 4096, 33, 132).wg);
  EXPECT_FALSE(gemm_rows_mma_shape(fp8, 4096, 4096, 32, 132).wg);
  cuda::GemmChoices wgc;
  wgc.rows_mma_wgmma = cuda::KernelPick::kAlways;
  EXPECT_TRUE(gemm_rows_mma_shape(fp8, 4096, 4096, 16, 132, wgc).wg);
  wgc.rows_mma_warps = 8;
  wgc.rows_mma_kw = 4;
  EXPECT_FALSE(gemm_rows_mma_shape(fp8, 4096, 4096, 64, 132, wgc).wg);
  wgc = {};
  wgc.rows_mma_wgmma = cuda::KernelPick::kNever;
  EXPECT_FALSE(gemm_rows_mma_shape(fp8, 4096, 4096, 64, 132, wgc).wg);

  // 32 steps x 8 splits would be 256 KB: too large
  s = gemm_rows_mma_shape(fp8, 4096, 16384, 64, 132);
  EXPECT_GT(s.smem, size_t{200} * 1024);
  EXPECT_FALSE(cuda::gemm_rows_mma_takes(fp8, true, 128, 128, 4096, 16384, 64, always));
  EXPECT_TRUE(cuda::gemm_rows_mma_takes(fp8, true, 128, 128, 4096, 16384, 32, always));
  // The default rule takes what kAlways takes: up to 64 rows.
  EXPECT_TRUE(cuda::gemm_rows_mma_takes(fp8, true, 128, 128, 4096, 4096, 32, {}));
  EXPECT_TRUE(cuda::gemm_rows_mma_takes(fp8, true, 128, 128, 1024, 4096, 64, {}));
  EXPECT_TRUE(cuda::gemm_rows_mma_takes(fp8, true, 128, 128, 1024, 4096, 33, always));
  EXPECT_TRUE(cuda::gemm_rows_mma_takes(fp8, true, 128, 128, 4096, 8192, 64, always));
  EXPECT_FALSE(cuda::gemm_rows_mma_takes(fp8, true, 128, 128, 1024, 4096, 65, always));
  EXPECT_FALSE(cuda::gemm_rows_mma_takes(fp8, true, 128, 128, 4096, 4096, 8, {}));
  EXPECT_TRUE(cuda::gemm_rows_mma_takes(fp8, true, 128, 128, 4096, 4096, 9, {}));
  // f32 block scales: taken by default (GemmChoices::f32_scale_mma, on since session 32), declined with it off.
  EXPECT_TRUE(cuda::gemm_rows_mma_takes(fp8, false, 128, 128, 4096, 4096, 9, {}));
  cuda::GemmChoices f32_off;
  f32_off.f32_scale_mma = false;
  EXPECT_FALSE(cuda::gemm_rows_mma_takes(fp8, false, 128, 128, 4096, 4096, 9, f32_off));
  EXPECT_FALSE(cuda::gemm_rows_mma_takes(fp8, true, 96, 128, 4096, 4096, 9, {}));
}

// Chosen shapes (GemmChoices::rows_mma_warps / _kw / _splits): warps along K split the block's steps in even counts
// (whole 128-byte lines of a row), their partial tiles take kw times the room; a chosen split count is kept even when
// the K range then exceeds the shared memory, and the call is declined.
TEST(CudaGemmRowsMmaShape, ChosenShapes) {
  using cuda::gemm_rows_mma_shape;
  const QuantFormat fp8 = QuantFormat::kFP8Block;
  cuda::GemmChoices c;
  c.rows_mma = cuda::KernelPick::kAlways;
  c.rows_mma_warps = 8;
  c.rows_mma_kw = 4;
  c.rows_mma_splits = 8;
  auto s = gemm_rows_mma_shape(fp8, 1024, 4096, 16, 132, c);  // 64 steps: 8 a block, 2 a warp
  EXPECT_EQ(s.warps, 8);
  EXPECT_EQ(s.kw, 4);
  EXPECT_EQ(s.splits, 8);
  EXPECT_EQ(s.split_steps, 8);
  EXPECT_EQ(s.warp_steps, 2);
  EXPECT_EQ(s.smem, size_t{8} * 64 * 16 * 2);  // the staged rows: 8 steps x 64 k x 16 rows x 2 bytes
  c.rows_mma_splits = 2;
  s = gemm_rows_mma_shape(fp8, 1024, 4096 + 64 * 4, 64, 132, c);  // 68 steps: 34 a block, 9 -> 10 a warp
  EXPECT_EQ(s.split_steps, 34);
  EXPECT_EQ(s.warp_steps, 10);
  c.rows_mma_kw = 8;
  c.rows_mma_splits = 8;
  s = gemm_rows_mma_shape(fp8, 1024, 512, 64, 132, c);  // 8 steps: 1 a block; partial tiles 8 x 64 x (16 + 4) floats
  EXPECT_EQ(s.warp_steps, 2);
  EXPECT_EQ(s.smem, size_t{8} * 64 * 20 * 4);
  c.rows_mma_share = 4;  // 4 x 8 blocks would pass the cluster's 8: 2 splits
  s = gemm_rows_mma_shape(fp8, 1024, 4096, 16, 132, c);
  EXPECT_EQ(s.share, 4);
  EXPECT_EQ(s.splits, 2);
  c.rows_mma_share = 1;  // unshared even where the rule would pair
  c.rows_mma_warps = 16;
  c.rows_mma_kw = 1;
  c.rows_mma_splits = 2;
  EXPECT_EQ(gemm_rows_mma_shape(fp8, 4096, 4096, 16, 132, c).share, 1);
  c.rows_mma_share = 0;
  EXPECT_EQ(gemm_rows_mma_shape(fp8, 4096, 4096, 16, 132, c).share, 2);
  EXPECT_EQ(gemm_rows_mma_shape(fp8, 256, 4096, 16, 132, c).share, 1);  // one tile: nothing to pair with
  c.rows_mma_warps = 8;
  c.rows_mma_kw = 3;  // not a divisor of the warps: the rule's 1
  EXPECT_EQ(gemm_rows_mma_shape(fp8, 1024, 4096, 16, 132, c).kw, 1);
  c.rows_mma_kw = 1;
  c.rows_mma_splits = 1;  // 64 rows of K = 16384 in one block: 512 KB, declined rather than split
  EXPECT_GT(gemm_rows_mma_shape(fp8, 4096, 16384, 64, 132, c).smem, size_t{200} * 1024);
  EXPECT_FALSE(cuda::gemm_rows_mma_takes(fp8, true, 128, 128, 4096, 16384, 64, c));
}

}  // namespace
}  // namespace deepinfer
