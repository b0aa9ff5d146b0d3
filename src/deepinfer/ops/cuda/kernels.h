// Kernel entry points of the CUDA backend: one plain params struct (raw device pointers + sizes) and one
// run_<op>(params, stream) per kernel, defined in the op family's .cu file. The backend (cuda_backend*.cc)
// validates the ops.h params, takes scratch from the workspace and fills these structs; nothing here knows
// about Tensor. Every run_* checks its launch.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include "deepinfer/ops/cuda/kernel_choices.h"
#include "deepinfer/ops/cuda/pool_format.h"
#include "deepinfer/ops/ops.h"

namespace deepinfer::cuda {

// ============================================================================ linear family (linear_cuda.cu)
// Element type of a float weight stored densely (QuantFormat::kFloat).
enum class FloatKind : uint8_t { kF32, kBF16, kF16 };

struct DequantizeKernelParams {
  const void* weight = nullptr;  // [n, k] (MXFP4: [n, k/2] bytes)
  const void* scale = nullptr;   // see DequantizeParams
  bool scale_e8m0 = true;        // else f32
  QuantFormat format = QuantFormat::kFloat;
  FloatKind float_kind = FloatKind::kF32;
  int64_t n = 0, k = 0, scale_cols = 0;
  int block_n = 128, block_k = 128;
  float* out = nullptr;      // [n, k]
  void* out_bf16 = nullptr;  // [n, k] bf16 (RNE) instead of `out` when set
};
void run_dequantize(const DequantizeKernelParams& p, cudaStream_t stream);

struct EmbeddingKernelParams {
  const float* table = nullptr;  // [vocab, dim]
  const int64_t* ids = nullptr;  // [tokens]
  float* out = nullptr;          // [tokens, dim]
  int64_t tokens = 0, vocab = 0, dim = 0;
  uint32_t* status = nullptr;  // kStatusEmbeddingIdRange on a bad id (that row becomes NaN)
};
void run_embedding(const EmbeddingKernelParams& p, cudaStream_t stream);

// f32 -> bf16 (RNE), n elements.
void run_cast_f32_to_bf16(const float* in, void* out_bf16, int64_t n, cudaStream_t stream);
// f32 -> two bf16 terms, n elements: hi = bf16(x), lo = bf16(x − hi) (RNE; x − hi is exact in f32), so
// |x − hi − lo| <= 2^-16·|x| for finite x (linear_quant's split_in). Where hi is not finite: lo = 0.
void run_split_f32_to_bf16(const float* in, void* hi_bf16, void* lo_bf16, int64_t n, cudaStream_t stream);

// ============================================================================ random fill (random_cuda.cu)
// kBytes: uniform bytes (MXFP4 codes, u8); kE4M3: uniform e4m3 codes without NaN; kE8M0: scales in
// [e8m0_low, e8m0_low + e8m0_span); kF32: uniform in [-range, range) (bytes % 4 == 0); kBF16: finite values
// in ±[2^-7, 2)
enum class RandomFillMode : uint8_t { kBytes, kE4M3, kE8M0, kF32, kBF16 };
struct RandomFillKernelParams {
  void* out = nullptr;  // 8-byte aligned
  int64_t bytes = 0;
  uint64_t seed = 0;
  RandomFillMode mode = RandomFillMode::kBytes;
  float range = 1.0f;
  int e8m0_low = 120, e8m0_span = 8;
};
void run_fill_random(const RandomFillKernelParams& p, cudaStream_t stream);

// ============================================================================ block-dequantizing GEMM (gemm_cuda.cu)
// C[row(i), :] = A[arow(i), :] · dequant(B_g)ᵀ for the rows i of group g, fp32 accumulation.
// Dense use: groups = 1, group_offsets = nullptr (rows [0, m)), tables = nullptr (b / b_scale).
// Grouped use (MoE): rows i in [group_offsets[g], group_offsets[g+1]) use weight table entry g; the grid
// covers `max_tiles_m` M tiles and each block finds its group through tile_offsets (both from run_moe_plan).
struct GemmKernelParams {
  const float* a = nullptr;
  int64_t lda = 0;
  // Optional bf16 copy of A (same lda, row for row): with it, grouped/dense block-format GEMMs of many rows take
  // the pipelined mma.sync kernel (gemm_mma_cuda.cu), which would otherwise round A to bf16 itself per tile.
  const void* a_bf16 = nullptr;
  const int32_t* a_rows = nullptr;  // optional: A row of gathered row i is a_rows[i] / a_row_div
  int a_row_div = 1;
  float* c = nullptr;
  int64_t ldc = 0;
  const int32_t* c_rows = nullptr;           // optional: C row of gathered row i
  QuantFormat format = QuantFormat::kFloat;  // kFloat = f32 weights here, unless b_bf16
  // kFloat only: the weights are bf16 (exact when widened), not f32. Grouped MoE calls outside batch-invariant mode,
  // vector-aligned (gemm_vector_ok): a few rows a group take the weight-streaming kernel (fp32 products, exact),
  // more (with a_bf16) the pipelined mma.sync kernel (gemm_mma.h).
  bool b_bf16 = false;
  // With a_bf16 over bf16 weights: A's lo terms, bf16(a − bf16(a)) row for row, so that the mma.sync kernel sums
  // hi·W + lo·W (~2^-16 of fp32, as linear_quant's split_in) instead of rounding A to bf16.
  const void* a_lo_bf16 = nullptr;
  const void* b = nullptr;  // [n, k] weight (MXFP4: [n, k/2] bytes)
  const void* b_scale = nullptr;
  const void* const* b_table = nullptr;        // [groups] per-group weights (overrides b)
  const void* const* b_scale_table = nullptr;  // [groups]
  bool scale_e8m0 = true;
  int block_n = 128, block_k = 128;
  int64_t scale_cols = 0;  // columns of the scale matrix
  int64_t m = 0, n = 0, k = 0;
  int groups = 1;
  const int32_t* group_offsets = nullptr;  // [groups + 1], device
  const int32_t* tile_offsets = nullptr;   // [groups + 1], device: cumulative M tiles
  int64_t max_tiles_m = 0;                 // grid bound for the grouped case
  // Kernel choice (kFloat past kGemmSkinnyRows takes the exact SIMT kernel): rows_hint (typical rows
  // per group; 0 = m) <= kGemmSkinnyRows -> a weight-streaming kernel (fp32 products, exact; any row count is
  // correct, groups with more rows re-read their weight row from cache); more -> bf16 tensor cores (A rounded
  // to bf16; weights exact in bf16 when their scales are UE8M0).
  int64_t rows_hint = 0;
  const int32_t* active_groups = nullptr;  // grouped: [groups + 1] non-empty group ids, count at [groups]
  // Grouped, optional: the MoE plan's pass table (MoePlanKernelParams::active_passes, pass_rows rows a pass,
  // count at [pass_capacity]): the streaming kernel then runs each pass of a group in its own block instead of one
  // block looping over a group's passes (a group of 30 rows: 4 blocks in parallel, weights re-read from L2).
  const int32_t* active_passes = nullptr;
  int pass_rows = 0;
  int64_t pass_capacity = 0;
  bool tables_aligned16 = false;  // every b_table entry is 16-byte aligned (vector weight loads)
  // Batch-invariant mode: every output's arithmetic is fixed by the weight whatever m, the group sizes and
  // rows_hint are, so a row's result never depends on which other rows share the call — a fixed tensor-core
  // sequence for UE8M0 block formats (gemm_invariant_mma.h), K-sliced fp32 chains for small dense f32 weights
  // (gemm_invariant_f32.h), else the fp32 FMA chain over k = 0, 1, ..., K-1 (the SIMT tile / the column chain).
  bool batch_invariant = false;
  GemmChoices choices;  // the backend's (kernel_choices.h)
  // A dense wgmma call split along K (gemm_wgmma.h, gemm_wgmma_k_splits): k_splits >= 2 splits, each writing its
  // partial [m, n] product to split_part (k_splits · m · n floats), summed into c in split order. Else not split.
  int k_splits = 0;
  float* split_part = nullptr;
  // The FP8 expert GEMM (gemm_wgmma_fp8.h): A as MXFP8 (e4m3 codes [rows, lda] bytes, rows indexed as a's, and their
  // UE8M0 scales a block of 32, [rows, lda / 32]), and each MXFP4 weight row's fold exponent ([groups, n]:
  // run_mxfp4_fold).
  const uint8_t* a_e4m3 = nullptr;
  const uint8_t* a_scale = nullptr;
  const uint8_t* b_fold = nullptr;
  // The V3 family's form (--activation-quant fp8): a_scale holds one f32 a 128 values ([rows, lda / 128] f32: the
  // same bytes a row), the weights FP8 blocks of 128 x 128 with f32 scales.
  bool a_scale_block128 = false;
};
constexpr int kGemmTileM = 64;
// The streaming kernel re-reads A (rows × K) for every output column: cheap from L1 for a row or two, the
// dominant cost from ~5 rows up (device run 2, docs/PERF.md: 9-16-row MoE groups and M=16 projections ran
// 5-40x slower than on the tensor-core / cuBLASLt paths).
constexpr int kGemmSkinnyRows = 4;
void run_gemm(const GemmKernelParams& p, cudaStream_t stream);
// The current device's SM count (132, the H200's, when the runtime cannot say): the GEMM launchers' shape rules.
int device_sm_count();

// ============================================================================ norms (norm_cuda.cu)
struct RmsNormKernelParams {
  const float* in = nullptr;
  const float* weight = nullptr;  // optional
  float* out = nullptr;           // may equal in
  int64_t rows = 0, dim = 0;
  float eps = 1e-6f;
};
void run_rms_norm(const RmsNormKernelParams& p, cudaStream_t stream);
// Threads of the rms_norm kernel for a row of `dim`: thread i sums elements i, i + threads, ... before the block
// sum, so a fused kernel that reduces the same way over this many threads gets bit-identical statistics.
__host__ __device__ constexpr int rms_norm_threads(int64_t dim) { return dim >= 1024 ? 512 : (dim >= 256 ? 256 : 128); }

// ============================================================================ rope (rope_cuda.cu)
struct RopeKernelParams {
  float* x = nullptr;  // [tokens, heads, hd]
  const int64_t* positions = nullptr;
  const float* inv_freq = nullptr;  // [half]
  int64_t tokens = 0, heads = 0, hd = 0, half = 0;
  bool inverse = false;
};
void run_rope(const RopeKernelParams& p, cudaStream_t stream);

// ============================================================================ fake quant (fake_quant_cuda.cu)
struct FakeQuantKernelParams {
  float* x = nullptr;         // [rows, cols], cols % block == 0
  const float* in = nullptr;  // optional source [rows, cols]: x = fake_quant(in) in one pass (x unchanged when cols
                              // % block != 0); null: x in place
  int64_t rows = 0, cols = 0;
  FakeQuantKind kind = FakeQuantKind::kFP8E4M3Ue8m0Block32;
};
void run_fake_quant(const FakeQuantKernelParams& p, cudaStream_t stream);
// fake_quant's kFP8E4M3Ue8m0Block32 rounding as an FP8 operand (mxfp8_quantize_rows' bytes): codes [rows, cols] e4m3,
// scales [rows, cols / 32] e8m0; cols % 32 == 0, x 16-byte aligned.
struct Mxfp8QuantizeKernelParams {
  const float* x = nullptr;   // [rows, cols]
  uint8_t* codes = nullptr;   // [rows, cols]
  uint8_t* scales = nullptr;  // [rows, cols / 32]
  int64_t rows = 0, cols = 0;
};
void run_mxfp8_quantize(const Mxfp8QuantizeKernelParams& p, cudaStream_t stream);
// fake_quant's kFP8E4M3(Ue8m0)Block128 rounding as an FP8 operand (fp8_block128_quantize_rows' bytes): codes e4m3 and
// one f32 scale a block of 128, block c of row r's at scales[r · scale_row_stride + c · scale_block_stride]
// (cuBLASLt's VEC128_32F: 1 and rows). cols % 128 == 0, ldx and ldc multiples of 4, x 16-byte aligned.
struct Fp8Block128QuantizeKernelParams {
  const float* x = nullptr;  // [rows, ldx]
  int64_t ldx = 0;
  uint8_t* codes = nullptr;  // [rows, ldc]
  int64_t ldc = 0;
  float* scales = nullptr;
  int64_t scale_row_stride = 0, scale_block_stride = 0;
  int64_t rows = 0, cols = 0;
  bool ue8m0 = false;
};
void run_fp8_block128_quantize(const Fp8Block128QuantizeKernelParams& p, cudaStream_t stream);

// ============================================================================ mHC (hc_cuda.cu)
struct HcMixKernelParams {
  const float* streams = nullptr;  // [tokens, hc, d]
  const float* fn = nullptr;       // [rows, hc*d]; rows = (2+hc)*hc (mix) or hc (head)
  const float* base = nullptr;
  const float* scale = nullptr;
  float* pre = nullptr;
  float* post = nullptr;  // mix only
  float* comb = nullptr;  // mix only
  int64_t tokens = 0, hc = 0, d = 0;
  float norm_eps = 1e-6f, hc_eps = 1e-6f;
  int sinkhorn_iters = 20;
  bool head = false;  // hc_head: only `pre` with scale[0]
  // Scratch of splits·tokens·(rows + 1) floats for the split-K partial sums, splits = hc_mix_splits(hc, d).
  float* partial = nullptr;
  int splits = 0;
  // Optional: kHcMixArrivalSlots zeroed counters (left zeroed) that let the partial kernel's last block per token tile
  // run the finish itself — one launch a site. Calls of more than 8 · kHcMixArrivalSlots tokens take two launches.
  unsigned* arrivals = nullptr;
  // run_hc_expand_mix only: hc_expand of `streams` (the same pointer, writable) by these first.
  float* expand_streams = nullptr;
  const float* expand_x = nullptr;     // [tokens, d]
  const float* expand_post = nullptr;  // [tokens, hc]
  const float* expand_comb = nullptr;  // [tokens, hc, hc]
};
constexpr int kHcMixArrivalSlots = 64;  // token tiles of 8 rows: calls of up to 512 tokens
int hc_mix_splits(int64_t hc, int64_t d);
void run_hc_mix(const HcMixKernelParams& p, cudaStream_t stream);
// hc_expand then hc_mix (HcExpandMixParams): one launch for hc <= 4, d % 512 == 0 and up to 4 · kHcMixArrivalSlots
// tokens with `arrivals` set, else run_hc_expand and run_hc_mix.
void run_hc_expand_mix(const HcMixKernelParams& p, cudaStream_t stream);

struct HcCollapseKernelParams {
  const float* streams = nullptr;
  const float* pre = nullptr;
  float* out = nullptr;
  int64_t tokens = 0, hc = 0, d = 0;
};
void run_hc_collapse(const HcCollapseKernelParams& p, cudaStream_t stream);

struct HcExpandKernelParams {
  float* streams = nullptr;  // in/out
  const float* x = nullptr;
  const float* post = nullptr;
  const float* comb = nullptr;
  int64_t tokens = 0, hc = 0, d = 0;
};
void run_hc_expand(const HcExpandKernelParams& p, cudaStream_t stream);

// ============================================================================ fused decode ops (fused_decode_cuda.cu)
// hc_collapse then rms_norm in one launch (HcCollapseNormParams).
struct HcCollapseNormKernelParams {
  const float* streams = nullptr;  // [tokens, hc, d]
  const float* pre = nullptr;      // [tokens, hc]
  const float* weight = nullptr;   // [d], optional
  float* out = nullptr;            // [tokens, d]
  int64_t tokens = 0, hc = 0, d = 0;
  float eps = 1e-6f;
};
void run_hc_collapse_norm(const HcCollapseNormKernelParams& p, cudaStream_t stream);

// rms_norm per head row, forward rope and / or fake_quant of up to two parts in one launch (NormRopeParams).
struct NormRopeKernelPart {
  float* x = nullptr;             // [tokens, heads, hd]; nullptr = no part
  const float* weight = nullptr;  // [hd], optional
  int64_t heads = 0, hd = 0;
  bool norm = false, rope = false, fake_quant = false;
  FakeQuantKind quant = FakeQuantKind::kFP8E4M3Ue8m0Block32;
};
struct NormRopeKernelParams {
  NormRopeKernelPart parts[2];
  const int64_t* positions = nullptr;  // [tokens]
  const float* inv_freq = nullptr;     // [half]
  int64_t tokens = 0, half = 0;
  float eps = 1e-6f;
};
void run_norm_rope(const NormRopeKernelParams& p, cudaStream_t stream);

// ============================================================================ compressor (compressor_cuda.cu)
struct CompressPoolKernelParams {
  const float* kv = nullptr;
  const float* gate = nullptr;
  float* out = nullptr;
  int64_t groups = 0, slots = 0, ch = 0;
};
void run_compress_pool(const CompressPoolKernelParams& p, cudaStream_t stream);

// ============================================================================ indexer + top-k (indexer_cuda.cu)
struct IndexerScoresKernelParams {
  const float* q = nullptr;    // [tokens, heads, dim]
  const void* keys = nullptr;  // [n, dim] f32; paged: the pool [pool_rows, pool_row_bytes(keys_format, dim) bytes]
  PoolFormat keys_format = PoolFormat::kF32;  // paged pools only: f32, bf16 or FP4 key records (pool_rows.cuh)
  const float* weights = nullptr;
  const int64_t* positions = nullptr;
  float* out = nullptr;
  int64_t tokens = 0, heads = 0, dim = 0, n = 0;
  int ratio = 1;
  float score_scale = 1.0f, weight_scale = 1.0f;
  // Paged keys (PagedIndexerScoreParams) when block_tables is set: token t reads sequence q_seq[t]'s entries
  // below n_entries[t] through its block table; bad pages set `status` (kStatusPagedAttentionRange).
  const int32_t* q_seq = nullptr;
  const int64_t* n_entries = nullptr;
  const int32_t* block_tables = nullptr;  // [seqs, max_blocks]
  int64_t seqs = 0, max_blocks = 0, pool_rows = 0;
  int block_size = 1, key_ratio = 1;
  uint32_t* status = nullptr;
  KernelPick mma = KernelPick::kAuto;  // the tensor-core kernel (indexer_mma.h)
  bool mma_decode = true;              // its decode form (KernelChoices::indexer_mma_decode)
  bool mma_ring = true;                // the decode form's ring kernel (KernelChoices::indexer_mma_ring)
  size_t smem_optin = 0;               // as PagedSinkAttentionKernelParams::smem_optin
};
void run_indexer_scores(const IndexerScoresKernelParams& p, cudaStream_t stream);

struct CandidateBlocksKernelParams {
  const float* scores = nullptr;
  const int64_t* positions = nullptr;
  uint8_t* keep = nullptr;
  float* block_scores = nullptr;  // scratch [tokens, ceil(n / block_size)]
  uint8_t* block_keep = nullptr;  // scratch [tokens, ceil(n / block_size)]
  int64_t tokens = 0, n = 0;
  int ratio = 1, topk_blocks = 1, block_size = 1;
  KernelPick small_blocks = KernelPick::kAuto;  // KernelChoices::topk_small_blocks
};
void run_candidate_blocks(const CandidateBlocksKernelParams& p, cudaStream_t stream);

struct TopKMaskKernelParams {
  const float* scores = nullptr;
  const uint8_t* allowed = nullptr;  // optional
  uint8_t* out = nullptr;
  int64_t tokens = 0, n = 0;
  int64_t k = 1;
  KernelPick small_blocks = KernelPick::kAuto;  // KernelChoices::topk_small_blocks
};
void run_topk_mask(const TopKMaskKernelParams& p, cudaStream_t stream);

// ============================================================================ attention (attention_cuda.cu)
struct SinkAttentionKernelParams {
  const float* q = nullptr;  // [tokens, heads, hd]
  const int64_t* q_positions = nullptr;
  const float* window_kv = nullptr;  // [s, hd]
  const int64_t* kv_positions = nullptr;
  const float* compressed = nullptr;   // [n_comp, hd], optional
  const uint8_t* comp_mask = nullptr;  // [tokens, n_comp], optional
  const float* sinks = nullptr;
  float* out = nullptr;
  int64_t tokens = 0, heads = 0, hd = 0, s = 0, n_comp = 0;
  int window = 128;
  float scale = 1.0f;
};
void run_sink_attention(const SinkAttentionKernelParams& p, cudaStream_t stream);

// Paged sink attention (attention_paged_cuda.cu), see PagedSinkAttentionParams. `splits` > 1 splits each
// query's key slots into chunks of `slots_per_split`; the partial buffers then hold [tokens, heads, splits]
// (part_o with hd per entry).
struct PagedSinkAttentionKernelParams {
  const float* q = nullptr;  // [tokens, heads, hd]
  const int64_t* q_positions = nullptr;
  const int32_t* q_seq = nullptr;
  const int32_t* block_tables = nullptr;  // [seqs, max_blocks]
  const void* window_pool = nullptr;      // [window_rows, hd] of window_format (pool_rows.cuh)
  const int64_t* window_begin = nullptr;  // [seqs]
  const void* comp_pool = nullptr;        // [comp_rows, hd] of comp_format, optional
  // Both f32, both bf16, or V4.1's records (--kv-cache-dtype fp8): FP8 window rows, FP4 entries (SlotPools).
  PoolFormat window_format = PoolFormat::kF32, comp_format = PoolFormat::kF32;
  const int32_t* comp_idx = nullptr;   // [tokens, k_sel], or
  const uint8_t* comp_mask = nullptr;  // [tokens, k_sel]: entry e where comp_mask[t, e] != 0
  const float* sinks = nullptr;
  float* out = nullptr;
  float *part_o = nullptr, *part_m = nullptr, *part_l = nullptr;
  int64_t tokens = 0, heads = 0, hd = 0, seqs = 0, max_blocks = 0, window_rows = 0, comp_rows = 0, k_sel = 0;
  int64_t slots_per_split = 0;
  int splits = 1;
  // Write partials and merge them in the combine kernel even with one split: batch-invariant mode, where the
  // split boundaries are fixed (kBatchInvariantSlotsPerSplit) and a query's result must not depend on whether
  // the longest query of the call needed more splits (empty splits merge as exact zeros).
  bool always_combine = false;
  int block_size = 64, comp_ratio = 1;
  int64_t window = 128;
  float scale = 1.0f;
  uint32_t* status = nullptr;
  KernelPick mma = KernelPick::kAuto;  // the tensor-core kernel (attention_paged_mma.h)
  // The device's opt-in shared memory a block (DeviceInfo::smem_per_block_optin, read once by the backend); 0: asked
  // of the runtime at the call (tests that build the params themselves).
  size_t smem_optin = 0;
};
// Splits for a launch: enough blocks to fill the SMs, at least 32 key slots each.
int paged_attention_splits(int64_t tokens, int64_t heads, int64_t max_slots, int sm_count);
// Batch-invariant mode: key slots per split, whatever the batch.
constexpr int64_t kBatchInvariantSlotsPerSplit = 256;
void run_paged_sink_attention(const PagedSinkAttentionKernelParams& p, cudaStream_t stream);

// ============================================================================ MLA (mla_cuda.cu)
// Absorbed-form MLA (MlaAttentionParams). Scratch from the caller: q_full [tokens, heads, r + dr] and the split
// partials [tokens, heads, splits] (part_o with r per entry), splits = mla_splits(...), keys_per_split =
// ceil(s / splits).
struct MlaKernelParams {
  const float* q = nullptr;  // [tokens, heads, dn + dr]
  const int64_t* q_positions = nullptr;
  const float* kv = nullptr;  // [s, r + dr]
  const int64_t* kv_positions = nullptr;
  const float* kv_b = nullptr;  // [heads·(dn + dv), r]
  float* out = nullptr;         // [tokens, heads, dv]
  float* q_full = nullptr;
  float *part_o = nullptr, *part_m = nullptr, *part_l = nullptr;
  int64_t tokens = 0, heads = 0, s = 0, dn = 0, dr = 0, dv = 0, r = 0, keys_per_split = 0;
  int splits = 1;
  float scale = 1.0f;
};
int mla_splits(int64_t tokens, int64_t heads, int64_t s, int sm_count);
void run_mla_attention(const MlaKernelParams& p, cudaStream_t stream);
// The naive form's pieces around its GEMMs (CudaBackend::mla_attention_naive, many queries): the latest query
// position (one int64 on the device) ...
void run_mla_max_position(const int64_t* q_positions, int64_t tokens, int64_t* out, cudaStream_t stream);
// ... the per-head keys [k_nope | k_pe] of `heads` heads from their expanded rows ([s, heads, dn + dv]: k_nope | v a
// head) and the cache rows' shared k_pe, with the values of rows no query sees (kv_positions[j] > *max_q_position)
// zeroed in place (the softmax gives them weight 0, but 0 · NaN is NaN: such rows may hold anything) ...
struct MlaKeysKernelParams {
  float* kvx = nullptr;                   // [s, heads, dn + dv]
  const float* kv = nullptr;              // [s, r + dr] cache rows (k_pe = the last dr)
  const int64_t* kv_positions = nullptr;  // [s]
  const int64_t* max_q_position = nullptr;
  float* keys = nullptr;  // [s, heads, dn + dr]
  int64_t s = 0, heads = 0, dn = 0, dv = 0, r = 0, dr = 0;
};
void run_mla_keys(const MlaKeysKernelParams& p, cudaStream_t stream);
// ... and the causal softmax of the logits in place: rows = heads x tokens (head-major), each `s` logits of query t
// against the keys; key j counts iff kv_positions[j] <= q_positions[t]; p = softmax(scale · logit) in fp32, 0 where
// masked (a row with no visible key: all 0). With p_hi / p_lo (KernelChoices::mla_bf16x3) p goes there instead, as
// bf16 terms hi + lo (split_bf16), row `row` at row · ld_p (ld_p >= s); the logits then hold the exponentials.
struct MlaSoftmaxKernelParams {
  float* logits = nullptr;                // [heads, tokens, s]
  const int64_t* q_positions = nullptr;   // [tokens]
  const int64_t* kv_positions = nullptr;  // [s]
  int64_t heads = 0, tokens = 0, s = 0;
  float scale = 1.0f;
  void* p_hi = nullptr;  // bf16 [heads, tokens, ld_p], optional (with p_lo)
  void* p_lo = nullptr;
  int64_t ld_p = 0;
};
void run_mla_causal_softmax(const MlaSoftmaxKernelParams& p, cudaStream_t stream);
// f32 values as bf16 terms for the naive MLA's bf16x3 GEMMs (KernelChoices::mla_bf16x3): element e < len of segment
// g < segs of row r (src + r · src_row + g · src_seg + e) split into hi + lo (split_bf16), written to `parts` parts
// (2 or 3) at dst + r · dst_row + g · dst_seg + j · part_stride + e, part j holding lo where bit j of lo_parts is set,
// hi elsewhere (strides in elements). A GEMM's operands [hi | hi | lo] and [hi | lo | hi] along K give
// hi·hi + hi·lo + lo·hi: the product within ~2^-16 of fp32's on bf16 tensor cores.
struct Bf16PartsKernelParams {
  const float* src = nullptr;
  int64_t src_row = 0, src_seg = 0;
  int64_t rows = 0, segs = 1, len = 0;
  void* dst = nullptr;
  int64_t dst_row = 0, dst_seg = 0, part_stride = 0;
  int parts = 2;
  unsigned lo_parts = 0b10;
};
void run_bf16_parts(const Bf16PartsKernelParams& p, cudaStream_t stream);
// Flash attention for the naive form (mla_flash_cuda.cu, KernelChoices::mla_flash): out[t, h] = softmax over the keys
// j with kv_positions[j] <= q_positions[t] of scale · (q[t, h] · k[j, h]) times v[j, h], in one pass (online softmax,
// bf16x3 products). q f32 at q + t · q_row + h · q_head; keys and values as bf16 [hi | lo] planes (run_bf16_parts):
// key j of head h at k2 + j · k_row + h · k_head, its lo terms k_part elements on (values likewise); vec16: every row,
// head and plane offset a multiple of 8 elements and the bases 16-byte aligned (16-byte loads). With
// kv_first_position >= 0 (row j holds position kv_first_position + j) a block of queries stops at its newest row.
struct MlaFlashKernelParams {
  const float* q = nullptr;
  int64_t q_row = 0, q_head = 0;
  const void* k2 = nullptr;
  int64_t k_row = 0, k_head = 0, k_part = 0;
  const void* v2 = nullptr;
  int64_t v_row = 0, v_head = 0, v_part = 0;
  bool vec16 = false;
  const int64_t* q_positions = nullptr;   // [tokens]
  const int64_t* kv_positions = nullptr;  // [s]
  int64_t tokens = 0, s = 0, kv_first_position = -1;
  int heads = 0, qk = 0, dv = 0;
  float scale = 1.0f;
  float* out = nullptr;
  int64_t out_row = 0, out_head = 0;
  int rows = 64;  // queries a block: 64, or 128 with double-buffered key tiles (KernelChoices::mla_flash_rows)
  bool lazy_rescale = false;  // skip O's rescale where no row's max grew (KernelChoices::mla_lazy_rescale)
  bool split_s = false;       // S's hi·hi and cross terms in separate accumulators (KernelChoices::mla_flash_split_s)
};
// Whether run_mla_flash has an instantiation for heads of qk key values and dv values (qk <= 192, dv <= 128).
bool mla_flash_takes(int64_t qk, int64_t dv);
void run_mla_flash(const MlaFlashKernelParams& p, cudaStream_t stream);
// The same on warpgroup MMAs (mla_flash_wgmma_cuda.cu, KernelChoices::mla_flash_wgmma; sm_90a): qk <= 192 and dv <=
// 128, both multiples of 8, p.vec16, and the values as Vᵀ planes (run_mla_vt_parts): value (s, h, d) at v2 + h · v_head
// + d · v_row + s (v_row = mla_vt_keys(s): the keys padded to the kernel's tile), its lo term v_part elements on.
bool mla_flash_wgmma_takes(int64_t qk, int64_t dv);
int64_t mla_vt_keys(int64_t s);
void run_mla_flash_wgmma(const MlaFlashKernelParams& p, cudaStream_t stream);
// Vᵀ's bf16 [hi | lo] planes for run_mla_flash_wgmma: value (s, h, d) at src + s · src_row + h · src_head + d to
// dst + (h · dv + d) · s_pad + s (lo part elements on), zeros for keys in [s, s_pad) (s_pad a multiple of 32).
struct MlaVtPartsKernelParams {
  const float* src = nullptr;
  int64_t src_row = 0, src_head = 0;
  int64_t s = 0, s_pad = 0;
  int heads = 0, dv = 0;
  uint16_t* dst = nullptr;
  int64_t part = 0;
};
void run_mla_vt_parts(const MlaVtPartsKernelParams& p, cudaStream_t stream);

// Paged absorbed-form MLA (PagedMlaAttentionParams, mla_paged_cuda.cu). Scratch from the caller: q_full
// [tokens, heads, r + dr] and the split partials [tokens, heads, splits] (part_o with r per entry), splits =
// paged_mla_splits(...).
struct PagedMlaKernelParams {
  const float* q = nullptr;  // [tokens, heads, dn + dr]
  const int64_t* q_positions = nullptr;
  const int32_t* q_seq = nullptr;
  const int32_t* block_tables = nullptr;  // [seqs, max_blocks]
  const void* kv_pool = nullptr;          // [pool_rows, r + dr], f32 or (kv_bf16) bf16
  bool kv_bf16 = false;
  const float* kv_b = nullptr;  // [heads·(dn + dv), r]
  float* out = nullptr;         // [tokens, heads, dv]
  float* q_full = nullptr;
  float *part_o = nullptr, *part_m = nullptr, *part_l = nullptr;
  int64_t tokens = 0, heads = 0, seqs = 0, max_blocks = 0, pool_rows = 0, dn = 0, dr = 0, dv = 0, r = 0;
  int splits = 1;
  // > 0: each split covers this many 32-key tiles (batch-invariant mode: split boundaries depend only on the
  // query's own keys); 0: a query's tiles are divided evenly over `splits`.
  int64_t tiles_per_split = 0;
  int block_size = 64;
  float scale = 1.0f;
  uint32_t* status = nullptr;
  // kAlways: the attend step on the tensor cores (mla_paged_mma.h; the caller checked paged_mla_mma_takes and sized
  // the splits by paged_mla_mma_splits); otherwise the fp32 kernel.
  KernelPick mma = KernelPick::kNever;
  int mma_block_heads = 32;     // the tensor-core kernel's heads a block (paged_mla_mma_block_heads)
  bool producer_ahead = false;  // 16-head blocks: producers load a tile ahead (KernelChoices::paged_mla_ahead)
  bool two_blocks = false;      // bf16 pool, 16-head blocks: two blocks an SM (paged_mla_mma_two_blocks)
  bool lazy_rescale = false;    // the tensor-core kernel skips Ō's rescale where no max grew (mla_lazy_rescale)
};
// Splits for a launch: about two blocks per SM, at most one per 32-key tile of the longest query.
int paged_mla_splits(int64_t tokens, int64_t heads, int64_t max_keys, int sm_count);
// Batch-invariant mode: (splits, tiles_per_split) for queries of up to max_keys keys — 8 tiles (256 keys) per
// split while that fits the combine's split limit, so invariance holds for keys <= 64 · 256 = 16,384; longer
// tables widen the splits (and a query's result then depends on the longest table of the call).
std::pair<int, int64_t> paged_mla_invariant_splits(int64_t max_keys);
void run_paged_mla_attention(const PagedMlaKernelParams& p, cudaStream_t stream);

// ============================================================================ router + MoE (moe_cuda.cu)
// After the logits GEMM: score function, optional softmax, bias, top-k (or hash table), weights.
struct RouterSelectKernelParams {
  const float* logits = nullptr;     // [tokens, experts], x·Wᵀ
  const float* bias = nullptr;       // optional
  const void* hash_table = nullptr;  // optional, [vocab, k] i32/i64
  bool hash_i64 = false;
  int64_t hash_rows = 0;
  const int64_t* token_ids = nullptr;
  float* weights = nullptr;  // [tokens, k]
  int32_t* indices = nullptr;
  int64_t tokens = 0, experts = 0, k = 0;
  RouterScoring scoring = RouterScoring::kSqrtSoftplus;
  float gate_temp = 1.0f, route_scale = 1.0f;
  bool normalize = true;
  int n_group = 1, topk_group = 1;  // group-limited selection (V3 family) when n_group > 1
  GroupScore group_score = GroupScore::kTop2Sum;
  uint32_t* status = nullptr;
};
void run_router_select(const RouterSelectKernelParams& p, cudaStream_t stream);

// Groups the T·k (token, slot) pairs by expert: perm lists slot ids (t·k + j) grouped by expert;
// group_offsets/tile_offsets are [experts + 1]. Slots with a bad expert id raise kStatusExpertIdRange and
// are left out (their output row stays zero).
struct MoePlanKernelParams {
  const int32_t* indices = nullptr;  // [slots]
  int64_t slots = 0;
  int experts = 0;
  int32_t* perm = nullptr;           // [slots]
  int32_t* group_offsets = nullptr;  // [experts + 1]
  int32_t* tile_offsets = nullptr;   // [experts + 1]
  int32_t* active_groups = nullptr;  // [experts + 1]: ids of non-empty experts, their count at [experts]
  // Optional [pass_capacity + 1]: every pass_rows-row pass of every expert in expert order, entry = expert | (pass
  // << 16), their count at [pass_capacity] (the decode GEMMs give each pass its own block: GemmKernelParams).
  int32_t* active_passes = nullptr;
  int pass_rows = 8;
  int64_t pass_capacity = 0;
  int32_t* cursor = nullptr;  // scratch [experts]
  uint32_t* status = nullptr;
};
void run_moe_plan(const MoePlanKernelParams& p, cudaStream_t stream);
// Entries the pass table needs at most: Σ_e ceil(c_e / r) <= ceil(slots / r) + min(experts, slots).
constexpr int64_t moe_pass_capacity(int64_t slots, int64_t experts, int64_t pass_rows) {
  return (slots + pass_rows - 1) / pass_rows + (experts < slots ? experts : slots);
}

// h[r, i] = silu(min(gu[r, i], limit)) · clamp(gu[r, I + i], ±limit) (· weights[row_weight(r)] if given).
struct SwigluKernelParams {
  const float* gu = nullptr;  // [rows, 2·inter]
  float* h = nullptr;         // [rows, inter]
  int64_t rows = 0, inter = 0;
  float limit = 0.0f;
  const float* weights = nullptr;        // optional [slots]
  const int32_t* weight_rows = nullptr;  // optional: slot of row r (else r)
  const int32_t* rows_used = nullptr;    // optional device count of valid rows (group_offsets[E])
};
void run_swiglu(const SwigluKernelParams& p, cudaStream_t stream);

// out[t] = Σ_j (in expert-id order) y_slot[t·k + j] (· weights[t·k + j] unless weighted already) + shared[t].
struct MoeCombineKernelParams {
  const float* y_slot = nullptr;  // [tokens·k, d]
  const int32_t* indices = nullptr;
  const float* weights = nullptr;  // nullptr: already applied
  const float* shared = nullptr;   // optional [tokens, d]
  float* out = nullptr;
  int64_t tokens = 0, k = 0, d = 0;
  int experts = 0;
};
void run_moe_combine(const MoeCombineKernelParams& p, cudaStream_t stream);

// ============================================================================ Engram (engram_cuda.cu)
struct EngramHashKernelParams {
  const int64_t* tokens = nullptr;
  const int64_t* multipliers = nullptr;
  const int64_t* primes = nullptr;
  const int64_t* offsets = nullptr;
  int64_t* out = nullptr;
  int64_t count = 0, n = 0, heads = 0;
};
void run_engram_hash(const EngramHashKernelParams& p, cudaStream_t stream);

struct EngramGateKernelParams {
  float* streams = nullptr;
  const float* key = nullptr;
  const float* value = nullptr;
  const float* weight = nullptr;
  int64_t tokens = 0, hc = 0, d = 0;
  float eps = 1e-6f;
};
void run_engram_gate(const EngramGateKernelParams& p, cudaStream_t stream);

// ============================================================================ memory moves (memory_cuda.cu)
// Strided copy of up to 4 dimensions (shape padded with leading 1s); strides in elements, src strides may
// be 0 (broadcast). Element size 1, 2, 4 or 8 bytes.
struct StridedCopyKernelParams {
  void* dst = nullptr;
  const void* src = nullptr;
  int64_t shape[4] = {1, 1, 1, 1};
  int64_t dst_strides[4] = {0, 0, 0, 0};
  int64_t src_strides[4] = {0, 0, 0, 0};
  int elem_bytes = 4;
};
void run_strided_copy(const StridedCopyKernelParams& p, cudaStream_t stream);

// ============================================================================ sampling (sampling_cuda.cu)
// One block per row: the CPU Sampler's chain from the token mask on (mask → temperature → top-k → top-p →
// min-p), then inverse-CDF sampling with the same Philox draw (sampling/rng.h), or argmax for temperature 0.
struct SampleKernelParams {
  const float* logits = nullptr;       // [rows, vocab]
  const float* temperature = nullptr;  // [rows]; 0 = greedy
  const int32_t* top_k = nullptr;      // [rows]; <= 0 or >= vocab: off
  const float* top_p = nullptr;        // [rows]; >= 1: off
  const float* min_p = nullptr;        // [rows]; <= 0: off
  const uint64_t* rng = nullptr;       // [rows, 3]: seed, stream, position
  const uint32_t* allowed = nullptr;   // [rows, mask_words] bit t of word t/32 = token t allowed; null: all
  int64_t mask_words = 0;
  int32_t* out = nullptr;  // [rows]: the token; -1 for a row with NaN/+inf logits or nothing left to sample
  int64_t rows = 0, vocab = 0;
  uint32_t* status = nullptr;  // kStatusSampleRange for a position outside [0, 2^32) (that row gets -1)
};
void run_sample(const SampleKernelParams& p, cudaStream_t stream);

// f32: out[i] = value, n elements; out[i] += in[i], n elements.
void run_fill_f32(float* out, float value, int64_t n, cudaStream_t stream);
void run_add_f32(float* out, const float* in, int64_t n, cudaStream_t stream);
// out[i] = bf16(in[i]) (round to nearest even, NaN kept quiet), n elements; out[i] = f32(in[i]) (exact).
void run_cast_f32_bf16(uint16_t* out, const float* in, int64_t n, cudaStream_t stream);
void run_cast_bf16_f32(float* out, const uint16_t* in, int64_t n, cudaStream_t stream);

// dst[index[t]] = src[t] for index[t] >= 0 (ops.h ScatterRowsParams); an index outside [-1, dst_rows) raises
// kStatusScatterRange and writes nothing for that row.
struct ScatterRowsKernelParams {
  const float* src = nullptr;                // [rows, width]
  const int64_t* index = nullptr;            // [rows]
  void* dst = nullptr;                       // [dst_rows, pool_row_bytes(dst_format, width) bytes]
  PoolFormat dst_format = PoolFormat::kF32;  // bf16: rounded to nearest even; a record: encoded (kv_record.cuh)
  int64_t rows = 0, width = 0, dst_rows = 0;
  uint32_t* status = nullptr;  // also kStatusRecordEncode: a row that is no record of the format (stored as NaNs)
};
void run_scatter_rows(const ScatterRowsKernelParams& p, cudaStream_t stream);

// Quantized cache records (TensorMemory::convert_records): rows f32 [rows, width] <-> records [rows,
// pool_row_bytes(format, width)] of a record format. Encoding a row that is no record of the format stores NaNs and
// raises kStatusRecordEncode.
struct RecordRowsKernelParams {
  const void* src = nullptr;
  void* dst = nullptr;
  PoolFormat format = PoolFormat::kFp8Ue8m0B32;
  int64_t rows = 0, width = 0;
  uint32_t* status = nullptr;
};
void run_records_encode(const RecordRowsKernelParams& p, cudaStream_t stream);
void run_records_decode(const RecordRowsKernelParams& p, cudaStream_t stream);
// The pool format of a pool tensor: f32, bf16, or u8 records of `record` (ops/kv_record.h's kinds).
PoolFormat pool_format_of(DType dtype, FakeQuantKind record);

}  // namespace deepinfer::cuda
