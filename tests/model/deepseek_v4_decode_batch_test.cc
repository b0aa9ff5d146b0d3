// DeepseekV4Model::decode_batch (the engine's batched decode step) on the V4 and V4.1 golden models and on
// generated V4.1 checkpoints with compress ratios 2 and 128: paged sequences of different lengths decode in
// lockstep, all active ones per step in one decode_batch call, and every logit must be bit-identical to one
// forward() per sequence (the CPU ops are row-independent). The prompt lengths put the sequences of one batch in
// different phases: some close a compressor group in the step and others do not (r = 2, 4, 16, 128; V4's CSA
// overlap and indexer, V4.1's shared selections and candidate blocks), windows past the ring wrap, prompts shorter
// than a window, starts at a prefix hit in another sequence's blocks (with the replayed positions), and V4.1
// bounded replay (decoder windows in the slot's ring, decoder_from per sequence).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <random>

#include "counting_backend.h"
#include "deepinfer/io/safetensors.h"
#include "deepinfer/model/deepseek_v4.h"
#include "deepinfer/model/random_checkpoint.h"
#include "random_checkpoint_util.h"
#include "test_util.h"
#include "v4_paged_decode.h"

namespace deepinfer {
namespace {

using testing::make_specs;
using testing::paged_decode;
using testing::Spec;
constexpr int kBlock = testing::kV4Block;

std::string golden_dir(const std::string& family) { return testing::test_data_dir() + "/golden/" + family; }

std::vector<int64_t> ids_of(const SafetensorsFile& f, const std::string& name) {
  Tensor t = f.tensor(name);
  return std::vector<int64_t>(t.data_as<int64_t>(), t.data_as<int64_t>() + t.numel());
}

struct Loaded {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<SafetensorsFile> golden;  // golden models only
  std::unique_ptr<DeepseekV4Model> model;
  std::unique_ptr<testing::TempDir> tmp;  // generated checkpoints
};

Loaded& golden_model(const std::string& family) {
  static std::map<std::string, std::unique_ptr<Loaded>> cache;
  auto& m = cache[family];
  if (!m) {
    m = std::make_unique<Loaded>();
    m->backend = make_cpu_backend(0);
    m->golden = SafetensorsFile::open(golden_dir(family) + "/golden.safetensors");
    std::optional<std::vector<int64_t>> map;
    if (m->golden->find("engram.token_map")) map = ids_of(*m->golden, "engram.token_map");
    m->model = DeepseekV4Model::load(golden_dir(family), *m->backend, map);
  }
  return *m;
}

// The V4.1 golden config with both kv sources (layers 1 and 3) at ratio `r` for layer 1 (and its reuse layer 2).
Loaded& generated_v41(int r) {
  static std::map<int, std::unique_ptr<Loaded>> cache;
  auto& m = cache[r];
  if (!m) {
    m = std::make_unique<Loaded>();
    m->tmp = std::make_unique<testing::TempDir>();
    nlohmann::json cfg =
        nlohmann::json::parse(testing::read_file_or_empty(golden_dir("deepseek_v41") + "/config.json"));
    auto& tc = cfg["text_config"];
    tc["compress_ratios"] = {0, r, r, 1, 1, 1};
    tc["index_topk"] = 4;
    tc["candidate_topk_blocks"] = 2;
    tc["candidate_block_size"] = 2;
    const std::string ckpt_dir = testing::write_random_checkpoint_of(*m->tmp, cfg, 7 + r);
    m->backend = make_cpu_backend(0);
    std::vector<int64_t> token_map(tc["vocab_size"].get<int64_t>());
    for (size_t i = 0; i < token_map.size(); ++i) token_map[i] = static_cast<int64_t>((i * 7) % 256);
    m->model = DeepseekV4Model::load(ckpt_dir, *m->backend, token_map);
  }
  return *m;
}

// Batched (and batched padded to graph buckets, as decode graphs run it: DecodeGraphs without recording) equals
// one forward() per sequence, bit for bit.
// forward_every: some sequences step through forward() between batched steps (paged_decode), unpadded.
void expect_batched_equals_single(const DeepseekV4Model& m, const std::vector<Spec>& specs, bool bounded,
                                  int block = kBlock, int forward_every = 0) {
  DecodeGraphs padding(m.backend(), 256, /*record=*/false);
  const auto single = paged_decode(m, specs, bounded, /*batched=*/false, block);
  const int64_t v = m.config().vocab_size;
  for (DecodeGraphs* graphs : {static_cast<DecodeGraphs*>(nullptr), &padding}) {
    if (graphs && forward_every > 0) continue;
    SCOPED_TRACE(graphs ? "padded to batch buckets" : "unpadded");
    const auto batched = paged_decode(m, specs, bounded, /*batched=*/true, block, graphs, forward_every);
    for (size_t i = 0; i < specs.size(); ++i) {
      ASSERT_EQ(batched[i].size(), specs[i].gen.size() * v) << "sequence " << i;
      ASSERT_EQ(batched[i].size(), single[i].size()) << "sequence " << i;
      bool finite = true;
      for (float x : batched[i]) finite = finite && std::isfinite(x);
      EXPECT_TRUE(finite) << "sequence " << i;
      for (size_t j = 0; j < batched[i].size(); ++j)
        ASSERT_EQ(std::memcmp(&batched[i][j], &single[i][j], sizeof(float)), 0)
            << "sequence " << i << " (prompt " << specs[i].prompt.size() << ") step " << j / v << " logit " << j % v
            << ": batched " << batched[i][j] << " vs " << single[i][j];
    }
  }
  if (forward_every > 0) return;
  // Every step went through the padded path (no recording on the CPU).
  EXPECT_GT(padding.stats().padded_eager, 0);
  EXPECT_EQ(padding.stats().recorded, 0);
}

// Prompt lengths around the compressor and window boundaries: 1 (a first token), below / at / past the window
// (16), every residue mod 4 and mod 16, long ones past several groups; 8–10 decode steps each, so every step's
// batch mixes sequences that close a group with ones that do not.
const std::vector<int64_t> kLengths = {1, 3, 6, 15, 16, 17, 30, 33, 47, 62, 70, 101};

TEST(V4DecodeBatch, GoldenV4EqualsPerSequence) {
  const DeepseekV4Model& m = *golden_model("deepseek_v4").model;
  // 9 and 11 start at prefix hits (32 and 64 positions) in 8's and 10's blocks; V4 replays the CSA window.
  expect_batched_equals_single(m, make_specs(m, kLengths, 8, {{{9, 8, 32}}, {{11, 10, 64}}}), false);
}

TEST(V4DecodeBatch, GoldenV41EqualsPerSequence) {
  const DeepseekV4Model& m = *golden_model("deepseek_v41").model;
  for (bool bounded : {false, true}) {
    SCOPED_TRACE(bounded ? "bounded replay" : "exact prefill");
    expect_batched_equals_single(m, make_specs(m, kLengths, 8, {{{9, 8, 32}}, {{11, 10, 64}}}), bounded);
  }
}

TEST(V4DecodeBatch, GeneratedV41Ratio2EqualsPerSequence) {
  const DeepseekV4Model& m = *generated_v41(2).model;
  for (bool bounded : {false, true})
    expect_batched_equals_single(m, make_specs(m, {2, 5, 9, 16, 17, 40, 41}, 6, {{{6, 5, 32}}}), bounded);
}

TEST(V4DecodeBatch, GeneratedV41Ratio128EqualsPerSequence) {
  // Groups close at 128 and 256: the batch has sequences crossing a boundary and ones far from it.
  const DeepseekV4Model& m = *generated_v41(128).model;
  expect_batched_equals_single(m, make_specs(m, {5, 124, 126, 127, 128, 200, 253}, 6, {{{6, 5, 128}}}),
                               /*bounded=*/true, /*block=*/128);
}

// The batched decode keeps open compressor groups in the pages' pool (V4SlotPool); a sequence that takes a
// forward() of its own in between gets them back, and the next batched step pools them again (another slot,
// possibly): every 3rd sequence-step goes through forward(), V4 (CSA overlap and HCA, main and indexer
// compressors) and V4.1 ratio 2.
TEST(V4DecodeBatch, PooledCompressorsSurviveForwardSteps) {
  {
    SCOPED_TRACE("V4");
    const DeepseekV4Model& m = *golden_model("deepseek_v4").model;
    expect_batched_equals_single(m, make_specs(m, kLengths, 10, {{{9, 8, 32}}}), false, kBlock, 3);
  }
  {
    SCOPED_TRACE("V4.1 ratio 2");
    const DeepseekV4Model& m = *generated_v41(2).model;
    expect_batched_equals_single(m, make_specs(m, {2, 5, 9, 16, 17, 40, 41}, 8), false, kBlock, 3);
  }
  SCOPED_TRACE("V4.1 bounded replay (rings pooled too)");
  const DeepseekV4Model& m = *golden_model("deepseek_v41").model;
  expect_batched_equals_single(m, make_specs(m, kLengths, 10, {{{9, 8, 32}}}), true, kBlock, 3);
}

// B paged sequences of one prompt length (distinct random ids) prefilled with forward(), so that every decode step of
// theirs is at one position; sequence b's blocks are those of index first + b, room for `steps` decode steps.
struct SameLengthBatch {
  SameLengthBatch(const DeepseekV4Model& m, int64_t B, int64_t prompt, int64_t steps, bool bounded, int64_t first)
      : pages(m.new_kv_pages(bounded)), tables(static_cast<size_t>(B)) {
    const int64_t blocks = (prompt + steps) / kBlock + 1;
    seqs.reserve(static_cast<size_t>(B));
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t k = 0; k < blocks; ++k) tables[b].push_back(static_cast<BlockId>((first + b) * blocks + k));
      seqs.push_back(m.new_sequence());
      seqs[b].pages = &pages;
      seqs[b].ref = PageRef{tables[b], kBlock, 0};
      if (bounded) seqs[b].decoder_from = m.bounded_decoder_from(prompt);
      m.forward(seqs[b], testing::random_ids(prompt, m.config().vocab_size, 40 + static_cast<uint32_t>(b)));
    }
    for (V4SequenceState& st : seqs) ptrs.push_back(&st);
  }
  SameLengthBatch(const SameLengthBatch&) = delete;
  SameLengthBatch& operator=(const SameLengthBatch&) = delete;

