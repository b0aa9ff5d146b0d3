// DeepSeek-V4 / V4.1 batched decode: one next token for each of B paged sequences in one pass (the engine
// runner's decode step). Row b is sequence b's token; everything per token runs once over the B rows, so a
// decode step reads each weight once instead of B times.
//
// Per layer the work falls into three stages:
//   1. batched: Engram, mHC mix/collapse, norms, query / window-row / compressor / indexer projections and RoPE
//      over all rows, into the step's buffers.
//   2. the "middle", over per-sequence state: window rows into the pages (or the slot's ring), compressor pending
//      rows and closing groups (per sequence), the indexer over each sequence's own entries (one
//      paged_indexer_scores call reading every sequence's keys in its pages, one top-k over the [B, n_max] scores),
//      then attention: paged windows in one paged_sink_attention call over all rows (one block table per
//      sequence), ring windows (V4.1 bounded replay's decoder layers) per sequence on row slices.
//   3. batched: grouped output projection, mHC expand, router and experts over all rows.
// Stage 3 of layer l and stage 1 of layer l + 1 form one "piece" (piece 0: the embedding and layer 0's stage 1;
// the last: the head). A piece reads and writes only the step's buffers — persistent ones under decode graphs,
// where the batch is padded to a bucket and each piece is recorded once per bucket and replayed; the middles run
// eagerly between the pieces (their shapes and branches follow each sequence's position and entry counts).
// The CPU ops are row-independent, so on the CPU reference every row is bit-identical to forward() of that
// sequence alone, padded or not (tests/model/deepseek_v4_decode_batch_test.cc).
#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <type_traits>

#include "deepinfer/model/deepseek_v4_internal.h"
#include "deepinfer/model/output_head.h"
#include "deepinfer/model/step_uploads.h"
#include "deepinfer/model/v4_grouped_output.h"
#include "deepinfer/model/v4_step_selections.h"

