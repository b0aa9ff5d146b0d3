#include "deepinfer/bench/bench_runner.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>

#include "deepinfer/bench/decode_rate.h"
#include "deepinfer/core/error.h"
#include "deepinfer/ops/kv_record.h"
#include "deepinfer/ops/rope_table.h"

namespace deepinfer::bench {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Device-resident state of one slice: weights per layer, caches sized for the largest step, activations
// sized for the most tokens. The data flow between ops is the model's shapes, not its values: caches and
// weights are random, and the grouped output projection reads contiguous chunks of the attention output.
//
// GEMM calls per layer (decode is launch-bound): the projections that share an input are one weight each, as
// engines fuse them at load time — [wq_a; wkv] (+ the indexer's wproj) over the normed input, wq_b (+ the indexer's
// wq_idx) over the q latent (bench_model.h fuse_rows) — and the o_groups output projections are one grouped call
// (BenchTarget::grouped_linear): 4 calls a layer, against 12 (14 on an indexed layer) as separate weights. The
// consumers read column ranges of the fused outputs: in place for one token (a row's range is contiguous), through
// a copy into a contiguous buffer for more (every op takes contiguous tensors): 2 copies a layer, 5 on an indexed
// one. StepCounts (the breakdown's last columns) counts both.
class Slice final : public SliceState {
 public:
  Slice(BenchTarget& t, const BenchModel& m, const std::vector<StepShape>& shapes, uint64_t seed)
      : t_(t), m_(m), mem_(t.memory()), seed_(seed) {
    for (const StepShape& s : shapes) {
      max_tokens_ = std::max(max_tokens_, s.seqs * s.tokens);
      max_seqs_ = std::max(max_seqs_, s.seqs);
      max_context_ = std::max(max_context_, s.context);
    }
    const int64_t d = m.hidden, hhd = m.heads * m.head_dim, tt = max_tokens_;
    streams_ = rnd({tt, m.hc, d}, 1.0f);
    xn_ = rnd({tt, d}, 1.0f);
    qr_ = rnd({tt, m.q_lora}, 1.0f);
    q_ = rnd({tt, m.heads, m.head_dim}, 1.0f);
    kv_ = rnd({tt, m.head_dim}, 1.0f);
    o_ = rnd({tt, m.heads, m.head_dim}, 1.0f);
    z_ = rnd({tt, m.o_groups * m.o_lora}, 1.0f);
    y_ = rnd({tt, d}, 1.0f);
    pre_ = rnd({tt, m.hc}, 1.0f);
    post_ = rnd({tt, m.hc}, 1.0f);
    comb_ = rnd({tt, m.hc, m.hc}, 1.0f);
    qi_ = rnd({tt, m.index_heads, m.index_dim}, 1.0f);
    iw_ = rnd({tt, m.index_heads}, 1.0f);
    rw_ = rnd({tt, m.topk}, 1.0f);
    ridx_ = mem_.zeros(DType::kI32, {tt, m.topk});
    sinks_ = rnd({m.heads}, 1.0f);
    RopeConfig rc;
    rc.dim = static_cast<int>(m.rope_dim);
    std::vector<float> inv = rope_inv_freq(rc);
    inv_freq_ = mem_.from_host(DType::kF32, {static_cast<int64_t>(inv.size())}, inv.data());
    // Paged caches as the engine keeps them: blocks of kBenchCacheBlock positions, each sequence's blocks spread over
    // the pool (block ids interleaved across sequences); window rows at id·bs + p % bs, entries of ratio r at
    // id·(bs/r) + ... (PagedRows). One window pool serves every layer (its contents do not matter here).
    const int64_t max_blocks = max_cache_blocks(shapes);
    int64_t max_entries = 1;
    for (const StepShape& s : shapes) {
      for (const LayerSpec& l : m.layers)
        if (l.ratio > 0)
          max_entries = std::max(max_entries, s.seqs * std::max<int64_t>(1, visible_entries(s.context - 1, l.ratio)));
    }
    window_pool_ = rnd({max_blocks * kBenchCacheBlock, m.head_dim}, 1.0f);
    window_pool_paged_ = paged_copy(window_pool_, kWindowRecord);
    int64_t max_scores = 1;
    for (const StepShape& s : shapes)
      for (const LayerSpec& l : m.layers)
        if (l.ratio > 0)
          max_scores =
              std::max(max_scores, s.seqs * s.tokens * std::max<int64_t>(1, visible_entries(s.context - 1, l.ratio)));
    scores_ = rnd({max_scores}, 1.0f);
    const int b = m.dense_block;
    int64_t in_width = 1, q_width = 1;
    for (const LayerSpec& spec : m.layers) {
      in_width = std::max(in_width, fused_input_rows(m, spec.kind).rows);
      q_width = std::max(q_width, fused_q_rows(m, spec.kind).rows);
    }
    fused_in_ = rnd({tt, in_width}, 1.0f);
    fused_q_ = rnd({tt, q_width}, 1.0f);
    const bool engram = std::any_of(m.layers.begin(), m.layers.end(), [](const LayerSpec& l) { return l.engram; });
    if (engram) {
      const int64_t cols = engram_cols(m);
      DI_CHECK(m.engram_ngram >= 2 && m.engram_heads >= 1 && m.engram_table_rows >= 8 * cols && m.engram_vocab >= 1)
          << "bench: Engram needs n-grams >= 2, heads >= 1, a table of at least 8 rows a hash column and a vocabulary";
      engram_ids_ = mem_.zeros(DType::kI64, {tt, cols});
      engram_rows_ = rnd({tt * cols, m.engram_dim}, 1.0f);
      engram_kv_ = rnd({tt, (m.hc + 1) * d}, 1.0f);
      engram_key_ = rnd({tt, m.hc, d}, 1.0f);
      engram_value_ = rnd({tt, d}, 1.0f);
    }
    for (size_t li = 0; li < m.layers.size(); ++li) {
      const LayerSpec& spec = m.layers[li];
      Layer l;
      l.in_rows = fused_input_rows(m, spec.kind);
      l.q_rows = fused_q_rows(m, spec.kind);
      l.w_in = t.fp8_weight(l.in_rows.rows, d, b, next());
      l.w_q = t.fp8_weight(l.q_rows.rows, m.q_lora, b, next());
      l.wo_a = t.grouped_weight(BenchFormat::kFP8Block, m.o_groups, m.o_lora, hhd / m.o_groups, b, next());
      l.wo_b = t.fp8_weight(d, m.o_groups * m.o_lora, b, next());
      const int64_t fn_rows = (2 + m.hc) * m.hc;
      for (Site* site : {&l.attn, &l.ffn}) {
        site->fn = rnd({fn_rows, m.hc * d}, 1.0f / std::sqrt(static_cast<float>(m.hc * d)));
        site->base = rnd({fn_rows}, 0.5f);
        site->scale = rnd({3}, 1.0f);
      }
      l.router = rnd({m.experts, d}, 1.0f / std::sqrt(static_cast<float>(d)));
      l.router_bias = rnd({m.experts}, 0.1f);
      ExpertSpec es;
      es.count = m.experts;
      es.d = d;
      es.inter = m.moe_inter;
      es.routed = BenchFormat::kMXFP4;
      es.shared_inter = m.shared_experts * m.moe_inter;
      es.shared = BenchFormat::kFP8Block;
      es.block = b;
      l.experts = t.experts(es, next());
      if (spec.kind == AttnKind::kIndexed || spec.kind == AttnKind::kAllSeen ||
          (spec.kind == AttnKind::kReuse && source_of(li) < 0)) {
        l.compressed = rnd({max_blocks * (kBenchCacheBlock / spec.ratio), m.head_dim}, 1.0f);
        l.compressed_paged = paged_copy(l.compressed, kEntryRecord);
      }
      if (spec.kind == AttnKind::kIndexed) {
        // Contiguous per sequence for prefill, paged like the compressed entries for batched decode.
        l.index_keys = rnd({std::max(max_entries, max_blocks * (kBenchCacheBlock / spec.ratio)), m.index_dim}, 1.0f);
        l.index_keys_paged = paged_copy(l.index_keys, kIndexKeyRecord);
        l.mask = mem_.zeros(DType::kU8, {max_scores});
      }
      if (spec.engram) make_engram(l);
      layers_.push_back(std::move(l));
    }
  }

