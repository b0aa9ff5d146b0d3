// MLA attention (V3 family) on the GPU against the CPU op: the absorbed form at small dims and at V3's
// (H=128, dn=128, dr=64, r=512, dv=128), decode (one query, split over the keys) and a few queries with causal
// masks; cache rows no query may see are NaN; a query that sees nothing gets zeros. The CUDA naive entry point
// is compared with the CPU naive form (the absorbed kernels below 64 queries; from there the flash kernel over a bf16x3
// expansion by default, on warpgroup MMAs on sm_90a, ~2^-16 a product: 3e-5, or with mla_flash and mla_bf16x3 off fp32
// GEMMs). fp32 in another summation order: 2e-5.
#include <functional>
#include <numeric>

#include "cuda_test_util.h"
#include "deepinfer/ops/cuda/kernels.h"
#include "ops/paged_mla_case.h"

namespace deepinfer::testing {
namespace {

TEST_F(CudaOpTest, MlaAttentionMatchesCpu) {
  struct Case {
    int64_t t, h, dn, dr, r, dv, s;
  };
  // From 64 queries the naive entry runs on the flash kernel (or, with mla_flash off, on GEMMs: head groups, logits,
  // causal softmax, P·V): a prefill-like chunk at small dims and at V3's, its cache rows past the newest query NaN as
  // above.
  for (const Case& c :
       {Case{5, 4, 16, 8, 64, 24, 40}, Case{1, 128, 128, 64, 512, 128, 700}, Case{3, 128, 128, 64, 512, 128, 300},
        Case{70, 6, 16, 8, 64, 24, 120}, Case{130, 128, 128, 64, 512, 128, 400}, Case{2500, 4, 32, 16, 64, 32, 2600}}) {
    HostTensor q = rand({c.t, c.h, c.dn + c.dr}), kv = rand({c.s, c.r + c.dr});
    HostTensor kv_b = rand({c.h * (c.dn + c.dv), c.r}, -0.1f, 0.1f);
    HostTensor qpos(DType::kI64, {c.t}), kvpos(DType::kI64, {c.s});
    for (int64_t i = 0; i < c.s; ++i) kvpos.data<int64_t>()[i] = 10 + i;
    // Queries near the end; the first of a multi-query case sees nothing (position before every row).
    for (int64_t i = 0; i < c.t; ++i) qpos.data<int64_t>()[i] = c.t > 1 && i == 0 ? 5 : 10 + c.s - 1 - 3 * i;
    int64_t newest = 0;
    for (int64_t i = 0; i < c.t; ++i) newest = std::max(newest, qpos.data<int64_t>()[i]);
    for (int64_t s = 0; s < c.s; ++s)
      if (kvpos.data<int64_t>()[s] > newest)
        for (int64_t j = 0; j < c.r + c.dr; ++j) kv.data<float>()[s * (c.r + c.dr) + j] = NAN;
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.dn + c.dr));
    HostTensor want(DType::kF32, {c.t, c.h, c.dv}), want_naive(DType::kF32, {c.t, c.h, c.dv});
    cpu().mla_attention_absorbed({q, qpos, kv, kvpos, kv_b, want, static_cast<int>(c.dr), scale});
    cpu().mla_attention_naive({q, qpos, kv, kvpos, kv_b, want_naive, static_cast<int>(c.dr), scale});
    DeviceTensor dq = up(q), dqp = up(qpos), dkv = up(kv), dkvp = up(kvpos), dkvb = up(kv_b);
    DeviceTensor dout = poisoned({c.t, c.h, c.dv}), dnaive = poisoned({c.t, c.h, c.dv});
    gpu().mla_attention_absorbed({dq, dqp, dkv, dkvp, dkvb, dout, static_cast<int>(c.dr), scale});
    const std::string n = " T=" + std::to_string(c.t) + " H=" + std::to_string(c.h) + " S=" + std::to_string(c.s);
    const HostTensor got = down(dout);
    rel_err(("mla absorbed" + n).c_str(), got, want, 2e-5);
    // The layout facts (rows in position order from kvpos[0], the query positions on the host): the GEMM path then
    // attends each query chunk's rows up to its newest position only; the same values.
    DeviceTensor dhint = poisoned({c.t, c.h, c.dv});
    MlaAttentionParams hinted{dq, dqp, dkv, dkvp, dkvb, dhint, static_cast<int>(c.dr), scale};
    hinted.kv_first_position = 10;
    hinted.host_q_positions = std::span<const int64_t>(qpos.data<int64_t>(), static_cast<size_t>(c.t));
    // The default (from 64 queries the flash kernel over a bf16x3 expansion), kept for the flash cases below.
    DeviceTensor ddefault = poisoned({c.t, c.h, c.dv});
    MlaAttentionParams pdefault = hinted;
    pdefault.out = ddefault;
    gpu().mla_attention_naive(pdefault);
    const HostTensor by_default = down(ddefault);
    const bool wgmma_default = cuda::mla_flash_wgmma_takes(c.dn + c.dr, c.dv);
    {
      // Full fp32 (mla_flash and mla_bf16x3 off): cuBLASLt's fp32 GEMMs, 2e-5.
      ScopedKernelChoices fp32(gpu(), [](cuda::KernelChoices& ch) {
        ch.mla_flash = false;
        ch.mla_bf16x3 = false;
      });
      gpu().mla_attention_naive({dq, dqp, dkv, dkvp, dkvb, dnaive, static_cast<int>(c.dr), scale});
      rel_err(("mla naive entry, fp32" + n).c_str(), down(dnaive), want_naive, 2e-5);
      gpu().mla_attention_naive(hinted);
      rel_err(("mla naive entry, fp32, causal layout" + n).c_str(), down(dhint), want_naive, 2e-5);
    }
    {
      // mla_bf16x3 without the flash kernel: the GEMMs as bf16 products of each operand's hi / lo terms, ~2^-16
      // relative a product: 3e-5 (tools/mla_bf16x3_emulate.py: 5.4-6.1e-6 on the CPU; the absorbed kernels below 64
      // queries are unaffected).
      ScopedKernelChoices x3(gpu(), [](cuda::KernelChoices& ch) {
        ch.mla_flash = false;
        ch.mla_bf16x3 = true;
      });
      for (const bool layout : {false, true}) {
        DeviceTensor dx3 = poisoned({c.t, c.h, c.dv});
        MlaAttentionParams p3 = hinted;
        p3.out = dx3;
        if (!layout) {
          p3.kv_first_position = -1;
          p3.host_q_positions = {};
        }
        gpu().mla_attention_naive(p3);
        rel_err(("mla naive entry, bf16x3" + std::string(layout ? ", causal layout" : "") + n).c_str(), down(dx3),
                want_naive, 3e-5);
      }
    }
    // mla_flash (the default): the logits, softmax and P·V in one flash kernel with bf16x3 products and an online
    // softmax, the expansion GEMM in fp32 or bf16x3: 3e-5 as the bf16x3 GEMMs. A query that sees nothing: zeros.
    // Blocks of 64 queries (the default, which gives these bytes) and of 128 (mla_flash_rows: double-buffered key
    // tiles).
    for (const int rows : {64, 128})
      for (const bool x3 : {false, true})
        for (const bool layout : {false, true}) {
          ScopedKernelChoices flash(gpu(), [&](cuda::KernelChoices& ch) {
            ch.mla_flash = true;
            ch.mla_bf16x3 = x3;
            ch.mla_flash_rows = rows;
            ch.mla_flash_wgmma = false;  // the mma.sync kernel's forms (the wgmma one below)
          });
          DeviceTensor dfl = poisoned({c.t, c.h, c.dv});
          MlaAttentionParams pf = hinted;
          pf.out = dfl;
          if (!layout) {
            pf.kv_first_position = -1;
            pf.host_q_positions = {};
          }
          gpu().mla_attention_naive(pf);
          const HostTensor fl = down(dfl);
          if (rows == 64 && x3 && layout && !wgmma_default) {
            EXPECT_EQ(std::memcmp(fl.data<float>(), by_default.data<float>(), sizeof(float) * fl.numel()), 0)
                << "off sm_90a the default is the mma.sync flash kernel over a bf16x3 expansion" << n;
          }
          {
            // mla_lazy_rescale=0: the rescale by exactly 1 done, the same bits as the default's skip.
            ScopedKernelChoices lazy(gpu(), [](cuda::KernelChoices& ch) { ch.mla_lazy_rescale = false; });
            DeviceTensor dlazy = poisoned({c.t, c.h, c.dv});
            MlaAttentionParams pl = pf;
            pl.out = dlazy;
            gpu().mla_attention_naive(pl);
            const HostTensor lz = down(dlazy);
            EXPECT_EQ(std::memcmp(lz.data<float>(), fl.data<float>(), sizeof(float) * fl.numel()), 0)
                << "flash, eager rescale, " << rows << " rows" << n;
          }
          {
            // mla_flash_split_s=0: S's hi·hi and cross terms in one accumulator (the default sums them apart),
            // another fp32 order: 3e-5 as above.
            ScopedKernelChoices split(gpu(), [](cuda::KernelChoices& ch) { ch.mla_flash_split_s = false; });
            DeviceTensor dsplit = poisoned({c.t, c.h, c.dv});
            MlaAttentionParams ps = pf;
            ps.out = dsplit;
            gpu().mla_attention_naive(ps);
            rel_err(("mla naive entry, flash, one S accumulator, " + std::to_string(rows) + " rows" + n).c_str(),
                    down(dsplit), want_naive, 3e-5);
          }
          rel_err(("mla naive entry, flash" + std::string(rows == 128 ? " 128 rows" : "") +
                   (x3 ? ", bf16x3 expansion" : "") + (layout ? ", causal layout" : "") + n)
                      .c_str(),
                  fl, want_naive, 3e-5);
          if (c.t >= 64 && c.t > 1)
            for (int64_t i = 0; i < c.h * c.dv; ++i)
              ASSERT_EQ(fl.data<float>()[i], 0.0f) << "flash: query with no visible key";
        }
    // mla_flash_wgmma (sm_90a, the default there): the same products on warpgroup MMAs, 64-key tiles, V transposed;
    // another fp32 order, 3e-5; smaller heads zero-padded to 192 / 128.
    if (c.t >= 64 && wgmma_default)
      for (const bool layout : {false, true}) {
        ScopedKernelChoices wg(gpu(), [](cuda::KernelChoices& ch) { ch.mla_flash_wgmma = true; });
        DeviceTensor dwg = poisoned({c.t, c.h, c.dv});
        MlaAttentionParams pw = hinted;
        pw.out = dwg;
        if (!layout) {
          pw.kv_first_position = -1;
          pw.host_q_positions = {};
        }
        gpu().mla_attention_naive(pw);
        const HostTensor wgo = down(dwg);
        rel_err(("mla naive entry, flash wgmma" + std::string(layout ? ", causal layout" : "") + n).c_str(), wgo,
                want_naive, 3e-5);
        for (int64_t i = 0; i < c.h * c.dv; ++i)
          ASSERT_EQ(wgo.data<float>()[i], 0.0f) << "flash wgmma: query with no visible key";
        if (layout)
          EXPECT_EQ(std::memcmp(wgo.data<float>(), by_default.data<float>(), sizeof(float) * wgo.numel()), 0)
              << "the default on sm_90a is the wgmma flash kernel over a bf16x3 expansion" << n;
      }
    if (c.t > 1)
      for (int64_t i = 0; i < c.h * c.dv; ++i) ASSERT_EQ(got.data<float>()[i], 0.0f) << "query with no visible key";
  }
}

