// Tensor memory of a backend: owning tensors on the backend's device and the few data moves a model does
// between ops (layout copies, fills, one add), so that one forward pass runs unchanged on the CPU reference
// (host memory) and on a device backend (weights, activations and caches stay in device memory).
//
// Ordering: a device memory enqueues its copies on the backend's stream, so they are ordered with the ops.
// Copies from the host return once the host data has been consumed (the source may be freed right after);
// copies to the host return once the data is there.
#pragma once

#include <memory>
#include <utility>

#include "deepinfer/core/tensor.h"

namespace deepinfer {

class Backend;
enum class FakeQuantKind;

// An owning tensor on any device (contiguous). Copies share the storage; use TensorMemory::clone for a copy.
class OwnedTensor {
 public:
  OwnedTensor() = default;
  // Adopts a host tensor's storage (no copy): host-loaded weights keep their buffers.
  OwnedTensor(HostTensor&& host);  // NOLINT: a HostTensor is an owned host tensor
  OwnedTensor(std::shared_ptr<void> storage, Tensor view) : storage_(std::move(storage)), view_(std::move(view)) {}

  const Tensor& view() const { return view_; }
  operator const Tensor&() const { return view_; }  // NOLINT: usable wherever a view is
  // Host pointer; only meaningful for host tensors (the CPU path and tests).
  template <typename T>
  T* data() const {
    return view_.data_as<T>();
  }
  DType dtype() const { return view_.dtype(); }
  const Shape& shape() const { return view_.shape(); }
  int64_t numel() const { return view_.numel(); }
  Device device() const { return view_.device(); }

 private:
  std::shared_ptr<void> storage_;
  Tensor view_;
};

class TensorMemory {
 public:
  virtual ~TensorMemory() = default;
  virtual Device device() const = 0;
  // Zero-filled contiguous tensor on device().
  virtual OwnedTensor zeros(DType dtype, Shape shape) = 0;
  // Contiguous tensor on device() with unspecified contents, for the output of an op that writes all of it (every CUDA
  // op is tested against NaN-poisoned outputs): a device backend skips the zero fill (the V4 prefill zero-filled ~4 GB
  // a layer it then overwrote). The default zero-fills, so the host reference is unchanged.
  virtual OwnedTensor empty(DType dtype, Shape shape) { return zeros(dtype, std::move(shape)); }
  // dst <- src: same dtype and shape. Within device() both may be strided (innermost stride 1, or 0 in src
  // for a broadcast); between the host and device() both must be contiguous.
  virtual void copy(const Tensor& dst, const Tensor& src) = 0;
  // dst <- src rounded to dst's dtype: f32 -> bf16 (round to nearest even) or bf16 -> f32 (exact); same shape, both
  // contiguous on device(). The paged caches kept in bf16 (--kv-cache-dtype bf16) are written and read through it.
  virtual void cast(const Tensor& dst, const Tensor& src) = 0;
  // Rows between f32 and quantized cache records of `record` (ops/kv_record.h, --kv-cache-dtype fp8): f32 [n, width]
  // into u8 [n, kv_record_bytes] encodes, u8 into f32 decodes (exactly); both contiguous on device(). Each encoded row
  // must be one that `record` fake-quantized: another is an error (kInternal on the host; a device stores NaNs and
  // reports it at its next synchronisation).
  virtual void convert_records(const Tensor& dst, const Tensor& src, FakeQuantKind record) = 0;
  // f32 only: dst[...] = value; dst[...] += src[...] (same shape, both on device(), contiguous).
  virtual void fill(const Tensor& dst, float value) = 0;
  virtual void add(const Tensor& dst, const Tensor& src) = 0;
  // Waits for every enqueued op and copy.
  virtual void synchronize() = 0;

  // Conveniences built on the above.
  OwnedTensor upload(const Tensor& src);  // a contiguous copy on device() (from the host or device())
  OwnedTensor clone(const Tensor& src) { return upload(src); }
  HostTensor to_host(const Tensor& src);  // synchronous
  template <typename T>
  OwnedTensor from_host(DType dtype, Shape shape, const T* values) {
    Tensor src(const_cast<T*>(values), dtype, std::move(shape));
    return upload(src);
  }
};

// TensorMemory::cast's contract (dtypes f32 <-> bf16, same shape, contiguous), checked by every implementation.
void check_cast(const Tensor& dst, const Tensor& src);
// TensorMemory::convert_records' contract, checked by every implementation: whether it encodes (f32 -> u8).
bool check_records(const Tensor& dst, const Tensor& src, FakeQuantKind record);

// Host memory (the CPU reference): stateless, so one instance serves every CPU backend.
TensorMemory& host_memory();
// Host memory whose empty() fills every byte with 0xFF (NaN in f32 and bf16, -1 in the integer types) instead of
// zeros, for tests: a model on a CPU backend made with poison_empty (make_cpu_backend) that reads a buffer no op wrote
// gives other outputs than on host_memory().
TensorMemory& poisoning_host_memory();

// Implemented next to Backend by a backend whose tensors live outside host memory (CudaBackend), or whose host memory
// is not host_memory() (a CpuBackend made with poison_empty), so that the Backend interface itself does not change.
// backend_memory() returns it, else host_memory().
class HasTensorMemory {
 public:
  virtual ~HasTensorMemory() = default;
  virtual TensorMemory& memory() = 0;
};
TensorMemory& backend_memory(Backend& backend);

// A view of indices [begin, end) of dimension `dim` (negative counts from the end); strided unless dim is 0.
Tensor narrow(const Tensor& t, int dim, int64_t begin, int64_t end);

// Rows appended over time (compressed entries, indexer keys), f32 [rows, width]. Storage grows by doubling so
// that appends cost O(rows added) amortised.
struct RowBuffer {
  int64_t width = 0;
  int64_t rows = 0;
  OwnedTensor storage;                                    // [capacity, width]
  Tensor view() const;                                    // [rows, width] (null data while empty)
  void append(TensorMemory& memory, const Tensor& more);  // more: f32 [n, width]
};

}  // namespace deepinfer
