// Aligned host memory. The CUDA backend has its own caching device allocator (ops/cuda); this is for host
// buffers: weights converted at load, activations of the CPU backend, test tensors.
#pragma once

#include <cstddef>
#include <cstdint>

namespace deepinfer {

constexpr size_t kHostAlignment = 64;

// Allocates zeroed memory aligned to kHostAlignment; throws ResourceExhausted on failure.
void* aligned_alloc_zeroed(size_t bytes);
void aligned_free(void* p);

class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(size_t bytes) : data_(aligned_alloc_zeroed(bytes)), size_(bytes) {}
  ~AlignedBuffer() { aligned_free(data_); }
  AlignedBuffer(AlignedBuffer&& o) noexcept : data_(o.data_), size_(o.size_) {
    o.data_ = nullptr;
    o.size_ = 0;
  }
  AlignedBuffer& operator=(AlignedBuffer&& o) noexcept {
    if (this != &o) {
      aligned_free(data_);
      data_ = o.data_;
      size_ = o.size_;
      o.data_ = nullptr;
      o.size_ = 0;
    }
    return *this;
  }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;

  void* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace deepinfer
