// Host index arrays of one batched decode step, each uploaded once. The layers of a step ask for the same ones: every
// paged window layer writes its row at the same pool row and starts its window at the same position, layers of one
// compress ratio see the same entry counts, and compressors of one shape append at the same pool rows. Each upload
// is an allocation and a host-to-device copy enqueued between the step's kernels, ~190 a V4-Flash step; content-equal
// arrays share one. Read-only to the ops that take them; alive until the step's end.
#pragma once

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "deepinfer/ops/memory.h"

namespace deepinfer {

class StepUploads {
 public:
  explicit StepUploads(TensorMemory& mem) : mem_(mem) {}
  // i64 [v.size()].
  Tensor i64(const std::vector<int64_t>& v) {
    auto [it, fresh] = i64_.try_emplace(v);
    if (fresh) it->second = mem_.from_host(DType::kI64, {static_cast<int64_t>(v.size())}, v.data());
    return it->second.view();
  }
  // u8 [rows, v.size() / rows].
  Tensor u8(const std::vector<uint8_t>& v, int64_t rows) {
    auto [it, fresh] = u8_.try_emplace({rows, v});
    if (fresh) it->second = mem_.from_host(DType::kU8, {rows, static_cast<int64_t>(v.size()) / rows}, v.data());
    return it->second.view();
  }

 private:
  TensorMemory& mem_;
  std::map<std::vector<int64_t>, OwnedTensor> i64_;
  std::map<std::pair<int64_t, std::vector<uint8_t>>, OwnedTensor> u8_;
};

}  // namespace deepinfer
