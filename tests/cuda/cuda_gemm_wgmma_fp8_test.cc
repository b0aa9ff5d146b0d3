// The FP8 expert GEMM (ops/cuda/gemm_wgmma_fp8_cuda.cu) and its fold kernel, called directly on random data: A as
// MXFP8 (the problem's bf16 rows quantized as the CPU quantizes them), MXFP4 weights folded into e4m3. Against the
// double reference of the same values (A's MXFP8 values are exact in bf16, so GemmProblemTest's reference and the
// bf16 wgmma kernel take them as a bf16 A), and against the bf16 wgmma kernel on that A (the same products).
//
// Tolerance: the e4m3 products are exact; the tensor core sums a k32 block's 32 of them with fewer bits than fp32
// (CudaOpTest.WgmmaE4m3TileMatchesExactSums prints how many); each block is then added in fp32. 1e-3 · Σ|a·w| per
// entry (2^-10; a wrong code, scale, fold or row is ~1e-2 of it and more); against the bf16 kernel ‖fp8 − bf16‖ /
// ‖bf16‖ <= 1e-3 and every entry within 1e-2 of the rms. The worst error is printed.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "cuda/cuda_gemm_problem.h"
#include "cuda/cuda_test_util.h"
#include "deepinfer/core/dtype.h"
#include "deepinfer/ops/cpu/cpu_backend.h"
#include "deepinfer/ops/cuda/fp8_codes.cuh"
#include "deepinfer/ops/cuda/gemm_mma.h"
#include "deepinfer/ops/cuda/gemm_wgmma.h"
#include "deepinfer/ops/cuda/gemm_wgmma_fp8.h"
#include "deepinfer/ops/cuda/kernels.h"

namespace deepinfer {
namespace {

using testing::DeviceTensor;
using testing::GemmProblemTest;
using testing::Kind;

constexpr double kFp8Tol = 1e-3;
// The per-128 form's operands are full-range e4m3 codes on both sides (3 mantissa bits each, products up to 448^2),
// and the tensor core sums a k32 group's products (and adds them to the accumulator) aligned to the largest with a
// limited number of bits kept (DeepSeek-V3's report, §3.3.2: "around 14 bits" on Hopper): the worst entries sit at
// 0.8-1.1e-3 of sum|a·w| (H100, session 36: 7 of 60000 entries past 1e-3 in one seed), against ~3e-5 for MXFP4 weights,
// whose e2m1 codes leave few significant bits in a product. A wrong scale or row is off by O(1).
constexpr double kFp8Block128Tol = 2e-3;

class CudaGemmWgmmaFp8Test : public GemmProblemTest {
 protected:
  // The device state of an FP8 launch: A's codes and scales, the weights' pointer tables and folds.
  struct Fp8 {
    DeviceTensor codes, scales, code_table, scale_table, folds, misfits;
    HostTensor host_folds;
    unsigned misfit_rows = 0;
  };

  // pr's A quantized to MXFP8 (codes, scales into f), and then replaced by those values in bf16 (exact): the problem
  // the reference and the bf16 kernel see.
  void quantize(Problem& pr, Fp8& f) {
    std::vector<float> a(pr.a.size());
    for (size_t i = 0; i < a.size(); ++i) a[i] = bf16_to_f32(pr.a[i]);
    HostTensor codes(DType::kU8, {pr.a_total, pr.k}), scales(DType::kU8, {pr.a_total, pr.k / 32});
    mxfp8_quantize_rows(a.data(), pr.a_total, pr.k, codes.data<uint8_t>(), scales.data<uint8_t>());
    for (int64_t r = 0; r < pr.a_total; ++r)
      for (int64_t j = 0; j < pr.k; ++j) {
        const float v = std::ldexp(e4m3_to_f32(codes.data<uint8_t>()[r * pr.k + j]),
                                   scales.data<uint8_t>()[r * (pr.k / 32) + j / 32] - 127);
        pr.a[r * pr.k + j] = f32_to_bf16(v);
        EXPECT_EQ(bf16_to_f32(pr.a[r * pr.k + j]), v) << "MXFP8 value not exact in bf16";
      }
    f.codes = up(codes);
    f.scales = up(scales);
  }

