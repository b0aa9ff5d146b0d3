#include "deepinfer/ops/memory.h"

#include <algorithm>
#include <cstring>

#include "deepinfer/ops/kv_record.h"
#include "deepinfer/ops/ops.h"

namespace deepinfer {

OwnedTensor::OwnedTensor(HostTensor&& host) {
  auto owned = std::make_shared<HostTensor>(std::move(host));
  view_ = owned->view();  // the buffer does not move with the HostTensor
  storage_ = std::move(owned);
}

OwnedTensor TensorMemory::upload(const Tensor& src) {
  OwnedTensor out = zeros(src.dtype(), src.shape());
  copy(out.view(), src);
  return out;
}

HostTensor TensorMemory::to_host(const Tensor& src) {
  HostTensor out(src.dtype(), src.shape());
  if (src.device().kind == DeviceKind::kCPU) {
    host_memory().copy(out.view(), src);
  } else {
    DI_CHECK(src.is_contiguous()) << "to_host: " << src.str() << " must be contiguous";
    copy(out.view(), src);
  }
  return out;
}

Tensor narrow(const Tensor& t, int dim, int64_t begin, int64_t end) {
  const int d = dim < 0 ? dim + t.rank() : dim;
  DI_CHECK(d >= 0 && d < t.rank() && begin >= 0 && begin <= end && end <= t.shape()[d])
      << "narrow [" << begin << ", " << end << ") of dimension " << dim << " of " << t.str();
  DI_CHECK(dtype_bits(t.dtype()) % 8 == 0) << "narrow of sub-byte " << t.str();
  Shape shape = t.shape();
  shape[d] = end - begin;
  auto* p = static_cast<uint8_t*>(t.data()) + begin * t.strides()[d] * (dtype_bits(t.dtype()) / 8);
  return Tensor(p, t.dtype(), std::move(shape), t.strides(), t.device());
}

Tensor RowBuffer::view() const {
  if (!storage.view().data()) return Tensor(nullptr, DType::kF32, {0, width});
  return storage.view().slice(0, rows);
}

void RowBuffer::append(TensorMemory& memory, const Tensor& more) {
  DI_CHECK(more.rank() == 2 && more.dim(1) == width && more.dtype() == DType::kF32)
      << "RowBuffer::append: " << more.str() << " into rows of width " << width;
  const int64_t n = more.dim(0), capacity = storage.view().data() ? storage.shape()[0] : 0;
  if (n == 0) return;
  if (rows + n > capacity) {
    OwnedTensor grown = memory.zeros(DType::kF32, {std::max(rows + n, 2 * capacity), width});
    if (rows > 0) memory.copy(grown.view().slice(0, rows), storage.view().slice(0, rows));
    storage = std::move(grown);
  }
  memory.copy(storage.view().slice(rows, rows + n), more);
  rows += n;
}

void check_cast(const Tensor& dst, const Tensor& src) {
  const bool f32_bf16 = src.dtype() == DType::kF32 && dst.dtype() == DType::kBF16;
  const bool bf16_f32 = src.dtype() == DType::kBF16 && dst.dtype() == DType::kF32;
  DI_CHECK((f32_bf16 || bf16_f32) && dst.shape() == src.shape() && dst.is_contiguous() && src.is_contiguous())
      << "cast: " << src.str() << " into " << dst.str() << " (f32 <-> bf16, same shape, contiguous)";
}

bool check_records(const Tensor& dst, const Tensor& src, FakeQuantKind record) {
  const bool encode = src.dtype() == DType::kF32 && dst.dtype() == DType::kU8;
  const bool decode = src.dtype() == DType::kU8 && dst.dtype() == DType::kF32;
  const Tensor& rows = encode ? src : dst;
  const Tensor& records = encode ? dst : src;
  DI_CHECK((encode || decode) && rows.rank() == 2 && records.rank() == 2 && rows.dim(0) == records.dim(0) &&
           kv_record_kind(record) && rows.dim(1) % fake_quant_block_len(record) == 0 &&
           records.dim(1) == kv_record_bytes(record, rows.dim(1)) && dst.is_contiguous() && src.is_contiguous())
      << "convert_records: " << src.str() << " into " << dst.str()
      << " (f32 [n, width] <-> u8 [n, record bytes] of a cache record kind, contiguous)";
  return encode;
}

namespace {

// Host memory: plain loops over the outer dimensions with one memcpy per innermost row.
class HostMemory : public TensorMemory {
 public:
  Device device() const override { return Device::cpu(); }
  OwnedTensor zeros(DType dtype, Shape shape) override { return OwnedTensor(HostTensor(dtype, std::move(shape))); }

