// DeepSeek-V4 / V4.1 batched decode: one next token for each of B paged sequences in one pass (the engine
// runner's decode step). Row b is sequence b's token; everything per token runs once over the B rows, so a
// decode step reads each weight once instead of B times.
//
// Per layer the work falls into three stages:
//   1. batched (decode_qkv): Engram, mHC mix/collapse, norms, query / window-row / compressor / indexer
//      projections and RoPE over all rows. Its inputs (positions, ids, slot ids) are uploaded once per step in
//      DecodeBatch, so the stage makes no host round trip: the unit a later CUDA graph can capture per layer.
//   2. per sequence: what is genuinely per-sequence state — window rows into the pages (or the slot's ring),
//      compressor pending rows and closing groups, indexer scoring and top-k over each sequence's own entries —
//      then attention: paged windows in one paged_sink_attention call over all rows (one block table per
//      sequence), ring windows (V4.1 bounded replay's decoder layers) per sequence on row slices.
//   3. batched (decode_output + MoE site): inverse RoPE, grouped output projection, mHC expand, router and
//      experts over all rows.
// The CPU ops are row-independent, so on the CPU reference every row is bit-identical to forward() of that
// sequence alone (tests/model/deepseek_v4_decode_batch_test.cc).
#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "deepinfer/model/deepseek_v4_internal.h"
#include "deepinfer/model/v4_grouped_output.h"