  // pr's A quantized per 128 values (the V3 family's --activation-quant fp8: e4m3 codes, an f32 scale a block,
  // [a_total, k / 128] row-major). With power-of-two scales the values are exact in bf16 and replace pr.a (the
  // reference's A); with f32 scales pr.a keeps the unrounded rows (no reference: the caller compares kernels).
  void quantize128(Problem& pr, Fp8& f, bool ue8m0) {
    std::vector<float> a(pr.a.size());
    for (size_t i = 0; i < a.size(); ++i) a[i] = bf16_to_f32(pr.a[i]);
    HostTensor codes(DType::kU8, {pr.a_total, pr.k}), scales(DType::kF32, {pr.a_total, pr.k / 128});
    fp8_block128_quantize_rows(a.data(), pr.a_total, pr.k, ue8m0, codes.data<uint8_t>(), scales.data<float>(),
                               pr.k / 128, 1);
    if (ue8m0)
      for (int64_t r = 0; r < pr.a_total; ++r)
        for (int64_t j = 0; j < pr.k; ++j) {
          const float v =
              e4m3_to_f32(codes.data<uint8_t>()[r * pr.k + j]) * scales.data<float>()[r * (pr.k / 128) + j / 128];
          pr.a[r * pr.k + j] = f32_to_bf16(v);
          EXPECT_EQ(bf16_to_f32(pr.a[r * pr.k + j]), v) << "a power-of-two scaled e4m3 value not exact in bf16";
        }
    f.codes = up(codes);
    f.scales = up(scales);
  }

  // The weights' folds by the device kernel, checked against fp8::fold_row row by row.
  void fold(const Problem& pr, Fp8& f) {
    const int groups = static_cast<int>(pr.w.size());
    HostTensor ct(DType::kI64, {groups}), st(DType::kI64, {groups});
    for (int g = 0; g < groups; ++g) {
      ct.data<int64_t>()[g] = reinterpret_cast<int64_t>(pr.w[g].dcodes.data());
      st.data<int64_t>()[g] = reinterpret_cast<int64_t>(pr.w[g].dscales.data());
    }
    f.code_table = up(ct);
    f.scale_table = up(st);
    f.folds = poisoned_bytes(DType::kU8, {groups, pr.n});
    HostTensor zero(DType::kI32, {1});
    zero.data<int32_t>()[0] = 0;
    f.misfits = up(zero);
    cuda::Mxfp4FoldKernelParams fp;
    fp.codes = static_cast<const void* const*>(f.code_table.data());
    fp.scales = static_cast<const void* const*>(f.scale_table.data());
    fp.groups = groups;
    fp.n = pr.n;
    fp.k = pr.k;
    fp.refs = static_cast<uint8_t*>(f.folds.data());
    fp.misfits = static_cast<unsigned*>(f.misfits.data());
    cuda::run_mxfp4_fold(fp, gpu().stream());
    f.host_folds = down(f.folds);
    f.misfit_rows = static_cast<unsigned>(down(f.misfits).data<int32_t>()[0]);
    unsigned want_misfits = 0;
    int64_t wrong = 0;
    for (int g = 0; g < groups; ++g)
      for (int64_t r = 0; r < pr.n; ++r) {
        const cuda::fp8::FoldRow want = cuda::fp8::fold_row(pr.w[g].scales.data<uint8_t>() + r * (pr.k / 32),
                                                            pr.w[g].codes.data<uint8_t>() + r * (pr.k / 2), pr.k / 32);
        want_misfits += want.fits ? 0 : 1;
        wrong += f.host_folds.data<uint8_t>()[g * pr.n + r] != want.e;
      }
    EXPECT_EQ(wrong, 0) << "fold exponents differ from fp8::fold_row";
    EXPECT_EQ(f.misfit_rows, want_misfits);
  }

  // The FP8 launch params of q (the bf16 problem's) with A's codes and the folds.
  static cuda::GemmKernelParams fp8_params(const cuda::GemmKernelParams& q, const Fp8& f) {
    cuda::GemmKernelParams p = q;
    p.choices.wgmma_fp8 = cuda::KernelPick::kAlways;
    p.a_e4m3 = static_cast<const uint8_t*>(f.codes.data());
    p.a_scale = static_cast<const uint8_t*>(f.scales.data());
    p.b_fold = static_cast<const uint8_t*>(f.folds.data());  // null for FP8 weights (no fold)
    return p;
  }

