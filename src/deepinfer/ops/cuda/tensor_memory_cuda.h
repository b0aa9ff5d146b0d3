// The TensorMemory of a CUDA backend (CudaBackend::memory()).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <memory>

#include "deepinfer/ops/cuda/cuda_runtime.h"
#include "deepinfer/ops/cuda/kernels.h"
#include "deepinfer/ops/memory.h"

namespace deepinfer::cuda {

// Device tensors of one backend: allocations from its caching allocator (freed blocks are reused by later work
// on the same stream, which orders them), copies and fills on its stream.
class DeviceTensorMemory final : public TensorMemory {
 public:
  DeviceTensorMemory(Device device, cuda::DeviceAllocator& alloc, cudaStream_t stream, cuda::DeviceStatus& status)
      : device_(device), alloc_(alloc), stream_(stream), status_(status), staging_(kStagingBytes) {
    DI_CUDA_CHECK(cudaEventCreateWithFlags(&lap_done_, cudaEventDisableTiming));
  }
  ~DeviceTensorMemory() override {
    if (lap_done_) cudaEventDestroy(lap_done_);
  }
  DeviceTensorMemory(const DeviceTensorMemory&) = delete;
  DeviceTensorMemory& operator=(const DeviceTensorMemory&) = delete;

  Device device() const override { return device_; }

  OwnedTensor zeros(DType dtype, Shape shape) override {
    OwnedTensor t = empty(dtype, std::move(shape));
    DI_CUDA_CHECK(cudaMemsetAsync(t.view().data(), 0, std::max<size_t>(t.view().nbytes(), 1), stream_));
    return t;
  }

  OwnedTensor empty(DType dtype, Shape shape) override {
    const size_t bytes = static_cast<size_t>(std::max<int64_t>(dtype_bytes(dtype, shape_numel(shape)), 1));
    void* p = alloc_.allocate(bytes);
    std::shared_ptr<void> storage(p, [alloc = &alloc_](void* q) { alloc->free(q); });
    return OwnedTensor(std::move(storage), Tensor(p, dtype, std::move(shape), device_));
  }

