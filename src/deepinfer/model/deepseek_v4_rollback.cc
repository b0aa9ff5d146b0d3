// DeepseekV4Model::truncate: speculative decoding's rollback of a V4 / V4.1 sequence to a prefix of the last
// chunk (docs/SPECULATIVE.md). The chunk's forward recorded a V4Undo; from it every per-slot cache kind is put back
// to what a forward of only the kept tokens would have left, bit for bit:
//   - sliding-window rings: the slots of dropped positions get back the rows the chunk overwrote (or, after a chunk
//     longer than the ring, the chunk's own earlier rows);
//   - compressors: the emitted-group counter and entry count go back to the groups the kept tokens close; the
//     pending rows of the open group are a slice of the rows the compressor saw (its pending rows before the chunk,
//     then the chunk's); V4 CSA's overlap slice is the first half of the last kept closed window's rows;
//   - compressed entries and indexer keys: slot-owned buffers are cut to the kept groups; paged rows past them are
//     ignored and rewritten when the group closes again (nothing reads a group before it is counted);
//   - Engram look-back: the last (n-1) compressed ids of the kept tokens;
//   - paged window rows of dropped positions are rewritten by the next chunk before any query reads them.
// This relies on a forward's per-token work not depending on the chunk's later tokens (causal attention, row-wise
// ops), which the chunked-prefill tests pin down.
#include <algorithm>

#include "deepinfer/model/deepseek_v4_internal.h"

namespace deepinfer {

namespace {

// The compressor after only positions [.., num_tokens) of the chunk: groups closed by then, the open group's rows
// pending. `overlap_dim` > 0 (V4 CSA): also the overlap slice (first overlap_dim channels of the last closed
// window).
void truncate_compressor(TensorMemory& mem, CompressorState& cs, const V4Undo::Compressor& u, int r, int64_t num_tokens,
                         int64_t overlap_dim) {
  const CompressorState& before = u.before;
  const int64_t base = before.emitted * r, groups = num_tokens / r, pending = num_tokens - groups * r;
  DI_CHECK_INTERNAL(groups >= before.emitted && num_tokens >= base + before.pending)
      << "truncate: a compressor at position " << base + before.pending << " cannot go back to " << num_tokens;
  cs.emitted = groups;
  cs.pending = pending;
  cs.pending_kv = cs.pending_gate = OwnedTensor{};
  if (r == 1) return;
  const int64_t seen = u.kv.view().data() ? u.kv.shape()[0] : 0;
  DI_CHECK_INTERNAL(num_tokens - base <= seen)
      << "truncate: the compressor recorded " << seen << " rows from " << base << ", needs " << num_tokens - base;
  const int64_t open = groups * r - base;  // first row of the open group
  if (pending > 0) {
    cs.pending_kv = mem.clone(u.kv.view().slice(open, open + pending));
    cs.pending_gate = mem.clone(u.gate.view().slice(open, open + pending));
  }
  if (overlap_dim > 0) {
    if (groups == before.emitted) {
      cs.prev_kv = before.prev_kv;
      cs.prev_gate = before.prev_gate;
    } else {
      cs.prev_kv = mem.clone(narrow(u.kv.view().slice(open - r, open), 1, 0, overlap_dim));
      cs.prev_gate = mem.clone(narrow(u.gate.view().slice(open - r, open), 1, 0, overlap_dim));
    }
  }
}

}  // namespace

void DeepseekV4Model::truncate(V4SequenceState& seq, int64_t num_tokens) const {
  DI_CHECK_INTERNAL(seq.undo.has_value()) << "truncate: the last forward kept no undo record (record_undo off)";
  const V4Undo& u = *seq.undo;
  DI_CHECK_INTERNAL(num_tokens >= u.p0 && num_tokens <= seq.num_tokens)
      << "truncate to " << num_tokens << " tokens: the last chunk covered [" << u.p0 << ", " << seq.num_tokens << ")";
  if (num_tokens == seq.num_tokens) {
    seq.undo.reset();
    return;
  }
  TensorMemory& mem = memory();
  const bool v41 = config_.family == ModelFamily::kDeepseekV41;
  for (int l = 0; l < config_.num_layers; ++l) {
    V4LayerState& st = seq.layers[l];
    const V4Undo::Layer& ul = u.layers[static_cast<size_t>(l)];
    // The slot of a dropped position w must hold the newest kept position of that slot again: the row the chunk
    // overwrote, or, when that position is itself in a chunk longer than the ring, the chunk's row the ring never
    // got.
    if (ul.ring.old_rows.view().data() != nullptr) {
      const int64_t cap = st.window.capacity, first = ul.ring.first, end = first + ul.ring.old_rows.shape()[0];
      for (int64_t w = std::max(first, num_tokens); w < end; ++w) {
        const int64_t older = w - cap * ((w - num_tokens) / cap + 1), slot = w % cap;
        const Tensor dst = st.window.rows.view().slice(slot, slot + 1);
        if (ul.ring.chunk_rows.view().data() != nullptr && older >= ul.ring.chunk_first) {
          const int64_t row = older - ul.ring.chunk_first;
          mem.copy(dst, ul.ring.chunk_rows.view().slice(row, row + 1));
        } else {
          mem.copy(dst, ul.ring.old_rows.view().slice(w - first, w - first + 1));
        }
      }
    }
    const LayerPlan& plan = config_.layers[l];
    const int r = plan.compress_ratio;
    if (r <= 0) continue;
    const bool overlap = !v41 && plan.attention == AttentionKind::kCSA;
    const int64_t dim = [&]() -> int64_t {
      const auto& a = w_.layers[l].attn;
      return a.comp_norm.view().data() ? a.comp_norm.shape()[0] : 0;
    }();
    if (ul.compressor.ran) {
      truncate_compressor(mem, st.compressor, ul.compressor, r, num_tokens, overlap ? dim : 0);
      st.n_entries = st.compressor.emitted;
    } else if (!v41 || plan.kv_source == l) {
      DI_CHECK_INTERNAL(st.compressor.emitted * r + st.compressor.pending <= num_tokens)
          << "truncate: layer " << l << "'s compressor did not run in the chunk but is past position " << num_tokens;
    }
    if (ul.index_compressor.ran) {
      const int64_t idim = w_.layers[l].attn.idx_comp_norm.shape()[0];
      truncate_compressor(mem, st.index_compressor, ul.index_compressor, r, num_tokens, overlap ? idim : 0);
    }
    if (!seq.pages) {
      if (st.entries.rows > 0) st.entries.rows = st.n_entries;
      if (st.index_keys.rows > 0) st.index_keys.rows = v41 ? st.n_entries : st.index_compressor.emitted;
    }
  }
  if (engram_) {
    const int64_t keep = u.engram_carried + (num_tokens - u.p0);
    DI_CHECK_INTERNAL(keep <= static_cast<int64_t>(u.engram_history.size()))
        << "truncate: Engram history of " << u.engram_history.size() << " ids, keeping " << keep;
    const int64_t n = std::min<int64_t>(engram_->max_ngram - 1, keep);
    seq.engram_recent.assign(u.engram_history.begin() + (keep - n), u.engram_history.begin() + keep);
  }
  seq.num_tokens = num_tokens;
  seq.undo.reset();
}

}  // namespace deepinfer
