// DecodeGraphs: a model's batched decode step recorded once per shape bucket and replayed (CUDA graphs), owned by
// the engine's runner next to the pages the steps write.
//
// A decode step is hundreds of small launches, so on a GPU the launch path, not the math, sets its time at small
// batch. A recording fixes every kernel's arguments, so the step must read everything that changes from one step
// to the next out of device buffers whose addresses do not change: the step inputs below (token ids, positions,
// block tables, the pool rows the new cache rows go to) are persistent, sized for the largest bucket seen, and the
// logits come back through a persistent buffer. Shapes are bucketed: the batch is padded up to a bucket size (a
// padding row repeats row 0's inputs and writes no cache row, its logits are dropped) and the block tables to a
// power-of-two width, so a few recordings serve every step. What a recording also reads by address — the page
// pools, which grow by reallocation — is listed by the model as dependencies; when one moves, every recording is
// dropped and re-recorded on first use.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "deepinfer/ops/memory.h"
#include "deepinfer/ops/ops.h"

namespace deepinfer {

// Step inputs for a padded batch of `batch` rows and table width `width`, views into the persistent buffers.
struct DecodeStepInputs {
  Tensor ids;         // i64 [batch]
  Tensor positions;   // i64 [batch]
  Tensor q_seq;       // i32 [batch]: row b reads block table row b
  Tensor tables;      // i32 [batch, width], -1 past a sequence's blocks
  Tensor write_rows;  // i64 [batch]: pool row of each row's new cache row (every layer alike), -1: none
  Tensor logits;      // f32 [batch, vocab] (the step's output)
};

// What consumes a batched decode step's logits (f32 [B, vocab]) while they are still on the device: a model's
// decode_batch given one calls it instead of copying the rows to the host (the engine's greedy fast path reduces
// them to token ids there, engine/device_step_hooks.h).
using DeviceLogitsFn = std::function<void(const Tensor& logits)>;

struct DecodeGraphStats {
  int64_t recorded = 0;      // recordings made (each ran the step eagerly too)
  int64_t replays = 0;       // steps served by a replay
  int64_t eager = 0;         // steps run eagerly (no recording possible: too large a batch, graphs off)
  int64_t padded_eager = 0;  // padded steps launched eagerly (record = false)
  int64_t dropped = 0;       // times every recording was dropped because a dependency moved
};

class DecodeGraphs {
 public:
  // Recording needs a backend that can (CUDA); on others enabled() is false and the model runs steps eagerly.
  // `record` false: the steps are padded and fed through the persistent inputs as recorded ones would be, but
  // launched eagerly (tests compare replays against this: same shapes, same kernels, so the same bits).
  explicit DecodeGraphs(Backend& backend, int64_t max_batch = 256, bool record = true);
  bool enabled() const { return !record_ || pool_ != nullptr; }

  // The padded batch for `batch` sequences (1, 2, 4, 8, 16, 24, 32, 48, 64, ... up to max_batch), 0 above it.
  int64_t batch_bucket(int64_t batch) const;
  // The padded table width: the next power of two >= max(width, 4).
  static int64_t width_bucket(int64_t width);

  // Views for a step of (batch, width) buckets; growing a buffer drops every recording (they read the old one).
  DecodeStepInputs inputs(TensorMemory& mem, int64_t batch, int64_t width, int64_t vocab);
  // Drops every recording when `deps` differ from the addresses the recordings were made with.
  void depend_on(std::vector<const void*> deps);
  // Replays the step of (batch, width), recording it first (`enqueue` runs it eagerly then) if there is none.
  void run(int64_t batch, int64_t width, const std::function<void()>& enqueue);

  // Steps recorded in pieces, with eager work between them (V4: each layer's per-sequence compressor / indexer /
  // attention middle runs eagerly between recordings of the batched rest; the pieces do not depend on the table
  // width). A piece must read and write only persistent memory across the boundary: buffer() gives it. The
  // stats count a step (replayed, or padded eager) at piece 0, and every recording made.
  // A persistent buffer `slot` viewed as `shape` (the first elements of an allocation that only grows; zeros when
  // first made). Growing one drops every recording (they read the old address).
  Tensor buffer(TensorMemory& mem, int slot, DType dtype, const std::vector<int64_t>& shape);
  // Replays piece `piece` of the step of `batch` rows, recording it first if there is none.
  void run_piece(int64_t batch, int64_t piece, const std::function<void()>& enqueue);
  void count_eager() { ++stats_.eager; }
  const DecodeGraphStats& stats() const { return stats_; }

 private:
  void drop_all();

  Backend& backend_;
  int64_t max_batch_;
  bool record_;
  std::unique_ptr<RecordingPool> pool_;
  std::map<std::pair<int64_t, int64_t>, std::unique_ptr<RecordedWork>> recorded_, pieces_;
  std::map<int, OwnedTensor> buffers_;
  std::vector<const void*> deps_;
  int64_t batch_cap_ = 0, width_cap_ = 0, vocab_ = 0;
  OwnedTensor ids_, positions_, q_seq_, tables_, write_rows_, logits_;
  DecodeGraphStats stats_;
};

}  // namespace deepinfer
