#include "deepinfer/ops/cpu/pool_rows.h"

#include "deepinfer/core/dtype.h"

namespace deepinfer {

PoolRows::PoolRows(const Tensor& pool, int64_t width, FakeQuantKind record)
    : pool_(pool), width_(width), record_(record), widen_(pool.dtype() != DType::kF32) {
  if (!widen_) base_ = pool.data_as<float>();
}

int64_t PoolRows::add(int64_t at) {
  if (!widen_) return at * width_;
  auto [it, fresh] = widened_at_.try_emplace(at, static_cast<int64_t>(widened_.size()));
  if (fresh) {
    widened_.resize(widened_.size() + static_cast<size_t>(width_));
    float* dst = widened_.data() + it->second;
    if (pool_.dtype() == DType::kU8) {
      kv_record_decode(record_, pool_.data_as<uint8_t>() + at * pool_.dim(1), width_, dst);
    } else {
      const uint16_t* src = pool_.data_as<uint16_t>() + at * width_;
      for (int64_t c = 0; c < width_; ++c) dst[c] = bf16_to_f32(src[c]);
    }
  }
  return it->second;
}

void PoolRows::seal() {
  if (widen_) base_ = widened_.data();
}

}  // namespace deepinfer