  // The FP8 kernel on pr against the reference (full: every entry) and against the bf16 wgmma kernel.
  void compare(const std::string& what, Problem q, bool full) {
    Fp8 f;
    quantize(q, f);
    if (q.kind == Kind::kMxfp4) {
      fold(q, f);
      ASSERT_EQ(f.misfit_rows, 0u) << what << ": the random weights fold exactly";
    }
    const std::unique_ptr<Launch> l = prepare(q);
    cudaStream_t s = gpu().stream();
    bool took = false;
    const HostTensor got =
        run(*l, q, [&](const cuda::GemmKernelParams& p) { took = cuda::run_gemm_wgmma_fp8(fp8_params(p, f), s); });
    ASSERT_TRUE(took) << what << ": run_gemm_wgmma_fp8 declined";
    check_reference(what + " [fp8]", q, got, full, kFp8Tol);
    // The bf16 kernel takes grouped calls and dense ones whose tiles fill the device (a smaller dense call only
    // split along K, which these launches do not ask for): there the reference alone checks the FP8 kernel.
    if (!q.sizes.empty() || cuda::gemm_mma_dense_fills(q.m, q.n)) {
      bool bf16_took = false;
      const HostTensor bf16 = run(*l, q, [&](const cuda::GemmKernelParams& p) {
        cuda::GemmKernelParams b = p;
        b.choices.wgmma = cuda::KernelPick::kAlways;
        bf16_took = cuda::run_gemm_wgmma(b, s);
      });
      ASSERT_TRUE(bf16_took) << what << ": run_gemm_wgmma declined";
      check_against(what + " [fp8 vs bf16 wgmma]", q, got, bf16, kFp8Tol);
    }
    // Launch to launch the same bytes (a fixed order of sums).
    const HostTensor again = run(
        *l, q, [&](const cuda::GemmKernelParams& p) { ASSERT_TRUE(cuda::run_gemm_wgmma_fp8(fp8_params(p, f), s)); });
    expect_same_bytes((what + " fp8 run twice").c_str(), again, got);
  }
};

// Dense, partial tiles: 300 rows (2 x 128 + 44), 200 columns (128 + 72), K = 384 (3 steps, fewer than the stages),
// and 2100 x 1000 x 1024 (8 steps: the stage ring wraps). Full reference for the first, sampled for the second.
TEST_F(CudaGemmWgmmaFp8Test, DensePartialTilesMatchReferenceAndBf16Kernel) {
  compare("fp8 dense 300x200x384", dense(Kind::kMxfp4, 300, 200, 384), true);
  compare("fp8 dense 2100x1000x1024", dense(Kind::kMxfp4, 2100, 1000, 1024), false);
}

// Grouped like the MoE experts: empty groups first, in the middle and last, 1-300 rows (partial and several 128-row
// tiles, odd plan tiles exiting), A rows gathered through a_rows / 6, C rows a permutation; N = 640, K = 896 (7 steps).
TEST_F(CudaGemmWgmmaFp8Test, GroupedUnevenGroupsMatchReferenceAndBf16Kernel) {
  compare("fp8 grouped 12 groups N=640 K=896",
          grouped(Kind::kMxfp4, {0, 1, 17, 64, 65, 0, 127, 128, 129, 300, 40, 0}, 640, 896, 6), true);
}

// The V4-Flash expert shapes as grouped calls of ~192 rows an expert (gate/up: N = 2048, K = 4096; down: N = 4096,
// K = 2048), 8 experts; sampled reference.
TEST_F(CudaGemmWgmmaFp8Test, V4FlashExpertShapesMatchReference) {
  compare("fp8 grouped gate V4-Flash", grouped(Kind::kMxfp4, {192, 180, 205, 192, 160, 230, 192, 187}, 2048, 4096, 6),
          false);
  compare("fp8 grouped down V4-Flash", grouped(Kind::kMxfp4, {192, 180, 205, 192, 160, 230, 192, 187}, 4096, 2048, 6),
          false);
}

// The per-128 form (--activation-quant fp8 over the V3 family's FP8 weights with f32 block scales) in both tiles: 128 x
// 128 and the wide 128 x 256 (GemmChoices::wgmma_fp8_wide 1, and 2: persistent blocks walking the tiles). With
// power-of-two activation scales A is exact in bf16: each tile against the double reference (kFp8Tol, as above: the
// tensor core's k32 sums), in full for the smaller problems. With f32 activation scales (no bf16 reference) the wide
// tile against the 128 x 128 one: the same products summed in the same order per entry (four k32 products chained
// in the tensor core, then promoted once), so within 1e-6 of the rms; the count of entries that differ in any bit is
// printed. The wide tile's persistent and per-tile launches: the same bytes (the same tiles, order by tile).
class CudaGemmWgmmaFp8Block128Test : public CudaGemmWgmmaFp8Test {
 protected:
  HostTensor run128(Launch& l, const Problem& q, const Fp8& f, int wide) {
    bool took = false;
    HostTensor got = run(l, q, [&](const cuda::GemmKernelParams& p) {
      cuda::GemmKernelParams g = fp8_params(p, f);
      g.b_fold = nullptr;
      g.a_scale_block128 = true;
      g.choices.wgmma_fp8_wide = wide;
      took = cuda::run_gemm_wgmma_fp8(g, gpu().stream());
    });
    EXPECT_TRUE(took) << "run_gemm_wgmma_fp8 declined a per-128 call (wide " << wide << ")";
    return got;
  }

