// The batched decode's per-sequence state in the pages' slot pool (v4_slot_pool.h): the compressors
// (DeepseekV4Model::compress_batch), the rings of V4.1 bounded replay's decoder layers (ring_windows_batch), and
// unpool(), which hands a sequence's pooled state back to forward().
//
// A pooled compressor keeps its open group in its slot's rows: with V4's CSA overlap the slot has two halves of r
// rows, the open group in half emitted % 2 and the window closed before it in the other (whose first `dim` channels
// are the Ca slice forward() keeps as prev_kv / prev_gate). Closing a group flips the halves without a copy. Before a
// first window (no prev_kv) the other half holds kv 0 and gate −inf, which v4_compress_rows also pools.
#include <algorithm>
#include <cmath>

#include "deepinfer/model/deepseek_v4_internal.h"
#include "deepinfer/model/step_uploads.h"

namespace deepinfer {
namespace {

// One compressor's shape: ratio, overlap, row width (kv / gate projections) and pooled width.
struct CompressorShape {
  int r = 0;
  bool overlap = false;
  int64_t width = 0, dim = 0;
  int64_t rows_per_slot() const { return overlap ? 2 * r : r; }
};

CompressorShape shape_of(const ModelConfig& config, const V4Weights& w, int layer, bool indexer, int64_t width) {
  const LayerPlan& plan = config.layers[layer];
  const V4AttentionWeights& a = w.layers[layer].attn;
  const bool v41 = config.family == ModelFamily::kDeepseekV41;
  CompressorShape s;
  s.r = plan.compress_ratio;
  s.overlap = !v41 && plan.attention == AttentionKind::kCSA;
  s.width = width;
  s.dim = v41 ? config.attn.head_dim : (indexer ? a.idx_comp_norm : a.comp_norm).shape()[0];
  return s;
}

V4SlotPool::Kind kind_of(bool indexer) { return indexer ? V4SlotPool::Kind::kIndexer : V4SlotPool::Kind::kCompressor; }

// First pool row of the open group and of the previous window (overlap) of slot `slot`.
int64_t open_row(const CompressorShape& s, int64_t slot, const CompressorState& cs) {
  return slot * s.rows_per_slot() + (s.overlap ? (cs.emitted % 2) * s.r : 0);
}
int64_t prev_row(const CompressorShape& s, int64_t slot, const CompressorState& cs) {
  return slot * s.rows_per_slot() + (1 - cs.emitted % 2) * s.r;
}

// The sequence's own tensors into its slot.
void import_state(TensorMemory& mem, const CompressorShape& s, V4SlotPool::Rows& p, int64_t slot, CompressorState& cs) {
  const int64_t open = open_row(s, slot, cs);
  if (cs.pending > 0) {
    mem.copy(p.kv.view().slice(open, open + cs.pending), cs.pending_kv.view());
    mem.copy(p.gate.view().slice(open, open + cs.pending), cs.pending_gate.view());
  }
  if (s.overlap) {
    const int64_t prev = prev_row(s, slot, cs);
    const Tensor kv = p.kv.view().slice(prev, prev + s.r), gate = p.gate.view().slice(prev, prev + s.r);
    cs.pooled_prev = cs.prev_kv.view().data() != nullptr;
    if (cs.pooled_prev) {
      mem.copy(narrow(kv, 1, 0, s.dim), cs.prev_kv.view());
      mem.copy(narrow(gate, 1, 0, s.dim), cs.prev_gate.view());
    } else {
      mem.fill(kv, 0.0f);  // weight 0: nothing before the first window
      mem.fill(gate, -INFINITY);
    }
  }
  cs.pending_kv = cs.pending_gate = cs.prev_kv = cs.prev_gate = OwnedTensor{};
  cs.pooled = true;
}

// The slot's rows back into the sequence's own tensors, as forward() would have left them.
void export_state(TensorMemory& mem, const CompressorShape& s, V4SlotPool::Rows& p, int64_t slot, CompressorState& cs) {
  const int64_t open = open_row(s, slot, cs);
  if (cs.pending > 0) {
    cs.pending_kv = mem.clone(p.kv.view().slice(open, open + cs.pending));
    cs.pending_gate = mem.clone(p.gate.view().slice(open, open + cs.pending));
  }
  if (s.overlap && cs.pooled_prev) {
    const int64_t prev = prev_row(s, slot, cs);
    cs.prev_kv = mem.clone(narrow(p.kv.view().slice(prev, prev + s.r), 1, 0, s.dim));
    cs.prev_gate = mem.clone(narrow(p.gate.view().slice(prev, prev + s.r), 1, 0, s.dim));
  }
  cs.pooled = cs.pooled_prev = false;
}

}  // namespace

void scatter_groups(Backend& b, TensorMemory& mem, StepUploads& up, PagedRows& kind,
                    std::span<V4SequenceState* const> seqs, const Tensor& rows, const std::vector<int64_t>& which,
                    const std::vector<int64_t>& groups) {
  std::vector<int64_t> at(which.size());
  for (size_t i = 0; i < which.size(); ++i) at[i] = kind.row_for_write(mem, seqs[which[i]]->ref, groups[i]);
  b.scatter_rows({rows, up.i64(at), kind.pool(), kind.record()});  // pool() after row_for_write: growth moves it
}

void DeepseekV4Model::compress_batch(std::span<V4SequenceState* const> seqs, int layer, bool indexer, const Tensor& kv,
                                     const Tensor& gate, const std::vector<bool>& fresh, StepUploads& up) const {
  const V4AttentionWeights& a = w_.layers[layer].attn;
  const bool v41 = config_.family == ModelFamily::kDeepseekV41;
  const int64_t B = static_cast<int64_t>(seqs.size());
  const CompressorShape s = shape_of(config_, w_, layer, indexer, kv.dim(1));
  DI_CHECK_INTERNAL(s.r > 1 && kv.dim(0) == B && gate.dim(0) == B && gate.dim(1) == s.width)
      << "compress_batch: layer " << layer << " ratio " << s.r << ", rows " << kv.dim(0) << " x " << s.width;
  TensorMemory& mem = memory();
  V4SlotPool& pool = seqs[0]->pages->slot_pool;
  if (std::find(fresh.begin(), fresh.end(), true) == fresh.end()) return;
  for (int64_t b = 0; b < B; ++b)
    if (fresh[b] && !seqs[b]->pool_slot) seqs[b]->pool_slot = pool.acquire(mem);
  V4SlotPool::Rows& p = pool.rows(mem, layer, kind_of(indexer), s.rows_per_slot(), s.width);
  auto state = [&](int64_t b) -> CompressorState& {
    V4LayerState& st = seqs[b]->layers[layer];
    return indexer ? st.index_compressor : st.compressor;
  };

  // Every fresh row at its slot's next open row: one scatter for kv, one for the gate.
  std::vector<int64_t> at(static_cast<size_t>(B), -1), closing;
  for (int64_t b = 0; b < B; ++b) {
    if (!fresh[b]) continue;
    CompressorState& cs = state(b);
    const int64_t slot = seqs[b]->pool_slot->index();
    if (!cs.pooled) import_state(mem, s, p, slot, cs);
    at[b] = open_row(s, slot, cs) + cs.pending;
    if (++cs.pending == s.r) closing.push_back(b);
  }
  const Tensor index = up.i64(at);
  backend_.scatter_rows({kv, index, p.kv.view()});
  backend_.scatter_rows({gate, index, p.gate.view()});
  if (closing.empty()) return;

  // The closing groups' rows (overlap: the previous window's, then the group's), gathered in one call each.
  const int64_t n = static_cast<int64_t>(closing.size()), slots = s.rows_per_slot();
  std::vector<int64_t> rows, groups(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const CompressorState& cs = state(closing[i]);
    const int64_t slot = seqs[closing[i]]->pool_slot->index();
    groups[i] = cs.emitted;
    for (int64_t first : s.overlap ? std::vector<int64_t>{prev_row(s, slot, cs), open_row(s, slot, cs)}
                                   : std::vector<int64_t>{open_row(s, slot, cs)})
      for (int64_t k = 0; k < s.r; ++k) rows.push_back(first + k);
  }
  const Tensor ids = up.i64(rows);
  OwnedTensor got_kv = mem.empty(DType::kF32, {n * slots, s.width});  // the gathers write all of it
  OwnedTensor got_gate = mem.empty(DType::kF32, {n * slots, s.width});
  backend_.embedding({p.kv.view(), ids, got_kv.view()});
  backend_.embedding({p.gate.view(), ids, got_gate.view()});
  // What v4_compress_rows pools: [n, slots, dim], overlap taking the previous window's Ca half (first dim channels)
  // and the group's own Cb half (the second dim channels).
  auto pool_input = [&](const OwnedTensor& got, OwnedTensor& hold) {
    const Tensor g = got.view().reshape({n, slots, s.width});
    if (!s.overlap && s.width == s.dim) return g;
    hold = mem.empty(DType::kF32, {n, slots, s.dim});  // the copies write all of it
    if (s.overlap) {
      mem.copy(narrow(hold.view(), 1, 0, s.r), narrow(narrow(g, 1, 0, s.r), 2, 0, s.dim));
      mem.copy(narrow(hold.view(), 1, s.r, slots), narrow(narrow(g, 1, s.r, slots), 2, s.dim, 2 * s.dim));
    } else {
      mem.copy(hold.view(), narrow(g, 2, 0, s.dim));
    }
    return hold.view();
  };
  OwnedTensor hold_kv, hold_gate;
  const Tensor skv = pool_input(got_kv, hold_kv), sgate = pool_input(got_gate, hold_gate);
  OwnedTensor pooled = mem.empty(DType::kF32, {n, s.dim});  // compress_pool writes all of it
  backend_.compress_pool({skv, sgate, pooled.view()});

  if (v41) {
    v41_store_groups(seqs, layer, pooled.view(), closing, groups, up);
  } else {
    std::vector<int64_t> pos(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) pos[i] = groups[i] * s.r;
    norm_rope_rows(backend_, pooled.view(), indexer ? a.idx_comp_norm : a.comp_norm, up.i64(pos),
                   compress_inv_freq_.view(), static_cast<float>(config_.rms_norm_eps));
    V4KvPages& pages = *seqs[0]->pages;
    scatter_groups(backend_, mem, up, (indexer ? pages.index_keys : pages.entries)[layer], seqs, pooled.view(), closing,
                   groups);
  }
  for (int64_t b : closing) {
    CompressorState& cs = state(b);
    cs.pending = 0;
    ++cs.emitted;  // flips the halves: the group just closed is the next one's previous window
    cs.pooled_prev = s.overlap;
    if (!indexer) ++seqs[b]->layers[layer].n_entries;
  }
}

void DeepseekV4Model::v41_store_groups(std::span<V4SequenceState* const> seqs, int layer, const Tensor& latent,
                                       const std::vector<int64_t>& which, const std::vector<int64_t>& groups,
                                       StepUploads& up) const {
  const V4AttentionWeights& a = w_.layers[layer].attn;
  const int r = config_.layers[layer].compress_ratio;
  const int64_t n = latent.dim(0), hd = config_.attn.head_dim, id = config_.attn.index_head_dim;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  TensorMemory& mem = memory();
  rms_norm_inplace(backend_, latent, a.comp_norm, eps);
  std::vector<int64_t> pos(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) pos[i] = groups[i] * r;
  OwnedTensor k = linear(backend_, mem, latent, a.idx_wk);  // indexer keys from the unrotated latent
  // The keys' norm, RoPE and FP4 fake-quant and the latent's RoPE and FP4 fake-quant in one call (as
  // v41_compress_rows).
  NormRopeParams nr;
  nr.parts[0] = {k.view().reshape({n, 1, id}),   optional(a.idx_k_norm), true, true, true,
                 FakeQuantKind::kFP4Ue8m0Block32};
  nr.parts[1] = {latent.reshape({n, 1, hd}), Tensor{}, false, true, true, FakeQuantKind::kFP4E4m3Block16};
  nr.positions = up.i64(pos);
  nr.inv_freq = compress_inv_freq_.view();
  nr.eps = eps;
  backend_.norm_rope(nr);
  V4KvPages& pages = *seqs[0]->pages;
  scatter_groups(backend_, mem, up, pages.index_keys[layer], seqs, k.view(), which, groups);
  scatter_groups(backend_, mem, up, pages.entries[layer], seqs, latent, which, groups);
}

OwnedTensor DeepseekV4Model::ring_windows_batch(std::span<V4SequenceState* const> seqs, int layer, const Tensor& kv,
                                                const std::vector<int64_t>& past_begin, std::vector<int64_t>& first,
                                                std::vector<int64_t>& window_pos, StepUploads& up) const {
  const int64_t B = static_cast<int64_t>(seqs.size()), cap = config_.attn.sliding_window, hd = config_.attn.head_dim;
  TensorMemory& mem = memory();
  V4SlotPool& pool = seqs[0]->pages->slot_pool;
  for (V4SequenceState* s : seqs)
    if (!s->pool_slot) s->pool_slot = pool.acquire(mem);
  V4SlotPool::Rows& rings = pool.rows(mem, layer, V4SlotPool::Kind::kRing, cap, hd);
  // A ring holds the window's positions (capacity = the window), so the slot the new row takes held one that fell
  // out of every window: writing it first leaves every row the windows read in place.
  std::vector<int64_t> at(static_cast<size_t>(B)), rows;
  first.assign(static_cast<size_t>(B + 1), 0);
  window_pos.clear();
  for (int64_t b = 0; b < B; ++b) {
    SwaRing& ring = seqs[b]->layers[layer].window;
    DI_CHECK_INTERNAL(ring.capacity == cap) << "layer " << layer << ": a ring of " << ring.capacity << " rows";
    const int64_t base = seqs[b]->pool_slot->index() * cap, p = seqs[b]->num_tokens;
    const Tensor mine = rings.kv.view().slice(base, base + cap);
    if (!ring.pooled) {
      if (ring.rows.view().data() != nullptr)
        mem.copy(mine, ring.rows.view());
      else
        mem.fill(mine, 0.0f);  // as ring_rows() would have allocated it
      ring.rows = OwnedTensor{};
      ring.pooled = true;
    }
    at[b] = base + p % cap;
    first[b + 1] = first[b] + (p - past_begin[b] + 1);
    for (int64_t q = past_begin[b]; q <= p; ++q) {
      window_pos.push_back(q);
      rows.push_back(base + q % cap);
    }
  }
  backend_.scatter_rows({kv, up.i64(at), rings.kv.view()});
  OwnedTensor windows = mem.empty(DType::kF32, {first[B], hd});  // the gather writes all of it
  backend_.embedding({rings.kv.view(), up.i64(rows), windows.view()});
  return windows;
}

void DeepseekV4Model::unpool(V4SequenceState& seq) const {
  if (!seq.pool_slot) return;
  TensorMemory& mem = memory();
  for (int l = 0; l < config_.num_layers; ++l) {
    V4LayerState& st = seq.layers[l];
    for (bool indexer : {false, true}) {
      CompressorState& cs = indexer ? st.index_compressor : st.compressor;
      if (!cs.pooled) continue;
      V4SlotPool::Rows* p = seq.pages->slot_pool.find(l, kind_of(indexer));
      DI_CHECK_INTERNAL(p != nullptr) << "layer " << l << ": a pooled compressor without pool rows";
      export_state(mem, shape_of(config_, w_, l, indexer, p->width), *p, seq.pool_slot->index(), cs);
    }
    if (st.window.pooled) {
      V4SlotPool::Rows* p = seq.pages->slot_pool.find(l, V4SlotPool::Kind::kRing);
      DI_CHECK_INTERNAL(p != nullptr) << "layer " << l << ": a pooled ring without pool rows";
      const int64_t base = seq.pool_slot->index() * p->rows_per_slot;
      st.window.rows = mem.clone(p->kv.view().slice(base, base + p->rows_per_slot));
      st.window.pooled = false;
    }
  }
  seq.pool_slot.reset();  // its rows are free for another sequence; a later batched step pools it anew
}

}  // namespace deepinfer
