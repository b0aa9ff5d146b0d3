// MLA attention on the CPU in its two equivalent forms (ops.h "MLA"): naive (expand the cache rows into
// per-head keys and values once, then attend) and absorbed (attend in the latent space). fp32 throughout.
#include <algorithm>
#include <cmath>
#include <vector>

#include "deepinfer/ops/cpu/cpu_backend.h"

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
    std::vector<int64_t> visible;
    for (int64_t th = begin; th < end; ++th) {
      const int64_t t = th / d.H, h = th % d.H;
      const float* q = p.q.data_as<float>() + th * qk;
      const float* w_uk = kv_b + h * (d.dn + d.dv) * d.r;  // [dn, r]
      const float* w_uv = w_uk + d.dn * d.r;               // [dv, r]
      // q̃ = W_UKᵀ·q_nope: the query moved into the latent space, so q̃·ĉ_s = q_nope·(W_UK·ĉ_s).
      std::fill(q_latent.begin(), q_latent.end(), 0.0f);
      for (int64_t i = 0; i < d.dn; ++i)
        for (int64_t c = 0; c < d.r; ++c) q_latent[c] += q[i] * w_uk[i * d.r + c];
      visible.clear();
      probs.clear();
      for (int64_t s = 0; s < d.S; ++s) {
        if (kv_pos[s] > q_pos[t]) continue;
        const float* cache = kv + s * row;
        visible.push_back(s);
        probs.push_back((dot_f32(q_latent.data(), cache, d.r) + dot_f32(q + d.dn, cache + d.r, d.dr)) * p.scale);
      }
      float* out = p.out.data_as<float>() + th * d.dv;
      if (visible.empty()) {
        std::fill(out, out + d.dv, 0.0f);
        continue;
      }
      softmax_in_place(probs);
      // o = W_UV·(Σ p·ĉ_s): values are never expanded.
      std::fill(o_latent.begin(), o_latent.end(), 0.0f);
      for (size_t j = 0; j < visible.size(); ++j) {
        const float* cache = kv + visible[j] * row;
        for (int64_t c = 0; c < d.r; ++c) o_latent[c] += probs[j] * cache[c];
      }
      for (int64_t i = 0; i < d.dv; ++i) out[i] = dot_f32(w_uv + i * d.r, o_latent.data(), d.r);
    }
  });
}

}  // namespace deepinfer