namespace deepinfer {
namespace {

OwnedTensor linear(Backend& b, TensorMemory& mem, const Tensor& x, const OwnedTensor& w) {
  OwnedTensor out = mem.zeros(DType::kF32, {x.dim(0), w.shape()[0]});
  b.linear({x, w.view(), out.view()});
  return out;
}

void rms_norm_inplace(Backend& b, const Tensor& x, const OwnedTensor& w, float eps) {
  b.rms_norm({x, w.view().data() != nullptr ? w.view() : Tensor{}, x, eps});
}

}  // namespace

// One decode step's inputs, in backend memory once per step.
struct DeepseekV4Model::DecodeBatch {
  std::span<V4SequenceState* const> seqs;
  int64_t B = 0;
  Chunk rows;                        // T = total = B: positions [B], ids [B] (the MoE's hash routing)
  OwnedTensor q_seq;                 // i32 [B]: row b is sequence b
  OwnedTensor tables;                // i32 [B, max_blocks], −1 past each sequence's blocks
  std::map<int, OwnedTensor> slots;  // V4 compressor position-bias slots per ratio r: i64 [B], position mod r
  std::vector<Selection> sel;        // V4.1 per-sequence selections of this step
};

// Stage 1's outputs for one layer (tensors a layer does not use stay empty).
struct DeepseekV4Model::DecodeQkv {
  OwnedTensor q_r;                   // [B, q_lora]
  OwnedTensor q;                     // [B, H, hd], rotated
  OwnedTensor kv;                    // [B, hd]: the window rows, rotated (V4.1: FP8-fake-quantized)
  OwnedTensor comp_kv, comp_gate;    // compressor rows [B, width] (V4: gate with position biases)
  OwnedTensor index_kv, index_gate;  // V4 CSA: the indexer compressor's rows
  OwnedTensor qi, index_weights;     // indexer queries [B, IH·Id] (rotated) and head weights [B, IH]
};

bool DeepseekV4Model::decode_batchable(const V4SequenceState& seq) const {
  return seq.pages != nullptr && ep_ == nullptr && !seq.record_undo &&
         static_cast<int64_t>(seq.layers.size()) == config_.num_layers && seq.num_tokens >= seq.decoder_from;
}

DeepseekV4Model::DecodeQkv DeepseekV4Model::decode_qkv(const DecodeBatch& d, int layer, const OwnedTensor& x) const {
  const LayerPlan& plan = config_.layers[layer];
  const V4AttentionWeights& a = w_.layers[layer].attn;
  const auto& ac = config_.attn;
  const bool v41 = config_.family == ModelFamily::kDeepseekV41;
  const int64_t B = d.B, H = config_.num_heads, hd = ac.head_dim;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  const Tensor inv_freq = plan.compress_rope ? compress_inv_freq_.view() : main_inv_freq_.view();
  const Tensor positions = d.rows.positions.view();
  TensorMemory& mem = memory();
  DecodeQkv o;
  o.q_r = linear(backend_, mem, x.view(), a.wq_a);
  rms_norm_inplace(backend_, o.q_r.view(), a.q_norm, eps);
  o.q = linear(backend_, mem, o.q_r.view(), a.wq_b);
  if (ac.q_head_norm) rms_norm_inplace(backend_, o.q.view().reshape({B * H, hd}), OwnedTensor{}, eps);
  backend_.rope({o.q.view().reshape({B, H, hd}), positions, inv_freq, false});
  o.kv = linear(backend_, mem, x.view(), a.wkv);
  rms_norm_inplace(backend_, o.kv.view(), a.kv_norm, eps);
  backend_.rope({o.kv.view().reshape({B, 1, hd}), positions, inv_freq, false});
  if (v41) backend_.fake_quant({o.kv.view(), FakeQuantKind::kFP8E4M3Ue8m0Block32});
  const int r = plan.compress_ratio;
  if (r <= 0) return o;
  bool scores = false;
  if (!v41) {
    // Position biases join the gate by slot (position mod r).
    auto project = [&](const OwnedTensor& wkv, const OwnedTensor& wgate, const OwnedTensor& ape, OwnedTensor& kv,
                       OwnedTensor& gate) {
      kv = linear(backend_, mem, x.view(), wkv);
      gate = linear(backend_, mem, x.view(), wgate);
      OwnedTensor bias = mem.zeros(DType::kF32, {B, wkv.shape()[0]});
      backend_.embedding({ape.view(), d.slots.at(r).view(), bias.view()});
      mem.add(gate.view(), bias.view());
    };
    project(a.comp_wkv, a.comp_wgate, a.comp_ape, o.comp_kv, o.comp_gate);
    if (plan.attention == AttentionKind::kCSA) {
      project(a.idx_comp_wkv, a.idx_comp_wgate, a.idx_comp_ape, o.index_kv, o.index_gate);
      scores = true;
    }
  } else {
    if (plan.kv_source == layer) {
      o.comp_kv = linear(backend_, mem, x.view(), a.comp_wkv);
      if (r > 1) o.comp_gate = linear(backend_, mem, x.view(), a.comp_wgate);
    }
    scores = plan.index_source == layer;
  }
  if (scores) {
    const int64_t IH = ac.index_n_heads, Id = ac.index_head_dim;
    o.qi = linear(backend_, mem, o.q_r.view(), a.idx_wq_b);
    backend_.rope({o.qi.view().reshape({B, IH, Id}), positions, compress_inv_freq_.view(), false});
    if (v41) backend_.fake_quant({o.qi.view().reshape({B * IH, Id}), FakeQuantKind::kFP4Ue8m0Block32});
    o.index_weights = linear(backend_, mem, x.view(), a.idx_weights_proj);
  }
  return o;
}

OwnedTensor DeepseekV4Model::decode_output(const DecodeBatch& d, int layer, OwnedTensor& attn) const {
  const V4AttentionWeights& a = w_.layers[layer].attn;
  const auto& ac = config_.attn;
  const int64_t B = d.B, H = config_.num_heads, hd = ac.head_dim;
  const Tensor inv_freq = config_.layers[layer].compress_rope ? compress_inv_freq_.view() : main_inv_freq_.view();
  TensorMemory& mem = memory();
  // K = V carried the keys' RoPE: rotate the output back by the query position.
  backend_.rope({attn.view(), d.rows.positions.view(), inv_freq, true});
  return v4_grouped_output(backend_, mem, attn.view().reshape({B, H * hd}), a.wo_a.view(), a.wo_b.view(), ac.o_groups,
                           ac.o_lora_rank);
}

OwnedTensor DeepseekV4Model::decode_attention(DecodeBatch& d, int layer, const OwnedTensor& x) const {
  const LayerPlan& plan = config_.layers[layer];
  const V4AttentionWeights& a = w_.layers[layer].attn;
  const auto& ac = config_.attn;
  const bool v41 = config_.family == ModelFamily::kDeepseekV41;
  const int64_t B = d.B, H = config_.num_heads, hd = ac.head_dim;
  const int r = plan.compress_ratio;
  TensorMemory& mem = memory();
  V4KvPages& pages = *d.seqs[0]->pages;

  // Stage 1: batched projections.
  DecodeQkv in = decode_qkv(d, layer, x);

  // Stage 2, per sequence: window rows, compressors (each sequence's pending rows and closing groups).
  const bool paged_window = layer < pages.ring_from_layer;
  const bool floored = decoder_start_ >= 0 && layer >= decoder_start_;  // decoder windows start at decoder_from
  std::vector<int64_t> past_begin(B);
  auto row = [](const OwnedTensor& t, int64_t b) { return t.view().slice(b, b + 1); };
  for (int64_t b = 0; b < B; ++b) {
    V4SequenceState& seq = *d.seqs[b];
    const int64_t p = d.rows.host_positions[b];
    past_begin[b] = std::max<int64_t>(floored ? seq.decoder_from : 0, p - (ac.sliding_window - 1));
    if (paged_window) pages.window[layer].write(mem, seq.ref, p, row(in.kv, b));
    if (r <= 0) continue;
    V4LayerState& st = seq.layers[layer];
    // A compressor already past this position (replayed rows after a prefix hit) skips it, as in forward().
    auto fresh = [&](const CompressorState& cs) { return replayed_rows(p, 1, cs, r) == 0; };
    if (!v41) {
      if (fresh(st.compressor)) v4_compress_rows(layer, row(in.comp_kv, b), row(in.comp_gate, b), seq, false);
      if (plan.attention == AttentionKind::kCSA && fresh(st.index_compressor))
        v4_compress_rows(layer, row(in.index_kv, b), row(in.index_gate, b), seq, true);
    } else if (plan.kv_source == layer && fresh(st.compressor)) {
      v41_compress_rows(layer, row(in.comp_kv, b), r > 1 ? row(in.comp_gate, b) : Tensor{}, seq);
    }
  }

  // Stage 2, per sequence: which compressed entries of the kv source each row attends (u8 [1, n_b]).
  const int src_layer = r <= 0 ? -1 : (v41 ? plan.kv_source : layer);
  std::vector<OwnedTensor> masks(static_cast<size_t>(B));
  int64_t n_max = 0;
  if (r > 0) {
    const int64_t IH = ac.index_n_heads, Id = ac.index_head_dim;
    auto index_scores = [&](int64_t b, V4SequenceState& seq) {
      const int64_t n = seq.layers[src_layer].n_entries;
      OwnedTensor scores = mem.zeros(DType::kF32, {1, n}), held_keys;
      IndexerScoreParams s;
      s.q = row(in.qi, b).reshape({1, IH, Id});
      s.keys = rows_view(seq, src_layer, /*keys=*/true, held_keys);
      s.weights = row(in.index_weights, b);
      s.positions = row(d.rows.positions, b);
      s.out = scores.view();
      s.ratio = r;
      s.score_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(Id)));
      s.weight_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(IH)));
      backend_.indexer_scores(s);
      return scores;
    };
    for (int64_t b = 0; b < B; ++b) {
      V4SequenceState& seq = *d.seqs[b];
      const int64_t ne = seq.layers[src_layer].n_entries, p = d.rows.host_positions[b];
      n_max = std::max(n_max, ne);
      OwnedTensor& mask = masks[b];
      if (!v41) {
        if (plan.attention == AttentionKind::kCSA) {
          mask = mem.zeros(DType::kU8, {1, ne});
          if (ne > 0) {
            OwnedTensor scores = index_scores(b, seq);
            backend_.topk_mask({scores.view(), Tensor{}, mask.view(), ac.index_topk});
          }
        } else {
          // HCA attends every entry the query can see: w < (p + 1) / r.
          std::vector<uint8_t> visible(static_cast<size_t>(ne));
          for (int64_t e = 0; e < ne; ++e) visible[e] = e < (p + 1) / r;
          mask = mem.from_host(DType::kU8, {1, ne}, visible.data());
        }
        continue;
      }
      Selection& sel = d.sel[b];
      if (plan.index_source == layer && ne > 0) {
        OwnedTensor scores = index_scores(b, seq);
        Tensor allowed;
        if (plan.candidate_source) {
          sel.candidates = mem.zeros(DType::kU8, {1, ne});
          backend_.candidate_blocks({scores.view(), row(d.rows.positions, b), sel.candidates.view(), r,
                                     ac.candidate_topk_blocks, ac.candidate_block_size});
          sel.n_candidates = ne;
        } else if (plan.csa2_role == Csa2Role::kReindex && sel.n_candidates == ne) {
          allowed = sel.candidates.view();
        }
        sel.topk = mem.zeros(DType::kU8, {1, ne});
        backend_.topk_mask({scores.view(), allowed, sel.topk.view(), ac.index_topk});
        sel.n_topk = ne;
      }
      // Reuse layers read the latest published selection; without one over these entries, none is attended.
      mask = sel.n_topk == ne ? mem.clone(sel.topk.view()) : mem.zeros(DType::kU8, {1, ne});
    }
  }

  // Attention over [window ∥ selected entries]: out [B, H, hd].
  OwnedTensor attn = mem.zeros(DType::kF32, {B, H, hd});
  const float scale = static_cast<float>(attention_softmax_scale(config_));
  if (paged_window) {
    // One call for every row, in place over the pages; a row's mask is zero past its sequence's entries.
    OwnedTensor mask, begin = mem.from_host(DType::kI64, {B}, past_begin.data());
    PagedSinkAttentionParams p;
    p.q = in.q.view().reshape({B, H, hd});
    p.q_positions = d.rows.positions.view();
    p.q_seq = d.q_seq.view();
    p.block_tables = d.tables.view();
    p.window_pool = pages.window[layer].pool();
    p.window_begin = begin.view();
    if (n_max > 0) {
      mask = mem.zeros(DType::kU8, {B, n_max});
      for (int64_t b = 0; b < B; ++b) {
        const int64_t ne = masks[b].shape()[1];
        if (ne > 0) mem.copy(narrow(row(mask, b), 1, 0, ne), masks[b].view());
      }
      const PagedRows& entries = pages.entries[src_layer];
      p.comp_pool = entries.pool();
      p.comp_mask = mask.view();
      p.comp_ratio = entries.ratio();
    }
    p.sinks = a.sinks.view();
    p.out = attn.view();
    p.block_size = d.seqs[0]->ref.block_size;
    p.window = ac.sliding_window;
    p.scale = scale;
    backend_.paged_sink_attention(p);
  } else {
    // The slot's ring (V4.1 bounded replay's decoder layers): gathered per sequence, as forward() does.
    for (int64_t b = 0; b < B; ++b) {
      V4SequenceState& seq = *d.seqs[b];
      SwaRing& ring = seq.layers[layer].window;
      const int64_t p = d.rows.host_positions[b], n_past = p - past_begin[b];
      OwnedTensor window_kv = mem.zeros(DType::kF32, {n_past + 1, hd});
      for_ring_runs(ring.capacity, past_begin[b], n_past, [&](int64_t slot, int64_t at, int64_t len) {
        mem.copy(window_kv.view().slice(at, at + len), ring.rows.view().slice(slot, slot + len));
      });
      mem.copy(window_kv.view().slice(n_past, n_past + 1), row(in.kv, b));
      std::vector<int64_t> window_pos(static_cast<size_t>(n_past + 1));
      for (int64_t i = 0; i <= n_past; ++i) window_pos[i] = past_begin[b] + i;
      OwnedTensor kv_pos = mem.from_host(DType::kI64, {n_past + 1}, window_pos.data()), held_entries;
      const int64_t slot = p % ring.capacity;
      mem.copy(ring.rows.view().slice(slot, slot + 1), row(in.kv, b));
      SinkAttentionParams sp;
      sp.q = row(in.q, b).reshape({1, H, hd});
      sp.q_positions = row(d.rows.positions, b);
      sp.window_kv = window_kv.view();
      sp.kv_positions = kv_pos.view();
      if (r > 0 && seq.layers[src_layer].n_entries > 0) {
        sp.compressed = rows_view(seq, src_layer, /*keys=*/false, held_entries);
        sp.comp_mask = masks[b].view();
      }
      sp.sinks = a.sinks.view();
      sp.out = row(attn, b);
      sp.window = ac.sliding_window;
      sp.scale = scale;
      backend_.sink_attention(sp);
    }
  }

  // Stage 3 (its first half): batched output projection.
  return decode_output(d, layer, attn);
}

