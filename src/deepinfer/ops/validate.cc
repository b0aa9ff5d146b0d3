// Boundary checks of every op's params (ops.h): dtypes, shapes, contiguity, consistency between fields.
// Backends call validate() once on entry and then trust the params.
#include <string>

#include "deepinfer/core/error.h"
#include "deepinfer/ops/kv_record.h"
#include "deepinfer/ops/ops.h"

namespace deepinfer {
namespace {

bool present(const Tensor& t) { return t.data() != nullptr || (t.rank() > 0 && t.numel() == 0); }

// Checks a required tensor: dtype, rank, contiguity; dims < 0 in `shape` are wildcards.
void expect(const char* op, const char* field, const Tensor& t, DType dtype, const Shape& shape) {
  DI_CHECK(present(t)) << op << ": '" << field << "' is required";
  DI_CHECK(t.dtype() == dtype) << op << ": '" << field << "' must be " << dtype_name(dtype) << ", got " << t.str();
  DI_CHECK(t.rank() == static_cast<int>(shape.size()))
      << op << ": '" << field << "' must have rank " << shape.size() << ", got " << t.str();
  for (size_t i = 0; i < shape.size(); ++i)
    DI_CHECK(shape[i] < 0 || t.shape()[i] == shape[i])
        << op << ": '" << field << "' must be " << shape_str(shape) << " (-1 = any), got " << t.str();
  DI_CHECK(t.is_contiguous()) << op << ": '" << field << "' must be contiguous";
  DI_CHECK(t.device().kind == DeviceKind::kCPU || t.device().kind == DeviceKind::kCUDA) << op << ": bad device";
}

// A paged cache pool of rows of `width` values: dtype (which the caller's other pools may fix) f32 or bf16 [-1, width],
// or u8 [-1, record bytes] of quantized records of kind `record` (--kv-cache-dtype fp8).
void expect_pool(const char* op, const char* field, const Tensor& t, DType dtype, int64_t width, FakeQuantKind record) {
  DI_CHECK(dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kU8)
      << op << ": '" << field << "' must be f32, bf16 or u8 records (--kv-cache-dtype), got " << t.str();
  if (dtype != DType::kU8) return expect(op, field, t, dtype, {-1, width});
  DI_CHECK(kv_record_kind(record) && width % fake_quant_block_len(record) == 0)
      << op << ": '" << field << "': no quantized record of " << width << " values";
  expect(op, field, t, dtype, {-1, kv_record_bytes(record, width)});
}

bool is_int_index(DType t) { return t == DType::kI32 || t == DType::kI64; }

// Whether the byte ranges of two contiguous tensors intersect (the fused ops write one while reading the other).
bool overlap(const Tensor& a, const Tensor& b) {
  if (a.data() == nullptr || b.data() == nullptr || a.nbytes() == 0 || b.nbytes() == 0) return false;
  const auto* a0 = static_cast<const char*>(a.data());
  const auto* b0 = static_cast<const char*>(b.data());
  return a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}

}  // namespace

void validate(const DequantizeParams& p) {
  const char* op = "dequantize";
  DI_CHECK(present(p.weight) && p.weight.rank() == 2) << op << ": 'weight' must be a matrix, got " << p.weight.str();
  const int64_t n = p.out.rank() == 2 ? p.out.dim(0) : -1, k = p.out.rank() == 2 ? p.out.dim(1) : -1;
  expect(op, "out", p.out, DType::kF32, {-1, -1});
  switch (p.format) {
    case QuantFormat::kFloat:
      DI_CHECK(p.weight.dtype() == DType::kF32 || p.weight.dtype() == DType::kBF16 || p.weight.dtype() == DType::kF16)
          << op << ": float weight must be F32/BF16/F16, got " << p.weight.str();
      DI_CHECK(p.weight.shape() == p.out.shape()) << op << ": weight " << p.weight.str() << " vs out " << p.out.str();
      break;
    case QuantFormat::kFP8Block:
      DI_CHECK(p.block_n > 0 && p.block_k > 0) << op << ": block sizes must be positive";
      expect(op, "weight", p.weight, DType::kF8E4M3, {n, k});
      DI_CHECK(p.scale.dtype() == DType::kE8M0 || p.scale.dtype() == DType::kF32) << op << ": scale dtype";
      expect(op, "scale", p.scale, p.scale.dtype(), {(n + p.block_n - 1) / p.block_n, (k + p.block_k - 1) / p.block_k});
      break;
    case QuantFormat::kMXFP4:
      DI_CHECK(k % 32 == 0) << op << ": MXFP4 needs K % 32 == 0, got " << k;
      DI_CHECK(p.weight.dtype() == DType::kI8 || p.weight.dtype() == DType::kU8) << op << ": MXFP4 weight is I8/U8";
      expect(op, "weight", p.weight, p.weight.dtype(), {n, k / 2});
      expect(op, "scale", p.scale, DType::kE8M0, {n, k / 32});
      break;
    case QuantFormat::kFP8Row32:
      expect(op, "weight", p.weight, DType::kF8E4M3, {n, k});
      DI_CHECK(p.scale.dtype() == DType::kE8M0 || p.scale.dtype() == DType::kF32) << op << ": scale dtype";
      expect(op, "scale", p.scale, p.scale.dtype(), {n, (k + 31) / 32});
      break;
  }
}

void validate(const LinearParams& p) {
  const char* op = "linear";
  expect(op, "in", p.in, DType::kF32, {-1, -1});
  expect(op, "weight", p.weight, DType::kF32, {-1, p.in.dim(1)});
  expect(op, "out", p.out, DType::kF32, {p.in.dim(0), p.weight.dim(0)});
  DI_CHECK(p.out.data() != p.in.data() || p.out.numel() == 0) << op << ": out must not alias in";
}

void validate(const EmbeddingParams& p) {
  const char* op = "embedding";
  expect(op, "table", p.table, DType::kF32, {-1, -1});
  expect(op, "ids", p.ids, DType::kI64, {-1});
  expect(op, "out", p.out, DType::kF32, {p.ids.dim(0), p.table.dim(1)});
}

void validate(const RmsNormParams& p) {
  const char* op = "rms_norm";
  expect(op, "in", p.in, DType::kF32, {-1, -1});
  expect(op, "out", p.out, DType::kF32, p.in.shape());
  if (present(p.weight)) expect(op, "weight", p.weight, DType::kF32, {p.in.dim(1)});
  DI_CHECK(p.eps > 0) << op << ": eps must be positive";
}

void validate(const RopeParams& p) {
  const char* op = "rope";
  expect(op, "x", p.x, DType::kF32, {-1, -1, -1});
  expect(op, "positions", p.positions, DType::kI64, {p.x.dim(0)});
  expect(op, "inv_freq", p.inv_freq, DType::kF32, {-1});
  DI_CHECK(2 * p.inv_freq.dim(0) <= p.x.dim(2)) << op << ": rope dim " << 2 * p.inv_freq.dim(0) << " > head dim";
}

void validate(const FakeQuantParams& p) { expect("fake_quant", "x", p.x, DType::kF32, {-1, -1}); }

void validate(const HcMixParams& p) {
  const char* op = "hc_mix";
  expect(op, "streams", p.streams, DType::kF32, {-1, -1, -1});
  const int64_t t = p.streams.dim(0), hc = p.streams.dim(1), d = p.streams.dim(2), mix = (2 + hc) * hc;
  expect(op, "fn", p.fn, DType::kF32, {mix, hc * d});
  expect(op, "base", p.base, DType::kF32, {mix});
  expect(op, "scale", p.scale, DType::kF32, {3});
  expect(op, "pre", p.pre, DType::kF32, {t, hc});
  expect(op, "post", p.post, DType::kF32, {t, hc});
  expect(op, "comb", p.comb, DType::kF32, {t, hc, hc});
  DI_CHECK(p.sinkhorn_iters >= 1) << op << ": sinkhorn_iters must be >= 1";
}

void validate(const HcHeadParams& p) {
  const char* op = "hc_head";
  expect(op, "streams", p.streams, DType::kF32, {-1, -1, -1});
  const int64_t t = p.streams.dim(0), hc = p.streams.dim(1), d = p.streams.dim(2);
  expect(op, "fn", p.fn, DType::kF32, {hc, hc * d});
  expect(op, "base", p.base, DType::kF32, {hc});
  expect(op, "scale", p.scale, DType::kF32, {1});
  expect(op, "pre", p.pre, DType::kF32, {t, hc});
}

void validate(const HcCollapseParams& p) {
  const char* op = "hc_collapse";
  expect(op, "streams", p.streams, DType::kF32, {-1, -1, -1});
  expect(op, "pre", p.pre, DType::kF32, {p.streams.dim(0), p.streams.dim(1)});
  expect(op, "out", p.out, DType::kF32, {p.streams.dim(0), p.streams.dim(2)});
}

void validate(const HcExpandParams& p) {
  const char* op = "hc_expand";
  expect(op, "streams", p.streams, DType::kF32, {-1, -1, -1});
  const int64_t t = p.streams.dim(0), hc = p.streams.dim(1);
  expect(op, "x", p.x, DType::kF32, {t, p.streams.dim(2)});
  expect(op, "post", p.post, DType::kF32, {t, hc});
  expect(op, "comb", p.comb, DType::kF32, {t, hc, hc});
}

void validate(const CompressPoolParams& p) {
  const char* op = "compress_pool";
  expect(op, "kv", p.kv, DType::kF32, {-1, -1, -1});
  expect(op, "gate", p.gate, DType::kF32, p.kv.shape());
  expect(op, "out", p.out, DType::kF32, {p.kv.dim(0), p.kv.dim(2)});
}

void validate(const IndexerScoreParams& p) {
  const char* op = "indexer_scores";
  expect(op, "q", p.q, DType::kF32, {-1, -1, -1});
  const int64_t t = p.q.dim(0), ih = p.q.dim(1);
  expect(op, "keys", p.keys, DType::kF32, {-1, p.q.dim(2)});
  expect(op, "weights", p.weights, DType::kF32, {t, ih});
  expect(op, "positions", p.positions, DType::kI64, {t});
  expect(op, "out", p.out, DType::kF32, {t, p.keys.dim(0)});
  DI_CHECK(p.ratio >= 1) << op << ": ratio must be >= 1";
}

void validate(const PagedIndexerScoreParams& p) {
  const char* op = "paged_indexer_scores";
  expect(op, "q", p.q, DType::kF32, {-1, -1, -1});
  const int64_t t = p.q.dim(0), ih = p.q.dim(1);
  expect(op, "weights", p.weights, DType::kF32, {t, ih});
  expect(op, "positions", p.positions, DType::kI64, {t});
  expect(op, "q_seq", p.q_seq, DType::kI32, {t});
  expect(op, "n_entries", p.n_entries, DType::kI64, {t});
  expect(op, "block_tables", p.block_tables, DType::kI32, {-1, -1});
  expect_pool(op, "key_pool", p.key_pool, p.key_pool.dtype(), p.q.dim(2), kIndexKeyRecord);
  expect(op, "out", p.out, DType::kF32, {t, -1});
  DI_CHECK(p.ratio >= 1) << op << ": ratio must be >= 1";
  DI_CHECK(p.block_size >= 1) << op << ": block_size must be >= 1, got " << p.block_size;
  DI_CHECK(p.key_ratio >= 1 && p.block_size % p.key_ratio == 0)
      << op << ": key_ratio " << p.key_ratio << " must be >= 1 and divide block_size " << p.block_size;
}

void validate(const CandidateBlocksParams& p) {
  const char* op = "candidate_blocks";
  expect(op, "scores", p.scores, DType::kF32, {-1, -1});
  expect(op, "positions", p.positions, DType::kI64, {p.scores.dim(0)});
  expect(op, "keep", p.keep, DType::kU8, p.scores.shape());
  DI_CHECK(p.ratio >= 1 && p.topk_blocks >= 1 && p.block_size >= 1) << op << ": ratio/topk_blocks/block_size >= 1";
}

void validate(const TopKMaskParams& p) {
  const char* op = "topk_mask";
  expect(op, "scores", p.scores, DType::kF32, {-1, -1});
  if (present(p.allowed)) expect(op, "allowed", p.allowed, DType::kU8, p.scores.shape());
  expect(op, "out", p.out, DType::kU8, p.scores.shape());
  DI_CHECK(p.k >= 0) << op << ": k must be >= 0";
}

void validate(const SinkAttentionParams& p) {
  const char* op = "sink_attention";
  expect(op, "q", p.q, DType::kF32, {-1, -1, -1});
  const int64_t t = p.q.dim(0), h = p.q.dim(1), hd = p.q.dim(2);
  expect(op, "q_positions", p.q_positions, DType::kI64, {t});
  expect(op, "window_kv", p.window_kv, DType::kF32, {-1, hd});
  expect(op, "kv_positions", p.kv_positions, DType::kI64, {p.window_kv.dim(0)});
  if (present(p.compressed)) {
    expect(op, "compressed", p.compressed, DType::kF32, {-1, hd});
    if (present(p.comp_mask)) expect(op, "comp_mask", p.comp_mask, DType::kU8, {t, p.compressed.dim(0)});
  } else {
    DI_CHECK(!present(p.comp_mask)) << op << ": comp_mask without compressed entries";
  }
  expect(op, "sinks", p.sinks, DType::kF32, {h});
  expect(op, "out", p.out, DType::kF32, {t, h, hd});
  DI_CHECK(p.window >= 1) << op << ": window must be >= 1";
}

void validate(const PagedSinkAttentionParams& p) {
  const char* op = "paged_sink_attention";
  expect(op, "q", p.q, DType::kF32, {-1, -1, -1});
  const int64_t t = p.q.dim(0), h = p.q.dim(1), hd = p.q.dim(2);
  expect(op, "q_positions", p.q_positions, DType::kI64, {t});
  expect(op, "q_seq", p.q_seq, DType::kI32, {t});
  expect(op, "block_tables", p.block_tables, DType::kI32, {-1, -1});
  const int64_t b = p.block_tables.dim(0);
  expect_pool(op, "window_pool", p.window_pool, p.window_pool.dtype(), hd, kWindowRecord);
  expect(op, "window_begin", p.window_begin, DType::kI64, {b});
  if (present(p.comp_pool)) {
    // One element type for both pools (a model keeps all its caches in one dtype).
    expect_pool(op, "comp_pool", p.comp_pool, p.window_pool.dtype(), hd, kEntryRecord);
    DI_CHECK(present(p.comp_idx) != present(p.comp_mask))
        << op << ": comp_pool needs exactly one of comp_idx / comp_mask";
    if (present(p.comp_idx)) expect(op, "comp_idx", p.comp_idx, DType::kI32, {t, -1});
    if (present(p.comp_mask)) expect(op, "comp_mask", p.comp_mask, DType::kU8, {t, -1});
  } else {
    DI_CHECK(!present(p.comp_idx) && !present(p.comp_mask)) << op << ": comp_idx / comp_mask without comp_pool";
  }
  expect(op, "sinks", p.sinks, DType::kF32, {h});
  expect(op, "out", p.out, DType::kF32, {t, h, hd});
  DI_CHECK(p.window >= 1) << op << ": window must be >= 1";
  DI_CHECK(p.block_size >= 1) << op << ": block_size must be >= 1, got " << p.block_size;
  DI_CHECK(p.comp_ratio >= 1 && p.block_size % p.comp_ratio == 0)
      << op << ": comp_ratio " << p.comp_ratio << " must be >= 1 and divide block_size " << p.block_size;
}

void validate(const RouterParams& p) {
  const char* op = "router";
  expect(op, "x", p.x, DType::kF32, {-1, -1});
  const int64_t t = p.x.dim(0);
  expect(op, "weight", p.weight, DType::kF32, {-1, p.x.dim(1)});
  const int64_t e = p.weight.dim(0);
  expect(op, "weights", p.weights, DType::kF32, {t, -1});
  const int64_t k = p.weights.dim(1);
  expect(op, "indices", p.indices, DType::kI32, {t, k});
  DI_CHECK(k >= 1 && k <= e) << op << ": top-k " << k << " must be in [1, " << e << "]";
  if (present(p.bias)) expect(op, "bias", p.bias, DType::kF32, {e});
  if (present(p.hash_table)) {
    DI_CHECK(is_int_index(p.hash_table.dtype())) << op << ": hash_table must be I32/I64";
    expect(op, "hash_table", p.hash_table, p.hash_table.dtype(), {-1, k});
    expect(op, "token_ids", p.token_ids, DType::kI64, {t});
  }
  DI_CHECK(p.gate_temp > 0) << op << ": gate_temp must be positive";
  DI_CHECK(p.n_group >= 1 && e % p.n_group == 0) << op << ": n_group " << p.n_group << " must divide " << e;
  DI_CHECK(p.topk_group >= 1 && p.topk_group <= p.n_group)
      << op << ": topk_group " << p.topk_group << " must be in [1, n_group]";
  DI_CHECK(p.n_group == 1 || k <= p.topk_group * (e / p.n_group))
      << op << ": top-k " << k << " exceeds the experts of the kept groups";
  DI_CHECK(p.n_group == 1 || p.group_score == GroupScore::kMax || e / p.n_group >= 2)
      << op << ": top-2 group scores need groups of at least 2 experts";
}

void validate(const MoeParams& p) {
  const char* op = "moe";
  expect(op, "x", p.x, DType::kF32, {-1, -1});
  const int64_t t = p.x.dim(0), d = p.x.dim(1);
  expect(op, "weights", p.weights, DType::kF32, {t, -1});
  expect(op, "indices", p.indices, DType::kI32, {t, p.weights.dim(1)});
  expect(op, "out", p.out, DType::kF32, {t, d});
  DI_CHECK(p.experts != nullptr && !p.experts->empty()) << op << ": experts are required";
  auto check_expert = [&](const ExpertWeights& w) {
    expect(op, "w1", w.w1, DType::kF32, {-1, d});
    expect(op, "w3", w.w3, DType::kF32, w.w1.shape());
    expect(op, "w2", w.w2, DType::kF32, {d, w.w1.dim(0)});
  };
  for (const auto& w : *p.experts) check_expert(w);
  if (p.shared) check_expert(*p.shared);
}

void validate(const EngramHashParams& p) {
  const char* op = "engram_hash";
  expect(op, "tokens", p.tokens, DType::kI64, {-1, -1});
  const int64_t n = p.tokens.dim(1);
  DI_CHECK(n >= 2) << op << ": at least a 2-gram";
  expect(op, "multipliers", p.multipliers, DType::kI64, {n});
  expect(op, "primes", p.primes, DType::kI64, {n - 1, -1});
  const int64_t cols = (n - 1) * p.primes.dim(1);
  expect(op, "offsets", p.offsets, DType::kI64, {cols});
  expect(op, "out", p.out, DType::kI64, {p.tokens.dim(0), cols});
}

void validate(const EngramGateParams& p) {
  const char* op = "engram_gate";
  expect(op, "streams", p.streams, DType::kF32, {-1, -1, -1});
  expect(op, "key", p.key, DType::kF32, p.streams.shape());
  expect(op, "value", p.value, DType::kF32, {p.streams.dim(0), p.streams.dim(2)});
  expect(op, "weight", p.weight, DType::kF32, {p.streams.dim(1), p.streams.dim(2)});
}

void validate(const MlaAttentionParams& p) {
  const char* op = "mla_attention";
  expect(op, "q", p.q, DType::kF32, {-1, -1, -1});
  const int64_t t = p.q.dim(0), h = p.q.dim(1), dr = p.rope_dim;
  DI_CHECK(dr > 0 && dr % 2 == 0 && dr < p.q.dim(2)) << op << ": rope_dim " << dr << " vs q " << p.q.str();
  const int64_t dn = p.q.dim(2) - dr;
  expect(op, "q_positions", p.q_positions, DType::kI64, {t});
  expect(op, "kv", p.kv, DType::kF32, {-1, -1});
  const int64_t s = p.kv.dim(0), r = p.kv.dim(1) - dr;
  DI_CHECK(r > 0) << op << ": kv rows " << p.kv.str() << " hold no latent beside " << dr << " rope channels";
  expect(op, "kv_positions", p.kv_positions, DType::kI64, {s});
  expect(op, "kv_b", p.kv_b, DType::kF32, {-1, r});
  DI_CHECK(p.kv_b.dim(0) % h == 0 && p.kv_b.dim(0) / h > dn)
      << op << ": kv_b " << p.kv_b.str() << " must be [H·(dn + dv), r] with H = " << h << ", dn = " << dn;
  expect(op, "out", p.out, DType::kF32, {t, h, p.kv_b.dim(0) / h - dn});
  DI_CHECK(p.scale > 0) << op << ": scale must be positive";
}

void validate(const PagedMlaAttentionParams& p) {
  const char* op = "paged_mla_attention";
  expect(op, "q", p.q, DType::kF32, {-1, -1, -1});
  const int64_t t = p.q.dim(0), h = p.q.dim(1), dr = p.rope_dim;
  DI_CHECK(dr > 0 && dr % 2 == 0 && dr < p.q.dim(2)) << op << ": rope_dim " << dr << " vs q " << p.q.str();
  const int64_t dn = p.q.dim(2) - dr;
  expect(op, "q_positions", p.q_positions, DType::kI64, {t});
  expect(op, "q_seq", p.q_seq, DType::kI32, {t});
  expect(op, "block_tables", p.block_tables, DType::kI32, {-1, -1});
  DI_CHECK(p.kv_pool.dtype() == DType::kF32 || p.kv_pool.dtype() == DType::kBF16)
      << op << ": kv_pool must be f32 or bf16 (--kv-cache-dtype), got " << p.kv_pool.str();
  expect(op, "kv_pool", p.kv_pool, p.kv_pool.dtype(), {-1, -1});
  const int64_t r = p.kv_pool.dim(1) - dr;
  DI_CHECK(r > 0) << op << ": kv_pool rows " << p.kv_pool.str() << " hold no latent beside " << dr << " rope channels";
  expect(op, "kv_b", p.kv_b, DType::kF32, {-1, r});
  DI_CHECK(p.kv_b.dim(0) % h == 0 && p.kv_b.dim(0) / h > dn)
      << op << ": kv_b " << p.kv_b.str() << " must be [H·(dn + dv), r] with H = " << h << ", dn = " << dn;
  expect(op, "out", p.out, DType::kF32, {t, h, p.kv_b.dim(0) / h - dn});
  DI_CHECK(p.block_size >= 1) << op << ": block_size must be >= 1, got " << p.block_size;
  DI_CHECK(p.scale > 0) << op << ": scale must be positive";
}

void validate(const ScatterRowsParams& p) {
  const char* op = "scatter_rows";
  expect(op, "src", p.src, DType::kF32, {-1, -1});
  expect(op, "index", p.index, DType::kI64, {p.src.dim(0)});
  expect_pool(op, "dst", p.dst, p.dst.dtype(), p.src.dim(1), p.record);
}

void validate(const HcCollapseNormParams& p) {
  const char* op = "hc_collapse_norm";
  expect(op, "streams", p.streams, DType::kF32, {-1, -1, -1});
  expect(op, "pre", p.pre, DType::kF32, {p.streams.dim(0), p.streams.dim(1)});
  expect(op, "out", p.out, DType::kF32, {p.streams.dim(0), p.streams.dim(2)});
  if (present(p.weight)) expect(op, "weight", p.weight, DType::kF32, {p.streams.dim(2)});
  DI_CHECK(!overlap(p.out, p.streams) && !overlap(p.out, p.pre)) << op << ": 'out' must not overlap 'streams' or 'pre'";
  DI_CHECK(p.eps > 0) << op << ": eps must be positive";
}

void validate(const HcExpandMixParams& p) {
  validate(p.expand);
  validate(p.mix);
  DI_CHECK(p.mix.streams.data() == p.expand.streams.data() && p.mix.streams.shape() == p.expand.streams.shape())
      << "hc_expand_mix: 'mix.streams' must be 'expand.streams'";
  for (const Tensor* out : {&p.mix.pre, &p.mix.post, &p.mix.comb})
    DI_CHECK(!overlap(*out, p.expand.streams) && !overlap(*out, p.expand.x))
        << "hc_expand_mix: the mix's outputs must not overlap the streams or the expand's x";
}

void validate(const GroupedQuantLinearParams& p) {
  const char* op = "grouped_linear_quant";
  const QuantMatrix& w = p.weight;
  DI_CHECK(w.format != QuantFormat::kFloat) << op << ": the weight must be in a block format";
  DI_CHECK(present(w.weight) && w.weight.rank() == 2 && w.weight.is_contiguous())
      << op << ": 'weight' must be a contiguous matrix, got " << w.weight.str();
  DI_CHECK(p.groups >= 1 && w.rows() % p.groups == 0)
      << op << ": " << w.rows() << " weight rows do not split into " << p.groups << " groups";
  const int64_t n = w.rows() / p.groups, k = w.cols();
  DI_CHECK(w.format != QuantFormat::kFP8Block || p.groups == 1 || n % w.block_n == 0)
      << op << ": groups of " << n << " rows cut the weight's " << w.block_n << "-row scale blocks";
  expect(op, "in", p.in, DType::kF32, {-1, k});
  DI_CHECK(p.in.dim(0) % p.groups == 0) << op << ": " << p.in.dim(0) << " input rows in " << p.groups << " groups";
  expect(op, "out", p.out, DType::kF32, {p.in.dim(0), n});
  DI_CHECK(!overlap(p.in, p.out)) << op << ": 'out' must not overlap 'in'";
}

void validate(const NormRopeParams& p) {
  const char* op = "norm_rope";
  DI_CHECK(present(p.parts[0].x)) << op << ": 'parts[0].x' is required";
  expect(op, "positions", p.positions, DType::kI64, {-1});
  expect(op, "inv_freq", p.inv_freq, DType::kF32, {-1});
  const int64_t t = p.positions.dim(0), rd = 2 * p.inv_freq.dim(0);
  for (int i = 0; i < 2; ++i) {
    const NormRopePart& part = p.parts[i];
    const char* x = i == 0 ? "parts[0].x" : "parts[1].x";
    if (!present(part.x)) {
      DI_CHECK(!present(part.weight)) << op << ": 'parts[1].weight' without 'parts[1].x'";
      continue;
    }
    expect(op, x, part.x, DType::kF32, {t, -1, -1});
    DI_CHECK(part.norm || part.rope || part.fake_quant)
        << op << ": part " << i << " neither normalises, rotates nor fake-quantizes";
    if (present(part.weight)) {
      DI_CHECK(part.norm) << op << ": part " << i << " has a norm weight but norm = false";
      expect(op, i == 0 ? "parts[0].weight" : "parts[1].weight", part.weight, DType::kF32, {part.x.dim(2)});
    }
    if (part.rope)
      DI_CHECK(rd <= part.x.dim(2)) << op << ": rope dim " << rd << " > head dim " << part.x.dim(2) << " of part " << i;
  }
  DI_CHECK(!overlap(p.parts[0].x, p.parts[1].x)) << op << ": the parts must not overlap";
  DI_CHECK(p.eps > 0) << op << ": eps must be positive";
}

}  // namespace deepinfer
