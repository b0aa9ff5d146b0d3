// The CUDA micro-benchmarks' fixture (cuda_bench_test.cc: the op table and prefill-sized shapes;
// cuda_bench_decode_test.cc: decode shapes): device tensors filled with a random pattern, timing, and the roofline
// ratios of a [bench] line.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <initializer_list>
#include <memory>
#include <numeric>
#include <optional>
#include <random>

#include "cuda/cuda_test_util.h"
#include "deepinfer/core/dtype.h"
#include "deepinfer/ops/cuda/gemm_rows_mma.h"
#include "deepinfer/ops/cuda/gemm_wgmma.h"
#include "deepinfer/ops/cuda/kernels.h"
#include "deepinfer/ops/cuda/swiglu_bf16.h"

namespace deepinfer::testing {

class CudaBench : public CudaOpTest {
 protected:
  // bf16_exact (f32 only): values rounded to bf16, as FP4 / FP8 fake-quantized activations are.
  DeviceTensor filled(DType dtype, Shape shape, bool e8m0_scale = false, bool e4m3 = false, bool bf16_exact = false) {
    DeviceTensor d(gpu(), dtype, shape);
    const size_t bytes = d.view().nbytes();
    const size_t pat = std::min<size_t>(bytes, 16u << 20);
    std::vector<uint8_t> h(pat);
    std::uniform_int_distribution<int> bd(0, 255);
    std::uniform_real_distribution<float> fd(-1.0f, 1.0f);
    if (dtype == DType::kF32) {
      for (size_t i = 0; i + 4 <= pat; i += 4) {
        float v = fd(rng());
        if (bf16_exact) v = round_bf16(v);
        std::memcpy(&h[i], &v, 4);
      }
    } else if (dtype == DType::kBF16) {
      for (size_t i = 0; i + 2 <= pat; i += 2) {
        uint16_t v = f32_to_bf16(fd(rng()));
        std::memcpy(&h[i], &v, 2);
      }
    } else {
      for (auto& b : h) {
        b = static_cast<uint8_t>(bd(rng()));
        if (e8m0_scale) b = static_cast<uint8_t>(120 + b % 10);
        if (e4m3 && (b & 0x7F) == 0x7F) b = 0x38;
      }
    }
    for (size_t off = 0; off < bytes; off += pat)
      EXPECT_EQ(testing::copy_and_sync(static_cast<char*>(d.data()) + off, h.data(), std::min(pat, bytes - off),
                                       cudaMemcpyHostToDevice),
                cudaSuccess);
    return d;
  }
  // Median time of one call in ms over `iters` (after 3 warm-ups), measured with events on the stream.
  double time_ms(const std::function<void()>& fn, int iters = 20) {
    for (int i = 0; i < 3; ++i) fn();
    gpu().synchronize();
    std::vector<cudaEvent_t> ev(iters + 1);
    for (auto& e : ev) EXPECT_EQ(cudaEventCreate(&e), cudaSuccess);
    EXPECT_EQ(cudaEventRecord(ev[0], gpu().stream()), cudaSuccess);
    for (int i = 0; i < iters; ++i) {
      fn();
      EXPECT_EQ(cudaEventRecord(ev[i + 1], gpu().stream()), cudaSuccess);
    }
    gpu().synchronize();
    std::vector<float> ms(iters);
    for (int i = 0; i < iters; ++i) EXPECT_EQ(cudaEventElapsedTime(&ms[i], ev[i], ev[i + 1]), cudaSuccess);
    for (auto& e : ev) cudaEventDestroy(e);
    std::sort(ms.begin(), ms.end());
    return ms[iters / 2];
  }
  void report(const std::string& what, double ms, double bytes, double flops) {
    const double tbs = bytes / (ms * 1e-3) / 1e12, tfs = flops / (ms * 1e-3) / 1e12;
    std::printf("[bench] %-52s %9.4f ms %8.3f TB/s (%5.1f%% HBM) %8.1f TFLOP/s (%5.1f%% bf16, %5.1f%% fp8)\n",
                what.c_str(), ms, tbs, 100 * tbs / hbm_tbs_, tfs, 100 * tfs / bf16_tfs_, 100 * tfs / 1440.0);
    std::fflush(stdout);
  }
  double hbm_tbs_ = 4.2, bf16_tfs_ = 790.0;

