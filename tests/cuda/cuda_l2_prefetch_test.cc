// CudaBackend::prefetch_l2 (l2_prefetch.h): a side stream pulls weights into L2 ahead of the kernels that read them.
// A hint: results are the same bytes with and without it, eagerly and in a captured graph (whose capture must join
// the side stream back), and ranges it cannot take (null, unaligned, under 16 bytes) are skipped.
#include <vector>

#include "cuda_test_util.h"
#include "deepinfer/core/error.h"
#include "deepinfer/ops/cuda/l2_prefetch.h"

namespace deepinfer::testing {
namespace {

TEST_F(CudaOpTest, L2PrefetchChangesNoResultEagerOrCaptured) {
  const int64_t t = 3, d = 512, n = 1024;
  HostTensor x0 = rand({t, d}), w1 = rand({n, d}, -0.05f, 0.05f), w2 = rand({d, n}, -0.05f, 0.05f);
  DeviceTensor x = up(x0), dw1 = up(w1), dw2 = up(w2), h = poisoned({t, n}), y = poisoned({t, d});
  const std::vector<std::pair<const void*, size_t>> ranges = {
      {dw2.data(), static_cast<size_t>(dw2.view().nbytes())},
      {nullptr, 4096},                                              // skipped
      {static_cast<const char*>(dw1.data()) + 4, 4096},             // unaligned: skipped
      {dw1.data(), 8},                                              // under 16 bytes: skipped
      {dw1.data(), static_cast<size_t>(dw1.view().nbytes()) - 8}};  // a partial last 16 bytes: left out
  auto chain = [&] {
    gpu().prefetch_l2(ranges);
    gpu().linear({x, dw1, h});
    gpu().prefetch_l2({{dw2.data(), static_cast<size_t>(dw2.view().nbytes())}});
    gpu().linear({h, dw2, y});
  };
  chain();  // prefetch off (the default): nothing enqueued
  const HostTensor plain = down(y);
  testing::ScopedKernelChoices on(gpu(), [](cuda::KernelChoices& c) { c.l2_prefetch = true; });
  y = poisoned({t, d});
  chain();
  expect_same_bytes("eager with prefetch == without", down(y), plain);
  y = poisoned({t, d});
  std::unique_ptr<CudaGraph> graph = gpu().capture_graph(chain);  // ends with the side stream still forked: joined
  graph->replay();
  expect_same_bytes("graph with prefetch == without", down(y), plain);
  // The weights were only read.
  expect_same_bytes("w1 untouched", down(dw1), w1);
  expect_same_bytes("w2 untouched", down(dw2), w2);
  // More ranges than one launch takes: a clear error, nothing enqueued.
  std::vector<std::pair<const void*, size_t>> many(cuda::kL2PrefetchMaxRanges + 1,
                                                   {dw1.data(), static_cast<size_t>(dw1.view().nbytes())});
  EXPECT_THROW(gpu().prefetch_l2(many), Error);
  gpu().synchronize();
}

}  // namespace
}  // namespace deepinfer::testing
