#include "deepinfer/core/tensor.h"

#include <sstream>

namespace deepinfer {

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << ']';
  return os.str();
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

static Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size());
  int64_t s = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = s;
    s *= shape[i];
  }
  return strides;
}

Tensor::Tensor(void* data, DType dtype, Shape shape, Device device)
    : data_(data), dtype_(dtype), shape_(std::move(shape)), device_(device) {
  for (int64_t d : shape_) DI_CHECK(d >= 0) << "negative dimension in shape " << shape_str(shape_);
  strides_ = contiguous_strides(shape_);
}

Tensor::Tensor(void* data, DType dtype, Shape shape, Shape strides, Device device)
    : data_(data), dtype_(dtype), shape_(std::move(shape)), strides_(std::move(strides)), device_(device) {
  DI_CHECK(shape_.size() == strides_.size()) << "shape " << shape_str(shape_) << " vs strides " << shape_str(strides_);
}

int64_t Tensor::dim(int i) const {
  int r = rank();
  int j = i < 0 ? i + r : i;
  DI_CHECK(j >= 0 && j < r) << "dimension " << i << " out of range for " << str();
  return shape_[j];
}

bool Tensor::is_contiguous() const { return strides_ == contiguous_strides(shape_); }

Tensor Tensor::reshape(Shape shape) const {
  DI_CHECK(is_contiguous()) << "reshape of a non-contiguous tensor " << str();
  int64_t infer = -1, known = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      DI_CHECK(infer < 0) << "reshape: more than one -1 in " << shape_str(shape);
      infer = static_cast<int64_t>(i);
    } else {
      known *= shape[i];
    }
  }
  if (infer >= 0) {
    DI_CHECK(known > 0 && numel() % known == 0) << "reshape " << str() << " to " << shape_str(shape);
    shape[infer] = numel() / known;
  }
  DI_CHECK(shape_numel(shape) == numel()) << "reshape " << str() << " to " << shape_str(shape);
  return Tensor(data_, dtype_, std::move(shape), device_);
}

Tensor Tensor::slice(int64_t begin, int64_t end) const {
  DI_CHECK(rank() >= 1 && begin >= 0 && begin <= end && end <= shape_[0])
      << "slice [" << begin << ", " << end << ") of " << str();
  int64_t elem_offset = begin * strides_[0];
  DI_CHECK((elem_offset * dtype_bits(dtype_)) % 8 == 0) << "slice of " << str() << " not byte aligned";
  Shape shape = shape_;
  shape[0] = end - begin;
  auto* p = static_cast<uint8_t*>(data_) + elem_offset * dtype_bits(dtype_) / 8;
  return Tensor(p, dtype_, std::move(shape), strides_, device_);
}

Tensor Tensor::row(int64_t i) const {
  Tensor s = slice(i, i + 1);
  Shape shape(s.shape_.begin() + 1, s.shape_.end());
  Shape strides(s.strides_.begin() + 1, s.strides_.end());
  return Tensor(s.data_, dtype_, std::move(shape), std::move(strides), device_);
}

std::string Tensor::str() const { return std::string(dtype_name(dtype_)) + shape_str(shape_); }

HostTensor::HostTensor(DType dtype, Shape shape) {
  int64_t bytes = dtype_bytes(dtype, shape_numel(shape));
  buffer_ = AlignedBuffer(static_cast<size_t>(bytes));
  view_ = Tensor(buffer_.data(), dtype, std::move(shape));
}

}  // namespace deepinfer