  // V4.1-Flash's MoE layer: 384 MXFP4 experts D=5120 I=2304, each in its own memory (a copy of one random pattern,
  // so bytes really move), and the FP8 128x128 UE8M0 shared expert.
  struct V41Moe {
    std::vector<DeviceTensor> keep;  // reserved up front: the QuantMatrix views point into it
    std::vector<QuantExpertWeights> experts;
    QuantExpertWeights shared;
  };
  std::unique_ptr<V41Moe> v41_moe() {
    const int64_t d = 5120, e = 384, inter = 2304;
    auto moe = std::make_unique<V41Moe>();
    moe->keep.reserve(6 * e + 5);
    moe->experts.resize(e);
    DeviceTensor pat_w = filled(DType::kU8, {inter, d / 2}), pat_s = filled(DType::kE8M0, {inter, d / 32}, true);
    for (int64_t i = 0; i < e; ++i)
      for (auto [rows, cols, q] : {std::tuple{inter, d, &moe->experts[i].w1},
                                   {inter, d, &moe->experts[i].w3},
                                   {d, inter, &moe->experts[i].w2}}) {
        moe->keep.emplace_back(gpu(), DType::kU8, Shape{rows, cols / 2});
        DI_CUDA_CHECK(
            testing::copy_and_sync(moe->keep.back().data(), pat_w.data(), rows * cols / 2, cudaMemcpyDeviceToDevice));
        const DeviceTensor& wt = moe->keep.back();
        moe->keep.emplace_back(gpu(), DType::kE8M0, Shape{rows, cols / 32});
        DI_CUDA_CHECK(
            testing::copy_and_sync(moe->keep.back().data(), pat_s.data(), rows * cols / 32, cudaMemcpyDeviceToDevice));
        *q = QuantMatrix{wt, moe->keep.back(), QuantFormat::kMXFP4};
      }
    auto keep = [&](DeviceTensor t) -> const DeviceTensor& { return moe->keep.emplace_back(std::move(t)); };
    const DeviceTensor& ss1 = keep(filled(DType::kE8M0, {inter / 128, d / 128}, true));
    const DeviceTensor& ss2 = keep(filled(DType::kE8M0, {d / 128, inter / 128}, true));
    moe->shared.w1 = {keep(filled(DType::kF8E4M3, {inter, d}, false, true)), ss1, QuantFormat::kFP8Block};
    moe->shared.w3 = {keep(filled(DType::kF8E4M3, {inter, d}, false, true)), ss1, QuantFormat::kFP8Block};
    moe->shared.w2 = {keep(filled(DType::kF8E4M3, {d, inter}, false, true)), ss2, QuantFormat::kFP8Block};
    return moe;
  }
  // FP8 128x128 UE8M0 copies of an [n, k] weight, enough of them (up to 64) to span ~200 MB, so that rotating them
  // reads each call's weight from HBM rather than the 50 MB L2.
  struct RotatingFp8 {
    std::vector<DeviceTensor> w, s;
    double bytes = 0;  // one copy's weight and scale bytes
  };
  RotatingFp8 rotating_fp8(int64_t n, int64_t k) {
    RotatingFp8 r;
    r.bytes = n * k * (1.0 + 1.0 / (128 * 128));
    const int copies = static_cast<int>(std::clamp(200e6 / r.bytes, 1.0, 64.0));
    for (int c = 0; c < copies; ++c) {
      r.w.push_back(filled(DType::kF8E4M3, {n, k}, false, true));
      r.s.push_back(filled(DType::kE8M0, {(n + 127) / 128, k / 128}, true));
    }
    return r;
  }
  // Median ms of linear_quant x -> y, each call on the next copy.
  double time_rotating(const RotatingFp8& r, const DeviceTensor& x, const DeviceTensor& y) {
    size_t c = 0;
    return time_ms([&] {
      gpu().linear_quant({x, {r.w[c], r.s[c], QuantFormat::kFP8Block, 128, 128}, y});
      c = (c + 1) % r.w.size();
    });
  }
  // `count` expert selections of t tokens x k of e experts (each token's k distinct); rotating them keeps the
  // experts out of L2. `touched`: the mean number of distinct experts a selection uses.
  std::vector<DeviceTensor> rotating_selections(int64_t t, int64_t k, int64_t e, int count, double& touched) {
    std::vector<DeviceTensor> idx;
    touched = 0;
    for (int sel = 0; sel < count; ++sel) {
      HostTensor h(DType::kI32, {t, k});
      std::vector<bool> used(e, false);
      for (int64_t i = 0; i < t * k; ++i) {
        const int32_t ex = static_cast<int32_t>((sel * 97 + (i / k) * 31 + (i % k) * 61) % e);
        h.data<int32_t>()[i] = ex;
        used[ex] = true;
      }
      touched += std::count(used.begin(), used.end(), true);
      idx.push_back(up(h));
    }
    touched /= count;
    return idx;
  }
  // A dense FP8 projection [n, k] (rotating_fp8 copies) at each row count, under each mode (set_mode(md) first): one
  // [bench] line each, named "fp8 <name> N= K= M= <mode>".
  struct Proj {
    const char* name;
    int64_t n, k;
  };
  template <class Mode, size_t N, class SetMode>
  void time_fp8_proj(const Proj& pr, std::initializer_list<int64_t> rows, const Mode (&modes)[N],
                     const SetMode& set_mode) {
    const RotatingFp8 wr = rotating_fp8(pr.n, pr.k);
    for (int64_t m : rows) {
      DeviceTensor x = filled(DType::kF32, {m, pr.k}), y(gpu(), DType::kF32, {m, pr.n});
      for (const Mode& md : modes) {
        set_mode(md);
        const double ms = time_rotating(wr, x, y);
        report(std::string("fp8 ") + pr.name + " N=" + std::to_string(pr.n) + " K=" + std::to_string(pr.k) +
                   " M=" + std::to_string(m) + " " + md.name,
               ms, wr.bytes + 4.0 * m * (pr.n + pr.k), 2.0 * m * pr.n * pr.k);
      }
    }
  }
  // One decode call of the V4.1 MoE (v41_moe: D=5120 I=2304, top-6) on t tokens, with 16 rotating expert selections
  // drawn from the first `pool` experts; bytes: the experts a selection touches on average plus the shared expert.
  struct V41MoeCall {
    std::vector<DeviceTensor> idx;
    DeviceTensor x, wts, y;
    double bytes = 0, flops = 0;
  };
  V41MoeCall v41_moe_call(int64_t t, int64_t pool) {
    const int64_t d = 5120, inter = 2304, k = 6;
    V41MoeCall c;
    double touched = 0;
    c.idx = rotating_selections(t, k, pool, 16, touched);
    c.x = filled(DType::kF32, {t, d});
    c.wts = filled(DType::kF32, {t, k});
    c.y = DeviceTensor(gpu(), DType::kF32, {t, d});
    c.bytes = touched * 3.0 * inter * d * (0.5 + 1.0 / 32) + 3.0 * inter * d;
    c.flops = 2.0 * 3 * inter * d * t * (k + 1);
    return c;
  }
  // Median ms of moe_quant for c over `iters` calls, each on the next selection.
  double time_v41_moe(const V41Moe& moe, const V41MoeCall& c, int iters) {
    size_t sel = 0;
    return time_ms(
        [&] {
          gpu().moe_quant({c.x, c.wts, c.idx[sel], &moe.experts, &moe.shared, c.y, 10.0f, true});
          sel = (sel + 1) % c.idx.size();
        },
        iters);
  }
  // Paged decode attention at V4.1's shape: b sequences of ctx tokens, 64 heads x 512, pages of 64 in shuffled order,
  // window 128 + 512 selected ratio-4 entries; `params` points into the tensors.
  struct PagedDecode {
    DeviceTensor q, win, comp, sinks, out, dpos, dseq, dtab, dbeg, dsel;
    PagedSinkAttentionParams params;
  };
  std::unique_ptr<PagedDecode> paged_decode(int64_t b, int64_t ctx) {
    const int64_t h = 64, hd = 512, bs = 64, nb = ctx / bs, k = 512;
    std::vector<int32_t> ids(b * nb), sel(b * k), seqs(b);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng());
    std::vector<int64_t> pos(b, ctx - 1), begin(b, 0);
    for (int64_t i = 0; i < b; ++i) {
      seqs[i] = static_cast<int32_t>(i);
      for (int64_t j = 0; j < k; ++j) sel[i * k + j] = static_cast<int32_t>(j * (ctx / 4 / k));  // ratio-4 entries
    }
    auto upv = [&](DType dt, Shape shape, const void* src) {
      HostTensor ht(dt, shape);
      std::memcpy(ht.view().data(), src, ht.view().nbytes());
      return up(ht);
    };
    auto pd = std::make_unique<PagedDecode>();
    pd->q = filled(DType::kF32, {b, h, hd});
    pd->win = filled(DType::kF32, {b * nb * bs, hd});
    pd->comp = filled(DType::kF32, {b * nb * bs / 4, hd});
    pd->sinks = filled(DType::kF32, {h});
    pd->out = DeviceTensor(gpu(), DType::kF32, {b, h, hd});
    pd->dpos = upv(DType::kI64, {b}, pos.data());
    pd->dseq = upv(DType::kI32, {b}, seqs.data());
    pd->dtab = upv(DType::kI32, {b, nb}, ids.data());
    pd->dbeg = upv(DType::kI64, {b}, begin.data());
    pd->dsel = upv(DType::kI32, {b, k}, sel.data());
    PagedSinkAttentionParams& ap = pd->params;
    ap.q = pd->q;
    ap.q_positions = pd->dpos;
    ap.q_seq = pd->dseq;
    ap.block_tables = pd->dtab;
    ap.window_pool = pd->win;
    ap.window_begin = pd->dbeg;
    ap.comp_pool = pd->comp;
    ap.comp_idx = pd->dsel;
    ap.sinks = pd->sinks;
    ap.out = pd->out;
    ap.block_size = static_cast<int>(bs);
    ap.comp_ratio = 4;
    ap.window = 128;
    ap.scale = 0.044f;
    return pd;
  }
};

}  // namespace deepinfer::testing
