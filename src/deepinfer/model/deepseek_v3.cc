// DeepSeek-V3 family forward: embedding → per layer [x += MLA(norm(x)); x += FFN(norm(x))] → norm → head,
// where FFN is a SwiGLU on the first first_k_dense_replace layers and routed experts + shared expert after.
//
// V3 vs V2-Lite in this file (both from config, no model_type switches):
//   - query: q_a_proj → q_a_layernorm → q_b_proj when q_lora_rank is set, a single q_proj when it is null;
//   - routing: sigmoid + e_score_correction_bias + group-limited top-k, unbiased weights renormalised and
//     scaled by routed_scaling_factor (V3 noaux_tc), or softmax + plain top-k (V2-Lite greedy).
//
// RoPE: the checkpoint's rope slices are interleaved pairs. transformers (rope_interleave) de-interleaves q
// and k identically before a rotate-half, which leaves q·k unchanged; the rope op rotates the pairs in place,
// so our cached k_pe keeps the checkpoint's (official code's) channel order.
#include "deepinfer/model/deepseek_v3.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "deepinfer/io/checkpoint.h"
#include "deepinfer/model/weight_loader.h"
#include "deepinfer/ops/rope_table.h"

namespace deepinfer {

namespace {

// transformers builds q_a_layernorm and kv_a_layernorm with the RMSNorm default eps, not rms_norm_eps.
constexpr float kLatentNormEps = 1e-6f;

// YaRN's attention_factor multiplies cos and sin, i.e. scales every rotated channel: the trailing `dr` channels
// of each row of t [rows, width]. No released config has a factor other than 1, so this rare path goes through
// the host rather than adding a scale op to every backend.
void scale_trailing(TensorMemory& mem, const Tensor& t, int64_t dr, float factor) {
  HostTensor h = mem.to_host(t);
  const int64_t width = t.shape().back(), rows = t.numel() / width;
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = width - dr; j < width; ++j) h.data<float>()[i * width + j] *= factor;
  mem.copy(t, h.view());
}

OwnedTensor positions_from(TensorMemory& mem, int64_t first, int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), first);
  return mem.from_host(DType::kI64, {n}, v.data());
}

}  // namespace

// One forward call: T tokens at absolute positions p0 .. p0+T-1; the cache then holds S = p0 + T rows.
// One forward call over a chunk of `total` tokens at absolute positions p0 .. p0+total-1; the cache then holds
// S = p0 + total rows. This rank computes T of them (all, or its CP share) at `positions` (ascending).
struct DeepseekV3Model::Chunk {
  int64_t T = 0;
  int64_t total = 0;
  int64_t p0 = 0;
  std::vector<int64_t> host_positions;  // [T]
  OwnedTensor positions;                // i64 [T]
  int64_t kv_base = 0;                  // first cached position (0 but for an MTP cache started at a prefix hit)
  OwnedTensor kv_positions;             // i64 [S - kv_base]: kv_base .. S-1
  const CpShard* cp = nullptr;
  // decode_step: row t is the next token of a paged sequence at positions[t], its cache row written to pool row
  // write_rows[t] of every layer (device data only, so that the step can be recorded).
  V3KvPages* decode_pages = nullptr;
  int block_size = 0;
  OwnedTensor q_seq;       // i32 [T]: the block-table row of each query row
  OwnedTensor tables;      // i32 [rows, max_blocks], -1 past a sequence's blocks
  OwnedTensor write_rows;  // i64 [T]
};

// A whole chunk on this rank (no context parallelism): the MTP module's calls.
DeepseekV3Model::Chunk DeepseekV3Model::make_chunk(int64_t p0, int64_t T, int64_t kv_base) const {
  Chunk c;
  c.T = T;
  c.total = T;
  c.p0 = p0;
  c.kv_base = kv_base;
  c.host_positions.resize(T);
  for (int64_t t = 0; t < T; ++t) c.host_positions[t] = p0 + t;
  c.positions = memory().from_host(DType::kI64, {T}, c.host_positions.data());
  c.kv_positions = positions_from(memory(), kv_base, p0 + T - kv_base);
  return c;
}

std::unique_ptr<DeepseekV3Model> DeepseekV3Model::load(const std::string& dir, Backend& backend,
                                                       V3WeightStorage storage, const ExpertFilter& resident) {
  ModelConfig config = load_model_config(dir + "/config.json");
  DI_CHECK_CODE(config.family == ModelFamily::kDeepseekV3, ErrorCode::kUnsupported)
      << dir << ": model family " << family_name(config.family) << " is not DeepSeek-V3/V2";
  auto ckpt = Checkpoint::open(dir);
  // Weights are read (and dequantized where kept f32) on the host; a device backend gets them uploaded by the
  // constructor, FP8 matrices in their format unless told otherwise.
  std::unique_ptr<Backend> host_backend;
  const bool device = backend_memory(backend).device().kind != DeviceKind::kCPU;
  if (device) host_backend = make_cpu_backend(0);
  // kAuto keeps f32 on every backend: exact against the f32 goldens, and expert parallelism needs f32 experts.
  // kFP8 opts in. Its accuracy on CUDA is the bf16 rounding of the many-row FP8 GEMMs, not a bug: on the H200 the
  // golden-shaped FP8 checkpoint is 0.31 worst prefill row rel. error from the CPU's f32, but 0.002 from a CPU
  // emulation of that rounding (itself 0.31 from f32), and 7.7e-7 token by token (one-row GEMMs are exact); see
  // tests/cuda/cuda_v3_fp8_test.cc and docs/PERF.md.
  const bool keep_fp8 = storage == V3WeightStorage::kFP8 || storage == V3WeightStorage::kStored;
  V3Weights weights = load_v3_weights(config, *ckpt, host_backend ? *host_backend : backend, keep_fp8, resident,
                                      storage == V3WeightStorage::kStored);
  return std::make_unique<DeepseekV3Model>(std::move(config), std::move(weights), backend);
}

