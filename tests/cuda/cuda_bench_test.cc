// Micro-benchmark of the CUDA ops on large shapes, with the two ceilings measured in the same run (HBM copy
// bandwidth, cuBLASLt bf16 GEMM rate). Disabled in the normal test run; tools/device_check.sh runs it with
// --gtest_also_run_disabled_tests --gtest_filter='*Bench*' and keeps the table it prints ([bench] lines).
// Inputs are random (a 16 MiB random pattern tiled over each buffer: never zeros, cheap to make).
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

namespace deepinfer {
namespace {

using testing::CudaOpTest;
using testing::DeviceTensor;
using testing::ScopedKernelChoices;

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

TEST_F(CudaBench, DISABLED_OpTimings) {
  std::printf("[bench] device: %s, %d SMs\n", gpu().device_info().name.c_str(), gpu().device_info().sm_count);
  {  // ceiling 1: device-to-device copy, bytes read + written
    const size_t bytes = 2ull << 30;
    DeviceTensor a = filled(DType::kU8, {static_cast<int64_t>(bytes)}),
                 b(gpu(), DType::kU8, {static_cast<int64_t>(bytes)});
    const double ms = time_ms(
        [&] { DI_CUDA_CHECK(cudaMemcpyAsync(b.data(), a.data(), bytes, cudaMemcpyDeviceToDevice, gpu().stream())); },
        10);
    hbm_tbs_ = 2.0 * bytes / (ms * 1e-3) / 1e12;
    std::printf("[bench] ceiling HBM copy (2 GiB D2D, read+write): %.3f TB/s\n", hbm_tbs_);
  }
  {  // ceiling 2: cuBLASLt bf16 GEMM 8192^3 (through linear_quant: includes the 8192x8192 input cast)
    const int64_t n = 8192;
    DeviceTensor x = filled(DType::kF32, {n, n}), w = filled(DType::kBF16, {n, n}), y(gpu(), DType::kF32, {n, n});
    const double ms = time_ms([&] { gpu().linear_quant({x, {w, Tensor{}, QuantFormat::kFloat}, y}); }, 10);
    bf16_tfs_ = 2.0 * n * n * n / (ms * 1e-3) / 1e12;
    std::printf("[bench] ceiling bf16 GEMM 8192^3 via cuBLASLt (+f32->bf16 cast): %.1f TFLOP/s\n", bf16_tfs_);
  }
  const int64_t d = 4096;
  for (int64_t m : {1, 64, 4096}) {  // dense projections, D x D
    DeviceTensor x = filled(DType::kF32, {m, d}), y(gpu(), DType::kF32, {m, d});
    DeviceTensor wf = filled(DType::kF32, {d, d}), wb = filled(DType::kBF16, {d, d});
    DeviceTensor w8 = filled(DType::kF8E4M3, {d, d}, false, true), s8 = filled(DType::kE8M0, {d / 128, d / 128}, true);
    DeviceTensor w4 = filled(DType::kU8, {d, d / 2}), s4 = filled(DType::kE8M0, {d, d / 32}, true);
    const double fl = 2.0 * m * d * d, io = 4.0 * m * d * 2;
    const std::string sz = " M=" + std::to_string(m) + " N=K=4096";
    report("linear f32 (cuBLASLt fp32)" + sz, time_ms([&] { gpu().linear({x, wf, y}); }), io + 4.0 * d * d, fl);
    report("linear_quant bf16 (cuBLASLt)" + sz, time_ms([&] {
             gpu().linear_quant({x, {wb, Tensor{}, QuantFormat::kFloat}, y});
           }),
           io + 2.0 * d * d, fl);
    report("linear_quant fp8 128x128 (own SIMT)" + sz, time_ms([&] {
             gpu().linear_quant({x, {w8, s8, QuantFormat::kFP8Block, 128, 128}, y});
           }),
           io + 1.0 * d * d, fl);
    report("linear_quant mxfp4 (own SIMT)" + sz, time_ms([&] {
             gpu().linear_quant({x, {w4, s4, QuantFormat::kMXFP4}, y});
           }),
           io + 0.5 * d * d, fl);
  }
  {  // MoE: 256 MXFP4 experts D=4096 I=2048, top-6, FP8 shared expert
    const int64_t e = 256, inter = 2048, k = 6;
    std::vector<DeviceTensor> keep;
    keep.reserve(6 * e + 6);
    std::vector<QuantExpertWeights> experts(e);
    DeviceTensor pat_w1 = filled(DType::kU8, {inter, d / 2}), pat_s1 = filled(DType::kE8M0, {inter, d / 32}, true);
    for (int64_t i = 0; i < e; ++i) {
      // Each expert has its own memory (so bytes really move) holding a copy of one random pattern.
      for (auto [rows, cols, q] :
           {std::tuple{inter, d, &experts[i].w1}, {inter, d, &experts[i].w3}, {d, inter, &experts[i].w2}}) {
        keep.emplace_back(gpu(), DType::kU8, Shape{rows, cols / 2});
        DI_CUDA_CHECK(
            testing::copy_and_sync(keep.back().data(), pat_w1.data(), rows * cols / 2, cudaMemcpyDeviceToDevice));
        const DeviceTensor& w = keep.back();
        keep.emplace_back(gpu(), DType::kE8M0, Shape{rows, cols / 32});
        DI_CUDA_CHECK(
            testing::copy_and_sync(keep.back().data(), pat_s1.data(), rows * cols / 32, cudaMemcpyDeviceToDevice));
        *q = QuantMatrix{w, keep.back(), QuantFormat::kMXFP4};
      }
    }
    QuantExpertWeights shared;
    DeviceTensor sw1 = filled(DType::kF8E4M3, {inter, d}, false, true),
                 sw3 = filled(DType::kF8E4M3, {inter, d}, false, true);
    DeviceTensor sw2 = filled(DType::kF8E4M3, {d, inter}, false, true);
    DeviceTensor ss1 = filled(DType::kE8M0, {inter / 128, d / 128}, true),
                 ss2 = filled(DType::kE8M0, {d / 128, inter / 128}, true);
    shared.w1 = {sw1, ss1, QuantFormat::kFP8Block};
    shared.w3 = {sw3, ss1, QuantFormat::kFP8Block};
    shared.w2 = {sw2, ss2, QuantFormat::kFP8Block};
    for (int64_t t : {1, 32, 1024}) {
      HostTensor idx(DType::kI32, {t, k});
      for (int64_t i = 0; i < t * k; ++i) idx.data<int32_t>()[i] = static_cast<int32_t>((i * 37 + i / k * 11) % e);
      DeviceTensor x = filled(DType::kF32, {t, d}), wts = filled(DType::kF32, {t, k}), di = up(idx),
                   y(gpu(), DType::kF32, {t, d});
      const int64_t touched = std::min<int64_t>(e, t * k);
      const double bytes = touched * 3.0 * inter * d * (0.5 + 1.0 / 32) + 3.0 * inter * d;
      const double fl = 2.0 * 3 * inter * d * t * (k + 1);
      report("moe_quant mxfp4 E=256 I=2048 k=6 +fp8 shared T=" + std::to_string(t),
             time_ms(
                 [&] {
                   gpu().moe_quant({x, wts, di, &experts, &shared, y, 10.0f, true});
                 },
                 10),
             bytes, fl);
    }
  }
  {  // V3 671B shapes (D=7168): the MoE layer as the checkpoint stores it (FP8 128x128 experts with f32 scales,
     // 256 routed, top-8, one shared of I=2048) and the MLA projections, at decode batch 1/64/128 and a 4096-token
     // prefill chunk.
    const int64_t dv3 = 7168, e = 256, inter = 2048, k = 8;
    std::vector<DeviceTensor> keep;
    keep.reserve(6 * e + 6);
    std::vector<QuantExpertWeights> experts(e);
    DeviceTensor pat_up = filled(DType::kF8E4M3, {inter, dv3}, false, true);
    DeviceTensor pat_su = filled(DType::kF32, {inter / 128, dv3 / 128}),
                 pat_sd = filled(DType::kF32, {dv3 / 128, inter / 128});
    for (int64_t i = 0; i < e; ++i) {
      for (auto [rows, cols, q] :
           {std::tuple{inter, dv3, &experts[i].w1}, {inter, dv3, &experts[i].w3}, {dv3, inter, &experts[i].w2}}) {
        keep.emplace_back(gpu(), DType::kF8E4M3, Shape{rows, cols});
        DI_CUDA_CHECK(testing::copy_and_sync(keep.back().data(), pat_up.data(), rows * cols, cudaMemcpyDeviceToDevice));
        *q = QuantMatrix{keep.back(), rows == inter ? pat_su.view() : pat_sd.view(), QuantFormat::kFP8Block, 128, 128};
      }
    }
    QuantExpertWeights shared = experts[0];  // same shape; its own call reads it once more
    for (int64_t t : {1, 64, 128, 4096}) {
      HostTensor idx(DType::kI32, {t, k});
      for (int64_t i = 0; i < t * k; ++i) idx.data<int32_t>()[i] = static_cast<int32_t>((i * 37 + i / k * 11) % e);
      DeviceTensor x = filled(DType::kF32, {t, dv3}), wts = filled(DType::kF32, {t, k}), di = up(idx),
                   y(gpu(), DType::kF32, {t, dv3});
      const int64_t touched = std::min<int64_t>(e, t * k);
      const double bytes = (touched + 1) * 3.0 * inter * dv3 * (1.0 + 4.0 / (128 * 128)) + 8.0 * t * dv3;
      const double fl = 2.0 * 3 * inter * dv3 * t * (k + 1);
      report("V3 moe_quant fp8-block E=256 I=2048 D=7168 k=8 +shared T=" + std::to_string(t),
             time_ms(
                 [&] {
                   gpu().moe_quant({x, wts, di, &experts, &shared, y, 0.0f, false});
                 },
                 10),
             bytes, fl);
    }
    // MLA projections of one layer (FP8 128x128, f32 scales): q_a 7168->1536, q_b 1536->24576, kv_a 7168->576,
    // o 16384->7168.
    for (int64_t t : {1, 64, 128, 4096}) {
      for (const Proj& pr :
           {Proj{"q_a", 1536, 7168}, Proj{"q_b", 24576, 1536}, Proj{"kv_a", 576, 7168}, Proj{"o", 7168, 16384}}) {
        const int64_t np = (pr.n + 127) / 128 * 128;  // kv_a 576 pads its last scale block
        DeviceTensor x = filled(DType::kF32, {t, pr.k}), y(gpu(), DType::kF32, {t, pr.n});
        DeviceTensor w = filled(DType::kF8E4M3, {pr.n, pr.k}, false, true);
        DeviceTensor sc = filled(DType::kF32, {np / 128, pr.k / 128});
        report(std::string("V3 linear_quant fp8 ") + pr.name + " M=" + std::to_string(t) +
                   " N=" + std::to_string(pr.n) + " K=" + std::to_string(pr.k),
               time_ms([&] {
                 gpu().linear_quant({x, {w, sc, QuantFormat::kFP8Block, 128, 128}, y});
               }),
               1.0 * pr.n * pr.k + 4.0 * t * (pr.n + pr.k), 2.0 * t * pr.n * pr.k);
      }
    }
  }
  {  // norms, attention, indexer, top-k
    const int64_t t = 4096;
    DeviceTensor x = filled(DType::kF32, {t, d}), w = filled(DType::kF32, {d}), y(gpu(), DType::kF32, {t, d});
    report("rms_norm T=4096 D=4096", time_ms([&] { gpu().rms_norm({x, w, y, 1e-6f}); }), 8.0 * t * d, 3.0 * t * d);
  }
  for (int64_t t : {1, 64}) {  // decode-like attention: 64 heads, hd 512, window 128 + 2048 compressed
    const int64_t h = 64, hd = 512, s = 128, n = 2048;
    HostTensor qpos(DType::kI64, {t}), kvpos(DType::kI64, {s});
    for (int64_t i = 0; i < t; ++i) qpos.data<int64_t>()[i] = 100000 + i;
    for (int64_t i = 0; i < s; ++i) kvpos.data<int64_t>()[i] = 100000 - s + i + t;
    DeviceTensor q = filled(DType::kF32, {t, h, hd}), kv = filled(DType::kF32, {s, hd}),
                 comp = filled(DType::kF32, {n, hd});
    DeviceTensor sinks = filled(DType::kF32, {h}), out(gpu(), DType::kF32, {t, h, hd}), dq = up(qpos), dk = up(kvpos);
    const double bytes = 4.0 * (2 * t * h * hd + (s + n) * hd), fl = 4.0 * t * h * (s + n) * hd;
    report("sink_attention T=" + std::to_string(t) + " H=64 hd=512 S=128 N=2048", time_ms([&] {
             gpu().sink_attention({q, dq, kv, dk, comp, Tensor{}, sinks, out, 128, 0.04f});
           }),
           bytes, fl);
  }
  for (int64_t b : {1, 16, 128}) {  // paged decode attention: b sequences, 64 heads, hd 512, window 128 + 512 entries
    const int64_t h = 64, hd = 512, k = 512;
    const std::unique_ptr<PagedDecode> pd = paged_decode(b, 8192);
    const double bytes = 4.0 * (2 * b * h * hd + b * (128 + k) * hd), fl = 4.0 * b * h * (128 + k) * hd;
    report("paged_sink_attention B=" + std::to_string(b) + " H=64 hd=512 window 128 + 512 sel",
           time_ms([&] { gpu().paged_sink_attention(pd->params); }), bytes, fl);
  }
  // MLA absorbed, V3 dims: decode (T=1, 8) of one sequence of 4096 cached tokens, and a causal prefill chunk of
  // 1024 tokens (T = S; the CUDA naive form runs the absorbed kernel).
  for (auto [t, s] : {std::pair<int64_t, int64_t>{1, 4096}, {8, 4096}, {1024, 1024}}) {
    const int64_t h = 128, dn = 128, dr = 64, r = 512, dv = 128;
    HostTensor qpos(DType::kI64, {t}), kvpos(DType::kI64, {s});
    for (int64_t i = 0; i < t; ++i) qpos.data<int64_t>()[i] = s - t + i;
    for (int64_t i = 0; i < s; ++i) kvpos.data<int64_t>()[i] = i;
    DeviceTensor q = filled(DType::kF32, {t, h, dn + dr}), kv = filled(DType::kF32, {s, r + dr});
    DeviceTensor kvb = filled(DType::kF32, {h * (dn + dv), r}), out(gpu(), DType::kF32, {t, h, dv});
    DeviceTensor dq = up(qpos), dk = up(kvpos);
    const double bytes = 4.0 * (s * (r + dr) + h * (dn + dv) * r + t * h * (dn + dr + dv));
    // Causal: query i sees s - t + 1 + i keys, so the mean is s - (t - 1) / 2.
    const double fl = 2.0 * t * h * ((s - (t - 1) / 2.0) * (r + dr + r) + (dn + dv) * r);
    report("mla_attention_absorbed V3 T=" + std::to_string(t) + " H=128 S=" + std::to_string(s) + " (f32 kv_b 64 MB)",
           time_ms([&] {
             gpu().mla_attention_absorbed({q, dq, kv, dk, kvb, out, static_cast<int>(dr), 0.07f});
           }),
           bytes, fl);
  }
  {
    const int64_t t = 64, ih = 64, id = 128, n = 16384;
    HostTensor pos(DType::kI64, {t});
    for (int64_t i = 0; i < t; ++i) pos.data<int64_t>()[i] = 4 * n;
    DeviceTensor q = filled(DType::kF32, {t, ih, id}), keys = filled(DType::kF32, {n, id}),
                 w = filled(DType::kF32, {t, ih});
    DeviceTensor dp = up(pos), out(gpu(), DType::kF32, {t, n}), mask(gpu(), DType::kU8, {t, n});
    report("indexer_scores T=64 IH=64 Id=128 N=16384", time_ms([&] {
             gpu().indexer_scores({q, keys, w, dp, out, 4, 0.088f, 0.125f});
           }),
           4.0 * (n * id + t * n), 2.0 * t * ih * n * id);
    report("topk_mask T=64 N=16384 k=512", time_ms([&] {
             gpu().topk_mask({out, Tensor{}, mask, 512});
           }),
           5.0 * t * n, 0);
  }
}

// Prefill attention on V4-Flash shapes (issue #7): a chunk of 2048 queries at the end of an 8192-token sequence,
// 64 heads of 512, window 128 plus 512 ratio-4 selections (the CSA layers) or the window alone (the SWA layers),
// with the tensor-core kernel (the default for >= 128 tokens) and with attn_mma kNever (the SIMT kernel):
// a same-run A/B. Keys generic f32 (V4: no KV fake-quant) and bf16-exact (V4.1: FP8 window / FP4 compressed KV).
// TFLOP/s count the useful products once (S and O over 64 x 512 per key); mma and SIMT results must agree to the
// mma kernel's 2e-5.
TEST_F(CudaBench, DISABLED_PrefillAttentionTimings) {
  const int64_t t = 2048, h = 64, hd = 512, ctx = 8192, bs = 64, nb = ctx / bs, window = 128;
  std::vector<int32_t> ids(nb), seqs(t, 0);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng());
  std::vector<int64_t> pos(t), begin(1, 0);
  for (int64_t i = 0; i < t; ++i) pos[i] = ctx - t + i;
  auto upv = [&](DType dt, Shape shape, const void* src) {
    HostTensor ht(dt, shape);
    std::memcpy(ht.view().data(), src, ht.view().nbytes());
    return up(ht);
  };
  DeviceTensor q = filled(DType::kF32, {t, h, hd}), win = filled(DType::kF32, {nb * bs, hd});
  DeviceTensor comp = filled(DType::kF32, {nb * bs / 4, hd}), sinks = filled(DType::kF32, {h});
  DeviceTensor win_x = filled(DType::kF32, {nb * bs, hd}, false, false, true);
  DeviceTensor comp_x = filled(DType::kF32, {nb * bs / 4, hd}, false, false, true);
  DeviceTensor out_mma(gpu(), DType::kF32, {t, h, hd}), out_simt(gpu(), DType::kF32, {t, h, hd});
  DeviceTensor dpos = upv(DType::kI64, {t}, pos.data()), dseq = upv(DType::kI32, {t}, seqs.data());
  DeviceTensor dtab = upv(DType::kI32, {1, nb}, ids.data()), dbeg = upv(DType::kI64, {1}, begin.data());
  for (const int64_t k : {int64_t{512}, int64_t{0}}) {
    std::vector<int32_t> sel(t * std::max<int64_t>(k, 1), -1);
    for (int64_t i = 0; i < t && k > 0; ++i) {
      const int64_t vis = (pos[i] + 1) / 4;  // closed ratio-4 groups, spread over as the indexer might pick them
      for (int64_t j = 0; j < k; ++j) sel[i * k + j] = static_cast<int32_t>(j * vis / k);
    }
    DeviceTensor dsel = upv(DType::kI32, {t, std::max<int64_t>(k, 1)}, sel.data());
    PagedSinkAttentionParams ap;
    ap.q = q;
    ap.q_positions = dpos;
    ap.q_seq = dseq;
    ap.block_tables = dtab;
    ap.window_begin = dbeg;
    if (k > 0) ap.comp_idx = dsel;
    ap.sinks = sinks;
    ap.block_size = static_cast<int>(bs);
    ap.comp_ratio = 4;
    ap.window = window;
    ap.scale = 0.044f;
    const double bytes = 4.0 * (2 * t * h * hd + (window + k) * hd), fl = 4.0 * t * h * (window + k) * hd;
    for (const bool exact : {false, true}) {
      ap.window_pool = exact ? win_x : win;
      if (k > 0) ap.comp_pool = exact ? comp_x : comp;
      const std::string shape =
          "attn prefill T=2048 H=64 hd=512 win 128 + " + std::to_string(k) + (exact ? " keys bf16-exact" : " keys f32");
      const struct {
        cuda::KernelPick mma;
        const char* label;
        DeviceTensor* out;
      } runs[] = {{cuda::KernelPick::kAuto, " mma", &out_mma}, {cuda::KernelPick::kNever, " simt", &out_simt}};
      for (const auto& r : runs) {
        ScopedKernelChoices choice(gpu(), [&](cuda::KernelChoices& c) { c.attn_mma = r.mma; });
        ap.out = *r.out;
        report(shape + r.label, time_ms([&] { gpu().paged_sink_attention(ap); }), bytes, fl);
      }
      rel_err(("mma vs simt, " + shape).c_str(), down(out_mma), down(out_simt), 2e-5);
    }
  }
}

// Prefill indexer on V4-Flash and V4.1-Flash shapes: 8192 queries at positions 0..8191 (a whole 8k prompt in one
// call) scoring every entry they can see, with the tensor-core kernel (the default for >= 64 tokens) and with
// indexer_mma kNever (the SIMT kernel): a same-run A/B. V4: 64 heads x 128, ratio 4 (2048 entries), fp32
// queries and keys (the split path, 3 mmas a product); V4.1: 32 x 128 at ratio 2 (4096 entries) and ratio 1
// (layer 20, 8192 entries) on bf16-exact data as its FP4-quantized queries and keys are (1 mma a product).
// TFLOP/s count the useful products once (2·heads·dim per visible (token, entry)). Then the selection that
// follows at the same shapes: topk_mask (top 512) and V4.1's candidate_blocks (blocks of 8, top 2048), each with
// the prefill block shapes and with topk_small_blocks kNever (1024-thread blocks), to see whether it matters once
// the scores are fast. Last, chunks of 16-2048 queries at the end of the context, for the token threshold.
TEST_F(CudaBench, DISABLED_PrefillIndexerTimings) {
  struct Shape {
    const char* name;
    int64_t ih, n;
    int ratio;
    bool exact;
  };
  const int64_t t = 8192, id = 128;
  const Shape shapes[] = {{"V4 IH=64 N=2048 r=4 fp32", 64, 2048, 4, false},
                          {"V4.1 IH=32 N=4096 r=2 bf16-exact", 32, 4096, 2, true},
                          {"V4.1 IH=32 N=8192 r=1 bf16-exact", 32, 8192, 1, true}};
  std::vector<int64_t> pos(t);
  std::iota(pos.begin(), pos.end(), 0);
  HostTensor hpos(DType::kI64, {t});
  std::copy(pos.begin(), pos.end(), hpos.data<int64_t>());
  const DeviceTensor dpos = up(hpos);
  for (const Shape& sh : shapes) {
    DeviceTensor q = filled(DType::kF32, {t, sh.ih, id}, false, false, sh.exact);
    DeviceTensor keys = filled(DType::kF32, {sh.n, id}, false, false, sh.exact), w = filled(DType::kF32, {t, sh.ih});
    DeviceTensor out_mma(gpu(), DType::kF32, {t, sh.n}), out_simt(gpu(), DType::kF32, {t, sh.n});
    double visible = 0;
    for (int64_t i = 0; i < t; ++i) visible += static_cast<double>(std::min<int64_t>(sh.n, (pos[i] + 1) / sh.ratio));
    const double fl = 2.0 * sh.ih * id * visible, bytes = 4.0 * (t * sh.ih * id + sh.n * id + t * sh.ih + t * sh.n);
    const float score_scale = 1.0f / std::sqrt(static_cast<float>(id));
    const float weight_scale = 1.0f / std::sqrt(static_cast<float>(sh.ih));
    const std::string shape = std::string("indexer_scores prefill T=8192 ") + sh.name;
    for (const bool mma : {true, false}) {
      ScopedKernelChoices choice(gpu(), [&](cuda::KernelChoices& c) {
        c.indexer_mma = mma ? cuda::KernelPick::kAuto : cuda::KernelPick::kNever;
      });
      const DeviceTensor& out = mma ? out_mma : out_simt;
      report(shape + (mma ? " mma" : " simt"), time_ms([&] {
               gpu().indexer_scores({q, keys, w, dpos, out, sh.ratio, score_scale, weight_scale});
             }),
             bytes, fl);
    }
    rel_err(("mma vs simt, " + shape).c_str(), down(out_mma), down(out_simt), sh.exact ? 2e-6 : 2e-5);
    // The selection after it, with the prefill block shapes (the default at >= 512 rows) and with
    // topk_small_blocks kNever (1024-thread blocks, the decode shape).
    DeviceTensor mask(gpu(), DType::kU8, {t, sh.n}), keep(gpu(), DType::kU8, {t, sh.n});
    for (const bool rows_form : {true, false}) {
      ScopedKernelChoices choice(gpu(), [&](cuda::KernelChoices& c) {
        c.topk_small_blocks = rows_form ? cuda::KernelPick::kAuto : cuda::KernelPick::kNever;
      });
      const std::string form = rows_form ? " rows-form" : " 1024-thread";
      report("topk_mask prefill T=8192 N=" + std::to_string(sh.n) + " k=512" + form, time_ms([&] {
               gpu().topk_mask({out_mma, Tensor{}, mask, 512});
             }),
             5.0 * t * sh.n, 0);
      if (sh.ratio == 1) {
        report("candidate_blocks prefill T=8192 N=8192 bs=8 top 2048" + form, time_ms([&] {
                 gpu().candidate_blocks({out_mma, dpos, keep, sh.ratio, 2048, 8});
               }),
               5.0 * t * sh.n, 0);
        report("topk_mask prefill T=8192 N=8192 k=512 allowed" + form, time_ms([&] {
                 gpu().topk_mask({out_mma, keep, mask, 512});
               }),
               6.0 * t * sh.n, 0);
      }
    }
  }
  // Chunks at the end of the 8192-token context (chunked prefill; where kIndexerMmaMinTokens should sit): V4's
  // shape, T queries at positions 8192 - T .. 8191 over all 2048 entries, mma (kAlways: below the threshold too)
  // against SIMT.
  {
    const int64_t ih = 64, n = 2048;
    DeviceTensor keys = filled(DType::kF32, {n, id});
    for (const int64_t tc : {int64_t{16}, int64_t{64}, int64_t{128}, int64_t{512}, int64_t{2048}}) {
      HostTensor cpos(DType::kI64, {tc});
      double vis = 0;
      for (int64_t i = 0; i < tc; ++i) {
        cpos.data<int64_t>()[i] = t - tc + i;
        vis += static_cast<double>(std::min<int64_t>(n, (t - tc + i + 1) / 4));
      }
      const DeviceTensor dcpos = up(cpos);
      DeviceTensor q = filled(DType::kF32, {tc, ih, id}), w = filled(DType::kF32, {tc, ih});
      DeviceTensor out(gpu(), DType::kF32, {tc, n});
      const double fl = 2.0 * ih * id * vis, bytes = 4.0 * (tc * ih * id + n * id + tc * ih + tc * n);
      for (const bool mma : {true, false}) {
        ScopedKernelChoices choice(gpu(), [&](cuda::KernelChoices& c) {
          c.indexer_mma = mma ? cuda::KernelPick::kAlways : cuda::KernelPick::kNever;
        });
        report("indexer_scores chunk T=" + std::to_string(tc) + " V4 N=2048" + (mma ? " mma" : " simt"), time_ms([&] {
                 gpu().indexer_scores({q, keys, w, dcpos, out, 4, 0.088f, 0.125f});
               }),
               bytes, fl);
      }
    }
  }
}

// Decode GEMMs on V4.1-Flash shapes (issue #7): the dense FP8 projections (128x128 UE8M0 blocks) at 1-4 rows and
// the MoE layer (384 MXFP4 experts D=5120 I=2304, top-6, + the FP8 shared expert) at 1-64 tokens, each with the
// tensor-core streaming kernel allowed up to 8 / 4 rows per weight and with it off (the fp32 column-group kernel):
// a same-run A/B through GemmChoices::stream_mma_max_rows. Weights rotate over enough copies
// (dense) or expert selections (MoE) that each call reads them from HBM, not from the 50 MB L2.
TEST_F(CudaBench, DISABLED_DecodeGemmTimings) {
  struct Mode {
    const char* name;
    int64_t rows;
  };
  const Mode modes[] = {
      {"stream-mma<=8", 8}, {"stream-mma<=4", 4}, {"fp32 stream", 0}, {"stream-mma<=8 (again, last)", 8}};
  const auto set_mode = [&](const Mode& md) {
    cuda::KernelChoices c;
    c.gemm.stream_mma_max_rows = md.rows;
    gpu().set_kernel_choices(c);
  };
  for (const Proj& pr : {Proj{"q_a", 1280, 5120}, Proj{"kv", 512, 5120}, Proj{"o_a group", 1024, 4096},
                         Proj{"o_b", 5120, 8192}, Proj{"q_b", 32768, 1280}})
    time_fp8_proj(pr, {1, 2, 4, 8}, modes, set_mode);
  {
    const std::unique_ptr<V41Moe> moe = v41_moe();
    for (int64_t t : {1, 8, 32, 64}) {
      const V41MoeCall call = v41_moe_call(t, 384);
      for (const Mode& md : modes) {
        set_mode(md);
        report("V4.1 moe_quant mxfp4 E=384 k=6 +fp8 shared T=" + std::to_string(t) + " " + md.name,
               time_v41_moe(*moe, call, 16), call.bytes, call.flops);
      }
    }
  }
  gpu().set_kernel_choices({});
}

// Dense FP8 projections of V4-Flash at decode batches 16-64 (issue #7): the rows kernel (gemm_rows_mma.h, rows_mma =
// always; from the f32 rows and from a bf16 copy) against the path it replaced (rows_mma
// = never: the dequantized bf16 scratch for cuBLASLt, or the wgmma tiles where they fill the device), a same-run A/B;
// weights rotate so each call reads them from HBM.
TEST_F(CudaBench, DISABLED_DecodeRowsGemmTimings) {
  struct Mode {
    const char* name;
    cuda::KernelPick pick;
    bool bf16_a;
  };
  const Mode modes[] = {{"rows", cuda::KernelPick::kAlways, false},
                        {"rows bf16 A", cuda::KernelPick::kAlways, true},
                        {"rows never", cuda::KernelPick::kNever, false},
                        {"rows (again, last)", cuda::KernelPick::kAlways, false}};
  const auto set_mode = [&](const Mode& md) {
    cuda::KernelChoices c;
    c.gemm.rows_mma = md.pick;
    c.gemm.rows_mma_bf16_a = md.bf16_a;
    gpu().set_kernel_choices(c);
  };
  for (const Proj& pr :
       {Proj{"q_a", 1024, 4096}, Proj{"kv", 512, 4096}, Proj{"q_b", 32768, 1024}, Proj{"o_a group", 1024, 4096},
        Proj{"o_b", 4096, 8192}, Proj{"shared gate", 2048, 4096}, Proj{"shared down", 4096, 2048}})
    time_fp8_proj(pr, {16, 32, 64}, modes, set_mode);
  gpu().set_kernel_choices({});
}

// The rows kernel's launch shape (issue #7: it is latency-bound at 16-64 rows, docs/PERF.md sessions 22-23): chosen
// shapes (warps a block 4 / 8 / 16, warps along K 1 / 2, cluster splits 1-8, blocks staging A together along N 1-4:
// "nS") against its rule, the rule from a bf16 copy of A (the staging reads half the bytes), and the path it
// replaced, on V4-Flash's FP8 projections at 16 / 32 / 64 rows; weights rotate so each call reads them from HBM. A
// [sweep] line a projection and row count names the fastest shape.
TEST_F(CudaBench, DISABLED_RowsGemmShapeSweep) {
  const int sms = gpu().device_info().sm_count;
  for (const Proj& pr :
       {Proj{"q_a", 1024, 4096}, Proj{"kv", 512, 4096}, Proj{"q_b", 32768, 1024}, Proj{"o_a group", 1024, 4096},
        Proj{"o_b", 4096, 8192}, Proj{"shared gate", 2048, 4096}, Proj{"shared down", 4096, 2048}}) {
    const RotatingFp8 wr = rotating_fp8(pr.n, pr.k);
    for (int64_t m : {16, 32, 64}) {
      DeviceTensor x = filled(DType::kF32, {m, pr.k}), y(gpu(), DType::kF32, {m, pr.n});
      const std::string what = std::string("fp8 ") + pr.name + " N=" + std::to_string(pr.n) +
                               " K=" + std::to_string(pr.k) + " M=" + std::to_string(m);
      const auto time_with = [&](const cuda::KernelChoices& c, const std::string& label) {
        gpu().set_kernel_choices(c);
        const double ms = time_rotating(wr, x, y);
        report(what + " " + label, ms, wr.bytes + 4.0 * m * (pr.n + pr.k), 2.0 * m * pr.n * pr.k);
        return ms;
      };
      cuda::KernelChoices c;
      c.gemm.rows_mma = cuda::KernelPick::kAlways;
      const cuda::RowsMmaShape rule = cuda::gemm_rows_mma_shape(QuantFormat::kFP8Block, pr.n, pr.k, m, sms);
      const auto shape_name = [](int warps, int kw, int splits, int share) {
        return "w" + std::to_string(warps) + " kw" + std::to_string(kw) + " s" + std::to_string(splits) +
               (share > 1 ? " n" + std::to_string(share) : "");
      };
      const std::string rule_name = shape_name(rule.warps, rule.kw, rule.splits, rule.share);
      const double t_rule = time_with(c, "rule (" + rule_name + ")");
      c.gemm.rows_mma_bf16_a = true;
      const double t_bf16 = time_with(c, "rule, bf16 A");
      c.gemm.rows_mma_bf16_a = false;
      cuda::KernelChoices never;
      never.gemm.rows_mma = cuda::KernelPick::kNever;
      const double t_never = time_with(never, "never");
      double best = t_rule;
      std::string best_name = rule_name + " (the rule)";
      for (int warps : {4, 8, 16})
        for (int kw : {1, 2})
          for (int splits : {1, 2, 4, 8})
            for (int share : {1, 2, 4}) {
              if (kw > warps || share * splits > 8 || (share > 1 && kw > 1)) continue;
              c.gemm.rows_mma_warps = warps;
              c.gemm.rows_mma_kw = kw;
              c.gemm.rows_mma_splits = splits;
              c.gemm.rows_mma_share = share;
              const cuda::RowsMmaShape sh =
                  cuda::gemm_rows_mma_shape(QuantFormat::kFP8Block, pr.n, pr.k, m, sms, c.gemm);
              const std::string name = shape_name(warps, kw, splits, share);
              if (!cuda::gemm_rows_mma_takes(QuantFormat::kFP8Block, true, 128, 128, pr.n, pr.k, m, c.gemm)) {
                std::printf("[bench] %s %s: declined (%zu bytes of shared memory)\n", what.c_str(), name.c_str(),
                            sh.smem);
                continue;
              }
              const double ms = time_with(c, name);
              if (ms < best) {
                best = ms;
                best_name = name;
              }
            }
      std::printf("[sweep] %-40s best %-14s %7.1f us; rule %s %7.1f us, bf16 A %7.1f us; never %7.1f us\n",
                  what.c_str(), best_name.c_str(), best * 1e3, rule_name.c_str(), t_rule * 1e3, t_bf16 * 1e3,
                  t_never * 1e3);
      std::fflush(stdout);
    }
  }
  gpu().set_kernel_choices({});
}

// The V4.1 MoE layer at decode batches 64-256 (issue #7: batch 128-256 at >= 60% of the binding ceiling; every expert
// is used, ~4 rows each at 256), default kernels.
TEST_F(CudaBench, DISABLED_DecodeMoeLargeBatchTimings) {
  const std::unique_ptr<V41Moe> moe = v41_moe();
  for (int64_t t : {64, 128, 256}) {
    const V41MoeCall call = v41_moe_call(t, 384);
    report("V4.1 moe_quant mxfp4 E=384 k=6 +fp8 shared T=" + std::to_string(t), time_v41_moe(*moe, call, 8), call.bytes,
           call.flops);
  }
}

// Is the batch-1 MoE bound by address translation? The same V4.1 MoE op (6 of 384 experts + shared, default kernels)
// with the 16 rotating selections drawn from the first `pool` experts only: from 24 on, the selections' experts
// (~450 MB at 24) miss the 50 MB L2 either way, so a slowdown from 24 to 384 experts (7.2 GB of weights) is the
// cost of touching more distinct pages (TLB reach), not of HBM bandwidth.
TEST_F(CudaBench, DISABLED_MoeExpertSpreadTimings) {
  const std::unique_ptr<V41Moe> moe = v41_moe();
  for (int64_t t : {1, 8}) {
    for (int64_t pool : {24, 96, 384, 24}) {
      const V41MoeCall call = v41_moe_call(t, pool);
      report("V4.1 moe_quant T=" + std::to_string(t) + " experts drawn from the first " + std::to_string(pool),
             time_v41_moe(*moe, call, 32), call.bytes, call.flops);
    }
  }
}

// Batch-invariant GEMMs (issue #7), two modes in the same run: the default mode's kernels and batch-invariant mode
// (gpu().set_batch_invariant: the tensor-core sequence of gemm_invariant_mma.h for these UE8M0 formats). FP8 128x128
// UE8M0 projections at V4-Flash shapes and the V4.1 MXFP4 routed experts (E=384, k=6,
// + FP8 shared expert) at 1-8 rows / tokens (decode) and 64-4096 (prefill); weights rotate over copies (dense) or
// expert selections (MoE) so each call reads them from HBM. Bytes as in DecodeGemmTimings. An fp32 chain is K
// dependent FMAs, so the floor line gives 4 cycles x K at the device clock.
TEST_F(CudaBench, DISABLED_BatchInvariantDecodeTimings) {
  int clock_khz = 0;
  DI_CUDA_CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
  auto floor_ms = [&](int64_t k) { return 4.0 * k / (clock_khz * 1e3) * 1e3; };
  struct Mode {
    const char* name;
    bool invariant;
  };
  const Mode modes[] = {{"default", false}, {"batch-invariant", true}};
  auto set_mode = [&](const Mode& md) { gpu().set_batch_invariant(md.invariant); };
  for (const Proj& pr :
       {Proj{"q_a", 1280, 5120}, Proj{"kv", 512, 5120}, Proj{"o_a group", 1024, 4096}, Proj{"o_b", 5120, 8192}}) {
    std::printf("[bench] chain floor K=%lld: 4 cycles x K at %.0f MHz = %.4f ms\n", static_cast<long long>(pr.k),
                clock_khz / 1e3, floor_ms(pr.k));
    time_fp8_proj(pr, {1, 2, 4, 8, 64, 512, 4096}, modes, set_mode);
  }
  {
    const int64_t d = 5120, inter = 2304;
    std::printf("[bench] chain floor experts K=%lld + K=%lld: %.4f ms\n", static_cast<long long>(d),
                static_cast<long long>(inter), floor_ms(d) + floor_ms(inter));
    const std::unique_ptr<V41Moe> moe = v41_moe();
    for (int64_t t : {1, 2, 4, 8, 512, 4096}) {
      const V41MoeCall call = v41_moe_call(t, 384);
      for (const Mode& md : modes) {
        set_mode(md);
        report("V4.1 moe_quant mxfp4 E=384 k=6 +fp8 shared T=" + std::to_string(t) + " " + md.name,
               time_v41_moe(*moe, call, t >= 512 ? 4 : 16), call.bytes, call.flops);
      }
    }
  }
  set_mode(modes[0]);
}

// The small latency-bound selection kernels at decode shapes (issue #7): one row per call, so the figure is the
// kernel's latency plus the gap between back-to-back launches on the stream (ncu gives the kernel alone).
// router includes its x·Wᵀ GEMM (cuBLASLt) before router_select; moe_plan runs the kernel directly.
TEST_F(CudaBench, DISABLED_SmallSelectTimings) {
  auto us = [](const std::string& what, double ms) {
    std::printf("[bench] %-52s %9.2f us/call\n", what.c_str(), ms * 1e3);
    std::fflush(stdout);
  };
  for (int64_t n : {int64_t{1024}, int64_t{4096}, int64_t{16384}, int64_t{65536}}) {
    for (int64_t t : {int64_t{1}, int64_t{64}}) {
      HostTensor pos(DType::kI64, {t});
      for (int64_t i = 0; i < t; ++i) pos.data<int64_t>()[i] = 4 * n - 1;
      DeviceTensor s = filled(DType::kF32, {t, n}), mask(gpu(), DType::kU8, {t, n}), dp = up(pos);
      us("topk_mask T=" + std::to_string(t) + " N=" + std::to_string(n) + " k=512", time_ms([&] {
           gpu().topk_mask({s, Tensor{}, mask, 512});
         }));
      us("candidate_blocks T=" + std::to_string(t) + " N=" + std::to_string(n) + " bs=64 top=32", time_ms([&] {
           gpu().candidate_blocks({s, dp, mask, 4, 32, 64});
         }));
    }
  }
  for (int64_t e : {int64_t{256}, int64_t{384}}) {
    for (int64_t t : {int64_t{1}, int64_t{64}, int64_t{256}}) {
      const int64_t d = 4096, k = 6;
      DeviceTensor x = filled(DType::kF32, {t, d}), w = filled(DType::kF32, {e, d}), b = filled(DType::kF32, {e});
      DeviceTensor ww(gpu(), DType::kF32, {t, k}), wi(gpu(), DType::kI32, {t, k});
      us("router sqrt-softplus+bias E=" + std::to_string(e) + " T=" + std::to_string(t) + " k=6 (with GEMM)",
         time_ms([&] {
           gpu().router({x, w, b, Tensor{}, Tensor{}, ww, wi, RouterScoring::kSqrtSoftplus, 1.0f, 2.5f, true});
         }));
      HostTensor ids(DType::kI32, {t * k});
      for (int64_t i = 0; i < t * k; ++i) ids.data<int32_t>()[i] = static_cast<int32_t>((i * 37) % e);
      DeviceTensor di = up(ids), perm(gpu(), DType::kI32, {t * k}), go(gpu(), DType::kI32, {e + 1}),
                   to(gpu(), DType::kI32, {e + 1}), ag(gpu(), DType::kI32, {e + 1}), st(gpu(), DType::kI32, {1});
      cuda::MoePlanKernelParams p;
      p.indices = static_cast<const int32_t*>(di.data());
      p.slots = t * k;
      p.experts = static_cast<int>(e);
      p.perm = static_cast<int32_t*>(perm.data());
      p.group_offsets = static_cast<int32_t*>(go.data());
      p.tile_offsets = static_cast<int32_t*>(to.data());
      p.active_groups = static_cast<int32_t*>(ag.data());
      p.status = static_cast<uint32_t*>(st.data());
      us("moe_plan E=" + std::to_string(e) + " T=" + std::to_string(t) + " k=6",
         time_ms([&] { cuda::run_moe_plan(p, gpu().stream()); }));
    }
  }
}

// The decode indexer of one CSA layer at V4-Flash's shape (64 heads x 128, ratio 4, top 512) for 64 sequences of
// `ctx` tokens, pages of 64 tokens (16 entries) in shuffled order: the batched path (paged_indexer_scores reading the
// pages, one topk_mask over [64, n]) against the per-sequence path it replaced (each sequence's keys gathered out of
// its pages run by run, then indexer_scores and topk_mask of one row). Both figures include the launch gaps.
TEST_F(CudaBench, DISABLED_DecodeIndexerTimings) {
  const int64_t B = 64, IH = 64, Id = 128, r = 4, bs = 64, per_block = bs / r;
  TensorMemory& mem = gpu().memory();
  for (int64_t ctx : {int64_t{1024}, int64_t{4096}, int64_t{16384}}) {
    const int64_t n = ctx / r, blocks = ctx / bs + 1;
    std::vector<int32_t> ids(B * blocks);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng());
    HostTensor tables(DType::kI32, {B, blocks}), pos(DType::kI64, {B}), seq(DType::kI32, {B}), cnt(DType::kI64, {B});
    std::copy(ids.begin(), ids.end(), tables.data<int32_t>());
    for (int64_t b = 0; b < B; ++b) {
      pos.data<int64_t>()[b] = ctx;
      seq.data<int32_t>()[b] = static_cast<int32_t>(b);
      cnt.data<int64_t>()[b] = n;
    }
    DeviceTensor pool = filled(DType::kF32, {B * blocks * per_block, Id}), q = filled(DType::kF32, {B, IH, Id});
    DeviceTensor w = filled(DType::kF32, {B, IH}), dt = up(tables), dp = up(pos), ds = up(seq), dn = up(cnt);
    DeviceTensor scores(gpu(), DType::kF32, {B, n}), mask(gpu(), DType::kU8, {B, n});
    const float score_scale = 1.0f / std::sqrt(static_cast<float>(Id)), weight_scale = 0.125f;
    const double batched = time_ms([&] {
      PagedIndexerScoreParams p;
      p.q = q;
      p.weights = w;
      p.positions = dp;
      p.q_seq = ds;
      p.n_entries = dn;
      p.block_tables = dt;
      p.key_pool = pool;
      p.out = scores;
      p.block_size = static_cast<int>(bs);
      p.key_ratio = static_cast<int>(r);
      p.ratio = static_cast<int>(r);
      p.score_scale = score_scale;
      p.weight_scale = weight_scale;
      gpu().paged_indexer_scores(p);
      gpu().topk_mask({scores, Tensor{}, mask, 512});
    });
    DeviceTensor keys(gpu(), DType::kF32, {n, Id}), s1(gpu(), DType::kF32, {1, n}), m1(gpu(), DType::kU8, {1, n});
    const double per_sequence = time_ms([&] {
      for (int64_t b = 0; b < B; ++b) {
        for (int64_t j = 0; j * per_block < n; ++j) {
          const int64_t id = ids[b * blocks + j], len = std::min(per_block, n - j * per_block);
          mem.copy(keys.view().slice(j * per_block, j * per_block + len),
                   pool.view().slice(id * per_block, id * per_block + len));
        }
        gpu().indexer_scores({q.view().slice(b, b + 1), keys, w.view().slice(b, b + 1), dp.view().slice(b, b + 1), s1,
                              static_cast<int>(r), score_scale, weight_scale});
        gpu().topk_mask({s1, Tensor{}, m1, 512});
      }
    });
    std::printf("[bench] decode indexer B=64 ctx=%-6lld batched %8.3f ms, per-sequence %8.3f ms (%.1fx)\n",
                static_cast<long long>(ctx), batched, per_sequence, per_sequence / batched);
    std::fflush(stdout);
  }
}

