// The Backend interface: one virtual function per op, each taking a plain params struct whose fields carry
// their shapes in comments. Every backend validates the params once at this boundary (validate_* below are
// shared by all backends) and may then assume them.
//
// Conventions
// - Activations are row-major f32 tensors (the CPU reference computes and accumulates in fp32; a device
//   backend may accept bf16 where a field says "float").
// - Linear weights are [out, in] (y = x·Wᵀ), as checkpoints store them.
// - T = tokens in the call, D = hidden size, H = heads, hd = head dim, rd = rope dim (trailing channels of a
//   head), hc = mHC streams, N = compressed entries, E = routed experts, k = experts (or entries) per token.
// - "Optional" fields are left default-constructed (Tensor{}) when unused; check with `.data() != nullptr`.
//
// Op families (in this order below): linear/quant, norms, rope, fake-quant, mHC, compressor, indexer +
// top-k, attention, MoE, Engram, MLA (V3 family), paged cache writes, fused decode ops. Adding a family means: a
// section of param structs here, a block of virtuals in Backend, a validate_* function, and one file in ops/cpu/. A
// family added after a backend exists may give its virtuals a default that throws Unsupported until that backend
// implements them (MLA did, before the CUDA backend had MLA kernels).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "deepinfer/core/tensor.h"