DeepseekV3Model::DeepseekV3Model(ModelConfig config, V3Weights weights, Backend& backend)
    : config_(std::move(config)), w_(std::move(weights)), backend_(backend), memory_(backend_memory(backend)) {
  DI_CHECK(config_.family == ModelFamily::kDeepseekV3) << "DeepseekV3Model: not a V3-family config";
  if (memory_.device().kind != DeviceKind::kCPU) upload_weights();
  const std::vector<float> f = rope_inv_freq(config_.rope);
  inv_freq_ = memory().from_host(DType::kF32, {static_cast<int64_t>(f.size())}, f.data());
  rope_magnitude_ = static_cast<float>(yarn_attention_factor(config_.rope));
  softmax_scale_ = static_cast<float>(attention_softmax_scale(config_));
}

// Each weight is loaded (and FP8-dequantized) on the host, then copied once to the device; the host copy is
// released as its OwnedTensor is replaced.
void DeepseekV3Model::upload_weights() {
  auto up = [this](OwnedTensor& t) {
    if (t.view().data() != nullptr) t = memory_.upload(t.view());
  };
  for (OwnedTensor* t : {&w_.embed, &w_.norm, &w_.head}) up(*t);
  std::vector<V3LayerWeights*> blocks;
  for (V3LayerWeights& lw : w_.layers) blocks.push_back(&lw);
  for (V3MtpWeights& m : w_.mtp) {
    for (OwnedTensor* t : {&m.enorm, &m.hnorm, &m.eh_proj, &m.head_norm}) up(*t);
    blocks.push_back(&m.block);
  }
  for (V3LayerWeights* block : blocks) {
    V3LayerWeights& lw = *block;
    V3AttentionWeights& a = lw.attn;
    for (OwnedTensor* t :
         {&lw.input_norm, &lw.post_attention_norm, &a.q_a_norm, &a.kv_a_norm, &a.kv_b, &lw.gate, &lw.gate_bias})
      up(*t);
    for (V3Matrix* m : {&a.q_a, &a.q_b, &a.q, &a.kv_a, &a.o}) upload_kept(memory_, *m);
    // Quantized experts: codes and scales per matrix, in the order load_v3_weights pushed them (w1, w3, w2 of
    // every expert, then the shared one); the QuantMatrix views are re-pointed below.
    if (lw.quant_experts) {
      for (OwnedTensor& t : lw.quant_storage) up(t);
      size_t i = 0;
      auto repoint = [&](QuantExpertWeights& e) {
        for (QuantMatrix* m : {&e.w1, &e.w3, &e.w2}) {
          m->weight = lw.quant_storage[i++].view();
          m->scale = lw.quant_storage[i++].view();
        }
      };
      for (QuantExpertWeights& e : lw.qexperts) repoint(e);
      if (lw.has_shared) repoint(lw.qshared);
      continue;
    }
    // Expert views point into expert_storage (w1, w3, w2 per expert, then the shared expert).
    for (OwnedTensor& t : lw.expert_storage) up(t);
    auto views = [&lw](size_t first) {
      return ExpertWeights{lw.expert_storage[first].view(), lw.expert_storage[first + 1].view(),
                           lw.expert_storage[first + 2].view()};
    };
    for (size_t e = 0; e < lw.experts.size(); ++e) lw.experts[e] = views(3 * e);
    if (lw.has_shared) lw.shared = views(3 * lw.experts.size());
  }
}

V3KvPages DeepseekV3Model::new_kv_pages(bool) const {
  V3KvPages p;
  p.layers.assign(config_.num_layers, PagedRows(config_.mla.kv_lora_rank + config_.mla.qk_rope_head_dim, 1, kv_dtype_));
  return p;
}

void DeepseekV3Model::set_kv_cache_dtype(DType dtype) {
  DI_CHECK(dtype == DType::kF32 || dtype == DType::kBF16)
      << "the MLA cache is kept in f32 or bf16, not " << dtype_name(dtype);
  kv_dtype_ = dtype;
}

int64_t V3KvPages::bytes_per_block(int block_size) const {
  int64_t b = 0;
  for (const PagedRows& r : layers) b += r.bytes_per_block(block_size);
  return b;
}

int64_t V3KvPages::bytes_allocated() const {
  int64_t b = 0;
  for (const PagedRows& r : layers) b += r.bytes_allocated();
  return b;
}

void V3KvPages::set_max_blocks(int64_t blocks) {
  for (PagedRows& r : layers) r.set_max_blocks(blocks);
}

int64_t DeepseekV3Model::slot_bytes(const V3SequenceState& s) const {
  int64_t b = 0;
  for (const RowBuffer& layer : s.kv)
    if (layer.storage.view().data()) b += dtype_bytes(layer.storage.dtype(), layer.storage.numel());
  return b;
}

V3SequenceState DeepseekV3Model::new_sequence() const {
  V3SequenceState s;
  s.kv.resize(config_.num_layers);
  for (RowBuffer& b : s.kv) b.width = config_.mla.kv_lora_rank + config_.mla.qk_rope_head_dim;
  return s;
}

