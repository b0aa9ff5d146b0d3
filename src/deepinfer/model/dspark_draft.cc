#include "deepinfer/model/dspark_draft.h"
#include "deepinfer/model/output_head.h"
#include "deepinfer/model/v4_draft_block.h"

#include <algorithm>
#include <cmath>

namespace deepinfer {

std::string DsparkDraft::unavailable_reason(const DeepseekV4Model& target) {
  const ModelConfig& c = target.config();
  if (c.draft.kind != DraftKind::kDSpark)
    return "the model config has no DSpark draft (needs dspark_block_size and draft layers: "
           "num_nextn_predict_layers or trailing compress_ratios entries)";
  if (!target.weights().dspark) return "the checkpoint has no DSpark draft tensors (mtp.0.main_proj.weight, ...)";
  if (c.draft.noise_token_id < 0 || c.draft.noise_token_id >= c.vocab_size)
    return "dspark_noise_token_id " + std::to_string(c.draft.noise_token_id) + " is outside the vocabulary [0, " +
           std::to_string(c.vocab_size) + ")";
  return "";
}

DsparkDraft::DsparkDraft(const DeepseekV4Model& target, int64_t rollback_slack)
    : target_(target), slack_(rollback_slack) {
  const std::string why = unavailable_reason(target);
  DI_CHECK_CODE(why.empty(), ErrorCode::kUnsupported) << "speculative decoding with DSpark: " << why;
  DI_CHECK(rollback_slack >= 0) << "DsparkDraft: rollback_slack must be >= 0, got " << rollback_slack;
}

DsparkContext DsparkDraft::new_context() const {
  DsparkContext ctx;
  ctx.capacity = window() + slack_;
  for (int l = 0; l < config().draft.num_layers; ++l)
    ctx.rings.push_back(target_.memory().zeros(DType::kF32, {ctx.capacity, config().attn.head_dim}));
  ctx.slot_position.assign(static_cast<size_t>(ctx.capacity), -1);
  return ctx;
}

void DsparkDraft::append_context(DsparkContext& ctx, const Tensor& rows, int64_t first_position) const {
  const ModelConfig& c = config();
  const int64_t D = c.hidden_size, width = static_cast<int64_t>(target_layers().size()) * D;
  DI_CHECK(rows.rank() == 2 && rows.dim(1) == width)
      << "DSpark context: captured rows must be [n, " << width << "] (" << target_layers().size()
      << " target layers x hidden " << D << ")";
  DI_CHECK(first_position >= ctx.num_positions)
      << "DSpark context: position " << first_position << " is already cached (next is " << ctx.num_positions << ")";
  const int64_t n = rows.dim(0);
  if (n == 0) {
    ctx.num_positions = std::max(ctx.num_positions, first_position);
    return;
  }
  // Only the newest `capacity` positions can survive in the rings.
  const int64_t keep = std::min(n, ctx.capacity), skip = n - keep;
  Backend& b = target_.backend();
  TensorMemory& mem = target_.memory();
  const float eps = static_cast<float>(c.rms_norm_eps);
  OwnedTensor main_x = v4_draft_linear(target_, rows.slice(skip, n), w().main_proj);
  b.rms_norm({main_x.view(), w().main_norm.view(), main_x.view(), eps});
  std::vector<int64_t> pos(static_cast<size_t>(keep));
  for (int64_t i = 0; i < keep; ++i) pos[i] = first_position + skip + i;
  OwnedTensor positions = mem.from_host(DType::kI64, {keep}, pos.data());
  for (int l = 0; l < c.draft.num_layers; ++l) {
    OwnedTensor kv = v4_draft_kv(target_, w().layers[l].attn, main_x.view(), positions);
    for (int64_t i = 0; i < keep; ++i) {
      const int64_t slot = pos[i] % ctx.capacity;
      mem.copy(ctx.rings[l].view().slice(slot, slot + 1), kv.view().slice(i, i + 1));
    }
  }
  for (int64_t p : pos) ctx.slot_position[p % ctx.capacity] = p;
  ctx.num_positions = first_position + n;
}

void DsparkDraft::truncate(DsparkContext& ctx, int64_t num_positions) const {
  DI_CHECK(num_positions >= 0 && num_positions <= ctx.num_positions)
      << "DSpark rollback to " << num_positions << " outside [0, " << ctx.num_positions << "]";
  DI_CHECK(ctx.num_positions - num_positions <= slack_) << "DSpark rollback of " << ctx.num_positions - num_positions
                                                        << " positions exceeds the cache's slack of " << slack_;
  for (int64_t& p : ctx.slot_position)
    if (p >= num_positions) p = -1;
  ctx.num_positions = num_positions;
}

OwnedTensor DsparkDraft::attention(int layer, const Tensor& x, const DsparkContext& ctx, const OwnedTensor& positions,
                                   int64_t anchor_position) const {
  const ModelConfig& c = config();
  const V4AttentionWeights& a = w().layers[layer].attn;
  Backend& b = target_.backend();
  TensorMemory& mem = target_.memory();
  const int64_t B = x.dim(0), H = c.num_heads, hd = c.attn.head_dim;
  OwnedTensor q = v4_draft_queries(target_, a, x, positions);
  OwnedTensor kv = v4_draft_kv(target_, a, x, positions);

  // Context keys: the window before the anchor, in position order.
  std::vector<int64_t> slots;
  for (int64_t p = std::max<int64_t>(0, anchor_position - window()); p < anchor_position; ++p)
    if (ctx.slot_position[p % ctx.capacity] == p) slots.push_back(p % ctx.capacity);
  const int64_t n_ctx = static_cast<int64_t>(slots.size());
  OwnedTensor context;
  if (n_ctx > 0) {
    context = mem.empty(DType::kF32, {n_ctx, hd});  // every row copied below
    for (int64_t i = 0; i < n_ctx; ++i)
      mem.copy(context.view().slice(i, i + 1), ctx.rings[layer].view().slice(slots[i], slots[i] + 1));
  }
  // Non-causal block: every block key is given the anchor's position and the window spans the block, so each
  // query sees all B block keys; the context rides as always-visible extra entries.
  std::vector<int64_t> at_anchor(static_cast<size_t>(B), anchor_position);
  OwnedTensor key_positions = mem.from_host(DType::kI64, {B}, at_anchor.data());
  OwnedTensor attn = mem.empty(DType::kF32, {B, H, hd});
  SinkAttentionParams p;
  p.q = q.view().reshape({B, H, hd});
  p.q_positions = positions.view();
  p.window_kv = kv.view();
  p.kv_positions = key_positions.view();
  if (n_ctx > 0) p.compressed = context.view();
  p.sinks = a.sinks.view();
  p.out = attn.view();
  p.window = static_cast<int>(B);
  p.scale = static_cast<float>(attention_softmax_scale(c));
  b.sink_attention(p);
  return v4_draft_output(target_, a, attn, positions);
}

OwnedTensor DsparkDraft::moe(int layer, const Tensor& x) const {
  return v4_draft_moe(target_, w().layers[layer], x, config().draft.num_experts_per_tok);
}

DsparkBlockOutput DsparkDraft::block(const DsparkContext& ctx, int64_t anchor) const {
  const ModelConfig& c = config();
  const int64_t B = block_size(), D = c.hidden_size, hc = c.hc.hc_mult, V = c.vocab_size;
  const bool v41 = c.family == ModelFamily::kDeepseekV41;
  const float eps = static_cast<float>(c.rms_norm_eps);
  DI_CHECK(anchor >= 0 && anchor < V) << "DSpark: anchor token " << anchor << " outside the vocabulary";
  Backend& b = target_.backend();
  TensorMemory& mem = target_.memory();
  const V4Weights& tw = target_.weights();
  const int64_t P = ctx.num_positions;

  std::vector<int64_t> ids(static_cast<size_t>(B), c.draft.noise_token_id), pos(static_cast<size_t>(B));
  ids[0] = anchor;
  for (int64_t i = 0; i < B; ++i) pos[i] = P + i;
  OwnedTensor id_t = mem.from_host(DType::kI64, {B}, ids.data());
  OwnedTensor positions = mem.from_host(DType::kI64, {B}, pos.data());
  // Buffers an op writes in full take no zero fill (DsparkDraftTest.ReadsNoBufferNoOpWrote: poisoned memory).
  OwnedTensor x = mem.empty(DType::kF32, {B, D});
  b.embedding({tw.embed.view(), id_t.view(), x.view()});
  OwnedTensor streams = mem.empty(DType::kF32, {B, hc, D});
  mem.copy(streams.view(), Tensor(x.view().data(), DType::kF32, {B, hc, D}, {D, 0, 1}, x.device()));

  std::vector<float> one_hot(static_cast<size_t>(B * hc), 0.0f);
  for (int64_t t = 0; t < B; ++t) one_hot[t * hc] = 1.0f;
  OwnedTensor carried_pre = mem.from_host(DType::kF32, {B, hc}, one_hot.data());
  OwnedTensor post = mem.empty(DType::kF32, {B, hc}), comb = mem.empty(DType::kF32, {B, hc, hc});
  auto mix = [&](const OwnedTensor& fn, const OwnedTensor& base, const OwnedTensor& scale, OwnedTensor& pre_out) {
    b.hc_mix({streams.view(), fn.view(), base.view(), scale.view(), pre_out.view(), post.view(), comb.view(), eps,
              static_cast<float>(c.hc.eps), c.hc.sinkhorn_iters});
  };
  auto collapse_norm = [&](const OwnedTensor& weights, const OwnedTensor& norm) {
    OwnedTensor h = mem.empty(DType::kF32, {B, D});
    b.hc_collapse({streams.view(), weights.view(), h.view()});
    b.rms_norm({h.view(), norm.view(), h.view(), eps});
    return h;
  };
  for (int l = 0; l < c.draft.num_layers; ++l) {
    const V4LayerWeights& lw = w().layers[l];
    OwnedTensor attn_pre = mem.empty(DType::kF32, {B, hc});
    mix(lw.hc_attn_fn, lw.hc_attn_base, lw.hc_attn_scale, attn_pre);
    OwnedTensor h = collapse_norm(v41 ? carried_pre : attn_pre, lw.attn_norm);
    OwnedTensor y = attention(l, h.view(), ctx, positions, P);
    b.hc_expand({streams.view(), y.view(), post.view(), comb.view()});
    OwnedTensor ffn_pre = mem.empty(DType::kF32, {B, hc});
    mix(lw.hc_ffn_fn, lw.hc_ffn_base, lw.hc_ffn_scale, ffn_pre);
    h = collapse_norm(v41 ? attn_pre : ffn_pre, lw.ffn_norm);
    y = moe(l, h.view());
    b.hc_expand({streams.view(), y.view(), post.view(), comb.view()});
    if (v41) carried_pre = std::move(ffn_pre);
  }
  if (!v41) {
    b.hc_head({streams.view(), w().hc_head_fn.view(), w().hc_head_base.view(), w().hc_head_scale.view(),
               carried_pre.view(), eps, static_cast<float>(c.hc.eps)});
  }
  OwnedTensor hidden = collapse_norm(carried_pre, w().norm);
  OwnedTensor logits = mem.empty(DType::kF32, {B, V});
  head_linear(b, hidden.view(), tw.head.view(), logits.view());
  return {mem.to_host(hidden), mem.to_host(logits)};
}

std::vector<float> DsparkDraft::markov_bias(int64_t token) const {
  const int64_t V = config().vocab_size, r = config().draft.markov_rank;
  DI_CHECK(token >= 0 && token < V) << "DSpark: token " << token << " outside the vocabulary";
  Backend& b = target_.backend();
  TensorMemory& mem = target_.memory();
  OwnedTensor id = mem.from_host(DType::kI64, {1}, &token);
  OwnedTensor e = mem.empty(DType::kF32, {1, r});
  b.embedding({w().markov_embed.view(), id.view(), e.view()});
  OwnedTensor bias = v4_draft_linear(target_, e.view(), w().markov_head);
  HostTensor host = mem.to_host(bias);
  return std::vector<float>(host.data<float>(), host.data<float>() + V);
}

float DsparkDraft::confidence(std::span<const float> hidden, int64_t token) const {
  const int64_t D = config().hidden_size, r = config().draft.markov_rank;
  DI_CHECK(static_cast<int64_t>(hidden.size()) == D)
      << "DSpark confidence: hidden has " << hidden.size() << " values, expected " << D;
  DI_CHECK(token >= 0 && token < config().vocab_size) << "DSpark: token " << token << " outside the vocabulary";
  Backend& b = target_.backend();
  TensorMemory& mem = target_.memory();
  OwnedTensor features = mem.empty(DType::kF32, {1, D + r});  // both parts copied below
  OwnedTensor h = mem.from_host(DType::kF32, {1, D}, hidden.data());
  mem.copy(narrow(features.view(), 1, 0, D), h.view());
  OwnedTensor id = mem.from_host(DType::kI64, {1}, &token);
  OwnedTensor e = mem.empty(DType::kF32, {1, r});
  b.embedding({w().markov_embed.view(), id.view(), e.view()});
  mem.copy(narrow(features.view(), 1, D, D + r), e.view());
  HostTensor z = mem.to_host(v4_draft_linear(target_, features.view(), w().confidence));
  return static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(z.data<float>()[0]))));
}

DsparkProposal DsparkDraft::propose(const DsparkContext& ctx, int64_t anchor, int n, const Pick& pick) const {
  DI_CHECK(n >= 0 && n <= block_size()) << "DSpark: " << n << " draft tokens requested, the block has " << block_size();
  const int64_t V = config().vocab_size, D = config().hidden_size;
  DsparkProposal out;
  out.logits = HostTensor(DType::kF32, {n, V});
  if (n == 0) return out;
  const DsparkBlockOutput base = block(ctx, anchor);
  int64_t x = anchor;
  for (int i = 0; i < n; ++i) {
    const float* u = base.base_logits.data<float>() + i * V;
    float* row = out.logits.data<float>() + i * V;
    const std::vector<float> bias = markov_bias(x);
    for (int64_t v = 0; v < V; ++v) row[v] = u[v] + bias[v];
    out.confidence.push_back(confidence({base.hidden.data<float>() + i * D, static_cast<size_t>(D)}, x));
    x = pick(i, {row, static_cast<size_t>(V)});
    DI_CHECK(x >= 0 && x < V) << "DSpark: picked token " << x << " outside the vocabulary";
    out.tokens.push_back(x);
  }
  return out;
}

}  // namespace deepinfer