// The small decode kernels at V4.1-Flash dims (D = 5120, hc = 4, 64 heads x 512, window 128 + 512 selected over a
// 4096-token context, indexer 64 x 128 over 1024 entries, 384 experts top-6, rope 64 of 512) at batch 1 / 16 / 64.
// (Against the previous kernels through A/B switches until sessions 17 / 19.) Each figure is one call of a CUDA graph
// of 20 back-to-back calls (launch overhead amortised as in the decode step's graphs; L2 warm, unlike ncu's flushed
// runs), median of 20 replays. The mHC ops at a V4-Flash (D = 4096) and V4.1-Flash (D = 5120) prefill of 8192 tokens,
// hc = 4; bytes are the HBM traffic the op cannot avoid (streams read once, expand's streams written once, the split-K
// partials written and read once), so TB/s against the copy rate is how far from the floor it is.
TEST_F(CudaBench, DISABLED_PrefillHcTimings) {
  const int64_t t = 8192, hc = 4, mix = (2 + hc) * hc;
  for (int64_t d : {int64_t{4096}, int64_t{5120}}) {
    const std::string sh = " hc=4 D=" + std::to_string(d) + " T=8192";
    const double stream_bytes = 4.0 * t * hc * d, splits = static_cast<double>(cuda::hc_mix_splits(hc, d));
    DeviceTensor streams = filled(DType::kF32, {t, hc, d}), fn = filled(DType::kF32, {mix, hc * d});
    DeviceTensor base = filled(DType::kF32, {mix}), scale = filled(DType::kF32, {3}), y = filled(DType::kF32, {t, d});
    DeviceTensor post = filled(DType::kF32, {t, hc}), comb = filled(DType::kF32, {t, hc, hc});
    DeviceTensor pre(gpu(), DType::kF32, {t, hc}), mpost(gpu(), DType::kF32, {t, hc});
    DeviceTensor mcomb(gpu(), DType::kF32, {t, hc, hc}), out(gpu(), DType::kF32, {t, d});
    DeviceTensor hfn = filled(DType::kF32, {hc, hc * d}), hbase = filled(DType::kF32, {hc});
    DeviceTensor hscale = filled(DType::kF32, {1}), w = filled(DType::kF32, {d});
    const auto mix_call = [&] { gpu().hc_mix({streams, fn, base, scale, pre, mpost, mcomb}); };
    const auto head_call = [&] { gpu().hc_head({streams, hfn, hbase, hscale, pre}); };
    const double mix_bytes = stream_bytes + 2 * 4.0 * splits * t * (mix + 1);
    const double head_bytes = stream_bytes + 2 * 4.0 * splits * t * (hc + 1);
    report("hc_mix" + sh, time_ms(mix_call), mix_bytes, 0);
    report("hc_head" + sh, time_ms(head_call), head_bytes, 0);
    report("hc_expand" + sh, time_ms([&] {
             gpu().hc_expand({streams, y, post, comb});
           }),
           2 * stream_bytes + 4.0 * t * d, 0);
    report("hc_collapse_norm" + sh, time_ms([&] {
             gpu().hc_collapse_norm({streams, pre, w, out, 1e-6f});
           }),
           stream_bytes + 4.0 * t * d, 0);
  }
  // The routed experts' SwiGLU of a V4-Flash prefill chunk (8192 tokens x 6 slots, I = 2048) with its bf16 copy: one
  // pass (gu read, h and h16 written) against SwiGLU then the cast (which reads h back); each with its own bytes.
  {
    const int64_t rows = 8192 * 6, inter = 2048;
    DeviceTensor gu = filled(DType::kF32, {rows, 2 * inter}), h(gpu(), DType::kF32, {rows, inter});
    DeviceTensor h16(gpu(), DType::kBF16, {rows, inter});
    cuda::SwigluKernelParams sp;
    sp.gu = static_cast<const float*>(gu.data());
    sp.h = static_cast<float*>(h.data());
    sp.rows = rows;
    sp.inter = inter;
    sp.limit = 10.0f;
    const double n = static_cast<double>(rows) * inter;
    report("swiglu+bf16 rows=49152 I=2048 one pass",
           time_ms([&] { cuda::run_swiglu_bf16(sp, h16.data(), gpu().stream()); }), n * (8 + 4 + 2), 0);
    // The cast alone (x's and the linears' bf16 copies), the same 50 M values.
    const auto cast = [&] { cuda::run_cast_f32_to_bf16(sp.h, h16.data(), rows * inter, gpu().stream()); };
    report("swiglu+bf16 rows=49152 I=2048 (two launches: swiglu, cast)", time_ms([&] {
             cuda::run_swiglu(sp, gpu().stream());
             cast();
           }),
           n * (8 + 4 + 4 + 2), 0);
    report("cast f32->bf16 n=49152x2048", time_ms(cast), n * (4 + 2), 0);
  }
}

