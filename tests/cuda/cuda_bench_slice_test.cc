// `deepinfer bench`'s V4 slice on the CUDA target at the tiny dims: prefill and batched decode run, the fused
// projections and the grouped output projection make 4 GEMM calls a layer (the copies of fused parts as on the CPU
// target), and a decode step captures into a CUDA graph whose replay gives the eager step's output where two eager
// steps agree (the grouped call's device tables are planned in prepare(), outside the capture).
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "deepinfer/bench/bench_runner.h"
#include "deepinfer/ops/cuda/cuda_runtime.h"

namespace deepinfer::bench {
namespace {

TEST(CudaBenchSlice, TinySliceRunsFusedAndGroupedAndReplays) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  std::unique_ptr<BenchTarget> t = make_cuda_target(0);
  const BenchModel m = tiny_slice();
  BenchOptions o;
  o.prompts = {12};
  o.batches = {1, 3};
  o.contexts = {20};
  o.warmup = 0;
  o.iters = 1;
  const std::vector<BenchRow> rows = run_slice(*t, m, o);
  ASSERT_EQ(rows.size(), 3u);
  for (const BenchRow& r : rows) {
    const std::string what = std::string(r.shape.prefill ? "prefill" : "decode") + " batch " +
                             std::to_string(r.shape.seqs) + ": " + r.graph_note;
    EXPECT_GT(r.ms, 0.0) << what;
    ASSERT_TRUE(r.counts.counted) << what;
    EXPECT_EQ(r.counts.gemm_calls, 4 * static_cast<int64_t>(m.layers.size()) + 1) << what;
    EXPECT_EQ(r.counts.part_copies, r.shape.seqs * r.shape.tokens == 1 ? 0 : 2 * 3 + 5 + 2) << what;
    if (r.shape.prefill) continue;
    // Decode: the step was captured and replayed (no upload or allocation inside it).
    EXPECT_EQ(r.graph_note.find("graph failed"), std::string::npos) << what;
    EXPECT_GT(r.graph_ms, 0.0) << what;
    const std::string det = "eager vs eager: 0 of";
    if (r.graph_note.find(det) != std::string::npos) {
      EXPECT_NE(r.graph_note.find("replay vs eager: 0 of"), std::string::npos) << what;
    }
  }
}

}  // namespace
}  // namespace deepinfer::bench