namespace deepinfer {

class ThreadPool;

// ============================================================================ linear / quantized weights
// Storage formats a weight may arrive in (see model/weight_schema.h).
enum class QuantFormat {
  kFloat,     // f32 / bf16 / f16 values
  kFP8Block,  // F8_E4M3 values, one scale (E8M0 or F32) per [block_n, block_k] tile; W = q · s
  kMXFP4,     // packed e2m1 (I8/U8 [out, in/2], low nibble = even column), one E8M0 scale per 32 inputs
  kFP8Row32,  // F8_E4M3 values, one scale per 32 consecutive columns of a row (Engram tables)
};

struct DequantizeParams {
  Tensor weight;  // [N, K] (kMXFP4: [N, K/2] bytes)
  Tensor scale;   // kFP8Block: [ceil(N/block_n), ceil(K/block_k)]; kMXFP4/kFP8Row32: [N, ceil(K/32)]; else none
  QuantFormat format = QuantFormat::kFloat;
  int block_n = 128;
  int block_k = 128;
  Tensor out;  // f32 [N, K]
};

// Quantization of a GEMM's activations (its input rows), as the reference's and vLLM's FP8 / MXFP4 GEMMs do (MODELS.md
// §5; HF, our default, quantizes none). kMxfp8: each row's consecutive blocks of 32 values are rounded as fake_quant's
// kFP8E4M3Ue8m0Block32 (e4m3 RNE, UE8M0 scale pow2ceil(max(amax, 1e-4) / 448)) before the product; rows whose length
// is not a multiple of 32 pass unchanged, as in fake_quant. kFp8Block128 / kFp8Block128Ue8m0: the V3 family's reference
// (MODELS.md Part B §6, its gemm_impl "fp8"; vLLM's and SGLang's block-FP8 GEMMs): blocks of 128 values rounded as
// fake_quant's kFP8E4M3Block128 / kFP8E4M3Ue8m0Block128 (rows whose length is not a multiple of 128 pass unchanged).
// An op with act_quant computes exactly the op without it over the rounded inputs (the input tensors themselves are
// not modified).
enum class ActQuant { kNone, kMxfp8, kFp8Block128, kFp8Block128Ue8m0 };
const char* act_quant_name(ActQuant q);  // "none", "mxfp8", "fp8", "fp8-ue8m0"
// Whether q is one of the V3 family's per-128 roundings.
inline bool act_quant_block128(ActQuant q) { return q == ActQuant::kFp8Block128 || q == ActQuant::kFp8Block128Ue8m0; }

struct LinearParams {
  Tensor in;      // f32 [M, K]
  Tensor weight;  // f32 [N, K]
  Tensor out;     // f32 [M, N]; must not alias `in`
  ActQuant act_quant = ActQuant::kNone;
};

// One weight matrix as the checkpoint stores it (see DequantizeParams for the layouts).
struct QuantMatrix {
  Tensor weight;  // kFloat: f32/bf16 [N, K]; kFP8Block/kFP8Row32: fp8_e4m3 [N, K]; kMXFP4: u8/i8 [N, K/2]
  Tensor scale;   // kFP8Block: e8m0/f32 [ceil(N/block_n), ceil(K/block_k)]; kMXFP4: e8m0 [N, K/32];
                  // kFP8Row32: e8m0/f32 [N, ceil(K/32)]; kFloat: none
  QuantFormat format = QuantFormat::kFloat;
  int block_n = 128;
  int block_k = 128;
  int64_t rows() const { return weight.dim(0); }
  int64_t cols() const { return format == QuantFormat::kMXFP4 ? weight.dim(1) * 2 : weight.dim(1); }
};

// out = in · dequant(W)ᵀ in fp32 accumulation. The Backend default (the CPU reference) dequantizes W to f32
// and runs linear(). CUDA: bf16 weights go through cuBLASLt with the input rounded to bf16 (split_in: as two bf16
// terms); FP8/MXFP4 weights through the own block-dequantizing GEMM (exact products in fp32 for few rows,
// bf16-rounded inputs on the tensor-core tiles for many).
struct QuantLinearParams {
  Tensor in;  // f32 [M, K]
  QuantMatrix weight;
  Tensor out;  // f32 [M, N]
  // kFloat bf16 weights only (a matrix the checkpoint stores in bf16, so exact there): near-f32 accuracy on bf16
  // tensor cores. CUDA splits `in` into hi = bf16(in) and lo = bf16(in − hi) (both RNE; in − hi is exact in f32)
  // and sums hi·Wᵀ + lo·Wᵀ with fp32 accumulation: |in − hi − lo| <= 2^-16·|in| elementwise, so each output is
  // within 2^-16·Σ_k |in_k·W_k| (plus fp32 summation) of the exact product, where the one-term bf16 input is within
  // 2^-8·Σ_k |in_k·W_k|. Batch-invariant mode keeps its exact fp32 chain (the flag changes nothing there).
  // The CPU reference computes the exact f32 product with or without the flag (the default above): it stays the
  // ground truth, bit for bit linear() over the widened weight, which the kept-weight model tests compare with the
  // f32 model; the CUDA tests state the 2^-16 bound instead of emulating the split.
  bool split_in = false;
  ActQuant act_quant = ActQuant::kNone;  // not with split_in
};
// Throws unless split_in, when set, has the bf16 float weight it needs (every backend's linear_quant checks it).
void check_split_in(const QuantLinearParams& p, const char* op);

// out = in · dequant(W_g)ᵀ for each of `groups` equal groups: group g's weight is rows [g·N, (g+1)·N) of `weight`, its
// input and output rows [g·T, (g+1)·T) of `in` / `out` (group-major). V4's grouped output projection (wo_a) kept in its
// block format. The default runs linear_quant on each group's row slices (quant_rows; the CPU reference); CUDA may
// run all groups in one launch (KernelChoices::grouped_output_one_launch) with the same arithmetic per group.
struct GroupedQuantLinearParams {
  Tensor in;           // f32 [G·T, K]
  QuantMatrix weight;  // [G·N, K], a block format (FP8 blocks: N a multiple of block_n when G > 1)
  int64_t groups = 1;
  Tensor out;  // f32 [G·T, N]
  ActQuant act_quant = ActQuant::kNone;
};
// Rows [r0, r1) of a block-format matrix with their scales (FP8 blocks: r0 and r1 on block_n boundaries or r1 = N).
QuantMatrix quant_rows(const QuantMatrix& w, int64_t r0, int64_t r1);

struct QuantExpertWeights {
  QuantMatrix w1, w3, w2;  // gate [I, D], up [I, D], down [D, I]
};

// MoeParams with quantized experts: all routed experts share one format; the shared expert may differ
// (V4: MXFP4 routed experts, FP8 block-scaled shared expert). The Backend default dequantizes every expert to
// f32 per call and runs moe() (a reference, not a fast path). A routed expert with no weight is not resident
// (expert parallelism) and must not be selected.
struct QuantMoeParams {
  Tensor x;        // f32 [T, D]
  Tensor weights;  // f32 [T, k]
  Tensor indices;  // i32 [T, k]
  const std::vector<QuantExpertWeights>* experts = nullptr;
  const QuantExpertWeights* shared = nullptr;
  Tensor out;  // f32 [T, D]
  float swiglu_limit = 0.0f;
  bool weight_before_w2 = false;
  ActQuant act_quant = ActQuant::kNone;  // as MoeParams::act_quant
};

// Row gather: out[t] = table[ids[t]].
struct EmbeddingParams {
  Tensor table;  // f32 [V, D]
  Tensor ids;    // i64 [T], each in [0, V)
  Tensor out;    // f32 [T, D]
};

// ============================================================================ norms
// out = x · rsqrt(mean(x²) + eps) [· weight], in fp32. May run in place (out == in).
struct RmsNormParams {
  Tensor in;      // f32 [M, D]
  Tensor weight;  // f32 [D], optional (unweighted norm when absent)
  Tensor out;     // f32 [M, D]
  float eps = 1e-6f;
};

// ============================================================================ rope
// Interleaved-pair rotary embedding on the trailing `inv_freq.numel()*2` channels of every head:
// (a, b) at channels (2i, 2i+1) of the slice -> (a·cos θ − b·sin θ, a·sin θ + b·cos θ), θ = pos·inv_freq[i]
// computed in fp32. `inverse` rotates by −θ (removes a query position from attention outputs). In place.
struct RopeParams {
  Tensor x;          // f32 [T, H, hd] (H may be 1), modified in place
  Tensor positions;  // i64 [T], absolute positions
  Tensor inv_freq;   // f32 [rd/2], from rope_inv_freq()
  bool inverse = false;
};

// ============================================================================ fake quantization (QAT)
// Quantize-dequantize in place, block-wise along the last dimension (MODELS.md §3.3). Rows whose length is
// not a multiple of the block pass through unchanged, as in the reference.
enum class FakeQuantKind {
  kFP8E4M3Ue8m0Block32,   // window KV: s = pow2ceil(max(amax,1e-4)/448), e4m3 RNE
  kFP4Ue8m0Block32,       // indexer q/k: s = pow2ceil(max(amax, 6·2^-126)/6), e2m1 RNE
  kFP4E4m3Block16,        // compressed KV: s = e4m3(max(amax, 6·2^-9)/6), e2m1 RNE
  kFP8E4M3Block128,       // V3 GEMM inputs: s = max(amax,1e-4)/448 (f32), e4m3 RNE of x / s (IEEE division)
  kFP8E4M3Ue8m0Block128,  // the same with s = pow2ceil(max(amax,1e-4)/448) (V3.1's scale_fmt ue8m0)
};
// Values a block of each kind rounds together.
int fake_quant_block_len(FakeQuantKind kind);
// The rounding of a GEMM input under q (q != kNone).
FakeQuantKind act_quant_kind(ActQuant q);

struct FakeQuantParams {
  Tensor x;  // f32 [M, C], modified in place
  FakeQuantKind kind = FakeQuantKind::kFP8E4M3Ue8m0Block32;
};

// ============================================================================ mHC (hyper-connections)
// Coefficients of one mHC site: f̂ = rmsnorm(flatten(X)) (no weight), m = fn·f̂, then
// pre = σ(m[:hc]·scale0 + base) + hc_eps, post = 2σ(m[hc:2hc]·scale1 + base), comb = Sinkhorn(softmax rows)
// with `sinkhorn_iters` total normalisations (MODELS.md §2.1).
struct HcMixParams {
  Tensor streams;  // f32 [T, hc, D]
  Tensor fn;       // f32 [(2+hc)·hc, hc·D]
  Tensor base;     // f32 [(2+hc)·hc]
  Tensor scale;    // f32 [3]
  Tensor pre;      // f32 [T, hc] out
  Tensor post;     // f32 [T, hc] out
  Tensor comb;     // f32 [T, hc, hc] out; comb[t][j][k]: weight of input stream j in output stream k
  float norm_eps = 1e-6f;
  float hc_eps = 1e-6f;
  int sinkhorn_iters = 20;
};

// V4 final head: pre = σ(fn·f̂·scale + base) + hc_eps (collapse weights only).
struct HcHeadParams {
  Tensor streams;  // f32 [T, hc, D]
  Tensor fn;       // f32 [hc, hc·D]
  Tensor base;     // f32 [hc]
  Tensor scale;    // f32 [1]
  Tensor pre;      // f32 [T, hc] out
  float norm_eps = 1e-6f;
  float hc_eps = 1e-6f;
};

// out[t] = Σ_k pre[t,k] · streams[t,k].
struct HcCollapseParams {
  Tensor streams;  // f32 [T, hc, D]
  Tensor pre;      // f32 [T, hc]
  Tensor out;      // f32 [T, D]
};

// streams[t,k] <- post[t,k]·x[t] + Σ_j comb[t,j,k]·streams[t,j]   (in place).
struct HcExpandParams {
  Tensor streams;  // f32 [T, hc, D], in/out
  Tensor x;        // f32 [T, D], the sublayer output
  Tensor post;     // f32 [T, hc]
  Tensor comb;     // f32 [T, hc, hc]
};

// ============================================================================ compressor
// Gated pooling of one compressed entry per group: out[g,c] = Σ_s softmax_s(gate[g,s,c])·kv[g,s,c] (fp32).
// Slots with gate −inf get weight 0 (V4 CSA's missing predecessor window). Position biases are added to
// `gate` by the caller, which owns the slot layout (plain groups, or V4's overlapping windows).
struct CompressPoolParams {
  Tensor kv;    // f32 [G, S, C]
  Tensor gate;  // f32 [G, S, C]
  Tensor out;   // f32 [G, C]
};

// ============================================================================ indexer + top-k
// Lightning-indexer scores: out[t,n] = Σ_h relu(q[t,h]·keys[n])·score_scale · weights[t,h]·weight_scale, and
// −inf where entry n is not yet visible to the query (n >= (positions[t]+1) / ratio).
struct IndexerScoreParams {
  Tensor q;          // f32 [T, IH, Id]
  Tensor keys;       // f32 [N, Id]
  Tensor weights;    // f32 [T, IH] (weights_proj output)
  Tensor positions;  // i64 [T]
  Tensor out;        // f32 [T, N]
  int ratio = 1;
  float score_scale = 1.0f;   // Id^-0.5
  float weight_scale = 1.0f;  // IH^-0.5
};

// indexer_scores for a batch of sequences, reading each sequence's keys from the paged pool in place (no gather
// copy): row t of sequence b = q_seq[t] scores b's entries e < n_entries[t] with the same per-entry arithmetic as
// indexer_scores over those keys gathered in order (bit-identical per entry), and out[t, e] = −inf for e >=
// n_entries[t] and for entries the query cannot see yet (e >= (positions[t] + 1) / ratio); such keys are never
// read. Pages follow PagedRows: entry g of sequence b is key_pool row table[b, g·kr / bs]·(bs / kr) +
// (g·kr % bs) / kr with kr = key_ratio, bs = block_size. A block id outside the pool, an entry beyond the table or
// q_seq outside [0, B) raises an error (on CUDA through the device status word; the entries behind a bad page
// become NaN, and a bad q_seq or n_entries makes the whole row NaN).
// Decode: one query row per sequence, every sequence of a step in one call; top-k over [T, N] then selects
// exactly what it selects per row over [1, n_entries[t]] (padding is −inf, after every real entry).
struct PagedIndexerScoreParams {
  Tensor q;             // f32 [T, IH, Id]
  Tensor weights;       // f32 [T, IH] (weights_proj output)
  Tensor positions;     // i64 [T]
  Tensor q_seq;         // i32 [T], each in [0, B)
  Tensor n_entries;     // i64 [T], each in [0, N]
  Tensor block_tables;  // i32 [B, max_blocks]
  Tensor key_pool;      // f32 or bf16 [rows, Id] (bf16 rows are widened exactly), or u8 [rows, record bytes]: FP4
                        // key records (ops/kv_record.h kIndexKeyRecord; --kv-cache-dtype fp8)
  Tensor out;           // f32 [T, N]
  int block_size = 64;
  int key_ratio = 1;          // the pool's pages: block_size / key_ratio rows per block
  int ratio = 1;              // visibility, as in indexer_scores
  float score_scale = 1.0f;   // Id^-0.5
  float weight_scale = 1.0f;  // IH^-0.5
};

// V4.1 hierarchical level one: block score = max over `block_size` consecutive entries; the block holding
// the query's newest visible entry is forced in; keep the top `topk_blocks` blocks with finite score.
struct CandidateBlocksParams {
  Tensor scores;     // f32 [T, N] (−inf = invisible)
  Tensor positions;  // i64 [T]
  Tensor keep;       // u8 [T, N] out: 1 inside a kept block
  int ratio = 1;
  int topk_blocks = 1;
  int block_size = 1;
};

// Per row: select the top min(k, N) entries by score (restricted to `allowed` when given), discarding
// picks whose score is −inf. Ties go to the lower index. out: 1 = selected.
struct TopKMaskParams {
  Tensor scores;   // f32 [T, N]
  Tensor allowed;  // u8 [T, N], optional
  Tensor out;      // u8 [T, N]
  int k = 1;
};

// ============================================================================ attention
// Shared-KV (K = V, one KV head) attention with a learnable per-head sink that only joins the softmax
// denominator. Keys are the sliding window (visible iff q_pos − window < kv_pos <= q_pos) followed by the
// compressed entries (visible iff comp_mask[t,n] != 0; all visible when comp_mask is absent).
// Logits = q·k·scale; softmax in fp32; out = P·V.
struct SinkAttentionParams {
  Tensor q;             // f32 [T, H, hd]
  Tensor q_positions;   // i64 [T]
  Tensor window_kv;     // f32 [S, hd]
  Tensor kv_positions;  // i64 [S]
  Tensor compressed;    // f32 [N, hd], optional (N may be 0)
  Tensor comp_mask;     // u8 [T, N], optional
  Tensor sinks;         // f32 [H]
  Tensor out;           // f32 [T, H, hd]
  int window = 128;
  float scale = 1.0f;
};

// The same function as sink_attention for a batch of sequences, reading the paged caches in place (no gather
// copy): query t of sequence b = q_seq[t] sees the window rows of positions (q_pos − window, q_pos] that are
// >= window_begin[b] (rows below it are not in the cache: bounded replay, or never written), then the
// compressed entries listed in comp_idx[t] (entries < 0 are padding) or, instead, those e with comp_mask[t, e] != 0
// in increasing e (the same keys in the same order as sink_attention over gathered rows). Pages follow PagedRows:
// position p of sequence b is window_pool row table[b, p / bs]·bs + p % bs; compressed entry g (ratio r, bs % r == 0)
// is comp_pool row table[b, g·r / bs]·(bs / r) + (g·r % bs) / r. A block id outside the pool, or a position or entry
// beyond the table, raises an error (on CUDA through the device status word, that query's output becomes NaN).
struct PagedSinkAttentionParams {
  Tensor q;             // f32 [T, H, hd]
  Tensor q_positions;   // i64 [T]
  Tensor q_seq;         // i32 [T], each in [0, B)
  Tensor block_tables;  // i32 [B, max_blocks]
  Tensor window_pool;   // f32 or bf16 [rows, hd] (bf16 rows are widened exactly), or u8 [rows, record bytes]: FP8
                        // window records (ops/kv_record.h kWindowRecord; --kv-cache-dtype fp8)
  Tensor window_begin;  // i64 [B]
  Tensor comp_pool;     // [rows', hd] of window_pool's dtype (u8: FP4 entry records, kEntryRecord), optional
  Tensor comp_idx;      // i32 [T, K], optional: with comp_pool, exactly one of comp_idx / comp_mask
  Tensor comp_mask;     // u8 [T, N], optional
  Tensor sinks;         // f32 [H]
  Tensor out;           // f32 [T, H, hd]
  int block_size = 64;
  int comp_ratio = 1;
  int window = 128;
  float scale = 1.0f;
};

// ============================================================================ router + MoE
enum class RouterScoring { kSigmoid, kSoftmax, kSqrtSoftplus };

// scores = score_fn((x·Wᵀ) / gate_temp); indices = top-k of (scores + bias) (or hash_table[token] when
// given); weights = scores[indices] / (Σ + 1e-20) · route_scale (normalised when `normalize`).
// Group-limited selection (V3 family, n_group > 1): the E experts form n_group groups of contiguous ids; a
// group scores the sum of its top-2 biased scores (kTop2Sum, V3 noaux_tc) or its best score (kMax, V2
// group_limited_greedy); experts outside the topk_group best groups get −inf before the top-k. A backend
// must honour n_group (validate() accepts it), or V3-family routing would silently differ.
enum class GroupScore { kTop2Sum, kMax };

struct RouterParams {
  Tensor x;           // f32 [T, D]
  Tensor weight;      // f32 [E, D]
  Tensor bias;        // f32 [E], optional (selection only)
  Tensor hash_table;  // i32/i64 [V, k], optional: hash routing
  Tensor token_ids;   // i64 [T], required with hash_table
  Tensor weights;     // f32 [T, k] out
  Tensor indices;     // i32 [T, k] out
  RouterScoring scoring = RouterScoring::kSqrtSoftplus;
  float gate_temp = 1.0f;
  float route_scale = 1.0f;
  bool normalize = true;
  int n_group = 1;     // 1: no group limit
  int topk_group = 1;  // groups kept when n_group > 1
  GroupScore group_score = GroupScore::kTop2Sum;
};

// One SwiGLU expert's weights (f32): w1 gate [I, D], w3 up [I, D], w2 down [D, I].
struct ExpertWeights {
  Tensor w1, w3, w2;
};

// out[t] = Σ_j E_{indices[t,j]}(x[t]) · weights[t,j] + shared(x[t]) with the clamped SwiGLU
// g = min(w1·x, limit), u = clamp(w3·x, ±limit), h = silu(g)·u; `weight_before_w2` applies the routing
// weight to h (V4.1) instead of the expert output (V4). limit <= 0 disables the clamp.
struct MoeParams {
  Tensor x;                                             // f32 [T, D]
  Tensor weights;                                       // f32 [T, k]
  Tensor indices;                                       // i32 [T, k]
  const std::vector<ExpertWeights>* experts = nullptr;  // E entries
  const ExpertWeights* shared = nullptr;                // optional shared expert (weight 1)
  Tensor out;                                           // f32 [T, D]
  float swiglu_limit = 0.0f;
  bool weight_before_w2 = false;
  // Applied to x before w1 / w3 and to h (after the routing weight when weight_before_w2) before w2, for the
  // routed and the shared experts alike.
  ActQuant act_quant = ActQuant::kNone;
};

// ============================================================================ Engram
// N-gram hashing of V4.1 Engram: per token, ids of the 2..n-grams ending there. `tokens[t, s]` is the
// compressed id s steps back (already padded where look-back is blocked). Rolling h = (tok_0·m_0) XOR
// (tok_1·m_1) XOR …; after s+1 terms the hash of the (s+1)-gram goes to out[t, s·heads + h] =
// h mod primes[s, h] + offsets[s·heads + h].
struct EngramHashParams {
  Tensor tokens;       // i64 [T, n]
  Tensor multipliers;  // i64 [n]
  Tensor primes;       // i64 [n-1, heads]
  Tensor offsets;      // i64 [(n-1)·heads]
  Tensor out;          // i64 [T, (n-1)·heads]
};

// Gated update of the streams: for stream k, dot = Σ_d X_kd·w_kd·K_kd · rsqrt(mean X_k²+eps) ·
// rsqrt(mean K_k²+eps) / sqrt(D); g = σ(sign(dot)·sqrt(max(|dot|, 1e-6))); X_k += g·V.
struct EngramGateParams {
  Tensor streams;  // f32 [T, hc, D], in/out
  Tensor key;      // f32 [T, hc, D]
  Tensor value;    // f32 [T, D]
  Tensor weight;   // f32 [hc, D] (q_weight · k_weight)
  float eps = 1e-6f;
};

// ============================================================================ MLA (V3 family)
// Multi-head latent attention over the MLA cache (MODELS.md Part B §2). A cache row per token holds the
// normalised latent ĉ (r channels) followed by the RoPE'd shared rope key k_pe (dr channels): the 576-value
// row of V3. kv_b = kv_b_proj [H·(dn+dv), r]: per head, dn rows W_UK then dv rows W_UV. Query and key of
// head h are [q_nope | q_pe] and [W_UK,h·ĉ | k_pe]; the value is W_UV,h·ĉ. Causal: key s is visible to
// query t iff kv_positions[s] <= q_positions[t]. Logits = q·k·scale, softmax in fp32, out = P·V.
// Two ops compute the same function:
//   - mla_attention_naive expands every cache row into per-head K = [k_nope | k_pe] and V (cheaper when many
//     queries share the keys: prefill);
//   - mla_attention_absorbed folds W_UK into the query (q̃_h = W_UK,hᵀ·q_nope,h, scored against ĉ directly)
//     and W_UV into the output (o_h = W_UV,h·Σ p·ĉ), never materialising K or V (decode).
struct MlaAttentionParams {
  Tensor q;             // f32 [T, H, dn + dr]: per head q_nope | RoPE'd q_pe
  Tensor q_positions;   // i64 [T]
  Tensor kv;            // f32 [S, r + dr]: cache rows ĉ | RoPE'd k_pe
  Tensor kv_positions;  // i64 [S]
  Tensor kv_b;          // f32 [H·(dn + dv), r]
  Tensor out;           // f32 [T, H, dv]
  int rope_dim = 64;    // dr
  float scale = 1.0f;   // softmax scale, including the YaRN m² correction
  // Optional layout facts an implementation may use to skip keys no query of a block sees (the result is the same):
  // kv row j holds position kv_first_position + j (-1: unknown), and host_q_positions is q_positions on the host
  // (empty: not given).
  int64_t kv_first_position = -1;
  std::span<const int64_t> host_q_positions;
};

// The absorbed form for a batch of sequences, reading the paged MLA cache in place (no gather copy): query t of
// sequence b = q_seq[t] attends the rows of positions 0 .. q_positions[t] of that sequence (causal; every position
// below a query's is cached). Position p of sequence b is kv_pool row table[b, p / block_size]·block_size +
// p % block_size (PagedRows' layout). Same function as mla_attention_absorbed over those rows gathered in order;
// the CPU backend computes it with the same arithmetic (bit-identical). A position beyond the table or a block id
// outside the pool raises an error (on CUDA through the device status word; that query's output becomes NaN).
// Decode: one (or a few) query tokens per sequence, all sequences of a step in one call.
struct PagedMlaAttentionParams {
  Tensor q;             // f32 [T, H, dn + dr]: per head q_nope | RoPE'd q_pe
  Tensor q_positions;   // i64 [T]
  Tensor q_seq;         // i32 [T], each in [0, B)
  Tensor block_tables;  // i32 [B, max_blocks]
  Tensor kv_pool;       // f32 or bf16 [rows, r + dr]: cache rows ĉ | RoPE'd k_pe (bf16: widened exactly as read)
  Tensor kv_b;          // f32 [H·(dn + dv), r]
  Tensor out;           // f32 [T, H, dv]
  int block_size = 64;
  int rope_dim = 64;   // dr
  float scale = 1.0f;  // softmax scale, including the YaRN m² correction
};

// ============================================================================ paged cache writes
// dst[index[t]] = src[t] for every row t with index[t] >= 0 (-1 leaves no row). The rows a decode step appends to
// the paged caches, addressed by device data so that a recorded step (CUDA graph) replays with new positions.
struct ScatterRowsParams {
  Tensor src;    // f32 [T, W]
  Tensor index;  // i64 [T], each in [-1, N)
  Tensor dst;    // f32 or bf16 [N, W] (bf16: each value rounded to nearest even), or u8 [N, record bytes]: each row
                 // a quantized record of kind `record` (ops/kv_record.h; rows that kind fake-quantized)
  FakeQuantKind record = FakeQuantKind::kFP8E4M3Ue8m0Block32;
};

// ============================================================================ fused decode ops
// Sequences of the ops above as one call each: a decode step at small batch is bound by kernel launches, and
// these sequences run at every layer. Each computes exactly its composition: the Backend defaults run the
// composed ops (the CPU reference), and a device kernel repeats its own unfused kernels' arithmetic, so its
// results are bit-identical to the unfused calls on that device.

// hc_collapse then rms_norm: out = rms_norm(Σ_k pre[t,k]·streams[t,k]) [· weight] (the mHC sites' x -> xn).
struct HcCollapseNormParams {
  Tensor streams;  // f32 [T, hc, D]
  Tensor pre;      // f32 [T, hc]
  Tensor weight;   // f32 [D], optional (unweighted norm when absent)
  Tensor out;      // f32 [T, D]; must not overlap streams or pre
  float eps = 1e-6f;
};

// hc_expand then hc_mix over the expanded streams (a sublayer's output into the next mHC site's coefficients):
// mix.streams is expand.streams. The mix's outputs may be the expand's post / comb (read before they are written).
struct HcExpandMixParams {
  HcExpandParams expand;
  HcMixParams mix;
};

// Per present part: rms_norm of every [hd] head row when `norm` (weight optional), then the forward rope of
// its trailing rd channels when `rope`, then fake_quant of every head row (as [T·H, hd]) when `fake_quant`; the
// parts share positions and inv_freq (the query and the window row of an attention site). In place; the parts must
// not overlap.
struct NormRopePart {
  Tensor x;       // f32 [T, H, hd], modified in place; absent = no part
  Tensor weight;  // f32 [hd], optional (norm only)
  bool norm = true;
  bool rope = true;
  bool fake_quant = false;
  FakeQuantKind quant = FakeQuantKind::kFP8E4M3Ue8m0Block32;  // with fake_quant
};
struct NormRopeParams {
  NormRopePart parts[2];  // parts[0] required, parts[1] optional
  Tensor positions;       // i64 [T]
  Tensor inv_freq;        // f32 [rd/2], rd <= every roped part's hd
  float eps = 1e-6f;
};

// ============================================================================ recorded work
// Work recorded once and replayed with the buffers it was recorded with (CUDA graphs: decode steps are
// launch-bound). Whatever those buffers hold at a replay is what the replay reads.
class RecordedWork {
 public:
  virtual ~RecordedWork() = default;
  virtual void replay() = 0;
};
// Memory the temporaries of recordings live in (set apart from everything else; one pool may serve several
// recordings that never run concurrently). Opaque to callers.
class RecordingPool {
 public:
  virtual ~RecordingPool() = default;
};

// ============================================================================ the interface
class Backend {
 public:
  virtual ~Backend() = default;