// Prefill data moves of the V4 engine at 8192 tokens (ncu of the real-dimension engine prefill: the grouped output's
// copy into group-major order ran at 1.18 TB/s, the query head norm + RoPE at 1.05 TB/s): the strided copy in
// 16-byte units vs one element a thread (the same copy from a source 4 bytes off 16-byte alignment), and norm_rope
// over [8192, 64, 512] (warp-per-row kernel) vs rms_norm then rope.
TEST_F(CudaBench, DISABLED_PrefillLayoutTimings) {
  const int64_t t = 8192, groups = 8, gw = 4096, h = 64, hd = 512;
  {
    DeviceTensor heads = filled(DType::kF32, {t * groups * gw + 4}), og(gpu(), DType::kF32, {groups, t, gw});
    const auto copy_from = [&](int64_t offset) {
      gpu().memory().copy(og.view(), Tensor(static_cast<float*>(heads.data()) + offset, DType::kF32, {groups, t, gw},
                                            {gw, groups * gw, 1}, heads.view().device()));
    };
    const double bytes = 2 * 4.0 * t * groups * gw;
    report("strided copy [8192, 8x4096] -> group-major, 16-byte units", time_ms([&] { copy_from(0); }), bytes, 0);
    report("strided copy [8192, 8x4096] -> group-major, element path", time_ms([&] { copy_from(1); }), bytes, 0);
  }
  {
    DeviceTensor q = filled(DType::kF32, {t, h, hd}), pos(gpu(), DType::kI64, {t}), inv = filled(DType::kF32, {32});
    std::vector<int64_t> hp(t);
    for (int64_t i = 0; i < t; ++i) hp[i] = i;
    gpu().memory().copy(pos.view(), Tensor(hp.data(), DType::kI64, {t}));
    NormRopeParams p;
    p.parts[0] = {q.view(), Tensor{}, true, true};
    p.positions = pos.view();
    p.inv_freq = inv.view();
    p.eps = 1e-6f;
    const double bytes = 2 * 4.0 * t * h * hd;
    report("norm_rope q [8192, 64, 512] head norm + rope", time_ms([&] { gpu().norm_rope(p); }), bytes, 0);
    report("norm_rope q [8192, 64, 512] as rms_norm then rope", time_ms([&] {
             gpu().rms_norm({q.view().reshape({t * h, hd}), Tensor{}, q.view().reshape({t * h, hd}), 1e-6f});
             gpu().rope({q.view(), pos.view(), inv.view(), false});
           }),
           bytes + 2 * 4.0 * t * h * 64, 0);
  }
}

