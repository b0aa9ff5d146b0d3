#include "deepinfer/model/v4_slot_pool.h"

#include <algorithm>
#include <functional>

#include "deepinfer/core/error.h"

namespace deepinfer {

std::unique_ptr<V4SlotPool::Slot> V4SlotPool::acquire(TensorMemory& mem) {
  if (free_->empty()) {
    DI_CHECK_INTERNAL(max_slots_ == 0 || capacity_ < max_slots_)
        << "slot pool: more than " << max_slots_ << " sequences at once";
    const int64_t grown = max_slots_ > 0 ? std::min(capacity_ + kGrowth, max_slots_) : capacity_ + kGrowth;
    for (auto& [key, r] : rows_) {
      for (OwnedTensor* t : {&r.kv, &r.gate}) {
        if (t->view().data() == nullptr) continue;  // a ring's gate
        OwnedTensor bigger = mem.zeros(DType::kF32, {grown * r.rows_per_slot, r.width});
        if (capacity_ > 0) mem.copy(bigger.view().slice(0, capacity_ * r.rows_per_slot), t->view());
        *t = std::move(bigger);
      }
    }
    // Lowest index first: a small batch keeps to the front of the pools.
    for (int64_t s = grown - 1; s >= capacity_; --s) free_->push_back(s);
    capacity_ = grown;
  }
  std::sort(free_->begin(), free_->end(), std::greater<>());
  const int64_t index = free_->back();
  free_->pop_back();
  return std::make_unique<Slot>(free_, index);
}

V4SlotPool::Rows& V4SlotPool::rows(TensorMemory& mem, int layer, Kind kind, int64_t rows_per_slot, int64_t width) {
  DI_CHECK_INTERNAL(capacity_ > 0) << "slot pool rows asked for before any slot was acquired";
  Rows& r = rows_[{layer, kind}];
  if (r.rows_per_slot == 0) {
    r.rows_per_slot = rows_per_slot;
    r.width = width;
    r.kv = mem.zeros(DType::kF32, {capacity_ * rows_per_slot, width});
    if (kind != Kind::kRing) r.gate = mem.zeros(DType::kF32, {capacity_ * rows_per_slot, width});
  }
  DI_CHECK_INTERNAL(r.rows_per_slot == rows_per_slot && r.width == width)
      << "slot pool of layer " << layer << " made with " << r.rows_per_slot << " x " << r.width << " rows, asked "
      << rows_per_slot << " x " << width;
  return r;
}

V4SlotPool::Rows* V4SlotPool::find(int layer, Kind kind) {
  auto it = rows_.find({layer, kind});
  return it == rows_.end() ? nullptr : &it->second;
}
const V4SlotPool::Rows* V4SlotPool::find(int layer, Kind kind) const {
  auto it = rows_.find({layer, kind});
  return it == rows_.end() ? nullptr : &it->second;
}

int64_t V4SlotPool::bytes_allocated() const {
  int64_t b = 0;
  for (const auto& [key, r] : rows_) b += (r.gate.view().data() ? 2 : 1) * capacity_ * r.rows_per_slot * r.width * 4;
  return b;
}

}  // namespace deepinfer