HostTensor DeepseekV3Model::forward(V3SequenceState& seq, std::span<const int64_t> ids, V3ForwardTrace* trace,
                                    const CpShard* cp) const {
  const int64_t total = static_cast<int64_t>(ids.size()), D = config_.hidden_size, V = config_.vocab_size;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  DI_CHECK(total > 0) << "forward: empty chunk";
  DI_CHECK(static_cast<int64_t>(seq.kv.size()) == config_.num_layers) << "forward: state of another model";
  DI_CHECK(!cp || cp->total_tokens() == total)
      << "forward: CP shard for " << (cp ? cp->total_tokens() : 0) << " tokens, chunk of " << total;
  TensorMemory& mem = memory();
  // This rank's tokens: chunk offsets (all of them without CP).
  std::vector<int64_t> local(cp ? cp->local() : std::vector<int64_t>{});
  if (!cp)
    for (int64_t t = 0; t < total; ++t) local.push_back(t);
  const int64_t T = static_cast<int64_t>(local.size());

  Chunk c;
  c.T = T;
  c.total = total;
  c.cp = cp;
  c.p0 = seq.num_tokens;
  std::vector<int64_t> local_ids(T);
  c.host_positions.resize(T);
  for (int64_t t = 0; t < T; ++t) {
    c.host_positions[t] = c.p0 + local[t];
    local_ids[t] = ids[local[t]];
  }
  c.positions = mem.from_host(DType::kI64, {T}, c.host_positions.data());
  c.kv_base = seq.pages ? 0 : seq.kv_base;
  c.kv_positions = positions_from(mem, c.kv_base, c.p0 + total - c.kv_base);
  const OwnedTensor id_tensor = mem.from_host(DType::kI64, {T}, local_ids.data());

  // Residual stream x [T, D] starts as the token embeddings (no scaling). Buffers an op writes in full take no zero
  // fill (a device's is a launch of its own; GoldenV3.ReadsNoBufferNoOpWrote runs the model on poisoned memory).
  OwnedTensor x = mem.empty(DType::kF32, {T, D});
  backend_.embedding({w_.embed.view(), id_tensor.view(), x.view()});
  OwnedTensor h = mem.empty(DType::kF32, {T, D});
  for (int l = 0; l < config_.num_layers; ++l) {
    const V3LayerWeights& lw = w_.layers[l];
    backend_.rms_norm({x.view(), lw.input_norm.view(), h.view(), eps});
    mem.add(x, attention(c, l, lw, h, seq));  // x += MLA(input_layernorm(x))
    backend_.rms_norm({x.view(), lw.post_attention_norm.view(), h.view(), eps});
    mem.add(x, ffn(c, l, lw, h));  // x += FFN(post_attention_layernorm(x))
    if (trace && trace->want_layer_outputs) trace->layer_outputs.push_back(mem.to_host(x));
  }
  backend_.rms_norm({x.view(), w_.norm.view(), h.view(), eps});  // final hidden [T, D]
  if (trace) trace->final_hidden = mem.to_host(h);
  OwnedTensor logits = mem.empty(DType::kF32, {T, V});
  backend_.linear({h.view(), w_.head.view(), logits.view()});
  seq.num_tokens += total;
  return mem.to_host(logits);
}

HostTensor DeepseekV3Model::forward_features(V3SequenceState& seq, std::span<const int64_t> ids,
                                             std::vector<float>* features) const {
  V3ForwardTrace trace;
  trace.want_layer_outputs = false;
  HostTensor logits = forward(seq, ids, &trace);
  const float* h = trace.final_hidden.data<float>();
  features->assign(h, h + trace.final_hidden.numel());
  return logits;
}

bool DeepseekV3Model::decode_batchable(const V3SequenceState& seq) const {
  if (!seq.pages || ep_) return false;
  if (mla_form_ != MlaForm::kAuto) return mla_form_ == MlaForm::kAbsorbed;
  return seq.mla_naive_until >= 0 ? seq.num_tokens >= seq.mla_naive_until : use_absorbed(1, seq.num_tokens);
}

