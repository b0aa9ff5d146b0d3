// The small decode kernels re-launched over more blocks (hc_expand_mix split per fn chunk, hc_collapse_norm with the
// row in registers, moe_combine one output a thread, the paged attention combine a float4 a thread, its key loads a
// group ahead and 32-slot splits, rope split over head groups) at V4 / V4.1 shapes, batch 1 and 16 (and the first sizes
// past the new kernels' limits): against the CPU op, and bit for bit against another form of the same op where there is
// one (their comparisons against the previous kernels went with the A/B switches, sessions 17 and 19).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>
#include <tuple>
#include <vector>

#include "cuda/cuda_decode_test_util.h"
#include "deepinfer/ops/cuda/kernels.h"
#include "ops/paged_attention_case.h"
#include "ops/paged_indexer_case.h"

namespace deepinfer {
namespace {

using testing::CudaDecodeOpTest;
using testing::DeviceTensor;

// The uploads (cudaMemcpy from pageable memory, on the legacy stream) may still be landing when cudaMemcpy returns;
// the backend's stream does not wait for the legacy one. A test that runs on it right after uploading inputs or
// poisoned outputs first waits for the device (a late poison DMA over a kernel's output failed an earlier run).
void settle() { ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess); }

// hc = 4 at V4-Flash's D = 4096, V4.1-Flash's 5120 and V4's 7168; t = 1 and 4 take the split kernel (one token tile),
// 5, 16 and 64 the one-launch kernel. Two forms: the fused op, hc_expand then hc_mix; outputs bit for bit, and the
// backend's counters must be left at zero (a second call of each form checks that: a stuck counter would skip a finish
// or a stream write).
TEST_F(CudaDecodeOpTest, HcExpandMixDecodeShapesSplitKernelBitwise) {
  const int64_t hc = 4, rows = (2 + hc) * hc;
  for (int64_t d : {int64_t{4096}, int64_t{5120}, int64_t{7168}}) {
    // The ranges of HcMixRealSizeSplitK (the CPU comparison's tolerance was set on them).
    HostTensor fn = rand({rows, hc * d}, -0.01f, 0.01f), base = rand({rows}), scale = rand({3}, 0.5f, 1.5f);
    DeviceTensor dfn = up(fn), dbase = up(base), dscale = up(scale);
    for (int64_t t : {int64_t{1}, int64_t{4}, int64_t{5}, int64_t{16}, int64_t{64}}) {
      HostTensor s0 = rand({t, hc, d}, -2, 2), y = rand({t, d}, -2, 2), post0 = rand({t, hc}, 0.1f, 2.0f);
      HostTensor comb0 = rand({t, hc, hc}, 0.0f, 1.0f);
      DeviceTensor dy = up(y);
      HostTensor out[2][4];  // [fused, unfused][streams, pre, post, comb]
      for (int form = 0; form < 2; ++form) {
        for (int rep = 0; rep < 2; ++rep) {
          DeviceTensor ds = up(s0), dpost = up(post0), dcomb = up(comb0), pre = poisoned({t, hc});
          DeviceTensor mpost = poisoned({t, hc}), mcomb = poisoned({t, hc, hc});
          const HcExpandParams e{ds, dy, dpost, dcomb};
          const HcMixParams m{ds, dfn, dbase, dscale, pre, mpost, mcomb};
          settle();
          if (form == 0) {
            gpu().hc_expand_mix({e, m});
          } else {
            gpu().hc_expand(e);
            gpu().hc_mix(m);
          }
          const HostTensor got[4] = {down(ds), down(pre), down(mpost), down(mcomb)};
          const std::string what = "hc_expand_mix d" + std::to_string(d) + " t" + std::to_string(t) + " form " +
                                   std::to_string(form) + (rep ? " again" : "");
          for (int i = 0; i < 4; ++i) {
            if (rep == 0) {
              out[form][i] = clone(got[i]);
            } else {
              expect_same_bytes(what.c_str(), got[i], out[form][i]);
            }
          }
        }
      }
      const std::string what = "hc_expand_mix d" + std::to_string(d) + " t" + std::to_string(t);
      const char* names[4] = {" streams", " pre", " post", " comb"};
      for (int i = 0; i < 4; ++i) {
        expect_same_bytes((what + " fused vs unfused" + names[i]).c_str(), out[0][i], out[1][i]);
      }
      // And the coefficients against the CPU op over the CPU's own expand.
      HostTensor cs(DType::kF32, s0.shape()), cpost(DType::kF32, {t, hc}), ccomb(DType::kF32, {t, hc, hc});
      std::memcpy(cs.view().data(), s0.view().data(), s0.view().nbytes());
      HostTensor cpre(DType::kF32, {t, hc}), mp(DType::kF32, {t, hc}), mc(DType::kF32, {t, hc, hc});
      std::memcpy(cpost.view().data(), post0.view().data(), post0.view().nbytes());
      std::memcpy(ccomb.view().data(), comb0.view().data(), comb0.view().nbytes());
      cpu().hc_expand({cs, y, cpost, ccomb});
      cpu().hc_mix({cs, fn, base, scale, cpre, mp, mc});
      rel_err((what + " streams vs cpu").c_str(), out[0][0], cs, 1e-6);
      rel_err((what + " pre vs cpu").c_str(), out[0][1], cpre, 1e-5);
      rel_err((what + " post vs cpu").c_str(), out[0][2], mp, 1e-5);
      rel_err((what + " comb vs cpu").c_str(), out[0][3], mc, 1e-5);
    }
  }
}

// The one-launch hc_mix (finish from partials staged in shared memory) at V4.1's D = 5120 and V4's 7168, batch 1 and
// 16, mix and head: against the two-launch form bit for bit.
TEST_F(CudaDecodeOpTest, HcMixDecodeShapesStagedFinishBitwise) {
  DeviceTensor arrivals = hc_mix_arrivals();
  const int64_t hc = 4;
  for (int64_t d : {int64_t{5120}, int64_t{7168}}) {
    for (bool head : {false, true}) {
      const int64_t rows = head ? hc : (2 + hc) * hc;
      HostTensor fn = rand({rows, hc * d}, -0.05f, 0.05f), base = rand({rows}, -0.5f, 0.5f), scale = rand({3});
      DeviceTensor dfn = up(fn), dbase = up(base), dscale = up(scale);
      for (int64_t t : {int64_t{1}, int64_t{16}}) {
        DeviceTensor ds = up(rand({t, hc, d}, -2, 2));
        std::vector<std::array<HostTensor, 3>> out;  // [two launches, one launch][pre, post, comb]
        ASSERT_NO_FATAL_FAILURE(hc_mix_forms(2, ds, dfn, dbase, dscale, arrivals, t, hc, d, head, out));
        const std::string what =
            "hc_mix d" + std::to_string(d) + (head ? " head" : "") + " t" + std::to_string(t) + " one launch";
        for (int i = 0; i < (head ? 1 : 3); ++i) expect_same_bytes(what.c_str(), out[1][i], out[0][i]);
      }
    }
  }
  expect_arrivals_zero(arrivals);
}

// hc_collapse_norm at V4.1's D = 5120 (and 4096, 7168), batch 1 / 16 / 64: the register kernel against the unfused
// pair bit for bit, and against the CPU op.
TEST_F(CudaDecodeOpTest, HcCollapseNormDecodeShapesRegisterKernelBitwise) {
  const int64_t hc = 4;
  for (int64_t d : {int64_t{4096}, int64_t{5120}, int64_t{7168}}) {
    for (int64_t t : {int64_t{1}, int64_t{16}, int64_t{64}}) {
      HostTensor streams = rand({t, hc, d}, -3, 3), pre = rand({t, hc}, 0.1f, 2.0f), w = rand({d});
      DeviceTensor ds = up(streams), dp = up(pre), dw = up(w);
      for (bool weighted : {true, false}) {
        const std::string what =
            "hc_collapse_norm d" + std::to_string(d) + " t" + std::to_string(t) + (weighted ? " weighted" : "");
        const Tensor weight = weighted ? dw.view() : Tensor{};
        DeviceTensor unfused = poisoned({t, d}), now = poisoned({t, d});
        settle();
        gpu().hc_collapse({ds, dp, unfused});
        gpu().rms_norm({unfused, weight, unfused, 1e-6f});
        gpu().hc_collapse_norm({ds, dp, weight, now, 1e-6f});
        const HostTensor got = down(now);
        expect_same_bytes((what + " vs unfused").c_str(), got, down(unfused));
        HostTensor want(DType::kF32, {t, d});
        cpu().hc_collapse_norm({streams, pre, weighted ? w.view() : Tensor{}, want, 1e-6f});
        rel_err((what + " vs cpu").c_str(), got, want, 1e-6);
      }
    }
  }
}

// moe_combine (run directly) at V4.1's D = 5120, k = 6 (+ shared) and V4's 7168, k = 8, T = 1 / 16 (the small
// kernel) and 17 (the span kernel), with weights and without, a repeated expert (hash routing) and an out-of-range
// id: against a host sum in expert-id order. (The small kernel against the span kernel bit for bit until session 19,
// when its A/B switch went.)
TEST_F(CudaDecodeOpTest, MoeCombineDecodeShapesSmallKernelBitwise) {
  struct Shape2 {
    int64_t d, k;
    int experts;
  };
  for (const Shape2 s : {Shape2{5120, 6, 384}, Shape2{7168, 8, 256}}) {
    for (int64_t t : {int64_t{1}, int64_t{16}, int64_t{17}}) {
      HostTensor y = rand({t * s.k, s.d}, -2, 2), w = rand({t, s.k}, 0.01f, 1.0f), sh = rand({t, s.d}, -1, 1);
      HostTensor ids = ints(DType::kI32, {t, s.k}, 0, s.experts - 1);
      ids.data<int32_t>()[0] = ids.data<int32_t>()[s.k - 1];  // a repeated expert: slot order breaks the tie
      if (t > 1) ids.data<int32_t>()[s.k + 1] = s.experts;    // out of range: left out
      DeviceTensor dy = up(y), dw = up(w), dsh = up(sh), di = up(ids);
      for (bool weighted : {true, false}) {
        for (bool shared : {true, false}) {
          HostTensor got;
          {
            DeviceTensor out = poisoned({t, s.d});
            cuda::MoeCombineKernelParams p;
            p.y_slot = static_cast<const float*>(dy.data());
            p.indices = static_cast<const int32_t*>(di.data());
            p.weights = weighted ? static_cast<const float*>(dw.data()) : nullptr;
            p.shared = shared ? static_cast<const float*>(dsh.data()) : nullptr;
            p.out = static_cast<float*>(out.data());
            p.tokens = t;
            p.k = s.k;
            p.d = s.d;
            p.experts = s.experts;
            settle();
            cuda::run_moe_combine(p, gpu().stream());
            got = down(out);
          }
          const std::string what = "moe_combine d" + std::to_string(s.d) + " k" + std::to_string(s.k) + " t" +
                                   std::to_string(t) + (weighted ? " weighted" : "") + (shared ? " shared" : "");
          HostTensor want(DType::kF32, {t, s.d});
          for (int64_t r = 0; r < t; ++r) {
            std::vector<int64_t> order(s.k);
            std::iota(order.begin(), order.end(), 0);
            const int32_t* id = ids.data<int32_t>() + r * s.k;
            std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return id[a] < id[b]; });
            for (int64_t i = 0; i < s.d; ++i) {
              double acc = 0;
              for (int64_t j : order) {
                if (id[j] < 0 || id[j] >= s.experts) continue;
                const double v = y.data<float>()[(r * s.k + j) * s.d + i];
                acc += weighted ? v * w.data<float>()[r * s.k + j] : v;
              }
              if (shared) acc += sh.data<float>()[r * s.d + i];
              want.data<float>()[r * s.d + i] = static_cast<float>(acc);
            }
          }
          rel_err((what + " vs host").c_str(), got, want, 2e-6);
        }
      }
    }
  }
}