  // linear / quantized weights
  virtual void dequantize(const DequantizeParams& p) = 0;
  virtual void linear(const LinearParams& p) = 0;
  // Weights in their stored format; the defaults dequantize to f32 and run linear / moe.
  virtual void linear_quant(const QuantLinearParams& p);
  virtual void grouped_linear_quant(const GroupedQuantLinearParams& p);
  virtual void embedding(const EmbeddingParams& p) = 0;
  // norms
  virtual void rms_norm(const RmsNormParams& p) = 0;
  // rope
  virtual void rope(const RopeParams& p) = 0;
  // fake quantization
  virtual void fake_quant(const FakeQuantParams& p) = 0;
  // mHC
  virtual void hc_mix(const HcMixParams& p) = 0;
  virtual void hc_head(const HcHeadParams& p) = 0;
  virtual void hc_collapse(const HcCollapseParams& p) = 0;
  virtual void hc_expand(const HcExpandParams& p) = 0;
  // compressor
  virtual void compress_pool(const CompressPoolParams& p) = 0;
  // indexer + top-k
  virtual void indexer_scores(const IndexerScoreParams& p) = 0;
  virtual void paged_indexer_scores(const PagedIndexerScoreParams& p) = 0;
  virtual void candidate_blocks(const CandidateBlocksParams& p) = 0;
  virtual void topk_mask(const TopKMaskParams& p) = 0;
  // attention
  virtual void sink_attention(const SinkAttentionParams& p) = 0;
  virtual void paged_sink_attention(const PagedSinkAttentionParams& p) = 0;
  // router + MoE
  virtual void router(const RouterParams& p) = 0;
  virtual void moe(const MoeParams& p) = 0;
  virtual void moe_quant(const QuantMoeParams& p);
  // Engram
  virtual void engram_hash(const EngramHashParams& p) = 0;
  virtual void engram_gate(const EngramGateParams& p) = 0;
  // MLA (V3 family): the defaults throw Unsupported ("not implemented on this backend").
  virtual void mla_attention_naive(const MlaAttentionParams& p);
  virtual void mla_attention_absorbed(const MlaAttentionParams& p);
  virtual void paged_mla_attention(const PagedMlaAttentionParams& p);
  // paged cache writes
  virtual void scatter_rows(const ScatterRowsParams& p) = 0;
  // fused decode ops: the defaults run the composed ops (backend_defaults.cc), the CPU reference.
  virtual void hc_collapse_norm(const HcCollapseNormParams& p);
  virtual void norm_rope(const NormRopeParams& p);
  virtual void hc_expand_mix(const HcExpandMixParams& p);

