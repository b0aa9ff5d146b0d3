// The model side of `deepinfer bench`: a slice of a DeepSeek V4-family model on its real dimensions (a few
// layers of each attention kind), and the FLOPs and bytes one step of it must move, counted from the
// dimensions (never measured).
//
// What the slice covers per layer: the attention site (mHC coefficients, q/kv projections, the indexer where
// the layer owns one, sink attention over the SWA window + compressed entries, the grouped output
// projection), the MoE site (mHC coefficients, router, routed MXFP4 experts + one shared expert) and, on the
// layers that have it (LayerSpec::engram), Engram's gated update of the streams at the layer's start (n-gram hash
// ids, their table rows, the FP8 wkv projection, the gate). It leaves out the compressors' pooling,
// RMSNorm/RoPE/mHC collapse+expand arithmetic (elementwise, < 1% of the FLOPs), the embedding and the head.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "deepinfer/ops/ops.h"

namespace deepinfer::bench {

// How a layer's attention picks its compressed entries.
enum class AttnKind {
  kSwa,      // window only (ratio 0)
  kIndexed,  // own indexer scores over the compressed entries, top-k (a V4 CSA / V4.1 index-source layer)
  kReuse,    // attends another layer's top-k selection (no indexer of its own)
  kAllSeen,  // every visible compressed entry (V4 HCA, ratio 128)
};
const char* attn_kind_name(AttnKind k);

struct LayerSpec {
  AttnKind kind = AttnKind::kSwa;
  int64_t ratio = 0;    // tokens per compressed entry (0 for kSwa)
  bool engram = false;  // Engram before the layer's attention site (V4.1: layers 1 and 14)
};

struct BenchModel {
  std::string name;
  int64_t hidden = 0, heads = 0, head_dim = 0, rope_dim = 0, q_lora = 0, o_groups = 0, o_lora = 0, window = 0;
  int64_t index_heads = 0, index_dim = 0, index_topk = 0;
  int64_t experts = 0, topk = 0, moe_inter = 0, shared_experts = 1;
  int64_t hc = 4;
  int dense_block = 128;  // FP8 block-scale tile of the dense projections (square, UE8M0 scales)
  // Engram (MODELS.md 2.5): n-grams 2..engram_ngram, engram_heads hash heads each, table rows of engram_dim values.
  // The bench's table has engram_table_rows random f32 rows (the checkpoint's has ~384 M: a step reads the rows its
  // ids pick, whatever the table's size) and token ids below engram_vocab (the compressed vocabulary).
  int64_t engram_ngram = 4, engram_heads = 8, engram_dim = 256, engram_table_rows = int64_t{1} << 20;
  int64_t engram_vocab = 99092;
  float swiglu_limit = 10.0f;
  bool weight_before_w2 = false;  // V4.1 applies the routing weight before w2
  bool q_head_norm = false;       // V4 normalises each query head (unweighted RMSNorm) before its RoPE
  // Bytes a cached value takes where the paged calls read it: 4 (f32 pools) or 2 (`--kv-cache-dtype bf16`: the bench
  // keeps bf16 copies of the pools beside the f32 ones, which prefill's contiguous indexer keys still read).
  int kv_value_bytes = 4;
  // `--kv-cache-dtype fp8` (V4.1 slices): the paged calls read record copies of the pools instead (ops/kv_record.h:
  // window rows FP8, entries and indexer keys FP4, with their block scales; the rows fake-quantized first).
  bool kv_records = false;
  std::vector<LayerSpec> layers;
};

// Real dimensions (docs: ../shared/docs/MODELS.md §1); `per_kind` layers of each attention kind.
BenchModel v4_flash_slice(int per_kind = 1);   // SWA, CSA r=4 (indexed), HCA r=128 (all seen)
BenchModel v41_flash_slice(int per_kind = 1);  // SWA (+ Engram), r=2 source + reuse, r=1 source + reuse
BenchModel tiny_slice();                       // CPU plumbing: one layer of each kind, small dims

// One step: `seqs` sequences of `tokens` new tokens each, the last of which sits at position context − 1
// (decode: tokens = 1; prefill: one sequence, tokens = context = the prompt length).
struct StepShape {
  bool prefill = false;
  int64_t seqs = 1;
  int64_t tokens = 1;
  int64_t context = 1;
};

// Counts for one step. flops: multiply-adds × 2 of every matrix product the slice runs (projections,
// router, experts, mHC coefficient GEMVs, indexer scores and attention over the keys each query may see).
// bytes: the least that must cross HBM: every weight the step touches once (FP8: 1 B + UE8M0 scales, MXFP4:
// 0.5 B + 1/32 B, f32 router and mHC 4 B; routed experts: the expected number of distinct experts under
// uniform routing, E·(1 − (1 − k/E)^T)), plus the f32 window / compressed / indexer-key entries each sequence
// reads once. Activations are not counted.
struct StepCost {
  double flops = 0;
  double weight_bytes = 0;
  double cache_bytes = 0;
  double attention_bytes = 0;  // the part of cache_bytes that sink attention reads (window rows + entries)
  double bytes() const { return weight_bytes + cache_bytes; }
};
StepCost count_step(const BenchModel& m, const StepShape& s);

// How a synthetic weight is stored on the target (and so how many bytes a step reads of it).
enum class BenchFormat {
  kFP8Block,  // e4m3 + one UE8M0 scale per block×block tile
  kMXFP4,     // e2m1 pairs + one UE8M0 scale per 32 inputs
  kBF16,
  kF32,
};
const char* bench_format_name(BenchFormat f);
// Bytes of an [n, k] weight in format f (FP8: with its scales; `block` only matters for kFP8Block).
double format_bytes(BenchFormat f, int64_t n, int64_t k, int block);

// Projections that read the same input, concatenated along N into one weight so that they run as one GEMM (as
// vLLM's merged / fused column-parallel projections do): part i's rows start at offset[i]. An FP8 block scale
// covers block×block weights, so every part but the last starts on a block boundary: a part whose row count is
// not a multiple of `block` is padded (its scale rows would otherwise be shared with the next part). The V4 and
// V4.1 slices need no padding (q_lora, head_dim and the index dims are multiples of their blocks; only the
// indexer's head-weight rows, the last part, end mid-block). Padding rows are read, so count_step counts them.
struct FusedRows {
  std::vector<int64_t> offset;
  int64_t rows = 0;  // the fused weight's rows, padding included
  int64_t pad = 0;   // padding rows
};
FusedRows fuse_rows(const std::vector<int64_t>& parts, int block);
// The slice's two fused projections of a layer: [wq_a; wkv] (+ wproj, the indexer's head weights, on an indexed
// layer) over the normed input, and wq_b (+ wq_idx, the indexer's q projection) over the q latent.
FusedRows fused_input_rows(const BenchModel& m, AttnKind kind);
FusedRows fused_q_rows(const BenchModel& m, AttnKind kind);

// Paged-cache block of the slice's caches (positions; a multiple of every ratio, 128 included).
constexpr int64_t kBenchCacheBlock = 256;
// Device bytes one layer of the slice keeps as the bench allocates it: every weight (all routed experts, not only
// those a step touches; Engram's table and wkv on its layer) and the compressed-entry / index-key pools it owns for
// `max_blocks` cache blocks (the most any shape needs: seqs · ceil(context / kBenchCacheBlock)). The window pool is
// one for all layers: max_blocks · kBenchCacheBlock · head_dim f32.
double layer_stored_bytes(const BenchModel& m, const LayerSpec& l, int64_t max_blocks);
// The cache blocks the largest of `shapes` needs: seqs · ceil(context / kBenchCacheBlock), at least 1.
int64_t max_cache_blocks(const std::vector<StepShape>& shapes);
// `deepinfer bench --fill-device`: the most layers of each kind (make(k): the slice with k layers a kind) whose
// stored bytes and window pool fit in `budget`; ResourceExhausted when one of each does not.
int fit_layers_per_kind(const std::function<BenchModel(int)>& make, double budget, int64_t max_blocks);

// Pieces of count_step, exposed for the tests.
double fp8_block_bytes(int64_t n, int64_t k, int block);  // n·k + ceil(n/b)·ceil(k/b)
double mxfp4_bytes(int64_t n, int64_t k);                 // n·k/2 + n·k/32
double expected_distinct_experts(int64_t experts, int64_t topk, int64_t tokens);
// Engram's hash columns a token: (engram_ngram - 1) · engram_heads (24 for V4.1).
int64_t engram_cols(const BenchModel& m);
// Compressed entries visible to the query at `pos` (entry w covers tokens [w·r, (w+1)·r)).
int64_t visible_entries(int64_t pos, int64_t ratio);

}  // namespace deepinfer::bench
