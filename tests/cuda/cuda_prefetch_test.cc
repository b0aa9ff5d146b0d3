// CudaBackend::prefetch (prefetch_cuda.cu): a hint that reads weights into L2 ahead of their GEMMs. It must write no
// byte anywhere (the hinted tensors and what lies around them keep their bytes) for any size and alignment (each
// range's 16-byte interior), take more tensors than one launch holds, stop at its byte cap, skip calls past its row
// bound, record into a graph, leave a GEMM after it the same bytes, and reject what is no tensor of this device.
#include <cstring>
#include <vector>

#include "cuda_test_util.h"
#include "deepinfer/core/error.h"

namespace deepinfer::testing {
namespace {

class CudaPrefetchTest : public CudaOpTest {
 protected:
  // Views of `bytes` bytes at `offset` into a u8 buffer.
  static Tensor bytes_at(const DeviceTensor& buf, int64_t offset, int64_t bytes) {
    return Tensor(static_cast<char*>(buf.data()) + offset, DType::kU8, {bytes}, buf.view().device());
  }
};

TEST_F(CudaPrefetchTest, WritesNoByteAtAnySizeOrAlignment) {
  const int64_t total = (int64_t{3} << 20) + 100;
  const HostTensor host = rand_bytes(DType::kU8, {total});
  const DeviceTensor buf = up(host);
  // Starts off 16-byte boundaries and sizes from empty to past one bulk piece (16 KB), 20 ranges: two launches.
  const int64_t offsets[] = {0, 1, 7, 15, 16, 33, 100, 4099, 65536, 1000003};
  const int64_t sizes[] = {0, 1, 15, 16, 17, 31, 4096, 16385, 65535, (int64_t{1} << 20) + 3};
  PrefetchParams p;
  for (int64_t o : offsets)
    for (int64_t s : {sizes[(o * 7) % 10], sizes[(o * 3 + 1) % 10]}) p.tensors.push_back(bytes_at(buf, o, s));
  ASSERT_GT(p.tensors.size(), 16u);  // more than one launch's ranges
  p.rows = 1;
  for (const int64_t mib : {64, 1}) {  // every range, then a cap inside the list
    ScopedKernelChoices on(gpu(), [&](cuda::KernelChoices& c) {
      c.l2_prefetch_rows = 16;
      c.l2_prefetch_mib = mib;
    });
    gpu().prefetch(p);
    expect_same_bytes(mib == 64 ? "prefetch: every range" : "prefetch: capped at 1 MiB", down(buf), host);
  }
  // The whole buffer at once, and a call past the row bound (no launch).
  ScopedKernelChoices on(gpu(), [&](cuda::KernelChoices& c) { c.l2_prefetch_rows = 16; });
  gpu().prefetch({{buf.view()}, 16});
  gpu().prefetch({{buf.view()}, 17});
  expect_same_bytes("prefetch: the whole buffer", down(buf), host);
}

// An FP8 projection of one row (the decode GEMM the hint is for) after the hint: the same bytes as without it, eagerly
// and replayed from a graph that records the hint.
TEST_F(CudaPrefetchTest, GemmAfterTheHintGivesTheSameBytes) {
  const int64_t n = 1536, k = 2048, block = 128;
  HostTensor w = rand_bytes(DType::kF8E4M3, {n, k}, 0x20, 0x4F);  // finite e4m3 codes of moderate magnitude
  const HostTensor s = e8m0({n / block, k / block}, 124, 130);
  const DeviceTensor dx = up(rand({1, k})), dw = up(w), ds = up(s), dout = poisoned({1, n});
  const QuantMatrix m{dw, ds, QuantFormat::kFP8Block, static_cast<int>(block), static_cast<int>(block)};
  ScopedKernelChoices off(gpu(), [](cuda::KernelChoices& c) { c.l2_prefetch_rows = 0; });
  gpu().linear_quant({dx, m, dout});
  const HostTensor plain = down(dout);
  ScopedKernelChoices on(gpu(), [](cuda::KernelChoices& c) { c.l2_prefetch_rows = 16; });
  const auto hinted = [&] {
    gpu().prefetch({{dw.view(), ds.view()}, 1});
    gpu().linear_quant({dx, m, dout});
  };
  hinted();
  expect_same_bytes("linear_quant after the hint", down(dout), plain);
  const DeviceTensor clear = poisoned({1, n});
  ASSERT_EQ(copy_and_sync(dout.data(), clear.data(), sizeof(float) * n, cudaMemcpyDeviceToDevice), cudaSuccess);
  std::unique_ptr<CudaGraph> graph = gpu().capture_graph(hinted);
  graph->replay();
  expect_same_bytes("linear_quant after the hint, graph replay", down(dout), plain);
}

TEST_F(CudaPrefetchTest, RejectsWhatIsNoTensorOfThisDevice) {
  ScopedKernelChoices on(gpu(), [](cuda::KernelChoices& c) { c.l2_prefetch_rows = 16; });
  const DeviceTensor buf = up(rand({8, 8}));
  const Tensor column(buf.data(), DType::kF32, {8, 1}, {8, 1}, buf.view().device());  // strided: not contiguous
  EXPECT_THROW(gpu().prefetch({{column}, 1}), Error);
  const HostTensor host = rand({4});
  EXPECT_THROW(gpu().prefetch({{host.view()}, 1}), Error);
  EXPECT_THROW(gpu().prefetch({{buf.view()}, -1}), Error);
  gpu().prefetch({{Tensor{}, buf.view()}, 1});  // an absent tensor is skipped
  gpu().synchronize();
}

}  // namespace
}  // namespace deepinfer::testing
