// The warpgroup-MMA GEMM (ops/cuda/gemm_wgmma_cuda.cu) called directly through GemmKernelParams, on random data:
// against a CPU reference in double (the same bf16 A, the weights dequantized exactly), against the mma.sync kernel
// (run_gemm_mma) on the same inputs, its bf16x2 integer decode against its f32 decode, and the weights decoded by
// the producer, split between producer and consumers, or by the consumers (byte-identical
// outputs); all of it for both block tiles (128 rows x 256 weight rows and 256 x 128), whose outputs are compared
// byte for byte too.
// Shapes: dense with partial row / column tiles and the V4-Flash expert shape, grouped with uneven groups (empty,
// 1-63 rows, several tiles), A rows gathered through a_rows / a_row_div and C rows scattered through c_rows;
// MXFP4, FP8 128x128 and 32x32 blocks with UE8M0 scales, FP8 with f32 scales, FP8 with a scale per 32 of a row.
//
// Tolerances. Reference: both operands are exact in the kernel (bf16 A, weights exact in bf16), so only the fp32
// sums differ: |got - want| <= 1e-4 · Σ|a·w| per entry (fp32 accumulation over K <= 4096 is ~1e-6 of Σ|a·w| in
// practice; a misplaced tile, a wrong scale or a wrong code is ~1e-2 of it and more). Against gemm_mma (same products,
// other summation order, and the tensor cores' own accumulation inside a wgmma): ‖wgmma − mma‖ / ‖mma‖ <= 1e-4 and
// every entry within 1e-2 of the rms (a wrong entry is off by about the rms). The first mismatch is printed.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>

#include "cuda/cuda_gemm_problem.h"
#include "cuda/cuda_test_util.h"
#include "deepinfer/core/dtype.h"
#include "deepinfer/ops/cuda/gemm_mma.h"
#include "deepinfer/ops/cuda/gemm_wgmma.h"
#include "deepinfer/ops/cuda/kernels.h"

namespace deepinfer {
namespace {

using testing::CudaOpTest;
using testing::DeviceTensor;

// p as the wgmma kernel takes it in these comparisons: any rows a group, the tile forced, the decode as asked.
cuda::GemmKernelParams forced(const cuda::GemmKernelParams& p, cuda::WgmmaTile tile, bool exact = false,
                              cuda::WgmmaDecode decode = cuda::WgmmaDecode::kByFormat) {
  cuda::GemmKernelParams q = p;
  q.choices.wgmma = cuda::KernelPick::kAlways;
  q.choices.wgmma_tile = tile;
  q.choices.wgmma_exact = exact;
  q.choices.wgmma_decode = decode;
  return q;
}

using testing::GemmProblemTest;
using testing::Kind;
using testing::kind_name;

class CudaGemmWgmmaTest : public GemmProblemTest {
 protected:
  // Both block tiles (forced: 128 x 256, 256 x 128) through the whole comparison set, and
  // the two tiles' outputs byte for byte: every output is the same k16 wgmma products of the same bf16 operands
  // accumulated into one fp32 register in the same order (steps, then k16 slices), only the instruction's N (256 vs
  // 128) and which warpgroup holds the row differ.
  void compare(const std::string& what, const Problem& pr, bool full_reference) {
    const HostTensor wide = compare_tile(what + " [128x256]", pr, full_reference, cuda::WgmmaTile::k128x256);
    const HostTensor tall = compare_tile(what + " [256x128]", pr, full_reference, cuda::WgmmaTile::k256x128);
    expect_same_bytes((what + " 256x128 tile = 128x256 tile").c_str(), tall, wide);
    if (!pr.sizes.empty()) {
      // Mixed (grouped): pairs of 128-row blocks as 256-row tiles, a group's unpaired last block as a 128-row tile,
      // in two launches; every row written once (C is NaN-poisoned), each output as in either tile.
      const HostTensor mixed = compare_tile(what + " [mixed]", pr, full_reference, cuda::WgmmaTile::kMixed);
      expect_same_bytes((what + " mixed tiles = 128x256 tile").c_str(), mixed, wide);
    }
    // How far apart when not byte-equal (tells an accumulation-order difference, ~1e-7 of the rms, from a fault).
    double num = 0, den = 0, worst = 0;
    for (int64_t i = 0; i < pr.m * pr.n; ++i) {
      const double a = tall.data<float>()[i], b = wide.data<float>()[i];
      num += (a - b) * (a - b);
      den += b * b;
      worst = std::max(worst, std::fabs(a - b));
    }
    std::printf("[cuda-op] %-48s 256x128 vs 128x256: rel_err=%.3e, max |diff| %.3e\n", what.c_str(),
                den > 0 ? std::sqrt(num / den) : std::sqrt(num), worst);
  }

