// Private pieces shared by the deepseek_v4*.cc files.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "deepinfer/model/deepseek_v4.h"

namespace deepinfer {

// One forward call over a chunk of `total` tokens at absolute positions p0 .. p0+total-1, of which this rank
// computes T (all of them, or its context-parallel share `cp->local()`).
struct DeepseekV4Model::Chunk {
  int64_t T = 0;
  int64_t total = 0;
  int64_t p0 = 0;
  OwnedTensor positions;                // i64 [T]
  std::vector<int64_t> host_positions;  // the same on the host
  OwnedTensor ids;                      // i64 [T], the token ids
  int64_t swa_floor = 0;        // sliding-window keys below this position are not visible (decoder segment start)
  const CpShard* cp = nullptr;  // set while the chunk is split across a CP group
};

// V4.1 CSA2 selections published within one forward (the reference's per-forward `shared` dict): the
// latest index source's top-k mask over its group's entries, and the candidate-source block mask.
struct DeepseekV4Model::Selection {
  OwnedTensor topk;        // u8 [T, n_topk]
  int64_t n_topk = -1;     // entries the mask covers; -1 = none published yet
  OwnedTensor candidates;  // u8 [T, n_candidates]
  int64_t n_candidates = -1;
};

// The small helpers of the V4 files (deepseek_v4_attention.cc, _decode_batch.cc, _pooled_state.cc).
inline OwnedTensor linear(Backend& b, TensorMemory& mem, const Tensor& x, const OwnedTensor& w) {
  OwnedTensor out = mem.empty(DType::kF32, {x.dim(0), w.shape()[0]});  // the linear writes all of it
  b.linear({x, w.view(), out.view()});
  return out;
}
inline OwnedTensor linear(Backend& b, TensorMemory& mem, const Tensor& x, const KeptMatrix& w) {
  return kept_project(b, mem, x, w);
}

// A norm weight, or none when the checkpoint has none.
inline Tensor optional(const OwnedTensor& w) { return w.view().data() != nullptr ? w.view() : Tensor{}; }

inline void rms_norm_inplace(Backend& b, const Tensor& x, const OwnedTensor& w, float eps) {
  b.rms_norm({x, optional(w), x, eps});
}

// rms_norm (weight optional) then the forward RoPE of [rows, 1, dim] in one call.
inline void norm_rope_rows(Backend& b, const Tensor& x, const OwnedTensor& w, const Tensor& positions,
                           const Tensor& inv_freq, float eps) {
  NormRopeParams p;
  p.parts[0] = {x.reshape({x.dim(0), 1, x.dim(1)}), optional(w), true, true};
  p.positions = positions;
  p.inv_freq = inv_freq;
  p.eps = eps;
  b.norm_rope(p);
}

// rows [n, width] into `kind` (window rows, entries, indexer keys) at group groups[i] of sequence seqs[which[i]]:
// one scatter (deepseek_v4_pooled_state.cc).
void scatter_groups(Backend& b, TensorMemory& mem, StepUploads& up, PagedRows& kind,
                    std::span<V4SequenceState* const> seqs, const Tensor& rows, const std::vector<int64_t>& which,
                    const std::vector<int64_t>& groups);

// Rows at the start of a chunk that a compressor has already accounted for: after start_at() at a prefix hit
// its next group starts at the first group boundary >= start, and the replayed rows before it belong to
// groups that are already cached.
inline int64_t replayed_rows(int64_t p0, int64_t T, const CompressorState& cs, int r) {
  const int64_t expected = cs.emitted * r + cs.pending;
  DI_CHECK_INTERNAL(expected >= p0) << "compressor at position " << expected << " but the chunk starts at " << p0;
  return std::min<int64_t>(expected - p0, T);
}

// Calls f(slot, offset, len) for the runs of ring slots that hold positions [p, p + n), n <= capacity, in
// position order (at most two runs: the ring wraps once).
template <typename F>
void for_ring_runs(int64_t capacity, int64_t p, int64_t n, F&& f) {
  for (int64_t done = 0; done < n;) {
    const int64_t slot = (p + done) % capacity, len = std::min(n - done, capacity - slot);
    f(slot, done, len);
    done += len;
  }
}

}  // namespace deepinfer
