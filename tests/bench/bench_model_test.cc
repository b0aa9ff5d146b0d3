// FLOP/byte counting of the bench slice against values worked out by hand for the tiny slice (dims in
// bench_model.cc: D=64, H=4, hd=32, q_lora=32, 2 output groups of 16, window 8, indexer 2×16 top-4, 4 experts
// top-2 of I=32 + 1 shared, hc=4, 32×32 FP8 blocks).
#include "deepinfer/bench/bench_model.h"

#include <gtest/gtest.h>

#include <functional>

#include "deepinfer/core/error.h"

namespace deepinfer::bench {
namespace {

TEST(BenchModel, Pieces) {
  EXPECT_EQ(visible_entries(15, 2), 8);
  EXPECT_EQ(visible_entries(0, 2), 0);
  EXPECT_EQ(visible_entries(1, 2), 1);
  EXPECT_EQ(visible_entries(127, 128), 1);
  EXPECT_EQ(visible_entries(100, 0), 0);
  EXPECT_DOUBLE_EQ(expected_distinct_experts(4, 2, 1), 2.0);  // one token picks exactly k
  EXPECT_DOUBLE_EQ(expected_distinct_experts(4, 2, 2), 3.0);  // 4·(1 − ½²)
  EXPECT_DOUBLE_EQ(expected_distinct_experts(256, 6, 0), 0.0);
  EXPECT_DOUBLE_EQ(fp8_block_bytes(33, 64, 32), 33 * 64 + 2 * 2);  // partial block row still has a scale
  EXPECT_DOUBLE_EQ(mxfp4_bytes(32, 64), 1024 + 64);
}

TEST(BenchModel, TinyDecodeStepByHand) {
  const BenchModel m = tiny_slice();
  const StepCost c = count_step(m, {false, 1, 1, 16});
  // Per layer, every kind: projections 2·(32·64 + 128·32 + 32·64 + 16·128 + 64·32) = 24576; mHC 2 sites ·
  // 2·24·256 = 24576; router 2·4·64 = 512; experts 2·(2+1)·3·64·32 = 36864.
  const double common = 24576 + 24576 + 512 + 36864;
  // Attention at position 15: 8 window keys; + top-4 of 8 entries (indexed, reuse r=2); + 4 entries (r=4).
  const double attn = 4.0 * 128 * (8 + 12 + 12 + 12);
  // Indexer (r=2 layer): q proj 2·(32·32) + head weights 2·(2·64), scores 2·2·16·8.
  const double indexer = 2.0 * (32 * 32 + 2 * 64) + 2.0 * 2 * 16 * 8;
  // Engram (first layer): 2-3-grams x 2 heads = 4 hash columns of 16 values; wkv [(4+1)·64, 64]: 2·320·64.
  const double engram = 2.0 * 320 * 64;
  EXPECT_DOUBLE_EQ(c.flops, 4 * common + attn + indexer + engram);
  // Weights per layer: projections 2050 + 4100 + 2050 + 2·1026 + 2050; mHC 2·4·24·256; router 4·4·64; two
  // distinct experts 2·3·1088; shared expert 3·2050. Indexer: 1025 + 130.
  const double w_layer =
      (2050 + 4100 + 2050 + 2 * 1026 + 2050) + 2 * 4 * 24 * 256 + 4 * 4 * 64 + 2 * 3 * 1088 + 3 * 2050;
  // Engram: wkv 320·64 + 10·2 scales, the gate's f32 [4, 64], the token's 4 table rows of 16 f32.
  const double w_engram = (320 * 64 + 10 * 2) + 4 * 4 * 64 + 4 * 4 * 16;
  EXPECT_DOUBLE_EQ(c.weight_bytes, 4 * w_layer + 1025 + 130 + w_engram);
  // Cache rows (f32, 32 wide): 8 window rows per layer, + 4 selected (r=2 twice) / 4 entries (r=4); index keys
  // 8 rows of 16.
  EXPECT_DOUBLE_EQ(c.cache_bytes, 4.0 * 32 * (8 + 12 + 12 + 12) + 4.0 * 16 * 8);
  EXPECT_DOUBLE_EQ(c.bytes(), c.weight_bytes + c.cache_bytes);
}

// --kv-cache-dtype fp8: the paged rows are read as records (ops/kv_record.h; 32-value rows here, padded to 4 bytes): a
// window row 32 + 1 -> 36 B, an entry 16 + 2 -> 20 B, an indexer key of 32 values 16 + 1 -> 20 B.
TEST(BenchModel, RecordCachesCountTheRecordBytes) {
  BenchModel m = tiny_slice();
  m.index_dim = 32;
  m.kv_records = true;
  const StepCost c = count_step(m, {false, 1, 1, 16});
  // TinyDecodeStepByHand's rows: 8 window rows in each of the 4 layers, 4 entries in each of the last 3; 8 keys.
  EXPECT_DOUBLE_EQ(c.attention_bytes, 36.0 * 8 * 4 + 20.0 * 4 * 3);
  EXPECT_DOUBLE_EQ(c.cache_bytes, c.attention_bytes + 20.0 * 8);
  // Prefill's indexer reads the f32 keys contiguously, the attention the records.
  BenchModel f32 = m;
  f32.kv_records = false;
  const StepCost p = count_step(m, {true, 1, 4, 16}), pf = count_step(f32, {true, 1, 4, 16});
  EXPECT_LT(p.attention_bytes * 3, pf.attention_bytes);
  EXPECT_DOUBLE_EQ(p.cache_bytes - p.attention_bytes, pf.cache_bytes - pf.attention_bytes);
}

TEST(BenchModel, PrefillCountsEveryQueryCausally) {
  BenchModel m = tiny_slice();
  m.layers = {{AttnKind::kAllSeen, 2}};
  const StepCost c = count_step(m, {true, 1, 4, 4});
  // Positions 0..3: window keys 1+2+3+4, entries 0+1+1+2.
  const double attn = 4.0 * 128 * (10 + 4);
  EXPECT_DOUBLE_EQ(c.flops, 4 * (24576 + 24576 + 512 + 36864) + attn);
  // 4 tokens touch 4·(1 − ½⁴) = 3.75 experts on average.
  EXPECT_DOUBLE_EQ(c.weight_bytes, 12302 + 2 * 4 * 24 * 256 + 4 * 4 * 64 + 3.75 * 3 * 1088 + 3 * 2050);
  EXPECT_DOUBLE_EQ(c.cache_bytes, 4.0 * 32 * (4 + 2));
}

// Engram on the V4.1 slice: one layer (the first) whatever the layers per kind, counted as the model's update: the
// FP8 wkv [(4+1)·5120, 24·256] with its 32x32 scales (V4.1's dense block), the gate's f32 [4, 5120] and 24 f32 table
// rows of 256 a token (at most the bench table's rows).
TEST(BenchModel, V41SliceCountsItsEngramLayer) {
  for (int per_kind : {1, 2}) {
    const BenchModel m = v41_flash_slice(per_kind);
    int engram = 0;
    for (const LayerSpec& l : m.layers) engram += l.engram;
    EXPECT_EQ(engram, 1);
    EXPECT_TRUE(m.layers.front().engram);
    EXPECT_EQ(engram_cols(m), 24);
    BenchModel without = m;
    without.layers.front().engram = false;
    for (const StepShape& s : {StepShape{false, 1, 1, 4096}, StepShape{false, 64, 1, 4096}}) {
      const StepCost a = count_step(m, s), b = count_step(without, s);
      const double t = static_cast<double>(s.seqs * s.tokens), width = 24 * 256;
      EXPECT_DOUBLE_EQ(a.flops - b.flops, 2 * t * 25600 * width);
      EXPECT_DOUBLE_EQ(a.weight_bytes - b.weight_bytes,
                       25600 * width + 800 * 192 + 4.0 * 4 * 5120 + 4.0 * 256 * 24 * t);
      EXPECT_DOUBLE_EQ(a.cache_bytes, b.cache_bytes);
    }
  }
}

// What a layer keeps on the device, by hand for the tiny slice (d 64, 32-blocks): projections 12302, mHC 2·4·(24·256 +
// 24 + 3), router 4·4·65, experts 4·3·1088, shared 3·2050; Engram's table 700·16 f32, wkv 320·64 + 10·2, gate 4·4·64;
// the indexed r=2 layer's compressed pool (32 f32) and index keys (16 f32) of 128 entries a cache block.
TEST(BenchModel, LayerStoredBytesByHand) {
  const BenchModel m = tiny_slice();
  const double swa = 12302 + 2 * 4 * (24 * 256 + 24 + 3) + 4 * 4 * 65 + 4 * 3 * 1088 + 3 * 2050;
  EXPECT_DOUBLE_EQ(layer_stored_bytes(m, {AttnKind::kSwa, 0}, 3), swa);
  EXPECT_DOUBLE_EQ(layer_stored_bytes(m, {AttnKind::kSwa, 0, true}, 3), swa + 700 * 16 * 4 + 20500 + 4 * 4 * 64);
  const LayerSpec indexed{AttnKind::kIndexed, 2};
  EXPECT_DOUBLE_EQ(layer_stored_bytes(m, indexed, 3) - layer_stored_bytes(m, indexed, 0), 3 * 128 * 4.0 * (32 + 16));
  const LayerSpec reuse{AttnKind::kReuse, 2};  // reads its source's pool
  EXPECT_DOUBLE_EQ(layer_stored_bytes(m, reuse, 3), layer_stored_bytes(m, reuse, 0));
}

// --fill-device: one more layer of each kind per `per_set` bytes past the first set; too small a budget is an error.
// On an H200-sized budget (~121.7 GB) with batch 256 x 4096-token caches: 2 V4.1 sets (~41 GB a set of 5 layers: 7.2
// GB of experts a layer, the r=1 layer's 2.1 GB compressed pool), 10 V4-Flash sets (~11.4 GB a set of 3).
TEST(BenchModel, FitLayersPerKind) {
  for (const auto& make :
       {std::function<BenchModel(int)>(v4_flash_slice), std::function<BenchModel(int)>(v41_flash_slice)}) {
    const auto stored = [&](int k) {
      const BenchModel m = make(k);
      double bytes = 4.0 * 4096 * kBenchCacheBlock * m.head_dim;
      for (const LayerSpec& l : m.layers) bytes += layer_stored_bytes(m, l, 4096);
      return bytes;
    };
    const double first = stored(1), per_set = stored(2) - first;
    EXPECT_DOUBLE_EQ(stored(3) - stored(2), per_set);
    EXPECT_EQ(fit_layers_per_kind(make, first, 4096), 1);
    EXPECT_EQ(fit_layers_per_kind(make, first + 2.5 * per_set, 4096), 3);
    EXPECT_THROW(fit_layers_per_kind(make, 0.99 * first, 4096), Error);
  }
  const double h200 = 0.9 * 140e9 - 4.0 * (1ull << 30);
  EXPECT_EQ(fit_layers_per_kind(v41_flash_slice, h200, 256 * 16), 2);
  EXPECT_EQ(fit_layers_per_kind(v4_flash_slice, h200, 256 * 16), 10);
}

// Fused projections: every part but the last starts on a block boundary (padding a part that ends mid-block).
TEST(BenchModel, FuseRowsPadsAllButTheLastPart) {
  const FusedRows f = fuse_rows({100, 50, 7}, 32);
  EXPECT_EQ(f.offset, (std::vector<int64_t>{0, 128, 192}));
  EXPECT_EQ(f.rows, 199);
  EXPECT_EQ(f.pad, 28 + 14);
  const FusedRows aligned = fuse_rows({1024, 512, 64}, 128);
  EXPECT_EQ(aligned.offset, (std::vector<int64_t>{0, 1024, 1536}));
  EXPECT_EQ(aligned.rows, 1600);
  EXPECT_EQ(aligned.pad, 0);
  EXPECT_THROW(fuse_rows({}, 32), Error);
  EXPECT_THROW(fuse_rows({16, 0}, 32), Error);
}

// The real slices need no padding, so the fused weights move exactly the bytes of the separate ones (the byte
// count the bench printed before the fusion): [wq_a; wkv; wproj] and [wq_b; wq_idx].
TEST(BenchModel, FusedWeightsOfTheRealSlicesMoveTheSeparateBytes) {
  for (const BenchModel& m : {v4_flash_slice(), v41_flash_slice(), tiny_slice()}) {
    const int b = m.dense_block;
    const int64_t d = m.hidden, hhd = m.heads * m.head_dim;
    for (AttnKind kind : {AttnKind::kSwa, AttnKind::kIndexed}) {
      const bool idx = kind == AttnKind::kIndexed;
      const FusedRows in = fused_input_rows(m, kind), q = fused_q_rows(m, kind);
      EXPECT_EQ(in.pad + q.pad, 0) << m.name;
      const double separate_in = fp8_block_bytes(m.q_lora, d, b) + fp8_block_bytes(m.head_dim, d, b) +
                                 (idx ? fp8_block_bytes(m.index_heads, d, b) : 0.0);
      const double separate_q =
          fp8_block_bytes(hhd, m.q_lora, b) + (idx ? fp8_block_bytes(m.index_heads * m.index_dim, m.q_lora, b) : 0.0);
      EXPECT_DOUBLE_EQ(fp8_block_bytes(in.rows, d, b), separate_in) << m.name << " " << attn_kind_name(kind);
      EXPECT_DOUBLE_EQ(fp8_block_bytes(q.rows, m.q_lora, b), separate_q) << m.name << " " << attn_kind_name(kind);
    }
  }
}

// A q latent that ends mid-block is padded in the fused weight, and the padding rows are counted as bytes read
// (the FLOPs stay the model's).
TEST(BenchModel, PaddedFusionCountsThePadding) {
  BenchModel m = tiny_slice();
  m.layers = {{AttnKind::kSwa, 0}};
  const StepCost before = count_step(m, {false, 1, 1, 16});
  BenchModel odd = m;
  odd.q_lora = 40;  // pads to 64 rows before wkv: 24 padding rows over D = 64, and one more scale row block
  const StepCost c = count_step(odd, {false, 1, 1, 16});
  const double d = m.hidden, hhd = m.heads * m.head_dim;
  // [wq_a; wkv] grows from 64 to 96 rows (8 real + 24 padding) and wq_b's K from 32 to 40 columns; the FLOPs
  // grow by the 8 real q-latent rows only, 2·8·(D + hhd).
  const double grown = (fp8_block_bytes(64 + 32, 64, 32) - fp8_block_bytes(32 + 32, 64, 32)) +
                       (fp8_block_bytes(128, 40, 32) - fp8_block_bytes(128, 32, 32));
  EXPECT_DOUBLE_EQ(c.weight_bytes - before.weight_bytes, grown);
  EXPECT_DOUBLE_EQ(fp8_block_bytes(64 + 32, 64, 32) - fp8_block_bytes(40 + 32, 64, 32), 24 * 64);
  EXPECT_DOUBLE_EQ(c.flops - before.flops, 2.0 * 8 * (d + hhd));
}

TEST(BenchModel, BadStepIsRejected) {
  EXPECT_THROW(count_step(tiny_slice(), {false, 0, 1, 16}), Error);
  EXPECT_THROW(count_step(tiny_slice(), {true, 1, 32, 16}), Error);
  EXPECT_THROW(v4_flash_slice(0), Error);
}

TEST(BenchModel, RealSlicesHaveEveryKind) {
  const BenchModel v41 = v41_flash_slice(2);
  EXPECT_EQ(v41.layers.size(), 10u);
  EXPECT_EQ(v41.hidden, 5120);
  EXPECT_EQ(v41.experts, 384);
  const BenchModel v4 = v4_flash_slice();
  EXPECT_EQ(v4.layers.size(), 3u);
  EXPECT_EQ(v4.layers[2].kind, AttnKind::kAllSeen);
  EXPECT_EQ(v4.layers[2].ratio, 128);
  // One V4.1 decode token, one layer: the dense projections alone are 2·(1280·5120 + 32768·1280 + 512·5120 +
  // 1024·32768 + 5120·8192) FLOPs.
  BenchModel one = v41;
  one.layers = {{AttnKind::kSwa, 0}};
  const StepCost c = count_step(one, {false, 1, 1, 1024});
  const double proj = 2.0 * (1280.0 * 5120 + 32768.0 * 1280 + 512.0 * 5120 + 1024.0 * 32768 + 5120.0 * 8192);
  const double mhc = 2 * 2.0 * 24 * 4 * 5120, router = 2.0 * 384 * 5120, experts = 2.0 * 7 * 3 * 5120 * 2304;
  EXPECT_DOUBLE_EQ(c.flops, proj + mhc + router + experts + 4.0 * 32768 * 128);
}

}  // namespace
}  // namespace deepinfer::bench