HostTensor DeepseekV3Model::decode_batch(std::span<V3SequenceState* const> seqs, std::span<const int64_t> ids,
                                         DecodeGraphs* graphs, const DeviceLogitsFn* device_logits) const {
  const int64_t B = static_cast<int64_t>(seqs.size()), V = config_.vocab_size;
  DI_CHECK(B > 0 && static_cast<int64_t>(ids.size()) == B)
      << "decode_batch: " << ids.size() << " token ids for " << B << " sequences";
  TensorMemory& mem = memory();
  V3KvPages* pages = seqs[0]->pages;
  const int bs = seqs[0]->ref.block_size;
  int64_t max_blocks = 1;
  std::vector<int64_t> positions(B), write_rows(B);
  for (int64_t b = 0; b < B; ++b) {
    V3SequenceState& s = *seqs[b];
    DI_CHECK_INTERNAL(decode_batchable(s) && s.pages == pages && s.ref.block_size == bs &&
                      static_cast<int64_t>(pages->layers.size()) == config_.num_layers)
        << "decode_batch: sequence " << b << " is not a paged decode sequence of this batch";
    positions[b] = s.num_tokens;
    const int64_t need = s.num_tokens / bs + 1;
    DI_CHECK_INTERNAL(static_cast<int64_t>(s.ref.block_table.size()) >= need)
        << "decode_batch: sequence " << b << " at position " << s.num_tokens << " has " << s.ref.block_table.size()
        << " blocks of " << bs;
    max_blocks = std::max(max_blocks, need);
    // Every layer's pool grows alike and puts the row at the same place.
    for (int l = 0; l < config_.num_layers; ++l) {
      const int64_t at = pages->layers[l].row_for_write(mem, s.ref, s.num_tokens);
      DI_CHECK_INTERNAL(l == 0 || at == write_rows[b]) << "decode_batch: layer pools out of step";
      write_rows[b] = at;
    }
  }
  // Padded to (rows, width): rows past B repeat row 0 and write nothing.
  auto host_inputs = [&](int64_t rows, int64_t width, std::vector<int64_t>& id, std::vector<int64_t>& pos,
                         std::vector<int32_t>& q_seq, std::vector<int32_t>& tables, std::vector<int64_t>& write) {
    id.assign(rows, ids[0]);
    pos.assign(rows, positions[0]);
    write.assign(rows, -1);
    q_seq.resize(rows);
    tables.assign(static_cast<size_t>(rows * width), -1);
    for (int64_t b = 0; b < rows; ++b) {
      const int64_t src = b < B ? b : 0;
      if (b < B) {
        id[b] = ids[b];
        pos[b] = positions[b];
        write[b] = write_rows[b];
      }
      q_seq[b] = static_cast<int32_t>(b);
      const int64_t need = positions[src] / bs + 1;
      for (int64_t j = 0; j < need; ++j) tables[b * width + j] = static_cast<int32_t>(seqs[src]->ref.block_table[j]);
    }
  };
  std::vector<int64_t> h_ids, h_pos, h_write;
  std::vector<int32_t> h_q_seq, h_tables;
  const int64_t rows = graphs && graphs->enabled() && rope_magnitude_ == 1.0f ? graphs->batch_bucket(B) : 0;
  HostTensor logits;
  if (rows > 0) {
    const int64_t width = DecodeGraphs::width_bucket(max_blocks);
    const DecodeStepInputs in = graphs->inputs(mem, rows, width, V);
    std::vector<const void*> deps;
    for (const PagedRows& p : pages->layers) deps.push_back(p.pool().data());
    graphs->depend_on(std::move(deps));
    host_inputs(rows, width, h_ids, h_pos, h_q_seq, h_tables, h_write);
    mem.copy(in.ids, Tensor(h_ids.data(), DType::kI64, {rows}));
    mem.copy(in.positions, Tensor(h_pos.data(), DType::kI64, {rows}));
    mem.copy(in.q_seq, Tensor(h_q_seq.data(), DType::kI32, {rows}));
    mem.copy(in.tables, Tensor(h_tables.data(), DType::kI32, {rows, width}));
    mem.copy(in.write_rows, Tensor(h_write.data(), DType::kI64, {rows}));
    graphs->run(rows, width, [&] { decode_step(in, pages, bs); });
    if (device_logits)
      (*device_logits)(in.logits.slice(0, B));
    else
      logits = mem.to_host(in.logits.slice(0, B));
  } else {
    if (graphs) graphs->count_eager();
    host_inputs(B, max_blocks, h_ids, h_pos, h_q_seq, h_tables, h_write);
    const OwnedTensor id = mem.from_host(DType::kI64, {B}, h_ids.data());
    const OwnedTensor pos = mem.from_host(DType::kI64, {B}, h_pos.data());
    const OwnedTensor q_seq = mem.from_host(DType::kI32, {B}, h_q_seq.data());
    const OwnedTensor tables = mem.from_host(DType::kI32, {B, max_blocks}, h_tables.data());
    const OwnedTensor write = mem.from_host(DType::kI64, {B}, h_write.data());
    const OwnedTensor out = mem.empty(DType::kF32, {B, V});
    decode_step({id.view(), pos.view(), q_seq.view(), tables.view(), write.view(), out.view()}, pages, bs);
    if (device_logits)
      (*device_logits)(out.view());
    else
      logits = mem.to_host(out);
  }
  for (V3SequenceState* s : seqs) ++s->num_tokens;
  return logits;
}

void DeepseekV3Model::decode_step(const DecodeStepInputs& in, V3KvPages* pages, int block_size) const {
  const int64_t B = in.ids.dim(0), D = config_.hidden_size;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  TensorMemory& mem = memory();
  Chunk c;
  c.T = B;
  c.total = B;
  c.positions = OwnedTensor(nullptr, in.positions);
  c.decode_pages = pages;
  c.block_size = block_size;
  c.q_seq = OwnedTensor(nullptr, in.q_seq);
  c.tables = OwnedTensor(nullptr, in.tables);
  c.write_rows = OwnedTensor(nullptr, in.write_rows);
  OwnedTensor x = mem.empty(DType::kF32, {B, D});
  backend_.embedding({w_.embed.view(), in.ids, x.view()});
  OwnedTensor h = mem.empty(DType::kF32, {B, D});
  V3SequenceState unused;  // the decode branch of attention() reads only the chunk
  for (int l = 0; l < config_.num_layers; ++l) {
    const V3LayerWeights& lw = w_.layers[l];
    backend_.rms_norm({x.view(), lw.input_norm.view(), h.view(), eps});
    mem.add(x, attention(c, l, lw, h, unused));
    backend_.rms_norm({x.view(), lw.post_attention_norm.view(), h.view(), eps});
    mem.add(x, ffn(c, l, lw, h));
  }
  backend_.rms_norm({x.view(), w_.norm.view(), h.view(), eps});
  backend_.linear({h.view(), w_.head.view(), in.logits});
}