  // Positions, block tables and the selected entries of one shape.
  void prepare(const StepShape& s) override {
    const int64_t tt = s.seqs * s.tokens;
    for (Layer& l : layers_) t_.plan_grouped(*l.wo_a, tt);
    std::vector<int64_t> pos(tt);
    for (int64_t q = 0; q < s.seqs; ++q)
      for (int64_t j = 0; j < s.tokens; ++j) pos[q * s.tokens + j] = s.context - s.tokens + j;
    positions_ = mem_.from_host(DType::kI64, {tt}, pos.data());
    // Block b of sequence q gets id b·seqs + q: a sequence's pages are never adjacent.
    const int64_t nb = ceil_div(s.context, kBenchCacheBlock);
    std::vector<int32_t> tables(s.seqs * nb), qseq(tt);
    for (int64_t q = 0; q < s.seqs; ++q)
      for (int64_t b = 0; b < nb; ++b) tables[q * nb + b] = static_cast<int32_t>(b * s.seqs + q);
    for (int64_t i = 0; i < tt; ++i) qseq[i] = static_cast<int32_t>(i / s.tokens);
    tables_ = mem_.from_host(DType::kI32, {s.seqs, nb}, tables.data());
    q_seq_ = mem_.from_host(DType::kI32, {tt}, qseq.data());
    std::vector<int64_t> begin(s.seqs, 0);
    window_begin_ = mem_.from_host(DType::kI64, {s.seqs}, begin.data());
    if (engram_ids_.numel() > 0) {  // each token's n-gram window of compressed ids (random: the cost is the same)
      std::vector<int64_t> tok(tt * m_.engram_ngram);
      for (int64_t& v : tok) v = static_cast<int64_t>(next() >> 33) % m_.engram_vocab;
      engram_tokens_ = mem_.from_host(DType::kI64, {tt, m_.engram_ngram}, tok.data());
    }
    // Selected entries per query: every visible one (all-seen layers) or min(top-k, visible) spread over them
    // (the selection's values do not change the cost; the indexer's own top-k is timed separately).
    comp_idx_.clear();
    n_entries_.clear();
    for (const LayerSpec& l : m_.layers) {
      if (l.ratio <= 0) continue;
      const bool all = l.kind == AttnKind::kAllSeen;
      const int64_t key = all ? -l.ratio : l.ratio;
      if (comp_idx_.count(key)) continue;
      const int64_t k = std::max<int64_t>(1, all ? visible_entries(s.context - 1, l.ratio)
                                                 : std::min(m_.index_topk, visible_entries(s.context - 1, l.ratio)));
      std::vector<int32_t> idx(tt * k, -1);
      for (int64_t i = 0; i < tt; ++i) {
        const int64_t vis = visible_entries(pos[i], l.ratio), n = std::min(k, vis);
        for (int64_t j = 0; j < n; ++j) idx[i * k + j] = static_cast<int32_t>(all || vis <= k ? j : j * vis / k);
      }
      comp_idx_[key] = mem_.from_host(DType::kI32, {tt, k}, idx.data());
    }
    // Entries each decode row's sequence holds, per indexed ratio (the batched indexer's row bound).
    for (const LayerSpec& l : m_.layers) {
      if (l.kind != AttnKind::kIndexed || n_entries_.count(l.ratio)) continue;
      std::vector<int64_t> ne(tt, visible_entries(s.context - 1, l.ratio));
      n_entries_[l.ratio] = mem_.from_host(DType::kI64, {tt}, ne.data());
    }
  }

