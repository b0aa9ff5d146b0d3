// CUDA graphs of backend work: a decode-like op chain (mHC coefficients, collapse, RMSNorm, a cuBLASLt linear,
// paged sink attention over shuffled pages, mHC expand) captured once and replayed must give the eager chain's
// output bit for bit, also after the inputs were overwritten in place (the graph reads the buffers, not a
// copy). Capturing work that synchronises or allocates fails with a clear error. Also the recording API the model's
// decode graphs use (pool-owned temporaries) and scatter_rows, the device-addressed cache write they need.
#include <algorithm>
#include <numeric>
#include <vector>

#include "cuda_test_util.h"
#include "ops/paged_attention_case.h"

namespace deepinfer::testing {
namespace {

TEST_F(CudaOpTest, GraphReplayEqualsEager) {
  PagedAttentionSpec spec;
  spec.seqs = 4;
  spec.heads = 8;
  spec.hd = 128;
  spec.k_sel = 32;
  const PagedAttentionCase c = make_paged_attention_case(spec, rng()());
  const int64_t t = c.tokens, hc = 4, d = 256, mix = (2 + hc) * hc, hhd = spec.heads * spec.hd;
  HostTensor streams0 = rand({t, hc, d}), fn = rand({mix, hc * d}, -0.05f, 0.05f), base = rand({mix});
  HostTensor scale = rand({3}, 0.5f, 1.5f), wq = rand({hhd, d}, -0.1f, 0.1f), wo = rand({d, hhd}, -0.05f, 0.05f);
  DeviceTensor streams = up(streams0), dfn = up(fn), db = up(base), dsc = up(scale), dwq = up(wq), dwo = up(wo);
  DeviceTensor pre = poisoned({t, hc}), post = poisoned({t, hc}), comb = poisoned({t, hc, hc});
  DeviceTensor x = poisoned({t, d}), q = poisoned({t, spec.heads, spec.hd}), o = poisoned({t, spec.heads, spec.hd});
  DeviceTensor y = poisoned({t, d});
  DeviceTensor dqp = up(c.q_pos), dqs = up(c.q_seq), dt = up(c.tables), dw = up(c.window_pool);
  DeviceTensor dwb = up(c.window_begin), dc = up(c.comp_pool), di = up(c.comp_idx), dsk = up(c.sinks);
  auto chain = [&] {
    gpu().hc_mix({streams, dfn, db, dsc, pre, post, comb, 1e-6f, 1e-6f, 20});
    gpu().hc_collapse({streams, pre, x});
    gpu().rms_norm({x, Tensor{}, x, 1e-6f});
    gpu().linear({x, dwq, q.view().reshape({t, hhd})});
    gpu().paged_sink_attention(c.params({q, dqp, dqs, dt, dw, dwb, dc, di, dsk}, o));
    gpu().linear({o.view().reshape({t, hhd}), dwo, y});
    gpu().hc_expand({streams, y, post, comb});
  };
  auto reset = [&](const HostTensor& h) {
    ASSERT_EQ(testing::copy_and_sync(streams.data(), h.view().data(), h.view().nbytes(), cudaMemcpyHostToDevice),
              cudaSuccess);
  };
  chain();  // eager, also warms plans and the workspace
  const HostTensor eager = down(streams);
  reset(streams0);
  std::unique_ptr<CudaGraph> graph = gpu().capture_graph(chain);
  graph->replay();
  expect_same_bytes("graph replay == eager (streams)", down(streams), eager);
  // New inputs in the same buffers: the replay must read them.
  const HostTensor streams1 = rand({t, hc, d});
  reset(streams1);
  chain();
  const HostTensor eager1 = down(streams);
  reset(streams1);
  graph->replay();
  expect_same_bytes("graph replay == eager (new inputs)", down(streams), eager1);
  EXPECT_NE(std::memcmp(eager.view().data(), eager1.view().data(), eager.view().nbytes()), 0);
}

TEST_F(CudaOpTest, GraphCaptureRejectsSyncAndAllocation) {
  try {
    gpu().capture_graph([&] { gpu().synchronize(); });
    ADD_FAILURE() << "capturing a synchronize did not fail";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
  }
  try {
    gpu().capture_graph([&] { DeviceTensor t(gpu(), DType::kF32, {1 << 20}); });
    ADD_FAILURE() << "capturing an allocation did not fail";
  } catch (const Error& e) {
    // A cached block is caught by the allocation count, a fresh cudaMalloc by CUDA itself: both end the capture.
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
  }
  // The stream still works after a failed capture.
  HostTensor a = rand({64, 32});
  DeviceTensor da = up(a), dout = poisoned({64, 32});
  gpu().rms_norm({da, Tensor{}, dout, 1e-6f});
  HostTensor want(DType::kF32, {64, 32});
  cpu().rms_norm({a, Tensor{}, want, 1e-6f});
  rel_err("rms_norm after a failed capture", down(dout), want, 1e-6);
}

TEST_F(CudaOpTest, ScatterRowsMatchesCpu) {
  const int64_t rows = 40, width = 576, n = 97;
  HostTensor src = rand({rows, width}), dst0 = rand({n, width});
  std::vector<int64_t> targets(n);
  std::iota(targets.begin(), targets.end(), 0);
  std::shuffle(targets.begin(), targets.end(), rng());
  HostTensor index(DType::kI64, {rows});
  for (int64_t t = 0; t < rows; ++t) index.data<int64_t>()[t] = t % 5 == 2 ? -1 : targets[t];
  DeviceTensor dsrc = up(src), dindex = up(index), ddst = up(dst0);
  gpu().scatter_rows({dsrc, dindex, ddst});
  HostTensor want(DType::kF32, {n, width});
  std::memcpy(want.view().data(), dst0.view().data(), dst0.view().nbytes());
  cpu().scatter_rows({src, index, want});
  expect_same_bytes("scatter_rows == CPU", down(ddst), want);
  // An index outside [-1, n) is reported at the next synchronize and writes nothing.
  index.data<int64_t>()[3] = n;
  DeviceTensor dbad = up(index);
  gpu().scatter_rows({dsrc, dbad, ddst});
  try {
    gpu().synchronize();
    ADD_FAILURE() << "an out-of-range scatter index was not reported";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("scatter_rows"), std::string::npos) << e.what();
  }
}

// Recorded work (Backend::record): temporaries taken inside come from the recording pool, so memory allocated
// afterwards through the shared cache never overlaps them and replays leave it alone; a replay reads whatever the
// input buffers hold then and equals the eager chain bit for bit.
TEST_F(CudaOpTest, RecordedWorkKeepsItsTemporariesApart) {
  const int64_t t = 24, d = 192, n = 80;
  HostTensor a0 = rand({t, d}), w = rand({n, d}, -0.1f, 0.1f);
  DeviceTensor da = up(a0), dw = up(w), out = poisoned({t, n});
  TensorMemory& mem = gpu().memory();
  auto chain = [&] {
    OwnedTensor normed = mem.zeros(DType::kF32, {t, d});
    gpu().rms_norm({da, Tensor{}, normed.view(), 1e-6f});
    OwnedTensor y = mem.zeros(DType::kF32, {t, n});
    gpu().linear({normed.view(), dw, y.view()});
    mem.copy(out, y.view());
  };
  std::unique_ptr<RecordingPool> pool = gpu().new_recording_pool();
  ASSERT_NE(pool, nullptr);
  std::unique_ptr<RecordedWork> rec = gpu().record(chain, *pool);  // runs the chain now
  HostTensor normed(DType::kF32, {t, d}), want(DType::kF32, {t, n});
  cpu().rms_norm({a0, Tensor{}, normed, 1e-6f});
  cpu().linear({normed, w, want});
  rel_err("recorded chain (its eager run) vs CPU", down(out), want, 1e-5);
  // Same-sized shared allocations after the recording: were the temporaries in the shared cache, these would get
  // their blocks and the replay would overwrite them.
  std::vector<DeviceTensor> others;
  std::vector<HostTensor> contents;
  for (int i = 0; i < 4; ++i) {
    contents.push_back(rand({t, d}));
    others.push_back(up(contents.back()));
    contents.push_back(rand({t, n}));
    others.push_back(up(contents.back()));
  }
  const HostTensor a1 = rand({t, d});
  ASSERT_EQ(testing::copy_and_sync(da.data(), a1.view().data(), a1.view().nbytes(), cudaMemcpyHostToDevice),
            cudaSuccess);
  chain();
  const HostTensor eager1 = down(out);
  ASSERT_EQ(testing::copy_and_sync(out.data(), nan_filled({t, n}).view().data(), eager1.view().nbytes(),
                                   cudaMemcpyHostToDevice),
            cudaSuccess);
  rec->replay();
  expect_same_bytes("replay with new inputs == eager", down(out), eager1);
  for (size_t i = 0; i < others.size(); ++i)
    expect_same_bytes("shared allocation untouched", down(others[i]), contents[i]);
  // Work that synchronises cannot be recorded: a clear error, and the stream still works.
  try {
    gpu().record([&] { gpu().synchronize(); }, *pool);
    ADD_FAILURE() << "recording a synchronize did not fail";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
  }
  rec->replay();
  expect_same_bytes("replay after a failed recording", down(out), eager1);
}

}  // namespace
}  // namespace deepinfer::testing