// A prefill chunk as the model gives it (2100 new queries at positions 200 .. 2299 over the sequence's 2300 rows in
// position order, the layout facts set): the GEMM path's query chunks of 1024 attend 1224, 2248 and 2300 rows; against
// the CPU naive op, 2e-5 (TF32 products, the mla_tf32 A/B choice: 5e-3; bf16x3, mla_bf16x3, and the flash kernel,
// mla_flash: 3e-5).
TEST_F(CudaOpTest, MlaAttentionCausalPrefillChunksMatchCpu) {
  const int64_t t = 2100, h = 8, dn = 32, dr = 16, r = 64, dv = 32, s = 2300;
  HostTensor q = rand({t, h, dn + dr}), kv = rand({s, r + dr}), kv_b = rand({h * (dn + dv), r}, -0.1f, 0.1f);
  HostTensor qpos(DType::kI64, {t}), kvpos(DType::kI64, {s});
  std::iota(kvpos.data<int64_t>(), kvpos.data<int64_t>() + s, int64_t{0});
  std::iota(qpos.data<int64_t>(), qpos.data<int64_t>() + t, s - t);
  const float scale = 1.0f / std::sqrt(static_cast<float>(dn + dr));
  HostTensor want(DType::kF32, {t, h, dv});
  cpu().mla_attention_naive({q, qpos, kv, kvpos, kv_b, want, static_cast<int>(dr), scale});
  DeviceTensor dq = up(q), dqp = up(qpos), dkv = up(kv), dkvp = up(kvpos), dkvb = up(kv_b);
  {
    // Full fp32 (mla_flash and mla_bf16x3 off): 2e-5.
    ScopedKernelChoices fp32(gpu(), [](cuda::KernelChoices& c) {
      c.mla_flash = false;
      c.mla_bf16x3 = false;
    });
    for (const bool hint : {false, true}) {
      DeviceTensor dout = poisoned({t, h, dv});
      MlaAttentionParams p{dq, dqp, dkv, dkvp, dkvb, dout, static_cast<int>(dr), scale};
      if (hint) {
        p.kv_first_position = 0;
        p.host_q_positions = std::span<const int64_t>(qpos.data<int64_t>(), static_cast<size_t>(t));
      }
      gpu().mla_attention_naive(p);
      rel_err(hint ? "mla naive prefill, fp32, causal layout" : "mla naive prefill, fp32, no layout facts", down(dout),
              want, 2e-5);
    }
  }
  // mla_tf32 (an A/B choice, the three GEMMs without mla_bf16x3 and mla_flash): TF32 products round q, the keys, p and
  // v to 10 mantissa bits (2^-11 relative each): 5e-3.
  ScopedKernelChoices tf32(gpu(), [](cuda::KernelChoices& c) {
    c.mla_tf32 = true;
    c.mla_bf16x3 = false;
    c.mla_flash = false;
  });
  DeviceTensor dout = poisoned({t, h, dv});
  MlaAttentionParams p{dq, dqp, dkv, dkvp, dkvb, dout, static_cast<int>(dr), scale};
  p.kv_first_position = 0;
  p.host_q_positions = std::span<const int64_t>(qpos.data<int64_t>(), static_cast<size_t>(t));
  gpu().mla_attention_naive(p);
  rel_err("mla naive prefill, tf32", down(dout), want, 5e-3);
  // mla_bf16x3 (takes precedence over mla_tf32): three bf16 products of the hi / lo terms, ~2^-16 a product: 3e-5.
  ScopedKernelChoices x3(gpu(), [](cuda::KernelChoices& c) { c.mla_bf16x3 = true; });
  DeviceTensor dx3 = poisoned({t, h, dv});
  p.out = dx3;
  gpu().mla_attention_naive(p);
  rel_err("mla naive prefill, bf16x3", down(dx3), want, 3e-5);
  // mla_flash: one flash pass a head group (blocks of 64 or 128 queries stop at their newest row with the layout
  // facts; all 2300 rows without): 3e-5.
  for (const int rows : {64, 128})
    for (const bool hint : {false, true}) {
      ScopedKernelChoices flash(gpu(), [&](cuda::KernelChoices& c) {
        c.mla_flash = true;
        c.mla_flash_rows = rows;
        c.mla_flash_wgmma = false;
      });
      DeviceTensor dfl = poisoned({t, h, dv});
      MlaAttentionParams pf = p;
      pf.out = dfl;
      if (!hint) {
        pf.kv_first_position = -1;
        pf.host_q_positions = {};
      }
      gpu().mla_attention_naive(pf);
      rel_err(
          (std::string("mla naive prefill, flash ") + std::to_string(rows) + " rows" + (hint ? ", causal layout" : ""))
              .c_str(),
          down(dfl), want, 3e-5);
    }
  // mla_flash_wgmma: the same on warpgroup MMAs (128-query blocks, 64-key tiles), 3e-5.
  if (cuda::mla_flash_wgmma_takes(dn + dr, dv))
    for (const bool hint : {false, true}) {
      ScopedKernelChoices wg(gpu(), [&](cuda::KernelChoices& c) {
        c.mla_flash = true;
        c.mla_flash_wgmma = true;
      });
      DeviceTensor dwg = poisoned({t, h, dv});
      MlaAttentionParams pw = p;
      pw.out = dwg;
      if (!hint) {
        pw.kv_first_position = -1;
        pw.host_q_positions = {};
      }
      gpu().mla_attention_naive(pw);
      rel_err(hint ? "mla naive prefill, flash wgmma, causal layout" : "mla naive prefill, flash wgmma", down(dwg),
              want, 3e-5);
    }
}

