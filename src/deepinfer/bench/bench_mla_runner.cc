// `deepinfer bench` for the MLA family: layers of a MlaBenchModel on a BenchTarget with random weights and caches.
// Prefill attention: the naive MLA op over each sequence's cache rows, one call per sequence. Decode: one
// paged_mla_attention call for all sequences (the V3 model's decode_batch path; pages of kBlock rows, each
// sequence's blocks contiguous in the pool), or with BenchOptions::mla_paged_decode off the absorbed op once per
// sequence (the path before); MlaBenchModel::kv_value_bytes 2 gives the paged call a bf16 pool. The cache rows are
// random (one pool serves every layer: its contents do not change the cost) and the step does not append to it.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "deepinfer/bench/bench_runner.h"
#include "deepinfer/core/error.h"
#include "deepinfer/ops/rope_table.h"

namespace deepinfer::bench {
namespace {

constexpr int64_t kBlock = 64;  // decode pages (the engine's default block size)

class MlaSlice final : public SliceState {
 public:
  MlaSlice(BenchTarget& t, const MlaBenchModel& m, const std::vector<StepShape>& shapes, uint64_t seed, bool paged)
      : t_(t), m_(m), mem_(t.memory()), seed_(seed), paged_(paged) {
    for (const StepShape& s : shapes) {
      max_tokens_ = std::max(max_tokens_, s.seqs * s.tokens);
      max_seqs_ = std::max(max_seqs_, s.seqs);
      max_context_ = std::max(max_context_, s.context);
    }
    const int64_t d = m.hidden, h = m.heads, qk = m.nope_dim + m.rope_dim, tt = max_tokens_;
    x_ = rnd({tt, d}, 1.0f);
    xn_ = rnd({tt, d}, 1.0f);
    if (m.q_lora > 0) q_latent_ = rnd({tt, m.q_lora}, 1.0f);
    q_ = rnd({tt, h, qk}, 1.0f);
    kv_a_ = rnd({tt, m.row()}, 1.0f);
    o_ = rnd({tt, h, m.v_dim}, 1.0f);
    y_ = rnd({tt, d}, 1.0f);
    rw_ = rnd({tt, std::max<int64_t>(m.topk, 1)}, 1.0f);
    ridx_ = mem_.zeros(DType::kI32, {tt, std::max<int64_t>(m.topk, 1)});
    ones_ = mem_.zeros(DType::kF32, {tt, 1});
    mem_.fill(ones_, 1.0f);
    zero_idx_ = mem_.zeros(DType::kI32, {tt, 1});
    RopeConfig rc;
    rc.dim = static_cast<int>(m.rope_dim);
    const std::vector<float> inv = rope_inv_freq(rc);
    inv_freq_ = mem_.from_host(DType::kF32, {static_cast<int64_t>(inv.size())}, inv.data());
    // Sequence q's rows are pool rows [q·max_context, q·max_context + context) (whole kBlock-row pages).
    max_context_ = (max_context_ + kBlock - 1) / kBlock * kBlock;
    pool_ = rnd({max_seqs_ * max_context_, m.row()}, 1.0f);
    // A bf16 decode cache holds the same rows rounded (the paged call reads it; prefill keeps the f32 rows).
    if (m.kv_value_bytes == 2) {
      pool_bf16_ = mem_.zeros(DType::kBF16, pool_.shape());
      mem_.cast(pool_bf16_.view(), pool_.view());
    }
    std::vector<int64_t> kvpos(static_cast<size_t>(max_context_));
    std::iota(kvpos.begin(), kvpos.end(), int64_t{0});
    kv_positions_ = mem_.from_host(DType::kI64, {max_context_}, kvpos.data());
    const int b = m.block;
    for (int64_t li = 0; li < m.layers(); ++li) {
      Layer l;
      if (m.q_lora > 0) {
        l.wq_a = t.weight(m.proj_format, m.q_lora, d, b, next());
        l.wq_b = t.weight(m.proj_format, h * qk, m.q_lora, b, next());
      } else {
        l.wq = t.weight(m.proj_format, h * qk, d, b, next());
      }
      l.wkv_a = t.weight(m.proj_format, m.row(), d, b, next());
      l.kv_b = rnd({h * (m.nope_dim + m.v_dim), m.kv_lora}, 1.0f / std::sqrt(static_cast<float>(m.kv_lora)));
      l.wo = t.weight(m.proj_format, d, h * m.v_dim, b, next());
      ExpertSpec es;
      es.d = d;
      es.routed = m.ffn_format;
      es.shared = m.ffn_format;
      es.block = b;
      l.dense = li < m.dense_layers;
      if (l.dense) {
        es.count = 1;
        es.inter = m.dense_inter;
      } else {
        es.count = m.experts;
        es.inter = m.moe_inter;
        es.shared_inter = m.shared_experts * m.moe_inter;
        l.router = rnd({m.experts, d}, 1.0f / std::sqrt(static_cast<float>(d)));
        if (m.sigmoid_router) l.router_bias = rnd({m.experts}, 0.1f);
      }
      l.experts = t.experts(es, next());
      layers_.push_back(std::move(l));
    }
  }

