// Micro-benchmark of the CUDA ops on large shapes, with the two ceilings measured in the same run (HBM copy
// bandwidth, cuBLASLt bf16 GEMM rate). Disabled in the normal test run; tools/device_check.sh runs it with
// --gtest_also_run_disabled_tests --gtest_filter='*Bench*' and keeps the table it prints ([bench] lines).
// Inputs are random (a 16 MiB random pattern tiled over each buffer: never zeros, cheap to make).
// Here: the op table and prefill-sized shapes (cuda_bench_decode_test.cc has the decode ones; the fixture is in
// cuda_bench_util.h).
#include "cuda/cuda_bench_util.h"
#include "deepinfer/ops/cuda/gemm_wgmma_fp8.h"

namespace deepinfer {
namespace {

using testing::CudaBench;
using testing::DeviceTensor;
using testing::ScopedKernelChoices;

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
      mode("wgmma 128x256 staged producer decode", WgmmaTile::k128x256, WgmmaDecode::kProducerStaged),
      mode("wgmma 256x128 staged producer decode", WgmmaTile::k256x128, WgmmaDecode::kProducerStaged),
      mode("wgmma mixed staged producer decode", WgmmaTile::kMixed, WgmmaDecode::kProducerStaged),
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
    // The same rows as MXFP8 (codes and UE8M0 scales) for the FP8 GEMM, and fold exponents of every weight row.
    const DeviceTensor x8 = filled(DType::kU8, {max_tokens, d}, false, true),
                       x8s = filled(DType::kU8, {max_tokens, d / 32}, true),
                       h8 = filled(DType::kU8, {max_tokens * topk, inter}, false, true),
                       h8s = filled(DType::kU8, {max_tokens * topk, inter / 32}, true),
                       fold = filled(DType::kU8, {e * std::max(d, inter)}, true);
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
        const std::string label = std::string(mo.name) + " experts mxfp4 " + pr.name + " T=" + std::to_string(tokens) +
                                  " E=" + std::to_string(e) + " k=6 N=" + std::to_string(pr.n) +
                                  " K=" + std::to_string(pr.k) + " ";
        for (const Mode& md : modes) {
          p.choices = md.choices;
          const double ms = time_ms([&] { cuda::run_gemm(p, gpu().stream()); }, 10);
          report(label + md.name, ms, bytes, 2.0 * slots * pr.n * pr.k);
        }
        // The FP8 GEMM (--activation-quant mxfp8's default): A as e4m3 codes + scales a 32 (half the bf16 A bytes).
        cuda::GemmKernelParams f = p;
        f.choices.wgmma_fp8 = KernelPick::kAlways;
        f.a_e4m3 = static_cast<const uint8_t*>(pr.n == inter ? x8.data() : h8.data());
        f.a_scale = static_cast<const uint8_t*>(pr.n == inter ? x8s.data() : h8s.data());
        f.b_fold = static_cast<const uint8_t*>(fold.data());
        if (cuda::gemm_wgmma_fp8_takes(f))
          report(label + "fp8 wgmma", time_ms([&] { cuda::run_gemm_wgmma_fp8(f, gpu().stream()); }, 10),
                 bytes - slots * pr.k * (1.0 - 1.0 / 32), 2.0 * slots * pr.n * pr.k);
      }
    }
  }
  const int64_t d = 4096, inter = 2048;
  const DeviceTensor x16 = filled(DType::kBF16, {max_tokens, d});
  struct Proj {
    const char* name;
    int64_t n, k;
  };
  // The shared expert: dense FP8 128x128 UE8M0, 8192 rows with every mode; 1024 and 2048 (the dense tall tile's
  // threshold, kGemmWgmmaDenseTallRows) with the default, the 128 x 256 tile and the tall split.
  for (const int64_t rows : {int64_t{1024}, int64_t{2048}, max_tokens})
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
      p.m = rows;
      p.n = pr.n;
      p.k = pr.k;
      p.c = static_cast<float*>(c.data());
      p.ldc = pr.n;
      const double bytes = pr.n * pr.k * 1.0 + rows * pr.k * 2.0 + rows * pr.n * 4.0;
      const std::string label = std::string("V4-Flash fp8 ") + pr.name + " M=" + std::to_string(rows) +
                                " N=" + std::to_string(pr.n) + " K=" + std::to_string(pr.k) + " ";
      for (const Mode& md : modes) {
        const std::string name = md.name;
        if (rows != max_tokens && name != "wgmma" && name != "wgmma 128x256" && name != "wgmma 256x128 split decode")
          continue;
        p.choices = md.choices;
        const double ms = time_ms([&] { cuda::run_gemm(p, gpu().stream()); }, 10);
        report(label + md.name, ms, bytes, 2.0 * rows * pr.n * pr.k);
      }
      // The FP8 GEMM on FP8-block weights (--activation-quant mxfp8's default): A as e4m3 codes + scales a 32.
      const DeviceTensor a8 = filled(DType::kU8, {max_tokens, pr.k}, false, true),
                         a8s = filled(DType::kU8, {max_tokens, pr.k / 32}, true);
      cuda::GemmKernelParams f = p;
      f.lda = pr.k;
      f.choices.wgmma_fp8 = KernelPick::kAlways;
      f.a_e4m3 = static_cast<const uint8_t*>(a8.data());
      f.a_scale = static_cast<const uint8_t*>(a8s.data());
      if (cuda::gemm_wgmma_fp8_takes(f))
        report(label + "fp8 wgmma", time_ms([&] { cuda::run_gemm_wgmma_fp8(f, gpu().stream()); }, 10),
               bytes - rows * pr.k * (1.0 - 1.0 / 32), 2.0 * rows * pr.n * pr.k);
    }
}

}  // namespace
}  // namespace deepinfer