  void copy(const Tensor& dst, const Tensor& src) override {
    DI_CHECK(dst.dtype() == src.dtype() && dst.shape() == src.shape())
        << "copy: " << src.str() << " into " << dst.str();
    if (dst.numel() == 0) return;
    const bool dst_dev = on_device(dst), src_dev = on_device(src);
    const size_t bytes = static_cast<size_t>(dst.nbytes());
    if (dst_dev && src_dev) {
      if (dst.is_contiguous() && src.is_contiguous()) {
        DI_CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), bytes, cudaMemcpyDeviceToDevice, stream_));
      } else {
        strided(dst, src);
      }
    } else if (dst_dev) {
      DI_CHECK(src.is_contiguous() && dst.is_contiguous()) << "copy host -> device needs contiguous tensors";
      upload_bytes(dst.data(), src.data(), bytes);
    } else if (src_dev) {
      DI_CHECK(src.is_contiguous() && dst.is_contiguous()) << "copy device -> host needs contiguous tensors";
      DI_CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), bytes, cudaMemcpyDeviceToHost, stream_));
      status_.check(stream_);  // synchronises; a kernel's bad-input report surfaces with the data
    } else {
      host_memory().copy(dst, src);
    }
  }

  void cast(const Tensor& dst, const Tensor& src) override {
    check_cast(dst, src);
    DI_CHECK(on_device(dst) && on_device(src)) << "cast: " << src.str() << " into " << dst.str() << " (device only)";
    if (dst.dtype() == DType::kBF16)
      cuda::run_cast_f32_bf16(static_cast<uint16_t*>(dst.data()), src.data_as<float>(), dst.numel(), stream_);
    else
      cuda::run_cast_bf16_f32(dst.data_as<float>(), static_cast<const uint16_t*>(src.data()), dst.numel(), stream_);
  }

  void convert_records(const Tensor& dst, const Tensor& src, FakeQuantKind record) override {
    const bool encode = check_records(dst, src, record);
    DI_CHECK(on_device(dst) && on_device(src))
        << "convert_records: " << src.str() << " into " << dst.str() << " (device only)";
    cuda::RecordRowsKernelParams k;
    k.src = src.data();
    k.dst = dst.data();
    k.format = cuda::pool_format_of(DType::kU8, record);
    k.rows = src.dim(0);
    k.width = (encode ? src : dst).dim(1);
    k.status = status_.word();
    if (encode)
      cuda::run_records_encode(k, stream_);
    else
      cuda::run_records_decode(k, stream_);
  }

  void fill(const Tensor& dst, float value) override {
    DI_CHECK(dst.dtype() == DType::kF32 && dst.is_contiguous() && on_device(dst)) << "fill: " << dst.str();
    cuda::run_fill_f32(dst.data_as<float>(), value, dst.numel(), stream_);
  }

  void add(const Tensor& dst, const Tensor& src) override {
    DI_CHECK(dst.dtype() == DType::kF32 && src.dtype() == DType::kF32 && dst.shape() == src.shape() &&
             dst.is_contiguous() && src.is_contiguous() && on_device(dst) && on_device(src))
        << "add: " << src.str() << " into " << dst.str();
    cuda::run_add_f32(dst.data_as<float>(), src.data_as<float>(), dst.numel(), stream_);
  }

  void synchronize() override { status_.check(stream_); }

 private:
  bool on_device(const Tensor& t) const {
    if (t.device().kind == DeviceKind::kCPU) return false;
    DI_CHECK(t.device() == device_) << "copy: tensor on cuda:" << t.device().index
                                    << ", backend on cuda:" << device_.index;
    return true;
  }

  // The source is pageable host memory that the caller may free or reuse at once. Small uploads (positions,
  // ids, masks: a few per layer) are staged in a pinned ring and copied asynchronously; a region of the ring is
  // rewritten only after the stream has passed every copy of the previous lap (one wait per lap). Larger ones
  // (weights at load) copy directly and wait.
  void upload_bytes(void* dst, const void* src, size_t bytes) {
    const size_t padded = (bytes + 255) / 256 * 256;
    if (padded > kStagingBytes) {
      DI_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
      DI_CUDA_CHECK(cudaStreamSynchronize(stream_));
      return;
    }
    if (staging_at_ + padded > kStagingBytes) {
      DI_CUDA_CHECK(cudaEventRecord(lap_done_, stream_));
      DI_CUDA_CHECK(cudaEventSynchronize(lap_done_));
      staging_at_ = 0;
    }
    auto* slot = static_cast<uint8_t*>(staging_.data()) + staging_at_;
    std::memcpy(slot, src, bytes);
    DI_CUDA_CHECK(cudaMemcpyAsync(dst, slot, bytes, cudaMemcpyHostToDevice, stream_));
    staging_at_ += padded;
  }

  void strided(const Tensor& dst, const Tensor& src) {
    const int r = dst.rank();
    DI_CHECK(r >= 1 && r <= 4) << "copy: strided copies take rank 1..4, got " << dst.str();
    cuda::StridedCopyKernelParams k;
    for (int i = 0; i < r; ++i) {
      k.shape[4 - r + i] = dst.shape()[i];
      k.dst_strides[4 - r + i] = dst.strides()[i];
      k.src_strides[4 - r + i] = src.strides()[i];
    }
    k.dst = dst.data();
    k.src = src.data();
    k.elem_bytes = static_cast<int>(dtype_bits(dst.dtype()) / 8);
    cuda::run_strided_copy(k, stream_);
  }

  static constexpr size_t kStagingBytes = 4ull << 20;
  Device device_;
  cuda::DeviceAllocator& alloc_;
  cudaStream_t stream_;
  cuda::DeviceStatus& status_;
  cuda::PinnedBuffer staging_;
  size_t staging_at_ = 0;
  cudaEvent_t lap_done_ = nullptr;
};

}  // namespace deepinfer::cuda