  // The state a step updates in place (the residual streams) of the current shape: saved, restored, read.
  OwnedTensor save(const StepShape& s) override { return mem_.clone(rows(streams_, s.seqs * s.tokens)); }
  void restore(const StepShape& s, const OwnedTensor& saved) override {
    mem_.copy(rows(streams_, s.seqs * s.tokens), saved.view());
  }
  HostTensor result(const StepShape& s) override { return mem_.to_host(rows(streams_, s.seqs * s.tokens)); }

  // profile: charge each op group's time to its segment (BenchTarget::profile_*).
  void step(const StepShape& s, bool profile) override {
    profile_ = profile;
    counts_ = StepCounts{0, 0, true};
    const BenchModel& m = m_;
    Backend& be = t_.backend();
    const bool copies = m.kv_value_bytes != 4 || m.kv_records;  // the paged calls read the pools' bf16 / record copies
    const int64_t tt = s.seqs * s.tokens, d = m.hidden, hhd = m.heads * m.head_dim;
    const Tensor streams = rows(streams_, tt), xn = rows(xn_, tt), qr = rows(qr_, tt);
    const Tensor q = rows(q_, tt), kv = rows(kv_, tt), o = rows(o_, tt), z = rows(z_, tt), y = rows(y_, tt);
    const Tensor pre = rows(pre_, tt), post = rows(post_, tt), comb = rows(comb_, tt);
    const Tensor pos = positions_.view();
    for (size_t li = 0; li < m.layers.size(); ++li) {
      const LayerSpec& spec = m.layers[li];
      Layer& l = layers_[li];
      // ---- Engram's update of the streams, then the attention site (its mix: below, with the previous layer's FFN
      // expand, past the first layer and unless Engram comes between)
      if (spec.engram) engram_update(l, tt, streams);
      if (li == 0 || spec.engram) be.hc_mix(mix_params(l.attn, streams, pre, post, comb));
      be.hc_collapse_norm({streams, pre, Tensor{}, xn, 1e-6f});
      mark(kSegMixNorm);
      // The fused projections (see the class comment), then their parts: q latent, kv, and on an indexed layer the
      // indexer's head weights and q.
      const Tensor fin = flat(fused_in_, 0, {tt, l.in_rows.rows}), fq = flat(fused_q_, 0, {tt, l.q_rows.rows});
      linear(xn, *l.w_in, fin);
      const Tensor qr_p = part(fin, l.in_rows.offset[0], qr);
      be.rms_norm({qr_p, Tensor{}, qr_p, 1e-6f});
      linear(qr_p, *l.w_q, fq);
      const Tensor q_p = part(fq, l.q_rows.offset[0], q.reshape({tt, hhd})).reshape({tt, m.heads, m.head_dim});
      const Tensor kv_p = part(fin, l.in_rows.offset[1], kv);
      // The query's (V4: head norm and) RoPE, the kv row's norm and RoPE: one launch, as the engine's attention.
      NormRopeParams nr;
      nr.parts[0] = {q_p, Tensor{}, m.q_head_norm, true};
      nr.parts[1] = {kv_p.reshape({tt, 1, m.head_dim}), Tensor{}, true, true};
      nr.positions = pos;
      nr.inv_freq = inv_freq_.view();
      nr.eps = 1e-6f;
      be.norm_rope(nr);
      Tensor qi, iw;
      if (spec.kind == AttnKind::kIndexed) {
        qi = part(fq, l.q_rows.offset[1], rows(qi_, tt).reshape({tt, m.index_heads * m.index_dim}))
                 .reshape({tt, m.index_heads, m.index_dim});
        iw = part(fin, l.in_rows.offset[2], rows(iw_, tt));
      }
      mark(kSegProj);
      const int src = spec.kind == AttnKind::kReuse ? source_of(li) : static_cast<int>(li);
      const Layer& owner = src >= 0 ? layers_[src] : l;
      const int64_t n = visible_entries(s.context - 1, spec.ratio);
      if (spec.kind == AttnKind::kIndexed) {
        if (s.tokens == 1 && n > 0) {
          // Decode as the engine's batched step runs it: every sequence's keys read in their pages in one call,
          // one top-k over the [B, n] scores.
          const Tensor sc = flat(scores_, 0, {tt, n});
          PagedIndexerScoreParams ip;
          ip.q = qi;
          ip.weights = iw;
          ip.positions = pos;
          ip.q_seq = q_seq_.view();
          ip.n_entries = n_entries_.at(spec.ratio).view();
          ip.block_tables = tables_.view();
          ip.key_pool = copies ? l.index_keys_paged.view() : l.index_keys.view();
          ip.out = sc;
          ip.block_size = static_cast<int>(kBenchCacheBlock);
          ip.key_ratio = static_cast<int>(spec.ratio);
          ip.ratio = static_cast<int>(spec.ratio);
          ip.score_scale = 1.0f / std::sqrt(static_cast<float>(m.index_dim));
          ip.weight_scale = 1.0f / std::sqrt(static_cast<float>(m.index_heads));
          be.paged_indexer_scores(ip);
          be.topk_mask({sc, Tensor{}, flat(l.mask, 0, {tt, n}), static_cast<int>(m.index_topk)});
        }
        for (int64_t sq = 0; sq < s.seqs && n > 0 && s.tokens > 1; ++sq) {
          const Tensor keys = seq_rows(l.index_keys, sq, n);
          const Tensor sc = flat(scores_, sq * s.tokens * n, {s.tokens, n});
          IndexerScoreParams ip;
          ip.q = qi.slice(sq * s.tokens, (sq + 1) * s.tokens);
          ip.keys = keys;
          ip.weights = iw.slice(sq * s.tokens, (sq + 1) * s.tokens);
          ip.positions = pos.slice(sq * s.tokens, (sq + 1) * s.tokens);
          ip.out = sc;
          ip.ratio = static_cast<int>(spec.ratio);
          ip.score_scale = 1.0f / std::sqrt(static_cast<float>(m.index_dim));
          ip.weight_scale = 1.0f / std::sqrt(static_cast<float>(m.index_heads));
          be.indexer_scores(ip);
          be.topk_mask({sc, Tensor{}, flat(l.mask, sq * s.tokens * n, {s.tokens, n}), static_cast<int>(m.index_topk)});
        }
      }
      if (spec.kind == AttnKind::kIndexed) mark(kSegIndexer);
      // All sequences in one launch, reading the pages in place.
      PagedSinkAttentionParams ap;
      ap.q = q_p;
      ap.q_positions = pos;
      ap.q_seq = q_seq_.view();
      ap.block_tables = tables_.view();
      ap.window_pool = copies ? window_pool_paged_.view() : window_pool_.view();
      ap.window_begin = window_begin_.view();
      if (spec.kind != AttnKind::kSwa && n > 0) {
        ap.comp_pool = copies ? owner.compressed_paged.view() : owner.compressed.view();
        ap.comp_idx = comp_idx_.at(spec.kind == AttnKind::kAllSeen ? -spec.ratio : spec.ratio).view();
        ap.comp_ratio = static_cast<int>(spec.ratio);
      }
      ap.sinks = sinks_.view();
      ap.out = o;
      ap.block_size = kBenchCacheBlock;
      ap.window = static_cast<int>(m.window);
      ap.scale = 1.0f / std::sqrt(static_cast<float>(m.head_dim));
      be.paged_sink_attention(ap);
      mark(kSegAttention);
      be.rope({o, pos, inv_freq_.view(), true});
      // Group g reads rows [g·tt, (g+1)·tt) of the attention output seen as [G·tt, hhd/G] (group-major).
      const int64_t gk = hhd / m.o_groups;
      ++counts_.gemm_calls;
      t_.grouped_linear(flat(o_, 0, {m.o_groups * tt, gk}), *l.wo_a, flat(z_, 0, {m.o_groups * tt, m.o_lora}));
      linear(z, *l.wo_b, y);
      mark(kSegProj);
      // ---- MoE site: the attention's expand and this site's mix in one call
      be.hc_expand_mix({{streams, y, post, comb}, mix_params(l.ffn, streams, pre, post, comb)});
      be.hc_collapse_norm({streams, pre, Tensor{}, xn, 1e-6f});
      RouterParams rp;
      rp.x = xn;
      rp.weight = l.router.view();
      rp.bias = l.router_bias.view();
      rp.weights = rows(rw_, tt);
      rp.indices = rows(ridx_, tt);
      rp.route_scale = 1.5f;
      mark(kSegMixNorm);
      be.router(rp);
      mark(kSegRouter);
      t_.moe(xn, rows(rw_, tt), rows(ridx_, tt), *l.experts, y, m.swiglu_limit, m.weight_before_w2);
      mark(kSegExperts);
      if (li + 1 < m.layers.size() && !m.layers[li + 1].engram)  // the FFN's expand and the next site's mix
        be.hc_expand_mix({{streams, y, post, comb}, mix_params(layers_[li + 1].attn, streams, pre, post, comb)});
      else
        be.hc_expand({streams, y, post, comb});
      mark(kSegMixNorm);
    }
    (void)d;
  }

