// paged_sink_attention on the GPU against the CPU reference: several sequences in one launch, shuffled pages,
// NaN in every pool row no query may read, decode (one query per sequence, split over the keys and merged) and
// prefill-style chunks; head dims on the float4 path (512, 128) and the scalar path (64, with a head count that
// leaves a warp's second head empty). fp32 arithmetic in a different summation order: tolerance 1e-5.
#include <numeric>

#include "cuda_test_util.h"
#include "ops/paged_attention_case.h"

namespace deepinfer::testing {
namespace {

TEST_F(CudaOpTest, PagedSinkAttentionMatchesCpu) {
  struct Case {
    const char* name;
    PagedAttentionSpec spec;
  };
  auto spec = [](int64_t seqs, int64_t heads, int64_t hd, int64_t tps, int64_t k_sel, int bs, int ratio, int window,
                 int64_t min_ctx, int64_t max_ctx) {
    PagedAttentionSpec s;
    s.seqs = seqs;
    s.heads = heads;
    s.hd = hd;
    s.tokens_per_seq = tps;
    s.k_sel = k_sel;
    s.block_size = bs;
    s.ratio = ratio;
    s.window = window;
    s.min_context = min_ctx;
    s.max_context = max_ctx;
    return s;
  };
  const Case cases[] = {
      {"decode B=5 H=64 hd=512 (split keys)", spec(5, 64, 512, 1, 512, 64, 4, 128, 200, 4000)},
      {"prefill B=2x9 H=64 hd=512", spec(2, 64, 512, 9, 96, 64, 2, 128, 100, 900)},
      {"decode B=160 H=64 hd=128 (one split)", spec(160, 64, 128, 1, 64, 32, 1, 64, 40, 500)},
      {"decode B=7 H=6 hd=64 (scalar path)", spec(7, 6, 64, 1, 40, 16, 4, 32, 20, 700)},
      {"no compressed entries B=3 H=16 hd=256", spec(3, 16, 256, 3, 0, 16, 1, 48, 10, 200)},
  };
  for (const Case& k : cases) {
    const PagedAttentionCase c = make_paged_attention_case(k.spec, rng()());
    HostTensor want(DType::kF32, {c.tokens, k.spec.heads, k.spec.hd});
    cpu().paged_sink_attention(c.params(want.view()));
    DeviceTensor dq = up(c.q), dqp = up(c.q_pos), dqs = up(c.q_seq), dt = up(c.tables), dw = up(c.window_pool);
    DeviceTensor dwb = up(c.window_begin), dc = up(c.comp_pool), di = up(c.comp_idx), dsk = up(c.sinks);
    DeviceTensor dout = poisoned({c.tokens, k.spec.heads, k.spec.hd});
    PagedSinkAttentionParams p = c.params({dq, dqp, dqs, dt, dw, dwb, dc, di, dsk}, dout);
    gpu().paged_sink_attention(p);
    rel_err((std::string("paged_sink_attention ") + k.name).c_str(), down(dout), want, 1e-5);
    if (k.spec.k_sel == 0) continue;
    // The mask form: the selected set as u8 [T, N] over the entries (N = the largest selected id + 1).
    int32_t n = 1;
    for (int64_t i = 0; i < c.comp_idx.numel(); ++i) n = std::max(n, c.comp_idx.data<int32_t>()[i] + 1);
    HostTensor mask(DType::kU8, {c.tokens, n});
    std::memset(mask.view().data(), 0, mask.view().nbytes());
    for (int64_t t = 0; t < c.tokens; ++t)
      for (int64_t j = 0; j < k.spec.k_sel; ++j)
        if (const int32_t e = c.comp_idx.data<int32_t>()[t * k.spec.k_sel + j]; e >= 0)
          mask.data<uint8_t>()[t * n + e] = 1;
    PagedSinkAttentionParams cm = c.params(want.view());
    cm.comp_idx = Tensor{};
    cm.comp_mask = mask.view();
    cpu().paged_sink_attention(cm);
    DeviceTensor dmask = up(mask), dout2 = poisoned({c.tokens, k.spec.heads, k.spec.hd});
    p.comp_idx = Tensor{};
    p.comp_mask = dmask;
    p.out = dout2;
    gpu().paged_sink_attention(p);
    rel_err((std::string("paged_sink_attention mask form ") + k.name).c_str(), down(dout2), want, 1e-5);
  }
}

TEST_F(CudaOpTest, PagedSinkAttentionBadPageRaisesStatus) {
  PagedAttentionSpec s;
  PagedAttentionCase c = make_paged_attention_case(s, rng()());
  for (int64_t j = 0; j < c.tables.shape()[1]; ++j) c.tables.data<int32_t>()[j] = 1 << 20;  // outside the pool
  DeviceTensor dq = up(c.q), dqp = up(c.q_pos), dqs = up(c.q_seq), dt = up(c.tables), dw = up(c.window_pool);
  DeviceTensor dwb = up(c.window_begin), dc = up(c.comp_pool), di = up(c.comp_idx), dsk = up(c.sinks);
  DeviceTensor dout = poisoned({c.tokens, s.heads, s.hd});
  gpu().paged_sink_attention(c.params({dq, dqp, dqs, dt, dw, dwb, dc, di, dsk}, dout));
  try {
    gpu().synchronize();
    ADD_FAILURE() << "no error for block ids outside the pool";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("paged_sink_attention"), std::string::npos) << e.what();
  }
}

// Batch-invariant mode: a query's keys split at fixed 256-slot boundaries and the splits always merged by the
// combine kernel, so its output is the same bytes when it runs alone, with a few others, or in a call whose
// longest query needs more splits (the full call's selection is padded with 600 unselected columns: three more,
// empty, splits for every query). Against the CPU op: 2e-5, the tensor-core kernel's tolerance (both shapes take
// it in this mode; cuda_paged_attention_mma_test.cc), 1e-5 would hold the SIMT kernel's.
TEST_F(CudaOpTest, PagedSinkAttentionBatchInvariantMode) {
  gpu().set_batch_invariant(true);
  PagedAttentionSpec decode;
  decode.seqs = 9;
  decode.heads = 64;
  decode.hd = 512;
  decode.k_sel = 512;
  decode.block_size = 64;
  decode.window = 128;
  decode.min_context = 30;
  decode.max_context = 4000;
  PagedAttentionSpec prefill;
  prefill.seqs = 3;
  prefill.heads = 16;
  prefill.hd = 128;
  prefill.tokens_per_seq = 5;
  prefill.k_sel = 96;
  prefill.ratio = 2;
  prefill.min_context = 10;
  prefill.max_context = 900;
  for (const PagedAttentionSpec& spec : {decode, prefill}) {
    const PagedAttentionCase c = make_paged_attention_case(spec, rng()());
    HostTensor want(DType::kF32, {c.tokens, spec.heads, spec.hd});
    cpu().paged_sink_attention(c.params(want.view()));
    const DeviceTensor dt = up(c.tables), dw = up(c.window_pool), dwb = up(c.window_begin), dc = up(c.comp_pool),
                       dsk = up(c.sinks);
    auto call = [&](const std::vector<int64_t>& rows, int64_t pad) {
      HostTensor idx(DType::kI32, {static_cast<int64_t>(rows.size()), spec.k_sel + pad});
      for (size_t i = 0; i < rows.size(); ++i)
        for (int64_t j = 0; j < spec.k_sel + pad; ++j)
          idx.data<int32_t>()[i * (spec.k_sel + pad) + j] =
              j < spec.k_sel ? c.comp_idx.data<int32_t>()[rows[i] * spec.k_sel + j] : -1;
      const DeviceTensor dq = up(take_rows(c.q, rows)), dqp = up(take_rows(c.q_pos, rows)),
                         dqs = up(take_rows(c.q_seq, rows)), di = up(idx),
                         dout = poisoned({static_cast<int64_t>(rows.size()), spec.heads, spec.hd});
      gpu().paged_sink_attention(c.params({dq, dqp, dqs, dt, dw, dwb, dc, di, dsk}, dout));
      return down(dout);
    };
    std::vector<int64_t> all(c.tokens);
    std::iota(all.begin(), all.end(), 0);
    const HostTensor full = call(all, 600);
    const std::string name = "batch-invariant paged_sink_attention hd=" + std::to_string(spec.hd);
    rel_err(name.c_str(), full, want, 2e-5);
    for (const auto& rows : invariance_subsets(c.tokens))
      expect_rows_bitwise(name + " queries=" + std::to_string(rows.size()), call(rows, 0), full, rows);
  }
}

}  // namespace
}  // namespace deepinfer::testing
