#include "deepinfer/model/decode_graphs.h"

#include <algorithm>

#include "deepinfer/core/error.h"

namespace deepinfer {

DecodeGraphs::DecodeGraphs(Backend& backend, int64_t max_batch, bool record)
    : backend_(backend),
      max_batch_(max_batch),
      record_(record),
      pool_(record ? backend.new_recording_pool() : nullptr) {
  DI_CHECK(max_batch >= 1) << "decode graphs: max batch " << max_batch << " must be >= 1";
}

int64_t DecodeGraphs::batch_bucket(int64_t batch) const {
  DI_CHECK_INTERNAL(batch >= 1) << "decode graphs: batch " << batch;
  if (batch > max_batch_) return 0;
  // Powers of two up to 16, then steps of a quarter of the power of two below (padding waste < 25 %).
  int64_t b = 1;
  while (b < batch && b < 16) b *= 2;
  if (b >= batch) return std::min(b, max_batch_);
  int64_t pow = 16;
  while (pow * 2 <= batch) pow *= 2;
  const int64_t step = pow / 4;
  return std::min((batch + step - 1) / step * step, max_batch_);
}

int64_t DecodeGraphs::width_bucket(int64_t width) {
  int64_t w = 4;
  while (w < width) w *= 2;
  return w;
}

void DecodeGraphs::drop_all() {
  if (!recorded_.empty() || !pieces_.empty()) ++stats_.dropped;
  recorded_.clear();
  pieces_.clear();
}

Tensor DecodeGraphs::buffer(TensorMemory& mem, int slot, DType dtype, const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  OwnedTensor& buf = buffers_[slot];
  if (buf.view().data() == nullptr || buf.dtype() != dtype || buf.view().numel() < n) {
    drop_all();
    buf = mem.zeros(dtype, {std::max<int64_t>(n, 1)});
  }
  return buf.view().slice(0, n).reshape(shape);
}

void DecodeGraphs::run_piece(int64_t batch, int64_t piece, const std::function<void()>& enqueue) {
  DI_CHECK_INTERNAL(enabled()) << "decode graphs: the backend cannot record";
  if (!record_) {
    enqueue();
    if (piece == 0) ++stats_.padded_eager;
    return;
  }
  auto& slot = pieces_[{batch, piece}];
  if (slot) {
    slot->replay();
    if (piece == 0) ++stats_.replays;
    return;
  }
  try {
    slot = backend_.record(enqueue, *pool_);
  } catch (...) {
    pieces_.erase({batch, piece});
    throw;
  }
  ++stats_.recorded;
}

DecodeStepInputs DecodeGraphs::inputs(TensorMemory& mem, int64_t batch, int64_t width, int64_t vocab) {
  if (batch > batch_cap_ || width > width_cap_ || vocab != vocab_) {
    drop_all();
    batch_cap_ = std::max(batch, batch_cap_);
    width_cap_ = std::max(width, width_cap_);
    vocab_ = vocab;
    ids_ = mem.zeros(DType::kI64, {batch_cap_});
    positions_ = mem.zeros(DType::kI64, {batch_cap_});
    q_seq_ = mem.zeros(DType::kI32, {batch_cap_});
    write_rows_ = mem.zeros(DType::kI64, {batch_cap_});
    tables_ = mem.zeros(DType::kI32, {batch_cap_ * width_cap_});
    logits_ = mem.zeros(DType::kF32, {batch_cap_, vocab_});
  }
  DecodeStepInputs in;
  in.ids = ids_.view().slice(0, batch);
  in.positions = positions_.view().slice(0, batch);
  in.q_seq = q_seq_.view().slice(0, batch);
  in.write_rows = write_rows_.view().slice(0, batch);
  in.tables = tables_.view().slice(0, batch * width).reshape({batch, width});
  in.logits = logits_.view().slice(0, batch);
  return in;
}

void DecodeGraphs::depend_on(std::vector<const void*> deps) {
  if (deps != deps_) {
    drop_all();
    deps_ = std::move(deps);
  }
}

void DecodeGraphs::run(int64_t batch, int64_t width, const std::function<void()>& enqueue) {
  DI_CHECK_INTERNAL(enabled()) << "decode graphs: the backend cannot record";
  if (!record_) {
    enqueue();
    ++stats_.padded_eager;
    return;
  }
  auto& slot = recorded_[{batch, width}];
  if (slot) {
    slot->replay();
    ++stats_.replays;
    return;
  }
  try {
    slot = backend_.record(enqueue, *pool_);
  } catch (...) {
    recorded_.erase({batch, width});
    throw;
  }
  ++stats_.recorded;
}

}  // namespace deepinfer