  StepCounts counts() const override { return counts_; }

 private:
  struct Site {
    OwnedTensor fn, base, scale;
  };
  struct Layer {
    // w_in = [wq_a; wkv] (+ wproj), w_q = wq_b (+ wq_idx): fused_input_rows / fused_q_rows give the parts' rows.
    std::unique_ptr<BenchWeight> w_in, w_q, wo_b;
    FusedRows in_rows, q_rows;
    std::unique_ptr<BenchGroupedWeight> wo_a;
    Site attn, ffn;
    OwnedTensor router, router_bias;
    std::unique_ptr<BenchExperts> experts;
    // The paged pools; with a bf16 or record cache (BenchModel::kv_value_bytes 2, kv_records) also their copies in
    // that form, which the paged calls then read (prefill's indexer reads the f32 keys contiguously, as the engine's
    // prefill gathers them widened).
    OwnedTensor compressed, index_keys, mask, compressed_paged, index_keys_paged;
    // Engram: the table, wkv [(hc+1)·D, cols·dim] FP8, the gate weight [hc, D], the hash's multipliers [n], moduli
    // [n-1, heads] and column offsets.
    OwnedTensor engram_table, engram_gate, engram_mult, engram_mod, engram_offsets;
    std::unique_ptr<BenchWeight> engram_wkv;
  };