  V4KvPages pages;
  std::vector<std::vector<BlockId>> tables;
  std::vector<V4SequenceState> seqs;
  std::vector<V4SequenceState*> ptrs;
};

// What a batched decode step enqueues does not grow with the batch: the same ops, data moves and allocations for 2 and
// for 8 sequences (each step's sequences at the same positions, so that the same groups close), step after step,
// groups closing or not, after the first (which pools each sequence's open groups). Only rows grow. (Before the
// compressor pool, each sequence added ~8 launches and 4 allocations per compressor per step.) Under V4.1's bounded
// replay the ring layers still attend per sequence: bounded by a few launches a sequence a ring layer.
TEST(V4DecodeBatch, LaunchesPerStepDoNotGrowWithTheBatch) {
  for (const std::string run : {"deepseek_v4", "deepseek_v41", "deepseek_v41 bounded"}) {
    SCOPED_TRACE(run);
    const bool bounded = run == "deepseek_v41 bounded";
    const std::string family = bounded ? "deepseek_v41" : run;
    const std::unique_ptr<Backend> cpu = make_cpu_backend(0);
    testing::CountingBackend counting(*cpu);
    std::optional<std::vector<int64_t>> map;
    if (golden_model(family).golden->find("engram.token_map"))
      map = ids_of(*golden_model(family).golden, "engram.token_map");
    const std::unique_ptr<DeepseekV4Model> m = DeepseekV4Model::load(golden_dir(family), counting, map);
    const int64_t prompt = 37, steps = 14, V = m->config().vocab_size;
    auto per_step = [&](int64_t B) {
      // Block ids end at the same id for every B, so that the pages grow at the same steps.
      SameLengthBatch batch(*m, B, prompt, steps, bounded, 8 - B);
      std::vector<testing::LaunchCounts> out;
      for (int64_t j = 0; j < steps; ++j) {
        const testing::LaunchCounts before = counting.counts;
        m->decode_batch(batch.ptrs, testing::random_ids(B, V, 70 + static_cast<uint32_t>(j)));
        const testing::LaunchCounts& after = counting.counts;
        out.push_back({after.ops - before.ops, after.moves - before.moves, after.allocs - before.allocs});
      }
      return out;
    };
    const auto two = per_step(2), eight = per_step(8);
    for (const auto* c : {&two, &eight}) {
      int64_t launches = 0, allocs = 0;
      for (int64_t j = 1; j < steps; ++j) launches += (*c)[j].launches(), allocs += (*c)[j].allocs;
      std::printf("%s B=%d: %.1f launches, %.1f allocations a decode step (steps 1-%d)\n", run.c_str(),
                  c == &two ? 2 : 8, launches / double(steps - 1), allocs / double(steps - 1), int(steps - 1));
    }
    // Step 0 moves each sequence's open compressor groups into the pool: once a sequence, not a step.
    EXPECT_GT(eight[0].moves, two[0].moves);
    if (bounded) {
      // The ring (decoder) layers attend per sequence, and gather each kv source's entries per sequence once a step:
      // at most 3 launches a sequence a ring layer (6.3 before the rings were pooled).
      const int64_t ring_layers = m->config().num_layers - m->decoder_start();
      ASSERT_GT(m->decoder_start(), 0);
      for (int64_t j = 1; j < steps; ++j)
        EXPECT_LE(eight[j].launches() - two[j].launches(), 6 * 3 * ring_layers) << "step " << j;
      continue;
    }
    for (int64_t j = 1; j < steps; ++j) {
      SCOPED_TRACE("step " + std::to_string(j) + " (position " + std::to_string(prompt + j) + ")");
      EXPECT_EQ(eight[j].ops, two[j].ops);
      EXPECT_EQ(eight[j].moves, two[j].moves);
      EXPECT_EQ(eight[j].allocs, two[j].allocs);
    }
    // Steps differ where groups close (more work), so the steps did reach the closing path.
    EXPECT_NE(std::min_element(two.begin(), two.end(), [](auto& a, auto& b) { return a.launches() < b.launches(); })
                  ->launches(),
              std::max_element(two.begin(), two.end(), [](auto& a, auto& b) {
                return a.launches() < b.launches();
              })->launches());
  }
}

