// PoolRows: a paged pool's rows as f32 for the CPU ops that read pools in place (paged MLA, paged sink attention,
// paged indexer scores). An f32 pool's rows are read where they are; a bf16 pool's (--kv-cache-dtype bf16) are widened
// exactly and a u8 pool's quantized records (--kv-cache-dtype fp8) decoded, each row once and only the rows a call
// touches, so an op computes over such a pool what it computes over an f32 pool holding the same values.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "deepinfer/core/tensor.h"
#include "deepinfer/ops/kv_record.h"

namespace deepinfer {

class PoolRows {
 public:
  // pool: [rows, width], f32 or bf16, or u8 [rows, record bytes] of `record` records of width values (the ops'
  // validate() checked it).
  PoolRows(const Tensor& pool, int64_t width, FakeQuantKind record = kWindowRecord);

  // A handle of pool row `at` (widening it on first use for a bf16 pool). Not thread-safe: call it before the
  // parallel part of an op.
  int64_t add(int64_t at);
  // After the call's last add(): the rows stop moving, and row() may be called (from any thread).
  void seal();
  const float* row(int64_t handle) const { return base_ + handle; }

 private:
  Tensor pool_;
  int64_t width_ = 0;
  FakeQuantKind record_;
  bool widen_ = false;  // rows go through widened_ (bf16, records)
  std::unordered_map<int64_t, int64_t> widened_at_;
  std::vector<float> widened_;
  const float* base_ = nullptr;
};

}  // namespace deepinfer