  // Engram's weights for layer l: hash moduli that keep every id inside the bench's table (the checkpoint's are
  // primes above 16e6 over a table of ~384 M rows; the hash's arithmetic is the same).
  void make_engram(Layer& l) {
    const BenchModel& m = m_;
    const int64_t cols = engram_cols(m), d = m.hidden;
    l.engram_table = rnd({m.engram_table_rows, m.engram_dim}, 1.0f);
    l.engram_wkv = t_.fp8_weight((m.hc + 1) * d, cols * m.engram_dim, m.dense_block, next());
    l.engram_gate = rnd({m.hc, d}, 1.0f);
    std::vector<int64_t> mult(m.engram_ngram), mod(cols), off(cols);
    // Odd multipliers below 2^40: id · m stays inside int64 for ids below 2^23.
    for (int64_t& v : mult) v = static_cast<int64_t>(next() >> 24) | 1;
    int64_t sum = 0;
    for (int64_t c = 0; c < cols; ++c) {
      mod[c] = m.engram_table_rows / cols - c % 7;
      off[c] = sum;
      sum += mod[c];
    }
    l.engram_mult = mem_.from_host(DType::kI64, {m.engram_ngram}, mult.data());
    l.engram_mod = mem_.from_host(DType::kI64, {m.engram_ngram - 1, m.engram_heads}, mod.data());
    l.engram_offsets = mem_.from_host(DType::kI64, {cols}, off.data());
  }

  // Engram as the model runs it (DeepseekV4Model::engram_update): hash ids, their table rows, kv = wkv · rows
  // = [K | V], the gated update of the streams.
  void engram_update(const Layer& l, int64_t tt, const Tensor& streams) {
    const BenchModel& m = m_;
    Backend& be = t_.backend();
    const int64_t cols = engram_cols(m), d = m.hidden;
    const Tensor ids = rows(engram_ids_, tt), table_rows = flat(engram_rows_, 0, {tt * cols, m.engram_dim});
    be.engram_hash({engram_tokens_.view(), l.engram_mult.view(), l.engram_mod.view(), l.engram_offsets.view(), ids});
    be.embedding({l.engram_table.view(), ids.reshape({tt * cols}), table_rows});
    const Tensor kv = rows(engram_kv_, tt);
    linear(table_rows.reshape({tt, cols * m.engram_dim}), *l.engram_wkv, kv);
    const Tensor key = part(kv, 0, rows(engram_key_, tt).reshape({tt, m.hc * d})).reshape({tt, m.hc, d});
    const Tensor value = part(kv, m.hc * d, rows(engram_value_, tt));
    be.engram_gate({streams, key, value, l.engram_gate.view(), 1e-6f});
    mark(kSegEngram);
  }