// Not a check: the launches and allocations a batched decode step enqueues on V4-Flash's layer schedule (43 layers:
// 2 SWA, 21 CSA, 20 HCA; the golden model's small dimensions, random weights) at batch 1 and 64, printed for PERF.md.
// ./build/bin/deepinfer_tests --gtest_also_run_disabled_tests --gtest_filter='*DISABLED_FlashScheduleLaunchCounts'
TEST(V4DecodeBatch, DISABLED_FlashScheduleLaunchCounts) {
  testing::TempDir tmp;
  nlohmann::json cfg = nlohmann::json::parse(testing::read_file_or_empty(golden_dir("deepseek_v4") + "/config.json"));
  std::vector<int> ratios = {0, 0};
  for (int i = 0; i < 20; ++i) ratios.insert(ratios.end(), {4, 128});
  ratios.push_back(4);
  std::vector<std::string> kinds, mlp;
  for (size_t l = 0; l < ratios.size(); ++l) {
    kinds.push_back(ratios[l] == 0   ? "sliding_attention"
                    : ratios[l] == 4 ? "compressed_sparse_attention"
                                     : "heavily_compressed_attention");
    mlp.push_back(l < 3 ? "hash_moe" : "moe");
  }
  cfg["layer_types"] = kinds;
  cfg["mlp_layer_types"] = mlp;
  cfg["num_hidden_layers"] = ratios.size();
  cfg["compress_rates"] = {{"compressed_sparse_attention", 4}, {"heavily_compressed_attention", 128}};
  const std::string dir = testing::write_random_checkpoint_of(tmp, cfg, 11);
  const std::unique_ptr<Backend> cpu = make_cpu_backend(0);
  testing::CountingBackend counting(*cpu);
  const std::unique_ptr<DeepseekV4Model> m = DeepseekV4Model::load(dir, counting);
  const int64_t prompt = 33, steps = 8, V = m->config().vocab_size;
  for (int64_t B : {1, 64}) {
    SameLengthBatch batch(*m, B, prompt, steps + 1, false, 0);
    m->decode_batch(batch.ptrs, testing::random_ids(B, V, 69));  // pools the open groups
    const testing::LaunchCounts before = counting.counts;
    for (int64_t j = 0; j < steps; ++j)
      m->decode_batch(batch.ptrs, testing::random_ids(B, V, 70 + static_cast<uint32_t>(j)));
    const testing::LaunchCounts& after = counting.counts;
    std::printf("V4-Flash schedule, B=%d, positions %d-%d: %.1f launches (%.1f ops), %.1f allocations a decode step\n",
                static_cast<int>(B), static_cast<int>(prompt + 1), static_cast<int>(prompt + steps),
                (after.launches() - before.launches()) / double(steps), (after.ops - before.ops) / double(steps),
                (after.allocs - before.allocs) / double(steps));
  }
}