// The paged decode kernels against the CPU's paged op: several sequences of different lengths over shuffled,
// non-contiguous pages (one block shared by two sequences), unused pool rows NaN, the output NaN-poisoned; small
// dims (4 heads: a partial head group, r = 64) and V3's (128 heads, r = 512, dr = 64), one query per sequence and
// three. fp32 in another summation order (split-K merged by log-sum-exp): 2e-5. With paged_mla_mma the attend step
// of the V3 shapes (latent 512, rope 64) runs on bf16x3 tensor-core products instead: 3e-5, as the flash MLA kernel;
// their cases add long contexts (many 16-key tiles a split, the three key buffers reused) and V2-Lite's 16 heads and 5
// heads (16-head blocks, paged_mla_16; with it off, half or less of a 32-head block: the same bits); with
// mla_lazy_rescale=0 the same bits. Every case again from a bf16 pool (--kv-cache-dtype bf16): against the CPU op on
// that pool (the same tolerances) and the same bits as the f32 pool holding the rounded rows (the tensor-core kernel
// drops only products with the keys' lo terms, zeros then; the fp32 kernel widens the rows as it stages them); with
// 16-head blocks also two blocks an SM (paged_mla_two_blocks flipped: other splits, the same tolerance).
TEST_F(CudaOpTest, PagedMlaAttentionMatchesCpu) {
  struct Case {
    PagedMlaSpec spec;
    const char* name;
  };
  std::vector<Case> cases;
  {
    PagedMlaSpec s;
    s.seqs = 5;
    s.min_context = 1;
    s.max_context = 200;
    cases.push_back({s, "small decode"});
    s.tokens_per_seq = 3;
    s.min_context = 3;
    cases.push_back({s, "small 3/seq"});
  }
  {
    PagedMlaSpec s;
    s.seqs = 3;
    s.heads = 128;
    s.dn = 128;
    s.dr = 64;
    s.dv = 128;
    s.r = 512;
    s.block_size = 64;
    s.min_context = 40;
    s.max_context = 700;
    cases.push_back({s, "V3 decode"});
    s.seqs = 40;  // more than one 32-token group in the absorb and project kernels
    s.min_context = 1;
    s.max_context = 100;
    cases.push_back({s, "V3 decode B=40"});
    s.seqs = 2;
    s.tokens_per_seq = 2;
    s.min_context = 300;
    s.max_context = 400;
    cases.push_back({s, "V3 2/seq"});
    s.tokens_per_seq = 1;
    s.min_context = 3000;
    s.max_context = 4500;
    cases.push_back({s, "V3 long"});
    s.heads = 16;
    s.seqs = 3;
    s.min_context = 1;
    s.max_context = 900;
    cases.push_back({s, "V2-Lite heads"});
    s.min_context = 3000;
    s.max_context = 4500;
    cases.push_back({s, "V2-Lite heads long"});
    s.heads = 5;  // a partial 16-head block
    s.min_context = 1;
    s.max_context = 700;
    cases.push_back({s, "5 heads"});
  }
  for (const cuda::KernelPick pick : {cuda::KernelPick::kNever, cuda::KernelPick::kAlways})
    for (const Case& k : cases) {
      const bool mma = pick == cuda::KernelPick::kAlways;
      if (mma && (k.spec.r != 512 || k.spec.dr != 64)) continue;
      ScopedKernelChoices choice(gpu(), [&](cuda::KernelChoices& ch) { ch.paged_mla_mma = pick; });
      const PagedMlaCase c = make_paged_mla_case(k.spec, rng()());
      const Shape out_shape{c.tokens, k.spec.heads, k.spec.dv};
      HostTensor want(DType::kF32, out_shape);
      cpu().paged_mla_attention(c.params(want.view()));
      DeviceTensor dq = up(c.q), dpos = up(c.q_pos), dseq = up(c.q_seq), dtab = up(c.tables), dpool = up(c.pool),
                   dkvb = up(c.kv_b), dout = poisoned(out_shape);
      PagedMlaAttentionParams p;
      p.q = dq;
      p.q_positions = dpos;
      p.q_seq = dseq;
      p.block_tables = dtab;
      p.kv_pool = dpool;
      p.kv_b = dkvb;
      p.out = dout;
      p.block_size = k.spec.block_size;
      p.rope_dim = static_cast<int>(k.spec.dr);
      p.scale = c.scale;
      gpu().paged_mla_attention(p);
      const HostTensor got = down(dout);
      const std::string what = std::string(mma ? "paged mla, tensor cores, " : "paged mla ") + k.name;
      rel_err(what.c_str(), got, want, mma ? 3e-5 : 2e-5);
      {  // The same batch from a bf16 pool (--kv-cache-dtype bf16).
        const HostTensor bf16 = c.bf16_pool(), rounded = c.rounded_pool();
        HostTensor want16(DType::kF32, out_shape);
        PagedMlaAttentionParams hp = c.params(want16.view());
        hp.kv_pool = bf16.view();
        cpu().paged_mla_attention(hp);
        const DeviceTensor d16 = up(bf16), drounded = up(rounded), o16 = poisoned(out_shape),
                           oref = poisoned(out_shape);
        PagedMlaAttentionParams q = p;
        q.kv_pool = d16;
        q.out = o16;
        gpu().paged_mla_attention(q);
        q.kv_pool = drounded;
        q.out = oref;
        gpu().paged_mla_attention(q);
        const HostTensor got16 = down(o16), ref = down(oref);
        rel_err((what + ", bf16 pool").c_str(), got16, want16, mma ? 3e-5 : 2e-5);
        EXPECT_EQ(std::memcmp(got16.data<float>(), ref.data<float>(), sizeof(float) * got16.numel()), 0)
            << what << ", bf16 pool: not the f32 pool's bits over the rounded rows";
        if (mma && k.spec.heads <= 16) {  // paged_mla_two_blocks flipped: other splits, the same bound
          ScopedKernelChoices two(gpu(),
                                  [](cuda::KernelChoices& ch) { ch.paged_mla_two_blocks = !ch.paged_mla_two_blocks; });
          const DeviceTensor o2 = poisoned(out_shape);
          q.kv_pool = d16;
          q.out = o2;
          gpu().paged_mla_attention(q);
          rel_err((what + ", bf16 pool, two blocks an SM flipped").c_str(), down(o2), want16, 3e-5);
        }
      }
      if (!mma) continue;
      // Choices that must give the same bits as the default: the output again under `change`.
      auto expect_same_bits = [&](const char* what, const std::function<void(cuda::KernelChoices&)>& change) {
        ScopedKernelChoices other(gpu(), change);
        DeviceTensor dother = poisoned(out_shape);
        p.out = dother;
        gpu().paged_mla_attention(p);
        const HostTensor o = down(dother);
        EXPECT_EQ(std::memcmp(o.data<float>(), got.data<float>(), sizeof(float) * got.numel()), 0)
            << "paged mla, tensor cores, " << what << ", " << k.name;
      };
      // mla_lazy_rescale=0: Ō's rescale by exactly 1 done, the same bits as the default's skip.
      expect_same_bits("eager rescale", [](cuda::KernelChoices& ch) { ch.mla_lazy_rescale = false; });
      if (k.spec.heads > 16) continue;
      // paged_mla_16 flipped: 16-head blocks or a 32-head block whose second group is padding, the same sums in the
      // same order.
      expect_same_bits("16 / 32-head blocks flipped",
                       [](cuda::KernelChoices& ch) { ch.paged_mla_16 = !ch.paged_mla_16; });
      // paged_mla_ahead flipped: the 16-head block's producers one tile ahead or not, the same bits.
      expect_same_bits("producers a tile ahead flipped", [](cuda::KernelChoices& ch) {
        ch.paged_mla_16 = true;
        ch.paged_mla_ahead = !ch.paged_mla_ahead;
      });
    }
}

