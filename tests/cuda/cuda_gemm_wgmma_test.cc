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

enum class Kind { kMxfp4, kFp8E8m0_128, kFp8E8m0_32, kFp8F32_128, kFp8Row32 };
const char* kind_name(Kind k) {
  switch (k) {
    case Kind::kMxfp4:
      return "mxfp4";
    case Kind::kFp8E8m0_128:
      return "fp8 128x128 e8m0";
    case Kind::kFp8E8m0_32:
      return "fp8 32x32 e8m0";
    case Kind::kFp8F32_128:
      return "fp8 128x128 f32";
    case Kind::kFp8Row32:
      return "fp8 row32 e8m0";
  }
  return "?";
}

class CudaGemmWgmmaTest : public CudaOpTest {
 protected:
  // One weight matrix [n, k]: host codes / scales, their exact dequantization, and device copies.
  struct Weight {
    HostTensor codes, scales;
    std::vector<float> deq;  // [n, k]
    DeviceTensor dcodes, dscales;
  };
  static QuantFormat format(Kind k) {
    return k == Kind::kMxfp4 ? QuantFormat::kMXFP4
                             : (k == Kind::kFp8Row32 ? QuantFormat::kFP8Row32 : QuantFormat::kFP8Block);
  }
  static int block(Kind k) { return k == Kind::kFp8E8m0_32 ? 32 : 128; }
  static bool e8m0(Kind k) { return k != Kind::kFp8F32_128; }
  static int64_t scale_cols(Kind k, int64_t kk) {
    return (k == Kind::kMxfp4 || k == Kind::kFp8Row32) ? kk / 32 : (kk + block(k) - 1) / block(k);
  }

  // Random codes (all e4m3 codes but NaN, subnormals and zeros included; all e2m1 codes) and scales: UE8M0 in
  // [2^-6, 2^1], f32 in [0.5, 2).
  Weight weight(Kind kind, int64_t n, int64_t k) {
    Weight w;
    const QuantFormat f = format(kind);
    const int64_t sc_rows = f == QuantFormat::kFP8Block ? (n + block(kind) - 1) / block(kind) : n;
    const int64_t sc_cols = scale_cols(kind, k);
    if (f == QuantFormat::kMXFP4) {
      w.codes = rand_bytes(DType::kU8, {n, k / 2});
    } else {
      w.codes = rand_bytes(DType::kF8E4M3, {n, k});
      auto* c = w.codes.data<uint8_t>();
      for (int64_t i = 0; i < n * k; ++i)
        if ((c[i] & 0x7F) == 0x7F) c[i] = 0x3C;
    }
    if (e8m0(kind)) {
      w.scales = rand_bytes(DType::kE8M0, {sc_rows, sc_cols}, 121, 128);
    } else {
      w.scales = rand({sc_rows, sc_cols}, 0.5f, 2.0f);
    }
    w.deq.resize(n * k);
    const auto* c = w.codes.data<uint8_t>();
    for (int64_t r = 0; r < n; ++r)
      for (int64_t j = 0; j < k; ++j) {
        const int64_t si =
            f == QuantFormat::kFP8Block ? (r / block(kind)) * sc_cols + j / block(kind) : r * sc_cols + j / 32;
        const float sc = e8m0(kind) ? e8m0_to_f32(w.scales.data<uint8_t>()[si]) : w.scales.data<float>()[si];
        const float v = f == QuantFormat::kMXFP4 ? e2m1_to_f32(fp4_get(c + r * (k / 2), j)) : e4m3_to_f32(c[r * k + j]);
        // f32 scales: the kernels round code·scale (an f32 product) to bf16, as gemm_mma does.
        w.deq[r * k + j] = e8m0(kind) ? v * sc : round_bf16(v * sc);
      }
    w.dcodes = up(w.codes);
    w.dscales = up(w.scales);
    return w;
  }

  // A problem: bf16 A [a_rows_total, k] and the routing of the gathered rows onto groups.
  struct Problem {
    Kind kind;
    int64_t n = 0, k = 0, m = 0;  // m gathered rows
    std::vector<int64_t> sizes;   // rows per group (grouped), empty = dense
    std::vector<uint16_t> a;      // [a_total, k] bf16
    int64_t a_total = 0;
    std::vector<int32_t> a_rows, c_rows;  // empty = identity
    int a_row_div = 1;
    std::vector<Weight> w;  // one per group (dense: one)
  };

