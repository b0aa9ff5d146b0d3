// MLA attention on the CPU in its two equivalent forms (ops.h "MLA"): naive (expand the cache rows into
// per-head keys and values once, then attend) and absorbed (attend in the latent space). fp32 throughout.
#include <algorithm>
#include <cmath>
#include <vector>

#include "deepinfer/ops/cpu/cpu_backend.h"
#include "deepinfer/ops/cpu/pool_rows.h"

namespace deepinfer {
namespace {

struct MlaDims {
  int64_t T, H, S, dn, dr, dv, r;
};

MlaDims mla_dims(const MlaAttentionParams& p) {
  MlaDims d{};
  d.T = p.q.dim(0);
  d.H = p.q.dim(1);
  d.S = p.kv.dim(0);
  d.dr = p.rope_dim;
  d.dn = p.q.dim(2) - d.dr;
  d.r = p.kv.dim(1) - d.dr;
  d.dv = p.kv_b.dim(0) / d.H - d.dn;
  return d;
}

// In place: logits -> softmax probabilities (fp32, max-subtracted).
void softmax_in_place(std::vector<float>& logits) {
  float mx = -INFINITY;
  for (float l : logits) mx = std::max(mx, l);
  float denom = 0.0f;
  for (float& l : logits) denom += (l = std::exp(l - mx));
  for (float& l : logits) l /= denom;
}

}  // namespace

void CpuBackend::mla_attention_naive(const MlaAttentionParams& p) {
  validate(p);
  const MlaDims d = mla_dims(p);
  const int64_t qk = d.dn + d.dr;
  const float* kv = p.kv.data_as<float>();
  const float* kv_b = p.kv_b.data_as<float>();
  // Expanded keys [S, H, dn + dr] (k_nope_h | shared k_pe) and values [S, H, dv].
  std::vector<float> keys(static_cast<size_t>(d.S * d.H * qk)), values(static_cast<size_t>(d.S * d.H * d.dv));
  parallel_for(d.S, d.S * d.H * (d.dn + d.dv) * d.r, [&](int64_t begin, int64_t end) {
    for (int64_t s = begin; s < end; ++s) {
      const float* latent = kv + s * (d.r + d.dr);
      for (int64_t h = 0; h < d.H; ++h) {
        const float* w = kv_b + h * (d.dn + d.dv) * d.r;
        float* k = keys.data() + (s * d.H + h) * qk;
        for (int64_t i = 0; i < d.dn; ++i) k[i] = dot_f32(w + i * d.r, latent, d.r);
        for (int64_t i = 0; i < d.dr; ++i) k[d.dn + i] = latent[d.r + i];
        float* v = values.data() + (s * d.H + h) * d.dv;
        for (int64_t j = 0; j < d.dv; ++j) v[j] = dot_f32(w + (d.dn + j) * d.r, latent, d.r);
      }
    }
  });
  const int64_t* q_pos = p.q_positions.data_as<int64_t>();
  const int64_t* kv_pos = p.kv_positions.data_as<int64_t>();
  parallel_for(d.T * d.H, d.T * d.H * d.S * (qk + d.dv), [&](int64_t begin, int64_t end) {
    std::vector<int64_t> visible;
    std::vector<float> probs;
    for (int64_t th = begin; th < end; ++th) {
      const int64_t t = th / d.H, h = th % d.H;
      const float* q = p.q.data_as<float>() + th * qk;
      visible.clear();
      probs.clear();
      for (int64_t s = 0; s < d.S; ++s) {
        if (kv_pos[s] > q_pos[t]) continue;
        visible.push_back(s);
        probs.push_back(dot_f32(q, keys.data() + (s * d.H + h) * qk, qk) * p.scale);
      }
      float* out = p.out.data_as<float>() + th * d.dv;
      std::fill(out, out + d.dv, 0.0f);
      if (visible.empty()) continue;
      softmax_in_place(probs);
      for (size_t j = 0; j < visible.size(); ++j) {
        const float* v = values.data() + (visible[j] * d.H + h) * d.dv;
        for (int64_t i = 0; i < d.dv; ++i) out[i] += probs[j] * v[i];
      }
    }
  });
}

namespace {

// One (query, head) of the absorbed form over the visible cache rows `rows` (in key order), into out [dv]. The
// per-sequence and the paged op share it, so both give bit-identical results.
void absorbed_head(const MlaDims& d, const float* q, const float* w_uk, const std::vector<const float*>& rows,
                   float scale, std::vector<float>& q_latent, std::vector<float>& o_latent, std::vector<float>& probs,
                   float* out) {
  const float* w_uv = w_uk + d.dn * d.r;  // [dv, r]
  // q̃ = W_UKᵀ·q_nope: the query moved into the latent space, so q̃·ĉ_s = q_nope·(W_UK·ĉ_s).
  std::fill(q_latent.begin(), q_latent.end(), 0.0f);
  for (int64_t i = 0; i < d.dn; ++i)
    for (int64_t c = 0; c < d.r; ++c) q_latent[c] += q[i] * w_uk[i * d.r + c];
  probs.clear();
  for (const float* cache : rows)
    probs.push_back((dot_f32(q_latent.data(), cache, d.r) + dot_f32(q + d.dn, cache + d.r, d.dr)) * scale);
  if (rows.empty()) {
    std::fill(out, out + d.dv, 0.0f);
    return;
  }
  softmax_in_place(probs);
  // o = W_UV·(Σ p·ĉ_s): values are never expanded.
  std::fill(o_latent.begin(), o_latent.end(), 0.0f);
  for (size_t j = 0; j < rows.size(); ++j)
    for (int64_t c = 0; c < d.r; ++c) o_latent[c] += probs[j] * rows[j][c];
  for (int64_t i = 0; i < d.dv; ++i) out[i] = dot_f32(w_uv + i * d.r, o_latent.data(), d.r);
}

}  // namespace

void CpuBackend::mla_attention_absorbed(const MlaAttentionParams& p) {
  validate(p);
  const MlaDims d = mla_dims(p);
  const int64_t row = d.r + d.dr, qk = d.dn + d.dr;
  const float* kv = p.kv.data_as<float>();
  const float* kv_b = p.kv_b.data_as<float>();
  const int64_t* q_pos = p.q_positions.data_as<int64_t>();
  const int64_t* kv_pos = p.kv_positions.data_as<int64_t>();
  parallel_for(d.T * d.H, d.T * d.H * (d.S * (row + d.r) + (d.dn + d.dv) * d.r), [&](int64_t begin, int64_t end) {
    std::vector<float> q_latent(d.r), o_latent(d.r), probs;
    std::vector<const float*> visible;
    for (int64_t th = begin; th < end; ++th) {
      const int64_t t = th / d.H, h = th % d.H;
      visible.clear();
      for (int64_t s = 0; s < d.S; ++s)
        if (kv_pos[s] <= q_pos[t]) visible.push_back(kv + s * row);
      absorbed_head(d, p.q.data_as<float>() + th * qk, kv_b + h * (d.dn + d.dv) * d.r, visible, p.scale, q_latent,
                    o_latent, probs, p.out.data_as<float>() + th * d.dv);
    }
  });
}

void CpuBackend::paged_mla_attention(const PagedMlaAttentionParams& p) {
  validate(p);
  MlaDims d{};
  d.T = p.q.dim(0);
  d.H = p.q.dim(1);
  d.dr = p.rope_dim;
  d.dn = p.q.dim(2) - d.dr;
  d.r = p.kv_pool.dim(1) - d.dr;
  d.dv = p.kv_b.dim(0) / d.H - d.dn;
  const int64_t row = d.r + d.dr, qk = d.dn + d.dr;
  const int64_t seqs = p.block_tables.dim(0), max_blocks = p.block_tables.dim(1), bs = p.block_size;
  const int64_t pool_rows = p.kv_pool.dim(0);
  const int32_t* tables = p.block_tables.data_as<int32_t>();
  // A bf16 pool's rows are widened once each (exactly), so the arithmetic is the f32 pool's over those values.
  PoolRows pool(p.kv_pool, row);
  // Each query's rows, positions 0 .. q_pos in order (validation throws here, outside the worker threads).
  std::vector<std::vector<int64_t>> handles(static_cast<size_t>(d.T));
  int64_t keys = 0;
  for (int64_t t = 0; t < d.T; ++t) {
    const int64_t b = p.q_seq.data_as<int32_t>()[t], pos = p.q_positions.data_as<int64_t>()[t];
    DI_CHECK(b >= 0 && b < seqs) << "paged_mla_attention: q_seq[" << t << "] = " << b << " outside [0, " << seqs << ")";
    DI_CHECK(pos < max_blocks * bs) << "paged_mla_attention: position " << pos << " of sequence " << b
                                    << " is beyond its block table (" << max_blocks << " blocks of " << bs << ")";
    for (int64_t s = 0; s <= pos; ++s) {
      const int64_t id = tables[b * max_blocks + s / bs], at = id * bs + s % bs;
      DI_CHECK(id >= 0 && at < pool_rows) << "paged_mla_attention: block id " << id << " of sequence " << b
                                          << " is outside the pool (" << pool_rows << " rows)";
      handles[t].push_back(pool.add(at));
    }
    keys += pos + 1;
  }
  pool.seal();
  std::vector<std::vector<const float*>> rows(static_cast<size_t>(d.T));
  for (int64_t t = 0; t < d.T; ++t)
    for (int64_t h : handles[t]) rows[t].push_back(pool.row(h));
  const int64_t per_query = keys / std::max<int64_t>(d.T, 1) + 1;
  parallel_for(d.T * d.H, d.T * d.H * (per_query * (row + d.r) + (d.dn + d.dv) * d.r), [&](int64_t begin, int64_t end) {
    std::vector<float> q_latent(d.r), o_latent(d.r), probs;
    for (int64_t th = begin; th < end; ++th) {
      const int64_t t = th / d.H, h = th % d.H;
      absorbed_head(d, p.q.data_as<float>() + th * qk, p.kv_b.data_as<float>() + h * (d.dn + d.dv) * d.r, rows[t],
                    p.scale, q_latent, o_latent, probs, p.out.data_as<float>() + th * d.dv);
    }
  });
}

}  // namespace deepinfer