namespace deepinfer {
namespace {

// Collapse of the streams by `weights` [R, hc], then RMSNorm: [R, D] (one fused call).
OwnedTensor collapse_norm(Backend& b, TensorMemory& mem, const Tensor& streams, const Tensor& weights,
                          const OwnedTensor& norm, float eps) {
  OwnedTensor h = mem.empty(DType::kF32, {streams.dim(0), streams.dim(2)});  // written in full
  b.hc_collapse_norm({streams, weights, optional(norm), h.view(), eps});
  return h;
}

Tensor row(const Tensor& t, int64_t b) { return t.slice(b, b + 1); }

// The step's buffers (DecodeGraphs::buffer slots under graphs); double-buffered ones take slot and slot + 1.
enum Slot : int {
  kIds,
  kPositions,
  kOneHot,
  kAttn,
  kLogits,
  kQ,
  kKv,
  kCompKv,
  kCompGate,
  kIndexKv,
  kIndexGate,
  kQi,
  kIndexWeights,
  kStreams = 20,
  kAttnPre = 22,
  kPost = 24,
  kComb = 26,
  kRatioSlots = 1000,  // + compress ratio
  kHashIds = 2000,     // + Engram layer index
};

}  // namespace

// One decode step: inputs and the buffers its pieces and middles pass on.
struct DeepseekV4Model::DecodeBatch {
  std::span<V4SequenceState* const> seqs;
  int64_t B = 0;                 // sequences
  int64_t R = 0;                 // rows of the batched stages: B, or B padded to a graph bucket
  Chunk rows;                    // T = total = R: positions, ids [R] (rows past B repeat row 0); host_positions [B]
  Tensor positions;              // i64 [B]: the sequences' rows of rows.positions
  OwnedTensor q_seq;             // i32 [B]: row b is sequence b
  OwnedTensor tables;            // i32 [B, max_blocks], −1 past each sequence's blocks
  std::map<int, Tensor> slots;   // V4 compressor position-bias slots per ratio r: i64 [R], position mod r
  std::vector<Tensor> hash_ids;  // Engram hash ids per Engram layer: i64 [R, cols]
  V4StepSelections sel;          // V4.1 selections of this step
  // Compressed entries gathered from the pages per (sequence, kv-source layer) for the ring layers: a source's
  // entries do not change after its own layer, and V4.1's reuse layers read the same ones.
  std::map<std::pair<int64_t, int>, OwnedTensor> entries;
  // Piece k writes index k % 2 of the double-buffered ones and reads (k − 1) % 2, so running a piece again (as
  // recording does) gives the same result.
  Tensor streams[2];                     // [R, hc, D]
  Tensor attn_pre[2], post[2], comb[2];  // the attention site's mHC mix of the piece's layer
  Tensor one_hot;                        // V4.1: [R, hc], the first site collapses stream 0 only
  // Stage 1's rows of the current layer, flat (decode_qkv_views shapes them), and stage 2's output.
  Tensor q, kv, comp_kv, comp_gate, index_kv, index_gate, qi, index_weights;
  Tensor attn;                         // [R, H, hd]: attention of rows < B, inverse-rotated by the query position
  Tensor logits;                       // [R, vocab]
  std::vector<OwnedTensor> owned;      // the buffers' storage without graphs
  std::optional<StepUploads> uploads;  // the middles' index arrays
};

// Stage 1's rows of one layer, views [R, width] into the step's buffers (empty where the layer has none).
struct DeepseekV4Model::DecodeQkv {
  Tensor q;                     // [R, H·hd], rotated
  Tensor kv;                    // [R, hd]: the window rows, rotated (V4.1: FP8-fake-quantized)
  Tensor comp_kv, comp_gate;    // compressor rows (V4: gate with position biases)
  Tensor index_kv, index_gate;  // V4 CSA: the indexer compressor's rows
  Tensor qi, index_weights;     // indexer queries [R, IH·Id] (rotated) and head weights [R, IH]
};

bool DeepseekV4Model::decode_batchable(const V4SequenceState& seq) const {
  return seq.pages != nullptr && ep_ == nullptr && !seq.record_undo &&
         static_cast<int64_t>(seq.layers.size()) == config_.num_layers && seq.num_tokens >= seq.decoder_from;
}

DeepseekV4Model::DecodeQkv DeepseekV4Model::decode_qkv_views(const DecodeBatch& d, int layer) const {
  const LayerPlan& plan = config_.layers[layer];
  const V4AttentionWeights& a = w_.layers[layer].attn;
  const bool v41 = config_.family == ModelFamily::kDeepseekV41;
  const int r = plan.compress_ratio;
  auto take = [&](const Tensor& flat, int64_t width) { return flat.slice(0, d.R * width).reshape({d.R, width}); };
  auto out_of = [](const auto& w) -> int64_t {
    if constexpr (std::is_same_v<std::decay_t<decltype(w)>, KeptMatrix>)
      return w.rows();
    else
      return w.shape()[0];
  };
  DecodeQkv o;
  o.q = take(d.q, out_of(a.wq_b));
  o.kv = take(d.kv, out_of(a.wkv));
  if (r <= 0) return o;
  bool scores = false;
  if (!v41) {
    o.comp_kv = take(d.comp_kv, out_of(a.comp_wkv));
    o.comp_gate = take(d.comp_gate, out_of(a.comp_wgate));
    if (plan.attention == AttentionKind::kCSA) {
      o.index_kv = take(d.index_kv, out_of(a.idx_comp_wkv));
      o.index_gate = take(d.index_gate, out_of(a.idx_comp_wgate));
      scores = true;
    }
  } else {
    if (plan.kv_source == layer) {
      o.comp_kv = take(d.comp_kv, out_of(a.comp_wkv));
      if (r > 1) o.comp_gate = take(d.comp_gate, out_of(a.comp_wgate));
    }
    scores = plan.index_source == layer;
  }
  if (scores) {
    o.qi = take(d.qi, out_of(a.idx_wq_b));
    o.index_weights = take(d.index_weights, out_of(a.idx_weights_proj));
  }
  return o;
}

void DeepseekV4Model::decode_layer_head(const DecodeBatch& d, int layer, const Tensor& carried_pre) const {
  const V4LayerWeights& lw = w_.layers[layer];
  const LayerPlan& plan = config_.layers[layer];
  const V4AttentionWeights& a = lw.attn;
  const auto& ac = config_.attn;
  const bool v41 = config_.family == ModelFamily::kDeepseekV41;
  const int64_t R = d.R, H = config_.num_heads, hd = ac.head_dim;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  const int cur = layer % 2;
  const Tensor& streams = d.streams[cur];
  TensorMemory& mem = memory();
  // Attention site (its mix ran in decode_piece; post / comb wait for the attention output in the next piece):
  // collapse, norm.
  const OwnedTensor x = collapse_norm(backend_, mem, streams, v41 ? carried_pre : d.attn_pre[cur], lw.attn_norm, eps);

  // Stage 1: the projections, into the step's buffers.
  const DecodeQkv o = decode_qkv_views(d, layer);
  const Tensor inv_freq = plan.compress_rope ? compress_inv_freq_.view() : main_inv_freq_.view();
  const Tensor positions = d.rows.positions.view();
  OwnedTensor q_r = linear(backend_, mem, x.view(), a.wq_a);
  rms_norm_inplace(backend_, q_r.view(), a.q_norm, eps);
  kept_linear(backend_, q_r.view(), a.wq_b, o.q);
  kept_linear(backend_, x.view(), a.wkv, o.kv);
  // The query's head norm and RoPE, the window row's norm, RoPE and (V4.1) FP8 fake-quant: one call (decode is
  // launch-bound).
  NormRopeParams nr;
  nr.parts[0] = {o.q.reshape({R, H, hd}), Tensor{}, ac.q_head_norm, true};
  nr.parts[1] = {o.kv.reshape({R, 1, hd}), optional(a.kv_norm), true, true, v41, FakeQuantKind::kFP8E4M3Ue8m0Block32};
  nr.positions = positions;
  nr.inv_freq = inv_freq;
  nr.eps = eps;
  backend_.norm_rope(nr);
  const int r = plan.compress_ratio;
  if (r <= 0) return;
  if (!v41) {
    // Position biases join the gate by slot (position mod r).
    auto project = [&](const OwnedTensor& wkv, const OwnedTensor& wgate, const OwnedTensor& ape, const Tensor& kv,
                       const Tensor& gate) {
      backend_.linear({x.view(), wkv.view(), kv});
      backend_.linear({x.view(), wgate.view(), gate});
      OwnedTensor bias = mem.empty(DType::kF32, {R, wkv.shape()[0]});  // the embedding writes every row
      backend_.embedding({ape.view(), d.slots.at(r), bias.view()});
      mem.add(gate, bias.view());
    };
    project(a.comp_wkv, a.comp_wgate, a.comp_ape, o.comp_kv, o.comp_gate);
    if (o.index_kv.data() != nullptr)
      project(a.idx_comp_wkv, a.idx_comp_wgate, a.idx_comp_ape, o.index_kv, o.index_gate);
  } else if (o.comp_kv.data() != nullptr) {
    backend_.linear({x.view(), a.comp_wkv.view(), o.comp_kv});
    if (o.comp_gate.data() != nullptr) backend_.linear({x.view(), a.comp_wgate.view(), o.comp_gate});
  }
  if (o.qi.data() != nullptr) {
    const int64_t IH = ac.index_n_heads, Id = ac.index_head_dim;
    kept_linear(backend_, q_r.view(), a.idx_wq_b, o.qi);
    NormRopeParams qr;  // RoPE and (V4.1) FP4 fake-quant of the indexer queries: one call
    qr.parts[0] = {o.qi.reshape({R, IH, Id}), Tensor{}, false, true, v41, FakeQuantKind::kFP4Ue8m0Block32};
    qr.positions = positions;
    qr.inv_freq = compress_inv_freq_.view();
    qr.eps = eps;
    backend_.norm_rope(qr);
    backend_.linear({x.view(), a.idx_weights_proj.view(), o.index_weights});
  }
}

void DeepseekV4Model::decode_piece(const DecodeBatch& d, int k) const {
  const int L = config_.num_layers;
  const int64_t R = d.R, D = config_.hidden_size, hc = config_.hc.hc_mult;
  const int64_t H = config_.num_heads, hd = config_.attn.head_dim;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  const bool v41 = config_.family == ModelFamily::kDeepseekV41;
  TensorMemory& mem = memory();
  // Layer `layer`'s attention-site mHC mix into the step's buffers, Engram first where the layer has it. `pending`: the
  // previous FFN site's expand, which runs first — in the same call as the mix when nothing runs between them.
  auto attention_mix = [&](int layer, const HcExpandParams* pending) {
    const V4LayerWeights& w = w_.layers[layer];
    const int cur = layer % 2;
    const HcMixParams mix{d.streams[cur],
                          w.hc_attn_fn.view(),
                          w.hc_attn_base.view(),
                          w.hc_attn_scale.view(),
                          d.attn_pre[cur],
                          d.post[cur],
                          d.comb[cur],
                          eps,
                          static_cast<float>(config_.hc.eps),
                          config_.hc.sinkhorn_iters};
    if (pending && !w.has_engram) {
      backend_.hc_expand_mix({*pending, mix});
      return;
    }
    if (pending) backend_.hc_expand(*pending);
    if (w.has_engram) {
      const auto& ids_of = config_.engram.layer_ids;
      const auto e = static_cast<size_t>(std::find(ids_of.begin(), ids_of.end(), layer) - ids_of.begin());
      engram_update(layer, d.hash_ids[e], d.streams[cur]);
    }
    backend_.hc_mix(mix);
  };
  if (k == 0) {
    // Embedding, copied into every hc stream.
    OwnedTensor x = mem.zeros(DType::kF32, {R, D});
    backend_.embedding({w_.embed.view(), d.rows.ids.view(), x.view()});
    mem.copy(d.streams[0], Tensor(x.view().data(), DType::kF32, {R, hc, D}, {D, 0, 1}, x.device()));
    attention_mix(0, nullptr);
    decode_layer_head(d, 0, d.one_hot);
    return;
  }
  const int l = k - 1, prev = l % 2;
  const V4LayerWeights& lw = w_.layers[l];
  const Tensor& streams = d.streams[k % 2];
  mem.copy(streams, d.streams[prev]);
  // Layer l's attention output (the middle left it inverse-rotated): grouped output projection, mHC expand.
  OwnedTensor y = v4_grouped_output(backend_, mem, d.attn.reshape({R, H * hd}), lw.attn.wo_a, lw.attn.wo_b,
                                    config_.attn.o_groups, config_.attn.o_lora_rank);
  // FFN site: the attention's mHC expand and this site's mix in one call, then router and experts over every row.
  // Written in full by the mix (a zero fill is a launch of its own in a step of small launches).
  OwnedTensor ffn_pre = mem.empty(DType::kF32, {R, hc}), post = mem.empty(DType::kF32, {R, hc});
  OwnedTensor comb = mem.empty(DType::kF32, {R, hc, hc});
  backend_.hc_expand_mix(
      {{streams, y.view(), d.post[prev], d.comb[prev]},
       {streams, lw.hc_ffn_fn.view(), lw.hc_ffn_base.view(), lw.hc_ffn_scale.view(), ffn_pre.view(), post.view(),
        comb.view(), eps, static_cast<float>(config_.hc.eps), config_.hc.sinkhorn_iters}});
  OwnedTensor h = collapse_norm(backend_, mem, streams, v41 ? d.attn_pre[prev] : ffn_pre.view(), lw.ffn_norm, eps);
  y = moe(d.rows, l, h);
  const HcExpandParams ffn_expand{streams, y.view(), post.view(), comb.view()};
  if (k < L) {
    attention_mix(k, &ffn_expand);
    decode_layer_head(d, k, ffn_pre.view());  // V4.1 carries the FFN site's pre into the next attention site
    return;
  }
  backend_.hc_expand(ffn_expand);
  // Final collapse (V4: hc_head; V4.1: the last FFN site's `pre`), norm, head.
  OwnedTensor pre;
  if (!v41) {
    pre = mem.empty(DType::kF32, {R, hc});  // hc_head writes all of it
    backend_.hc_head({streams, w_.hc_head_fn.view(), w_.hc_head_base.view(), w_.hc_head_scale.view(), pre.view(), eps,
                      static_cast<float>(config_.hc.eps)});
  }
  const OwnedTensor hidden = collapse_norm(backend_, mem, streams, v41 ? ffn_pre.view() : pre.view(), w_.norm, eps);
  head_linear(backend_, hidden.view(), w_.head.view(), d.logits);
}

void DeepseekV4Model::decode_middle(DecodeBatch& d, int layer) const {
  const LayerPlan& plan = config_.layers[layer];
  const V4AttentionWeights& a = w_.layers[layer].attn;
  const auto& ac = config_.attn;
  const bool v41 = config_.family == ModelFamily::kDeepseekV41;
  const int64_t B = d.B, H = config_.num_heads, hd = ac.head_dim;
  const int r = plan.compress_ratio;
  TensorMemory& mem = memory();
  V4KvPages& pages = *d.seqs[0]->pages;
  const DecodeQkv in = decode_qkv_views(d, layer);

  // Stage 2: window rows into the pages, one scatter for all rows (ring layers write their rings below).
  const bool paged_window = layer < pages.ring_from_layer;
  const bool floored = decoder_start_ >= 0 && layer >= decoder_start_;  // decoder windows start at decoder_from
  std::vector<int64_t> every(static_cast<size_t>(B));
  std::iota(every.begin(), every.end(), 0);
  if (paged_window)
    scatter_groups(backend_, mem, *d.uploads, pages.window[layer], d.seqs, in.kv.slice(0, B), every,
                   d.rows.host_positions);
  std::vector<int64_t> past_begin(B);
  for (int64_t b = 0; b < B; ++b) {
    past_begin[b] =
        std::max<int64_t>(floored ? d.seqs[b]->decoder_from : 0, d.rows.host_positions[b] - (ac.sliding_window - 1));
  }
  // Compressors: each sequence's pending rows and closing groups. A compressor already past this position
  // (replayed rows after a prefix hit) skips it, as in forward().
  auto fresh = [&](int64_t b, const CompressorState& cs) {
    return replayed_rows(d.rows.host_positions[b], 1, cs, r) == 0;
  };
  auto fresh_rows = [&](bool indexer) {
    std::vector<bool> f(static_cast<size_t>(B));
    for (int64_t b = 0; b < B; ++b) {
      const V4LayerState& st = d.seqs[b]->layers[layer];
      f[b] = fresh(b, indexer ? st.index_compressor : st.compressor);
    }
    return f;
  };
  if (v41 && r == 1 && plan.kv_source == layer) {
    // Ratio 1: every row is a group, closed at once (no open rows to keep).
    const std::vector<bool> f = fresh_rows(false);
    std::vector<int64_t> which, groups;
    for (int64_t b = 0; b < B; ++b) {
      if (!f[b]) continue;
      which.push_back(b);
      groups.push_back(d.seqs[b]->layers[layer].compressor.emitted);
    }
    // The fresh rows (all but those a prefix hit replays) gathered, then stored as groups in one pass.
    if (!which.empty()) {
      OwnedTensor latent = mem.empty(DType::kF32, {static_cast<int64_t>(which.size()), hd});  // the gather writes it
      backend_.embedding({in.comp_kv, d.uploads->i64(which), latent.view()});
      v41_store_groups(d.seqs, layer, latent.view(), which, groups, *d.uploads);
    }
    for (int64_t b : which) {
      ++d.seqs[b]->layers[layer].compressor.emitted;
      ++d.seqs[b]->layers[layer].n_entries;
    }
  } else if (r > 0 && (!v41 || plan.kv_source == layer)) {
    // Open groups in the pages' slot pool: a scatter of every row, a gather of the groups that close.
    compress_batch(d.seqs, layer, false, in.comp_kv.slice(0, B), in.comp_gate.slice(0, B), fresh_rows(false),
                   *d.uploads);
    if (!v41 && plan.attention == AttentionKind::kCSA)
      compress_batch(d.seqs, layer, true, in.index_kv.slice(0, B), in.index_gate.slice(0, B), fresh_rows(true),
                     *d.uploads);
  }

  // Stage 2, the selection: which compressed entries of the kv source each row attends, as one u8 [B, n_max] mask
  // (row b is zero past its sequence's n_b entries; masks[b] views its first n_b columns for the ring path).
  const int src_layer = r <= 0 ? -1 : (v41 ? plan.kv_source : layer);
  std::vector<int64_t> ne(static_cast<size_t>(B), 0);
  int64_t n_max = 0;
  for (int64_t b = 0; b < B && r > 0; ++b) n_max = std::max(n_max, ne[b] = d.seqs[b]->layers[src_layer].n_entries);
  Tensor mask;
  OwnedTensor mask_storage;
  if (n_max > 0) {
    const bool scores_here = v41 ? plan.index_source == layer : plan.attention == AttentionKind::kCSA;
    OwnedTensor scores;
    if (scores_here) {
      // One launch for every row, reading each sequence's indexer keys in its pages (no gather copy); a row's
      // scores are −inf past its entries, so one top-k over [B, n_max] picks for each row what a top-k over its
      // own [1, n_b] scores picks (−inf picks are dropped; padding ranks after every real entry).
      const int64_t IH = ac.index_n_heads, Id = ac.index_head_dim;
      const PagedRows& keys = pages.index_keys[src_layer];
      scores = mem.zeros(DType::kF32, {B, n_max});
      PagedIndexerScoreParams s;
      s.q = in.qi.slice(0, B).reshape({B, IH, Id});
      s.weights = in.index_weights.slice(0, B);
      s.positions = d.positions;
      s.q_seq = d.q_seq.view();
      s.n_entries = d.uploads->i64(ne);
      s.block_tables = d.tables.view();
      s.key_pool = keys.pool();
      s.out = scores.view();
      s.block_size = d.seqs[0]->ref.block_size;
      s.key_ratio = keys.ratio();
      s.ratio = r;
      s.score_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(Id)));
      s.weight_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(IH)));
      backend_.paged_indexer_scores(s);
    }
    if (!v41) {
      if (scores_here) {
        mask_storage = mem.zeros(DType::kU8, {B, n_max});
        backend_.topk_mask({scores.view(), Tensor{}, mask_storage.view(), ac.index_topk});
        mask = mask_storage.view();
      } else {
        // HCA attends every entry the query can see: e < (p + 1) / r.
        std::vector<uint8_t> visible(static_cast<size_t>(B * n_max), 0);
        for (int64_t b = 0; b < B; ++b)
          for (int64_t e = 0; e < ne[b]; ++e) visible[b * n_max + e] = e < (d.rows.host_positions[b] + 1) / r;
        mask = d.uploads->u8(visible, B);
      }
    } else {
      if (scores_here) d.sel.select(backend_, mem, plan, ac, r, scores.view(), d.positions, ne, d.rows.host_positions);
      mask = d.sel.attended(mem, ne, n_max);
    }
  }
  std::vector<Tensor> masks(static_cast<size_t>(B));
  for (int64_t b = 0; b < B && n_max > 0; ++b) masks[b] = row_prefix(mask, b, ne[b]);

  // Attention over [window ∥ selected entries]: out [B, H, hd].
  const Tensor attn = d.attn.slice(0, B);
  const float scale = static_cast<float>(attention_softmax_scale(config_));
  if (paged_window) {
    // One call for every row, in place over the pages; a row's mask is zero past its sequence's entries.
    PagedSinkAttentionParams p;
    p.q = in.q.slice(0, B).reshape({B, H, hd});
    p.q_positions = d.positions;
    p.q_seq = d.q_seq.view();
    p.block_tables = d.tables.view();
    p.window_pool = pages.window[layer].pool();
    p.window_begin = d.uploads->i64(past_begin);
    if (n_max > 0) {
      const PagedRows& entries = pages.entries[src_layer];
      p.comp_pool = entries.pool();
      p.comp_mask = mask;
      p.comp_ratio = entries.ratio();
    }
    p.sinks = a.sinks.view();
    p.out = attn;
    p.block_size = d.seqs[0]->ref.block_size;
    p.window = ac.sliding_window;
    p.scale = scale;
    backend_.paged_sink_attention(p);
  } else {
    // The slots' rings (V4.1 bounded replay's decoder layers): the new rows in and every window out in one call
    // each; attention per sequence on its rows.
    std::vector<int64_t> first, window_pos;
    const OwnedTensor windows =
        ring_windows_batch(d.seqs, layer, in.kv.slice(0, B), past_begin, first, window_pos, *d.uploads);
    const Tensor kv_pos = d.uploads->i64(window_pos);
    for (int64_t b = 0; b < B; ++b) {
      V4SequenceState& seq = *d.seqs[b];
      const Tensor window_kv = windows.view().slice(first[b], first[b + 1]);
      SinkAttentionParams sp;
      sp.q = row(in.q, b).reshape({1, H, hd});
      sp.q_positions = row(d.positions, b);
      sp.window_kv = window_kv;
      sp.kv_positions = kv_pos.slice(first[b], first[b + 1]);
      if (r > 0 && seq.layers[src_layer].n_entries > 0) {
        OwnedTensor& held = d.entries[{b, src_layer}];
        if (held.view().data() == nullptr || held.shape()[0] != seq.layers[src_layer].n_entries)
          rows_view(seq, src_layer, /*keys=*/false, held);
        sp.compressed = held.view();
        sp.comp_mask = masks[b];
      }
      sp.sinks = a.sinks.view();
      sp.out = row(attn, b);
      sp.window = ac.sliding_window;
      sp.scale = scale;
      backend_.sink_attention(sp);
    }
  }

  // K = V carried the keys' RoPE: rotate the output back by the query position.
  const Tensor inv_freq = plan.compress_rope ? compress_inv_freq_.view() : main_inv_freq_.view();
  backend_.rope({attn, d.positions, inv_freq, true});
}

