// DeepSeek-V4 / V4.1 attention of one layer: low-rank queries, a single K=V latent head with sliding-window
// cache, the compressed branch (V4: CSA with overlapping windows + indexer, HCA; V4.1: CSA2 groups sharing
// the kv-source layer's entries and selections), sink attention, inverse RoPE and the grouped output
// projection. Shapes: T tokens, H heads, hd head dim, r compress ratio, G closed groups, N entries.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "deepinfer/model/deepseek_v4_internal.h"
#include "deepinfer/model/v4_grouped_output.h"

namespace deepinfer {
namespace {

// Rows from which a compressor projection with a bf16 copy (V4AttentionWeights::comp_wkv_bf16 ...) runs on bf16
// tensor cores with split activations (linear_quant's split_in: ~2^-16 relative, not f32's exact products). Below,
// the f32 weight as before: a decode token or a short chunk (speculative verification, a prompt's tail) is a few
// rows that stream the weight, where tensor cores gain little, and keeps today's numerics (the batched decode does
// not come here: it projects with the f32 weights itself). Not measured: a round number past decode's 1-64 rows.
constexpr int64_t kSplitBf16MinRows = 128;

// x·wᵀ for a compressor projection: f32 w, or its bf16 copy (when kept) for many rows.
OwnedTensor compressor_linear(Backend& b, TensorMemory& mem, const Tensor& x, const OwnedTensor& w,
                              const OwnedTensor& w_bf16) {
  if (w_bf16.view().data() == nullptr || x.dim(0) < kSplitBf16MinRows) return linear(b, mem, x, w);
  OwnedTensor out = mem.empty(DType::kF32, {x.dim(0), w.shape()[0]});  // the linear writes all of it
  QuantLinearParams p;
  p.in = x;
  p.weight = QuantMatrix{w_bf16.view(), Tensor{}, QuantFormat::kFloat};
  p.out = out.view();
  p.split_in = true;
  b.linear_quant(p);
  return out;
}

// A norm weight, or none when the checkpoint has none.

OwnedTensor positions_of(TensorMemory& mem, const std::vector<int64_t>& pos) {
  return mem.from_host(DType::kI64, {static_cast<int64_t>(pos.size())}, pos.data());
}

// Appends T new rows [T, width] to a compressor's pending rows. Returns G, the closed groups: their rows are
// rows [0, G·r) of out_kv/out_gate; the rest stay pending.
int64_t take_closed_groups(TensorMemory& mem, CompressorState& cs, const Tensor& kv, const Tensor& gate, int r,
                           OwnedTensor& out_kv, OwnedTensor& out_gate) {
  const int64_t T = kv.dim(0), width = kv.dim(1), total = cs.pending + T;
  auto concat = [&](const OwnedTensor& pending, const Tensor& fresh) {
    OwnedTensor all = mem.zeros(DType::kF32, {total, width});
    if (cs.pending > 0) mem.copy(all.view().slice(0, cs.pending), pending.view());
    mem.copy(all.view().slice(cs.pending, total), fresh);
    return all;
  };
  out_kv = concat(cs.pending_kv, kv);
  out_gate = concat(cs.pending_gate, gate);
  const int64_t groups = total / r, used = groups * r;
  cs.pending = total - used;
  cs.pending_kv = cs.pending > 0 ? mem.clone(out_kv.view().slice(used, total)) : OwnedTensor{};
  cs.pending_gate = cs.pending > 0 ? mem.clone(out_gate.view().slice(used, total)) : OwnedTensor{};
  return groups;
}

}  // namespace

void DeepseekV4Model::store_rows(V4SequenceState& seq, int layer, bool keys, int64_t first, const Tensor& rows) const {
  if (seq.pages) {
    (keys ? seq.pages->index_keys : seq.pages->entries)[layer].write(memory(), seq.ref, first, rows);
  } else {
    V4LayerState& st = seq.layers[layer];
    DI_CHECK_INTERNAL((keys ? st.index_keys : st.entries).rows == first) << "layer " << layer << " rows out of step";
    if (rounds_bf16()) round_to_bf16_values(memory(), rows);  // the values a bf16 pool would hold
    (keys ? st.index_keys : st.entries).append(memory(), rows);
  }
}

Tensor DeepseekV4Model::rows_view(const V4SequenceState& seq, int layer, bool keys, OwnedTensor& hold) const {
  const V4LayerState& st = seq.layers[layer];
  if (!seq.pages) return (keys ? st.index_keys : st.entries).view();
  hold = (keys ? seq.pages->index_keys : seq.pages->entries)[layer].gather(memory(), seq.ref, 0, st.n_entries);
  return hold.view();
}

OwnedTensor DeepseekV4Model::chunk_rows(const Chunk& c, const OwnedTensor& x, const OwnedTensor& w,
                                        const OwnedTensor& w_bf16, int64_t drop) const {
  TensorMemory& mem = memory();
  if (!c.cp) return compressor_linear(backend_, mem, x.view().slice(drop, c.total), w, w_bf16);
  OwnedTensor mine = compressor_linear(backend_, mem, x.view(), w, w_bf16);
  OwnedTensor all = mem.zeros(DType::kF32, {c.total, w.shape()[0]});
  c.cp->all_gather_rows(mem, mine.view(), all.view());
  return drop == 0 ? all : mem.clone(all.view().slice(drop, c.total));
}

// V4 compressor (main entries, or with `indexer` the indexer's keys). CSA overlaps windows: entry w pools
// the Ca half of window w−1 with the Cb half of window w over 2r slots; HCA pools its r tokens.
void DeepseekV4Model::v4_compress(const Chunk& c, int layer, const OwnedTensor& x_all, V4SequenceState& seq,
                                  bool indexer) const {
  V4LayerState& st = seq.layers[layer];
  const auto& a = w_.layers[layer].attn;
  const OwnedTensor& wkv = indexer ? a.idx_comp_wkv : a.comp_wkv;
  const OwnedTensor& wgate = indexer ? a.idx_comp_wgate : a.comp_wgate;
  const OwnedTensor& wkv_bf16 = indexer ? a.idx_comp_wkv_bf16 : a.comp_wkv_bf16;
  const OwnedTensor& wgate_bf16 = indexer ? a.idx_comp_wgate_bf16 : a.comp_wgate_bf16;
  const OwnedTensor& ape = indexer ? a.idx_comp_ape : a.comp_ape;
  CompressorState& cs = indexer ? st.index_compressor : st.compressor;
  const int r = config_.layers[layer].compress_ratio;
  const int64_t width = wkv.shape()[0];
  TensorMemory& mem = memory();
  const int64_t drop = replayed_rows(c.p0, c.total, cs, r);
  if (drop == c.total) return;
  const int64_t T = c.total - drop, p0 = c.p0 + drop;

  OwnedTensor kv = chunk_rows(c, x_all, wkv, wkv_bf16, drop);  // [T, width]
  OwnedTensor gate = chunk_rows(c, x_all, wgate, wgate_bf16, drop);
  // Learned position biases join the gate by slot (position mod r); groups start at multiples of r.
  std::vector<int64_t> slot(T);
  for (int64_t t = 0; t < T; ++t) slot[t] = (p0 + t) % r;
  OwnedTensor slot_ids = positions_of(mem, slot), bias = mem.zeros(DType::kF32, {T, width});
  backend_.embedding({ape.view(), slot_ids.view(), bias.view()});
  mem.add(gate.view(), bias.view());
  v4_compress_rows(layer, kv.view(), gate.view(), seq, indexer);
}

void DeepseekV4Model::v4_compress_rows(int layer, const Tensor& kv, const Tensor& gate, V4SequenceState& seq,
                                       bool indexer) const {
  V4LayerState& st = seq.layers[layer];
  const auto& a = w_.layers[layer].attn;
  const OwnedTensor& norm = indexer ? a.idx_comp_norm : a.comp_norm;
  CompressorState& cs = indexer ? st.index_compressor : st.compressor;
  const int r = config_.layers[layer].compress_ratio;
  const bool overlap = config_.layers[layer].attention == AttentionKind::kCSA;
  const int64_t width = kv.dim(1), dim = norm.shape()[0];
  TensorMemory& mem = memory();
  OwnedTensor ckv, cgate;
  V4Undo::Compressor* undo = nullptr;
  if (seq.undo) {
    undo = &(indexer ? seq.undo->layers[layer].index_compressor : seq.undo->layers[layer].compressor);
    undo->ran = true;
    undo->before = cs;
  }
  const int64_t G = take_closed_groups(mem, cs, kv, gate, r, ckv, cgate);
  if (undo) {
    undo->kv = ckv;
    undo->gate = cgate;
  }
  if (G == 0) return;

  const int64_t slots = overlap ? 2 * r : r;
  OwnedTensor skv = mem.zeros(DType::kF32, {G, slots, dim}), sgate = mem.zeros(DType::kF32, {G, slots, dim});
  const Tensor rkv = ckv.view().slice(0, G * r).reshape({G, r, width});
  const Tensor rgate = cgate.view().slice(0, G * r).reshape({G, r, width});
  // Each window's own rows: overlap puts their Cb half (the second `dim` channels) in the last r slots.
  const int64_t own = overlap ? r : 0, own_ch = overlap ? dim : 0;
  mem.copy(narrow(skv.view(), 1, own, own + r), narrow(rkv, 2, own_ch, own_ch + dim));
  mem.copy(narrow(sgate.view(), 1, own, own + r), narrow(rgate, 2, own_ch, own_ch + dim));
  if (overlap) {
    // The first r slots take the previous window's Ca half: from this chunk, from the carried state, or
    // nothing (kv 0, gate −inf: weight 0) before the first window.
    if (G > 1) {
      mem.copy(narrow(skv.view().slice(1, G), 1, 0, r), narrow(rkv.slice(0, G - 1), 2, 0, dim));
      mem.copy(narrow(sgate.view().slice(1, G), 1, 0, r), narrow(rgate.slice(0, G - 1), 2, 0, dim));
    }
    const Tensor first_kv = skv.view().row(0).slice(0, r), first_gate = sgate.view().row(0).slice(0, r);
    if (cs.prev_kv.view().data() != nullptr) {
      mem.copy(first_kv, cs.prev_kv.view());
      mem.copy(first_gate, cs.prev_gate.view());
    } else {
      mem.fill(first_gate, -INFINITY);
    }
    cs.prev_kv = mem.clone(narrow(rkv.row(G - 1), 1, 0, dim));
    cs.prev_gate = mem.clone(narrow(rgate.row(G - 1), 1, 0, dim));
  }
  OwnedTensor pooled = mem.zeros(DType::kF32, {G, dim});
  backend_.compress_pool({skv.view(), sgate.view(), pooled.view()});
  std::vector<int64_t> pos(G);
  for (int64_t g = 0; g < G; ++g) pos[g] = (cs.emitted + g) * r;
  OwnedTensor p = positions_of(mem, pos);
  norm_rope_rows(backend_, pooled.view(), norm, p.view(), compress_inv_freq_.view(),
                 static_cast<float>(config_.rms_norm_eps));
  store_rows(seq, layer, indexer, cs.emitted, pooled.view());
  cs.emitted += G;
  if (!indexer) st.n_entries += G;
}

// V4.1 kv-source compressor: r = 1 is a plain per-token projection, r > 1 pools r tokens with an fp32
// softmax gate (no position bias, no overlap). From the pre-RoPE latent it derives the group's indexer keys
// (k_norm(wk·latent), RoPE, FP4) and its main entries (RoPE, FP4 with e4m3 scales).
void DeepseekV4Model::v41_compress(const Chunk& c, int layer, const OwnedTensor& x_all, V4SequenceState& seq) const {
  const auto& a = w_.layers[layer].attn;
  const int r = config_.layers[layer].compress_ratio;
  const int64_t drop = replayed_rows(c.p0, c.total, seq.layers[layer].compressor, r);
  if (drop == c.total) return;
  const OwnedTensor kv = chunk_rows(c, x_all, a.comp_wkv, a.comp_wkv_bf16, drop);
  const OwnedTensor gate = r == 1 ? OwnedTensor{} : chunk_rows(c, x_all, a.comp_wgate, a.comp_wgate_bf16, drop);
  v41_compress_rows(layer, kv.view(), gate.view(), seq);
}

void DeepseekV4Model::v41_compress_rows(int layer, const Tensor& kv, const Tensor& gate, V4SequenceState& seq) const {
  V4LayerState& st = seq.layers[layer];
  const auto& a = w_.layers[layer].attn;
  const int r = config_.layers[layer].compress_ratio;
  const int64_t hd = config_.attn.head_dim;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  CompressorState& cs = st.compressor;
  TensorMemory& mem = memory();
  const int64_t T = kv.dim(0);
  V4Undo::Compressor* undo = seq.undo ? &seq.undo->layers[layer].compressor : nullptr;
  if (undo) {
    undo->ran = true;
    undo->before = cs;
  }
  OwnedTensor latent;  // [G, hd]
  int64_t G = 0;
  if (r == 1) {
    latent = mem.clone(kv);
    G = T;
  } else {
    OwnedTensor ckv, cgate;
    G = take_closed_groups(mem, cs, kv, gate, r, ckv, cgate);
    if (undo) {
      undo->kv = ckv;
      undo->gate = cgate;
    }
    if (G == 0) return;
    latent = mem.zeros(DType::kF32, {G, hd});
    backend_.compress_pool({ckv.view().slice(0, G * r).reshape({G, r, hd}),
                            cgate.view().slice(0, G * r).reshape({G, r, hd}), latent.view()});
  }
  rms_norm_inplace(backend_, latent.view(), a.comp_norm, eps);
  std::vector<int64_t> pos(G);
  for (int64_t g = 0; g < G; ++g) pos[g] = (cs.emitted + g) * r;
  OwnedTensor p = positions_of(mem, pos);

  // Indexer keys come from the latent before it is rotated.
  const int64_t id = config_.attn.index_head_dim;
  OwnedTensor k = linear(backend_, mem, latent.view(), a.idx_wk);  // [G, Id]
  // The keys' norm, RoPE and FP4 fake-quant with the latent's RoPE and FP4 fake-quant: one call.
  NormRopeParams nr;
  nr.parts[0] = {k.view().reshape({G, 1, id}),   optional(a.idx_k_norm), true, true, true,
                 FakeQuantKind::kFP4Ue8m0Block32};
  nr.parts[1] = {latent.view().reshape({G, 1, hd}), Tensor{}, false, true, true, FakeQuantKind::kFP4E4m3Block16};
  nr.positions = p.view();
  nr.inv_freq = compress_inv_freq_.view();
  nr.eps = eps;
  backend_.norm_rope(nr);
  store_rows(seq, layer, /*keys=*/true, cs.emitted, k.view());
  store_rows(seq, layer, /*keys=*/false, cs.emitted, latent.view());
  cs.emitted += G;
  st.n_entries += G;
}

OwnedTensor DeepseekV4Model::attention(const Chunk& c, int layer, const OwnedTensor& x, V4SequenceState& seq,
                                       Selection& sel, bool run_compressor) const {
  const LayerPlan& plan = config_.layers[layer];
  const V4AttentionWeights& a = w_.layers[layer].attn;
  const auto& ac = config_.attn;
  const bool v41 = config_.family == ModelFamily::kDeepseekV41;
  const int64_t T = c.T, H = config_.num_heads, hd = ac.head_dim;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  const Tensor inv_freq = plan.compress_rope ? compress_inv_freq_.view() : main_inv_freq_.view();
  V4LayerState& st = seq.layers[layer];
  TensorMemory& mem = memory();

  // Queries: q_r = q_norm(wq_a·x) [T, ql]; q = wq_b·q_r [T, H, hd] (V4: + per-head unweighted RMSNorm).
  OwnedTensor q_r = linear(backend_, mem, x.view(), a.wq_a);
  rms_norm_inplace(backend_, q_r.view(), a.q_norm, eps);
  OwnedTensor q = linear(backend_, mem, q_r.view(), a.wq_b);
  // K = V latent: kv_norm(wkv·x) [T, hd], RoPE; V4.1 stores it FP8-fake-quantized.
  OwnedTensor kv = linear(backend_, mem, x.view(), a.wkv);
  // The query's head norm and RoPE with the latent's norm, RoPE and (V4.1) FP8 fake-quant: one call.
  NormRopeParams nr;
  nr.parts[0] = {q.view().reshape({T, H, hd}), Tensor{}, ac.q_head_norm, true};
  nr.parts[1] = {kv.view().reshape({T, 1, hd}),      optional(a.kv_norm), true, true, v41,
                 FakeQuantKind::kFP8E4M3Ue8m0Block32};
  nr.positions = c.positions.view();
  nr.inv_freq = inv_freq;
  nr.eps = eps;
  backend_.norm_rope(nr);
  // The chunk's window rows [chunk_n, hd] in chunk order: under CP every rank's rows (all queries may read them).
  const int64_t chunk_n = c.total;
  if (c.cp) {
    OwnedTensor all = mem.zeros(DType::kF32, {chunk_n, hd});
    c.cp->all_gather_rows(mem, kv.view(), all.view());
    kv = std::move(all);
  }

  // Window keys: the last (window − 1) tokens' rows (paged, or from the slot's ring), then this chunk.
  SwaRing& ring = st.window;
  const bool paged_window = seq.pages && layer < seq.pages->ring_from_layer;
  const int64_t past_begin = std::max<int64_t>(c.swa_floor, c.p0 - (ac.sliding_window - 1)), n_past = c.p0 - past_begin;
  // Paged windows are attended in place (paged_sink_attention below): this chunk's rows go into the pages and
  // nothing is gathered. The ring path gathers its rows into window_kv.
  OwnedTensor window_kv = paged_window ? OwnedTensor{} : mem.zeros(DType::kF32, {n_past + chunk_n, hd});
  if (!paged_window && rounds_bf16()) round_to_bf16_values(mem, kv.view());  // the ring holds what pages would
  if (paged_window) {
    seq.pages->window[layer].write(mem, seq.ref, c.p0, kv.view());
  } else {
    ring_rows(ring);
    for_ring_runs(ring.capacity, past_begin, n_past, [&](int64_t slot, int64_t at, int64_t len) {
      mem.copy(window_kv.view().slice(at, at + len), ring.rows.view().slice(slot, slot + len));
    });
  }
  OwnedTensor kv_pos;
  if (!paged_window) {
    mem.copy(window_kv.view().slice(n_past, n_past + chunk_n), kv.view());
    std::vector<int64_t> window_pos(n_past + chunk_n);
    for (int64_t i = 0; i < n_past + chunk_n; ++i) window_pos[i] = past_begin + i;
    kv_pos = positions_of(mem, window_pos);
  }
  // Only the chunk's last `capacity` rows survive in the ring.
  const int64_t kept = paged_window ? 0 : std::min(chunk_n, ring.capacity);
  if (seq.undo && kept > 0) {
    V4Undo::Ring& u = seq.undo->layers[layer].ring;
    u.first = c.p0 + chunk_n - kept;
    u.old_rows = mem.zeros(DType::kF32, {kept, hd});
    for_ring_runs(ring.capacity, u.first, kept, [&](int64_t slot, int64_t at, int64_t len) {
      mem.copy(u.old_rows.view().slice(at, at + len), ring.rows.view().slice(slot, slot + len));
    });
    // Truncated inside a chunk longer than the ring, the window holds chunk rows the ring never got.
    if (chunk_n > kept) {
      u.chunk_first = c.p0;
      u.chunk_rows = kv;
    }
  }
  for_ring_runs(ring.capacity, c.p0 + chunk_n - kept, kept, [&](int64_t slot, int64_t at, int64_t len) {
    const int64_t from = chunk_n - kept + at;
    mem.copy(ring.rows.view().slice(slot, slot + len), kv.view().slice(from, from + len));
  });

  // Compressed branch: entries of the kv source and, per query, which of them to attend.
  const V4LayerState* src = nullptr;
  int src_layer = -1;
  OwnedTensor comp_mask, held_keys, held_entries;
  if (plan.compress_ratio > 0) {
    const int r = plan.compress_ratio;
    const int64_t IH = ac.index_n_heads, Id = ac.index_head_dim;
    auto index_scores = [&](int keys_layer, bool fp4) {
      const V4LayerState& keys_of = seq.layers[keys_layer];
      OwnedTensor qi = linear(backend_, mem, q_r.view(), a.idx_wq_b);  // [T, IH·Id]
      NormRopeParams qr;  // RoPE and (fp4) FP4 fake-quant of the indexer queries: one call
      qr.parts[0] = {qi.view().reshape({T, IH, Id}), Tensor{}, false, true, fp4, FakeQuantKind::kFP4Ue8m0Block32};
      qr.positions = c.positions.view();
      qr.inv_freq = compress_inv_freq_.view();
      qr.eps = eps;
      backend_.norm_rope(qr);
      OwnedTensor wts = linear(backend_, mem, x.view(), a.idx_weights_proj);  // [T, IH]
      const int64_t n = keys_of.n_entries;
      OwnedTensor scores = mem.zeros(DType::kF32, {T, n});
      IndexerScoreParams s;
      s.q = qi.view().reshape({T, IH, Id});
      s.keys = rows_view(seq, keys_layer, /*keys=*/true, held_keys);
      s.weights = wts.view();
      s.positions = c.positions.view();
      s.out = scores.view();
      s.ratio = r;
      s.score_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(Id)));
      s.weight_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(IH)));
      backend_.indexer_scores(s);
      return scores;
    };
    if (!v41) {
      v4_compress(c, layer, x, seq, /*indexer=*/false);
      src = &st;
      src_layer = layer;
      const int64_t ne = st.n_entries;
      if (plan.attention == AttentionKind::kCSA) {
        comp_mask = mem.zeros(DType::kU8, {T, ne});
        v4_compress(c, layer, x, seq, /*indexer=*/true);
        // Before the first group of r tokens closes there is nothing to score (and paged storage holds no rows to
        // gather): a sequence's first chunk can be shorter than r under chunked prefill.
        if (ne > 0) {
          OwnedTensor scores = index_scores(layer, /*fp4=*/false);
          backend_.topk_mask({scores.view(), Tensor{}, comp_mask.view(), ac.index_topk});
        }
      } else {
        // HCA attends every entry the query can see: w < (p + 1) / r.
        std::vector<uint8_t> visible(static_cast<size_t>(T * ne));
        for (int64_t t = 0; t < T; ++t)
          for (int64_t e = 0; e < ne; ++e) visible[t * ne + e] = e < (c.host_positions[t] + 1) / r;
        comp_mask = mem.from_host(DType::kU8, {T, ne}, visible.data());
      }
    } else {
      if (plan.kv_source == layer && run_compressor) v41_compress(c, layer, x, seq);
      src = &seq.layers[plan.kv_source];
      src_layer = plan.kv_source;
      const int64_t ne = src->n_entries;
      if (plan.index_source == layer && ne > 0) {
        OwnedTensor scores = index_scores(src_layer, /*fp4=*/true);
        Tensor allowed;
        if (plan.candidate_source) {
          sel.candidates = mem.zeros(DType::kU8, {T, ne});
          backend_.candidate_blocks({scores.view(), c.positions.view(), sel.candidates.view(), r,
                                     ac.candidate_topk_blocks, ac.candidate_block_size});
          sel.n_candidates = ne;
        } else if (plan.csa2_role == Csa2Role::kReindex && sel.n_candidates == ne) {
          allowed = sel.candidates.view();
        }
        sel.topk = mem.zeros(DType::kU8, {T, ne});
        backend_.topk_mask({scores.view(), allowed, sel.topk.view(), ac.index_topk});
        sel.n_topk = ne;
      }
      // Reuse layers read the latest published selection; without one over these entries, none is attended.
      comp_mask = sel.n_topk == ne ? mem.clone(sel.topk.view()) : mem.zeros(DType::kU8, {T, ne});
    }
  }

  // Sink attention over [window ∥ selected entries]: out [T, H, hd].
  OwnedTensor attn = mem.empty(DType::kF32, {T, H, hd});  // written in full by the attention
  if (paged_window) {
    // In place over the pages: window rows of positions >= past_begin, then the selected entries of the kv
    // source (the same keys in the same order as the gathered form below).
    const std::vector<int32_t> table(seq.ref.block_table.begin(), seq.ref.block_table.end());
    const std::vector<int32_t> zeros(T, 0);
    OwnedTensor tables = mem.from_host(DType::kI32, {1, static_cast<int64_t>(table.size())}, table.data());
    OwnedTensor q_seq = mem.from_host(DType::kI32, {T}, zeros.data());
    OwnedTensor begin = positions_of(mem, {past_begin});
    PagedSinkAttentionParams p;
    p.q = q.view().reshape({T, H, hd});
    p.q_positions = c.positions.view();
    p.q_seq = q_seq.view();
    p.block_tables = tables.view();
    p.window_pool = seq.pages->window[layer].pool();
    p.window_begin = begin.view();
    if (src && src->n_entries > 0) {
      const PagedRows& entries = seq.pages->entries[src_layer];
      p.comp_pool = entries.pool();
      p.comp_mask = comp_mask.view();
      p.comp_ratio = entries.ratio();
    }
    p.sinks = a.sinks.view();
    p.out = attn.view();
    p.block_size = seq.ref.block_size;
    p.window = ac.sliding_window;
    p.scale = static_cast<float>(attention_softmax_scale(config_));
    backend_.paged_sink_attention(p);
  } else {
    SinkAttentionParams p;
    p.q = q.view().reshape({T, H, hd});
    p.q_positions = c.positions.view();
    p.window_kv = window_kv.view();
    p.kv_positions = kv_pos.view();
    if (src && src->n_entries > 0) {
      p.compressed = rows_view(seq, src_layer, /*keys=*/false, held_entries);
      p.comp_mask = comp_mask.view();
    }
    p.sinks = a.sinks.view();
    p.out = attn.view();
    p.window = ac.sliding_window;
    p.scale = static_cast<float>(attention_softmax_scale(config_));
    backend_.sink_attention(p);
  }
  // K = V carried the keys' RoPE: rotate the output back by the query position.
  backend_.rope({attn.view(), c.positions.view(), inv_freq, true});

  return v4_grouped_output(backend_, mem, attn.view().reshape({T, H * hd}), a.wo_a, a.wo_b, ac.o_groups,
                           ac.o_lora_rank);
}

}  // namespace deepinfer
