// Indexer scores, candidate blocks, top-k masks, sink attention and the router on CUDA against the CPU
// reference (the MoE ops: cuda_moe_test.cc). Cache slots and keys no query may read are poisoned with NaN: a kernel
// that reads them fails.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <numeric>
#include <tuple>

#include "cuda/cuda_test_util.h"
#include "deepinfer/core/dtype.h"
#include "deepinfer/ops/cuda/cuda_runtime.h"
#include "deepinfer/ops/cuda/gemm_invariant_mma.h"
#include "deepinfer/ops/cuda/kernels.h"

namespace deepinfer {
namespace {

using testing::CudaOpTest;
using testing::DeviceTensor;
using testing::ScopedKernelChoices;

// Shapes: the op test's 16 heads, V4's 64 x 128 at one token (decode: 16 entries a block) and at 40 tokens
// (prefill: 128 entries a block), and an odd dim (100: the dot's loops past whole warps). Entries the tokens
// cannot see hold NaN keys: they must come out -inf, never read.
TEST_F(CudaOpTest, IndexerScoresSkipInvisibleKeys) {
  struct Shape {
    int64_t t, ih, id, n;
  };
  for (const Shape& sh :
       {Shape{11, 16, 128, 300}, Shape{1, 64, 128, 1100}, Shape{40, 64, 128, 700}, Shape{5, 24, 100, 257}}) {
    const int64_t t = sh.t, ih = sh.ih, id = sh.id, n = sh.n, ratio = 4;
    HostTensor q = rand({t, ih, id}), keys = rand({n, id}), w = rand({t, ih});
    HostTensor pos = ints(DType::kI64, {t}, 0, ratio * n - 200);
    int64_t max_visible = 0;
    for (int64_t i = 0; i < t; ++i) max_visible = std::max(max_visible, (pos.data<int64_t>()[i] + 1) / ratio);
    for (int64_t e = max_visible; e < n; ++e)
      for (int64_t c = 0; c < id; ++c) keys.data<float>()[e * id + c] = NAN;
    HostTensor want(DType::kF32, {t, n});
    const float score_scale = 1.0f / std::sqrt(static_cast<float>(id));
    IndexerScoreParams p{q, keys, w, pos, want, static_cast<int>(ratio), score_scale, 0.25f};
    cpu().indexer_scores(p);
    DeviceTensor dq = up(q), dk = up(keys), dw = up(w), dp = up(pos), dout = poisoned({t, n});
    gpu().indexer_scores({dq, dk, dw, dp, dout, static_cast<int>(ratio), score_scale, 0.25f});
    rel_err(("indexer_scores T=" + std::to_string(t) + " IH=" + std::to_string(ih) + " Id=" + std::to_string(id) +
             " N=" + std::to_string(n))
                .c_str(),
            down(dout), want, 1e-5);
  }
}

TEST_F(CudaOpTest, TopKMaskWithTiesInfAndAllowed) {
  const int64_t t = 7, n = 1500;
  HostTensor s = rand({t, n}, -4, 4);
  for (int64_t i = 0; i < s.numel(); ++i) {
    s.data<float>()[i] = std::round(s.data<float>()[i] * 8) / 8 + 0.01f;  // many exact ties
    if (i % 11 == 0) s.data<float>()[i] = -INFINITY;
  }
  HostTensor allowed = ints(DType::kU8, {t, n}, 0, 1);
  for (int k : {1, 64, 700, 2000}) {
    for (bool with_allowed : {false, true}) {
      HostTensor want(DType::kU8, {t, n});
      cpu().topk_mask({s, with_allowed ? allowed.view() : Tensor{}, want, k});
      DeviceTensor ds = up(s), da = up(allowed), dout = poisoned_bytes(DType::kU8, {t, n});
      gpu().topk_mask({ds, with_allowed ? da.view() : Tensor{}, dout, k});
      expect_same_bytes(("topk_mask k=" + std::to_string(k) + (with_allowed ? " allowed" : "")).c_str(), down(dout),
                        want);
    }
  }
}

// Prefill-sized top-k (>= 512 rows: blocks of 256 / 512 threads by row length, KernelChoices::topk_small_blocks) and
// the decode shape (kNever: 1024 threads) on the same rows, and the small blocks on a few rows (kAlways): the same
// bytes as the CPU op. Rows of 1500 / 5000 / 9000 entries (256 / 512 / 1024 threads) with many exact ties, -inf and an
// allowed mask.
const std::pair<cuda::KernelPick, const char*> kPicks[] = {
    {cuda::KernelPick::kAuto, "auto"}, {cuda::KernelPick::kNever, "never"}, {cuda::KernelPick::kAlways, "always"}};

TEST_F(CudaOpTest, TopKMaskPrefillRowsMatchCpu) {
  for (const int64_t n : {int64_t{1500}, int64_t{5000}, int64_t{9000}}) {
    for (const int64_t t : {int64_t{600}, int64_t{5}}) {
      HostTensor s = rand({t, n}, -4, 4);
      for (int64_t i = 0; i < s.numel(); ++i) {
        s.data<float>()[i] = std::round(s.data<float>()[i] * 64) / 64 + 0.01f;  // ties
        if (i % 13 == 0) s.data<float>()[i] = -INFINITY;
      }
      const HostTensor allowed = ints(DType::kU8, {t, n}, 0, 1);
      DeviceTensor ds = up(s), da = up(allowed);
      for (const int k : {1, 512, 2000}) {
        for (const bool with_allowed : {false, true}) {
          HostTensor want(DType::kU8, {t, n});
          cpu().topk_mask({s, with_allowed ? allowed.view() : Tensor{}, want, k});
          for (const auto& [pick, pick_name] : kPicks) {
            ScopedKernelChoices guard(gpu(), [&](cuda::KernelChoices& c) { c.topk_small_blocks = pick; });
            DeviceTensor dout = poisoned_bytes(DType::kU8, {t, n});
            gpu().topk_mask({ds, with_allowed ? da.view() : Tensor{}, dout, k});
            expect_same_bytes(("topk_mask T=" + std::to_string(t) + " N=" + std::to_string(n) +
                               " k=" + std::to_string(k) + (with_allowed ? " allowed" : "") + " " + pick_name)
                                  .c_str(),
                              down(dout), want);
          }
        }
      }
    }
  }
}

// candidate_blocks at prefill row counts (V4.1's shape: blocks of 8, top 2048 blocks, 8192 entries; and a row
// count of blocks for each block size), each block form against the CPU.
TEST_F(CudaOpTest, CandidateBlocksPrefillRowsMatchCpu) {
  const int64_t t = 520, ratio = 1;
  for (const auto& [n, bs, top] : {std::tuple<int64_t, int, int>{8192, 8, 600}, {3000, 1, 1000}, {6000, 64, 20}}) {
    HostTensor pos = ints(DType::kI64, {t}, 0, ratio * n - 1);
    HostTensor s = rand({t, n}, -3, 3);
    for (int64_t i = 0; i < t; ++i) {
      const int64_t visible = (pos.data<int64_t>()[i] + 1) / ratio;
      for (int64_t e = visible; e < n; ++e) s.data<float>()[i * n + e] = -INFINITY;
    }
    HostTensor want(DType::kU8, {t, n});
    cpu().candidate_blocks({s, pos, want, static_cast<int>(ratio), top, bs});
    DeviceTensor ds = up(s), dp = up(pos);
    for (const auto& [pick, pick_name] : {kPicks[0], kPicks[1]}) {
      ScopedKernelChoices guard(gpu(), [&](cuda::KernelChoices& c) { c.topk_small_blocks = pick; });
      DeviceTensor dout = poisoned_bytes(DType::kU8, {t, n});
      gpu().candidate_blocks({ds, dp, dout, static_cast<int>(ratio), top, bs});
      expect_same_bytes(
          ("candidate_blocks T=520 N=" + std::to_string(n) + " bs=" + std::to_string(bs) + " " + pick_name).c_str(),
          down(dout), want);
    }
  }
}

TEST_F(CudaOpTest, CandidateBlocksMatchCpu) {
  const int64_t t = 9, n = 2000, ratio = 4;
  for (int bs : {1, 16, 64}) {
    HostTensor pos = ints(DType::kI64, {t}, 0, ratio * n - 1);
    HostTensor s = rand({t, n}, -3, 3);
    for (int64_t i = 0; i < t; ++i) {
      const int64_t visible = (pos.data<int64_t>()[i] + 1) / ratio;
      for (int64_t e = visible; e < n; ++e) s.data<float>()[i * n + e] = -INFINITY;
    }
    HostTensor want(DType::kU8, {t, n});
    cpu().candidate_blocks({s, pos, want, static_cast<int>(ratio), 5, bs});
    DeviceTensor ds = up(s), dp = up(pos), dout = poisoned_bytes(DType::kU8, {t, n});
    gpu().candidate_blocks({ds, dp, dout, static_cast<int>(ratio), 5, bs});
    expect_same_bytes(("candidate_blocks bs=" + std::to_string(bs)).c_str(), down(dout), want);
  }
}

// The indexer's top-512 at decode and prefill sizes: one row over 1k..16k entries (decode: N = context / ratio),
// 64 rows of 16k, 256 short rows, and rows longer than the kernel's register cache (20000: the re-reading path).
// Continuous scores have distinct keys (the radix passes stop early); scores on a 1/4 grid tie across the
// 512th place (ties go to the lower index) and hold both −0 and +0 (equal to the CPU, so they must tie too);
// the third mode adds a −inf tail of unseen entries per row, longer than n − 512 in some rows.
TEST_F(CudaOpTest, TopKMaskDecodeShapesMatchCpu) {
  struct Shape {
    int64_t t, n;
  };
  for (const Shape& sh : {Shape{1, 1024}, Shape{1, 4096}, Shape{1, 16384}, Shape{64, 16384}, Shape{3, 20000},
                          Shape{256, 2048}, Shape{2, 300}}) {
    for (int mode = 0; mode < 3; ++mode) {
      const int64_t t = sh.t, n = sh.n;
      HostTensor s = rand({t, n}, -4, 4);
      if (mode >= 1)
        for (int64_t i = 0; i < s.numel(); ++i) s.data<float>()[i] = std::round(s.data<float>()[i] * 4) / 4;
      if (mode == 2) {
        HostTensor visible = ints(DType::kI64, {t}, 0, n);
        for (int64_t r = 0; r < t; ++r)
          for (int64_t e = visible.data<int64_t>()[r]; e < n; ++e) s.data<float>()[r * n + e] = -INFINITY;
      }
      for (int k : {512, 1}) {
        HostTensor want(DType::kU8, {t, n});
        cpu().topk_mask({s, Tensor{}, want, k});
        DeviceTensor ds = up(s), dout = poisoned_bytes(DType::kU8, {t, n});
        gpu().topk_mask({ds, Tensor{}, dout, k});
        expect_same_bytes(("topk_mask T=" + std::to_string(t) + " N=" + std::to_string(n) + " k=" + std::to_string(k) +
                           " mode=" + std::to_string(mode))
                              .c_str(),
                          down(dout), want);
      }
    }
  }
}

// Candidate blocks at decode and prefill sizes: block sizes under a warp (one thread per block max) and of one
// or more warps (a warp per block), with the block maxima on a grid so that they tie across the kept count.
TEST_F(CudaOpTest, CandidateBlocksDecodeShapesMatchCpu) {
  struct Case {
    int64_t t, n;
    int bs, topk;
  };
  const int64_t ratio = 4;
  for (const Case& c : {Case{1, 16384, 64, 32}, Case{1, 16384, 8, 128}, Case{64, 16384, 128, 16},
                        Case{256, 4096, 32, 8}, Case{1, 1000, 64, 64}, Case{5, 20000, 16, 1500}}) {
    for (bool grid : {false, true}) {
      HostTensor pos = ints(DType::kI64, {c.t}, 0, ratio * c.n - 1);
      HostTensor s = rand({c.t, c.n}, -3, 3);
      for (int64_t i = 0; i < c.t; ++i) {
        const int64_t visible = (pos.data<int64_t>()[i] + 1) / ratio;
        for (int64_t e = 0; e < c.n; ++e) {
          float& v = s.data<float>()[i * c.n + e];
          if (grid) v = std::round(v * 2) / 2;
          if (e >= visible) v = -INFINITY;
        }
      }
      HostTensor want(DType::kU8, {c.t, c.n});
      cpu().candidate_blocks({s, pos, want, static_cast<int>(ratio), c.topk, c.bs});
      DeviceTensor ds = up(s), dp = up(pos), dout = poisoned_bytes(DType::kU8, {c.t, c.n});
      gpu().candidate_blocks({ds, dp, dout, static_cast<int>(ratio), c.topk, c.bs});
      expect_same_bytes(("candidate_blocks T=" + std::to_string(c.t) + " N=" + std::to_string(c.n) +
                         " bs=" + std::to_string(c.bs) + " top=" + std::to_string(c.topk) + (grid ? " grid" : ""))
                            .c_str(),
                        down(dout), want);
    }
  }
}

TEST_F(CudaOpTest, SinkAttentionPrefillAndDecodeWithPoisonedSlots) {
  struct Case {
    int64_t t, h, hd, s, n;
    int window;
  };
  for (const Case& c : {Case{6, 8, 512, 40, 50, 16}, Case{1, 16, 512, 128, 300, 128}, Case{13, 4, 128, 64, 0, 32}}) {
    HostTensor q = rand({c.t, c.h, c.hd}), kv = rand({c.s, c.hd}), sinks = rand({c.h}, -1, 2);
    HostTensor qpos(DType::kI64, {c.t}), kvpos(DType::kI64, {c.s});
    const int64_t base = 1000;
    for (int64_t i = 0; i < c.t; ++i) qpos.data<int64_t>()[i] = base + 3 * i;
    // A ring of window slots holding a spread of positions: some visible, some stale or future.
    for (int64_t i = 0; i < c.s; ++i) kvpos.data<int64_t>()[i] = base - c.window - 10 + i * 2;
    for (int64_t i = 0; i < c.s; ++i) {
      bool any = false;
      for (int64_t j = 0; j < c.t; ++j) {
        const int64_t kp = kvpos.data<int64_t>()[i], qp = qpos.data<int64_t>()[j];
        any |= kp <= qp && kp > qp - c.window;
      }
      if (!any)
        for (int64_t d = 0; d < c.hd; ++d) kv.data<float>()[i * c.hd + d] = NAN;
    }
    HostTensor comp = rand({std::max<int64_t>(c.n, 1), c.hd}),
               mask = ints(DType::kU8, {c.t, std::max<int64_t>(c.n, 1)}, 0, 1);
    for (int64_t e = 0; e < c.n; ++e) {
      bool any = false;
      for (int64_t j = 0; j < c.t; ++j) any |= mask.data<uint8_t>()[j * c.n + e] != 0;
      if (!any)
        for (int64_t d = 0; d < c.hd; ++d) comp.data<float>()[e * c.hd + d] = NAN;
    }
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.hd));
    HostTensor want(DType::kF32, {c.t, c.h, c.hd});
    SinkAttentionParams cp{q, qpos, kv, kvpos, Tensor{}, Tensor{}, sinks, want, c.window, scale};
    if (c.n > 0) {
      cp.compressed = comp.view().reshape({c.n, c.hd});
      cp.comp_mask = mask;
    }
    cpu().sink_attention(cp);
    DeviceTensor dq = up(q), dqp = up(qpos), dkv = up(kv), dkvp = up(kvpos), dcomp = up(comp), dmask = up(mask);
    DeviceTensor dsinks = up(sinks), dout = poisoned({c.t, c.h, c.hd});
    SinkAttentionParams gp{dq, dqp, dkv, dkvp, Tensor{}, Tensor{}, dsinks, dout, c.window, scale};
    if (c.n > 0) {
      gp.compressed = dcomp.view().reshape({c.n, c.hd});
      gp.comp_mask = dmask;
    }
    gpu().sink_attention(gp);
    rel_err(("sink_attention T=" + std::to_string(c.t) + " hd=" + std::to_string(c.hd)).c_str(), down(dout), want,
            1e-5);
  }
}