  void prepare(const StepShape& s) override {
    const int64_t tt = s.seqs * s.tokens;
    std::vector<int64_t> pos(static_cast<size_t>(tt));
    for (int64_t q = 0; q < s.seqs; ++q)
      for (int64_t j = 0; j < s.tokens; ++j) pos[q * s.tokens + j] = s.context - s.tokens + j;
    positions_ = mem_.from_host(DType::kI64, {tt}, pos.data());
    host_positions_ = pos;
    // Paged decode: sequence q's page j is block q·(max_context / kBlock) + j; token rows map to their sequence.
    const int64_t blocks = (s.context + kBlock - 1) / kBlock, per_seq = max_context_ / kBlock;
    std::vector<int32_t> tables(static_cast<size_t>(s.seqs * blocks)), q_seq(static_cast<size_t>(tt));
    for (int64_t q = 0; q < s.seqs; ++q) {
      for (int64_t j = 0; j < blocks; ++j) tables[q * blocks + j] = static_cast<int32_t>(q * per_seq + j);
      for (int64_t j = 0; j < s.tokens; ++j) q_seq[q * s.tokens + j] = static_cast<int32_t>(q);
    }
    tables_ = mem_.from_host(DType::kI32, {s.seqs, blocks}, tables.data());
    q_seq_ = mem_.from_host(DType::kI32, {tt}, q_seq.data());
  }

  OwnedTensor save(const StepShape& s) override { return mem_.clone(rows(x_, s.seqs * s.tokens)); }
  void restore(const StepShape& s, const OwnedTensor& saved) override {
    mem_.copy(rows(x_, s.seqs * s.tokens), saved.view());
  }
  HostTensor result(const StepShape& s) override { return mem_.to_host(rows(x_, s.seqs * s.tokens)); }

