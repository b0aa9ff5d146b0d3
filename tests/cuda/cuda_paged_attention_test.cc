// paged_sink_attention on the GPU against the CPU reference: several sequences in one launch, shuffled pages,
// NaN in every pool row no query may read, decode (one query per sequence, split over the keys and merged) and
// prefill-style chunks; head dims on the float4 path (512, 128) and the scalar path (64, with a head count that
// leaves a warp's second head empty). The SIMT kernel (attn_mma = kNever): fp32 arithmetic in a different summation
// order, tolerance 1e-5; the default choice (the tensor-core kernel for every shape it takes, split bf16 products as
// in cuda_paged_attention_mma_test.cc): 2e-5.
#include <cstring>
#include <numeric>

#include "cuda_paged_attention_util.h"

namespace deepinfer::testing {
namespace {

TEST_F(CudaPagedAttentionTest, PagedSinkAttentionMatchesCpu) {
  struct Case {
    const char* name;
    PagedAttentionSpec spec;
  };
  const Case cases[] = {
      {"decode B=5 H=64 hd=512 (split keys)", make_spec(5, 64, 512, 1, 512, 64, 4, 128, 200, 4000)},
      {"prefill B=2x9 H=64 hd=512", make_spec(2, 64, 512, 9, 96, 64, 2, 128, 100, 900)},
      {"decode B=160 H=64 hd=128 (one split)", make_spec(160, 64, 128, 1, 64, 32, 1, 64, 40, 500)},
      {"decode B=7 H=6 hd=64 (scalar path)", make_spec(7, 6, 64, 1, 40, 16, 4, 32, 20, 700)},
      {"no compressed entries B=3 H=16 hd=256", make_spec(3, 16, 256, 3, 0, 16, 1, 48, 10, 200)},
  };
  for (const Case& k : cases) {
    const PagedAttentionCase c = make_paged_attention_case(k.spec, rng()());
    HostTensor want(DType::kF32, {c.tokens, k.spec.heads, k.spec.hd});
    cpu().paged_sink_attention(c.params(want.view()));
    const Device d = upload(c);
    rel_err((std::string("paged_sink_attention auto ") + k.name).c_str(), run_op(c, d), want, 2e-5);
    ScopedKernelChoices simt(gpu(), [](cuda::KernelChoices& kc) { kc.attn_mma = cuda::KernelPick::kNever; });
    rel_err((std::string("paged_sink_attention ") + k.name).c_str(), run_op(c, d), want, 1e-5);
    if (k.spec.k_sel == 0) continue;
    // The mask form: the selected set as u8 [T, N] over the entries (mask_of).
    const HostTensor mask = mask_of(c);
    PagedSinkAttentionParams cm = c.params(want.view());
    cm.comp_idx = Tensor{};
    cm.comp_mask = mask.view();
    cpu().paged_sink_attention(cm);
    const DeviceTensor dmask = up(mask);
    rel_err((std::string("paged_sink_attention mask form ") + k.name).c_str(), run_op(c, d, &dmask), want, 1e-5);
  }
}

// --kv-cache-dtype bf16: both kernels over bf16 pools give the bytes they give over f32 pools holding the same rounded
// rows (the SIMT kernel widens them in registers; the tensor-core kernel also drops the keys' zero lo products), and
// stay within their tolerances of the CPU op over the bf16 pools. The f32 rounded pools carry the NaN rows too.
TEST_F(CudaPagedAttentionTest, Bf16PoolsEqualF32PoolsOfTheRoundedRows) {
  struct Case {
    const char* name;
    PagedAttentionSpec spec;
  };
  const Case cases[] = {
      {"decode B=5 H=64 hd=512 (split keys)", make_spec(5, 64, 512, 1, 512, 64, 2, 128, 200, 3000)},
      {"prefill B=2x9 H=64 hd=512", make_spec(2, 64, 512, 9, 96, 64, 1, 128, 100, 900)},
      {"decode B=7 H=6 hd=64 (scalar path)", make_spec(7, 6, 64, 1, 40, 16, 4, 32, 20, 700)},
  };
  for (const Case& k : cases) {
    PagedAttentionCase c = make_paged_attention_case(k.spec, rng()());
    const HostTensor win16 = bf16_of(c.window_pool), comp16 = bf16_of(c.comp_pool);
    c.window_pool = rounded_f32_of(c.window_pool);
    c.comp_pool = rounded_f32_of(c.comp_pool);
    HostTensor want(DType::kF32, {c.tokens, k.spec.heads, k.spec.hd});
    PagedSinkAttentionParams cp = c.params(want.view());
    cp.window_pool = win16.view();
    cp.comp_pool = comp16.view();
    cpu().paged_sink_attention(cp);
    const Device rounded = upload(c);
    Device bf16 = upload(c);
    bf16.window_pool = up(win16);
    bf16.comp_pool = up(comp16);
    for (const cuda::KernelPick pick : {cuda::KernelPick::kAuto, cuda::KernelPick::kNever}) {
      ScopedKernelChoices choice(gpu(), [&](cuda::KernelChoices& kc) { kc.attn_mma = pick; });
      const std::string name = std::string(pick == cuda::KernelPick::kNever ? "simt " : "auto ") + k.name;
      const HostTensor got = run_op(c, bf16), same = run_op(c, rounded);
      rel_err(("paged_sink_attention bf16 pools " + name).c_str(), got, want,
              pick == cuda::KernelPick::kNever ? 1e-5 : 2e-5);
      const bool equal = std::memcmp(got.view().data(), same.view().data(), got.view().nbytes()) == 0;
      std::printf("[cuda-op] %-52s bf16 pools == f32 pools of the rounded rows: %s\n", name.c_str(),
                  equal ? "ok" : "FAIL");
      EXPECT_TRUE(equal) << name << " (seed " << seed_ << ")";
    }
  }
}

TEST_F(CudaPagedAttentionTest, PagedSinkAttentionBadPageRaisesStatus) {
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
TEST_F(CudaPagedAttentionTest, PagedSinkAttentionBatchInvariantMode) {
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
    const Device d = upload(c);
    auto call = [&](const std::vector<int64_t>& rows, int64_t pad) { return run_queries(c, d, rows, pad); };
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