  // Recording (CUDA graphs). new_recording_pool() is nullptr where the backend cannot record (the CPU).
  // record() runs `enqueue` eagerly (the work happens now; it may run more than once, so it must be idempotent:
  // same inputs, same outputs) and returns it recorded. Inside `enqueue`, memory the work takes from the
  // backend's memory comes from `pool` and must not outlive the call; nothing may synchronise or upload from the
  // host. The default throws Unsupported.
  virtual std::unique_ptr<RecordingPool> new_recording_pool() { return nullptr; }
  virtual std::unique_ptr<RecordedWork> record(const std::function<void()>& enqueue, RecordingPool& pool);
};

// The CPU reference backend (ops/cpu/). num_threads <= 0: all cores. poison_empty (tests): its TensorMemory::empty
// fills with 0xFF bytes instead of zeros (ops/memory.h, poisoning_host_memory).
std::unique_ptr<Backend> make_cpu_backend(int num_threads = 0, bool poison_empty = false);

// ============================================================================ boundary validation
// Shared by every backend: throws InvalidArgument naming the op and field on a dtype/shape/contiguity
// mismatch.
void validate(const DequantizeParams& p);
void validate(const LinearParams& p);
void validate(const EmbeddingParams& p);
void validate(const RmsNormParams& p);
void validate(const RopeParams& p);
void validate(const FakeQuantParams& p);
void validate(const HcMixParams& p);
void validate(const HcHeadParams& p);
void validate(const HcCollapseParams& p);
void validate(const HcExpandParams& p);
void validate(const CompressPoolParams& p);
void validate(const IndexerScoreParams& p);
void validate(const PagedIndexerScoreParams& p);
void validate(const CandidateBlocksParams& p);
void validate(const TopKMaskParams& p);
void validate(const SinkAttentionParams& p);
void validate(const PagedSinkAttentionParams& p);
void validate(const RouterParams& p);
void validate(const MoeParams& p);
void validate(const EngramHashParams& p);
void validate(const EngramGateParams& p);
void validate(const MlaAttentionParams& p);
void validate(const PagedMlaAttentionParams& p);
void validate(const ScatterRowsParams& p);
void validate(const HcCollapseNormParams& p);
void validate(const NormRopeParams& p);
void validate(const HcExpandMixParams& p);
void validate(const GroupedQuantLinearParams& p);

}  // namespace deepinfer