  // The latest indexed layer with the same ratio before `li` (the reuse layer's source), or -1.
  int source_of(size_t li) const {
    for (int j = static_cast<int>(li) - 1; j >= 0; --j)
      if (m_.layers[j].kind == AttnKind::kIndexed && m_.layers[j].ratio == m_.layers[li].ratio) return j;
    return -1;
  }
  uint64_t next() { return seed_ = seed_ * 6364136223846793005ull + 1442695040888963407ull; }
  OwnedTensor rnd(Shape shape, float range) { return t_.random(std::move(shape), next(), range); }
  // The copy of a cache pool the paged calls read: bf16 (kv_value_bytes 2), or records of `record` (kv_records: the
  // pool's rows fake-quantized by that kind in place first, as the model quantizes what it caches); empty for f32.
  OwnedTensor paged_copy(const OwnedTensor& pool, FakeQuantKind record) {
    const Tensor& v = pool.view();
    if (m_.kv_records) {
      t_.backend().fake_quant({v, record});
      OwnedTensor c = mem_.zeros(DType::kU8, {v.dim(0), kv_record_bytes(record, v.dim(1))});
      mem_.convert_records(c.view(), v, record);
      return c;
    }
    if (m_.kv_value_bytes != 2) return {};
    OwnedTensor c = mem_.zeros(DType::kBF16, v.shape());
    mem_.cast(c.view(), v);
    return c;
  }
  static Tensor rows(const OwnedTensor& t, int64_t n) { return t.view().slice(0, n); }
  // Rows [sq·n, (sq+1)·n) of a [rows, width] cache: sequence sq's region.
  static Tensor seq_rows(const OwnedTensor& t, int64_t sq, int64_t n) { return t.view().slice(sq * n, (sq + 1) * n); }
  // A contiguous view of `shape` at element offset `off` of a tensor's storage.
  static Tensor flat(const OwnedTensor& t, int64_t off, Shape shape) {
    const Tensor& v = t.view();
    DI_CHECK_INTERNAL(off + shape_numel(shape) <= v.numel()) << "bench: view past the end of a buffer";
    return Tensor(static_cast<char*>(v.data()) + off * dtype_bytes(v.dtype(), 1), v.dtype(), std::move(shape),
                  v.device());
  }
  void mark(int seg) {
    if (profile_) t_.profile_mark(seg);
  }
  void linear(const Tensor& in, const BenchWeight& w, const Tensor& out) {
    ++counts_.gemm_calls;
    t_.linear(in, w, out);
  }
  // The part of a fused projection's output [tt, rows] that starts at column c0 and is as wide as dst: a view for
  // one token (one row's columns are contiguous) or a part that is the whole output (wq_b alone), else copied into
  // dst (ops take contiguous tensors).
  Tensor part(const Tensor& fused, int64_t c0, const Tensor& dst) {
    const int64_t tt = fused.dim(0), w = dst.rank() == 2 ? dst.dim(1) : 0;
    DI_CHECK_INTERNAL(dst.rank() == 2 && dst.dim(0) == tt && c0 + w <= fused.dim(1))
        << "bench: a fused part past its output";
    char* p = static_cast<char*>(fused.data()) + dtype_bytes(fused.dtype(), c0);
    if (tt == 1 || (c0 == 0 && w == fused.dim(1))) return Tensor(p, fused.dtype(), dst.shape(), fused.device());
    mem_.copy(dst, Tensor(p, fused.dtype(), {tt, w}, {fused.dim(1), 1}, fused.device()));
    ++counts_.part_copies;
    return dst;
  }
  // The mHC mix of a site (its outputs may be the expand inputs of the same call: hc_expand_mix reads those first).
  static HcMixParams mix_params(const Site& s, const Tensor& streams, const Tensor& pre, const Tensor& post,
                                const Tensor& comb) {
    HcMixParams hp;
    hp.streams = streams;
    hp.fn = s.fn.view();
    hp.base = s.base.view();
    hp.scale = s.scale.view();
    hp.pre = pre;
    hp.post = post;
    hp.comb = comb;
    hp.sinkhorn_iters = 20;
    return hp;
  }

  BenchTarget& t_;
  const BenchModel& m_;
  TensorMemory& mem_;
  uint64_t seed_;
  bool profile_ = false;
  StepCounts counts_;
  int64_t max_tokens_ = 1, max_seqs_ = 1, max_context_ = 1;
  OwnedTensor streams_, xn_, qr_, q_, kv_, o_, z_, y_, pre_, post_, comb_, qi_, iw_, rw_, ridx_, sinks_, inv_freq_;
  OwnedTensor scores_, positions_, window_pool_, window_pool_paged_, tables_, q_seq_, window_begin_, fused_in_,
      fused_q_;
  OwnedTensor engram_tokens_, engram_ids_, engram_rows_, engram_kv_, engram_key_, engram_value_;
  std::map<int64_t, OwnedTensor> comp_idx_;   // by ratio (negative: every visible entry)
  std::map<int64_t, OwnedTensor> n_entries_;  // i64 [tokens], by indexed ratio
  std::vector<Layer> layers_;
};

std::string human(double v, const char* unit) {
  const char* pre[] = {"", "K", "M", "G", "T", "P"};
  int i = 0;
  while (std::fabs(v) >= 1000 && i < 5) {
    v /= 1000;
    ++i;
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.3g %s%s", v, pre[i], unit);
  return buf;
}

// Bytes that differ between two f32 tensors and the largest absolute difference (NaN == NaN bitwise).
std::string compare(const HostTensor& a, const HostTensor& b) {
  int64_t diff = 0;
  double max_abs = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const float x = a.data<float>()[i], y = b.data<float>()[i];
    if (std::memcmp(&x, &y, sizeof x) != 0) {
      ++diff;
      max_abs = std::max(max_abs, std::fabs(static_cast<double>(x) - y));
    }
  }
  char buf[96];
  std::snprintf(buf, sizeof buf, "%lld of %lld values differ (max |d| %.3g)", static_cast<long long>(diff),
                static_cast<long long>(a.numel()), max_abs);
  return buf;
}

// Decode as one graph: the replay must give the eager step's output (two eager runs from the same state
// show whether the step itself is deterministic), then its median time.
void graph_step(BenchTarget& target, SliceState& slice, const StepShape& s, const BenchOptions& o, BenchRow& r) {
  try {
    const OwnedTensor start = slice.save(s);
    slice.step(s, false);
    const HostTensor eager = slice.result(s);
    slice.restore(s, start);
    slice.step(s, false);
    const HostTensor eager2 = slice.result(s);
    slice.restore(s, start);
    if (!target.capture([&] { slice.step(s, false); })) {
      r.graph_note = "no graphs on this target";
      return;
    }
    target.replay();
    const HostTensor replayed = slice.result(s);
    r.graph_note = "replay vs eager: " + compare(replayed, eager) + "; eager vs eager: " + compare(eager2, eager);
    r.graph_ms = target.time_ms([&] { target.replay(); }, o.warmup, o.iters);
  } catch (const Error& e) {
    r.graph_note = std::string("graph failed: ") + e.what();
  }
}

}  // namespace

