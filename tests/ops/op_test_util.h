// Helpers for the op tests: random (never zero) tensors and error measures against naive references.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "deepinfer/core/error.h"
#include "deepinfer/core/tensor.h"
#include "deepinfer/ops/cpu/cpu_backend.h"
#include "deepinfer/ops/kv_record.h"
#include "deepinfer/ops/ops.h"

namespace deepinfer::testing {

// f32 tensor with values uniform in ±[lo, hi] (random sign), so no element is zero.
inline HostTensor random_tensor(Shape shape, uint32_t seed, float lo = 0.05f, float hi = 1.0f) {
  HostTensor t(DType::kF32, std::move(shape));
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> mag(lo, hi);
  std::bernoulli_distribution neg(0.5);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = neg(rng) ? -mag(rng) : mag(rng);
  return t;
}

inline HostTensor positions_tensor(const std::vector<int64_t>& pos) {
  HostTensor t(DType::kI64, {static_cast<int64_t>(pos.size())});
  for (size_t i = 0; i < pos.size(); ++i) t.data<int64_t>()[i] = pos[i];
  return t;
}

inline HostTensor copy_of(const HostTensor& t) {
  HostTensor out(t.dtype(), t.shape());
  std::copy(t.data<uint8_t>(), t.data<uint8_t>() + t.view().nbytes(), out.data<uint8_t>());
  return out;
}

// A cache pool as --kv-cache-dtype bf16 keeps it: an f32 tensor's values rounded to nearest even in bf16 storage
// (NaN stays NaN), and the same rounded values in f32 (what a bf16 pool must read as).
inline HostTensor bf16_of(const HostTensor& t) {
  HostTensor out(DType::kBF16, t.shape());
  for (int64_t i = 0; i < t.numel(); ++i) out.data<uint16_t>()[i] = f32_to_bf16(t.data<float>()[i]);
  return out;
}
inline HostTensor rounded_f32_of(const HostTensor& t) {
  HostTensor out(DType::kF32, t.shape());
  for (int64_t i = 0; i < t.numel(); ++i) out.data<float>()[i] = round_bf16(t.data<float>()[i]);
  return out;
}

// A cache pool as --kv-cache-dtype fp8 keeps it: each row of an f32 pool [rows, width] fake-quantized by `kind` (as the
// model quantizes what it caches; NaN rows stay NaN or become zeros, as the kind rounds them), stored as that kind's
// records (u8 [rows, record bytes]), and the same quantized values in f32 (what the records must read as).
struct RecordPool {
  HostTensor records, values;
};
inline RecordPool records_of(const HostTensor& t, FakeQuantKind kind) {
  const int64_t rows = t.view().dim(0), width = t.view().dim(1), bytes = kv_record_bytes(kind, width);
  RecordPool p{HostTensor(DType::kU8, {rows, bytes}), copy_of(t)};
  fake_quant_rows(p.values.data<float>(), rows, width, kind);
  for (int64_t r = 0; r < rows; ++r)
    DI_CHECK(kv_record_encode(kind, p.values.data<float>() + r * width, width, p.records.data<uint8_t>() + r * bytes))
        << "records_of: row " << r;
  return p;
}

// max |a − ref| / max(|ref|, floor) over all elements.
inline double max_rel_error(const float* a, const std::vector<double>& ref, double floor = 1e-6) {
  double err = 0, scale = floor;
  for (size_t i = 0; i < ref.size(); ++i) {
    err = std::max(err, std::fabs(a[i] - ref[i]));
    scale = std::max(scale, std::fabs(ref[i]));
  }
  return err / scale;
}

}  // namespace deepinfer::testing
