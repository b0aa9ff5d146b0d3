#include "deepinfer/ops/cpu/pool_rows.h"

#include "deepinfer/core/dtype.h"

namespace deepinfer {

PoolRows::PoolRows(const Tensor& pool) : pool_(pool), width_(pool.dim(1)), bf16_(pool.dtype() == DType::kBF16) {
  if (!bf16_) base_ = pool.data_as<float>();
}

int64_t PoolRows::add(int64_t at) {
  if (!bf16_) return at * width_;
  auto [it, fresh] = widened_at_.try_emplace(at, static_cast<int64_t>(widened_.size()));
  if (fresh) {
    const uint16_t* src = pool_.data_as<uint16_t>() + at * width_;
    for (int64_t c = 0; c < width_; ++c) widened_.push_back(bf16_to_f32(src[c]));
  }
  return it->second;
}

void PoolRows::seal() {
  if (bf16_) base_ = widened_.data();
}

}  // namespace deepinfer
