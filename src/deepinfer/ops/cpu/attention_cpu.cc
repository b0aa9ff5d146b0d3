// Sink attention on the CPU: one shared K=V head, sliding-window keys plus masked compressed entries, a
// per-head sink logit in the softmax denominator only. fp32 throughout.
#include <cmath>
#include <vector>

#include "deepinfer/ops/cpu/cpu_backend.h"

namespace deepinfer {

void CpuBackend::sink_attention(const SinkAttentionParams& p) {
  validate(p);
  const int64_t tokens = p.q.dim(0), heads = p.q.dim(1), hd = p.q.dim(2);
  const int64_t s_count = p.window_kv.dim(0);
  const int64_t n_comp = p.compressed.data() ? p.compressed.dim(0) : 0;
  const int64_t* q_pos = p.q_positions.data_as<int64_t>();
  const int64_t* kv_pos = p.kv_positions.data_as<int64_t>();
  const float* window = p.window_kv.data_as<float>();
  const float* comp = n_comp ? p.compressed.data_as<float>() : nullptr;
  const uint8_t* mask = p.comp_mask.data() ? p.comp_mask.data_as<uint8_t>() : nullptr;
  parallel_for(tokens * heads, tokens * heads * (s_count + n_comp) * hd * 2, [&](int64_t begin, int64_t end) {
    std::vector<const float*> keys;
    std::vector<float> logits;
    for (int64_t th = begin; th < end; ++th) {
      const int64_t t = th / heads, h = th % heads;
      const float* q = p.q.data_as<float>() + th * hd;
      keys.clear();
      logits.clear();
      for (int64_t s = 0; s < s_count; ++s)
        if (kv_pos[s] <= q_pos[t] && kv_pos[s] > q_pos[t] - p.window) keys.push_back(window + s * hd);
      for (int64_t e = 0; e < n_comp; ++e)
        if (!mask || mask[t * n_comp + e]) keys.push_back(comp + e * hd);
      const float sink = p.sinks.data_as<float>()[h];
      float mx = sink;
      for (const float* k : keys) {
        logits.push_back(dot_f32(q, k, hd) * p.scale);
        mx = std::max(mx, logits.back());
      }
      float denom = std::exp(sink - mx);
      for (float& l : logits) denom += (l = std::exp(l - mx));
      float* out = p.out.data_as<float>() + th * hd;
      for (int64_t i = 0; i < hd; ++i) out[i] = 0.0f;
      for (size_t j = 0; j < keys.size(); ++j) {
        const float w = logits[j] / denom;
        for (int64_t i = 0; i < hd; ++i) out[i] += w * keys[j][i];
      }
    }
  });
}

}  // namespace deepinfer
