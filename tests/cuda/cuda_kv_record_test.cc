// V4.1's quantized cache records on the GPU (--kv-cache-dtype fp8, ops/kv_record.h, ops/cuda/kv_record.cuh): the
// device encoder writes the CPU's records byte for byte (the same search for codes and scales), the decoder reads the
// CPU's values bit for bit (any NaN for a NaN), scatter_rows into a record pool equals the CPU's, and the readers —
// paged sink attention (both kernels) and paged indexer scores (every kernel) — give over record pools the bytes they
// give over f32 pools holding the quantized rows, and stay within their tolerances of the CPU op.
#include <cstring>
#include <limits>
#include <numeric>

#include "cuda_paged_attention_util.h"
#include "ops/kv_record_rows.h"
#include "ops/paged_indexer_case.h"

namespace deepinfer::testing {
namespace {

constexpr FakeQuantKind kKinds[] = {kWindowRecord, kEntryRecord, kIndexKeyRecord};

// testing::quantized_rows (magnitudes 1e-38 .. 1e4, zero blocks) as [rows, width], with a NaN in row 1 and an
// infinity in row 2 (blocks the encoders store as NaNs).
HostTensor quantized_rows(FakeQuantKind kind, int64_t rows, int64_t width, uint64_t seed) {
  const std::vector<float> v =
      testing::quantized_rows(kind, static_cast<int>(rows), static_cast<int>(width), static_cast<uint32_t>(seed));
  HostTensor t(DType::kF32, {rows, width});
  std::memcpy(t.data<float>(), v.data(), v.size() * sizeof(float));
  t.data<float>()[1 * width + 3] = std::numeric_limits<float>::quiet_NaN();
  t.data<float>()[2 * width + width - 1] = -std::numeric_limits<float>::infinity();
  return t;
}

TEST_F(CudaOpTest, KvRecordsEncodeAndDecodeAsTheCpu) {
  TensorMemory& mem = gpu().memory();
  for (const FakeQuantKind kind : kKinds)
    for (const int64_t width : {32, 64, 128, 512}) {
      const int64_t rows = 37, bytes = kv_record_bytes(kind, width);
      const HostTensor values = quantized_rows(kind, rows, width, rng()());
      HostTensor want(DType::kU8, {rows, bytes});
      host_memory().convert_records(want.view(), values.view(), kind);
      DeviceTensor dvalues = up(values), drecords = poisoned_bytes(DType::kU8, {rows, bytes});
      mem.convert_records(drecords, dvalues, kind);
      const std::string name = "kind " + std::to_string(static_cast<int>(kind)) + " width " + std::to_string(width);
      expect_same_bytes(("records encoded on the GPU == CPU, " + name).c_str(), down(drecords), want);
      DeviceTensor dwant = up(want), back = poisoned({rows, width});
      mem.convert_records(back, dwant, kind);
      HostTensor decoded(DType::kF32, {rows, width});
      host_memory().convert_records(decoded.view(), want.view(), kind);
      expect_same_values(("records decoded on the GPU == CPU, " + name).c_str(), down(back), decoded);
    }
}

TEST_F(CudaOpTest, KvRecordsOfUnquantizedRowsAreReported) {
  TensorMemory& mem = gpu().memory();
  const HostTensor raw = rand({4, 128});  // not fake-quantized
  DeviceTensor draw = up(raw), drecords = poisoned_bytes(DType::kU8, {4, kv_record_bytes(kIndexKeyRecord, 128)});
  mem.convert_records(drecords, draw, kIndexKeyRecord);
  try {
    gpu().synchronize();
    ADD_FAILURE() << "unquantized rows encoded without a report";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fake-quantize"), std::string::npos) << e.what();
  }
}

TEST_F(CudaOpTest, ScatterRowsIntoRecordPoolsMatchesCpu) {
  for (const FakeQuantKind kind : kKinds) {
    const int64_t rows = 23, width = 512, n = 61, bytes = kv_record_bytes(kind, width);
    const HostTensor src = quantized_rows(kind, rows, width, rng()());
    const RecordPool before = records_of(rand({n, width}), kind);
    std::vector<int64_t> targets(n);
    std::iota(targets.begin(), targets.end(), 0);
    std::shuffle(targets.begin(), targets.end(), rng());
    HostTensor index(DType::kI64, {rows});
    for (int64_t t = 0; t < rows; ++t) index.data<int64_t>()[t] = t % 5 == 2 ? -1 : targets[t];
    DeviceTensor dsrc = up(src), dindex = up(index), ddst = up(before.records);
    ScatterRowsParams gp{dsrc, dindex, ddst};
    gp.record = kind;
    gpu().scatter_rows(gp);
    HostTensor want = copy_of(before.records);
    ScatterRowsParams cp{src.view(), index.view(), want.view()};
    cp.record = kind;
    cpu().scatter_rows(cp);
    ASSERT_EQ(want.view().dim(1), bytes);
    expect_same_bytes(("scatter_rows into records == CPU, kind " + std::to_string(static_cast<int>(kind))).c_str(),
                      down(ddst), want);
  }
}

// Both attention kernels over record pools (FP8 window rows, FP4 entries) against the f32 pools of their values.
TEST_F(CudaPagedAttentionTest, RecordPoolsEqualF32PoolsOfTheQuantizedRows) {
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
    const RecordPool win = records_of(c.window_pool, kWindowRecord), comp = records_of(c.comp_pool, kEntryRecord);
    c.window_pool = copy_of(win.values);
    c.comp_pool = copy_of(comp.values);
    HostTensor want(DType::kF32, {c.tokens, k.spec.heads, k.spec.hd});
    PagedSinkAttentionParams cp = c.params(want.view());
    cp.window_pool = win.records.view();
    cp.comp_pool = comp.records.view();
    cpu().paged_sink_attention(cp);
    const Device values = upload(c);
    Device records = upload(c);
    records.window_pool = up(win.records);
    records.comp_pool = up(comp.records);
    for (const cuda::KernelPick pick : {cuda::KernelPick::kAuto, cuda::KernelPick::kNever}) {
      ScopedKernelChoices choice(gpu(), [&](cuda::KernelChoices& kc) { kc.attn_mma = pick; });
      const std::string name = std::string(pick == cuda::KernelPick::kNever ? "simt " : "auto ") + k.name;
      const HostTensor got = run_op(c, records), same = run_op(c, values);
      rel_err(("paged_sink_attention record pools " + name).c_str(), got, want,
              pick == cuda::KernelPick::kNever ? 1e-5 : 2e-5);
      const bool equal = std::memcmp(got.view().data(), same.view().data(), got.view().nbytes()) == 0;
      std::printf("[cuda-op] %-52s record pools == f32 pools of their values: %s\n", name.c_str(),
                  equal ? "ok" : "FAIL");
      EXPECT_TRUE(equal) << name << " (seed " << seed_ << ")";
    }
  }
}

// Every indexer kernel over FP4 key records: the tensor-core one (64 rows), the float4 shared-memory one (dim 128) and
// the one-warp-per-entry one (dim 256), each with indexer_mma auto and never.
TEST_F(CudaOpTest, PagedIndexerScoresRecordPoolEqualsQuantizedF32Pool) {
  struct Case {
    const char* name;
    PagedIndexerSpec spec;
  };
  const Case cases[] = {
      {"B=64 IH=64 Id=128 r=2 bs=64", make_indexer_spec(64, 64, 128, 700, 64, 2)},
      {"B=9 IH=24 Id=128 r=2 bs=16", make_indexer_spec(9, 24, 128, 300, 16, 2)},
      {"B=6 IH=64 Id=256 r=4 bs=32 (warp kernel)", make_indexer_spec(6, 64, 256, 200, 32, 4)},
  };
  for (const Case& k : cases) {
    const PagedIndexerSpec& s = k.spec;
    PagedIndexerCase c = make_paged_indexer_case(s, rng()());
    const RecordPool keys = records_of(c.pool, kIndexKeyRecord);
    c.pool = copy_of(keys.values);
    HostTensor want(DType::kF32, {s.seqs, c.n});
    PagedIndexerScoreParams cp = c.params(want.view());
    cp.key_pool = keys.records.view();
    cpu().paged_indexer_scores(cp);
    DeviceTensor dq = up(c.q), dw = up(c.weights), dp = up(c.positions), ds = up(c.q_seq), dn = up(c.n_entries);
    DeviceTensor dt = up(c.tables), dvalues = up(c.pool), drecords = up(keys.records);
    for (const cuda::KernelPick pick : {cuda::KernelPick::kAuto, cuda::KernelPick::kNever}) {
      ScopedKernelChoices choice(gpu(), [&](cuda::KernelChoices& kc) { kc.indexer_mma = pick; });
      DeviceTensor got = poisoned({s.seqs, c.n}), same = poisoned({s.seqs, c.n});
      gpu().paged_indexer_scores(c.params({dq, dw, dp, ds, dn, dt, drecords}, got));
      gpu().paged_indexer_scores(c.params({dq, dw, dp, ds, dn, dt, dvalues}, same));
      const HostTensor g = down(got), r = down(same);
      const std::string name = std::string(pick == cuda::KernelPick::kNever ? "simt " : "auto ") + k.name;
      rel_err(("paged_indexer_scores record pool " + name).c_str(), g, want, 2e-5);
      const bool equal = std::memcmp(g.view().data(), r.view().data(), g.view().nbytes()) == 0;
      std::printf("[cuda-op] %-52s record pool == f32 pool of its values: %s\n", name.c_str(), equal ? "ok" : "FAIL");
      EXPECT_TRUE(equal) << name << " (seed " << seed_ << ")";
    }
  }
}

}  // namespace
}  // namespace deepinfer::testing