// Decode paged attention at V4.1's attention shape (64 heads x 512, window 128 + 512 selected, pages of 64, contexts
// up to 4096) for 1 and 16 sequences, and smaller 16- and 2-split calls (the float4 combine, the key prefetch, 32-slot
// splits) against the CPU op within the kernel's tolerance. (Bit for bit against the previous combine, key loads and
// 64-slot splits until session 19, when their A/B switches went.)
TEST_F(CudaDecodeOpTest, PagedAttentionDecodeShapesCombineAndSplits) {
  struct Shape {
    int64_t seqs, heads, hd, k_sel;
    int window;
    int64_t min_ctx, max_ctx;
  };
  // V4.1 at batch 1 (20 splits: the 32-split combine) and 16 (7: the 8-split one), a one-group call of 16 splits and
  // a small call of 2.
  for (const Shape& sh : {Shape{1, 64, 512, 512, 128, 3000, 4096}, Shape{16, 64, 512, 512, 128, 3000, 4096},
                          Shape{1, 8, 128, 384, 128, 2000, 3000}, Shape{8, 16, 128, 32, 32, 200, 300}}) {
    const int64_t seqs = sh.seqs;
    testing::PagedAttentionSpec spec;
    spec.seqs = seqs;
    spec.heads = sh.heads;
    spec.hd = sh.hd;
    spec.k_sel = sh.k_sel;
    spec.block_size = 64;
    spec.window = sh.window;
    spec.min_context = sh.min_ctx;
    spec.max_context = sh.max_ctx;
    const testing::PagedAttentionCase c = testing::make_paged_attention_case(spec, rng()());
    HostTensor want(DType::kF32, {c.tokens, spec.heads, spec.hd});
    cpu().paged_sink_attention(c.params(want.view()));
    DeviceTensor dq = up(c.q), dqp = up(c.q_pos), dqs = up(c.q_seq), dt = up(c.tables), dw = up(c.window_pool);
    DeviceTensor dwb = up(c.window_begin), dc = up(c.comp_pool), di = up(c.comp_idx), dsk = up(c.sinks);
    HostTensor got;
    {
      DeviceTensor dout = poisoned({c.tokens, spec.heads, spec.hd});
      settle();
      gpu().paged_sink_attention(c.params({dq, dqp, dqs, dt, dw, dwb, dc, di, dsk}, dout));
      got = down(dout);
    }
    const std::string what = "paged_sink_attention decode B=" + std::to_string(seqs) +
                             " H=" + std::to_string(sh.heads) + " hd=" + std::to_string(sh.hd);
    rel_err((what + " vs cpu").c_str(), got, want, 1e-5);
    // Batch-invariant mode takes the combine too (fixed 256-slot splits): against the CPU op.
    gpu().set_batch_invariant(true);
    DeviceTensor dout = poisoned({c.tokens, spec.heads, spec.hd});
    settle();
    gpu().paged_sink_attention(c.params({dq, dqp, dqs, dt, dw, dwb, dc, di, dsk}, dout));
    gpu().set_batch_invariant(false);
    rel_err((what + " batch-invariant vs cpu").c_str(), down(dout), want, 1e-5);
  }
}

