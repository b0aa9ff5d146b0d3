#include "deepinfer/model/v4_mtp_draft.h"

#include <algorithm>

#include "deepinfer/model/output_head.h"
#include "deepinfer/model/v4_draft_block.h"

namespace deepinfer {

std::string V4MtpDraft::unavailable_reason(const DeepseekV4Model& target) {
  const ModelConfig& c = target.config();
  if (c.family != ModelFamily::kDeepseekV4 || c.draft.kind != DraftKind::kMTP)
    return "the model config has no V4 MTP layers (a DeepSeek-V4-Flash base config with num_nextn_predict_layers > "
           "0 and no DSpark draft)";
  if (!target.weights().mtp) return "the checkpoint has no MTP tensors (mtp.0.e_proj.weight, ...)";
  return "";
}

V4MtpDraft::V4MtpDraft(const DeepseekV4Model& target, int64_t rollback_slack)
    : target_(target), slack_(rollback_slack) {
  const std::string why = unavailable_reason(target);
  DI_CHECK_CODE(why.empty(), ErrorCode::kUnsupported) << "speculative decoding with MTP: " << why;
  DI_CHECK(rollback_slack >= 0) << "V4MtpDraft: rollback_slack must be >= 0, got " << rollback_slack;
}

V4MtpCache V4MtpDraft::new_cache(int64_t base) const {
  V4MtpCache cache;
  cache.capacity = window() + slack_;
  cache.ring = target_.memory().zeros(DType::kF32, {cache.capacity, config().attn.head_dim});
  cache.slot_position.assign(static_cast<size_t>(cache.capacity), -1);
  cache.kv_base = cache.num_tokens = base;
  return cache;
}

void V4MtpDraft::truncate(V4MtpCache& cache, int64_t num_tokens) const {
  DI_CHECK(num_tokens >= cache.kv_base && num_tokens <= cache.num_tokens)
      << "V4 MTP rollback to " << num_tokens << " outside [" << cache.kv_base << ", " << cache.num_tokens << "]";
  const bool restart = cache.num_tokens - num_tokens > slack_;
  for (int64_t& p : cache.slot_position)
    if (p >= num_tokens || restart) p = -1;
  if (restart) cache.kv_base = num_tokens;
  cache.num_tokens = num_tokens;
}

OwnedTensor V4MtpDraft::attention(const Tensor& x, V4MtpCache& cache, const OwnedTensor& positions, int64_t p0) const {
  const ModelConfig& c = config();
  const V4AttentionWeights& a = w().block.attn;
  Backend& b = target_.backend();
  TensorMemory& mem = target_.memory();
  const int64_t T = x.dim(0), H = c.num_heads, hd = c.attn.head_dim;
  OwnedTensor q = v4_draft_queries(target_, a, x, positions);
  OwnedTensor kv = v4_draft_kv(target_, a, x, positions);

  // Keys: the cached window before the chunk (positions the chunk's first query can see), then the chunk's own.
  std::vector<int64_t> key_pos;
  for (int64_t p = std::max(cache.kv_base, p0 - window() + 1); p < p0; ++p)
    if (cache.slot_position[p % cache.capacity] == p) key_pos.push_back(p);
  const int64_t n_ctx = static_cast<int64_t>(key_pos.size());
  OwnedTensor keys = mem.empty(DType::kF32, {n_ctx + T, hd});  // every row copied below
  for (int64_t i = 0; i < n_ctx; ++i) {
    const int64_t slot = key_pos[i] % cache.capacity;
    mem.copy(keys.view().slice(i, i + 1), cache.ring.view().slice(slot, slot + 1));
  }
  mem.copy(keys.view().slice(n_ctx, n_ctx + T), kv.view());
  for (int64_t t = 0; t < T; ++t) key_pos.push_back(p0 + t);
  OwnedTensor key_positions = mem.from_host(DType::kI64, {n_ctx + T}, key_pos.data());
  OwnedTensor attn = mem.empty(DType::kF32, {T, H, hd});
  SinkAttentionParams p;
  p.q = q.view().reshape({T, H, hd});
  p.q_positions = positions.view();
  p.window_kv = keys.view();
  p.kv_positions = key_positions.view();
  p.sinks = a.sinks.view();
  p.out = attn.view();
  p.window = static_cast<int>(window());
  p.scale = static_cast<float>(attention_softmax_scale(c));
  b.sink_attention(p);

  // The chunk's rows enter the ring (only the newest `capacity` can stay).
  for (int64_t t = std::max<int64_t>(0, T - cache.capacity); t < T; ++t) {
    const int64_t slot = (p0 + t) % cache.capacity;
    mem.copy(cache.ring.view().slice(slot, slot + 1), kv.view().slice(t, t + 1));
    cache.slot_position[slot] = p0 + t;
  }
  return v4_draft_output(target_, a, attn, positions);
}

HostTensor V4MtpDraft::forward(V4MtpCache& cache, std::span<const float> streams, std::span<const int64_t> next_ids,
                               HostTensor* out_streams) const {
  const ModelConfig& c = config();
  const int64_t T = static_cast<int64_t>(next_ids.size()), D = c.hidden_size, hc = c.hc.hc_mult, V = c.vocab_size;
  const float eps = static_cast<float>(c.rms_norm_eps), hc_eps = static_cast<float>(c.hc.eps);
  DI_CHECK(T > 0) << "V4 MTP forward: empty chunk";
  DI_CHECK(static_cast<int64_t>(streams.size()) == T * hc * D)
      << "V4 MTP forward: " << streams.size() << " stream values for " << T << " positions of width " << hc * D;
  DI_CHECK(cache.capacity > 0) << "V4 MTP forward: not a cache of this module (new_cache)";
  for (int64_t id : next_ids)
    DI_CHECK(id >= 0 && id < V) << "V4 MTP forward: token " << id << " outside the vocabulary";
  Backend& b = target_.backend();
  TensorMemory& mem = target_.memory();
  const V4MtpWeights& m = w();
  const int64_t p0 = cache.num_tokens;
  std::vector<int64_t> pos(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) pos[t] = p0 + t;
  OwnedTensor positions = mem.from_host(DType::kI64, {T}, pos.data());

  // e = e_proj(enorm(embed(next))), the embedding zeroed at position 0.
  OwnedTensor ids = mem.from_host(DType::kI64, {T}, next_ids.data());
  // Buffers an op writes in full take no zero fill (V4MtpDraft.ReadsNoBufferNoOpWrote runs this on poisoned memory).
  OwnedTensor e = mem.empty(DType::kF32, {T, D});
  b.embedding({target_.weights().embed.view(), ids.view(), e.view()});
  if (p0 == 0) mem.fill(e.view().slice(0, 1), 0.0f);
  b.rms_norm({e.view(), m.enorm.view(), e.view(), eps});
  OwnedTensor e_p = v4_draft_linear(target_, e.view(), m.e_proj);
  // Stream k: h_proj(hnorm(X_k)) + e.
  OwnedTensor x = mem.from_host(DType::kF32, {T * hc, D}, streams.data());
  b.rms_norm({x.view(), m.hnorm.view(), x.view(), eps});
  OwnedTensor s = v4_draft_linear(target_, x.view(), m.h_proj);
  OwnedTensor e_b = mem.empty(DType::kF32, {T, hc, D});
  mem.copy(e_b.view(), Tensor(e_p.view().data(), DType::kF32, {T, hc, D}, {D, 0, 1}, e_p.device()));
  mem.add(s.view(), e_b.view().reshape({T * hc, D}));
  const Tensor st = s.view().reshape({T, hc, D});

  // The block: each mHC site collapses with its own pre (V4).
  const V4LayerWeights& lw = m.block;
  OwnedTensor pre = mem.empty(DType::kF32, {T, hc}), post = mem.empty(DType::kF32, {T, hc});
  OwnedTensor comb = mem.empty(DType::kF32, {T, hc, hc});
  auto collapse_norm = [&](const OwnedTensor& norm) {
    OwnedTensor h = mem.empty(DType::kF32, {T, D});
    b.hc_collapse({st, pre.view(), h.view()});
    b.rms_norm({h.view(), norm.view(), h.view(), eps});
    return h;
  };
  b.hc_mix({st, lw.hc_attn_fn.view(), lw.hc_attn_base.view(), lw.hc_attn_scale.view(), pre.view(), post.view(),
            comb.view(), eps, hc_eps, c.hc.sinkhorn_iters});
  OwnedTensor h = collapse_norm(lw.attn_norm);
  OwnedTensor y = attention(h.view(), cache, positions, p0);
  b.hc_expand({st, y.view(), post.view(), comb.view()});
  b.hc_mix({st, lw.hc_ffn_fn.view(), lw.hc_ffn_base.view(), lw.hc_ffn_scale.view(), pre.view(), post.view(),
            comb.view(), eps, hc_eps, c.hc.sinkhorn_iters});
  h = collapse_norm(lw.ffn_norm);
  y = v4_draft_moe(target_, lw, h.view(), c.moe.num_experts_per_tok);
  b.hc_expand({st, y.view(), post.view(), comb.view()});
  cache.num_tokens = p0 + T;
  if (out_streams) *out_streams = mem.to_host(s.view().reshape({T, hc * D}));

  // Logits: the module's hc_head and norm, the target's head.
  b.hc_head({st, m.hc_head_fn.view(), m.hc_head_base.view(), m.hc_head_scale.view(), pre.view(), eps, hc_eps});
  h = collapse_norm(m.norm);
  OwnedTensor logits = mem.empty(DType::kF32, {T, V});
  head_linear(b, h.view(), target_.weights().head.view(), logits.view());
  return mem.to_host(logits);
}

}  // namespace deepinfer