  Problem dense(Kind kind, int64_t m, int64_t n, int64_t k) {
    Problem pr;
    pr.kind = kind;
    pr.n = n;
    pr.k = k;
    pr.m = m;
    pr.a_total = m;
    pr.a = bf16_matrix(m, k);
    pr.w.push_back(weight(kind, n, k));
    return pr;
  }
  // Groups of the given sizes; A has `tokens` rows, gathered row i reads A row a_rows[i] / topk; C rows permuted.
  Problem grouped(Kind kind, std::vector<int64_t> sizes, int64_t n, int64_t k, int topk) {
    Problem pr;
    pr.kind = kind;
    pr.n = n;
    pr.k = k;
    pr.sizes = sizes;
    pr.m = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
    pr.a_total = (pr.m + topk - 1) / topk;
    pr.a = bf16_matrix(pr.a_total, k);
    pr.a_row_div = topk;
    std::uniform_int_distribution<int32_t> d(0, static_cast<int32_t>(pr.a_total * topk - 1));
    for (int64_t i = 0; i < pr.m; ++i) pr.a_rows.push_back(d(rng()));
    pr.c_rows.resize(pr.m);
    std::iota(pr.c_rows.begin(), pr.c_rows.end(), 0);
    std::shuffle(pr.c_rows.begin(), pr.c_rows.end(), rng());
    for (size_t g = 0; g < sizes.size(); ++g) pr.w.push_back(weight(kind, n, k));
    return pr;
  }
  std::vector<uint16_t> bf16_matrix(int64_t rows, int64_t k) {
    std::vector<uint16_t> v(rows * k);
    std::uniform_real_distribution<float> d(-1.0f, 1.0f);
    for (auto& x : v) {
      const float f = d(rng());
      x = f32_to_bf16(f == 0.0f ? 1e-3f : f);
    }
    return v;
  }

  // Device state of a problem and its kernel params (c set by the caller).
  struct Launch {
    DeviceTensor a, a_rows, c_rows, offsets, tiles, active, b_table, s_table;
    cuda::GemmKernelParams p;
  };
  std::unique_ptr<Launch> prepare(const Problem& pr) {
    auto l = std::make_unique<Launch>();
    HostTensor ha(DType::kBF16, {pr.a_total, pr.k});
    std::memcpy(ha.view().data(), pr.a.data(), pr.a.size() * 2);
    l->a = up(ha);
    cuda::GemmKernelParams& p = l->p;
    p.a_bf16 = l->a.data();
    p.lda = pr.k;
    p.format = format(pr.kind);
    p.scale_e8m0 = e8m0(pr.kind);
    p.block_n = p.block_k = block(pr.kind);
    p.scale_cols = scale_cols(pr.kind, pr.k);
    p.m = pr.m;
    p.n = pr.n;
    p.k = pr.k;
    p.ldc = pr.n;
    auto ints = [&](const std::vector<int32_t>& v) {
      HostTensor h(DType::kI32, {static_cast<int64_t>(v.size())});
      std::memcpy(h.view().data(), v.data(), v.size() * 4);
      return up(h);
    };
    if (!pr.a_rows.empty()) {
      l->a_rows = ints(pr.a_rows);
      p.a_rows = static_cast<const int32_t*>(l->a_rows.data());
      p.a_row_div = pr.a_row_div;
    }
    if (!pr.c_rows.empty()) {
      l->c_rows = ints(pr.c_rows);
      p.c_rows = static_cast<const int32_t*>(l->c_rows.data());
    }
    if (pr.sizes.empty()) {
      p.b = pr.w[0].dcodes.data();
      p.b_scale = pr.w[0].dscales.data();
      p.rows_hint = pr.m;
      return l;
    }
    const int g_count = static_cast<int>(pr.sizes.size());
    std::vector<int32_t> off(g_count + 1, 0), tiles(g_count + 1, 0), active(g_count + 1, 0);
    int na = 0;
    for (int g = 0; g < g_count; ++g) {
      off[g + 1] = off[g] + static_cast<int32_t>(pr.sizes[g]);
      tiles[g + 1] = tiles[g] + static_cast<int32_t>((pr.sizes[g] + cuda::kGemmTileM - 1) / cuda::kGemmTileM);
      if (pr.sizes[g] > 0) active[na++] = g;
    }
    active[g_count] = na;
    l->offsets = ints(off);
    l->tiles = ints(tiles);
    l->active = ints(active);
    HostTensor bt(DType::kI64, {g_count}), st(DType::kI64, {g_count});
    for (int g = 0; g < g_count; ++g) {
      bt.data<int64_t>()[g] = reinterpret_cast<int64_t>(pr.w[g].dcodes.data());
      st.data<int64_t>()[g] = reinterpret_cast<int64_t>(pr.w[g].dscales.data());
    }
    l->b_table = up(bt);
    l->s_table = up(st);
    p.groups = g_count;
    p.group_offsets = static_cast<const int32_t*>(l->offsets.data());
    p.tile_offsets = static_cast<const int32_t*>(l->tiles.data());
    p.active_groups = static_cast<const int32_t*>(l->active.data());
    p.max_tiles_m = tiles[g_count] + 3;  // more grid rows than tiles, as the MoE plan's bound
    p.b_table = static_cast<const void* const*>(l->b_table.data());
    p.b_scale_table = static_cast<const void* const*>(l->s_table.data());
    p.tables_aligned16 = true;
    p.rows_hint = 64;
    return l;
  }

