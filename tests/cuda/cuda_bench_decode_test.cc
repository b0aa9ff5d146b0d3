// Micro-benchmarks of the CUDA ops at decode shapes (the fixture and the bench conventions: cuda_bench_util.h,
// cuda_bench_test.cc): the decode GEMMs and their launch-shape sweep, MoE at decode batches, batch-invariant decode,
// the small selection ops, the indexer and the small per-token ops.
#include "cuda/cuda_bench_util.h"

namespace deepinfer {
namespace {

using testing::CudaBench;
using testing::DeviceTensor;
using testing::ScopedKernelChoices;

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
// always; from the f32 rows and from a bf16 copy, on mma.sync; its warpgroup form) against the path it replaced
// (rows_mma = never: the dequantized bf16 scratch for cuBLASLt, or the wgmma tiles where they fill the device), a
// same-run A/B; weights rotate so each call reads them from HBM.
TEST_F(CudaBench, DISABLED_DecodeRowsGemmTimings) {
  struct Mode {
    const char* name;
    cuda::KernelPick pick;
    bool bf16_a;
    cuda::KernelPick wgmma = cuda::KernelPick::kNever;
  };
  constexpr auto kWg = cuda::KernelPick::kAlways;
  const Mode modes[] = {{"rows", cuda::KernelPick::kAlways, false},
                        {"rows wgmma", cuda::KernelPick::kAlways, false, kWg},
                        {"rows bf16 A", cuda::KernelPick::kAlways, true},
                        {"rows never", cuda::KernelPick::kNever, false},
                        {"rows (again, last)", cuda::KernelPick::kAlways, false},
                        {"rows wgmma (again, last)", cuda::KernelPick::kAlways, false, kWg}};
  const auto set_mode = [&](const Mode& md) {
    cuda::KernelChoices c;
    c.gemm.rows_mma = md.pick;
    c.gemm.rows_mma_bf16_a = md.bf16_a;
    c.gemm.rows_mma_wgmma = md.wgmma;
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

// The output projections (K = 8192) at 33-64 rows need 8 cluster splits for their K range to fit a block's shared
// memory, and clusters of 8 one-block SMs fit only 15 at a time on a 132-SM part (ncu's Max Active Clusters): V4-Flash
// o_b's 16 clusters and V4.1's 20 run in two waves. Fewer, larger splits (6: 22 steps of 64 k, 180 KB at 64 rows)
// fit one wave; a same-run A/B of the split counts, weights rotating out of L2.
TEST_F(CudaBench, DISABLED_RowsGemmClusterWaves) {
  for (const Proj& pr : {Proj{"V4-Flash o_b", 4096, 8192}, Proj{"V4.1 o_b", 5120, 8192}}) {
    const RotatingFp8 wr = rotating_fp8(pr.n, pr.k);
    for (int64_t m : {33, 64}) {
      DeviceTensor x = filled(DType::kF32, {m, pr.k}), y(gpu(), DType::kF32, {m, pr.n});
      for (int pass = 0; pass < 2; ++pass)
        for (int splits : {-1, 0, 8, 7, 6}) {  // -1: the rule without waves (rows_mma_waves = false), 0: the rule
          cuda::KernelChoices c;
          c.gemm.rows_mma = cuda::KernelPick::kAlways;
          c.gemm.rows_mma_warps = splits > 0 ? 16 : 0;
          c.gemm.rows_mma_splits = std::max(splits, 0);
          c.gemm.rows_mma_waves = splits >= 0;
          if (splits > 0 && !cuda::gemm_rows_mma_takes(QuantFormat::kFP8Block, true, 128, 128, pr.n, pr.k, m, c.gemm))
            continue;
          gpu().set_kernel_choices(c);
          const cuda::RowsMmaShape sh =
              cuda::gemm_rows_mma_shape(QuantFormat::kFP8Block, pr.n, pr.k, m, gpu().device_info().sm_count, c.gemm,
                                        cuda::gemm_rows_mma_cluster_slots);
          const double ms = time_rotating(wr, x, y);
          report(
              std::string("fp8 ") + pr.name + " M=" + std::to_string(m) +
                  (splits > 0 ? " w16 s" + std::to_string(splits) : std::string(splits ? " rule, no waves" : " rule")) +
                  " (w" + std::to_string(sh.warps) + " s" + std::to_string(sh.splits) + ")" + (pass ? " (again)" : ""),
              ms, wr.bytes + 4.0 * m * (pr.n + pr.k), 2.0 * m * pr.n * pr.k);
        }
      if (m == 64)
        std::printf("[bench] cluster slots (clusters of 2..8 16-warp blocks at once): %d %d %d %d %d %d %d\n",
                    cuda::gemm_rows_mma_cluster_slots(2), cuda::gemm_rows_mma_cluster_slots(3),
                    cuda::gemm_rows_mma_cluster_slots(4), cuda::gemm_rows_mma_cluster_slots(5),
                    cuda::gemm_rows_mma_cluster_slots(6), cuda::gemm_rows_mma_cluster_slots(7),
                    cuda::gemm_rows_mma_cluster_slots(8));
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

}  // namespace
}  // namespace deepinfer