  // The whole comparison set for one problem and tile: wgmma accepted; against the reference; against gemm_mma; the
  // f32 decode (GemmChoices::wgmma_exact) gives the same bytes as the default decode; so does every decode placement.
  // Returns the default's output.
  HostTensor compare_tile(const std::string& what, const Problem& pr, bool full_reference, cuda::WgmmaTile tile) {
    const std::unique_ptr<Launch> l = prepare(pr);
    cudaStream_t s = gpu().stream();
    bool took = false;
    HostTensor wg =
        run(*l, pr, [&](const cuda::GemmKernelParams& p) { took = cuda::run_gemm_wgmma(forced(p, tile), s); });
    EXPECT_TRUE(took) << what << ": run_gemm_wgmma declined";
    if (!took) return wg;
    check_reference(what, pr, wg, full_reference);
    bool mma_took = false;
    HostTensor mma = run(*l, pr, [&](const cuda::GemmKernelParams& p) { mma_took = cuda::run_gemm_mma(p, s); });
    EXPECT_TRUE(mma_took) << what << ": run_gemm_mma declined";
    check_against(what, pr, wg, mma, 1e-4);
    HostTensor exact = run(*l, pr, [&](const cuda::GemmKernelParams& p) {
      ASSERT_TRUE(cuda::run_gemm_wgmma(forced(p, tile, /*exact=*/true), s));
    });
    check_against(what + " f32 decode", pr, exact, mma, 1e-4);  // tells a decode fault from one elsewhere
    expect_same_bytes((what + " exact decode").c_str(), exact, wg);
    // Where the weights are decoded (the producer, split with the consumers, the consumers): the same bf16 weights
    // and products, so the same bytes as the default (split for MXFP4, the producer for FP8).
    if (e8m0(pr.kind)) {
      // Staged (MXFP4 with K % 128 == 0; otherwise it runs the producer's register loads): the same decode from codes
      // copied into shared memory first.
      const std::pair<cuda::WgmmaDecode, const char*> placements[] = {
          {cuda::WgmmaDecode::kProducer, "producer"},
          {cuda::WgmmaDecode::kSplit, "split"},
          {cuda::WgmmaDecode::kConsumers, "consumers"},
          {cuda::WgmmaDecode::kProducerStaged, "producer staged"}};
      for (const auto& [dec, name] : placements) {
        HostTensor placed = run(*l, pr, [&](const cuda::GemmKernelParams& p) {
          ASSERT_TRUE(cuda::run_gemm_wgmma(forced(p, tile, false, dec), s));
        });
        check_against(what + " " + name, pr, placed, mma, 1e-4);
        expect_same_bytes((what + " " + name + " = default").c_str(), placed, wg);
      }
    }
    return wg;
  }
};

// Dense, partial tiles everywhere: 2100 rows (16 full 128-row tiles + 52), 1000 columns (3 full 256-column tiles +
// 232), K = 384 (6 steps, more than the 4 stages). 33 x 4 of gemm_mma's tiles: enough for gemm_mma_dense_fills, so
// both kernels take it. Full reference.
TEST_F(CudaGemmWgmmaTest, DensePartialTilesMatchReferenceAndMma) {
  for (Kind kind : {Kind::kMxfp4, Kind::kFp8E8m0_128}) {
    const Problem pr = dense(kind, 2100, 1000, 384);
    compare(std::string("dense 2100x1000x384 ") + kind_name(kind), pr, true);
  }
}

// The V4-Flash down projection shape as one dense GEMM (M = 8192, N = 4096, K = 2048: 64 x 16 tiles, 32 steps),
// MXFP4 and FP8; reference on sampled rows and columns (every column of 10 rows, every row of 8 columns).
TEST_F(CudaGemmWgmmaTest, DenseLargeMatchesReferenceAndMma) {
  for (Kind kind : {Kind::kMxfp4, Kind::kFp8E8m0_128}) {
    const Problem pr = dense(kind, 8192, 4096, 2048);
    compare(std::string("dense 8192x4096x2048 ") + kind_name(kind), pr, false);
  }
}

// Grouped like the MoE experts: 14 groups of 0 (first, middle and last), 1, 2, 17, 37, 63, 64, 65, 127, 128, 129 and
// 300 rows (the 128-row tiles span two of the plan's 64-row tiles: odd plan tiles exit, partial tiles are masked);
// A rows gathered through a_rows / 6 (top-6 slots), C rows a permutation. N = 640 (a partial column tile), K = 640.
TEST_F(CudaGemmWgmmaTest, GroupedUnevenGroupsMatchReferenceAndMma) {
  const std::vector<int64_t> sizes = {0, 1, 2, 17, 37, 63, 0, 64, 65, 127, 128, 129, 300, 0};
  for (Kind kind : {Kind::kMxfp4, Kind::kFp8E8m0_128, Kind::kFp8E8m0_32}) {
    const Problem pr = grouped(kind, sizes, 640, 640, 6);
    compare(std::string("grouped uneven ") + kind_name(kind), pr, true);
  }
}

// Prefill-sized groups around both tiles' edges: 1, 63, 64, 65, 127, 128, 129, 200, 256, 257 and 511 rows (256-row
// tiles span four of the plan's 64-row tiles: three of four plan tiles exit; 257 and 511 rows take two 256-row
// tiles, the second with 1 / 255 rows), an empty group; N = 704 (5.5 x 128: a partial column tile for both tiles),
// K = 512 (8 steps). MXFP4, FP8 128x128 and 32x32 blocks. K must be a multiple of 64 (run_gemm_wgmma declines
// others: RunGemmDispatchAndAbSwitch), so there is no partial K step to test.
TEST_F(CudaGemmWgmmaTest, GroupedPrefillGroupsBothTiles) {
  const std::vector<int64_t> sizes = {1, 63, 64, 65, 127, 128, 129, 0, 200, 256, 257, 511};
  for (Kind kind : {Kind::kMxfp4, Kind::kFp8E8m0_128, Kind::kFp8E8m0_32}) {
    const Problem pr = grouped(kind, sizes, 704, 512, 6);
    compare(std::string("grouped prefill ") + kind_name(kind), pr, true);
  }
}

// Many groups, as the MoE layers have them: 384 groups of ~128 rows (V4.1's experts at 8192 tokens: 0-260 rows, some
// empty) and 1100 groups of 0-40 rows with a few of 300. The 256 x 128 tile finds its group by a warp scan over
// ceil(groups / 32) groups a lane (12 and 35 here: the second scans the owner lane's groups in two passes of 32);
// a missed or repeated tile shows as NaN-poisoned or wrong rows against the reference and the 128 x 256 tile. N =
// 192, K = 128; reference on sampled rows and columns.
TEST_F(CudaGemmWgmmaTest, GroupedManyGroupsBothTiles) {
  std::uniform_int_distribution<int64_t> around128(0, 260), small(0, 40);
  std::vector<int64_t> v41(384), many(1100);
  for (auto& x : v41) x = around128(rng()) < 20 ? 0 : around128(rng());
  for (size_t i = 0; i < many.size(); ++i) many[i] = i % 97 == 5 ? 300 : small(rng());
  for (Kind kind : {Kind::kMxfp4, Kind::kFp8E8m0_128}) {
    compare(std::string("grouped 384 groups ") + kind_name(kind), grouped(kind, v41, 192, 128, 6), false);
    compare(std::string("grouped 1100 groups ") + kind_name(kind), grouped(kind, many, 192, 128, 6), false);
  }
}

// Dense with 1000 rows (three full 256-row tiles + 232; seven 128-row tiles + 104) and N = 704, K = 512: the
// shared expert's case for both tiles. Full reference.
TEST_F(CudaGemmWgmmaTest, DensePrefillBothTiles) {
  for (Kind kind : {Kind::kMxfp4, Kind::kFp8E8m0_128}) {
    // 44 x 3 gemm_mma tiles of 64 x 256 >= 128: gemm_mma_dense_fills, so wgmma takes the call (1500 rows did not).
    ASSERT_TRUE(cuda::gemm_mma_dense_fills(2800, 704));
    const Problem pr = dense(kind, 2800, 704, 512);
    compare(std::string("dense 2800x704x512 ") + kind_name(kind), pr, true);
  }
}

// FP8 with f32 block scales (V3 checkpoints: the kernel decodes through f32 like gemm_mma) and FP8 with a UE8M0 scale
// per 32 of a row; grouped, N = 320, K = 1024 (16 steps).
TEST_F(CudaGemmWgmmaTest, Fp8F32ScalesAndRow32MatchReferenceAndMma) {
  const std::vector<int64_t> sizes = {5, 0, 70, 200, 33};
  for (Kind kind : {Kind::kFp8F32_128, Kind::kFp8Row32}) {
    const Problem pr = grouped(kind, sizes, 320, 1024, 4);
    compare(std::string("grouped ") + kind_name(kind), pr, true);
  }
}

// Few K steps: K = 64 (one step: no pipelining), 192 and 320 (3 and 5 steps: odd counts end on the producer's
// unpaired step; fewer or about as many steps as stages), MXFP4 and FP8, grouped with a partial column tile (N = 320).
TEST_F(CudaGemmWgmmaTest, ShortAndOddStepCountsMatchReferenceAndMma) {
  for (Kind kind : {Kind::kMxfp4, Kind::kFp8E8m0_128})
    for (int64_t k : {64, 192, 320}) {
      const Problem pr = grouped(kind, {70, 3, 130, 0, 64}, 320, k, 3);
      compare(std::string("grouped K=") + std::to_string(k) + " " + kind_name(kind), pr, true);
    }
}

// run_gemm's dispatch: by default a grouped block-format GEMM of many rows per group takes the wgmma kernel (the
// same bytes as calling it), GemmChoices::wgmma kNever takes gemm_mma (the same bytes as calling that); K not a
// multiple of 64, a float weight and a batch-invariant call are declined.
TEST_F(CudaGemmWgmmaTest, RunGemmDispatchAndChoice) {
  const Problem pr = grouped(Kind::kMxfp4, {90, 0, 150, 40}, 512, 512, 2);
  const std::unique_ptr<Launch> l = prepare(pr);
  cudaStream_t s = gpu().stream();
  HostTensor wg, mma, via_default, via_off;
  wg = run(*l, pr, [&](const cuda::GemmKernelParams& p) { ASSERT_TRUE(cuda::run_gemm_wgmma(p, s)); });
  via_default = run(*l, pr, [&](const cuda::GemmKernelParams& p) { cuda::run_gemm(p, s); });
  mma = run(*l, pr, [&](const cuda::GemmKernelParams& p) { ASSERT_TRUE(cuda::run_gemm_mma(p, s)); });
  {
    cuda::GemmKernelParams off = l->p;
    off.choices.wgmma = cuda::KernelPick::kNever;
    EXPECT_FALSE(cuda::run_gemm_wgmma(off, s));
    via_off = run(*l, pr, [&](const cuda::GemmKernelParams& p) {
      cuda::GemmKernelParams q = p;
      q.choices.wgmma = cuda::KernelPick::kNever;
      cuda::run_gemm(q, s);
    });
  }
  expect_same_bytes("run_gemm default = wgmma", via_default, wg);
  {
    // Many rows per group: run_gemm takes the mixed tiles, the same bytes as the 128 x 256 one.
    HostTensor via_run = run(*l, pr, [&](const cuda::GemmKernelParams& p) {
      cuda::GemmKernelParams r = p;
      r.rows_hint = 192;
      EXPECT_EQ(cuda::wgmma_tile(r), cuda::WgmmaTile::kMixed);
      cuda::run_gemm(r, s);
    });
    expect_same_bytes("run_gemm 192 rows a group (mixed) = wgmma 128x256", via_run, wg);
  }
  expect_same_bytes("run_gemm wgmma kNever = mma", via_off, mma);
  cuda::GemmKernelParams q = l->p;
  q.rows_hint = cuda::kGemmWgmmaMinRows - 1;
  EXPECT_FALSE(cuda::run_gemm_wgmma(q, s)) << "few rows per group";
  q = l->p;
  q.k = 96;
  EXPECT_FALSE(cuda::run_gemm_wgmma(q, s)) << "K % 64 != 0";
  q = l->p;
  q.batch_invariant = true;
  EXPECT_FALSE(cuda::run_gemm_wgmma(q, s)) << "batch-invariant";
  q = l->p;
  q.a_bf16 = nullptr;
  EXPECT_FALSE(cuda::run_gemm_wgmma(q, s)) << "no bf16 A";
}

// Dense calls short of the device fill (decode batches of the projections) split K over more blocks: each split's
// partial product into p.split_part, summed in split order into C. Every UE8M0 kind at 9 / 64 / 200 rows (one and two
// row tiles) against the double reference in full, the same bytes on a second run and through run_gemm, C with a row
// stride wider than N (the shared expert's gate | up halves) the same bytes with the rest of the row untouched; no
// split without splits asked or without the scratch, unless wgmma_split_k = always (opt-in), or with f32 scales.
TEST_F(CudaGemmWgmmaTest, DenseKSplitsMatchReference) {
  cudaStream_t s = gpu().stream();
  const int sms = gpu().device_info().sm_count;
  const int64_t n = 1000, k = 2048;
  for (Kind kind : {Kind::kMxfp4, Kind::kFp8E8m0_128, Kind::kFp8E8m0_32, Kind::kFp8Row32, Kind::kFp8F32_128})
    for (int64_t m : {9, 64, 200}) {
      const Problem pr = dense(kind, m, n, k);
      const std::unique_ptr<Launch> l = prepare(pr);
      EXPECT_EQ(cuda::gemm_wgmma_k_splits(l->p, sms), 1) << "split-K is opt-in";
      l->p.choices.wgmma_split_k = cuda::KernelPick::kAlways;
      const std::string what = std::string("dense split-K ") + kind_name(kind) + " M=" + std::to_string(m);
      const int splits = cuda::gemm_wgmma_k_splits(l->p, sms);
      if (kind == Kind::kFp8F32_128) {
        EXPECT_EQ(splits, 1) << what << ": f32 scales decode exactly, unsplit";
        continue;
      }
      ASSERT_GT(splits, 1) << what;
      ASSERT_EQ(splits, cuda::wgmma_dense_splits(m, n, k, sms)) << what;
      EXPECT_FALSE(cuda::run_gemm_wgmma(l->p, s)) << what << ": no splits asked";
      l->p.k_splits = splits;
      EXPECT_FALSE(cuda::run_gemm_wgmma(l->p, s)) << what << ": no partials scratch";
      DeviceTensor part = poisoned({splits * m * n});
      l->p.split_part = static_cast<float*>(part.data());
      {
        cuda::GemmKernelParams never = l->p;
        never.choices.wgmma_split_k = cuda::KernelPick::kNever;
        EXPECT_EQ(cuda::gemm_wgmma_k_splits(never, sms), 1) << what;
        EXPECT_FALSE(cuda::run_gemm_wgmma(never, s)) << what << ": wgmma_split_k = never";
      }
      const HostTensor got =
          run(*l, pr, [&](const cuda::GemmKernelParams& p) { ASSERT_TRUE(cuda::run_gemm_wgmma(p, s)); });
      check_reference(what, pr, got, /*full=*/true);
      const HostTensor again = run(*l, pr, [&](const cuda::GemmKernelParams& p) { cuda::run_gemm_wgmma(p, s); });
      expect_same_bytes((what + " repeated").c_str(), again, got);
      // (run_gemm sends dense calls of 9-64 rows to the rows kernel first: gemm_rows_mma.h.)
      const HostTensor via = run(*l, pr, [&](const cuda::GemmKernelParams& p) {
        cuda::GemmKernelParams q = p;
        q.choices.rows_mma = cuda::KernelPick::kNever;
        cuda::run_gemm(q, s);
      });
      expect_same_bytes((what + " run_gemm = run_gemm_wgmma").c_str(), via, got);
      expect_wide_c_same(what, *l, pr, got,
                         [&](const cuda::GemmKernelParams& q) { return cuda::run_gemm_wgmma(q, s); });
    }
}

// The split count (host only): one wave of blocks, at least 4 k-steps a split, at most 16 splits, none once the
// tiles fill the device or when fewer than two splits would do.
TEST(CudaGemmWgmmaSplits, CountBySmsTilesAndSteps) {
  EXPECT_EQ(cuda::wgmma_dense_splits(16, 4096, 4096, 132), 8);    // 16 tiles: 132 / 16
  EXPECT_EQ(cuda::wgmma_dense_splits(128, 4096, 4096, 132), 8);   // still one row tile
  EXPECT_EQ(cuda::wgmma_dense_splits(129, 4096, 4096, 132), 4);   // two row tiles: 32 tiles
  EXPECT_EQ(cuda::wgmma_dense_splits(16, 1024, 4096, 132), 16);   // 4 tiles: capped at 16
  EXPECT_EQ(cuda::wgmma_dense_splits(16, 1024, 1024, 132), 4);    // 16 k-steps: 4 a split
  EXPECT_EQ(cuda::wgmma_dense_splits(16, 1024, 448, 132), 1);     // 7 k-steps: no two splits of 4
  EXPECT_EQ(cuda::wgmma_dense_splits(16, 32768, 4096, 132), 1);   // 128 tiles: 132 / 128 = 1
  EXPECT_EQ(cuda::wgmma_dense_splits(256, 32768, 4096, 132), 1);  // a wave and more
  EXPECT_EQ(cuda::wgmma_dense_splits(0, 4096, 4096, 132), 1);
}

// The tile choice (host only, no device needed): grouped calls mixed from kGemmWgmmaMixedRows rows a group (rows_hint),
// else 128 x 256; dense calls 128 x 256; GemmChoices::wgmma_tile forcing one (mixed: grouped only).
TEST(CudaGemmWgmmaTile, ChoiceByRowsAndOverride) {
  using cuda::WgmmaTile;
  const auto with_tile = [](cuda::GemmKernelParams q, WgmmaTile t) {
    q.choices.wgmma_tile = t;
    return q;
  };
  cuda::GemmKernelParams p;
  const int32_t offsets[2] = {0, 0};  // never read: only its presence marks a grouped call
  p.group_offsets = offsets;
  p.m = 100000;
  p.rows_hint = cuda::kGemmWgmmaMixedRows - 1;
  EXPECT_EQ(cuda::wgmma_tile(p), WgmmaTile::k128x256);
  p.rows_hint = cuda::kGemmWgmmaMixedRows;
  EXPECT_EQ(cuda::wgmma_tile(p), WgmmaTile::kMixed);
  p.rows_hint = 128;  // V4.1 at 8192 tokens
  EXPECT_EQ(cuda::wgmma_tile(p), WgmmaTile::kMixed);
  p.rows_hint = 192;  // V4-Flash at 8192 tokens
  EXPECT_EQ(cuda::wgmma_tile(p), WgmmaTile::kMixed);
  EXPECT_EQ(cuda::wgmma_tile(with_tile(p, WgmmaTile::k128x256)), WgmmaTile::k128x256);
  p.rows_hint = 8;
  EXPECT_EQ(cuda::wgmma_tile(with_tile(p, WgmmaTile::k256x128)), WgmmaTile::k256x128);
  EXPECT_EQ(cuda::wgmma_tile(with_tile(p, WgmmaTile::kMixed)), WgmmaTile::kMixed);
  EXPECT_EQ(cuda::wgmma_tile(p), WgmmaTile::k128x256);
  cuda::GemmKernelParams d;  // dense calls: 128 x 256 unless FP8 blocks of many rows or the choice asks otherwise
  d.format = QuantFormat::kMXFP4;
  d.m = 8192;
  d.n = 2048;
  EXPECT_EQ(cuda::wgmma_tile(d), WgmmaTile::k128x256);
  EXPECT_EQ(cuda::wgmma_tile(with_tile(d, WgmmaTile::kMixed)), WgmmaTile::k128x256);
  EXPECT_EQ(cuda::wgmma_tile(with_tile(d, WgmmaTile::k256x128)), WgmmaTile::k256x128);
  d.format = QuantFormat::kFP8Block;  // the V4-Flash shared expert at 8192 rows
  EXPECT_EQ(cuda::wgmma_tile(d), WgmmaTile::k256x128);
  EXPECT_EQ(cuda::wgmma_tile(with_tile(d, WgmmaTile::k128x256)), WgmmaTile::k128x256);
  EXPECT_EQ(cuda::wgmma_tile(with_tile(d, WgmmaTile::kMixed)), WgmmaTile::k128x256);
  d.m = cuda::kGemmWgmmaDenseTallRows;
  EXPECT_EQ(cuda::wgmma_tile(d), WgmmaTile::k256x128);
  d.m = cuda::kGemmWgmmaDenseTallRows - 1;
  EXPECT_EQ(cuda::wgmma_tile(d), WgmmaTile::k128x256);
  d.m = 2048;
  d.n = 256;  // short of the device fill: the split K path's 128 x 256
  EXPECT_EQ(cuda::wgmma_tile(d), WgmmaTile::k128x256);
}

}  // namespace
}  // namespace deepinfer