// rope over head groups at the attention output's shape (64 heads x 512, 64 rotated channels) and the indexer's
// (64 x 128), batch 1 / 16 / 64, forward and inverse, against the CPU op. (Bit for bit against the previous
// one-block-per-token launch until session 17, when its A/B switch went.)
TEST_F(CudaDecodeOpTest, RopeDecodeShapesHeadGroupsMatchCpu) {
  for (auto [h, hd] : {std::pair<int64_t, int64_t>{64, 512}, {64, 128}, {3, 192}}) {
    const int64_t half = 32;
    HostTensor inv(DType::kF32, {half});
    for (int64_t i = 0; i < half; ++i) inv.data<float>()[i] = std::pow(10000.0f, -static_cast<float>(i) / half);
    for (int64_t t : {int64_t{1}, int64_t{16}, int64_t{64}}) {
      HostTensor x = rand({t, h, hd}, -2, 2), pos = ints(DType::kI64, {t}, 0, 70000);
      DeviceTensor dp = up(pos), di = up(inv);
      for (bool inverse : {false, true}) {
        HostTensor want(DType::kF32, x.shape());
        std::memcpy(want.view().data(), x.view().data(), x.view().nbytes());
        cpu().rope({want, pos, inv, inverse});
        DeviceTensor now = up(x);
        settle();
        gpu().rope({now, dp, di, inverse});
        const std::string what = "rope h" + std::to_string(h) + " hd" + std::to_string(hd) + " t" + std::to_string(t) +
                                 (inverse ? " inverse" : "");
        rel_err((what + " vs cpu").c_str(), down(now), want, 1e-6);
      }
    }
  }
}