void DeepseekV3Model::truncate(V3SequenceState& seq, int64_t n) const {
  DI_CHECK_INTERNAL(n >= seq.kv_base && n <= seq.num_tokens)
      << "truncate to " << n << " tokens of a sequence holding [" << seq.kv_base << ", " << seq.num_tokens << ")";
  if (!seq.pages) {
    // Unused slots (an MTP state's main-layer slots) stay empty; the storage is kept for the next appends.
    for (RowBuffer& cache : seq.kv)
      if (cache.rows > 0) cache.rows = n - seq.kv_base;
  }
  seq.num_tokens = n;
}

V3SequenceState DeepseekV3Model::new_mtp_sequence(int64_t base) const {
  V3SequenceState s;
  s.kv.resize(config_.num_layers + 1);  // only the last slot (the MTP block's) is used
  for (RowBuffer& b : s.kv) b.width = config_.mla.kv_lora_rank + config_.mla.qk_rope_head_dim;
  s.num_tokens = base;
  s.kv_base = base;
  return s;
}

HostTensor DeepseekV3Model::mtp_forward(V3SequenceState& mtp, std::span<const float> hidden,
                                        std::span<const int64_t> next_ids, HostTensor* out_hidden) const {
  DI_CHECK(!w_.mtp.empty()) << "mtp_forward: the checkpoint has no MTP weights";
  const int64_t T = static_cast<int64_t>(next_ids.size()), D = config_.hidden_size, V = config_.vocab_size;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  DI_CHECK(T > 0) << "mtp_forward: empty chunk";
  DI_CHECK(static_cast<int64_t>(hidden.size()) == T * D)
      << "mtp_forward: " << hidden.size() << " hidden values for " << T << " positions of width " << D;
  DI_CHECK(static_cast<int64_t>(mtp.kv.size()) == config_.num_layers + 1 && !mtp.pages)
      << "mtp_forward: not an MTP state (new_mtp_sequence)";
  TensorMemory& mem = memory();
  const V3MtpWeights& m = w_.mtp[0];
  const Chunk c = make_chunk(mtp.num_tokens, T, mtp.kv_base);
  const OwnedTensor id_tensor = mem.from_host(DType::kI64, {T}, next_ids.data());
  // cat = [enorm(embed(t_{i+1})) ; hnorm(h_i)] (embedding first), z = cat · eh_projᵀ.
  OwnedTensor e = mem.zeros(DType::kF32, {T, D}), cat = mem.zeros(DType::kF32, {T, 2 * D});
  backend_.embedding({w_.embed.view(), id_tensor.view(), e.view()});
  const Tensor cat_e = narrow(cat, 1, 0, D), cat_h = narrow(cat, 1, D, 2 * D);
  OwnedTensor e_n = mem.zeros(DType::kF32, {T, D}), h_n = mem.zeros(DType::kF32, {T, D});
  backend_.rms_norm({e.view(), m.enorm.view(), e_n.view(), eps});
  const OwnedTensor h_in = mem.from_host(DType::kF32, {T, D}, hidden.data());
  backend_.rms_norm({h_in.view(), m.hnorm.view(), h_n.view(), eps});
  mem.copy(cat_e, e_n.view());
  mem.copy(cat_h, h_n.view());
  OwnedTensor x = mem.zeros(DType::kF32, {T, D}), h = mem.zeros(DType::kF32, {T, D});
  backend_.linear({cat.view(), m.eh_proj.view(), x.view()});
  const V3LayerWeights& lw = m.block;
  backend_.rms_norm({x.view(), lw.input_norm.view(), h.view(), eps});
  mem.add(x, attention(c, config_.num_layers, lw, h, mtp));
  backend_.rms_norm({x.view(), lw.post_attention_norm.view(), h.view(), eps});
  mem.add(x, ffn(c, config_.num_layers, lw, h));
  backend_.rms_norm({x.view(), m.head_norm.view(), h.view(), eps});
  OwnedTensor logits = mem.zeros(DType::kF32, {T, V});
  backend_.linear({h.view(), w_.head.view(), logits.view()});
  mtp.num_tokens += T;
  if (out_hidden) *out_hidden = mem.to_host(x);
  return mem.to_host(logits);
}

void DeepseekV3Model::set_activation_quant(ActQuant q) {
  DI_CHECK_CODE(q == ActQuant::kNone || act_quant_block128(q), ErrorCode::kUnsupported)
      << "DeepSeek-V3 family: activation rounding " << act_quant_name(q) << " is not its reference's (fp8, per 128)";
  act_quant_ = q;
  auto set_layer = [&](V3LayerWeights& lw) {
    for (V3Matrix* m : {&lw.attn.q_a, &lw.attn.q_b, &lw.attn.q, &lw.attn.kv_a, &lw.attn.o}) set_act_quant(*m, q);
    lw.moe_act_quant = config_.quant.fp8 ? q : ActQuant::kNone;
  };
  for (V3LayerWeights& lw : w_.layers) set_layer(lw);
  for (V3MtpWeights& m : w_.mtp) set_layer(m.block);
}

void DeepseekV3Model::linear(const Tensor& in, const V3Matrix& w, const Tensor& out) const {
  kept_linear(backend_, in, w, out);
}

