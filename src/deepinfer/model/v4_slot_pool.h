// The batched decode's home of the per-sequence rows a V4 / V4.1 step appends to: the compressors' open groups (a
// compressor keeps the rows of the group it has not closed yet, and V4's CSA the first half of the last closed
// window) and V4.1 bounded replay's sliding-window rings. forward() keeps them as tensors of the sequence's own, so a
// decode step over B sequences would append B rows with B separate copies (and, for a compressor before this pool, a
// concatenation and two clones each). Here every sequence has a slot, and each such store one f32 pool of
// [slots · rows_per_slot, width] rows (a compressor a second one for its gate): a step appends all B rows with one
// scatter and reads what it needs with one embedding-style gather, whatever B is.
//
// A slot is the sequence's while it holds the handle (V4SequenceState::pool_slot); the handle gives it back when the
// state is reset or destroyed, and the pool may outlive or predate the handle's owner (shared free list).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "deepinfer/ops/memory.h"

namespace deepinfer {

class V4SlotPool {
 public:
  // One sequence's slot; gives the index back when destroyed.
  class Slot {
   public:
    Slot(std::shared_ptr<std::vector<int64_t>> free, int64_t index) : free_(std::move(free)), index_(index) {}
    ~Slot() { free_->push_back(index_); }
    Slot(const Slot&) = delete;
    Slot& operator=(const Slot&) = delete;
    int64_t index() const { return index_; }

   private:
    std::shared_ptr<std::vector<int64_t>> free_;
    int64_t index_;
  };

  // What a layer keeps per sequence: a compressor, V4's indexer compressor, or V4.1's ring of window rows.
  enum class Kind { kCompressor, kIndexer, kRing };
  // One store's rows: slot s owns rows [s · rows_per_slot, (s + 1) · rows_per_slot) of kv (and gate: compressors).
  struct Rows {
    int64_t rows_per_slot = 0, width = 0;
    OwnedTensor kv, gate;  // f32 [capacity · rows_per_slot, width]; no gate for a ring
  };

  // A free slot, the pools grown by kGrowth slots (contents kept, never past max_slots) when there is none.
  // An engine's runner sets max_slots to its state slots, each budgeted DeepseekV4Model::slot_bytes_bound, which
  // covers a slot's rows here; more sequences than that at once is an internal error.
  std::unique_ptr<Slot> acquire(TensorMemory& mem);
  // The rows of (layer, kind), made at the pool's capacity on first use.
  Rows& rows(TensorMemory& mem, int layer, Kind kind, int64_t rows_per_slot, int64_t width);
  // Those rows, or null when never made.
  Rows* find(int layer, Kind kind);
  const Rows* find(int layer, Kind kind) const;
  void set_max_slots(int64_t n) { max_slots_ = n; }
  int64_t capacity() const { return capacity_; }
  int64_t bytes_allocated() const;

 private:
  static constexpr int64_t kGrowth = 8;
  int64_t capacity_ = 0;
  int64_t max_slots_ = 0;  // 0: unbounded
  std::shared_ptr<std::vector<int64_t>> free_ = std::make_shared<std::vector<int64_t>>();
  std::map<std::pair<int, Kind>, Rows> rows_;
};

}  // namespace deepinfer