// The decode indexer at V4's shape (64 heads x 128, ratio 4, pages of 64, up to 1024 entries a sequence) for 4 and
// 16 sequences, then batch 1 (row 0 alone, 1024 entries); an odd head count (the key slots' alignment), a 576-dim row
// (the element-wise tail past 512) and an odd dim that keeps the one-entry kernel: the batch-1 call and the contiguous
// form (row 0's keys gathered) against the batched row bit for bit, and against the CPU op. (The two-entries-a-warp
// kernel against the one-entry kernel bit for bit until session 19, when its A/B switch went.) The SIMT kernels
// throughout (indexer_mma = kNever): from 16 sequences the default is the tensor-core kernel
// (cuda_paged_indexer_test.cc).
TEST_F(CudaDecodeOpTest, IndexerScoresDecodeShapesTwoEntriesBitwise) {
  testing::ScopedKernelChoices simt(gpu(), [](cuda::KernelChoices& k) { k.indexer_mma = cuda::KernelPick::kNever; });
  for (auto [seqs, heads, dim] :
       {std::tuple<int64_t, int64_t, int64_t>{4, 64, 128}, {16, 64, 128}, {3, 64, 100}, {5, 7, 128}, {4, 2, 576}}) {
    testing::PagedIndexerSpec s;
    s.seqs = seqs;
    s.heads = heads;
    s.dim = dim;
    s.max_entries = 1024;
    s.block_size = 64;
    s.ratio = 4;
    const testing::PagedIndexerCase c = testing::make_paged_indexer_case(s, rng()());
    HostTensor want(DType::kF32, {s.seqs, c.n});
    cpu().paged_indexer_scores(c.params(want.view()));
    DeviceTensor dq = up(c.q), dw = up(c.weights), dp = up(c.positions), ds = up(c.q_seq), dn = up(c.n_entries);
    DeviceTensor dt = up(c.tables), dpool = up(c.pool);
    const std::string what = "paged_indexer_scores B=" + std::to_string(seqs) + " IH=" + std::to_string(heads) +
                             " Id=" + std::to_string(dim);
    HostTensor got;
    {
      DeviceTensor dout = poisoned({s.seqs, c.n});
      settle();
      gpu().paged_indexer_scores(c.params({dq, dw, dp, ds, dn, dt, dpool}, dout));
      got = down(dout);
    }
    rel_err((what + " vs cpu").c_str(), got, want, 1e-5);
    // Row 0 (1024 entries) alone: batch 1, paged and contiguous, both kernels: row 0's bytes of the batched call.
    const int64_t ne = c.entries(0);
    ASSERT_EQ(ne, s.max_entries);
    DeviceTensor keys = up(c.keys[0]);
    {
      DeviceTensor paged = poisoned({1, c.n}), contiguous = poisoned({1, ne});
      settle();
      gpu().paged_indexer_scores(c.params({dq.view().slice(0, 1), dw.view().slice(0, 1), dp.view().slice(0, 1),
                                           ds.view().slice(0, 1), dn.view().slice(0, 1), dt, dpool},
                                          paged));
      gpu().indexer_scores({dq.view().slice(0, 1), keys, dw.view().slice(0, 1), dp.view().slice(0, 1), contiguous,
                            s.ratio, c.score_scale, c.weight_scale});
      const HostTensor p1 = down(paged), c1 = down(contiguous);
      EXPECT_EQ(std::memcmp(p1.data<float>(), got.data<float>(), sizeof(float) * c.n), 0)
          << what << " batch 1 paged (seed " << seed_ << ")";
      EXPECT_EQ(std::memcmp(c1.data<float>(), got.data<float>(), sizeof(float) * ne), 0)
          << what << " batch 1 contiguous (seed " << seed_ << ")";
    }
  }
}

}  // namespace
}  // namespace deepinfer
