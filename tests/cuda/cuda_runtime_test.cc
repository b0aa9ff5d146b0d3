// The CUDA runtime pieces: error checks, caching allocator, workspace arena, pinned buffers, device status.
#include <gtest/gtest.h>

#include "cuda/cuda_test_util.h"
#include "deepinfer/ops/cuda/cuda_runtime.h"

namespace deepinfer {
namespace {

using testing::CudaOpTest;

TEST(CudaRuntime, DeviceCountNeverThrows) { EXPECT_GE(cuda::device_count(), 0); }

TEST(CudaRuntime, CheckMacroThrowsInternalWithCallText) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  try {
    DI_CUDA_CHECK(cudaSetDevice(1 << 20));
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInternal);
    EXPECT_NE(std::string(e.what()).find("cudaSetDevice"), std::string::npos) << e.what();
  }
  EXPECT_THROW(cuda::select_device(1 << 20), Error);
}

TEST(CudaRuntime, AllocatorReusesFreedBlocks) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  cuda::select_device(0);
  cuda::DeviceAllocator alloc;
  void* a = alloc.allocate(1000);
  const size_t calls = alloc.cuda_malloc_calls();
  alloc.free(a);
  void* b = alloc.allocate(900);  // same rounded size class
  EXPECT_EQ(a, b);
  EXPECT_EQ(alloc.cuda_malloc_calls(), calls);
  void* big = alloc.allocate(5 << 20);
  EXPECT_EQ(alloc.live_bytes(), cuda::DeviceAllocator::round_size(1000) + cuda::DeviceAllocator::round_size(5 << 20));
  alloc.free(big);
  alloc.free(b);
  EXPECT_EQ(alloc.live_bytes(), 0u);
  alloc.release_cached();
  EXPECT_EQ(alloc.cached_bytes(), 0u);
  EXPECT_THROW(alloc.free(reinterpret_cast<void*>(0x1234)), Error);
}

TEST(CudaRuntime, ArenaScopesRewindAndResetMergesChunks) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  cuda::select_device(0);
  cuda::DeviceAllocator alloc;
  cuda::WorkspaceArena arena(alloc, 1 << 20);
  void* first = nullptr;
  {
    cuda::WorkspaceArena::Scope s(arena);
    first = arena.take(100);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(first) % cuda::WorkspaceArena::kAlignment, 0u);
  }
  {
    cuda::WorkspaceArena::Scope s(arena);
    EXPECT_EQ(arena.take(100), first);  // rewound
    void* big = arena.take(3 << 20);    // does not fit: a second chunk
    EXPECT_NE(big, nullptr);
    EXPECT_EQ(cudaMemset(big, 1, 3 << 20), cudaSuccess);
  }
  arena.reset();
  EXPECT_GE(arena.high_water(), size_t(3 << 20));
  void* again = arena.take(3 << 20);  // one merged chunk now holds the high-water size
  EXPECT_EQ(cudaMemset(again, 2, 3 << 20), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// Closing the outermost scope after it grew the arena merges the chunks (nothing else calls reset()): a
// second scope of the same size then fits without a new chunk and gets the same memory back.
TEST(CudaRuntime, ArenaOutermostScopeMergesGrowth) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  cuda::select_device(0);
  cuda::DeviceAllocator alloc;
  cuda::WorkspaceArena arena(alloc, 1 << 20);
  void* first = nullptr;
  {
    cuda::WorkspaceArena::Scope s(arena);
    first = arena.take(5 << 20);
    EXPECT_EQ(cudaMemset(first, 1, 5 << 20), cudaSuccess);
  }
  for (int i = 0; i < 4; ++i) {
    cuda::WorkspaceArena::Scope s(arena);
    void* p = arena.take(5 << 20);
    EXPECT_EQ(cudaMemset(p, 2, 5 << 20), cudaSuccess);
    if (i > 0) {
      EXPECT_EQ(p, first) << "scope " << i << " did not reuse the merged chunk";
    }
    first = p;
  }
  EXPECT_EQ(arena.mark().chunk, 0u);  // one chunk
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

TEST(CudaRuntime, PinnedRoundTripOnStream) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  cuda::select_device(0);
  cuda::Stream stream;
  cuda::DeviceAllocator alloc;
  cuda::PinnedBuffer in(4096), out(4096);
  for (int i = 0; i < 1024; ++i) in.data_as<float>()[i] = static_cast<float>(i) + 0.5f;
  cuda::DeviceBuffer d(alloc, 4096);
  DI_CUDA_CHECK(cudaMemcpyAsync(d.data(), in.data(), 4096, cudaMemcpyHostToDevice, stream.get()));
  DI_CUDA_CHECK(cudaMemcpyAsync(out.data(), d.data(), 4096, cudaMemcpyDeviceToHost, stream.get()));
  stream.synchronize();
  EXPECT_EQ(std::memcmp(in.data(), out.data(), 4096), 0);
}

TEST_F(CudaOpTest, BadTokenIdIsReportedAtSynchronize) {
  HostTensor table = rand({10, 8});
  HostTensor ids(DType::kI64, {3});
  ids.data<int64_t>()[0] = 1;
  ids.data<int64_t>()[1] = 12;  // out of range
  ids.data<int64_t>()[2] = 3;
  auto dt = up(table), di = up(ids), dout = poisoned({3, 8});
  gpu().embedding({dt, di, dout});
  EXPECT_THROW(gpu().synchronize(), Error);
  EXPECT_NO_THROW(gpu().synchronize());  // the status word was cleared
}

TEST_F(CudaOpTest, HostTensorsAreRejected) {
  HostTensor x = rand({2, 8}), y = rand({2, 8});
  EXPECT_THROW(gpu().rms_norm({x, Tensor{}, y, 1e-6f}), Error);
}

}  // namespace
}  // namespace deepinfer