  void compare128(const std::string& what, Problem pr, bool full) {
    const std::vector<uint16_t> a = pr.a;
    for (const bool ue8m0 : {true, false}) {
      pr.a = a;
      Fp8 f;
      quantize128(pr, f, ue8m0);
      const std::unique_ptr<Launch> l = prepare(pr);
      const HostTensor narrow = run128(*l, pr, f, 0), wide = run128(*l, pr, f, 1), persistent = run128(*l, pr, f, 2);
      const std::string tag = what + (ue8m0 ? " [ue8m0 act scales]" : " [f32 act scales]");
      if (ue8m0) {
        check_reference(tag + " 128x128", pr, narrow, full, kFp8Block128Tol);
        check_reference(tag + " 128x256", pr, wide, full, kFp8Block128Tol);
      }
      check_against(tag + " 128x256 vs 128x128", pr, wide, narrow, 1e-6);
      int64_t differ = 0;
      for (int64_t i = 0; i < pr.m * pr.n; ++i)
        differ += std::memcmp(wide.data<float>() + i, narrow.data<float>() + i, sizeof(float)) != 0;
      std::printf("%s: 128x256 and 128x128 differ in %lld of %lld entries\n", tag.c_str(),
                  static_cast<long long>(differ), static_cast<long long>(pr.m * pr.n));
      expect_same_bytes((tag + " persistent vs per-tile").c_str(), persistent, wide);
      expect_same_bytes((tag + " run twice").c_str(), run128(*l, pr, f, 1), wide);
    }
  }
};

// Dense with partial tiles: N = 200 (the wide tile's second half partial, its block row the second), N = 1000
// (3 x 256 + 232), M = 300 / 2100, K = 384 (fewer steps than stages) / 1024.
TEST_F(CudaGemmWgmmaFp8Block128Test, DensePartialTilesMatchReference) {
  compare128("fp8-128 dense 300x200x384", dense(Kind::kFp8F32_128, 300, 200, 384), true);
  compare128("fp8-128 dense 2100x1000x1024", dense(Kind::kFp8F32_128, 2100, 1000, 1024), false);
}

// Grouped with empty groups, 1-300 rows, gathered A rows and scattered C rows; N = 640: the last wide tile's second
// half wholly past N (its weight block row clamped).
TEST_F(CudaGemmWgmmaFp8Block128Test, GroupedUnevenGroupsMatchReference) {
  compare128("fp8-128 grouped 12 groups N=640 K=896",
             grouped(Kind::kFp8F32_128, {0, 1, 17, 64, 65, 0, 127, 128, 129, 300, 40, 0}, 640, 896, 6), true);
}

// DeepSeek-V3's expert shapes (gate / up: N = 2048, K = 7168; down: N = 7168, K = 2048), 4 experts of ~192 rows;
// sampled reference.
TEST_F(CudaGemmWgmmaFp8Block128Test, V3ExpertShapesMatchReference) {
  compare128("fp8-128 grouped gate V3", grouped(Kind::kFp8F32_128, {192, 180, 205, 230}, 2048, 7168, 8), false);
  compare128("fp8-128 grouped down V3", grouped(Kind::kFp8F32_128, {192, 180, 205, 230}, 7168, 2048, 8), false);
}

// FP8-block weights (128 x 128 UE8M0 blocks: the dense projections), their codes copied into the B tile as they are
// and each block's scale joining the promotion: dense with partial tiles (N = 200: the second column tile takes the
// second block row) and grouped with gathered / scattered rows.
TEST_F(CudaGemmWgmmaFp8Test, Fp8BlockWeightsMatchReferenceAndBf16Kernel) {
  compare("fp8 weights dense 300x200x384", dense(Kind::kFp8E8m0_128, 300, 200, 384), true);
  compare("fp8 weights dense 2100x1000x1024", dense(Kind::kFp8E8m0_128, 2100, 1000, 1024), false);
  compare("fp8 weights grouped N=640 K=896",
          grouped(Kind::kFp8E8m0_128, {0, 1, 17, 64, 65, 0, 127, 128, 129, 300, 40, 0}, 640, 896, 6), true);
}

// Weights whose all-zero blocks carry scales far outside a row's span (UE8M0 0 and 254: any shift gives zeros) fold
// exactly and multiply right; rows with a nonzero block 15 binades below the row's largest scale are counted as misfits
// (the backend then keeps the bf16 kernel for the matrix).
TEST_F(CudaGemmWgmmaFp8Test, ZeroBlocksFoldAndWideRowsAreCounted) {
  Problem pr = dense(Kind::kMxfp4, 260, 192, 512);
  auto& w = pr.w[0];
  const int64_t blocks = pr.k / 32;
  for (int64_t r = 0; r < pr.n; ++r)
    for (int64_t b = 0; b < blocks; ++b)
      if ((r + b) % 7 == 3) {
        std::memset(w.codes.data<uint8_t>() + r * (pr.k / 2) + 16 * b, (r & 1) ? 0x88 : 0x00, 16);
        w.scales.data<uint8_t>()[r * blocks + b] = static_cast<uint8_t>((b & 1) ? 0 : 254);
        for (int64_t j = 32 * b; j < 32 * b + 32; ++j) w.deq[r * pr.k + j] = 0.0f;
      }
  w.dcodes = up(w.codes);
  w.dscales = up(w.scales);
  compare("fp8 dense zero blocks at extreme scales", std::move(pr), true);

  Problem wide = dense(Kind::kMxfp4, 64, 128, 256);
  auto& ww = wide.w[0];
  const int64_t wb = wide.k / 32;
  for (int64_t r : {int64_t{5}, int64_t{77}, int64_t{127}}) {
    ww.scales.data<uint8_t>()[r * wb] = 127;
    ww.scales.data<uint8_t>()[r * wb + 3] = 127 - cuda::fp8::kFoldSpan - 1;
    ww.codes.data<uint8_t>()[r * (wide.k / 2)] = 0x11;  // nonzero codes in blocks 0 and 3
    ww.codes.data<uint8_t>()[r * (wide.k / 2) + 3 * 16] = 0x22;
  }
  ww.dcodes = up(ww.codes);
  ww.dscales = up(ww.scales);
  Fp8 f;
  fold(wide, f);
  EXPECT_EQ(f.misfit_rows, 3u);
}

// What the kernel declines: the choice not kAlways (the default), K not a multiple of 128, FP8 weights other than
// 128 x 128 UE8M0 blocks, MXFP4 without folds, batch-invariant mode.
TEST_F(CudaGemmWgmmaFp8Test, DeclinesWhatItDoesNotTake) {
  Fp8 f;
  Problem q = dense(Kind::kMxfp4, 128, 128, 256);
  quantize(q, f);
  fold(q, f);
  const std::unique_ptr<Launch> l = prepare(q);
  const cuda::GemmKernelParams ok = fp8_params(l->p, f);
  EXPECT_TRUE(cuda::gemm_wgmma_fp8_takes(ok));
  cuda::GemmKernelParams p = ok;
  p.choices.wgmma_fp8 = cuda::KernelPick::kAuto;
  EXPECT_FALSE(cuda::run_gemm_wgmma_fp8(p, gpu().stream())) << "opt-in only";
  p = ok;
  p.k = 192;
  EXPECT_FALSE(cuda::gemm_wgmma_fp8_takes(p)) << "K % 128";
  p = ok;
  p.format = QuantFormat::kFP8Block;
  p.block_n = p.block_k = 32;
  EXPECT_FALSE(cuda::gemm_wgmma_fp8_takes(p)) << "FP8 weights of 32 x 32 blocks";
  p.block_n = p.block_k = 128;
  p.scale_e8m0 = false;
  EXPECT_FALSE(cuda::gemm_wgmma_fp8_takes(p)) << "FP8 weights with f32 scales";
  p = ok;
  p.b_fold = nullptr;
  EXPECT_FALSE(cuda::gemm_wgmma_fp8_takes(p)) << "no folds";
  p = ok;
  p.batch_invariant = true;
  EXPECT_FALSE(cuda::gemm_wgmma_fp8_takes(p)) << "batch-invariant";
}

}  // namespace
}  // namespace deepinfer