// The model reads no buffer that an op did not write: on a backend whose TensorMemory::empty fills with 0xFF bytes
// (NaN, -1) instead of zeros, prefill and the batched decode (unpadded and padded to graph buckets) give the same
// logits, bit for bit, as on the zero-filling backend. (A device backend's empty() leaves whatever was there.)
TEST(V4DecodeBatch, ReadsNoBufferNoOpWrote) {
  for (const std::string family : {"deepseek_v4", "deepseek_v41"}) {
    SCOPED_TRACE(family);
    const DeepseekV4Model& zeroed = *golden_model(family).model;
    const std::unique_ptr<Backend> poison = make_cpu_backend(0, /*poison_empty=*/true);
    std::optional<std::vector<int64_t>> map;
    if (golden_model(family).golden->find("engram.token_map"))
      map = ids_of(*golden_model(family).golden, "engram.token_map");
    const std::unique_ptr<DeepseekV4Model> poisoned = DeepseekV4Model::load(golden_dir(family), *poison, map);
    const std::vector<Spec> specs = make_specs(zeroed, {1, 6, 17, 33, 70}, 5, {{{4, 3, 32}}});
    DecodeGraphs padding_zeroed(zeroed.backend(), 256, /*record=*/false);
    DecodeGraphs padding_poisoned(*poison, 256, /*record=*/false);
    for (int run = 0; run < (family == "deepseek_v41" ? 3 : 2); ++run) {
      const bool padded = run == 1, bounded = run == 2;  // V4.1: also bounded replay (the prefill's decoder split)
      SCOPED_TRACE(bounded ? "bounded replay" : padded ? "padded to batch buckets" : "unpadded");
      const auto want = paged_decode(zeroed, specs, bounded, true, kBlock, padded ? &padding_zeroed : nullptr);
      const auto got = paged_decode(*poisoned, specs, bounded, true, kBlock, padded ? &padding_poisoned : nullptr);
      for (size_t i = 0; i < specs.size(); ++i) {
        ASSERT_EQ(got[i].size(), want[i].size());
        for (size_t j = 0; j < got[i].size(); ++j)
          ASSERT_EQ(std::memcmp(&got[i][j], &want[i][j], sizeof(float)), 0)
              << "sequence " << i << " logit " << j << ": " << got[i][j] << " vs " << want[i][j];
      }
    }
  }
}