// A block id outside the pool is reported by the device status word (the next synchronize throws); by the
// tensor-core attend step too (V3's shape).
TEST_F(CudaOpTest, PagedMlaAttentionReportsBadPages) {
  for (const bool mma : {false, true}) {
    ScopedKernelChoices choice(gpu(), [&](cuda::KernelChoices& ch) {
      ch.paged_mla_mma = mma ? cuda::KernelPick::kAlways : cuda::KernelPick::kNever;
    });
    PagedMlaSpec s;
    s.seqs = 2;
    if (mma) {
      s.heads = 128;
      s.dn = 128;
      s.dr = 64;
      s.dv = 128;
      s.r = 512;
      s.block_size = 64;
    }
    PagedMlaCase c = make_paged_mla_case(s, 9);
    c.tables.data<int32_t>()[0] = 1 << 20;
    DeviceTensor dq = up(c.q), dpos = up(c.q_pos), dseq = up(c.q_seq), dtab = up(c.tables), dpool = up(c.pool),
                 dkvb = up(c.kv_b), dout = poisoned({c.tokens, s.heads, s.dv});
    PagedMlaAttentionParams p;
    p.q = dq;
    p.q_positions = dpos;
    p.q_seq = dseq;
    p.block_tables = dtab;
    p.kv_pool = dpool;
    p.kv_b = dkvb;
    p.out = dout;
    p.block_size = s.block_size;
    p.rope_dim = static_cast<int>(s.dr);
    p.scale = c.scale;
    gpu().paged_mla_attention(p);
    try {
      gpu().synchronize();
      ADD_FAILURE() << "no error for a block id outside the pool" << (mma ? " (tensor cores)" : "");
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("paged_mla_attention"), std::string::npos) << e.what();
    }
  }
}