std::string format_graphs(const std::vector<BenchRow>& rows) {
  std::string out = "decode step as a CUDA graph (eager ms, replay ms, speed-up; output check):\n";
  for (const BenchRow& r : rows) {
    if (r.shape.prefill || r.graph_note.empty()) continue;
    char buf[160];
    std::snprintf(buf, sizeof buf, "%-11s batch %4lld context %6lld  eager %9.3f  graph %9.3f  %5.2fx  ",
                  r.model.c_str(), static_cast<long long>(r.shape.seqs), static_cast<long long>(r.shape.context), r.ms,
                  r.graph_ms, r.graph_ms > 0 ? r.ms / r.graph_ms : 0.0);
    out += buf + r.graph_note + "\n";
  }
  return out;
}

std::string format_decode_rates(const std::vector<BenchRow>& rows) {
  std::string out =
      "decode as the reference reports it (avg_SPS = 1 / median step; no drafts in the bench: delivered = "
      "full-acceptance, draft length 0):\n";
  for (const BenchRow& r : rows) {
    if (r.shape.prefill || r.ms <= 0) continue;
    // One step of `seqs` sequences in the median step time.
    DecodeCounts c{1, r.ms / 1000.0, r.shape.seqs, 0, 0, 0, 0};
    const DecodeRate d = decode_rate(c);
    char buf[256];
    std::snprintf(buf, sizeof buf,
                  "%-11s batch %4lld context %6lld  avg_SPS %9.2f steps/s  delivered %11.1f tokens/s  "
                  "full-acceptance %11.1f tokens/s",
                  r.model.c_str(), static_cast<long long>(r.shape.seqs), static_cast<long long>(r.shape.context),
                  d.avg_sps, d.delivered_tokens_per_s, d.full_acceptance_tokens_per_s);
    out += buf;
    if (r.graph_ms > 0) {
      c.seconds = r.graph_ms / 1000.0;
      const DecodeRate g = decode_rate(c);
      std::snprintf(buf, sizeof buf, "  (graph: avg_SPS %9.2f, delivered %11.1f tokens/s)", g.avg_sps,
                    g.delivered_tokens_per_s);
      out += buf;
    }
    out += "\n";
  }
  return out;
}

const char* segment_name(int s) {
  switch (s) {
    case kSegMixNorm:
      return "mHC+norm";
    case kSegProj:
      return "q/kv/o proj";
    case kSegIndexer:
      return "indexer";
    case kSegAttention:
      return "attention";
    case kSegRouter:
      return "router";
    case kSegExperts:
      return "experts";
    case kSegEngram:
      return "engram";
    default:
      return "?";
  }
}

std::string format_breakdown(const std::vector<BenchRow>& rows) {
  std::string out =
      "breakdown (ms of one profiled step; events between op groups):\n"
      "  (V4 slices: q/kv/o proj includes the indexer's q and head-weight projections, fused with q_b and q_a/kv;\n"
      "  the o_groups output projections are one grouped call)\n"
      "model       phase    batch  context";
  for (int g = 0; g < kSegCount; ++g) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "  %12s", segment_name(g));
    out += buf;
  }
  out += "  attn-bytes  attn-B/s    gemm-calls  part-copies\n";
  for (const BenchRow& r : rows) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "%-11s %-8s %5lld %8lld", r.model.c_str(), r.shape.prefill ? "prefill" : "decode",
                  static_cast<long long>(r.shape.seqs), static_cast<long long>(r.shape.context));
    out += buf;
    for (int g = 0; g < kSegCount; ++g) {
      std::snprintf(buf, sizeof buf, "  %12.3f", g < static_cast<int>(r.segment_ms.size()) ? r.segment_ms[g] : 0.0);
      out += buf;
    }
    // Bytes sink attention must read (window rows + selected entries, f32) over its measured time.
    const double attn_ms = kSegAttention < static_cast<int>(r.segment_ms.size()) ? r.segment_ms[kSegAttention] : 0.0;
    std::snprintf(buf, sizeof buf, "  %-10s  %-10s", human(r.cost.attention_bytes, "B").c_str(),
                  attn_ms > 0 ? human(r.cost.attention_bytes / (attn_ms / 1000.0), "B/s").c_str() : "-");
    out += buf;
    // Target GEMM calls of the step outside the MoE (linear / grouped_linear; a CUDA linear past the streaming
    // kernels' rows — 8 with UE8M0 scales — is itself 3 launches: weight to bf16, input to bf16, cuBLASLt) and the
    // copies of fused-projection parts.
    if (r.counts.counted)
      std::snprintf(buf, sizeof buf, "  %10lld  %11lld\n", static_cast<long long>(r.counts.gemm_calls),
                    static_cast<long long>(r.counts.part_copies));
    else
      std::snprintf(buf, sizeof buf, "  %10s  %11s\n", "-", "-");
    out += buf;
  }
  return out;
}