// Against the transformers goldens: the batched decode of the golden prompts reproduces decode_logits.
TEST(V4DecodeBatch, GoldenDecodeLogitsWithinTolerance) {
  for (const std::string family : {"deepseek_v4", "deepseek_v41"}) {
    Loaded& l = golden_model(family);
    std::vector<Spec> specs;
    for (int i = 0; l.golden->find("prompt" + std::to_string(i) + ".input_ids"); ++i) {
      const std::string p = "prompt" + std::to_string(i);
      Spec s{ids_of(*l.golden, p + ".input_ids"), ids_of(*l.golden, p + ".generated_ids")};
      s.gen.pop_back();  // the decode inputs are generated_ids[0 .. n-2]
      specs.push_back(std::move(s));
    }
    const auto rows = paged_decode(*l.model, specs, /*bounded=*/false, /*batched=*/true);
    const int64_t v = l.model->config().vocab_size;
    for (size_t i = 0; i < specs.size(); ++i) {
      const Tensor ref = l.golden->tensor("prompt" + std::to_string(i) + ".decode_logits");
      for (size_t j = 0; j < specs[i].gen.size(); ++j) {
        const float* a = rows[i].data() + j * v;
        const float* b = ref.data_as<float>() + (j + 1) * v;  // row 0 is the prefill's last row
        double diff = 0, scale = 0;
        for (int64_t k = 0; k < v; ++k) {
          diff = std::max(diff, std::fabs(static_cast<double>(a[k]) - b[k]));
          scale = std::max(scale, std::fabs(static_cast<double>(b[k])));
        }
        EXPECT_LE(diff / scale, 1e-4) << family << " prompt " << i << " step " << j;
      }
    }
  }
}