  void step(const StepShape& s, bool profile) override {
    profile_ = profile;
    const MlaBenchModel& m = m_;
    Backend& be = t_.backend();
    const int64_t tt = s.seqs * s.tokens, h = m.heads, qk = m.nope_dim + m.rope_dim;
    const Tensor x = rows(x_, tt), xn = rows(xn_, tt), q = rows(q_, tt), kv_a = rows(kv_a_, tt);
    const Tensor o = rows(o_, tt), y = rows(y_, tt), pos = positions_.view();
    const float scale = 1.0f / std::sqrt(static_cast<float>(qk));
    for (size_t li = 0; li < layers_.size(); ++li) {
      const Layer& l = layers_[li];
      // ---- attention: x += o_proj(MLA(norm(x)))
      be.rms_norm({x, Tensor{}, xn, 1e-6f});
      mark(kSegMixNorm);
      if (m.q_lora > 0) {
        const Tensor ql = rows(q_latent_, tt);
        t_.linear(xn, *l.wq_a, ql);
        be.rms_norm({ql, Tensor{}, ql, 1e-6f});
        t_.linear(ql, *l.wq_b, q.reshape({tt, h * qk}));
      } else {
        t_.linear(xn, *l.wq, q.reshape({tt, h * qk}));
      }
      t_.linear(xn, *l.wkv_a, kv_a);
      be.rope({q, pos, inv_freq_.view(), false});
      be.rope({kv_a.reshape({tt, 1, m.row()}), pos, inv_freq_.view(), false});
      mark(kSegProj);
      if (!s.prefill && paged_) {
        PagedMlaAttentionParams p;
        p.q = q;
        p.q_positions = pos;
        p.q_seq = q_seq_.view();
        p.block_tables = tables_.view();
        p.kv_pool = m.kv_value_bytes == 2 ? pool_bf16_.view() : pool_.view();
        p.kv_b = l.kv_b.view();
        p.out = o;
        p.block_size = static_cast<int>(kBlock);
        p.rope_dim = static_cast<int>(m.rope_dim);
        p.scale = scale;
        be.paged_mla_attention(p);
      }
      for (int64_t sq = 0; sq < s.seqs && (s.prefill || !paged_); ++sq) {
        MlaAttentionParams p;
        p.q = q.slice(sq * s.tokens, (sq + 1) * s.tokens);
        p.q_positions = pos.slice(sq * s.tokens, (sq + 1) * s.tokens);
        p.kv = pool_.view().slice(sq * max_context_, sq * max_context_ + s.context);
        p.kv_positions = kv_positions_.view().slice(0, s.context);
        // As the model gives them: rows in position order from 0, the queries' positions on the host.
        p.kv_first_position = 0;
        p.host_q_positions = std::span<const int64_t>(host_positions_).subspan(sq * s.tokens, s.tokens);
        p.kv_b = l.kv_b.view();
        p.out = o.slice(sq * s.tokens, (sq + 1) * s.tokens);
        p.rope_dim = static_cast<int>(m.rope_dim);
        p.scale = scale;
        if (s.prefill)
          be.mla_attention_naive(p);
        else
          be.mla_attention_absorbed(p);
      }
      mark(kSegAttention);
      t_.linear(o.reshape({tt, h * m.v_dim}), *l.wo, y);
      mark(kSegProj);
      t_.memory().add(x, y);
      // ---- FFN: x += ffn(norm(x))
      be.rms_norm({x, Tensor{}, xn, 1e-6f});
      mark(kSegMixNorm);
      if (l.dense) {
        t_.moe(xn, rows(ones_, tt), rows(zero_idx_, tt), *l.experts, y, 0.0f, false);
      } else {
        RouterParams rp;
        rp.x = xn;
        rp.weight = l.router.view();
        if (m.sigmoid_router) rp.bias = l.router_bias.view();
        rp.weights = rows(rw_, tt);
        rp.indices = rows(ridx_, tt);
        rp.scoring = m.sigmoid_router ? RouterScoring::kSigmoid : RouterScoring::kSoftmax;
        rp.route_scale = m.route_scale;
        rp.normalize = m.sigmoid_router;  // V3 norm_topk_prob; V2-Lite false
        rp.n_group = m.n_group;
        rp.topk_group = m.topk_group;
        rp.group_score = GroupScore::kTop2Sum;
        be.router(rp);
        mark(kSegRouter);
        t_.moe(xn, rows(rw_, tt), rows(ridx_, tt), *l.experts, y, 0.0f, false);
      }
      mark(kSegExperts);
      t_.memory().add(x, y);
      mark(kSegMixNorm);
    }
  }

 private:
  struct Layer {
    std::unique_ptr<BenchWeight> wq_a, wq_b, wq, wkv_a, wo;
    OwnedTensor kv_b, router, router_bias;
    std::unique_ptr<BenchExperts> experts;
    bool dense = false;
  };

  uint64_t next() { return seed_ = seed_ * 6364136223846793005ull + 1442695040888963407ull; }
  OwnedTensor rnd(Shape shape, float range) { return t_.random(std::move(shape), next(), range); }
  static Tensor rows(const OwnedTensor& t, int64_t n) { return t.view().slice(0, n); }
  void mark(int seg) {
    if (profile_) t_.profile_mark(seg);
  }

  BenchTarget& t_;
  const MlaBenchModel& m_;
  TensorMemory& mem_;
  uint64_t seed_;
  bool profile_ = false;
  int64_t max_tokens_ = 1, max_seqs_ = 1, max_context_ = 1;
  OwnedTensor x_, xn_, q_latent_, q_, kv_a_, o_, y_, rw_, ridx_, ones_, zero_idx_, inv_freq_, pool_, pool_bf16_,
      kv_positions_;
  OwnedTensor positions_, tables_, q_seq_;
  std::vector<int64_t> host_positions_;
  bool paged_ = true;
  std::vector<Layer> layers_;
};

}  // namespace

std::vector<BenchRow> run_mla_slice(BenchTarget& target, const MlaBenchModel& m, const BenchOptions& o) {
  const std::vector<StepShape> shapes = bench_shapes(o);
  MlaSlice slice(target, m, shapes, o.seed, o.mla_paged_decode);
  return run_shapes(
      target, slice, m.name, shapes, [&m](const StepShape& s) { return count_mla_step(m, s); }, o);
}

}  // namespace deepinfer::bench
