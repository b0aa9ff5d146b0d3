// A GEMM problem on random data for the CUDA GEMM kernels' tests (cuda_gemm_wgmma_test.cc, cuda_gemm_rows_mma_test.cc):
// block-format weights with their exact dequantization, bf16 A, dense or grouped (a_rows / c_rows routing), the
// device copies and GemmKernelParams of a launch, and the checks against a double reference.
//
// Reference tolerance: both operands are exact in the kernels (bf16 A, weights exact in bf16), so only the fp32 sums
// differ: |got - want| <= 1e-4 · Σ|a·w| per entry (fp32 accumulation over K <= 8192 is ~1e-6 of Σ|a·w| in practice; a
// misplaced tile, a wrong scale or a wrong code is ~1e-2 of it and more).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "cuda/cuda_test_util.h"
#include "deepinfer/core/dtype.h"
#include "deepinfer/ops/cuda/kernels.h"

namespace deepinfer::testing {

enum class Kind { kMxfp4, kFp8E8m0_128, kFp8E8m0_32, kFp8F32_128, kFp8Row32 };
inline const char* kind_name(Kind k) {
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

class GemmProblemTest : public CudaOpTest {
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
  // `cols` (all of them when `full`), within tol · Σ|a·w| each. Prints the first mismatch.
  void check_reference(const std::string& what, const Problem& pr, const HostTensor& got, bool full,
                       double tol = 1e-4) {
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
      if (!(err <= tol)) {
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
  // `fn` (a kernel entry taking p, returning whether it took the call) with C rows 2N apart: the first N columns of
  // each row must be `got`'s bytes (the same call with ldc = N), the other N still NaN.
  template <class Fn>
  void expect_wide_c_same(const std::string& what, const Launch& l, const Problem& pr, const HostTensor& got, Fn fn) {
    const int64_t m = pr.m, n = pr.n;
    DeviceTensor wide = poisoned({m, 2 * n});
    cuda::GemmKernelParams q = l.p;
    q.c = static_cast<float*>(wide.data());
    q.ldc = 2 * n;
    EXPECT_TRUE(fn(q)) << what << ": declined with ldc = 2N";
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
};

}  // namespace deepinfer::testing