double BenchRow::tokens_per_s() const { return ms > 0 ? shape.seqs * shape.tokens / (ms / 1000.0) : 0; }

std::vector<StepShape> bench_shapes(const BenchOptions& o) {
  DI_CHECK(o.iters >= 1 && o.warmup >= 0) << "bench: iters must be >= 1 and warmup >= 0";
  std::vector<StepShape> shapes;
  for (int64_t p : o.prompts) {
    DI_CHECK(p >= 1) << "bench: prompt length must be >= 1, got " << p;
    shapes.push_back({true, 1, p, p});
  }
  for (int64_t b : o.batches)
    for (int64_t c : o.contexts) {
      DI_CHECK(b >= 1 && c >= 1) << "bench: batch and context must be >= 1, got " << b << ", " << c;
      shapes.push_back({false, b, 1, c});
    }
  return shapes;
}

std::vector<BenchRow> run_shapes(BenchTarget& target, SliceState& slice, const std::string& model,
                                 const std::vector<StepShape>& shapes,
                                 const std::function<StepCost(const StepShape&)>& cost, const BenchOptions& o) {
  std::vector<BenchRow> rows;
  for (const StepShape& s : shapes) {
    slice.prepare(s);
    BenchRow r;
    r.model = model;
    r.shape = s;
    r.cost = cost(s);
    r.ms = target.time_ms([&] { slice.step(s, false); }, o.warmup, o.iters);
    target.profile_begin();
    slice.step(s, true);
    r.segment_ms = target.profile_end(kSegCount);
    r.counts = slice.counts();
    if (!s.prefill && o.graphs) graph_step(target, slice, s, o, r);
    rows.push_back(r);
  }
  return rows;
}

std::vector<BenchRow> run_slice(BenchTarget& target, const BenchModel& m, const BenchOptions& o) {
  const std::vector<StepShape> shapes = bench_shapes(o);
  Slice slice(target, m, shapes, o.seed);
  return run_shapes(
      target, slice, m.name, shapes, [&m](const StepShape& s) { return count_step(m, s); }, o);
}

std::string format_ceilings(const Ceilings& c) {
  std::string out = "ceilings (measured in this run): " + c.copy_label + " " + human(c.copy_bytes_per_s, "B/s") + "; " +
                    c.gemm_label + " " + human(c.gemm_flops_per_s, "FLOP/s");
  if (c.gemm2_flops_per_s > 0) out += "; " + c.gemm2_label + " " + human(c.gemm2_flops_per_s, "FLOP/s");
  return out + "\n";
}

std::string format_table(const std::vector<BenchRow>& rows, const Ceilings& c) {
  std::string out =
      "model       phase    batch  context  tokens/s      step ms   FLOP/step   bytes/step  FLOP/s      B/s        "
      "of-gemm  of-copy  bound\n";
  for (const BenchRow& r : rows) {
    const double s = r.ms / 1000.0;
    const double fr = s > 0 ? r.cost.flops / s : 0, br = s > 0 ? r.cost.bytes() / s : 0;
    const double gemm = c.gemm_flops_per_s > 0 ? fr / c.gemm_flops_per_s : 0;
    const double copy = c.copy_bytes_per_s > 0 ? br / c.copy_bytes_per_s : 0;
    // The floor: the larger of FLOPs at the GEMM rate and bytes at the copy rate.
    const double t_flop = c.gemm_flops_per_s > 0 ? r.cost.flops / c.gemm_flops_per_s : 0;
    const double t_byte = c.copy_bytes_per_s > 0 ? r.cost.bytes() / c.copy_bytes_per_s : 0;
    char buf[320];
    std::snprintf(buf, sizeof buf,
                  "%-11s %-8s %5lld %8lld  %-12s %9.3f  %-10s  %-10s  %-10s  %-9s  %6.1f%%  %6.1f%%  %s %.1fx floor\n",
                  r.model.c_str(), r.shape.prefill ? "prefill" : "decode", static_cast<long long>(r.shape.seqs),
                  static_cast<long long>(r.shape.context), human(r.tokens_per_s(), "").c_str(), r.ms,
                  human(r.cost.flops, "").c_str(), human(r.cost.bytes(), "B").c_str(), human(fr, "").c_str(),
                  human(br, "").c_str(), 100 * gemm, 100 * copy, t_flop >= t_byte ? "flop" : "byte",
                  std::max(t_flop, t_byte) > 0 ? s / std::max(t_flop, t_byte) : 0.0);
    out += buf;
  }
  return out;
}

}  // namespace deepinfer::bench
