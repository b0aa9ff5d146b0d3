// CudaBackend ops: KV compression, the indexer and its top-k, sink and MLA attention (paged and contiguous).
#include "deepinfer/ops/cuda/cuda_backend_impl.h"

#include "deepinfer/ops/cuda/indexer_mma.h"
#include "deepinfer/ops/cuda/mla_paged_mma.h"
#include "deepinfer/ops/kv_record.h"

namespace deepinfer {

// ============================================================================ compressor, indexer, top-k
void CudaBackend::compress_pool(const CompressPoolParams& p) {
  validate(p);
  const Device& dev = impl_->device;
  expect_on("compress_pool", "kv", p.kv, dev);
  expect_on("compress_pool", "gate", p.gate, dev);
  expect_on("compress_pool", "out", p.out, dev);
  cuda::CompressPoolKernelParams k;
  k.kv = p.kv.data_as<float>();
  k.gate = p.gate.data_as<float>();
  k.out = p.out.data_as<float>();
  k.groups = p.kv.dim(0);
  k.slots = p.kv.dim(1);
  k.ch = p.kv.dim(2);
  cuda::run_compress_pool(k, impl_->s());
}

namespace {
// The fields indexer_scores and paged_indexer_scores share: queries, weights, positions, output, scales.
cuda::IndexerScoresKernelParams indexer_kernel_params(const Tensor& q, const Tensor& weights, const Tensor& positions,
                                                      const Tensor& out, int ratio, float score_scale,
                                                      float weight_scale) {
  cuda::IndexerScoresKernelParams k;
  k.q = q.data_as<float>();
  k.weights = weights.data_as<float>();
  k.positions = positions.data_as<int64_t>();
  k.out = out.data_as<float>();
  k.tokens = q.dim(0);
  k.heads = q.dim(1);
  k.dim = q.dim(2);
  k.ratio = ratio;
  k.score_scale = score_scale;
  k.weight_scale = weight_scale;
  return k;
}

// The tensor-core kernel for prefill-like calls (indexer_mma.h), else the SIMT kernels.
void launch_indexer_scores(const cuda::IndexerScoresKernelParams& k, bool batch_invariant, cudaStream_t stream) {
  if (cuda::indexer_scores_use_mma(k, batch_invariant))
    cuda::launch_indexer_scores_mma(k, stream);
  else
    cuda::run_indexer_scores(k, stream);
}
}  // namespace

void CudaBackend::indexer_scores(const IndexerScoreParams& p) {
  validate(p);
  const Device& dev = impl_->device;
  for (auto [name, t] :
       {std::pair{"q", &p.q}, {"keys", &p.keys}, {"weights", &p.weights}, {"positions", &p.positions}, {"out", &p.out}})
    expect_on("indexer_scores", name, *t, dev);
  cuda::IndexerScoresKernelParams k =
      indexer_kernel_params(p.q, p.weights, p.positions, p.out, p.ratio, p.score_scale, p.weight_scale);
  k.keys = p.keys.data_as<float>();
  k.n = p.keys.dim(0);
  k.mma = impl_->choices.indexer_mma;
  k.smem_optin = impl_->info.smem_per_block_optin;
  launch_indexer_scores(k, impl_->batch_invariant, impl_->s());
}

void CudaBackend::paged_indexer_scores(const PagedIndexerScoreParams& p) {
  validate(p);
  const Device& dev = impl_->device;
  for (auto [name, t] : {std::pair{"q", &p.q},
                         {"weights", &p.weights},
                         {"positions", &p.positions},
                         {"q_seq", &p.q_seq},
                         {"n_entries", &p.n_entries},
                         {"block_tables", &p.block_tables},
                         {"key_pool", &p.key_pool},
                         {"out", &p.out}})
    expect_on("paged_indexer_scores", name, *t, dev);
  cuda::IndexerScoresKernelParams k =
      indexer_kernel_params(p.q, p.weights, p.positions, p.out, p.ratio, p.score_scale, p.weight_scale);
  k.keys = p.key_pool.data();  // f32, bf16 or key records (validate)
  k.keys_format = cuda::pool_format_of(p.key_pool.dtype(), kIndexKeyRecord);
  k.n = p.out.dim(1);
  k.q_seq = p.q_seq.data_as<int32_t>();
  k.n_entries = p.n_entries.data_as<int64_t>();
  k.block_tables = p.block_tables.data_as<int32_t>();
  k.seqs = p.block_tables.dim(0);
  k.max_blocks = p.block_tables.dim(1);
  k.pool_rows = p.key_pool.dim(0);
  k.block_size = p.block_size;
  k.key_ratio = p.key_ratio;
  k.status = impl_->status.word();
  k.mma = impl_->choices.indexer_mma;
  k.mma_decode = impl_->choices.indexer_mma_decode;
  k.mma_ring = impl_->choices.indexer_mma_ring;
  k.smem_optin = impl_->info.smem_per_block_optin;
  launch_indexer_scores(k, impl_->batch_invariant, impl_->s());
}

void CudaBackend::candidate_blocks(const CandidateBlocksParams& p) {
  validate(p);
  const Device& dev = impl_->device;
  expect_on("candidate_blocks", "scores", p.scores, dev);
  expect_on("candidate_blocks", "positions", p.positions, dev);
  expect_on("candidate_blocks", "keep", p.keep, dev);
  cuda::WorkspaceArena::Scope scope(impl_->ws());
  const int64_t tokens = p.scores.dim(0), n = p.scores.dim(1), blocks = ceil_div(n, p.block_size);
  cuda::CandidateBlocksKernelParams k;
  k.scores = p.scores.data_as<float>();
  k.positions = p.positions.data_as<int64_t>();
  k.keep = p.keep.data_as<uint8_t>();
  k.block_scores = impl_->ws().take_as<float>(std::max<int64_t>(tokens * blocks, 1));
  k.block_keep = impl_->ws().take_as<uint8_t>(std::max<int64_t>(tokens * blocks, 1));
  k.tokens = tokens;
  k.n = n;
  k.ratio = p.ratio;
  k.topk_blocks = p.topk_blocks;
  k.block_size = p.block_size;
  k.small_blocks = impl_->choices.topk_small_blocks;
  cuda::run_candidate_blocks(k, impl_->s());
}

void CudaBackend::topk_mask(const TopKMaskParams& p) {
  validate(p);
  const Device& dev = impl_->device;
  expect_on("topk_mask", "scores", p.scores, dev);
  expect_on("topk_mask", "allowed", p.allowed, dev);
  expect_on("topk_mask", "out", p.out, dev);
  cuda::TopKMaskKernelParams k;
  k.scores = p.scores.data_as<float>();
  k.allowed = cptr<uint8_t>(p.allowed);
  k.out = p.out.data_as<uint8_t>();
  k.tokens = p.scores.dim(0);
  k.n = p.scores.dim(1);
  k.k = p.k;
  k.small_blocks = impl_->choices.topk_small_blocks;
  cuda::run_topk_mask(k, impl_->s());
}

// ============================================================================ attention
void CudaBackend::sink_attention(const SinkAttentionParams& p) {
  validate(p);
  const Device& dev = impl_->device;
  for (auto [name, t] : {std::pair{"q", &p.q},
                         {"q_positions", &p.q_positions},
                         {"window_kv", &p.window_kv},
                         {"kv_positions", &p.kv_positions},
                         {"compressed", &p.compressed},
                         {"comp_mask", &p.comp_mask},
                         {"sinks", &p.sinks},
                         {"out", &p.out}})
    expect_on("sink_attention", name, *t, dev);
  cuda::SinkAttentionKernelParams k;
  k.q = p.q.data_as<float>();
  k.q_positions = p.q_positions.data_as<int64_t>();
  k.window_kv = cptr<float>(p.window_kv);
  k.kv_positions = cptr<int64_t>(p.kv_positions);
  k.compressed = cptr<float>(p.compressed);
  k.comp_mask = cptr<uint8_t>(p.comp_mask);
  k.sinks = p.sinks.data_as<float>();
  k.out = p.out.data_as<float>();
  k.tokens = p.q.dim(0);
  k.heads = p.q.dim(1);
  k.hd = p.q.dim(2);
  k.s = p.window_kv.dim(0);
  k.n_comp = p.compressed.data() ? p.compressed.dim(0) : 0;
  k.window = p.window;
  k.scale = p.scale;
  cuda::run_sink_attention(k, impl_->s());
}

void CudaBackend::paged_sink_attention(const PagedSinkAttentionParams& p) {
  validate(p);
  const Device& dev = impl_->device;
  for (auto [name, t] : {std::pair{"q", &p.q},
                         {"q_positions", &p.q_positions},
                         {"q_seq", &p.q_seq},
                         {"block_tables", &p.block_tables},
                         {"window_pool", &p.window_pool},
                         {"window_begin", &p.window_begin},
                         {"comp_pool", &p.comp_pool},
                         {"comp_idx", &p.comp_idx},
                         {"comp_mask", &p.comp_mask},
                         {"sinks", &p.sinks},
                         {"out", &p.out}})
    expect_on("paged_sink_attention", name, *t, dev);
  cuda::PagedSinkAttentionKernelParams k;
  k.mma = impl_->choices.attn_mma;
  k.smem_optin = impl_->info.smem_per_block_optin;
  k.q = p.q.data_as<float>();
  k.q_positions = p.q_positions.data_as<int64_t>();
  k.q_seq = p.q_seq.data_as<int32_t>();
  k.block_tables = p.block_tables.data_as<int32_t>();
  k.window_pool = p.window_pool.data();  // f32, bf16 or records, the comp pool's dtype (validate)
  k.window_format = cuda::pool_format_of(p.window_pool.dtype(), kWindowRecord);
  k.comp_format = cuda::pool_format_of(p.window_pool.dtype(), kEntryRecord);
  k.window_begin = p.window_begin.data_as<int64_t>();
  k.comp_pool = p.comp_pool.data();
  k.comp_idx = cptr<int32_t>(p.comp_idx);
  k.comp_mask = cptr<uint8_t>(p.comp_mask);
  k.sinks = p.sinks.data_as<float>();
  k.out = p.out.data_as<float>();
  k.tokens = p.q.dim(0);
  k.heads = p.q.dim(1);
  k.hd = p.q.dim(2);
  k.seqs = p.block_tables.dim(0);
  k.max_blocks = p.block_tables.dim(1);
  k.window_rows = p.window_pool.dim(0);
  k.comp_rows = p.comp_pool.data() ? p.comp_pool.dim(0) : 0;
  k.k_sel = !p.comp_pool.data() ? 0 : (p.comp_mask.data() ? p.comp_mask.dim(1) : p.comp_idx.dim(1));
  k.block_size = p.block_size;
  k.comp_ratio = p.comp_ratio;
  k.window = p.window;
  k.scale = p.scale;
  k.status = impl_->status.word();
  const int64_t max_slots = p.window + k.k_sel;
  if (impl_->batch_invariant) {
    // Split boundaries fixed in slot space: a query's partition depends on its own slots only.
    k.slots_per_split = cuda::kBatchInvariantSlotsPerSplit;
    k.splits = static_cast<int>(std::max<int64_t>(1, ceil_div(max_slots, k.slots_per_split)));
    k.always_combine = true;
  } else {
    k.splits = cuda::paged_attention_splits(k.tokens, k.heads, max_slots, impl_->info.sm_count);
    k.slots_per_split = ceil_div(ceil_div(max_slots, k.splits), 32) * 32;
    k.splits = static_cast<int>(ceil_div(max_slots, k.slots_per_split));
  }
  cuda::WorkspaceArena::Scope scope(impl_->ws());
  if (k.splits > 1 || k.always_combine) {
    const int64_t parts = k.tokens * k.heads * k.splits;
    k.part_o = impl_->ws().take_as<float>(parts * k.hd);
    k.part_m = impl_->ws().take_as<float>(parts);
    k.part_l = impl_->ws().take_as<float>(parts);
  }
  cuda::run_paged_sink_attention(k, impl_->s());
}

// ============================================================================ MLA
namespace {
// validate(p) and every tensor on the backend's device.
void validate_on_device(const MlaAttentionParams& p, const Device& dev) {
  validate(p);
  for (auto [name, t] : {std::pair{"q", &p.q},
                         {"q_positions", &p.q_positions},
                         {"kv", &p.kv},
                         {"kv_positions", &p.kv_positions},
                         {"kv_b", &p.kv_b},
                         {"out", &p.out}})
    expect_on("mla_attention", name, *t, dev);
}

// Prefill MLA on GEMMs from this many queries (below it, and in batch-invariant mode, the absorbed SIMT kernels: their
// order does not depend on the call's shape).
constexpr int64_t kMlaGemmMinTokens = 64;
// The logits of a head group x query chunk stay within this many floats (512 MiB).
constexpr int64_t kMlaGemmLogitFloats = int64_t{128} << 20;
// Queries a chunk when the causal layout is known (each chunk then attends only the rows up to its newest position).
constexpr int64_t kMlaGemmChunkTokens = 1024;

// bf16x3 operands of the logits GEMM: `rows` x `heads` vectors of `len` at src (row stride src_row, a head's vector
// after the previous one) as [rows][heads][3 · len] bf16 terms, part j lo where bit j of lo_parts is set.
void head_terms(const float* src, int64_t src_row, int64_t rows, int64_t heads, int64_t len, uint16_t* dst,
                unsigned lo_parts, cudaStream_t stream) {
  cuda::run_bf16_parts({.src = src,
                        .src_row = src_row,
                        .src_seg = len,
                        .rows = rows,
                        .segs = heads,
                        .len = len,
                        .dst = dst,
                        .dst_row = heads * 3 * len,
                        .dst_seg = 3 * len,
                        .part_stride = len,
                        .parts = 3,
                        .lo_parts = lo_parts},
                       stream);
}

// Per-head vectors of `len` (row s, head h at src + s · src_row + h · src_seg) of `rows` rows and `heads` heads as bf16
// [hi | lo] planes [2][rows, heads, len].
void bf16_planes(const float* src, int64_t src_row, int64_t src_seg, int64_t rows, int64_t heads, int64_t len,
                 uint16_t* dst, cudaStream_t stream) {
  cuda::run_bf16_parts({.src = src,
                        .src_row = src_row,
                        .src_seg = src_seg,
                        .rows = rows,
                        .segs = heads,
                        .len = len,
                        .dst = dst,
                        .dst_row = heads * len,
                        .dst_seg = len,
                        .part_stride = rows * heads * len,
                        .parts = 2,
                        .lo_parts = 0b10},
                       stream);
}

// The flash kernel (KernelChoices::mla_flash) over heads h0 .. h0 + g - 1: their keys (keys [S, g, qk]) and values
// split into [hi | lo] planes at k2 / v2, then every query of them in one launch.
void run_flash_group(const MlaAttentionParams& p, const float* kvx, const float* keys, uint16_t* k2, uint16_t* v2,
                     int64_t g, int64_t h0, const cuda::KernelChoices& choices, cudaStream_t stream) {
  const int64_t T = p.q.dim(0), H = p.q.dim(1), dr = p.rope_dim, dn = p.q.dim(2) - dr, qk = dn + dr;
  const int64_t S = p.kv.dim(0), dv = p.kv_b.dim(0) / H - dn;
  bf16_planes(keys, g * qk, qk, S, g, qk, k2, stream);
  const auto aligned16 = [](const void* x) { return reinterpret_cast<uintptr_t>(x) % 16 == 0; };
  const bool vec16 = qk % 8 == 0 && dv % 8 == 0 && aligned16(k2) && aligned16(v2);  // then the planes' offsets are too
  // The wgmma form reads V transposed (v2 holds mla_vt_keys(S) keys a dim and plane).
  const bool wgmma = choices.mla_flash_wgmma && vec16 && cuda::mla_flash_wgmma_takes(qk, dv);
  const int64_t s_pad = cuda::mla_vt_keys(S);
  if (wgmma)
    cuda::run_mla_vt_parts({.src = kvx + dn,
                            .src_row = g * (dn + dv),
                            .src_head = dn + dv,
                            .s = S,
                            .s_pad = s_pad,
                            .heads = static_cast<int>(g),
                            .dv = static_cast<int>(dv),
                            .dst = v2,
                            .part = g * dv * s_pad},
                           stream);
  else
    bf16_planes(kvx + dn, g * (dn + dv), dn + dv, S, g, dv, v2, stream);
  cuda::MlaFlashKernelParams f;
  f.q = p.q.data_as<float>() + h0 * qk;
  f.q_row = H * qk;
  f.q_head = qk;
  f.k2 = k2;
  f.k_row = g * qk;
  f.k_head = qk;
  f.k_part = S * g * qk;
  f.v2 = v2;
  f.v_row = wgmma ? s_pad : g * dv;
  f.v_head = wgmma ? dv * s_pad : dv;
  f.v_part = wgmma ? g * dv * s_pad : S * g * dv;
  f.vec16 = vec16;
  f.q_positions = p.q_positions.data_as<int64_t>();
  f.kv_positions = cptr<int64_t>(p.kv_positions);
  f.tokens = T;
  f.s = S;
  f.kv_first_position = p.kv_first_position;
  f.heads = static_cast<int>(g);
  f.qk = static_cast<int>(qk);
  f.dv = static_cast<int>(dv);
  f.scale = p.scale;
  f.out = p.out.data_as<float>() + h0 * dv;
  f.out_row = H * dv;
  f.out_head = dv;
  f.rows = choices.mla_flash_rows == 128 ? 128 : 64;  // 0 (the rule) and 64: 64
  f.lazy_rescale = choices.mla_lazy_rescale;
  f.split_s = choices.mla_flash_split_s;
  if (wgmma)
    cuda::run_mla_flash_wgmma(f, stream);
  else
    cuda::run_mla_flash(f, stream);
}
}  // namespace

// The naive form on cuBLASLt's fp32 GEMMs (full fp32, no TF32: the CPU reference's numerics up to summation order), a
// group of heads at a time: expand the group's K_nope | V from the cache rows (one GEMM against its kv_b rows), build
// its keys [k_nope | k_pe], then per query chunk the logits (one batched GEMM over the group's heads), the causal
// softmax in place, and P·V (batched) straight into `out`. The absorbed SIMT kernels it replaces for prefill re-read
// every cache row per head in fp32 (H100, V3 slice prefill 4096: 2.50 s of a 2.55 s step; docs/PERF.md, session 30).
// KernelChoices::mla_bf16x3: the same three GEMMs on bf16 tensor cores as hi·hi + hi·lo + lo·hi of each operand's
// bf16 terms (run_bf16_parts); the expansion and the logits with the three products side by side along K (one GEMM of
// 3K: [hi | hi | lo] x [hi | lo | hi]), P·V as three GEMMs summed into `out` (beta = 1), whose K (the visible rows)
// changes with the chunk.
void CudaBackend::mla_attention_naive(const MlaAttentionParams& p) {
  const int64_t T = p.q.dim(0);
  if (impl_->batch_invariant || T < kMlaGemmMinTokens) return mla_attention_absorbed(p);
  validate_on_device(p, impl_->device);
  const int64_t H = p.q.dim(1), dr = p.rope_dim, dn = p.q.dim(2) - dr, S = p.kv.dim(0), r = p.kv.dim(1) - dr;
  const int64_t dv = p.kv_b.dim(0) / H - dn, qk = dn + dr;
  if (S == 0) {
    DI_CUDA_CHECK(cudaMemsetAsync(p.out.data(), 0, p.out.nbytes(), impl_->s()));
    return;
  }
  const float* q = p.q.data_as<float>();
  const float* kv = cptr<float>(p.kv);
  const float* kv_b = p.kv_b.data_as<float>();
  float* out = p.out.data_as<float>();
  const bool x3 = impl_->choices.mla_bf16x3;
  const bool tf32 = impl_->choices.mla_tf32;  // f32 operands only (lt_batched): bf16x3 takes precedence
  // KernelChoices::mla_flash: the logits, softmax and P·V in one flash kernel over bf16x3 planes of the keys and values
  // (no logit buffer); the expansion stays a GEMM (bf16x3 or TF32 as chosen).
  const bool flash = impl_->choices.mla_flash && cuda::mla_flash_takes(qk, dv);
  // With the layout facts (kv row j = position kv_first_position + j, the query positions on the host), a chunk of
  // queries attends only the rows up to its latest position: causal prefill in chunks of kMlaGemmChunkTokens does about
  // half the logit and P·V work of whole rows. Without them every chunk takes all S rows.
  const bool causal = p.kv_first_position >= 0 && static_cast<int64_t>(p.host_q_positions.size()) == T;
  const int64_t chunk_tokens = causal ? kMlaGemmChunkTokens : T;
  // Heads a group and queries a chunk: chunks of chunk_tokens while the logits of several heads fit, else one head a
  // group in as many queries as fit. The group's expanded rows and keys ((dn + dv + qk) floats a row and head) keep
  // to the same budget: a short chunk after a long prefix would otherwise expand every head at once (32k rows: 3.5
  // GiB). bf16x3 adds P's two bf16 terms to each logit (half the logits a chunk) and the keys' three and V's two terms
  // to each row and head.
  // The flash kernel keeps no logits; its keys' and values' [hi | lo] planes take a float's bytes an entry.
  const int64_t logit_floats = x3 ? kMlaGemmLogitFloats / 2 : kMlaGemmLogitFloats;
  const int64_t row_floats = dn + dv + qk + (flash ? qk + dv : x3 ? (3 * qk) / 2 + dv : 0);
  const int64_t G = std::clamp<int64_t>(
      std::min(flash ? H : logit_floats / (std::min(T, chunk_tokens) * S), kMlaGemmLogitFloats / (S * row_floats)), 1,
      H);
  const int64_t Tc = std::max<int64_t>(1, std::min({T, chunk_tokens, logit_floats / (G * S)}));
  const int64_t ld_p = ceil_div(S, 8) * 8;  // P's terms: 16-byte rows
  cuda::WorkspaceArena::Scope scope(impl_->ws());
  float* kvx = impl_->ws().take_as<float>(S * G * (dn + dv));
  float* keys = impl_->ws().take_as<float>(S * G * qk);
  float* logits = flash ? nullptr : impl_->ws().take_as<float>(G * Tc * S);
  int64_t* max_qpos = impl_->ws().take_as<int64_t>(1);
  // bf16x3 operands (bf16, 2 bytes an entry): the cache rows' latent part [S, 3r] as [hi | lo | hi], a group's kv_b
  // rows [G (dn + dv), 3r] as [hi | hi | lo], its keys [S, G, 3qk] as [hi | hi | lo], a chunk's queries [Tc, G, 3qk]
  // as [hi | lo | hi], V's terms [2][S, G, dv] and P's [2][G, Tc, ld_p].
  uint16_t *c3 = nullptr, *kvb3 = nullptr, *keys3 = nullptr, *q3 = nullptr, *v2 = nullptr, *p2 = nullptr;
  if (flash) {
    keys3 = impl_->ws().take_as<uint16_t>(2 * S * G * qk);                  // the keys' [hi | lo] planes
    v2 = impl_->ws().take_as<uint16_t>(2 * cuda::mla_vt_keys(S) * G * dv);  // room for the wgmma form's Vᵀ too
  }
  if (x3) {
    c3 = impl_->ws().take_as<uint16_t>(S * 3 * r);
    kvb3 = impl_->ws().take_as<uint16_t>(G * (dn + dv) * 3 * r);
    if (!flash) {
      keys3 = impl_->ws().take_as<uint16_t>(S * G * 3 * qk);
      q3 = impl_->ws().take_as<uint16_t>(Tc * G * 3 * qk);
      v2 = impl_->ws().take_as<uint16_t>(2 * S * G * dv);
      p2 = impl_->ws().take_as<uint16_t>(2 * G * Tc * ld_p);
    }
    cuda::run_bf16_parts({.src = kv,
                          .src_row = r + dr,
                          .rows = S,
                          .len = r,
                          .dst = c3,
                          .dst_row = 3 * r,
                          .part_stride = r,
                          .parts = 3,
                          .lo_parts = 0b010},
                         impl_->s());
  }
  cuda::run_mla_max_position(p.q_positions.data_as<int64_t>(), T, max_qpos, impl_->s());
  for (int64_t h0 = 0; h0 < H; h0 += G) {
    const int64_t g = std::min(G, H - h0);
    // kvx[s, j] = Σ_c ĉ[s, c] · kv_b[h0 (dn + dv) + j, c]: column-major kvxᵀ = kv_bᵀ-rows · ĉᵀ.
    Impl::LtBatched e;
    e.tf32 = tf32;
    e.trans_a = true;
    e.rows = g * (dn + dv);
    e.cols = S;
    e.k = r;
    e.a = kv_b + h0 * (dn + dv) * r;
    e.lda = r;
    e.b = kv;
    e.ldb = r + dr;
    e.d = kvx;
    e.ldd = g * (dn + dv);
    if (x3) {
      cuda::run_bf16_parts({.src = kv_b + h0 * (dn + dv) * r,
                            .src_row = r,
                            .rows = g * (dn + dv),
                            .len = r,
                            .dst = kvb3,
                            .dst_row = 3 * r,
                            .part_stride = r,
                            .parts = 3,
                            .lo_parts = 0b100},
                           impl_->s());
      e.bf16 = true;
      e.k = 3 * r;
      e.a = kvb3;
      e.lda = 3 * r;
      e.b = c3;
      e.ldb = 3 * r;
    }
    impl_->lt_batched(e);
    cuda::MlaKeysKernelParams kp;
    kp.kvx = kvx;
    kp.kv = kv;
    kp.kv_positions = cptr<int64_t>(p.kv_positions);
    kp.max_q_position = max_qpos;
    kp.keys = keys;
    kp.s = S;
    kp.heads = g;
    kp.dn = dn;
    kp.dv = dv;
    kp.r = r;
    kp.dr = dr;
    cuda::run_mla_keys(kp, impl_->s());
    if (flash) {
      run_flash_group(p, kvx, keys, keys3, v2, g, h0, impl_->choices, impl_->s());
      continue;
    }
    if (x3) {
      head_terms(keys, g * qk, S, g, qk, keys3, 0b100, impl_->s());  // [hi | hi | lo]
      // V (masked rows zeroed by run_mla_keys): hi, then lo
      bf16_planes(kvx + dn, g * (dn + dv), dn + dv, S, g, dv, v2, impl_->s());
    }
    for (int64_t t0 = 0; t0 < T; t0 += Tc) {
      const int64_t tc = std::min(Tc, T - t0);
      // The rows this chunk's queries may see: [0, Sc).
      int64_t Sc = S;
      if (causal) {
        const int64_t newest = *std::max_element(p.host_q_positions.begin() + t0, p.host_q_positions.begin() + t0 + tc);
        Sc = std::clamp<int64_t>(newest - p.kv_first_position + 1, 0, S);
      }
      if (Sc == 0) {  // no visible key: zeros (as the softmax gives)
        DI_CUDA_CHECK(cudaMemset2DAsync(out + (t0 * H + h0) * dv, sizeof(float) * H * dv, 0, sizeof(float) * g * dv, tc,
                                        impl_->s()));
        continue;
      }
      // logits[h][t][s] = keys[s, h] · q[t0 + t, h0 + h]: column-major (S x tc) = keysᵀ · q, batched over the heads.
      Impl::LtBatched l;
      l.tf32 = tf32;
      l.trans_a = true;
      l.rows = Sc;
      l.cols = tc;
      l.k = qk;
      l.batch = g;
      l.a = keys;
      l.lda = g * qk;
      l.stride_a = qk;
      l.b = q + (t0 * H + h0) * qk;
      l.ldb = H * qk;
      l.stride_b = qk;
      l.d = logits;
      l.ldd = Sc;
      l.stride_d = tc * Sc;
      if (x3) {
        head_terms(q + (t0 * H + h0) * qk, H * qk, tc, g, qk, q3, 0b010, impl_->s());  // [hi | lo | hi]
        l.bf16 = true;
        l.k = 3 * qk;
        l.a = keys3;
        l.lda = g * 3 * qk;
        l.stride_a = 3 * qk;
        l.b = q3;
        l.ldb = g * 3 * qk;
        l.stride_b = 3 * qk;
      }
      impl_->lt_batched(l);
      cuda::MlaSoftmaxKernelParams sm;
      sm.logits = logits;
      sm.q_positions = p.q_positions.data_as<int64_t>() + t0;
      sm.kv_positions = cptr<int64_t>(p.kv_positions);
      sm.heads = g;
      sm.tokens = tc;
      sm.s = Sc;
      sm.scale = p.scale;
      if (x3) {
        sm.p_hi = p2;
        sm.p_lo = p2 + g * tc * ld_p;
        sm.ld_p = ld_p;
      }
      cuda::run_mla_causal_softmax(sm, impl_->s());
      // out[t0 + t, h0 + h, :] = Σ_s P[h][t][s] · V[s, h]: column-major (dv x tc) = Vᵀ · Pᵀ, batched over the heads.
      Impl::LtBatched o;
      o.tf32 = tf32;
      o.rows = dv;
      o.cols = tc;
      o.k = Sc;
      o.batch = g;
      o.a = kvx + dn;
      o.lda = g * (dn + dv);
      o.stride_a = dn + dv;
      o.b = logits;
      o.ldb = Sc;
      o.stride_b = tc * Sc;
      o.d = out + (t0 * H + h0) * dv;
      o.ldd = H * dv;
      o.stride_d = dv;
      if (!x3) {
        impl_->lt_batched(o);
        continue;
      }
      // V_hi·P_hi, then + V_hi·P_lo and + V_lo·P_hi.
      o.bf16 = true;
      o.lda = g * dv;
      o.stride_a = dv;
      o.ldb = ld_p;
      o.stride_b = tc * ld_p;
      const std::pair<const uint16_t*, const uint16_t*> terms[] = {
          {v2, p2}, {v2, p2 + g * tc * ld_p}, {v2 + S * g * dv, p2}};
      for (int j = 0; j < 3; ++j) {
        o.a = terms[j].first;
        o.b = terms[j].second;
        o.beta = j == 0 ? 0.0f : 1.0f;
        impl_->lt_batched(o);
      }
    }
  }
}

void CudaBackend::mla_attention_absorbed(const MlaAttentionParams& p) {
  validate_on_device(p, impl_->device);
  cuda::MlaKernelParams k;
  k.q = p.q.data_as<float>();
  k.q_positions = p.q_positions.data_as<int64_t>();
  k.kv = cptr<float>(p.kv);
  k.kv_positions = cptr<int64_t>(p.kv_positions);
  k.kv_b = p.kv_b.data_as<float>();
  k.out = p.out.data_as<float>();
  k.tokens = p.q.dim(0);
  k.heads = p.q.dim(1);
  k.s = p.kv.dim(0);
  k.dr = p.rope_dim;
  k.dn = p.q.dim(2) - k.dr;
  k.r = p.kv.dim(1) - k.dr;
  k.dv = p.kv_b.dim(0) / k.heads - k.dn;
  k.scale = p.scale;
  if (impl_->batch_invariant) {
    k.keys_per_split = cuda::kBatchInvariantSlotsPerSplit;
    k.splits = static_cast<int>(std::max<int64_t>(1, ceil_div(k.s, k.keys_per_split)));
  } else {
    k.splits = cuda::mla_splits(k.tokens, k.heads, k.s, impl_->info.sm_count);
    k.keys_per_split = ceil_div(k.s, k.splits);
  }
  cuda::WorkspaceArena::Scope scope(impl_->ws());
  const int64_t th = std::max<int64_t>(1, k.tokens * k.heads), parts = th * k.splits;
  k.q_full = impl_->ws().take_as<float>(th * (k.r + k.dr));
  k.part_o = impl_->ws().take_as<float>(parts * k.r);
  k.part_m = impl_->ws().take_as<float>(parts);
  k.part_l = impl_->ws().take_as<float>(parts);
  cuda::run_mla_attention(k, impl_->s());
}

void CudaBackend::paged_mla_attention(const PagedMlaAttentionParams& p) {
  validate(p);
  const Device& dev = impl_->device;
  for (auto [name, t] : {std::pair{"q", &p.q},
                         {"q_positions", &p.q_positions},
                         {"q_seq", &p.q_seq},
                         {"block_tables", &p.block_tables},
                         {"kv_pool", &p.kv_pool},
                         {"kv_b", &p.kv_b},
                         {"out", &p.out}})
    expect_on("paged_mla_attention", name, *t, dev);
  cuda::PagedMlaKernelParams k;
  k.q = p.q.data_as<float>();
  k.q_positions = p.q_positions.data_as<int64_t>();
  k.q_seq = p.q_seq.data_as<int32_t>();
  k.block_tables = p.block_tables.data_as<int32_t>();
  k.kv_pool = p.kv_pool.data();
  k.kv_bf16 = p.kv_pool.dtype() == DType::kBF16;
  k.kv_b = p.kv_b.data_as<float>();
  k.out = p.out.data_as<float>();
  k.tokens = p.q.dim(0);
  k.heads = p.q.dim(1);
  k.seqs = p.block_tables.dim(0);
  k.max_blocks = p.block_tables.dim(1);
  k.pool_rows = p.kv_pool.dim(0);
  k.dr = p.rope_dim;
  k.dn = p.q.dim(2) - k.dr;
  k.r = p.kv_pool.dim(1) - k.dr;
  k.dv = p.kv_b.dim(0) / k.heads - k.dn;
  k.block_size = p.block_size;
  k.scale = p.scale;
  k.status = impl_->status.word();
  const bool mma = impl_->choices.paged_mla_mma != cuda::KernelPick::kNever &&
                   cuda::paged_mla_mma_takes(k.r, k.dr, impl_->info.smem_per_block_optin);
  k.mma = mma ? cuda::KernelPick::kAlways : cuda::KernelPick::kNever;
  k.lazy_rescale = impl_->choices.mla_lazy_rescale;
  k.mma_block_heads = cuda::paged_mla_mma_block_heads(k.heads, impl_->choices.paged_mla_16);
  k.producer_ahead = impl_->choices.paged_mla_ahead;
  k.two_blocks = cuda::paged_mla_mma_two_blocks(impl_->choices.paged_mla_two_blocks, k.kv_bf16, k.mma_block_heads);
  // The longest query the tables allow bounds the splits (positions live on the device).
  if (impl_->batch_invariant)
    std::tie(k.splits, k.tiles_per_split) = cuda::paged_mla_invariant_splits(k.max_blocks * k.block_size);
  else if (mma)
    k.splits = cuda::paged_mla_mma_splits(k.tokens, k.heads, k.max_blocks * k.block_size, impl_->info.sm_count,
                                          k.mma_block_heads, k.two_blocks ? 2 : 1);
  else
    k.splits = cuda::paged_mla_splits(k.tokens, k.heads, k.max_blocks * k.block_size, impl_->info.sm_count);
  cuda::WorkspaceArena::Scope scope(impl_->ws());
  const int64_t th = std::max<int64_t>(1, k.tokens * k.heads), parts = th * k.splits;
  k.q_full = impl_->ws().take_as<float>(th * (k.r + k.dr));
  k.part_o = impl_->ws().take_as<float>(parts * k.r);
  k.part_m = impl_->ws().take_as<float>(parts);
  k.part_l = impl_->ws().take_as<float>(parts);
  cuda::run_paged_mla_attention(k, impl_->s());
}

}  // namespace deepinfer