// --kv-cache-dtype bf16. V4.1 caches FP8 / FP4 fake-quantized rows, each a bf16 value: its bf16 caches give the f32
// caches' logits bit for bit (exact prefill and bounded replay, a generated ratio-2 checkpoint too: windows, entries
// and indexer keys). V4's rows are not quantized, so its bf16 caches round: the logits move, batched decode still
// equals one forward() per sequence, and the golden prompts stay near transformers' decode logits.
struct KvDtypeScope {
  DeepseekV4Model& m;
  explicit KvDtypeScope(DeepseekV4Model& model, DType dtype = DType::kBF16) : m(model) { m.set_kv_cache_dtype(dtype); }
  ~KvDtypeScope() { m.set_kv_cache_dtype(DType::kF32); }
};

// dtype kBF16, or kF8E4M3: --kv-cache-dtype fp8, the rows' quantized records (FP8 windows, FP4 entries and keys).
void expect_cache_lossless(DeepseekV4Model& m, const std::vector<Spec>& specs, bool bounded,
                           DType dtype = DType::kBF16) {
  const auto f32 = paged_decode(m, specs, bounded, /*batched=*/true);
  const int64_t f32_block = m.new_kv_pages(bounded).bytes_per_block(kBlock);
  KvDtypeScope scope(m, dtype);
  const int64_t block = m.new_kv_pages(bounded).bytes_per_block(kBlock);
  if (dtype == DType::kBF16)
    EXPECT_EQ(block * 2, f32_block) << "a bf16 block: half the bytes";
  else  // records of 32-value rows: 33 (window) / 18 (entry) / 17 (key) bytes against f32's 128
    EXPECT_LT(block * 3.5, f32_block) << "a record block: under 2/7 of the f32 bytes";
  for (bool batched : {true, false}) {
    const auto got = paged_decode(m, specs, bounded, batched);
    for (size_t i = 0; i < specs.size(); ++i) {
      ASSERT_EQ(got[i].size(), f32[i].size()) << "sequence " << i;
      EXPECT_EQ(std::memcmp(got[i].data(), f32[i].data(), got[i].size() * sizeof(float)), 0)
          << "sequence " << i << (batched ? " batched" : " per sequence") << (bounded ? ", bounded replay" : "");
    }
  }
}