HostTensor DeepseekV4Model::decode_batch(std::span<V4SequenceState* const> seqs, std::span<const int64_t> ids) const {
  const int64_t B = static_cast<int64_t>(seqs.size());
  const int64_t D = config_.hidden_size, hc = config_.hc.hc_mult, V = config_.vocab_size;
  const float eps = static_cast<float>(config_.rms_norm_eps);
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

  // The step's inputs, uploaded once.
  TensorMemory& mem = memory();
  DecodeBatch d;
  d.seqs = seqs;
  d.B = B;
  d.sel.resize(static_cast<size_t>(B));
  d.rows.T = d.rows.total = B;
  d.rows.host_positions.resize(B);
  std::vector<int32_t> tables(static_cast<size_t>(B * max_blocks), -1), q_seq(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    const V4SequenceState& s = *seqs[b];
    d.rows.host_positions[b] = s.num_tokens;
    q_seq[b] = static_cast<int32_t>(b);
    for (int64_t j = 0; j < s.num_tokens / bs + 1; ++j)
      tables[b * max_blocks + j] = static_cast<int32_t>(s.ref.block_table[j]);
  }
  d.rows.positions = mem.from_host(DType::kI64, {B}, d.rows.host_positions.data());
  d.rows.ids = mem.from_host(DType::kI64, {B}, ids.data());
  d.q_seq = mem.from_host(DType::kI32, {B}, q_seq.data());
  d.tables = mem.from_host(DType::kI32, {B, max_blocks}, tables.data());
  if (!v41) {
    for (const LayerPlan& plan : config_.layers) {
      const int r = plan.compress_ratio;
      if (r <= 0 || d.slots.count(r)) continue;
      std::vector<int64_t> slot(static_cast<size_t>(B));
      for (int64_t b = 0; b < B; ++b) slot[b] = d.rows.host_positions[b] % r;
      d.slots[r] = mem.from_host(DType::kI64, {B}, slot.data());
    }
  }
  for (V4SequenceState* s : seqs) s->undo.reset();
  // Engram look-back rows of every sequence (each advances its own), hashed in one call per Engram layer.
  std::vector<OwnedTensor> hash_ids;
  if (engram_) {
    std::vector<int64_t> token_rows;
    for (int64_t b = 0; b < B; ++b) {
      const std::vector<int64_t> t = engram_token_rows(*seqs[b], ids.subspan(b, 1));
      token_rows.insert(token_rows.end(), t.begin(), t.end());
    }
    hash_ids = engram_hash_rows(token_rows, B);
  }

  // Embedding, copied into every hc stream: streams [B, hc, D].
  OwnedTensor x = mem.zeros(DType::kF32, {B, D});
  backend_.embedding({w_.embed.view(), d.rows.ids.view(), x.view()});
  OwnedTensor streams = mem.zeros(DType::kF32, {B, hc, D});
  mem.copy(streams.view(), Tensor(x.view().data(), DType::kF32, {B, hc, D}, {D, 0, 1}, x.device()));
  // V4.1 single-pass mHC: the first site collapses stream 0 only.
  std::vector<float> one_hot(static_cast<size_t>(B * hc), 0.0f);
  for (int64_t b = 0; b < B; ++b) one_hot[b * hc] = 1.0f;
  OwnedTensor carried_pre = mem.from_host(DType::kF32, {B, hc}, one_hot.data());
  OwnedTensor pre = mem.zeros(DType::kF32, {B, hc}), post = mem.zeros(DType::kF32, {B, hc});
  OwnedTensor comb = mem.zeros(DType::kF32, {B, hc, hc});
  auto mix = [&](const OwnedTensor& fn, const OwnedTensor& base, const OwnedTensor& scale, OwnedTensor& pre_out) {
    backend_.hc_mix({streams.view(), fn.view(), base.view(), scale.view(), pre_out.view(), post.view(), comb.view(),
                     eps, static_cast<float>(config_.hc.eps), config_.hc.sinkhorn_iters});
  };
  auto collapse_norm = [&](const OwnedTensor& weights, const OwnedTensor& norm) {
    OwnedTensor h = mem.zeros(DType::kF32, {B, D});
    backend_.hc_collapse({streams.view(), weights.view(), h.view()});
    backend_.rms_norm({h.view(), norm.view(), h.view(), eps});
    return h;
  };

  for (int l = 0; l < config_.num_layers; ++l) {
    const V4LayerWeights& lw = w_.layers[l];
    if (lw.has_engram) {
      const auto& ids_of = config_.engram.layer_ids;
      const auto k = static_cast<size_t>(std::find(ids_of.begin(), ids_of.end(), l) - ids_of.begin());
      engram_update(l, hash_ids[k], streams);
    }
    // Attention site.
    OwnedTensor attn_pre = mem.zeros(DType::kF32, {B, hc});
    mix(lw.hc_attn_fn, lw.hc_attn_base, lw.hc_attn_scale, attn_pre);
    OwnedTensor h = collapse_norm(v41 ? carried_pre : attn_pre, lw.attn_norm);
    OwnedTensor y = decode_attention(d, l, h);
    backend_.hc_expand({streams.view(), y.view(), post.view(), comb.view()});
    // FFN site: router and experts over every row.
    OwnedTensor ffn_pre = mem.zeros(DType::kF32, {B, hc});
    mix(lw.hc_ffn_fn, lw.hc_ffn_base, lw.hc_ffn_scale, ffn_pre);
    h = collapse_norm(v41 ? attn_pre : ffn_pre, lw.ffn_norm);
    y = moe(d.rows, l, h);
    backend_.hc_expand({streams.view(), y.view(), post.view(), comb.view()});
    if (v41) carried_pre = std::move(ffn_pre);
  }
  // Final collapse (V4: hc_head; V4.1: the last FFN site's `pre`), norm, head.
  if (!v41) {
    backend_.hc_head({streams.view(), w_.hc_head_fn.view(), w_.hc_head_base.view(), w_.hc_head_scale.view(), pre.view(),
                      eps, static_cast<float>(config_.hc.eps)});
  }
  OwnedTensor hidden = collapse_norm(v41 ? carried_pre : pre, w_.norm);
  OwnedTensor logits = mem.zeros(DType::kF32, {B, V});
  backend_.linear({hidden.view(), w_.head.view(), logits.view()});
  for (V4SequenceState* s : seqs) ++s->num_tokens;
  return mem.to_host(logits);
}

}  // namespace deepinfer