TEST_F(CudaBench, DISABLED_DecodeSmallOpTimings) {
  constexpr int kCalls = 20;
  auto graph_us = [&](const std::function<void()>& fn) {
    fn();  // eager first: plans, workspace
    gpu().synchronize();
    std::unique_ptr<CudaGraph> g = gpu().capture_graph([&] {
      for (int i = 0; i < kCalls; ++i) fn();
    });
    return time_ms([&] { g->replay(); }) * 1e3 / kCalls;
  };
  auto ab = [&](const std::string& what, const std::function<void()>& fn) {
    std::printf("[bench] %-58s %8.2f us/call\n", what.c_str(), graph_us(fn));
    std::fflush(stdout);
  };
  const int64_t d = 5120, hc = 4, mix = (2 + hc) * hc;
  for (int64_t t : {int64_t{1}, int64_t{16}, int64_t{64}}) {
    const std::string bt = " T=" + std::to_string(t);
    {  // mHC
      DeviceTensor streams = filled(DType::kF32, {t, hc, d}), fn = filled(DType::kF32, {mix, hc * d});
      DeviceTensor base = filled(DType::kF32, {mix}), scale = filled(DType::kF32, {3}), y = filled(DType::kF32, {t, d});
      DeviceTensor post = filled(DType::kF32, {t, hc}), comb = filled(DType::kF32, {t, hc, hc});
      DeviceTensor pre(gpu(), DType::kF32, {t, hc}), mpost(gpu(), DType::kF32, {t, hc});
      DeviceTensor mcomb(gpu(), DType::kF32, {t, hc, hc}), out(gpu(), DType::kF32, {t, d}),
          w = filled(DType::kF32, {d});
      ab("hc_expand_mix hc=4 D=5120" + bt, [&] {
        gpu().hc_expand_mix({{streams, y, post, comb}, {streams, fn, base, scale, pre, mpost, mcomb}});
      });
      std::printf("[bench] %-58s %8.2f us/call\n", ("hc_collapse_norm hc=4 D=5120" + bt).c_str(), graph_us([&] {
                    gpu().hc_collapse_norm({streams, pre, w, out, 1e-6f});
                  }));
      std::printf("[bench] %-58s %8.2f us/call\n", ("hc_mix hc=4 D=5120" + bt).c_str(), graph_us([&] {
                    gpu().hc_mix({streams, fn, base, scale, pre, mpost, mcomb});
                  }));
    }
    {  // MoE combine: 6 routed + shared
      const int64_t k = 6;
      HostTensor ids(DType::kI32, {t, k});
      for (int64_t i = 0; i < t * k; ++i) ids.data<int32_t>()[i] = static_cast<int32_t>((i * 37) % 384);
      DeviceTensor di = up(ids), ys = filled(DType::kF32, {t * k, d}), wt = filled(DType::kF32, {t, k});
      DeviceTensor sh = filled(DType::kF32, {t, d}), out(gpu(), DType::kF32, {t, d});
      cuda::MoeCombineKernelParams p;
      p.y_slot = static_cast<const float*>(ys.data());
      p.indices = static_cast<const int32_t*>(di.data());
      p.weights = static_cast<const float*>(wt.data());
      p.shared = static_cast<const float*>(sh.data());
      p.out = static_cast<float*>(out.data());
      p.tokens = t;
      p.k = k;
      p.d = d;
      p.experts = 384;
      ab("moe_combine k=6+shared D=5120" + bt, [&] { cuda::run_moe_combine(p, gpu().stream()); });
    }
    {  // router selection alone, sqrt-softplus + bias, 384 experts, top-6
      const int64_t e = 384, k = 6;
      DeviceTensor logits = filled(DType::kF32, {t, e}), bias = filled(DType::kF32, {e});
      DeviceTensor ww(gpu(), DType::kF32, {t, k}), wi(gpu(), DType::kI32, {t, k});
      cuda::RouterSelectKernelParams p;
      p.logits = static_cast<const float*>(logits.data());
      p.bias = static_cast<const float*>(bias.data());
      p.weights = static_cast<float*>(ww.data());
      p.indices = static_cast<int32_t*>(wi.data());
      p.tokens = t;
      p.experts = e;
      p.k = k;
      p.route_scale = 2.5f;
      ab("router_select E=384 k=6" + bt, [&] { cuda::run_router_select(p, gpu().stream()); });
    }
    {  // rope of the attention output (inverse), 64 heads x 512, 64 rotated channels
      const int64_t h = 64, hd = 512, half = 32;
      HostTensor pos(DType::kI64, {t}), inv(DType::kF32, {half});
      for (int64_t i = 0; i < t; ++i) pos.data<int64_t>()[i] = 4095 + i;
      for (int64_t i = 0; i < half; ++i) inv.data<float>()[i] = std::pow(10000.0f, -static_cast<float>(i) / half);
      DeviceTensor x = filled(DType::kF32, {t, h, hd}), dp = up(pos), dinv = up(inv);
      ab("rope inverse H=64 hd=512 rd=64" + bt, [&] { gpu().rope({x, dp, dinv, true}); });
    }
    {  // paged indexer scores: t sequences of 4096 tokens (1024 entries at ratio 4), 64 heads x 128, pages of 64
      const int64_t b = t, ih = 64, id = 128, r = 4, bs = 64, ctx = 4096, n = ctx / r, blocks = ctx / bs;
      std::vector<int32_t> ids(b * blocks);
      std::iota(ids.begin(), ids.end(), 0);
      std::shuffle(ids.begin(), ids.end(), rng());
      HostTensor tables(DType::kI32, {b, blocks}), pos(DType::kI64, {b}), seq(DType::kI32, {b}), cnt(DType::kI64, {b});
      std::copy(ids.begin(), ids.end(), tables.data<int32_t>());
      for (int64_t i = 0; i < b; ++i) {
        pos.data<int64_t>()[i] = ctx - 1;
        seq.data<int32_t>()[i] = static_cast<int32_t>(i);
        cnt.data<int64_t>()[i] = n;
      }
      DeviceTensor pool = filled(DType::kF32, {b * blocks * (bs / r), id}), q = filled(DType::kF32, {b, ih, id});
      DeviceTensor w = filled(DType::kF32, {b, ih}), dt = up(tables), dp = up(pos), ds = up(seq), dn = up(cnt);
      DeviceTensor scores(gpu(), DType::kF32, {b, n});
      PagedIndexerScoreParams ip;
      ip.q = q;
      ip.weights = w;
      ip.positions = dp;
      ip.q_seq = ds;
      ip.n_entries = dn;
      ip.block_tables = dt;
      ip.key_pool = pool;
      ip.out = scores;
      ip.block_size = static_cast<int>(bs);
      ip.key_ratio = static_cast<int>(r);
      ip.ratio = static_cast<int>(r);
      ip.score_scale = 0.088f;
      ip.weight_scale = 0.125f;
      ab("paged_indexer_scores IH=64 Id=128 n=1024" + bt, [&] { gpu().paged_indexer_scores(ip); });
    }
    {  // paged decode attention (+ combine): t sequences of 4096 tokens, pages of 64 in shuffled order
      const std::unique_ptr<PagedDecode> pd = paged_decode(t, 4096);
      const PagedSinkAttentionParams& ap = pd->params;
      const std::string what = "paged_sink_attention H=64 hd=512 128+512" + bt;
      ab(what, [&] { gpu().paged_sink_attention(ap); });
    }
  }
}

