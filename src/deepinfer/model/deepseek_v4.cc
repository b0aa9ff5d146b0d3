// DeepSeek-V4 / V4.1 forward: embedding into hc streams, per layer (Engram) → attention site → MoE site with
// mHC mixing, final collapse → norm → head. Attention and the compressors are in deepseek_v4_attention.cc.
//
// V4 vs V4.1 in this file:
//   - mHC collapse weights: V4 collapses each site with its own `pre`; V4.1 (single-pass mHC) with the
//     previous site's `pre` (one-hot for the first site) and ends with the last FFN site's `pre` instead of
//     an hc_head.
//   - MoE: V4.1 applies the routing weight before w2 and scales router logits by 1/gate_temp; V4 has hash
//     routed layers.
//   - Engram (V4.1 only) updates the streams at the start of its layers.
#include "deepinfer/model/deepseek_v4.h"

#include "deepinfer/model/weight_loader.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "deepinfer/io/checkpoint.h"
#include "deepinfer/model/deepseek_v4_internal.h"
#include "deepinfer/model/output_head.h"
#include "deepinfer/ops/rope_table.h"

namespace deepinfer {

namespace {

// The first decoder layer of V4.1's causal encoder-decoder (derived from the schedule, not from layer numbers):
// the candidate-source layer when its compressor is per-token (ratio 1) and it is the last kv source, so the
// decoder's only link to the encoder part of a prompt is that compressor's entries.
int find_decoder_start(const ModelConfig& c) {
  if (c.family != ModelFamily::kDeepseekV41) return -1;
  const int l = c.candidate_source_layer_id;
  if (l < 0 || l >= c.num_layers) return -1;
  const LayerPlan& p = c.layers[l];
  if (p.compress_ratio != 1 || p.kv_source != l) return -1;
  for (int k = l + 1; k < c.num_layers; ++k)
    if (c.layers[k].kv_source == k) return -1;
  return l;
}

}  // namespace

std::unique_ptr<DeepseekV4Model> DeepseekV4Model::load(const std::string& dir, Backend& backend,
                                                       std::optional<std::vector<int64_t>> token_map, bool keep_quant,
                                                       const ExpertFilter& resident) {
  ModelConfig config = load_model_config(dir + "/config.json");
  DI_CHECK_CODE(config.is_v4_family(), ErrorCode::kUnsupported)
      << dir << ": model family " << family_name(config.family) << " is not DeepSeek-V4/V4.1";
  auto ckpt = Checkpoint::open(dir);
  // Weights are dequantized on the host; a device backend gets them uploaded by the constructor.
  std::unique_ptr<Backend> host_backend;
  if (backend_memory(backend).device().kind != DeviceKind::kCPU) host_backend = make_cpu_backend(0);
  V4Weights weights = load_v4_weights(config, *ckpt, host_backend ? *host_backend : backend, keep_quant, resident);
  std::optional<EngramTables> engram;
  if (config.engram.enabled()) {
    if (!token_map) token_map = engram_token_map_from_tokenizer(dir + "/tokenizer.json");
    engram = build_engram_tables(config.engram, std::move(*token_map));
  }
  return std::make_unique<DeepseekV4Model>(std::move(config), std::move(weights), std::move(engram), backend);
}

DeepseekV4Model::DeepseekV4Model(ModelConfig config, V4Weights weights, std::optional<EngramTables> engram,
                                 Backend& backend)
    : config_(std::move(config)),
      w_(std::move(weights)),
      engram_(std::move(engram)),
      backend_(backend),
      memory_(backend_memory(backend)) {
  DI_CHECK(!config_.engram.enabled() || engram_.has_value()) << "V4.1 Engram layers need the Engram hash tables";
  if (memory_.device().kind != DeviceKind::kCPU) upload_weights();
  auto table = [this](const RopeConfig& r) {
    std::vector<float> f = rope_inv_freq(r);
    return memory().from_host(DType::kF32, {static_cast<int64_t>(f.size())}, f.data());
  };
  main_inv_freq_ = table(config_.rope);
  compress_inv_freq_ = table(config_.compress_rope);
  decoder_start_ = find_decoder_start(config_);
}

void DeepseekV4Model::set_activation_quant(ActQuant q) {
  act_quant_ = q;
  if (w_.dspark) set_act_quant(w_.dspark->main_proj, q);
  if (w_.mtp) {
    set_act_quant(w_.mtp->e_proj, q);
    set_act_quant(w_.mtp->h_proj, q);
  }
  for (V4LayerWeights* lw : v4_blocks(w_)) {
    for (KeptMatrix* m : lw->attn.kept()) set_act_quant(*m, q);
    lw->moe_act_quant = lw->experts_block_format ? q : ActQuant::kNone;
    lw->engram.wkv_act_quant = lw->engram.wkv_block_format ? q : ActQuant::kNone;
  }
}

int64_t DeepseekV4Model::bounded_decoder_from(int64_t prompt_len) const {
  return decoder_start_ < 0 ? 0 : std::max<int64_t>(0, prompt_len - decoder_window());
}

void DeepseekV4Model::upload_weights() {
  auto up = [this](OwnedTensor& t) {
    if (t.view().data() != nullptr) t = memory_.upload(t.view());
  };
  for (OwnedTensor* t : {&w_.embed, &w_.norm, &w_.head, &w_.hc_head_fn, &w_.hc_head_base, &w_.hc_head_scale}) up(*t);
  if (w_.dspark) {
    V4DsparkWeights& d = *w_.dspark;
    upload_kept(memory_, d.main_proj);
    for (OwnedTensor* t : {&d.main_norm, &d.norm, &d.markov_embed, &d.markov_head, &d.confidence, &d.hc_head_fn,
                           &d.hc_head_base, &d.hc_head_scale})
      up(*t);
  }
  if (w_.mtp) {
    V4MtpWeights& m = *w_.mtp;
    upload_kept(memory_, m.e_proj);
    upload_kept(memory_, m.h_proj);
    for (OwnedTensor* t : {&m.enorm, &m.hnorm, &m.norm, &m.hc_head_fn, &m.hc_head_base, &m.hc_head_scale}) up(*t);
  }
  for (V4LayerWeights* block : v4_blocks(w_)) {
    V4LayerWeights& lw = *block;
    V4AttentionWeights& a = lw.attn;
    for (OwnedTensor* t : {&lw.attn_norm,     &lw.ffn_norm,      &lw.hc_attn_fn,  &lw.hc_attn_base,
                           &lw.hc_attn_scale, &lw.hc_ffn_fn,     &lw.hc_ffn_base, &lw.hc_ffn_scale,
                           &a.q_norm,         &a.kv_norm,        &a.sinks,        &a.comp_wkv,
                           &a.comp_wgate,     &a.comp_ape,       &a.comp_norm,    &a.idx_weights_proj,
                           &a.idx_comp_wkv,   &a.idx_comp_wgate, &a.idx_comp_ape, &a.idx_comp_norm,
                           &a.idx_wk,         &a.idx_k_norm,     &lw.gate,        &lw.gate_bias,
                           &lw.tid2eid,       &lw.engram.table,  &lw.engram.wkv,  &lw.engram.gate_weight})
      up(*t);
    for (OwnedTensor* t : {&a.comp_wkv_bf16, &a.comp_wgate_bf16, &a.idx_comp_wkv_bf16, &a.idx_comp_wgate_bf16}) up(*t);
    for (KeptMatrix* m : a.kept()) upload_kept(memory_, *m);
    if (lw.quant_experts) {
      // quant_storage holds w1, w3, w2 of every routed expert, then the shared one (load_v4_weights).
      for (KeptMatrix& m : lw.quant_storage) upload_kept(memory_, m);
      auto views = [&lw](size_t first) {
        return QuantExpertWeights{lw.quant_storage[first].as_quant(), lw.quant_storage[first + 1].as_quant(),
                                  lw.quant_storage[first + 2].as_quant()};
      };
      for (size_t e = 0; e < lw.qexperts.size(); ++e) lw.qexperts[e] = views(3 * e);
      if (lw.has_shared) lw.qshared = views(3 * lw.qexperts.size());
      continue;
    }
    // Expert views point into expert_storage (w1, w3, w2 per routed expert, then the shared expert).
    for (OwnedTensor& t : lw.expert_storage) up(t);
    auto views = [&lw](size_t first) {
      return ExpertWeights{lw.expert_storage[first].view(), lw.expert_storage[first + 1].view(),
                           lw.expert_storage[first + 2].view()};
    };
    for (size_t e = 0; e < lw.experts.size(); ++e) lw.experts[e] = views(3 * e);
    if (lw.has_shared) lw.shared = views(3 * lw.experts.size());
  }
}

V4SequenceState DeepseekV4Model::new_sequence() const {
  V4SequenceState s;
  s.layers.resize(config_.num_layers);
  for (auto& l : s.layers) {
    l.window.capacity = config_.attn.sliding_window;  // rows: on first use (ring_rows)
    l.entries.width = config_.attn.head_dim;
    l.index_keys.width = config_.attn.index_head_dim;
  }
  return s;
}

V4KvPages DeepseekV4Model::new_kv_pages(bool bounded_decoder) const {
  const int L = config_.num_layers;
  V4KvPages p;
  // fp8: each kind's quantized records (u8 pools), the reference's storage of these rows.
  const DType pool = kv_dtype_ == DType::kF8E4M3 ? DType::kU8 : kv_dtype_;
  p.window.assign(L, PagedRows(config_.attn.head_dim, 1, pool, kWindowRecord));
  p.entries.resize(L);
  p.index_keys.resize(L);
  const bool v41 = config_.family == ModelFamily::kDeepseekV41;
  for (int l = 0; l < L; ++l) {
    const LayerPlan& plan = config_.layers[l];
    const int r = plan.compress_ratio;
    // Pools only where rows are written (the footprint counts every pool): V4 compresses on every compressed
    // layer and keeps indexer keys on CSA layers; V4.1 writes both on kv-source layers only.
    if (r <= 0 || (v41 && plan.kv_source != l)) continue;
    p.entries[l] = PagedRows(config_.attn.head_dim, r, pool, kEntryRecord);
    if (v41 || plan.attention == AttentionKind::kCSA)
      p.index_keys[l] = PagedRows(config_.attn.index_head_dim, r, pool, kIndexKeyRecord);
  }
  p.ring_from_layer = bounded_decoder && decoder_start_ >= 0 ? decoder_start_ : L;
  for (int l = p.ring_from_layer; l < L; ++l) p.window[l] = PagedRows();  // windows kept in the slot's ring
  return p;
}

void DeepseekV4Model::set_kv_cache_dtype(DType dtype) {
  DI_CHECK(dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kF8E4M3)
      << "the paged caches are kept in f32, bf16 or fp8 records, not " << dtype_name(dtype);
  DI_CHECK_CODE(dtype != DType::kF8E4M3 || cached_rows_quantized(config_), ErrorCode::kUnsupported)
      << "fp8 caches keep the FP8 / FP4 records of fake-quantized rows: V4.1 with head and indexer widths in whole "
         "32-value blocks only ("
      << family_name(config_.family) << " caches its rows unquantized; bf16 halves them)";
  kv_dtype_ = dtype;
}

int64_t V4KvPages::bytes_per_block(int block_size) const {
  int64_t b = 0;
  for (const auto* kind : {&window, &entries, &index_keys})
    for (const PagedRows& r : *kind) b += r.bytes_per_block(block_size);
  return b;
}

int64_t V4KvPages::bytes_allocated() const {
  int64_t b = 0;
  for (const auto* kind : {&window, &entries, &index_keys})
    for (const PagedRows& r : *kind) b += r.bytes_allocated();
  return b;  // the slot pool's rows count with the slots (DeepseekV4Model::slot_bytes)
}

void V4KvPages::set_max_blocks(int64_t blocks) {
  for (auto* kind : {&window, &entries, &index_keys})
    for (PagedRows& r : *kind) r.set_max_blocks(blocks);
}

const OwnedTensor& DeepseekV4Model::ring_rows(SwaRing& ring) const {
  if (ring.rows.view().data() == nullptr)
    ring.rows = memory().zeros(DType::kF32, {ring.capacity, config_.attn.head_dim});
  return ring.rows;
}

int64_t DeepseekV4Model::slot_bytes_bound(bool bounded_decoder) const {
  const int64_t f32 = dtype_bytes(DType::kF32, 1);
  // Rings only where a paged sequence keeps its window in the slot (new_kv_pages: from ring_from_layer on).
  const int ring_from = bounded_decoder && decoder_start_ >= 0 ? decoder_start_ : config_.num_layers;
  int64_t b = (config_.num_layers - ring_from) * config_.attn.sliding_window * config_.attn.head_dim * f32;
  for (int l = 0; l < config_.num_layers; ++l) {
    const int r = config_.layers[l].compress_ratio;
    if (r <= 0) continue;
    const auto& a = w_.layers[l].attn;
    const bool overlap = config_.layers[l].attention == AttentionKind::kCSA;
    // A compressor keeps < r pending rows of kv and gate [width], and with overlap the last window's Ca half
    // (kv and gate [r, width / 2]); in the batched decode's pool (V4SlotPool) instead, r rows of kv and gate,
    // 2r with overlap.
    for (const OwnedTensor* wkv : {&a.comp_wkv, &a.idx_comp_wkv}) {
      if (wkv->view().data() == nullptr) continue;
      const int64_t width = wkv->shape()[0];
      const int64_t own = 2 * (r - 1) * width * f32 + (overlap ? r * width * f32 : 0);
      b += std::max(own, 2 * (overlap ? 2 * r : r) * width * f32);
    }
  }
  if (engram_) b += static_cast<int64_t>(engram_->max_ngram - 1) * static_cast<int64_t>(sizeof(int64_t));
  return b;
}

int64_t DeepseekV4Model::slot_bytes(const V4SequenceState& s) const {
  auto bytes = [](const OwnedTensor& t) { return t.view().data() ? dtype_bytes(t.dtype(), t.numel()) : 0; };
  int64_t b = static_cast<int64_t>(s.engram_recent.size() * sizeof(int64_t));
  for (const V4LayerState& l : s.layers) {
    b += bytes(l.window.rows) + bytes(l.entries.storage) + bytes(l.index_keys.storage);
    for (const CompressorState* c : {&l.compressor, &l.index_compressor})
      b += bytes(c->pending_kv) + bytes(c->pending_gate) + bytes(c->prev_kv) + bytes(c->prev_gate);
  }
  // Pooled state: the slot's rows in the pages' slot pool.
  if (s.pool_slot) {
    using Kind = V4SlotPool::Kind;
    for (int l = 0; l < config_.num_layers; ++l) {
      const V4LayerState& st = s.layers[l];
      for (auto [pooled, kind] : {std::pair{st.compressor.pooled, Kind::kCompressor},
                                  {st.index_compressor.pooled, Kind::kIndexer},
                                  {st.window.pooled, Kind::kRing}}) {
        const V4SlotPool::Rows* p = s.pages->slot_pool.find(l, kind);
        if (pooled && p) b += (kind == Kind::kRing ? 1 : 2) * p->rows_per_slot * p->width * dtype_bytes(DType::kF32, 1);
      }
    }
  }
  return b;
}

int DeepseekV4Model::prefix_replay_tokens(bool bounded_decoder) const {
  int replay = 0;
  // V4's CSA entry w pools half of window w−1: the window before a hit is re-run to rebuild that slice.
  if (config_.family != ModelFamily::kDeepseekV41)
    for (const LayerPlan& p : config_.layers)
      if (p.attention == AttentionKind::kCSA) replay = std::max(replay, p.compress_ratio);
  // Bounded replay: decoder windows live in the slot (they depend on the prompt length), rebuilt by re-running
  // one window of positions; the encoder rows they read are paged, so this is exact.
  if (bounded_decoder && decoder_start_ >= 0) replay = std::max<int>(replay, config_.attn.sliding_window);
  return replay;
}

int DeepseekV4Model::prefix_replay_tokens_past_prompt(bool bounded_decoder) const {
  const int replay = prefix_replay_tokens(bounded_decoder);
  if (!bounded_decoder || decoder_start_ < 0) return replay;
  // A hit past the prompt (a recompute after preemption) starts the replay above decoder_from, where the decoder
  // windows have rows the replay does not rebuild. Only the first decoder layer's window rows come from paged
  // (encoder) rows alone; layer d0 + k's row at a replayed position also reads layer d0 + k − 1's window over the
  // W − 1 positions before it, so it is exact only k·(W − 1) positions into the replay. The first new token reads
  // the last decoder layer's window: L decoder layers need L·(W − 1) replayed positions (or a replay reaching
  // decoder_from, which is exact by construction).
  const int layers = config_.num_layers - decoder_start_, w = static_cast<int>(config_.attn.sliding_window);
  return std::max(replay, layers * (w - 1));
}

void DeepseekV4Model::start_at(V4SequenceState& seq, int64_t start, std::span<const int64_t> prefix_ids) const {
  unpool(seq);
  DI_CHECK_INTERNAL(static_cast<int64_t>(prefix_ids.size()) == start)
      << "start_at(" << start << ") with " << prefix_ids.size() << " prefix ids";
  const bool v41 = config_.family == ModelFamily::kDeepseekV41;
  seq.num_tokens = start;
  for (int l = 0; l < config_.num_layers; ++l) {
    const LayerPlan& p = config_.layers[l];
    const int r = p.compress_ratio;
    if (r <= 0 || (v41 && p.kv_source != l)) continue;
    // Groups before the first boundary >= start are cached; the compressors resume there.
    const int64_t groups = (start + r - 1) / r;
    V4LayerState& st = seq.layers[l];
    st.compressor.emitted = groups;
    st.n_entries = groups;
    if (!v41 && p.attention == AttentionKind::kCSA) st.index_compressor.emitted = groups;
  }
  if (engram_) {
    const int64_t keep = std::min<int64_t>(engram_->max_ngram - 1, start);
    seq.engram_recent.clear();
    for (int64_t i = start - keep; i < start; ++i) {
      const int64_t id = prefix_ids[i];
      DI_CHECK(id >= 0 && id < static_cast<int64_t>(engram_->token_map.size()))
          << "engram: token id " << id << " outside the map";
      seq.engram_recent.push_back(engram_->token_map[id]);
    }
  }
}

HostTensor DeepseekV4Model::forward(V4SequenceState& seq, std::span<const int64_t> ids, V4ForwardTrace* trace,
                                    V4StreamCapture* capture, const CpShard* cp, int64_t last_rows) const {
  const int64_t total_tokens = static_cast<int64_t>(ids.size());
  const int64_t D = config_.hidden_size, hc = config_.hc.hc_mult, V = config_.vocab_size;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  const bool v41 = config_.family == ModelFamily::kDeepseekV41;
  DI_CHECK(total_tokens > 0) << "forward: empty chunk";
  DI_CHECK(static_cast<int64_t>(seq.layers.size()) == config_.num_layers) << "forward: state of another model";
  DI_CHECK(!cp || cp->total_tokens() == total_tokens)
      << "forward: CP shard for " << (cp ? cp->total_tokens() : 0) << " tokens, chunk of " << total_tokens;
  // Captured rows would be this rank's zig-zag rows, not the chunk's; the DSpark capture runs without CP.
  DI_CHECK_CODE(!(capture && cp), ErrorCode::kUnsupported) << "forward: stream capture with a CP shard";
  unpool(seq);  // the compressors run on the sequence's own state here
  if (seq.record_undo) {
    seq.undo.emplace();
    seq.undo->p0 = seq.num_tokens;
    seq.undo->layers.resize(static_cast<size_t>(config_.num_layers));
  } else {
    seq.undo.reset();
  }
  // This rank's tokens (chunk offsets); T shrinks to the decoder rows at a bounded-replay split.
  std::vector<int64_t> local(cp ? cp->local() : std::vector<int64_t>{});
  if (!cp)
    for (int64_t t = 0; t < total_tokens; ++t) local.push_back(t);
  int64_t T = static_cast<int64_t>(local.size());

  TensorMemory& mem = memory();
  Chunk c;
  c.T = T;
  c.total = total_tokens;
  c.cp = cp;
  c.p0 = seq.num_tokens;
  std::vector<int64_t> local_ids(T);
  c.host_positions.resize(T);
  for (int64_t t = 0; t < T; ++t) {
    c.host_positions[t] = c.p0 + local[t];
    local_ids[t] = ids[local[t]];
  }
  c.positions = mem.from_host(DType::kI64, {T}, c.host_positions.data());
  c.ids = mem.from_host(DType::kI64, {T}, local_ids.data());

  // Embedding, copied into every hc stream: streams [T, hc, D]. Buffers an op writes in full take no zero fill here
  // (at 8192 tokens the streams alone are 0.5 GB); V4DecodeBatch.ReadsNoBufferNoOpWrote runs this on poisoned memory.
  OwnedTensor x = mem.empty(DType::kF32, {T, D});
  backend_.embedding({w_.embed.view(), c.ids.view(), x.view()});
  OwnedTensor streams = mem.empty(DType::kF32, {T, hc, D});
  mem.copy(streams.view(), Tensor(x.view().data(), DType::kF32, {T, hc, D}, {D, 0, 1}, x.device()));

  // V4.1 single-pass mHC: the first site collapses stream 0 only.
  std::vector<float> one_hot(static_cast<size_t>(T * hc), 0.0f);
  for (int64_t t = 0; t < T; ++t) one_hot[t * hc] = 1.0f;
  OwnedTensor carried_pre = mem.from_host(DType::kF32, {T, hc}, one_hot.data());

  // Engram look-back needs the preceding ids: hashed over the whole chunk, then this rank's rows kept.
  std::vector<OwnedTensor> hash_ids, chunk_hash_ids;
  if (engram_) chunk_hash_ids = engram_hash_ids(seq, ids);
  for (const OwnedTensor& all : chunk_hash_ids) {
    if (!cp) {
      hash_ids.push_back(all);
      continue;
    }
    OwnedTensor mine = mem.zeros(DType::kI64, {T, all.shape()[1]});
    cp->select_rows(mem, all.view(), mine.view());
    hash_ids.push_back(std::move(mine));
  }
  if (trace)
    for (const auto& h : hash_ids) trace->engram_hash_ids.push_back(mem.to_host(h));
  // Bounded replay: the first `skip` tokens stop after the decoder-start layer's compressor.
  const int64_t skip = decoder_start_ < 0 ? 0 : std::clamp<int64_t>(seq.decoder_from - c.p0, 0, total_tokens);

  Selection sel;
  OwnedTensor pre = mem.empty(DType::kF32, {T, hc}), post = mem.empty(DType::kF32, {T, hc});
  OwnedTensor comb = mem.empty(DType::kF32, {T, hc, hc});
  auto mix = [&](const OwnedTensor& fn, const OwnedTensor& base, const OwnedTensor& scale, OwnedTensor& pre_out) {
    backend_.hc_mix({streams.view(), fn.view(), base.view(), scale.view(), pre_out.view(), post.view(), comb.view(),
                     eps, static_cast<float>(config_.hc.eps), config_.hc.sinkhorn_iters});
  };
  auto collapse_norm = [&](const OwnedTensor& weights, const OwnedTensor& norm) {
    OwnedTensor h = mem.empty(DType::kF32, {T, D});
    backend_.hc_collapse_norm({streams.view(), weights.view(), norm.view(), h.view(), eps});
    return h;
  };

  std::vector<OwnedTensor> captured;  // per capture layer: [rows of the chunk that reached it, D]
  if (capture) {
    DI_CHECK(!capture->final_streams || capture->layers.empty())
        << "forward: a capture takes either layer streams or the final streams";
    for (size_t i = 0; i < capture->layers.size(); ++i)
      DI_CHECK(capture->layers[i] >= 0 && capture->layers[i] < config_.num_layers &&
               (i == 0 || capture->layers[i] > capture->layers[i - 1]))
          << "forward: capture layers must be ascending layer ids in [0, " << config_.num_layers << ")";
  }
  bool encoder_only = false;            // every token of the chunk stopped at the decoder start
  int stopped_at = config_.num_layers;  // the first layer an encoder-only chunk did not run
  for (int l = 0; l < config_.num_layers; ++l) {
    const V4LayerWeights& lw = w_.layers[l];
    if (lw.has_engram) {
      const auto& ids_of = config_.engram.layer_ids;
      const int k = static_cast<int>(std::find(ids_of.begin(), ids_of.end(), l) - ids_of.begin());
      engram_update(l, hash_ids[k].view(), streams.view());
    }
    if (capture && std::find(capture->layers.begin(), capture->layers.end(), l) != capture->layers.end()) {
      // Mean over the hc copies: a collapse with uniform weights.
      std::vector<float> uniform(static_cast<size_t>(T * hc), 1.0f / static_cast<float>(hc));
      OwnedTensor weights = mem.from_host(DType::kF32, {T, hc}, uniform.data());
      OwnedTensor mean = mem.empty(DType::kF32, {T, D});
      backend_.hc_collapse({streams.view(), weights.view(), mean.view()});
      captured.push_back(std::move(mean));
    }
    // Attention site.
    OwnedTensor attn_pre = mem.empty(DType::kF32, {T, hc});
    mix(lw.hc_attn_fn, lw.hc_attn_base, lw.hc_attn_scale, attn_pre);
    OwnedTensor h = collapse_norm(v41 ? carried_pre : attn_pre, lw.attn_norm);  // [T, D]
    bool run_compressor = true;
    if (l == decoder_start_) {
      c.swa_floor = seq.decoder_from;  // decoder windows start at the segment
      if (skip > 0 && cp) {
        // CP ends at the split: gather every per-token tensor and go on as one rank over the whole chunk (the
        // decoder segment is one window of tokens; every rank runs it).
        auto gather = [&](OwnedTensor& t) {
          Shape s = t.shape();
          s[0] = total_tokens;
          OwnedTensor all = mem.zeros(t.dtype(), s);
          cp->all_gather_rows(mem, t.view(), all.view());
          t = std::move(all);
        };
        for (OwnedTensor* t : {&streams, &carried_pre, &attn_pre, &post, &comb, &h}) gather(*t);
        hash_ids = chunk_hash_ids;
        T = total_tokens;
        c.T = T;
        c.cp = nullptr;
        c.host_positions.resize(T);
        for (int64_t t = 0; t < T; ++t) c.host_positions[t] = c.p0 + t;
        c.positions = mem.from_host(DType::kI64, {T}, c.host_positions.data());
        c.ids = mem.from_host(DType::kI64, {T}, ids.data());
      }
      if (skip > 0) {
        // Every token feeds the decoder-start compressor (the decoder's view of the encoder); only the last
        // T - skip go on through the decoder layers.
        v41_compress(c, l, h, seq);
        run_compressor = false;
        if (skip == T) {
          encoder_only = true;
          stopped_at = l;
          break;
        }
        auto keep = [&](OwnedTensor& t) { t = mem.clone(t.view().slice(skip, T)); };
        for (OwnedTensor* t : {&streams, &carried_pre, &attn_pre, &post, &comb, &h, &c.positions, &c.ids}) keep(*t);
        for (OwnedTensor& ids_k : hash_ids) keep(ids_k);
        T -= skip;
        c.T = T;
        c.total = T;
        c.p0 += skip;
        c.host_positions.erase(c.host_positions.begin(), c.host_positions.begin() + skip);
        pre = mem.empty(DType::kF32, {T, hc});
      }
    }
    if (trace) trace->attn_inputs.push_back(mem.to_host(h));
    OwnedTensor y = attention(c, l, h, seq, sel, run_compressor);  // [T, D]
    if (trace) trace->attn_outputs.push_back(mem.to_host(y));
    backend_.hc_expand({streams.view(), y.view(), post.view(), comb.view()});
    // FFN site.
    OwnedTensor ffn_pre = mem.empty(DType::kF32, {T, hc});
    mix(lw.hc_ffn_fn, lw.hc_ffn_base, lw.hc_ffn_scale, ffn_pre);
    h = collapse_norm(v41 ? attn_pre : ffn_pre, lw.ffn_norm);
    y = moe(c, l, h);
    if (trace) trace->ffn_outputs.push_back(mem.to_host(y));
    backend_.hc_expand({streams.view(), y.view(), post.view(), comb.view()});
    if (v41) carried_pre = std::move(ffn_pre);
    if (trace) trace->layer_outputs.push_back(mem.to_host(streams));
  }

  if (capture) {
    // Layers before a bounded-replay split saw every token of the chunk; keep the rows all layers saw.
    const int64_t n = encoder_only ? 0 : T;
    const int64_t width = capture->final_streams ? hc * D : static_cast<int64_t>(capture->layers.size()) * D;
    capture->first_position = encoder_only ? seq.num_tokens + total_tokens : c.p0;
    capture->rows = mem.zeros(DType::kF32, {n, width});
    if (n > 0 && capture->final_streams)
      mem.copy(capture->rows.view(), streams.view().reshape({n, width}));
    else if (n > 0)
      for (size_t i = 0; i < captured.size(); ++i) {
        const int64_t rows = captured[i].shape()[0];
        mem.copy(narrow(capture->rows.view(), 1, i * D, (i + 1) * D), captured[i].view().slice(rows - n, rows));
      }
  }
  if (encoder_only) {
    // EP: the other ranks of the group still run these layers' exchanges.
    if (ep_) {
      for (int l = stopped_at; l < config_.num_layers; ++l) ep_idle(l);
    }
    seq.num_tokens += total_tokens;
    return HostTensor(DType::kF32, {0, V});
  }
  // Final collapse: V4 computes its own weights with hc_head, V4.1 reuses the last FFN site's `pre`.
  if (!v41) {
    backend_.hc_head({streams.view(), w_.hc_head_fn.view(), w_.hc_head_base.view(), w_.hc_head_scale.view(), pre.view(),
                      eps, static_cast<float>(config_.hc.eps)});
  }
  OwnedTensor hidden = collapse_norm(v41 ? carried_pre : pre, w_.norm);  // [T, D]
  if (trace) trace->final_hidden = mem.to_host(hidden);
  // The head on the rows the caller reads (a CP rank's rows are its zig-zag share: all of them).
  const int64_t rows = last_rows < 0 || cp ? T : std::min(last_rows, T);
  OwnedTensor logits = mem.empty(DType::kF32, {rows, V});
  if (rows > 0) head_linear(backend_, hidden.view().slice(T - rows, T), w_.head.view(), logits.view());
  seq.num_tokens += total_tokens;
  return mem.to_host(logits);
}

int64_t DeepseekV4Model::feature_dim() const {
  if (config_.draft.kind == DraftKind::kMTP) return static_cast<int64_t>(config_.hc.hc_mult) * config_.hidden_size;
  return static_cast<int64_t>(config_.draft.target_layer_ids.size()) * config_.hidden_size;
}

HostTensor DeepseekV4Model::forward_features(V4SequenceState& seq, std::span<const int64_t> ids,
                                             std::vector<float>* features) const {
  DI_CHECK_CODE(config_.draft.kind == DraftKind::kDSpark || config_.draft.kind == DraftKind::kMTP,
                ErrorCode::kUnsupported)
      << "forward_features: the model has no draft (DSpark or MTP layers) whose features it could capture";
  V4StreamCapture capture;
  if (config_.draft.kind == DraftKind::kDSpark)
    capture.layers = config_.draft.target_layer_ids;
  else
    capture.final_streams = true;
  const int64_t p0 = seq.num_tokens, T = static_cast<int64_t>(ids.size());
  HostTensor logits = forward(seq, ids, nullptr, &capture);
  const int64_t F = feature_dim();
  features->assign(static_cast<size_t>(T * F), std::numeric_limits<float>::quiet_NaN());
  const int64_t n = capture.rows.shape()[0];
  if (n > 0) {
    HostTensor rows = memory().to_host(capture.rows.view());
    std::copy_n(rows.data<float>(), n * F, features->data() + (capture.first_position - p0) * F);
  }
  return logits;
}

OwnedTensor DeepseekV4Model::moe(const Chunk& c, int layer, const OwnedTensor& x) const {
  const V4LayerWeights& lw = w_.layers[layer];
  const auto& m = config_.moe;
  const int64_t T = c.T, k = m.num_experts_per_tok;
  const bool v41 = config_.family == ModelFamily::kDeepseekV41;
  // The router writes every slot and the MoE every output (no zero fills: decode is a chain of small launches).
  OwnedTensor weights = memory().empty(DType::kF32, {T, k}), indices = memory().empty(DType::kI32, {T, k});
  RouterParams r;
  r.x = x.view();
  r.weight = lw.gate.view();
  if (lw.tid2eid.view().data() != nullptr) {
    r.hash_table = lw.tid2eid.view();
    r.token_ids = c.ids.view();
  } else {
    r.bias = lw.gate_bias.view();
  }
  r.weights = weights.view();
  r.indices = indices.view();
  r.scoring = m.scoring == ScoringFunc::kSigmoid   ? RouterScoring::kSigmoid
              : m.scoring == ScoringFunc::kSoftmax ? RouterScoring::kSoftmax
                                                   : RouterScoring::kSqrtSoftplus;
  r.gate_temp = static_cast<float>(v41 ? m.gate_temp : 1.0);
  r.route_scale = static_cast<float>(m.routed_scaling_factor);
  // V4.1 normalises only with norm_topk_prob and top-k > 1; V4 always does.
  r.normalize = v41 ? (m.norm_topk_prob && k > 1) : true;
  backend_.router(r);
  OwnedTensor out = memory().empty(DType::kF32, {T, config_.hidden_size});
  if (lw.quant_experts) {
    const QuantMoeParams q{x.view(),
                           weights.view(),
                           indices.view(),
                           &lw.qexperts,
                           lw.has_shared ? &lw.qshared : nullptr,
                           out.view(),
                           static_cast<float>(m.swiglu_limit),
                           v41,
                           lw.moe_act_quant};
    if (ep_) {
      ep_->moe(backend_, layer, q);
    } else {
      backend_.moe_quant(q);
    }
    return out;
  }
  MoeParams p;
  p.x = x.view();
  p.weights = weights.view();
  p.indices = indices.view();
  p.experts = &lw.experts;
  p.shared = lw.has_shared ? &lw.shared : nullptr;
  p.out = out.view();
  p.swiglu_limit = static_cast<float>(m.swiglu_limit);
  p.weight_before_w2 = v41;
  p.act_quant = lw.moe_act_quant;
  if (ep_) {
    ep_->moe(backend_, layer, p);
  } else {
    backend_.moe(p);
  }
  return out;
}

void DeepseekV4Model::idle_forward() const {
  DI_CHECK_INTERNAL(ep_ != nullptr) << "idle_forward without expert parallelism";
  for (int l = 0; l < config_.num_layers; ++l) ep_idle(l);
}

void DeepseekV4Model::ep_idle(int layer) const {
  const V4LayerWeights& lw = w_.layers[layer];
  const float limit = static_cast<float>(config_.moe.swiglu_limit);
  const bool v41 = config_.family == ModelFamily::kDeepseekV41;
  if (lw.quant_experts) {
    ep_->idle(backend_, layer, lw.qexperts, limit, v41);
  } else {
    ep_->idle(backend_, layer, lw.experts, limit, v41);
  }
}

int DeepseekV4Model::routed_experts(int layer) const {
  const V4LayerWeights& lw = w_.layers.at(layer);
  return static_cast<int>(lw.quant_experts ? lw.qexperts.size() : lw.experts.size());
}

bool DeepseekV4Model::has_expert(int layer, int expert) const {
  const V4LayerWeights& lw = w_.layers.at(layer);
  if (expert < 0 || expert >= routed_experts(layer)) return false;
  return lw.quant_experts ? lw.qexperts[expert].w1.weight.data() != nullptr : lw.experts[expert].w1.data() != nullptr;
}

void DeepseekV4Model::retain_experts(int layer, const std::vector<bool>& keep) {
  V4LayerWeights& lw = w_.layers.at(layer);
  const int n = routed_experts(layer);
  DI_CHECK(static_cast<int>(keep.size()) == n)
      << "retain_experts: layer " << layer << " has " << n << " routed experts, got " << keep.size() << " flags";
  for (size_t e = 0; e < keep.size(); ++e) {
    if (keep[e]) continue;
    // quant_storage / expert_storage: w1, w3, w2 of every routed expert first (load_v4_weights).
    for (size_t i = 0; i < 3; ++i) {
      if (lw.quant_experts)
        lw.quant_storage[3 * e + i] = KeptMatrix{};
      else
        lw.expert_storage[3 * e + i] = OwnedTensor();
    }
    if (lw.quant_experts)
      lw.qexperts[e] = QuantExpertWeights{};
    else
      lw.experts[e] = ExpertWeights{};
  }
}

void DeepseekV4Model::load_experts(const std::string& dir, int layer, const std::vector<int>& experts) {
  V4LayerWeights& lw = w_.layers.at(layer);
  auto ckpt = Checkpoint::open(dir);
  // Dequantized on the host (as load() does), then moved into this backend's memory.
  std::unique_ptr<Backend> host_backend = make_cpu_backend(1);
  WeightLoader ld(config_, *ckpt, *host_backend);
  const std::string X0 = "layers." + std::to_string(config_.layers.at(layer).index) + ".ffn.experts.";
  const bool device = memory_.device().kind != DeviceKind::kCPU;
  for (int e : experts) {
    DI_CHECK(e >= 0 && e < routed_experts(layer)) << "load_experts: expert " << e << " out of range";
    if (has_expert(layer, e)) continue;
    const std::string X = X0 + std::to_string(e) + ".";
    const char* names[3] = {"w1.weight", "w3.weight", "w2.weight"};
    if (lw.quant_experts) {
      // In the stored block format, as load_v4_weights keeps it (the codes and scales move to the device).
      for (size_t i = 0; i < 3; ++i) {
        KeptMatrix m = load_kept(ld, X + names[i], true);
        DI_CHECK(m.quantized()) << "load_experts: " << X << names[i]
                                << " is not block-quantized like the layer's other routed experts";
        if (device) upload_kept(memory_, m);
        lw.quant_storage[3 * e + i] = std::move(m);
      }
      lw.qexperts[e] = {lw.quant_storage[3 * e].as_quant(), lw.quant_storage[3 * e + 1].as_quant(),
                        lw.quant_storage[3 * e + 2].as_quant()};
      continue;
    }
    for (size_t i = 0; i < 3; ++i) {
      HostTensor h = ld.f32(X + names[i]);
      lw.expert_storage[3 * e + i] = device ? memory_.upload(h.view()) : OwnedTensor(std::move(h));
    }
    lw.experts[e] = {lw.expert_storage[3 * e].view(), lw.expert_storage[3 * e + 1].view(),
                     lw.expert_storage[3 * e + 2].view()};
  }
}

std::vector<OwnedTensor> DeepseekV4Model::engram_hash_ids(V4SequenceState& seq, std::span<const int64_t> ids) const {
  const std::vector<int64_t> tokens = engram_token_rows(seq, ids);
  return engram_hash_rows(tokens, static_cast<int64_t>(ids.size()));
}

std::vector<int64_t> DeepseekV4Model::engram_token_rows(V4SequenceState& seq, std::span<const int64_t> ids) const {
  const EngramTables& e = *engram_;
  const int64_t T = static_cast<int64_t>(ids.size()), n = e.max_ngram;
  constexpr int64_t kDead = -1;  // blocks look-back (image tokens, before the sequence start)
  // History = the carried look-back followed by this chunk's compressed ids.
  std::vector<int64_t> history(seq.engram_recent);
  const int64_t carried = static_cast<int64_t>(history.size());
  for (int64_t id : ids) {
    DI_CHECK(id >= 0 && id < static_cast<int64_t>(e.token_map.size()))
        << "engram: token id " << id << " outside the map";
    history.push_back(e.token_map[id]);
  }
  // tokens[t, s]: compressed id s steps back, or the pad id once look-back is blocked.
  std::vector<int64_t> token_rows(static_cast<size_t>(T * n));
  for (int64_t t = 0; t < T; ++t) {
    bool blocked = false;
    for (int64_t s = 0; s < n; ++s) {
      const int64_t at = carried + t - s;
      blocked = blocked || at < 0 || history[at] == kDead;
      token_rows[t * n + s] = blocked ? e.pad_id : history[at];
    }
  }
  const int64_t keep = std::min<int64_t>(n - 1, static_cast<int64_t>(history.size()));
  seq.engram_recent.assign(history.end() - keep, history.end());
  if (seq.undo) {
    seq.undo->engram_carried = carried;
    seq.undo->engram_history = std::move(history);
  }
  return token_rows;
}

std::vector<OwnedTensor> DeepseekV4Model::engram_hash_rows(const std::vector<int64_t>& token_rows, int64_t T) const {
  const EngramTables& e = *engram_;
  const int64_t n = e.max_ngram, heads = e.heads;
  TensorMemory& mem = memory();
  OwnedTensor tokens = mem.from_host(DType::kI64, {T, n}, token_rows.data());
  std::vector<OwnedTensor> out;
  for (size_t l = 0; l < e.multipliers.size(); ++l) {
    OwnedTensor mult = mem.from_host(DType::kI64, {n}, e.multipliers[l].data());
    OwnedTensor primes = mem.from_host(DType::kI64, {n - 1, heads}, e.primes[l].data());
    OwnedTensor offsets = mem.from_host(DType::kI64, {(n - 1) * heads}, e.offsets[l].data());
    OwnedTensor rows = mem.zeros(DType::kI64, {T, (n - 1) * heads});
    backend_.engram_hash({tokens.view(), mult.view(), primes.view(), offsets.view(), rows.view()});
    out.push_back(std::move(rows));
  }
  return out;
}

void DeepseekV4Model::engram_update(int layer, const Tensor& hash_ids, const Tensor& streams) const {
  const V4EngramWeights& ew = w_.layers[layer].engram;
  const int64_t T = hash_ids.dim(0), cols = hash_ids.dim(1), ed = ew.table.shape()[1];
  const int64_t D = config_.hidden_size, hc = config_.hc.hc_mult;
  TensorMemory& mem = memory();
  // e = table rows of every hash column, flattened: [T, cols·ed]; kv = wkv·e = [K (hc·D) | V (D)].
  OwnedTensor rows = mem.zeros(DType::kF32, {T * cols, ed});
  backend_.embedding({ew.table.view(), hash_ids.reshape({T * cols}), rows.view()});
  OwnedTensor kv = mem.zeros(DType::kF32, {T, (hc + 1) * D});
  backend_.linear({rows.view().reshape({T, cols * ed}), ew.wkv.view(), kv.view(), ew.wkv_act_quant});
  OwnedTensor key = mem.zeros(DType::kF32, {T, hc, D}), value = mem.zeros(DType::kF32, {T, D});
  mem.copy(key.view().reshape({T, hc * D}), narrow(kv.view(), 1, 0, hc * D));
  mem.copy(value.view(), narrow(kv.view(), 1, hc * D, (hc + 1) * D));
  backend_.engram_gate(
      {streams, key.view(), value.view(), ew.gate_weight.view(), static_cast<float>(config_.rms_norm_eps)});
}

}  // namespace deepinfer