// Multiply-add counts of the two forms for T queries over S = cached + T keys (per head):
//   naive:    expand every row, S·(dn+dv)·r, then attend, T·S·(dn+dr+dv);
//   absorbed: fold the T queries and outputs, T·(dn+dv)·r, then attend in the latent, T·S·(2r+dr).
// For V3 (r = 512, dn = dv = 128) naive wins from about 170 new tokens on; decode is always absorbed.
bool DeepseekV3Model::use_absorbed(int64_t tokens, int64_t cached) const {
  if (mla_form_ != MlaForm::kAuto) return mla_form_ == MlaForm::kAbsorbed;
  const auto& m = config_.mla;
  const int64_t r = m.kv_lora_rank, dn = m.qk_nope_head_dim, dr = m.qk_rope_head_dim, dv = m.v_head_dim;
  const int64_t S = cached + tokens;
  const int64_t naive = S * (dn + dv) * r + tokens * S * (dn + dr + dv);
  const int64_t absorbed = tokens * (dn + dv) * r + tokens * S * (2 * r + dr);
  return absorbed < naive;
}

OwnedTensor DeepseekV3Model::attention(const Chunk& c, int layer, const V3LayerWeights& lw, const OwnedTensor& x,
                                       V3SequenceState& seq) const {
  const V3AttentionWeights& a = lw.attn;
  const auto& m = config_.mla;
  const int64_t T = c.T, H = config_.num_heads, D = config_.hidden_size;
  const int64_t dn = m.qk_nope_head_dim, dr = m.qk_rope_head_dim, dv = m.v_head_dim, r = m.kv_lora_rank;
  const int64_t qk = dn + dr, row = r + dr;
  TensorMemory& mem = memory();

  // Query q [T, H, dn + dr]: per head q_nope | q_pe.
  // Every buffer below is written in full before it is read (no zero fills: a decode step is small launches).
  OwnedTensor q = mem.empty(DType::kF32, {T, H * qk});
  if (m.q_lora_rank > 0) {
    OwnedTensor q_latent = mem.empty(DType::kF32, {T, m.q_lora_rank});
    OwnedTensor q_normed = mem.empty(DType::kF32, {T, m.q_lora_rank});
    linear(x.view(), a.q_a, q_latent.view());
    backend_.rms_norm({q_latent.view(), a.q_a_norm.view(), q_normed.view(), kLatentNormEps});
    linear(q_normed.view(), a.q_b, q.view());
  } else {
    linear(x.view(), a.q, q.view());
  }
  const Tensor q_heads = q.view().reshape({T, H, qk});
  backend_.rope({q_heads, c.positions.view(), inv_freq_.view()});  // rotates the trailing dr channels

  // Compressed KV: kv_a [T, r + dr] = latent c | shared rope key k_pe (one for all heads).
  OwnedTensor kv_a = mem.empty(DType::kF32, {T, row});
  linear(x.view(), a.kv_a, kv_a.view());
  OwnedTensor latent = mem.empty(DType::kF32, {T, r}), k_pe = mem.empty(DType::kF32, {T, 1, dr});
  mem.copy(latent, narrow(kv_a, 1, 0, r));
  mem.copy(k_pe.view().reshape({T, dr}), narrow(kv_a, 1, r, row));
  // Cache rows [T, r + dr] = ĉ | RoPE'd k_pe (k_pe is not normed).
  OwnedTensor rows = mem.empty(DType::kF32, {T, row}), latent_normed = mem.empty(DType::kF32, {T, r});
  backend_.rms_norm({latent.view(), a.kv_a_norm.view(), latent_normed.view(), kLatentNormEps});
  mem.copy(narrow(rows, 1, 0, r), latent_normed.view());
  backend_.rope({k_pe.view(), c.positions.view(), inv_freq_.view()});
  if (rope_magnitude_ != 1.0f) {
    scale_trailing(mem, k_pe.view().reshape({T, dr}), dr, rope_magnitude_);
    scale_trailing(mem, q_heads, dr, rope_magnitude_);
  }
  mem.copy(narrow(rows, 1, r, row), k_pe.view().reshape({T, dr}));

  if (c.decode_pages) {
    // decode_step: each row goes to its sequence's pages, then one paged call attends every sequence in place.
    PagedRows& pages = c.decode_pages->layers[layer];
    backend_.scatter_rows({rows.view(), c.write_rows.view(), pages.pool()});
    OwnedTensor o = mem.empty(DType::kF32, {T, H, dv});
    PagedMlaAttentionParams p;
    p.q = q_heads;
    p.q_positions = c.positions.view();
    p.q_seq = c.q_seq.view();
    p.block_tables = c.tables.view();
    p.kv_pool = pages.pool();
    p.kv_b = a.kv_b.view();
    p.out = o.view();
    p.block_size = c.block_size;
    p.rope_dim = static_cast<int>(dr);
    p.scale = softmax_scale_;
    backend_.paged_mla_attention(p);
    OwnedTensor out = mem.empty(DType::kF32, {T, D});
    linear(o.view().reshape({T, H * dv}), a.o, out.view());
    return out;
  }
  // Under CP every rank's rows are all-gathered: the cache gets the whole chunk [total, r + dr] in chunk order.
  if (c.cp) {
    OwnedTensor all = mem.zeros(DType::kF32, {c.total, row});
    c.cp->all_gather_rows(mem, rows.view(), all.view());
    rows = std::move(all);
  }
  // Append the chunk's rows, then attend over all S rows.
  const int64_t S = c.p0 + c.total;
  OwnedTensor paged;  // all S rows gathered from the pages
  Tensor kv_rows;
  if (seq.pages) {
    PagedRows& pages = seq.pages->layers[layer];
    pages.write(mem, seq.ref, c.p0, rows.view());
    paged = pages.gather(mem, seq.ref, 0, S);
    kv_rows = paged.view();
  } else {
    RowBuffer& cache = seq.kv[layer];
    DI_CHECK(cache.rows == c.p0 - c.kv_base) << "forward: layer " << layer << " cache out of step";
    if (kv_dtype_ == DType::kBF16) round_to_bf16_values(mem, rows.view());  // the values a bf16 pool would hold
    cache.append(mem, rows.view());
    kv_rows = cache.view();
  }
  OwnedTensor o = mem.empty(DType::kF32, {T, H, dv});
  MlaAttentionParams p;
  p.q = q_heads;
  p.q_positions = c.positions.view();
  p.kv = kv_rows;
  p.kv_positions = c.kv_positions.view();
  p.kv_b = a.kv_b.view();
  p.out = o.view();
  p.rope_dim = static_cast<int>(dr);
  p.scale = softmax_scale_;
  p.kv_first_position = c.kv_base;
  p.host_q_positions = c.host_positions;
  if (mla_form_ == MlaForm::kAuto && seq.mla_naive_until >= 0) {
    // Rows [0, n_naive) of the chunk are below mla_naive_until. Each form is row-invariant, so splitting the
    // query rows gives the same rows as one call.
    // (Under CP the rank's positions ascend, so its rows below the bound are a prefix too.)
    const int64_t n_naive = std::lower_bound(c.host_positions.begin(), c.host_positions.end(), seq.mla_naive_until) -
                            c.host_positions.begin();
    MlaAttentionParams part = p;
    if (n_naive > 0) {
      part.q = q_heads.slice(0, n_naive);
      part.q_positions = c.positions.view().slice(0, n_naive);
      part.host_q_positions = std::span<const int64_t>(c.host_positions).first(n_naive);
      part.out = o.view().slice(0, n_naive);
      backend_.mla_attention_naive(part);
    }
    if (n_naive < T) {
      part.q = q_heads.slice(n_naive, T);
      part.q_positions = c.positions.view().slice(n_naive, T);
      part.host_q_positions = std::span<const int64_t>(c.host_positions).subspan(n_naive);
      part.out = o.view().slice(n_naive, T);
      backend_.mla_attention_absorbed(part);
    }
  } else if (use_absorbed(c.total, c.p0)) {  // the whole chunk decides: every CP rank picks the one-rank form
    backend_.mla_attention_absorbed(p);
  } else {
    backend_.mla_attention_naive(p);
  }

  // Output projection: concat_h(o_h) [T, H·dv] · W_oᵀ.
  OwnedTensor out = mem.empty(DType::kF32, {T, D});
  linear(o.view().reshape({T, H * dv}), a.o, out.view());
  return out;
}