// The prefill expert GEMMs of V4-Flash (256 MXFP4 experts, D = 4096, I = 2048) at 4096 tokens (~96 rows an expert)
// and 8192 (~192), and of V4.1 (384 experts, D = 5120, I = 2304) at 8192 tokens (~128 rows an expert); top-6 routing
// drawn at random (and V4-Flash at 8192 tokens with skewed experts: popularity exp(0.3 · N(0, 1)), ~100-300 rows);
// gate (N = I, K = D: one of the two gate/up calls, rows gathered through a_rows / 6) and down
// (N = D, K = I, C rows scattered), plus V4-Flash's FP8 128x128 shared expert as dense GEMMs of 8192 rows (gate
// N = 2048, K = 4096; down N = 4096, K = 2048). Each through run_gemm with the wgmma kernel (the default: tile by rows
// per expert, bf16x2 decode, split between producer and consumers for MXFP4, on the producer for FP8), with each
// block tile forced (GemmChoices::wgmma_tile: 128 x 256, 256 x 128, mixed) and each decode placement in each tile,
// the f32 decode, and with wgmma off (gemm_mma: wgmma kNever), the same inputs in the same run. TFLOP/s and the share
// of the measured 790 TFLOP/s bf16 rate are printed. The experts' weights are distinct (1-2.3 GiB a projection), so
// each call reads them from HBM.
TEST_F(CudaBench, DISABLED_PrefillExpertGemmTimings) {
  const int64_t topk = 6, max_tokens = 8192;
  struct Mode {
    const char* name;
    cuda::GemmChoices choices;
  };
  using cuda::KernelPick;
  using cuda::WgmmaDecode;
  using cuda::WgmmaTile;
  const auto mode = [](const char* name, WgmmaTile tile, WgmmaDecode dec = WgmmaDecode::kByFormat, bool exact = false,
                       KernelPick pick = KernelPick::kAuto) {
    Mode md{name, {}};
    md.choices.wgmma = pick;
    md.choices.wgmma_tile = tile;
    md.choices.wgmma_decode = dec;
    md.choices.wgmma_exact = exact;
    return md;
  };
  const Mode modes[] = {
      mode("wgmma", WgmmaTile::kByRows),
      mode("wgmma 128x256", WgmmaTile::k128x256),
      mode("wgmma 256x128", WgmmaTile::k256x128),
      mode("wgmma mixed", WgmmaTile::kMixed),
      mode("wgmma 128x256 producer decode", WgmmaTile::k128x256, WgmmaDecode::kProducer),
      mode("wgmma 256x128 producer decode", WgmmaTile::k256x128, WgmmaDecode::kProducer),
      mode("wgmma 128x256 split decode", WgmmaTile::k128x256, WgmmaDecode::kSplit),
      mode("wgmma 256x128 split decode", WgmmaTile::k256x128, WgmmaDecode::kSplit),
      mode("wgmma 128x256 consumer decode", WgmmaTile::k128x256, WgmmaDecode::kConsumers),
      mode("wgmma 256x128 consumer decode", WgmmaTile::k256x128, WgmmaDecode::kConsumers),
      mode("wgmma f32-decode", WgmmaTile::kByRows, WgmmaDecode::kByFormat, true),
      mode("mma.sync (wgmma off)", WgmmaTile::kByRows, WgmmaDecode::kByFormat, false, KernelPick::kNever)};
  // The plan of `tokens` tokens over e experts: each token's 6 distinct experts uniformly at random, slots sorted by
  // expert.
  struct Plan {
    DeviceTensor perm, off, tiles, active;
    int64_t slots = 0;
  };
  auto plan = [&](int64_t tokens, int64_t e, double skew) {
    std::vector<std::vector<int32_t>> by_expert(e);
    // Expert popularity exp(skew · N(0, 1)) (skew 0: uniform), as a random router's bias makes it.
    std::vector<double> wts(e, 1.0);
    std::normal_distribution<double> nd(0.0, 1.0);
    for (auto& w : wts) w = std::exp(skew * nd(rng()));
    std::discrete_distribution<int> de(wts.begin(), wts.end());
    for (int64_t t = 0; t < tokens; ++t) {
      std::vector<int> chosen;
      while (static_cast<int64_t>(chosen.size()) < topk) {
        const int x = de(rng());
        if (std::find(chosen.begin(), chosen.end(), x) == chosen.end()) chosen.push_back(x);
      }
      for (int64_t j = 0; j < topk; ++j) by_expert[chosen[j]].push_back(static_cast<int32_t>(t * topk + j));
    }
    const int64_t slots = tokens * topk;
    HostTensor perm(DType::kI32, {slots}), off(DType::kI32, {e + 1}), tiles(DType::kI32, {e + 1}),
        active(DType::kI32, {e + 1});
    int64_t pos = 0, tl = 0, na = 0;
    for (int64_t g = 0; g < e; ++g) {
      off.data<int32_t>()[g] = static_cast<int32_t>(pos);
      tiles.data<int32_t>()[g] = static_cast<int32_t>(tl);
      for (int32_t sl : by_expert[g]) perm.data<int32_t>()[pos++] = sl;
      tl += (static_cast<int64_t>(by_expert[g].size()) + cuda::kGemmTileM - 1) / cuda::kGemmTileM;
      if (!by_expert[g].empty()) active.data<int32_t>()[na++] = static_cast<int32_t>(g);
    }
    off.data<int32_t>()[e] = static_cast<int32_t>(pos);
    tiles.data<int32_t>()[e] = static_cast<int32_t>(tl);
    active.data<int32_t>()[e] = static_cast<int32_t>(na);
    return Plan{up(perm), up(off), up(tiles), up(active), slots};
  };
  struct Model {
    const char* name;
    int64_t d, inter, e;
    std::vector<int64_t> tokens;
    double skew;
  };
  const Model models[] = {{"V4-Flash", 4096, 2048, 256, {4096, max_tokens}, 0.0},
                          {"V4-Flash skewed", 4096, 2048, 256, {max_tokens}, 0.3},
                          {"V4.1", 5120, 2304, 384, {max_tokens}, 0.0}};
  for (const Model& mo : models) {
    const int64_t d = mo.d, inter = mo.inter, e = mo.e;
    std::vector<std::pair<int64_t, Plan>> plans;
    for (int64_t tokens : mo.tokens) plans.emplace_back(tokens, plan(tokens, e, mo.skew));
    const DeviceTensor x16 = filled(DType::kBF16, {max_tokens, d}),
                       h16 = filled(DType::kBF16, {max_tokens * topk, inter});
    DeviceTensor gu(gpu(), DType::kF32, {max_tokens * topk, 2 * inter}), y(gpu(), DType::kF32, {max_tokens * topk, d});
    struct Proj {
      const char* name;
      int64_t n, k;
    };
    for (const Proj& pr : {Proj{"gate", inter, d}, Proj{"down", d, inter}}) {
      // All experts' codes and scales in one buffer each; the tables point at each expert's slice.
      const DeviceTensor w = filled(DType::kU8, {e * pr.n, pr.k / 2}),
                         sc = filled(DType::kE8M0, {e * pr.n, pr.k / 32}, true);
      HostTensor wt(DType::kI64, {e}), st(DType::kI64, {e});
      for (int64_t g = 0; g < e; ++g) {
        wt.data<int64_t>()[g] = reinterpret_cast<int64_t>(static_cast<const uint8_t*>(w.data()) + g * pr.n * pr.k / 2);
        st.data<int64_t>()[g] =
            reinterpret_cast<int64_t>(static_cast<const uint8_t*>(sc.data()) + g * pr.n * pr.k / 32);
      }
      const DeviceTensor dwt = up(wt), dst = up(st);
      for (const auto& [tokens, pl] : plans) {
        const int64_t slots = pl.slots;
        cuda::GemmKernelParams p;
        p.format = QuantFormat::kMXFP4;
        p.groups = static_cast<int>(e);
        p.group_offsets = static_cast<const int32_t*>(pl.off.data());
        p.tile_offsets = static_cast<const int32_t*>(pl.tiles.data());
        p.active_groups = static_cast<const int32_t*>(pl.active.data());
        p.max_tiles_m = (slots + cuda::kGemmTileM - 1) / cuda::kGemmTileM + e;
        p.tables_aligned16 = true;
        p.rows_hint = (slots + e - 1) / e;  // as the MoE layer sets it
        p.m = slots;
        p.n = pr.n;
        p.k = pr.k;
        p.b_table = static_cast<const void* const*>(dwt.data());
        p.b_scale_table = static_cast<const void* const*>(dst.data());
        p.scale_cols = pr.k / 32;
        if (pr.n == inter) {  // gate: token rows gathered by slot, C = the gate half of gu
          p.a_bf16 = x16.data();
          p.lda = d;
          p.a_rows = static_cast<const int32_t*>(pl.perm.data());
          p.a_row_div = static_cast<int>(topk);
          p.c = static_cast<float*>(gu.data());
          p.ldc = 2 * inter;
        } else {  // down: h rows in plan order, C rows scattered to their slots
          p.a_bf16 = h16.data();
          p.lda = inter;
          p.c = static_cast<float*>(y.data());
          p.ldc = d;
          p.c_rows = static_cast<const int32_t*>(pl.perm.data());
        }
        const double bytes = e * pr.n * pr.k * (0.5 + 1.0 / 32) + slots * pr.k * 2.0 + slots * pr.n * 4.0;
        for (const Mode& md : modes) {
          p.choices = md.choices;
          const double ms = time_ms([&] { cuda::run_gemm(p, gpu().stream()); }, 10);
          report(std::string(mo.name) + " experts mxfp4 " + pr.name + " T=" + std::to_string(tokens) +
                     " E=" + std::to_string(e) + " k=6 N=" + std::to_string(pr.n) + " K=" + std::to_string(pr.k) + " " +
                     md.name,
                 ms, bytes, 2.0 * slots * pr.n * pr.k);
        }
      }
    }
  }
  const int64_t d = 4096, inter = 2048;
  const DeviceTensor x16 = filled(DType::kBF16, {max_tokens, d});
  struct Proj {
    const char* name;
    int64_t n, k;
  };
  // The shared expert: dense FP8 128x128 UE8M0, 8192 rows.
  for (const Proj& pr : {Proj{"shared gate", inter, d}, Proj{"shared down", d, inter}}) {
    const DeviceTensor w = filled(DType::kF8E4M3, {pr.n, pr.k}, false, true),
                       sc = filled(DType::kE8M0, {pr.n / 128, pr.k / 128}, true);
    DeviceTensor c(gpu(), DType::kF32, {max_tokens, pr.n});
    cuda::GemmKernelParams p;
    p.format = QuantFormat::kFP8Block;
    p.a_bf16 = x16.data();  // [8192, 4096]: the down call reads the first 2048 columns of each row
    p.lda = d;
    p.b = w.data();
    p.b_scale = sc.data();
    p.scale_cols = pr.k / 128;
    p.m = max_tokens;
    p.n = pr.n;
    p.k = pr.k;
    p.c = static_cast<float*>(c.data());
    p.ldc = pr.n;
    for (const Mode& md : modes) {
      p.choices = md.choices;
      const double ms = time_ms([&] { cuda::run_gemm(p, gpu().stream()); }, 10);
      report(std::string("V4-Flash fp8 ") + pr.name + " M=8192 N=" + std::to_string(pr.n) +
                 " K=" + std::to_string(pr.k) + " " + md.name,
             ms, pr.n * pr.k * 1.0 + max_tokens * pr.k * 2.0 + max_tokens * pr.n * 4.0, 2.0 * max_tokens * pr.n * pr.k);
    }
  }
}

}  // namespace
}  // namespace deepinfer
