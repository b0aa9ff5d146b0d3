#include "deepinfer/bench/bench_model.h"

#include <algorithm>
#include <cmath>

#include "deepinfer/core/error.h"
#include "deepinfer/ops/kv_record.h"

namespace deepinfer::bench {

const char* attn_kind_name(AttnKind k) {
  switch (k) {
    case AttnKind::kSwa:
      return "swa";
    case AttnKind::kIndexed:
      return "indexed";
    case AttnKind::kReuse:
      return "reuse";
    case AttnKind::kAllSeen:
      return "all-seen";
  }
  return "?";
}

namespace {
void add_layers(BenchModel& m, LayerSpec spec, int count) {
  for (int i = 0; i < count; ++i) m.layers.push_back(spec);
}
}  // namespace

BenchModel v4_flash_slice(int per_kind) {
  DI_CHECK(per_kind >= 1) << "bench: layers per kind must be >= 1, got " << per_kind;
  BenchModel m;
  m.name = "V4-Flash";
  m.hidden = 4096;
  m.heads = 64;
  m.head_dim = 512;
  m.rope_dim = 64;
  m.q_lora = 1024;
  m.o_groups = 8;
  m.o_lora = 1024;
  m.window = 128;
  m.index_heads = 64;
  m.index_dim = 128;
  m.index_topk = 512;
  m.experts = 256;
  m.topk = 6;
  m.moe_inter = 2048;
  m.dense_block = 128;
  m.weight_before_w2 = false;
  m.q_head_norm = true;  // the engine's V4 attention normalises each query head
  add_layers(m, {AttnKind::kSwa, 0}, per_kind);
  add_layers(m, {AttnKind::kIndexed, 4}, per_kind);
  add_layers(m, {AttnKind::kAllSeen, 128}, per_kind);
  return m;
}

BenchModel v41_flash_slice(int per_kind) {
  DI_CHECK(per_kind >= 1) << "bench: layers per kind must be >= 1, got " << per_kind;
  BenchModel m;
  m.name = "V4.1-Flash";
  m.hidden = 5120;
  m.heads = 64;
  m.head_dim = 512;
  m.rope_dim = 64;
  m.q_lora = 1280;
  m.o_groups = 8;
  m.o_lora = 1024;
  m.window = 128;
  m.index_heads = 32;
  m.index_dim = 128;
  m.index_topk = 512;
  m.experts = 384;
  m.topk = 6;
  m.moe_inter = 2304;
  m.dense_block = 32;
  m.weight_before_w2 = true;
  add_layers(m, {AttnKind::kSwa, 0}, per_kind);
  add_layers(m, {AttnKind::kIndexed, 2}, per_kind);
  add_layers(m, {AttnKind::kReuse, 2}, per_kind);
  add_layers(m, {AttnKind::kIndexed, 1}, per_kind);
  add_layers(m, {AttnKind::kReuse, 1}, per_kind);
  m.layers.front().engram = true;  // one Engram layer (the checkpoint has 2 of 43)
  return m;
}

BenchModel tiny_slice() {
  BenchModel m;
  m.name = "tiny";
  m.hidden = 64;
  m.heads = 4;
  m.head_dim = 32;
  m.rope_dim = 8;
  m.q_lora = 32;
  m.o_groups = 2;
  m.o_lora = 16;
  m.window = 8;
  m.index_heads = 2;
  m.index_dim = 16;
  m.index_topk = 4;
  m.experts = 4;
  m.topk = 2;
  m.moe_inter = 32;
  m.dense_block = 32;
  m.engram_ngram = 3;
  m.engram_heads = 2;
  m.engram_dim = 16;
  m.engram_table_rows = 700;
  m.engram_vocab = 64;
  m.layers = {{AttnKind::kSwa, 0, true}, {AttnKind::kIndexed, 2}, {AttnKind::kReuse, 2}, {AttnKind::kAllSeen, 4}};
  return m;
}

FusedRows fuse_rows(const std::vector<int64_t>& parts, int block) {
  DI_CHECK(!parts.empty() && block >= 1) << "bench: fusing needs parts and a block >= 1";
  FusedRows f;
  for (size_t i = 0; i < parts.size(); ++i) {
    DI_CHECK(parts[i] >= 1) << "bench: a fused part needs rows >= 1, got " << parts[i];
    f.offset.push_back(f.rows);
    const bool last = i + 1 == parts.size();
    const int64_t rows = last ? parts[i] : (parts[i] + block - 1) / block * block;
    f.pad += rows - parts[i];
    f.rows += rows;
  }
  return f;
}

FusedRows fused_input_rows(const BenchModel& m, AttnKind kind) {
  return kind == AttnKind::kIndexed ? fuse_rows({m.q_lora, m.head_dim, m.index_heads}, m.dense_block)
                                    : fuse_rows({m.q_lora, m.head_dim}, m.dense_block);
}

FusedRows fused_q_rows(const BenchModel& m, AttnKind kind) {
  const int64_t hhd = m.heads * m.head_dim;
  return kind == AttnKind::kIndexed ? fuse_rows({hhd, m.index_heads * m.index_dim}, m.dense_block)
                                    : fuse_rows({hhd}, m.dense_block);
}

double fp8_block_bytes(int64_t n, int64_t k, int block) {
  const int64_t bn = (n + block - 1) / block, bk = (k + block - 1) / block;
  return static_cast<double>(n) * k + static_cast<double>(bn) * bk;
}
double mxfp4_bytes(int64_t n, int64_t k) { return static_cast<double>(n) * k / 2 + static_cast<double>(n) * k / 32; }

const char* bench_format_name(BenchFormat f) {
  switch (f) {
    case BenchFormat::kFP8Block:
      return "fp8-block";
    case BenchFormat::kMXFP4:
      return "mxfp4";
    case BenchFormat::kBF16:
      return "bf16";
    case BenchFormat::kF32:
      return "f32";
  }
  return "?";
}

double format_bytes(BenchFormat f, int64_t n, int64_t k, int block) {
  switch (f) {
    case BenchFormat::kFP8Block:
      return fp8_block_bytes(n, k, block);
    case BenchFormat::kMXFP4:
      return mxfp4_bytes(n, k);
    case BenchFormat::kBF16:
      return 2.0 * static_cast<double>(n) * k;
    case BenchFormat::kF32:
      return 4.0 * static_cast<double>(n) * k;
  }
  return 0;
}

double expected_distinct_experts(int64_t experts, int64_t topk, int64_t tokens) {
  if (experts <= 0) return 0;
  const double miss = 1.0 - static_cast<double>(topk) / static_cast<double>(experts);
  return static_cast<double>(experts) * (1.0 - std::pow(miss, static_cast<double>(tokens)));
}

int64_t visible_entries(int64_t pos, int64_t ratio) { return ratio > 0 ? (pos + 1) / ratio : 0; }

int64_t engram_cols(const BenchModel& m) { return (m.engram_ngram - 1) * m.engram_heads; }

int64_t max_cache_blocks(const std::vector<StepShape>& shapes) {
  int64_t blocks = 1;
  for (const StepShape& s : shapes)
    blocks = std::max(blocks, s.seqs * ((s.context + kBenchCacheBlock - 1) / kBenchCacheBlock));
  return blocks;
}

namespace {

// The dense projections of a layer as the slice fuses them (fused_input_rows / fused_q_rows; the indexer's wproj and
// wq_idx ride along on an indexed layer): the same bytes as the separate weights unless a part needs padding.
double projection_bytes(const BenchModel& m, AttnKind kind) {
  const int64_t d = m.hidden, hhd = m.heads * m.head_dim, g = m.o_groups;
  const int b = m.dense_block;
  return fp8_block_bytes(fused_input_rows(m, kind).rows, d, b) +
         fp8_block_bytes(fused_q_rows(m, kind).rows, m.q_lora, b) + g * fp8_block_bytes(m.o_lora, hhd / g, b) +
         fp8_block_bytes(d, g * m.o_lora, b);
}

// Engram's weights a step reads whole: the FP8 wkv [K (hc·D) | V (D)] over the rows' concatenation and the gate's
// f32 [hc, D].
double engram_weight_bytes(const BenchModel& m) {
  return fp8_block_bytes((m.hc + 1) * m.hidden, engram_cols(m) * m.engram_dim, m.dense_block) + 4.0 * m.hc * m.hidden;
}

double shared_expert_bytes(const BenchModel& m) {
  const int b = m.dense_block;
  return m.shared_experts * (2 * fp8_block_bytes(m.moe_inter, m.hidden, b) + fp8_block_bytes(m.hidden, m.moe_inter, b));
}

// Bytes of a cached row of `width` values (of record kind `kind`) where the paged calls read it: f32, bf16 or a record.
double paged_row_bytes(const BenchModel& m, FakeQuantKind kind, int64_t width) {
  return m.kv_records ? static_cast<double>(kv_record_bytes(kind, width))
                      : static_cast<double>(m.kv_value_bytes) * width;
}
// Bytes the bench stores such a row in: its f32 pool, and the copy the paged calls read unless that is the f32 pool.
double stored_row_bytes(const BenchModel& m, FakeQuantKind kind, int64_t width) {
  return 4.0 * width + (m.kv_records || m.kv_value_bytes != 4 ? paged_row_bytes(m, kind, width) : 0.0);
}

}  // namespace

double layer_stored_bytes(const BenchModel& m, const LayerSpec& l, int64_t max_blocks) {
  const int64_t d = m.hidden;
  double bytes = projection_bytes(m, l.kind);
  const double fn_rows = static_cast<double>((2 + m.hc) * m.hc);
  bytes += 2 * 4 * (fn_rows * m.hc * d + fn_rows + 3);  // mHC fn, base, scale at both sites
  bytes += 4.0 * m.experts * (d + 1);                   // router weight and bias
  bytes += m.experts * 3 * mxfp4_bytes(m.moe_inter, d) + shared_expert_bytes(m);
  if (l.ratio > 0) {
    const double entries = static_cast<double>(max_blocks) * (kBenchCacheBlock / l.ratio);
    // A reuse layer reads its source's entries.
    if (l.kind != AttnKind::kReuse) bytes += entries * stored_row_bytes(m, kEntryRecord, m.head_dim);
    if (l.kind == AttnKind::kIndexed) bytes += entries * stored_row_bytes(m, kIndexKeyRecord, m.index_dim);
  }
  if (l.engram) bytes += 4.0 * m.engram_table_rows * m.engram_dim + engram_weight_bytes(m);
  return bytes;
}

int fit_layers_per_kind(const std::function<BenchModel(int)>& make, double budget, int64_t max_blocks) {
  const auto stored = [&](const BenchModel& m) {
    double bytes = stored_row_bytes(m, kWindowRecord, m.head_dim) * max_blocks * kBenchCacheBlock;  // window pool
    for (const LayerSpec& l : m.layers) bytes += layer_stored_bytes(m, l, max_blocks);
    return bytes;
  };
  const BenchModel one = make(1);
  const double first = stored(one);
  DI_CHECK_CODE(first <= budget, ErrorCode::kResourceExhausted)
      << "bench --fill-device: one layer of each kind of " << one.name << " needs " << first / 1e9 << " GB, "
      << budget / 1e9 << " GB are available";
  // Each further layer of every kind adds the same bytes (Engram stays on the first layer).
  const double per_set = stored(make(2)) - first;
  DI_CHECK_INTERNAL(per_set > 0) << "bench: a second layer of each kind adds no bytes";
  return 1 + static_cast<int>((budget - first) / per_set);
}

StepCost count_step(const BenchModel& m, const StepShape& s) {
  DI_CHECK(s.seqs >= 1 && s.tokens >= 1 && s.context >= s.tokens)
      << "bench: a step needs seqs >= 1, tokens >= 1 and context >= tokens (got " << s.seqs << ", " << s.tokens << ", "
      << s.context << ")";
  const double t = static_cast<double>(s.seqs * s.tokens);
  const int64_t d = m.hidden, hhd = m.heads * m.head_dim, g = m.o_groups;
  const int64_t first_pos = s.context - s.tokens, last_pos = s.context - 1;
  StepCost c;
  for (const LayerSpec& l : m.layers) {
    // Engram: the rows its hash ids pick (f32, as the table is kept; at most the table), the FP8 wkv projection
    // [K (hc·D) | V (D)] of their concatenation, and the gate's f32 weight [hc, D] (its dot products are elementwise).
    if (l.engram) {
      const int64_t cols = engram_cols(m), width = cols * m.engram_dim;
      c.flops += 2 * t * static_cast<double>((m.hc + 1) * d * width);
      c.weight_bytes += engram_weight_bytes(m);
      c.weight_bytes += 4.0 * m.engram_dim * std::min(t * cols, static_cast<double>(m.engram_table_rows));
    }
    // Dense projections (FP8 block-scaled). The weights as the slice fuses them (fused_input_rows /
    // fused_q_rows; the indexer's wproj and wq_idx ride along on an indexed layer): the same bytes as the separate
    // weights unless a part needs padding.
    c.flops +=
        2 * t * static_cast<double>(m.q_lora * d + hhd * m.q_lora + m.head_dim * d + m.o_lora * hhd + d * g * m.o_lora);
    c.weight_bytes += projection_bytes(m, l.kind);
    // mHC coefficients at both sites: fn [(2+hc)·hc, hc·D] f32.
    const double fn_rows = static_cast<double>((2 + m.hc) * m.hc), fn_cols = static_cast<double>(m.hc * d);
    c.flops += 2 * 2 * t * fn_rows * fn_cols;
    c.weight_bytes += 2 * 4 * fn_rows * fn_cols;
    // Indexer: its q projection and head weights, then one score per (query, head, visible entry).
    if (l.kind == AttnKind::kIndexed) {
      c.flops += 2 * t * static_cast<double>(m.index_heads * m.index_dim * m.q_lora + m.index_heads * d);
      for (int64_t p = first_pos; p <= last_pos; ++p)
        c.flops += s.seqs * 2.0 * m.index_heads * m.index_dim * visible_entries(p, l.ratio);
      // Decode reads the paged keys, prefill contiguous f32 ones.
      const double key_bytes = s.tokens == 1 ? paged_row_bytes(m, kIndexKeyRecord, m.index_dim) : 4.0 * m.index_dim;
      c.cache_bytes += s.seqs * key_bytes * visible_entries(last_pos, l.ratio);
    }
    // Attention: QK and PV over the keys each query sees.
    for (int64_t p = first_pos; p <= last_pos; ++p) {
      int64_t keys = std::min(m.window, p + 1);
      const int64_t vis = visible_entries(p, l.ratio);
      if (l.kind == AttnKind::kIndexed || l.kind == AttnKind::kReuse) keys += std::min(m.index_topk, vis);
      if (l.kind == AttnKind::kAllSeen) keys += vis;
      c.flops += s.seqs * 4.0 * static_cast<double>(hhd) * keys;
    }
    const int64_t window_rows = std::min(s.context, m.window + s.tokens - 1);
    const int64_t vis_last = visible_entries(last_pos, l.ratio);
    int64_t entry_rows = 0;
    if (l.kind == AttnKind::kIndexed || l.kind == AttnKind::kReuse)
      entry_rows = std::min(vis_last, m.index_topk * s.tokens);
    if (l.kind == AttnKind::kAllSeen) entry_rows = vis_last;
    const double read = s.seqs * (window_rows * paged_row_bytes(m, kWindowRecord, m.head_dim) +
                                  entry_rows * paged_row_bytes(m, kEntryRecord, m.head_dim));
    c.cache_bytes += read;
    c.attention_bytes += read;
    // Router (f32 [E, D]) and experts: k routed MXFP4 + the shared FP8 expert per token.
    c.flops += 2 * t * static_cast<double>(m.experts * d);
    c.weight_bytes += 4.0 * m.experts * d;
    c.flops += 2 * t * static_cast<double>(m.topk + m.shared_experts) * 3 * d * m.moe_inter;
    c.weight_bytes += expected_distinct_experts(m.experts, m.topk, s.seqs * s.tokens) * 3 * mxfp4_bytes(m.moe_inter, d);
    c.weight_bytes += shared_expert_bytes(m);
  }
  return c;
}

}  // namespace deepinfer::bench