OwnedTensor DeepseekV3Model::ffn(const Chunk& c, int layer, const V3LayerWeights& lw, const OwnedTensor& x) const {
  const auto& moe = config_.moe;
  const int64_t T = c.T;
  TensorMemory& mem = memory();
  OwnedTensor out = mem.empty(DType::kF32, {T, config_.hidden_size});  // the MoE writes every output
  MoeParams p;
  p.x = x.view();
  p.experts = &lw.experts;
  p.out = out.view();
  p.act_quant = lw.moe_act_quant;
  // Experts kept FP8: the same call through moe_quant; routed experts across the EP group when `ep` is set.
  auto run = [&](const MoeParams& mp, bool ep) {
    if (!lw.quant_experts) return ep ? ep_->moe(backend_, layer, mp) : backend_.moe(mp);
    const QuantMoeParams q{
        mp.x,   mp.weights,      mp.indices,          &lw.qexperts, mp.shared ? &lw.qshared : nullptr,
        mp.out, mp.swiglu_limit, mp.weight_before_w2, mp.act_quant};
    if (ep)
      ep_->moe(backend_, layer, q);
    else
      backend_.moe_quant(q);
  };
  if (!lw.moe) {
    // Dense SwiGLU: the layer's one "expert" with weight 1 for every token.
    OwnedTensor weights = mem.empty(DType::kF32, {T, 1}), indices = mem.zeros(DType::kI32, {T, 1});  // expert 0
    mem.fill(weights, 1.0f);
    p.weights = weights.view();
    p.indices = indices.view();
    run(p, false);
    return out;
  }
  const int64_t k = moe.num_experts_per_tok;
  OwnedTensor weights = mem.empty(DType::kF32, {T, k}), indices = mem.empty(DType::kI32, {T, k});  // the router's
  RouterParams r;
  r.x = x.view();
  r.weight = lw.gate.view();
  if (lw.gate_bias.view().data() != nullptr) r.bias = lw.gate_bias.view();
  r.weights = weights.view();
  r.indices = indices.view();
  r.route_scale = static_cast<float>(moe.routed_scaling_factor);
  if (moe.scoring == ScoringFunc::kSigmoid) {
    r.scoring = RouterScoring::kSigmoid;
    r.normalize = moe.norm_topk_prob;  // transformers deepseek_v3
  } else {
    DI_CHECK_CODE(moe.scoring == ScoringFunc::kSoftmax, ErrorCode::kUnsupported)
        << "V3 family: scoring_func " << scoring_name(moe.scoring) << " is not supported";
    r.scoring = RouterScoring::kSoftmax;
    r.normalize = moe.norm_topk_prob && k > 1;  // DeepSeek-V2 remote code (false for every released V2)
  }
  if (moe.topk_method != TopkMethod::kGreedy) {
    r.n_group = moe.n_group;
    r.topk_group = moe.topk_group;
    r.group_score = moe.topk_method == TopkMethod::kNoauxTc ? GroupScore::kTop2Sum : GroupScore::kMax;
  }
  backend_.router(r);
  p.weights = weights.view();
  p.indices = indices.view();
  p.shared = lw.has_shared ? &lw.shared : nullptr;
  // The MTP block (layer == num_layers) keeps all its experts: expert parallelism covers the main layers only.
  run(p, ep_ && layer < config_.num_layers);
  return out;
}