// Batch-invariant mode: absorbed MLA splits a query's keys at fixed 256-key boundaries (not by the token count),
// paged MLA at fixed 8-tile (256-key) splits whatever the table width; a query's output is the same bytes alone or
// in the whole call — the paged full call also gets 40 extra table columns, which changes the split count.
TEST_F(CudaOpTest, MlaAttentionBatchInvariantMode) {
  gpu().set_batch_invariant(true);
  {
    const int64_t t = 6, h = 16, dn = 32, dr = 16, r = 128, dv = 32, s = 700;
    const HostTensor q = rand({t, h, dn + dr}), kv = rand({s, r + dr}), kv_b = rand({h * (dn + dv), r}, -0.1f, 0.1f);
    HostTensor qpos(DType::kI64, {t}), kvpos(DType::kI64, {s});
    for (int64_t i = 0; i < s; ++i) kvpos.data<int64_t>()[i] = i;
    for (int64_t i = 0; i < t; ++i) qpos.data<int64_t>()[i] = s - 1 - 97 * i;
    const float scale = 1.0f / std::sqrt(static_cast<float>(dn + dr));
    const DeviceTensor dkv = up(kv), dkvp = up(kvpos), dkvb = up(kv_b);
    auto call = [&](const std::vector<int64_t>& rows) {
      const DeviceTensor dq = up(take_rows(q, rows)), dqp = up(take_rows(qpos, rows)),
                         dout = poisoned({static_cast<int64_t>(rows.size()), h, dv});
      gpu().mla_attention_absorbed({dq, dqp, dkv, dkvp, dkvb, dout, static_cast<int>(dr), scale});
      return down(dout);
    };
    std::vector<int64_t> all(t);
    std::iota(all.begin(), all.end(), 0);
    const HostTensor full = call(all);
    HostTensor want(DType::kF32, {t, h, dv});
    cpu().mla_attention_absorbed({q, qpos, kv, kvpos, kv_b, want, static_cast<int>(dr), scale});
    rel_err("batch-invariant mla absorbed", full, want, 2e-5);
    for (const auto& rows : invariance_subsets(t))
      expect_rows_bitwise("batch-invariant mla absorbed queries=" + std::to_string(rows.size()), call(rows), full,
                          rows);
  }
  // The paged op, on the fp32 attend step and on the tensor cores (the same split boundaries: a query's partials
  // depend on its own keys only either way).
  for (const cuda::KernelPick pick : {cuda::KernelPick::kNever, cuda::KernelPick::kAlways}) {
    ScopedKernelChoices choice(gpu(), [&](cuda::KernelChoices& ch) { ch.paged_mla_mma = pick; });
    const std::string tag = pick == cuda::KernelPick::kAlways ? ", tensor cores" : "";
    PagedMlaSpec spec;
    spec.seqs = 7;
    spec.heads = 128;
    spec.dn = 128;
    spec.dr = 64;
    spec.dv = 128;
    spec.r = 512;
    spec.block_size = 64;
    spec.min_context = 40;
    spec.max_context = 1500;
    const PagedMlaCase c = make_paged_mla_case(spec, rng()());
    HostTensor want(DType::kF32, {c.tokens, spec.heads, spec.dv});
    cpu().paged_mla_attention(c.params(want.view()));
    const int64_t width = c.tables.shape()[1];
    HostTensor wide(DType::kI32, {c.tables.shape()[0], width + 40});
    for (int64_t b = 0; b < c.tables.shape()[0]; ++b)
      for (int64_t j = 0; j < width + 40; ++j)
        wide.data<int32_t>()[b * (width + 40) + j] = j < width ? c.tables.data<int32_t>()[b * width + j] : -1;
    const DeviceTensor dpool = up(c.pool), dkvb = up(c.kv_b), dtab = up(c.tables), dwide = up(wide);
    auto call = [&](const std::vector<int64_t>& rows, const DeviceTensor& tables) {
      const DeviceTensor dq = up(take_rows(c.q, rows)), dpos = up(take_rows(c.q_pos, rows)),
                         dseq = up(take_rows(c.q_seq, rows)),
                         dout = poisoned({static_cast<int64_t>(rows.size()), spec.heads, spec.dv});
      PagedMlaAttentionParams p = c.params(dout);
      p.q = dq;
      p.q_positions = dpos;
      p.q_seq = dseq;
      p.block_tables = tables;
      p.kv_pool = dpool;
      p.kv_b = dkvb;
      gpu().paged_mla_attention(p);
      return down(dout);
    };
    std::vector<int64_t> all(c.tokens);
    std::iota(all.begin(), all.end(), 0);
    const HostTensor full = call(all, dwide);
    rel_err(("batch-invariant paged mla" + tag).c_str(), full, want, pick == cuda::KernelPick::kAlways ? 3e-5 : 2e-5);
    for (const auto& rows : invariance_subsets(c.tokens))
      expect_rows_bitwise("batch-invariant paged mla" + tag + " queries=" + std::to_string(rows.size()),
                          call(rows, dtab), full, rows);
  }
}

}  // namespace
}  // namespace deepinfer::testing