TEST(V4DecodeBatch, V41Bf16CachesAreLossless) {
  DeepseekV4Model& m = *golden_model("deepseek_v41").model;
  for (bool bounded : {false, true})
    expect_cache_lossless(m, make_specs(m, kLengths, 6, {{{9, 8, 32}}, {{11, 10, 64}}}), bounded);
  DeepseekV4Model& r2 = *generated_v41(2).model;
  expect_cache_lossless(r2, make_specs(r2, {2, 5, 9, 16, 17, 40, 41}, 6, {{{6, 5, 32}}}), /*bounded=*/false);
}

// --kv-cache-dtype fp8: the records give the f32 caches' logits bit for bit too; V4 (rows unquantized) refuses them.
TEST(V4DecodeBatch, V41RecordCachesAreLossless) {
  DeepseekV4Model& m = *golden_model("deepseek_v41").model;
  for (bool bounded : {false, true})
    expect_cache_lossless(m, make_specs(m, kLengths, 6, {{{9, 8, 32}}, {{11, 10, 64}}}), bounded, DType::kF8E4M3);
  DeepseekV4Model& r2 = *generated_v41(2).model;
  expect_cache_lossless(r2, make_specs(r2, {2, 5, 9, 16, 17, 40, 41}, 6, {{{6, 5, 32}}}), /*bounded=*/false,
                        DType::kF8E4M3);
  DeepseekV4Model& v4 = *golden_model("deepseek_v4").model;
  EXPECT_THROW(v4.set_kv_cache_dtype(DType::kF8E4M3), Error);
  EXPECT_EQ(v4.kv_cache_dtype(), DType::kF32);
}

TEST(V4DecodeBatch, V4Bf16CachesRoundButStayConsistent) {
  Loaded& l = golden_model("deepseek_v4");
  DeepseekV4Model& m = *l.model;
  const std::vector<Spec> specs = make_specs(m, kLengths, 6, {{{9, 8, 32}}});
  const auto f32 = paged_decode(m, specs, false, /*batched=*/true);
  KvDtypeScope bf16(m);
  expect_batched_equals_single(m, specs, false);
  const auto got = paged_decode(m, specs, false, /*batched=*/true);
  bool moved = false;
  for (size_t i = 0; i < specs.size(); ++i)
    moved = moved || std::memcmp(got[i].data(), f32[i].data(), got[i].size() * sizeof(float)) != 0;
  EXPECT_TRUE(moved) << "V4's bf16 caches gave the f32 caches' logits: the rows were not rounded";
}

TEST(V4DecodeBatch, BadInputIsRejected) {
  const DeepseekV4Model& m = *golden_model("deepseek_v4").model;
  V4KvPages pages = m.new_kv_pages(false);
  std::vector<BlockId> table{0, 1};
  V4SequenceState a = m.new_sequence(), b = m.new_sequence(), unpaged = m.new_sequence();
  for (V4SequenceState* s : {&a, &b}) {
    s->pages = &pages;
    s->ref = PageRef{table, kBlock, 0};
  }
  const std::vector<int64_t> one{5}, two{5, 6};
  auto run = [&](std::vector<V4SequenceState*> seqs, const std::vector<int64_t>& ids) {
    m.decode_batch(std::span<V4SequenceState* const>(seqs), ids);
  };
  auto expect_error = [&](const std::function<void()>& f, const std::string& what) {
    try {
      f();
      ADD_FAILURE() << "no error, expected: " << what;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  expect_error([&] { run({&a, &b}, one); }, "1 token ids for 2 sequences");
  expect_error([&] { run({}, {}); }, "no sequences");
  expect_error([&] { run({&a, &a}, two); }, "appears twice");
  expect_error([&] { run({&a, &unpaged}, two); }, "cannot be batched");
  expect_error([&] { run({&a}, {m.config().vocab_size}); }, "outside the vocabulary");
  b.record_undo = true;
  expect_error([&] { run({&a, &b}, two); }, "cannot be batched");
  EXPECT_FALSE(m.decode_batchable(b));
  EXPECT_FALSE(m.decode_batchable(unpaged));
  EXPECT_TRUE(m.decode_batchable(a));
}

}  // namespace
}  // namespace deepinfer