HostTensor DeepseekV4Model::decode_batch(std::span<V4SequenceState* const> seqs, std::span<const int64_t> ids,
                                         DecodeGraphs* graphs, const DeviceLogitsFn* device_logits) const {
  const int64_t B = static_cast<int64_t>(seqs.size());
  const int64_t D = config_.hidden_size, hc = config_.hc.hc_mult, V = config_.vocab_size;
  const int64_t H = config_.num_heads, hd = config_.attn.head_dim;
  const bool v41 = config_.family == ModelFamily::kDeepseekV41;
  DI_CHECK(B > 0) << "decode_batch: no sequences";
  DI_CHECK(static_cast<int64_t>(ids.size()) == B)
      << "decode_batch: " << ids.size() << " token ids for " << B << " sequences";
  DI_CHECK(seqs[0] != nullptr && seqs[0]->pages != nullptr) << "decode_batch: sequence 0 is not a paged sequence";
  const int bs = seqs[0]->ref.block_size;
  std::set<const V4SequenceState*> seen;
  int64_t max_blocks = 1;
  for (int64_t b = 0; b < B; ++b) {
    const V4SequenceState* s = seqs[b];
    DI_CHECK(s != nullptr) << "decode_batch: sequence " << b << " is null";
    DI_CHECK(seen.insert(s).second) << "decode_batch: sequence " << b << " appears twice in the batch";
    DI_CHECK(decode_batchable(*s)) << "decode_batch: sequence " << b << " at position " << s->num_tokens
                                   << " cannot be batched (it needs pages, no expert parallelism, no undo "
                                      "recording, and a position >= decoder_from "
                                   << s->decoder_from << ")";
    DI_CHECK(s->pages == seqs[0]->pages && s->ref.block_size == bs)
        << "decode_batch: sequence " << b << " uses other pages or block size than sequence 0";
    DI_CHECK(ids[b] >= 0 && ids[b] < V) << "decode_batch: token id " << ids[b] << " of sequence " << b
                                        << " outside the vocabulary [0, " << V << ")";
    const int64_t need = s->num_tokens / bs + 1;
    DI_CHECK(static_cast<int64_t>(s->ref.block_table.size()) >= need)
        << "decode_batch: sequence " << b << " at position " << s->num_tokens << " has " << s->ref.block_table.size()
        << " blocks of " << bs << ", needs " << need;
    max_blocks = std::max(max_blocks, need);
  }

  // Rows of the batched stages: padded to a bucket under graphs, rows past B repeating row 0's inputs.
  const int64_t bucket = graphs && graphs->enabled() ? graphs->batch_bucket(B) : 0;
  const int64_t R = bucket > 0 ? bucket : B;
  TensorMemory& mem = memory();
  DecodeBatch d;
  d.uploads.emplace(mem);
  d.seqs = seqs;
  d.B = B;
  d.R = R;
  d.sel.reset(B);
  auto buffer = [&](int slot, DType dtype, const Shape& shape) {
    if (bucket > 0) return graphs->buffer(mem, slot, dtype, shape);
    d.owned.push_back(mem.zeros(dtype, shape));
    return d.owned.back().view();
  };
  std::vector<int64_t> positions(static_cast<size_t>(R)), tokens(static_cast<size_t>(R));
  for (int64_t b = 0; b < R; ++b) {
    positions[b] = seqs[b < B ? b : 0]->num_tokens;
    tokens[b] = ids[b < B ? b : 0];
  }
  d.rows.T = d.rows.total = R;
  d.rows.host_positions.assign(positions.begin(), positions.begin() + B);
  const Tensor pos_buf = buffer(kPositions, DType::kI64, {R}), ids_buf = buffer(kIds, DType::kI64, {R});
  mem.copy(pos_buf, Tensor(positions.data(), DType::kI64, {R}));
  mem.copy(ids_buf, Tensor(tokens.data(), DType::kI64, {R}));
  d.rows.positions = OwnedTensor(nullptr, pos_buf);
  d.rows.ids = OwnedTensor(nullptr, ids_buf);
  d.positions = pos_buf.slice(0, B);
  if (!v41) {
    for (const LayerPlan& plan : config_.layers) {
      const int r = plan.compress_ratio;
      if (r <= 0 || d.slots.count(r)) continue;
      std::vector<int64_t> slot(static_cast<size_t>(R));
      for (int64_t b = 0; b < R; ++b) slot[b] = positions[b] % r;
      d.slots[r] = buffer(kRatioSlots + r, DType::kI64, {R});
      mem.copy(d.slots[r], Tensor(slot.data(), DType::kI64, {R}));
    }
  }
  if (v41) {
    std::vector<float> one_hot(static_cast<size_t>(R * hc), 0.0f);
    for (int64_t b = 0; b < R; ++b) one_hot[b * hc] = 1.0f;
    d.one_hot = buffer(kOneHot, DType::kF32, {R, hc});
    mem.copy(d.one_hot, Tensor(one_hot.data(), DType::kF32, {R, hc}));
  }
  for (int i = 0; i < 2; ++i) {
    d.streams[i] = buffer(kStreams + i, DType::kF32, {R, hc, D});
    d.attn_pre[i] = buffer(kAttnPre + i, DType::kF32, {R, hc});
    d.post[i] = buffer(kPost + i, DType::kF32, {R, hc});
    d.comb[i] = buffer(kComb + i, DType::kF32, {R, hc, hc});
  }
  // Stage 1's buffers, each as wide as its widest layer.
  std::map<int, int64_t> widths;
  auto widen = [&](int slot, const auto& w) {
    if constexpr (std::is_same_v<std::decay_t<decltype(w)>, KeptMatrix>) {
      if (!w.empty()) widths[slot] = std::max(widths[slot], w.rows());
    } else if (w.view().data() != nullptr) {
      widths[slot] = std::max(widths[slot], w.shape()[0]);
    }
  };
  for (int l = 0; l < config_.num_layers; ++l) {
    const V4AttentionWeights& a = w_.layers[l].attn;
    widen(kQ, a.wq_b);
    widen(kKv, a.wkv);
    widen(kCompKv, a.comp_wkv);
    widen(kCompGate, a.comp_wgate);
    widen(kIndexKv, a.idx_comp_wkv);
    widen(kIndexGate, a.idx_comp_wgate);
    widen(kQi, a.idx_wq_b);
    widen(kIndexWeights, a.idx_weights_proj);
  }
  for (auto [slot, field] : {std::pair{kQ, &d.q},
                             {kKv, &d.kv},
                             {kCompKv, &d.comp_kv},
                             {kCompGate, &d.comp_gate},
                             {kIndexKv, &d.index_kv},
                             {kIndexGate, &d.index_gate},
                             {kQi, &d.qi},
                             {kIndexWeights, &d.index_weights}})
    if (widths.count(slot)) *field = buffer(slot, DType::kF32, {R * widths[slot]});
  d.attn = buffer(kAttn, DType::kF32, {R, H, hd});
  d.logits = buffer(kLogits, DType::kF32, {R, V});
  if (R > B) mem.fill(d.attn.slice(B, R), 0.0f);  // padding rows attend nothing

  // The per-sequence middle's inputs.
  std::vector<int32_t> tables(static_cast<size_t>(B * max_blocks), -1), q_seq(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    const V4SequenceState& s = *seqs[b];
    q_seq[b] = static_cast<int32_t>(b);
    for (int64_t j = 0; j < s.num_tokens / bs + 1; ++j)
      tables[b * max_blocks + j] = static_cast<int32_t>(s.ref.block_table[j]);
  }
  d.q_seq = mem.from_host(DType::kI32, {B}, q_seq.data());
  d.tables = mem.from_host(DType::kI32, {B, max_blocks}, tables.data());
  for (V4SequenceState* s : seqs) s->undo.reset();
  // Engram look-back rows of every sequence (each advances its own), hashed in one call per Engram layer.
  if (engram_) {
    const int64_t n = engram_->max_ngram;
    std::vector<int64_t> token_rows;
    for (int64_t b = 0; b < B; ++b) {
      const std::vector<int64_t> t = engram_token_rows(*seqs[b], ids.subspan(b, 1));
      token_rows.insert(token_rows.end(), t.begin(), t.end());
    }
    for (int64_t b = B; b < R; ++b) token_rows.insert(token_rows.end(), token_rows.begin(), token_rows.begin() + n);
    std::vector<OwnedTensor> hashed = engram_hash_rows(token_rows, R);
    for (size_t k = 0; k < hashed.size(); ++k) {
      if (bucket > 0) {
        d.hash_ids.push_back(graphs->buffer(mem, kHashIds + static_cast<int>(k), DType::kI64, hashed[k].shape()));
        mem.copy(d.hash_ids.back(), hashed[k].view());
      } else {
        d.hash_ids.push_back(hashed[k].view());
        d.owned.push_back(std::move(hashed[k]));
      }
    }
  }

  // Piece k, then layer k's middle.
  for (int k = 0; k <= config_.num_layers; ++k) {
    if (bucket > 0) {
      graphs->run_piece(R, k, [&] { decode_piece(d, k); });
    } else {
      decode_piece(d, k);
    }
    if (k < config_.num_layers) decode_middle(d, k);
  }
  if (graphs && bucket == 0) graphs->count_eager();
  for (V4SequenceState* s : seqs) ++s->num_tokens;
  if (device_logits) {
    (*device_logits)(d.logits.slice(0, B));
    return {};
  }
  return mem.to_host(d.logits.slice(0, B));
}

}  // namespace deepinfer