class CudaRouterTest : public CudaOpTest {
 protected:
  // The router of p's inputs and settings (host tensors; p's outputs are ignored) on the CPU, and on the GPU from
  // device copies into poisoned outputs [T, k]: the same expert ids byte for byte, the weights within 1e-5.
  void expect_router_matches_cpu(const std::string& name, RouterParams p, int64_t k) {
    const int64_t t = p.x.shape()[0];
    HostTensor ww(DType::kF32, {t, k}), wi(DType::kI32, {t, k});
    p.weights = ww;
    p.indices = wi;
    cpu().router(p);
    const DeviceTensor dx = up_view(p.x), dw = up_view(p.weight), db = up_view(p.bias), dh = up_view(p.hash_table),
                       dtok = up_view(p.token_ids), dww = poisoned({t, k}), dwi = poisoned_bytes(DType::kI32, {t, k});
    RouterParams g = p;
    g.x = dx;
    g.weight = dw;
    g.bias = db;
    g.hash_table = dh;
    g.token_ids = dtok;
    g.weights = dww;
    g.indices = dwi;
    gpu().router(g);
    expect_same_bytes((name + " indices").c_str(), down(dwi), wi);
    rel_err((name + " weights").c_str(), down(dww), ww, 1e-5);
  }
  // A device copy of a host view; an absent view (no data) gives an absent one.
  DeviceTensor up_view(const Tensor& v) {
    if (!v.data()) return DeviceTensor{};
    DeviceTensor d(gpu(), v.dtype(), v.shape());
    EXPECT_EQ(testing::copy_and_sync(d.data(), v.data(), v.nbytes(), cudaMemcpyHostToDevice), cudaSuccess);
    return d;
  }
};

