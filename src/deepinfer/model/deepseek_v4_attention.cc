// DeepSeek-V4 / V4.1 attention of one layer: low-rank queries, a single K=V latent head with sliding-window
// cache, the compressed branch (V4: CSA with overlapping windows + indexer, HCA; V4.1: CSA2 groups sharing
// the kv-source layer's entries and selections), sink attention, inverse RoPE and the grouped output
// projection. Shapes: T tokens, H heads, hd head dim, r compress ratio, G closed groups, N entries.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "deepinfer/model/deepseek_v4_internal.h"

namespace deepinfer {
namespace {

HostTensor linear(Backend& b, const Tensor& x, const HostTensor& w) {
  HostTensor out(DType::kF32, {x.dim(0), w.shape()[0]});
  b.linear({x, w.view(), out.view()});
  return out;
}

void rms_norm_inplace(Backend& b, const Tensor& x, const HostTensor& w, float eps) {
  b.rms_norm({x, w.data<void>() != nullptr ? w.view() : Tensor{}, x, eps});
}

HostTensor positions_of(const std::vector<int64_t>& pos) {
  HostTensor t(DType::kI64, {static_cast<int64_t>(pos.size())});
  std::copy(pos.begin(), pos.end(), t.data<int64_t>());
  return t;
}

// Appends T new rows to a compressor's pending buffer and moves every closed group's rows (G·r of them) out
// into kv/gate. Returns G.
int64_t take_closed_groups(CompressorState& cs, const float* kv, const float* gate, int64_t T, int64_t width, int r,
                           std::vector<float>& out_kv, std::vector<float>& out_gate) {
  cs.pending_kv.insert(cs.pending_kv.end(), kv, kv + T * width);
  cs.pending_gate.insert(cs.pending_gate.end(), gate, gate + T * width);
  cs.pending += T;
  const int64_t groups = cs.pending / r, used = groups * r * width;
  out_kv.assign(cs.pending_kv.begin(), cs.pending_kv.begin() + used);
  out_gate.assign(cs.pending_gate.begin(), cs.pending_gate.begin() + used);
  cs.pending_kv.erase(cs.pending_kv.begin(), cs.pending_kv.begin() + used);
  cs.pending_gate.erase(cs.pending_gate.begin(), cs.pending_gate.begin() + used);
  cs.pending -= groups * r;
  return groups;
}

}  // namespace

// V4 compressor (main entries, or with `indexer` the indexer's keys). CSA overlaps windows: entry w pools
// the Ca half of window w−1 with the Cb half of window w over 2r slots; HCA pools its r tokens.
void DeepseekV4Model::v4_compress(const Chunk& c, int layer, const HostTensor& x, V4LayerState& st,
                                  bool indexer) const {
  const auto& a = w_.layers[layer].attn;
  const HostTensor& wkv = indexer ? a.idx_comp_wkv : a.comp_wkv;
  const HostTensor& wgate = indexer ? a.idx_comp_wgate : a.comp_wgate;
  const HostTensor& ape = indexer ? a.idx_comp_ape : a.comp_ape;
  const HostTensor& norm = indexer ? a.idx_comp_norm : a.comp_norm;
  CompressorState& cs = indexer ? st.index_compressor : st.compressor;
  const int r = config_.layers[layer].compress_ratio;
  const bool overlap = config_.layers[layer].attention == AttentionKind::kCSA;
  const int64_t width = wkv.shape()[0], dim = norm.shape()[0], T = c.T;

  HostTensor kv = linear(backend_, x.view(), wkv), gate = linear(backend_, x.view(), wgate);  // [T, width]
  // Learned position biases join the gate by slot (position mod r); groups start at multiples of r.
  for (int64_t t = 0; t < T; ++t) {
    const int64_t slot = (c.p0 + t) % r;
    for (int64_t i = 0; i < width; ++i) gate.data<float>()[t * width + i] += ape.data<float>()[slot * width + i];
  }
  std::vector<float> ckv, cgate;
  const int64_t G = take_closed_groups(cs, kv.data<float>(), gate.data<float>(), T, width, r, ckv, cgate);
  if (G == 0) return;

  const int64_t slots = overlap ? 2 * r : r;
  HostTensor skv(DType::kF32, {G, slots, dim}), sgate(DType::kF32, {G, slots, dim});
  for (int64_t g = 0; g < G; ++g)
    for (int64_t j = 0; j < r; ++j) {
      const float* src_kv = ckv.data() + (g * r + j) * width;
      const float* src_gate = cgate.data() + (g * r + j) * width;
      float* dst_kv = skv.data<float>() + (g * slots + (overlap ? r + j : j)) * dim;
      float* dst_gate = sgate.data<float>() + (g * slots + (overlap ? r + j : j)) * dim;
      // Overlap: this window's Cb half (the second `dim` channels) fills the last r slots.
      std::memcpy(dst_kv, src_kv + (overlap ? dim : 0), sizeof(float) * dim);
      std::memcpy(dst_gate, src_gate + (overlap ? dim : 0), sizeof(float) * dim);
      if (!overlap) continue;
      // The first r slots take the previous window's Ca half: from this chunk, from the carried state, or
      // nothing (kv 0, gate −inf: weight 0) before the first window.
      float* prev_kv = skv.data<float>() + (g * slots + j) * dim;
      float* prev_gate = sgate.data<float>() + (g * slots + j) * dim;
      if (g > 0) {
        std::memcpy(prev_kv, ckv.data() + ((g - 1) * r + j) * width, sizeof(float) * dim);
        std::memcpy(prev_gate, cgate.data() + ((g - 1) * r + j) * width, sizeof(float) * dim);
      } else if (!cs.prev_kv.empty()) {
        std::memcpy(prev_kv, cs.prev_kv.data() + j * dim, sizeof(float) * dim);
        std::memcpy(prev_gate, cs.prev_gate.data() + j * dim, sizeof(float) * dim);
      } else {
        std::fill(prev_gate, prev_gate + dim, -INFINITY);
      }
    }
  if (overlap) {
    cs.prev_kv.resize(r * dim);
    cs.prev_gate.resize(r * dim);
    for (int64_t j = 0; j < r; ++j) {
      std::memcpy(cs.prev_kv.data() + j * dim, ckv.data() + ((G - 1) * r + j) * width, sizeof(float) * dim);
      std::memcpy(cs.prev_gate.data() + j * dim, cgate.data() + ((G - 1) * r + j) * width, sizeof(float) * dim);
    }
  }
  HostTensor pooled(DType::kF32, {G, dim});
  backend_.compress_pool({skv.view(), sgate.view(), pooled.view()});
  rms_norm_inplace(backend_, pooled.view(), norm, static_cast<float>(config_.rms_norm_eps));
  std::vector<int64_t> pos(G);
  for (int64_t g = 0; g < G; ++g) pos[g] = (cs.emitted + g) * r;
  HostTensor p = positions_of(pos);
  backend_.rope({pooled.view().reshape({G, 1, dim}), p.view(), compress_inv_freq_.view(), false});
  std::vector<float>& dst = indexer ? st.index_keys : st.entries;
  dst.insert(dst.end(), pooled.data<float>(), pooled.data<float>() + G * dim);
  cs.emitted += G;
  if (!indexer) st.n_entries += G;
}

// V4.1 kv-source compressor: r = 1 is a plain per-token projection, r > 1 pools r tokens with an fp32
// softmax gate (no position bias, no overlap). From the pre-RoPE latent it derives the group's indexer keys
// (k_norm(wk·latent), RoPE, FP4) and its main entries (RoPE, FP4 with e4m3 scales).
void DeepseekV4Model::v41_compress(const Chunk& c, int layer, const HostTensor& x, V4LayerState& st) const {
  const auto& a = w_.layers[layer].attn;
  const int r = config_.layers[layer].compress_ratio;
  const int64_t hd = config_.attn.head_dim, T = c.T;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  CompressorState& cs = st.compressor;
  HostTensor latent;  // [G, hd]
  int64_t G = 0;
  if (r == 1) {
    latent = linear(backend_, x.view(), a.comp_wkv);
    G = T;
  } else {
    HostTensor kv = linear(backend_, x.view(), a.comp_wkv), gate = linear(backend_, x.view(), a.comp_wgate);
    std::vector<float> ckv, cgate;
    G = take_closed_groups(cs, kv.data<float>(), gate.data<float>(), T, hd, r, ckv, cgate);
    if (G == 0) return;
    HostTensor skv(DType::kF32, {G, r, hd}), sgate(DType::kF32, {G, r, hd});
    std::copy(ckv.begin(), ckv.end(), skv.data<float>());
    std::copy(cgate.begin(), cgate.end(), sgate.data<float>());
    latent = HostTensor(DType::kF32, {G, hd});
    backend_.compress_pool({skv.view(), sgate.view(), latent.view()});
  }
  rms_norm_inplace(backend_, latent.view(), a.comp_norm, eps);
  std::vector<int64_t> pos(G);
  for (int64_t g = 0; g < G; ++g) pos[g] = (cs.emitted + g) * r;
  HostTensor p = positions_of(pos);

  // Indexer keys come from the latent before it is rotated.
  const int64_t id = config_.attn.index_head_dim;
  HostTensor k = linear(backend_, latent.view(), a.idx_wk);  // [G, Id]
  rms_norm_inplace(backend_, k.view(), a.idx_k_norm, eps);
  backend_.rope({k.view().reshape({G, 1, id}), p.view(), compress_inv_freq_.view(), false});
  backend_.fake_quant({k.view(), FakeQuantKind::kFP4Ue8m0Block32});
  st.index_keys.insert(st.index_keys.end(), k.data<float>(), k.data<float>() + G * id);

  backend_.rope({latent.view().reshape({G, 1, hd}), p.view(), compress_inv_freq_.view(), false});
  backend_.fake_quant({latent.view(), FakeQuantKind::kFP4E4m3Block16});
  st.entries.insert(st.entries.end(), latent.data<float>(), latent.data<float>() + G * hd);
  cs.emitted += G;
  st.n_entries += G;
}

HostTensor DeepseekV4Model::attention(const Chunk& c, int layer, const HostTensor& x, V4SequenceState& seq,
                                      Selection& sel) const {
  const LayerPlan& plan = config_.layers[layer];
  const V4AttentionWeights& a = w_.layers[layer].attn;
  const auto& ac = config_.attn;
  const bool v41 = config_.family == ModelFamily::kDeepseekV41;
  const int64_t T = c.T, H = config_.num_heads, hd = ac.head_dim, D = config_.hidden_size;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  const Tensor inv_freq = plan.compress_rope ? compress_inv_freq_.view() : main_inv_freq_.view();
  V4LayerState& st = seq.layers[layer];

  // Queries: q_r = q_norm(wq_a·x) [T, ql]; q = wq_b·q_r [T, H, hd] (V4: + per-head unweighted RMSNorm).
  HostTensor q_r = linear(backend_, x.view(), a.wq_a);
  rms_norm_inplace(backend_, q_r.view(), a.q_norm, eps);
  HostTensor q = linear(backend_, q_r.view(), a.wq_b);
  if (ac.q_head_norm) rms_norm_inplace(backend_, q.view().reshape({T * H, hd}), HostTensor{}, eps);
  backend_.rope({q.view().reshape({T, H, hd}), c.positions.view(), inv_freq, false});

  // K = V latent: kv_norm(wkv·x) [T, hd], RoPE; V4.1 stores it FP8-fake-quantized.
  HostTensor kv = linear(backend_, x.view(), a.wkv);
  rms_norm_inplace(backend_, kv.view(), a.kv_norm, eps);
  backend_.rope({kv.view().reshape({T, 1, hd}), c.positions.view(), inv_freq, false});
  if (v41) backend_.fake_quant({kv.view(), FakeQuantKind::kFP8E4M3Ue8m0Block32});

  // Window keys: the ring's last (window − 1) tokens, then this chunk; then the ring takes the new rows.
  SwaRing& ring = st.window;
  const int64_t past_begin = std::max<int64_t>(0, c.p0 - (ring.capacity - 1)), n_past = c.p0 - past_begin;
  HostTensor window_kv(DType::kF32, {n_past + T, hd}), kv_pos(DType::kI64, {n_past + T});
  for (int64_t i = 0; i < n_past; ++i) {
    const int64_t p = past_begin + i;
    std::memcpy(window_kv.data<float>() + i * hd, ring.rows.data() + (p % ring.capacity) * hd, sizeof(float) * hd);
    kv_pos.data<int64_t>()[i] = p;
  }
  std::memcpy(window_kv.data<float>() + n_past * hd, kv.data<float>(), sizeof(float) * T * hd);
  for (int64_t t = 0; t < T; ++t) {
    kv_pos.data<int64_t>()[n_past + t] = c.p0 + t;
    std::memcpy(ring.rows.data() + ((c.p0 + t) % ring.capacity) * hd, kv.data<float>() + t * hd, sizeof(float) * hd);
  }

  // Compressed branch: entries of the kv source and, per query, which of them to attend.
  const V4LayerState* src = nullptr;
  HostTensor comp_mask;
  if (plan.compress_ratio > 0) {
    const int r = plan.compress_ratio;
    const int64_t IH = ac.index_n_heads, Id = ac.index_head_dim;
    auto index_scores = [&](const V4LayerState& keys_of, bool fp4) {
      HostTensor qi = linear(backend_, q_r.view(), a.idx_wq_b);  // [T, IH·Id]
      backend_.rope({qi.view().reshape({T, IH, Id}), c.positions.view(), compress_inv_freq_.view(), false});
      if (fp4) backend_.fake_quant({qi.view().reshape({T * IH, Id}), FakeQuantKind::kFP4Ue8m0Block32});
      HostTensor wts = linear(backend_, x.view(), a.idx_weights_proj);  // [T, IH]
      const int64_t n = keys_of.n_entries;
      HostTensor scores(DType::kF32, {T, n});
      IndexerScoreParams s;
      s.q = qi.view().reshape({T, IH, Id});
      s.keys = Tensor(const_cast<float*>(keys_of.index_keys.data()), DType::kF32, {n, Id});
      s.weights = wts.view();
      s.positions = c.positions.view();
      s.out = scores.view();
      s.ratio = r;
      s.score_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(Id)));
      s.weight_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(IH)));
      backend_.indexer_scores(s);
      return scores;
    };
    if (!v41) {
      v4_compress(c, layer, x, st, /*indexer=*/false);
      src = &st;
      const int64_t n = st.n_entries;
      comp_mask = HostTensor(DType::kU8, {T, n});
      if (plan.attention == AttentionKind::kCSA) {
        v4_compress(c, layer, x, st, /*indexer=*/true);
        HostTensor scores = index_scores(st, /*fp4=*/false);
        backend_.topk_mask({scores.view(), Tensor{}, comp_mask.view(), ac.index_topk});
      } else {
        // HCA attends every entry the query can see: w < (p + 1) / r.
        for (int64_t t = 0; t < T; ++t)
          for (int64_t e = 0; e < n; ++e) comp_mask.data<uint8_t>()[t * n + e] = e < (c.p0 + t + 1) / r;
      }
    } else {
      if (plan.kv_source == layer) v41_compress(c, layer, x, st);
      src = &seq.layers[plan.kv_source];
      const int64_t n = src->n_entries;
      if (plan.index_source == layer && n > 0) {
        HostTensor scores = index_scores(*src, /*fp4=*/true);
        Tensor allowed;
        if (plan.candidate_source) {
          sel.candidates = HostTensor(DType::kU8, {T, n});
          backend_.candidate_blocks({scores.view(), c.positions.view(), sel.candidates.view(), r,
                                     ac.candidate_topk_blocks, ac.candidate_block_size});
          sel.n_candidates = n;
        } else if (plan.csa2_role == Csa2Role::kReindex && sel.n_candidates == n) {
          allowed = sel.candidates.view();
        }
        sel.topk = HostTensor(DType::kU8, {T, n});
        backend_.topk_mask({scores.view(), allowed, sel.topk.view(), ac.index_topk});
        sel.n_topk = n;
      }
      // Reuse layers read the latest published selection; without one over these entries, none is attended.
      comp_mask = sel.n_topk == n ? copy_tensor(sel.topk) : HostTensor(DType::kU8, {T, n});
    }
  }

  // Sink attention over [window ∥ selected entries]: out [T, H, hd].
  HostTensor attn(DType::kF32, {T, H, hd});
  SinkAttentionParams p;
  p.q = q.view().reshape({T, H, hd});
  p.q_positions = c.positions.view();
  p.window_kv = window_kv.view();
  p.kv_positions = kv_pos.view();
  if (src && src->n_entries > 0) {
    p.compressed = Tensor(const_cast<float*>(src->entries.data()), DType::kF32, {src->n_entries, hd});
    p.comp_mask = comp_mask.view();
  }
  p.sinks = a.sinks.view();
  p.out = attn.view();
  p.window = ac.sliding_window;
  p.scale = static_cast<float>(attention_softmax_scale(config_));
  backend_.sink_attention(p);
  // K = V carried the keys' RoPE: rotate the output back by the query position.
  backend_.rope({attn.view(), c.positions.view(), inv_freq, true});

  // Grouped low-rank output: heads split into G groups, z_g = wo_a[g]·o_g, out = wo_b·[z_0 … z_{G−1}].
  const int64_t G = ac.o_groups, ol = ac.o_lora_rank, gw = H * hd / G;
  HostTensor z(DType::kF32, {T, G * ol}), og(DType::kF32, {T, gw}), zg(DType::kF32, {T, ol});
  for (int64_t g = 0; g < G; ++g) {
    for (int64_t t = 0; t < T; ++t)
      std::memcpy(og.data<float>() + t * gw, attn.data<float>() + t * H * hd + g * gw, sizeof(float) * gw);
    Tensor wg(a.wo_a.data<float>() + g * ol * gw, DType::kF32, {ol, gw});
    backend_.linear({og.view(), wg, zg.view()});
    for (int64_t t = 0; t < T; ++t)
      std::memcpy(z.data<float>() + t * G * ol + g * ol, zg.data<float>() + t * ol, sizeof(float) * ol);
  }
  HostTensor out(DType::kF32, {T, D});
  backend_.linear({z.view(), a.wo_b.view(), out.view()});
  return out;
}

}  // namespace deepinfer
