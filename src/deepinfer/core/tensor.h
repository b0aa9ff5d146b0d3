// Tensor: a non-owning view (pointer, dtype, shape, strides in elements, device). HostBuffer owns aligned
// host memory; HostTensor pairs the two for the CPU backend and tests.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "deepinfer/core/allocator.h"
#include "deepinfer/core/dtype.h"
#include "deepinfer/core/error.h"

namespace deepinfer {

enum class DeviceKind : uint8_t { kCPU, kCUDA };

struct Device {
  DeviceKind kind = DeviceKind::kCPU;
  int index = 0;
  bool operator==(const Device&) const = default;
  static Device cpu() { return {}; }
  static Device cuda(int i) { return {DeviceKind::kCUDA, i}; }
};

// Shapes are small; a vector keeps the code plain (no fixed rank limit).
using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);
int64_t shape_numel(const Shape& s);

class Tensor {
 public:
  Tensor() = default;
  // Contiguous view.
  Tensor(void* data, DType dtype, Shape shape, Device device = Device::cpu());
  Tensor(void* data, DType dtype, Shape shape, Shape strides, Device device);

  void* data() const { return data_; }
  template <typename T>
  T* data_as() const {
    return static_cast<T*>(data_);
  }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  Device device() const { return device_; }
  int rank() const { return static_cast<int>(shape_.size()); }
  int64_t dim(int i) const;  // negative i counts from the end
  int64_t numel() const { return shape_numel(shape_); }
  int64_t nbytes() const { return dtype_bytes(dtype_, numel()); }
  bool defined() const { return data_ != nullptr || numel() == 0; }
  bool is_contiguous() const;

  // Views (no copies). reshape needs a contiguous tensor; slice takes rows [begin, end) of dimension 0.
  Tensor reshape(Shape shape) const;
  Tensor slice(int64_t begin, int64_t end) const;
  Tensor row(int64_t i) const;  // slice(i, i+1) with dimension 0 dropped

  std::string str() const;  // "bf16[4, 128]"

 private:
  void* data_ = nullptr;
  DType dtype_ = DType::kF32;
  Shape shape_;
  Shape strides_;
  Device device_;
};

// Owning, zero-initialised, 64-byte aligned host tensor.
class HostTensor {
 public:
  HostTensor() = default;
  HostTensor(DType dtype, Shape shape);
  const Tensor& view() const { return view_; }
  operator const Tensor&() const { return view_; }  // NOLINT: a HostTensor is usable wherever a view is
  template <typename T>
  T* data() const {
    return view_.data_as<T>();
  }
  DType dtype() const { return view_.dtype(); }
  const Shape& shape() const { return view_.shape(); }
  int64_t numel() const { return view_.numel(); }

 private:
  AlignedBuffer buffer_;
  Tensor view_;
};

}  // namespace deepinfer
