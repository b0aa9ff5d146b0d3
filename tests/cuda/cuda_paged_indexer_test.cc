// paged_indexer_scores on the GPU: every row byte for byte equal to the GPU's indexer_scores of that row alone over
// its sequence's gathered keys (what batched decode did per sequence before: the CPU-identical-path guarantee of
// decode_batch rests on it), and against the CPU reference at 1e-5. Shuffled pages, NaN in every pool row no row may
// read, a sequence without entries, one whose entries run past what its query sees, and an output wider than every
// sequence. Shapes: V4's 64 x 128 at decode batches of 64 and 5 (the shared-memory kernel), an odd dim, and a head
// count whose staged queries exceed 48 KiB of shared memory (the one-warp-per-entry kernel).
#include <cstring>

#include "cuda_test_util.h"
#include "ops/op_test_util.h"
#include "ops/paged_indexer_case.h"

namespace deepinfer::testing {
namespace {

TEST_F(CudaOpTest, PagedIndexerScoresMatchPerSequenceBitwise) {
  struct Case {
    const char* name;
    PagedIndexerSpec spec;
  };
  const Case cases[] = {
      {"B=64 IH=64 Id=128 r=4 bs=64", make_indexer_spec(64, 64, 128, 700, 64, 4)},
      {"B=5 IH=64 Id=128 r=1 bs=64", make_indexer_spec(5, 64, 128, 1500, 64, 1)},
      {"B=9 IH=24 Id=100 r=2 bs=16", make_indexer_spec(9, 24, 100, 300, 16, 2)},
      {"B=6 IH=64 Id=256 r=4 bs=32 (warp kernel)", make_indexer_spec(6, 64, 256, 200, 32, 4)},
  };
  for (const Case& k : cases) {
    const PagedIndexerSpec& s = k.spec;
    const PagedIndexerCase c = make_paged_indexer_case(s, rng()());
    HostTensor want(DType::kF32, {s.seqs, c.n});
    cpu().paged_indexer_scores(c.params(want.view()));
    DeviceTensor dq = up(c.q), dw = up(c.weights), dp = up(c.positions), ds = up(c.q_seq), dn = up(c.n_entries);
    DeviceTensor dt = up(c.tables), dpool = up(c.pool), dout = poisoned({s.seqs, c.n});
    {
      // The default choice (from kIndexerMmaMinDecodeTokens rows the tensor-core kernel: split bf16 products, held to
      // 2e-5 on fp32 data as in cuda_indexer_mma_test.cc); the SIMT kernel is held to 1e-5 and checked bitwise next.
      DeviceTensor dauto = poisoned({s.seqs, c.n});
      gpu().paged_indexer_scores(c.params({dq, dw, dp, ds, dn, dt, dpool}, dauto));
      rel_err((std::string("paged_indexer_scores auto ") + k.name).c_str(), down(dauto), want, 2e-5);
    }
    ScopedKernelChoices simt(gpu(), [](cuda::KernelChoices& kc) { kc.indexer_mma = cuda::KernelPick::kNever; });
    gpu().paged_indexer_scores(c.params({dq, dw, dp, ds, dn, dt, dpool}, dout));
    const HostTensor got = down(dout);
    rel_err((std::string("paged_indexer_scores ") + k.name).c_str(), got, want, 1e-5);
    // Row t against indexer_scores of row t alone over the gathered keys, on the GPU: the same bytes.
    int64_t differ = 0;
    for (int64_t t = 0; t < s.seqs; ++t) {
      const int64_t ne = c.entries(t);
      for (int64_t e = ne; e < c.n; ++e) differ += got.data<float>()[t * c.n + e] != -INFINITY;
      if (ne == 0) continue;
      DeviceTensor keys = up(c.keys[t]), row_out = poisoned({1, ne});
      IndexerScoreParams p{dq.view().slice(t, t + 1),
                           keys,
                           dw.view().slice(t, t + 1),
                           dp.view().slice(t, t + 1),
                           row_out,
                           s.ratio,
                           c.score_scale,
                           c.weight_scale};
      gpu().indexer_scores(p);
      const HostTensor row = down(row_out);
      differ += std::memcmp(got.data<float>() + t * c.n, row.data<float>(), sizeof(float) * ne) != 0;
    }
    std::printf("[cuda-op] %-40s %lld rows differ from per-sequence indexer_scores %s\n", k.name,
                static_cast<long long>(differ), differ == 0 ? "ok" : "FAIL");
    EXPECT_EQ(differ, 0) << k.name << " (seed " << seed_ << ")";
  }
}

// --kv-cache-dtype bf16: every kernel over a bf16 key pool gives the bytes it gives over the f32 pool holding the same
// rounded keys (NaN rows included): the tensor-core kernel (64 rows), the float4 shared-memory kernel (dim 128), the
// scalar one (dim 100) and the one-warp-per-entry kernel (dim 256), each with indexer_mma auto and never.
TEST_F(CudaOpTest, PagedIndexerScoresBf16PoolEqualsRoundedF32Pool) {
  struct Case {
    const char* name;
    PagedIndexerSpec spec;
  };
  const Case cases[] = {
      {"B=64 IH=64 Id=128 r=2 bs=64", make_indexer_spec(64, 64, 128, 700, 64, 2)},
      {"B=9 IH=24 Id=100 r=2 bs=16", make_indexer_spec(9, 24, 100, 300, 16, 2)},
      {"B=6 IH=64 Id=256 r=4 bs=32 (warp kernel)", make_indexer_spec(6, 64, 256, 200, 32, 4)},
  };
  for (const Case& k : cases) {
    const PagedIndexerSpec& s = k.spec;
    PagedIndexerCase c = make_paged_indexer_case(s, rng()());
    const HostTensor pool16 = bf16_of(c.pool);
    c.pool = rounded_f32_of(c.pool);
    HostTensor want(DType::kF32, {s.seqs, c.n});
    PagedIndexerScoreParams cp = c.params(want.view());
    cp.key_pool = pool16.view();
    cpu().paged_indexer_scores(cp);
    DeviceTensor dq = up(c.q), dw = up(c.weights), dp = up(c.positions), ds = up(c.q_seq), dn = up(c.n_entries);
    DeviceTensor dt = up(c.tables), drounded = up(c.pool), dbf16 = up(pool16);
    for (const cuda::KernelPick pick : {cuda::KernelPick::kAuto, cuda::KernelPick::kNever}) {
      ScopedKernelChoices choice(gpu(), [&](cuda::KernelChoices& kc) { kc.indexer_mma = pick; });
      DeviceTensor got = poisoned({s.seqs, c.n}), same = poisoned({s.seqs, c.n});
      gpu().paged_indexer_scores(c.params({dq, dw, dp, ds, dn, dt, dbf16}, got));
      gpu().paged_indexer_scores(c.params({dq, dw, dp, ds, dn, dt, drounded}, same));
      const HostTensor g = down(got), r = down(same);
      const std::string name = std::string(pick == cuda::KernelPick::kNever ? "simt " : "auto ") + k.name;
      rel_err(("paged_indexer_scores bf16 pool " + name).c_str(), g, want, 2e-5);
      const bool equal = std::memcmp(g.view().data(), r.view().data(), g.view().nbytes()) == 0;
      std::printf("[cuda-op] %-52s bf16 pool == f32 pool of the rounded keys: %s\n", name.c_str(),
                  equal ? "ok" : "FAIL");
      EXPECT_TRUE(equal) << name << " (seed " << seed_ << ")";
    }
  }
}

TEST_F(CudaOpTest, PagedIndexerScoresBadPageRaisesStatus) {
  PagedIndexerCase c = make_paged_indexer_case(PagedIndexerSpec{}, rng()());
  for (int64_t j = 0; j < c.tables.shape()[1]; ++j) c.tables.data<int32_t>()[j] = 1 << 20;  // outside the pool
  DeviceTensor dq = up(c.q), dw = up(c.weights), dp = up(c.positions), ds = up(c.q_seq), dn = up(c.n_entries);
  DeviceTensor dt = up(c.tables), dpool = up(c.pool), dout = poisoned({c.spec.seqs, c.n});
  gpu().paged_indexer_scores(c.params({dq, dw, dp, ds, dn, dt, dpool}, dout));
  try {
    gpu().synchronize();
    ADD_FAILURE() << "no error for block ids outside the pool";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("paged_indexer_scores"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace deepinfer::testing