  void copy(const Tensor& dst, const Tensor& src) override {
    DI_CHECK(dst.dtype() == src.dtype() && dst.shape() == src.shape())
        << "copy: " << src.str() << " into " << dst.str();
    DI_CHECK(dst.device().kind == DeviceKind::kCPU && src.device().kind == DeviceKind::kCPU)
        << "copy: host memory copies host tensors only";
    if (dst.numel() == 0) return;
    const int64_t esize = dtype_bits(dst.dtype()) / 8;
    DI_CHECK(esize > 0 && dst.strides().back() == 1 && (src.strides().back() == 1 || src.strides().back() == 0))
        << "copy: innermost dimension must be contiguous (" << src.str() << " -> " << dst.str() << ")";
    const int r = dst.rank();
    const int64_t inner = dst.dim(-1), outer = dst.numel() / inner;
    const bool broadcast_inner = src.strides().back() == 0;
    for (int64_t o = 0; o < outer; ++o) {
      int64_t rest = o, doff = 0, soff = 0;
      for (int d = r - 2; d >= 0; --d) {
        const int64_t i = rest % dst.shape()[d];
        rest /= dst.shape()[d];
        doff += i * dst.strides()[d];
        soff += i * src.strides()[d];
      }
      auto* dp = static_cast<uint8_t*>(dst.data()) + doff * esize;
      const auto* sp = static_cast<const uint8_t*>(src.data()) + soff * esize;
      if (broadcast_inner) {
        for (int64_t j = 0; j < inner; ++j) std::memcpy(dp + j * esize, sp, esize);
      } else {
        std::memmove(dp, sp, inner * esize);
      }
    }
  }

  void cast(const Tensor& dst, const Tensor& src) override {
    check_cast(dst, src);
    DI_CHECK(dst.device().kind == DeviceKind::kCPU && src.device().kind == DeviceKind::kCPU)
        << "cast: host memory casts host tensors only";
    const int64_t n = dst.numel();
    if (dst.dtype() == DType::kBF16) {
      for (int64_t i = 0; i < n; ++i) dst.data_as<uint16_t>()[i] = f32_to_bf16(src.data_as<float>()[i]);
    } else {
      for (int64_t i = 0; i < n; ++i) dst.data_as<float>()[i] = bf16_to_f32(src.data_as<uint16_t>()[i]);
    }
  }

  void convert_records(const Tensor& dst, const Tensor& src, FakeQuantKind record) override {
    const bool encode = check_records(dst, src, record);
    DI_CHECK(dst.device().kind == DeviceKind::kCPU && src.device().kind == DeviceKind::kCPU)
        << "convert_records: host memory converts host tensors only";
    const int64_t width = (encode ? src : dst).dim(1), bytes = (encode ? dst : src).dim(1);
    for (int64_t r = 0; r < src.dim(0); ++r) {
      if (encode)
        DI_CHECK_INTERNAL(
            kv_record_encode(record, src.data_as<float>() + r * width, width, dst.data_as<uint8_t>() + r * bytes))
            << "convert_records: a row that its kind did not fake-quantize written to a quantized-record pool";
      else
        kv_record_decode(record, src.data_as<uint8_t>() + r * bytes, width, dst.data_as<float>() + r * width);
    }
  }

  void fill(const Tensor& dst, float value) override {
    DI_CHECK(dst.dtype() == DType::kF32 && dst.is_contiguous()) << "fill: " << dst.str();
    std::fill(dst.data_as<float>(), dst.data_as<float>() + dst.numel(), value);
  }

  void add(const Tensor& dst, const Tensor& src) override {
    DI_CHECK(dst.dtype() == DType::kF32 && src.dtype() == DType::kF32 && dst.shape() == src.shape() &&
             dst.is_contiguous() && src.is_contiguous())
        << "add: " << src.str() << " into " << dst.str();
    for (int64_t i = 0; i < dst.numel(); ++i) dst.data_as<float>()[i] += src.data_as<float>()[i];
  }

  void synchronize() override {}
};

}  // namespace

TensorMemory& host_memory() {
  static HostMemory memory;  // stateless
  return memory;
}

namespace {
class PoisoningHostMemory final : public HostMemory {
 public:
  OwnedTensor empty(DType dtype, Shape shape) override {
    HostTensor t(dtype, std::move(shape));
    std::memset(t.view().data(), 0xFF, static_cast<size_t>(t.view().nbytes()));
    return OwnedTensor(std::move(t));
  }
};
}  // namespace

TensorMemory& poisoning_host_memory() {
  static PoisoningHostMemory memory;  // stateless
  return memory;
}

TensorMemory& backend_memory(Backend& backend) {
  if (auto* own = dynamic_cast<HasTensorMemory*>(&backend)) return own->memory();
  return host_memory();
}

}  // namespace deepinfer