TEST_F(CudaRouterTest, RouterScoringsBiasAndHash) {
  const int64_t t = 33, d = 64, e = 256, k = 8;
  HostTensor x = rand({t, d}), w = rand({e, d}), bias = rand({e}, -0.1f, 0.1f);
  HostTensor hash32 = ints(DType::kI32, {500, k}, 0, e - 1), hash64 = ints(DType::kI64, {500, k}, 0, e - 1);
  HostTensor tok = ints(DType::kI64, {t}, 0, 499);
  struct Case {
    const char* name;
    RouterScoring scoring;
    bool bias, normalize;
    const HostTensor* hash;
  };
  for (const Case& c : {Case{"router sqrt-softplus+bias", RouterScoring::kSqrtSoftplus, true, true, nullptr},
                        Case{"router sigmoid", RouterScoring::kSigmoid, false, true, nullptr},
                        Case{"router softmax unnormalized", RouterScoring::kSoftmax, false, false, nullptr},
                        Case{"router hash i32", RouterScoring::kSqrtSoftplus, false, true, &hash32},
                        Case{"router hash i64", RouterScoring::kSqrtSoftplus, false, true, &hash64}}) {
    expect_router_matches_cpu(c.name,
                              {x, w, c.bias ? bias.view() : Tensor{}, c.hash ? c.hash->view() : Tensor{},
                               c.hash ? tok.view() : Tensor{}, Tensor{}, Tensor{}, c.scoring, 1.3f, 2.5f, c.normalize},
                              k);
  }
}