void DeepseekV3Model::idle_forward() const {
  DI_CHECK_INTERNAL(ep_ != nullptr) << "idle_forward without expert parallelism";
  for (int l = 0; l < config_.num_layers; ++l) {
    const V3LayerWeights& lw = w_.layers[l];
    if (!lw.moe) continue;
    if (lw.quant_experts)
      ep_->idle(backend_, l, lw.qexperts, 0.0f, false);
    else
      ep_->idle(backend_, l, lw.experts, 0.0f, false);
  }
}

int DeepseekV3Model::routed_experts(int layer) const {
  const V3LayerWeights& lw = w_.layers.at(layer);
  if (!lw.moe) return 0;
  return static_cast<int>(lw.quant_experts ? lw.qexperts.size() : lw.experts.size());
}

bool DeepseekV3Model::has_expert(int layer, int expert) const {
  const V3LayerWeights& lw = w_.layers.at(layer);
  if (expert < 0 || expert >= routed_experts(layer)) return false;
  return lw.quant_experts ? lw.qexperts[expert].w1.weight.data() != nullptr : lw.experts[expert].w1.data() != nullptr;
}

void DeepseekV3Model::retain_experts(int layer, const std::vector<bool>& keep) {
  V3LayerWeights& lw = w_.layers.at(layer);
  const int n = routed_experts(layer);
  DI_CHECK(lw.moe && static_cast<int>(keep.size()) == n)
      << "retain_experts: layer " << layer << " has " << n << " routed experts, got " << keep.size() << " flags";
  for (size_t e = 0; e < keep.size(); ++e) {
    if (keep[e]) continue;
    if (lw.quant_experts) {
      // quant_storage: codes and scales of w1, w3, w2 per routed expert (load_v3_weights).
      for (size_t i = 0; i < 6; ++i) lw.quant_storage[6 * e + i] = OwnedTensor();
      lw.qexperts[e] = QuantExpertWeights{};
    } else {
      for (size_t i = 0; i < 3; ++i) lw.expert_storage[3 * e + i] = HostTensor();
      lw.experts[e] = ExpertWeights{};
    }
  }
}

void DeepseekV3Model::load_experts(const std::string& dir, int layer, const std::vector<int>& experts) {
  V3LayerWeights& lw = w_.layers.at(layer);
  DI_CHECK(lw.moe) << "load_experts: layer " << layer << " is dense";
  auto ckpt = Checkpoint::open(dir);
  // Read (and dequantized) on the host, as load() does, then moved into this backend's memory.
  std::unique_ptr<Backend> host_backend = make_cpu_backend(1);
  WeightLoader ld(config_, *ckpt, *host_backend);
  const bool device = memory_.device().kind != DeviceKind::kCPU;
  auto place = [&](HostTensor h) { return device ? memory_.upload(h.view()) : OwnedTensor(std::move(h)); };
  const std::string M = "model.layers." + std::to_string(config_.layers.at(layer).index) + ".mlp.experts.";
  for (int e : experts) {
    DI_CHECK(e >= 0 && e < routed_experts(layer)) << "load_experts: expert " << e << " out of range";
    if (has_expert(layer, e)) continue;
    const std::string X = M + std::to_string(e) + ".";
    if (lw.quant_experts) {
      // FP8 codes and block scales as load_v3_weights keeps them.
      QuantExpertWeights& q = lw.qexperts[e];
      const char* names[3] = {"gate_proj.weight", "up_proj.weight", "down_proj.weight"};
      QuantMatrix* dst[3] = {&q.w1, &q.w3, &q.w2};
      for (size_t i = 0; i < 3; ++i) {
        KeptMatrix m = load_kept(ld, X + names[i], true);
        DI_CHECK(m.quantized()) << "load_experts: " << X << names[i]
                                << " is not FP8 block-scaled like the layer's other experts";
        if (device) upload_kept(memory_, m);
        *dst[i] = m.quant;
        lw.quant_storage[6 * e + 2 * i] = std::move(m.codes);
        lw.quant_storage[6 * e + 2 * i + 1] = std::move(m.scales);
      }
      continue;
    }
    lw.expert_storage[3 * e] = place(ld.f32(X + "gate_proj.weight"));
    lw.expert_storage[3 * e + 1] = place(ld.f32(X + "up_proj.weight"));
    lw.expert_storage[3 * e + 2] = place(ld.f32(X + "down_proj.weight"));
    lw.experts[e] = {lw.expert_storage[3 * e].view(), lw.expert_storage[3 * e + 1].view(),
                     lw.expert_storage[3 * e + 2].view()};
  }
}

}  // namespace deepinfer
