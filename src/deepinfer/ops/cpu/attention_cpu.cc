// Sink attention on the CPU: one shared K=V head, sliding-window keys plus masked compressed entries, a
// per-head sink logit in the softmax denominator only. fp32 throughout.
#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

#include "deepinfer/ops/cpu/cpu_backend.h"
#include "deepinfer/ops/cpu/pool_rows.h"

namespace deepinfer {

namespace {

// One (query, head): softmax over q·k·scale of `keys` with the sink in the denominator only, out = P·V (K = V).
void attend(const float* q, const std::vector<const float*>& keys, int64_t hd, float sink, float scale,
            std::vector<float>& logits, float* out) {
  logits.clear();
  float mx = sink;
  for (const float* k : keys) {
    logits.push_back(dot_f32(q, k, hd) * scale);
    mx = std::max(mx, logits.back());
  }
  float denom = std::exp(sink - mx);
  for (float& l : logits) denom += (l = std::exp(l - mx));
  for (int64_t i = 0; i < hd; ++i) out[i] = 0.0f;
  for (size_t j = 0; j < keys.size(); ++j) {
    const float w = logits[j] / denom;
    for (int64_t i = 0; i < hd; ++i) out[i] += w * keys[j][i];
  }
}

}  // namespace

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
      for (int64_t s = 0; s < s_count; ++s)
        if (kv_pos[s] <= q_pos[t] && kv_pos[s] > q_pos[t] - p.window) keys.push_back(window + s * hd);
      for (int64_t e = 0; e < n_comp; ++e)
        if (!mask || mask[t * n_comp + e]) keys.push_back(comp + e * hd);
      attend(q, keys, hd, p.sinks.data_as<float>()[h], p.scale, logits, p.out.data_as<float>() + th * hd);
    }
  });
}

void CpuBackend::paged_sink_attention(const PagedSinkAttentionParams& p) {
  validate(p);
  const int64_t tokens = p.q.dim(0), heads = p.q.dim(1), hd = p.q.dim(2);
  const int64_t seqs = p.block_tables.dim(0), max_blocks = p.block_tables.dim(1), bs = p.block_size;
  const int64_t r = p.comp_ratio, per_block = bs / r;
  const bool comp = p.comp_pool.data() != nullptr;
  const bool by_mask = comp && p.comp_mask.data() != nullptr;
  const int64_t k_sel = !comp ? 0 : (by_mask ? p.comp_mask.dim(1) : p.comp_idx.dim(1));
  const int32_t* tables = p.block_tables.data_as<int32_t>();
  // bf16 pools' rows are widened once each (exactly), records decoded: the arithmetic is the f32 pools' over those
  // values.
  PoolRows window_rows(p.window_pool, hd, kWindowRecord);
  std::optional<PoolRows> comp_rows;
  if (comp) comp_rows.emplace(p.comp_pool, hd, kEntryRecord);
  // Pool row of group g (ratio rr, per_blk groups per block) of sequence b, checked against the table and pool.
  auto row_of = [&](int64_t b, int64_t g, int64_t rr, int64_t per_blk, PoolRows& rows, const Tensor& pool,
                    const char* what) {
    const int64_t blk = g * rr / bs;
    DI_CHECK(g >= 0 && blk < max_blocks) << "paged_sink_attention: " << what << " " << g << " of sequence " << b
                                         << " is beyond its block table (" << max_blocks << " blocks)";
    const int64_t id = tables[b * max_blocks + blk], row = id * per_blk + (g * rr % bs) / rr;
    DI_CHECK(id >= 0 && row < pool.dim(0)) << "paged_sink_attention: block id " << id << " of sequence " << b
                                           << " is outside the " << what << " pool (" << pool.dim(0) << " rows)";
    return rows.add(row);
  };
  // Key rows per token first (validation throws here, outside the worker threads): handles of the window rows, then
  // of the compressed entries.
  std::vector<std::vector<int64_t>> handles(tokens);
  std::vector<size_t> n_window(tokens);
  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t b = p.q_seq.data_as<int32_t>()[t], pos = p.q_positions.data_as<int64_t>()[t];
    DI_CHECK(b >= 0 && b < seqs) << "paged_sink_attention: q_seq[" << t << "] = " << b << " outside [0, " << seqs
                                 << ")";
    const int64_t lo = std::max(pos - p.window + 1, p.window_begin.data_as<int64_t>()[b]);
    for (int64_t w = std::max<int64_t>(lo, 0); w <= pos; ++w)
      handles[t].push_back(row_of(b, w, 1, bs, window_rows, p.window_pool, "window position"));
    n_window[t] = handles[t].size();
    for (int64_t j = 0; j < k_sel; ++j) {
      const int64_t e = by_mask ? (p.comp_mask.data_as<uint8_t>()[t * k_sel + j] ? j : -1)
                                : p.comp_idx.data_as<int32_t>()[t * k_sel + j];
      if (e >= 0) handles[t].push_back(row_of(b, e, r, per_block, *comp_rows, p.comp_pool, "compressed entry"));
    }
  }
  window_rows.seal();
  if (comp_rows) comp_rows->seal();
  std::vector<std::vector<const float*>> keys(tokens);
  for (int64_t t = 0; t < tokens; ++t)
    for (size_t i = 0; i < handles[t].size(); ++i)
      keys[t].push_back(i < n_window[t] ? window_rows.row(handles[t][i]) : comp_rows->row(handles[t][i]));
  parallel_for(tokens * heads, tokens * heads * (p.window + k_sel) * hd * 2, [&](int64_t begin, int64_t end) {
    std::vector<float> logits;
    for (int64_t th = begin; th < end; ++th) {
      const int64_t t = th / heads, h = th % heads;
      attend(p.q.data_as<float>() + th * hd, keys[t], hd, p.sinks.data_as<float>()[h], p.scale, logits,
             p.out.data_as<float>() + th * hd);
    }
  });
}

}  // namespace deepinfer