// V3-family routing: group-limited top-k (V3 noaux_tc: sigmoid + bias, groups by top-2 sum; V2 group-limited
// greedy: softmax, groups by max) must pick the CPU op's experts exactly.
TEST_F(CudaRouterTest, RouterGroupLimited) {
  const int64_t t = 37, d = 64, e = 256, k = 8;
  HostTensor x = rand({t, d}), w = rand({e, d}), bias = rand({e}, -0.1f, 0.1f);
  struct Case {
    const char* name;
    RouterScoring scoring;
    bool bias;
    int n_group, topk_group;
    GroupScore group_score;
  };
  for (const Case& c :
       {Case{"router V3 noaux_tc 8 groups top-4", RouterScoring::kSigmoid, true, 8, 4, GroupScore::kTop2Sum},
        Case{"router V2 group-limited greedy 16 groups top-3", RouterScoring::kSoftmax, false, 16, 3,
             GroupScore::kMax}}) {
    RouterParams p{x,    w,   c.bias ? bias.view() : Tensor{}, Tensor{}, Tensor{}, Tensor{}, Tensor{}, c.scoring, 1.0f,
                   2.5f, true};
    p.n_group = c.n_group;
    p.topk_group = c.topk_group;
    p.group_score = c.group_score;
    expect_router_matches_cpu(c.name, p, k);
  }
}