  // Runs `fn` (a kernel entry taking p) into a fresh NaN-poisoned C and returns C.
  template <class Fn>
  HostTensor run(Launch& l, const Problem& pr, Fn fn) {
    DeviceTensor c = poisoned({pr.m, pr.n});
    l.p.c = static_cast<float*>(c.data());
    fn(l.p);
    return down(c);
  }

  // C row of gathered row i, A row of gathered row i, group of gathered row i.
  static int64_t c_row(const Problem& pr, int64_t i) { return pr.c_rows.empty() ? i : pr.c_rows[i]; }
  static int64_t a_row(const Problem& pr, int64_t i) { return pr.a_rows.empty() ? i : pr.a_rows[i] / pr.a_row_div; }

  // Checks entries (gathered row i, column j) against the double reference: every column of `rows`, every row of
  // `cols` (all of them when `full`). Prints the first mismatch.
  void check_reference(const std::string& what, const Problem& pr, const HostTensor& got, bool full) {
    std::vector<int> group(pr.m, 0);
    if (!pr.sizes.empty()) {
      int64_t i = 0;
      for (size_t g = 0; g < pr.sizes.size(); ++g)
        for (int64_t r = 0; r < pr.sizes[g]; ++r) group[i++] = static_cast<int>(g);
    }
    std::vector<int64_t> rows, cols;
    if (full) {
      rows.resize(pr.m);
      std::iota(rows.begin(), rows.end(), 0);
    } else {
      std::uniform_int_distribution<int64_t> dr(0, pr.m - 1), dc(0, pr.n - 1);
      for (int64_t r : {int64_t{0}, int64_t{63}, int64_t{64}, int64_t{127}, int64_t{128}, pr.m - 1})
        if (r < pr.m) rows.push_back(r);
      for (int i = 0; i < 4; ++i) rows.push_back(dr(rng()));
      for (int64_t c : {int64_t{0}, int64_t{255}, int64_t{256}, pr.n - 1})
        if (c < pr.n) cols.push_back(c);
      for (int i = 0; i < 4; ++i) cols.push_back(dc(rng()));
    }
    int64_t bad = 0, checked = 0;
    double worst = 0;
    auto check = [&](int64_t i, int64_t j) {
      const uint16_t* a = pr.a.data() + a_row(pr, i) * pr.k;
      const float* w = pr.w[group[i]].deq.data() + j * pr.k;
      double sum = 0, mag = 0;
      for (int64_t kk = 0; kk < pr.k; ++kk) {
        const double t = static_cast<double>(bf16_to_f32(a[kk])) * w[kk];
        sum += t;
        mag += std::fabs(t);
      }
      const double g = got.data<float>()[c_row(pr, i) * pr.n + j];
      const double err = std::fabs(g - sum) / std::max(mag, 1e-30);
      ++checked;
      if (!(err <= 1e-4)) {
        if (bad++ == 0)
          ADD_FAILURE() << what << ": first mismatch at gathered row " << i << " (C row " << c_row(pr, i) << ", group "
                        << group[i] << "), column " << j << ": got " << g << ", want " << sum << " (sum|a·w| " << mag
                        << ", seed in the test record)";
      }
      if (err > worst || std::isnan(err)) worst = std::isnan(err) ? INFINITY : err;
    };
    for (int64_t i : rows)
      for (int64_t j = 0; j < pr.n; ++j) check(i, j);
    for (int64_t j : cols)
      for (int64_t i = 0; i < pr.m; ++i) check(i, j);
    std::printf("[cuda-op] %-48s ref: %lld entries, worst |err|/sum|aw| %.2e, %lld bad %s\n", what.c_str(),
                static_cast<long long>(checked), worst, static_cast<long long>(bad), bad ? "FAIL" : "ok");
    std::fflush(stdout);
  }
  // ‖got − want‖ / ‖want‖ over the written rows, and the first entry off by more than 1e-2 of the rms.
  void check_against(const std::string& what, const Problem& pr, const HostTensor& got, const HostTensor& want,
                     double tol) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < pr.m * pr.n; ++i) {
      const double w = want.data<float>()[i];
      den += w * w;
    }
    const double rms = std::sqrt(den / std::max<int64_t>(pr.m * pr.n, 1));
    int64_t first = -1, bad = 0;
    for (int64_t i = 0; i < pr.m * pr.n; ++i) {
      const double g = got.data<float>()[i], w = want.data<float>()[i];
      num += (g - w) * (g - w);
      if (!(std::fabs(g - w) <= 1e-2 * rms)) {
        if (first < 0) first = i;
        ++bad;
      }
    }
    const double err = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
    std::printf("[cuda-op] %-48s vs mma: rel_err=%.3e tol=%.0e, %lld entries off %s\n", what.c_str(), err, tol,
                static_cast<long long>(bad), err <= tol && bad == 0 ? "ok" : "FAIL");
    std::fflush(stdout);
    EXPECT_LE(err, tol) << what;
    EXPECT_EQ(bad, 0) << what << ": first entry off at C row " << (first < 0 ? -1 : first / pr.n) << ", column "
                      << (first < 0 ? -1 : first % pr.n) << ": " << (first < 0 ? 0.0f : got.data<float>()[first])
                      << " vs " << (first < 0 ? 0.0f : want.data<float>()[first]);
  }

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
      const std::pair<cuda::WgmmaDecode, const char*> placements[] = {{cuda::WgmmaDecode::kProducer, "producer"},
                                                                      {cuda::WgmmaDecode::kSplit, "split"},
                                                                      {cuda::WgmmaDecode::kConsumers, "consumers"}};
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
      const HostTensor via = run(*l, pr, [&](const cuda::GemmKernelParams& p) { cuda::run_gemm(p, s); });
      expect_same_bytes((what + " run_gemm = run_gemm_wgmma").c_str(), via, got);
      // C rows 2N apart: the first N columns of each row, the rest still NaN.
      DeviceTensor wide = poisoned({m, 2 * n});
      cuda::GemmKernelParams q = l->p;
      q.c = static_cast<float*>(wide.data());
      q.ldc = 2 * n;
      ASSERT_TRUE(cuda::run_gemm_wgmma(q, s)) << what;
      const HostTensor hw = down(wide);
      int64_t differ = 0, written = 0;
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < 2 * n; ++j) {
          const float v = hw.data<float>()[i * 2 * n + j];
          if (j < n)
            differ += std::memcmp(&v, got.data<float>() + i * n + j, sizeof(float)) != 0;
          else
            written += !std::isnan(v);
        }
      EXPECT_EQ(differ, 0) << what << ": ldc = 2N differs from ldc = N";
      EXPECT_EQ(written, 0) << what << ": ldc = 2N wrote past the first N columns";
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
  cuda::GemmKernelParams d;  // dense calls: 128 x 256 unless the choice asks for the tall tile
  d.m = 8192;
  EXPECT_EQ(cuda::wgmma_tile(d), WgmmaTile::k128x256);
  EXPECT_EQ(cuda::wgmma_tile(with_tile(d, WgmmaTile::kMixed)), WgmmaTile::k128x256);
  EXPECT_EQ(cuda::wgmma_tile(with_tile(d, WgmmaTile::k256x128)), WgmmaTile::k256x128);
}

}  // namespace
}  // namespace deepinfer