// V4 / V4.1 routing shapes: 256 and 384 experts, top-6, T = 1 (decode), 64, 256 and 2048 (prefill). The gate
// weight is the identity (d = E), so the logits are the test's values exactly on both sides. Logits on a 1/32
// grid in [-2, 2] and a bias on a 1/8 grid in [-0.5, 0.5] give many exactly equal biased scores (which must go
// to the lower expert id), while distinct ones stay >= 1e-5 apart (checked in double over both grids, for both
// score functions), far beyond the few-ulp difference of the CPU's and the GPU's exp/log1p.
TEST_F(CudaRouterTest, RouterDecodeShapesWithTies) {
  const int64_t k = 6;
  for (int64_t e : {int64_t{256}, int64_t{384}}) {
    HostTensor eye(DType::kF32, {e, e});
    std::fill(eye.data<float>(), eye.data<float>() + eye.numel(), 0.0f);
    for (int64_t i = 0; i < e; ++i) eye.data<float>()[i * e + i] = 1.0f;
    HostTensor bias = rand({e}, -0.5f, 0.5f);
    for (int64_t i = 0; i < e; ++i) bias.data<float>()[i] = std::round(bias.data<float>()[i] * 8) / 8;
    HostTensor hash = ints(DType::kI32, {300, k}, 0, e - 1);
    for (int64_t t : {int64_t{1}, int64_t{64}, int64_t{256}, int64_t{2048}}) {
      HostTensor x = rand({t, e}, -2, 2);
      for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = std::round(x.data<float>()[i] * 32) / 32;
      HostTensor tok = ints(DType::kI64, {t}, 0, 299);
      struct Case {
        const char* name;
        RouterScoring scoring;
        bool bias, normalize, hash;
      };
      for (const Case& c : {Case{"sqrt-softplus+bias", RouterScoring::kSqrtSoftplus, true, true, false},
                            Case{"sigmoid+bias", RouterScoring::kSigmoid, true, true, false},
                            Case{"sqrt-softplus unnormalized", RouterScoring::kSqrtSoftplus, false, false, false},
                            Case{"hash", RouterScoring::kSqrtSoftplus, false, true, true}}) {
        const std::string name =
            std::string("router E=") + std::to_string(e) + " T=" + std::to_string(t) + " " + c.name;
        expect_router_matches_cpu(
            name,
            {x, eye, c.bias ? bias.view() : Tensor{}, c.hash ? hash.view() : Tensor{}, c.hash ? tok.view() : Tensor{},
             Tensor{}, Tensor{}, c.scoring, 1.0f, 2.5f, c.normalize},
            k);
      }
    }
  }
}

}  // namespace
}  // namespace deepinfer
