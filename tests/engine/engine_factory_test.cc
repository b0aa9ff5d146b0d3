// load_engine_stack (engine/engine_factory.h), the one setup path of the CLI, the Python binding and the server, on
// the golden-fixture models:
//   - the cache is sized from the runner's real footprint: a budget of k blocks gives k blocks; one sequence
//     filling k blocks makes the runner allocate exactly k * bytes_per_block; the caches never hold more than the
//     budget at any step, and a slot never holds more than bytes_per_slot;
//   - admission stops at that limit: a workload larger than the cache finishes through preemption with the same
//     tokens as a roomy cache (instead of growing past the budget);
//   - errors name the option in the front end's spelling;
//   - the scheduling policy reaches the engine (priority: lower values first).
#include "deepinfer/engine/engine_factory.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "deepinfer/core/error.h"
#include "deepinfer/io/safetensors.h"
#include "deepinfer/model/deepseek_v3.h"
#include "deepinfer/model/deepseek_v4.h"
#include "deepinfer/ops/kernel_choice_args.h"
#include "test_util.h"

namespace deepinfer {
namespace {

std::string golden_dir(const std::string& family) { return testing::test_data_dir() + "/golden/" + family; }

EngineStackOptions options_for(const std::string& family) {
  EngineStackOptions o;
  o.model_dir = golden_dir(family);
  o.threads = 1;
  o.max_num_seqs = 3;
  o.max_model_len = 256;
  o.max_num_batched_tokens = 64;
  o.async_scheduling = false;  // the test reads the runner's allocations between steps
  auto golden = SafetensorsFile::open(o.model_dir + "/golden.safetensors");
  if (golden->find("engram.token_map")) o.engram_token_map_file = o.model_dir + "/golden.safetensors";
  return o;
}

std::vector<TokenId> prompt_of(const std::string& family, int offset, int len) {
  auto golden = SafetensorsFile::open(golden_dir(family) + "/golden.safetensors");
  Tensor t = golden->tensor("prompt2.input_ids");
  std::vector<TokenId> ids;
  for (int i = 0; i < len; ++i) ids.push_back(static_cast<TokenId>(t.data_as<int64_t>()[(offset + i) % t.numel()]));
  return ids;
}

struct Param {
  std::string family;
  bool exact_prefill = true;
  std::string name() const { return family + (exact_prefill ? "" : "_bounded"); }
};

class EngineFactory : public ::testing::TestWithParam<Param> {
 protected:
  EngineStackOptions options() const {
    EngineStackOptions o = options_for(GetParam().family);
    o.exact_prefill = GetParam().exact_prefill;
    return o;
  }

  // Six requests of 120 prompt tokens + 12 generated, all at once; greedy. Checks the allocations against the
  // budget and the footprint after every step. Returns the outputs by request id.
  std::map<std::string, std::vector<TokenId>> run(EngineStack& stack, int64_t budget, EngineStats* stats) {
    auto engine = stack.make_engine();
    for (int i = 0; i < 6; ++i) {
      Request r;
      r.request_id = "r" + std::to_string(i);
      r.prompt_token_ids = prompt_of(GetParam().family, 7 * i, 120);
      r.params.max_tokens = 12;
      r.params.temperature = 0;
      r.params.ignore_eos = true;
      engine->add_request(std::move(r));
    }
    const KvFootprint f = *stack.layout.storage;
    int64_t peak = 0;
    while (engine->has_unfinished()) {
      engine->step();
      const KvAllocation a = stack.runner->kv_allocation();
      peak = std::max(peak, a.total());
      EXPECT_LE(a.total(), budget) << "the caches outgrew the budget";
      EXPECT_LE(a.page_bytes, static_cast<int64_t>(stack.sizing.num_blocks) * f.bytes_per_block);
      EXPECT_LE(a.max_slot_bytes, f.bytes_per_slot) << "a slot holds more than the footprint says";
    }
    std::map<std::string, std::vector<TokenId>> out;
    for (auto& c : engine->take_finished()) {
      EXPECT_EQ(c.output_token_ids.size(), 12u) << c.request_id;
      out[c.request_id] = c.output_token_ids;
    }
    *stats = engine->stats();
    EXPECT_GT(peak, 0);
    return out;
  }
};

TEST_P(EngineFactory, CacheSizedFromTheRunnersRealFootprintAdmitsExactlyWhatFits) {
  // Read the footprint, then give the cache room for the slots and one block more than one max_model_len sequence
  // needs, plus a fraction of a block that must not buy another one.
  EngineStackOptions o = options();
  auto probe = load_engine_stack(o);
  ASSERT_TRUE(probe->layout.storage.has_value());
  const KvFootprint f = *probe->layout.storage;
  const int bs = probe->layout.block_size;
  ASSERT_GT(f.bytes_per_block, 0);
  // The runner stores f32 rows: more than the design formats (bf16/fp8 latents, one window ring per sequence).
  EXPECT_GT(f.bytes_per_block, probe->layout.bytes_per_token() * bs);
  const int64_t blocks_per_seq = (o.max_model_len + bs - 1) / bs;
  const int32_t want_blocks = static_cast<int32_t>(blocks_per_seq + 1);  // fewer than the 6 requests need
  o.host_kv_budget_bytes = o.max_num_seqs * f.bytes_per_slot + want_blocks * f.bytes_per_block + f.bytes_per_block / 2;
  auto tight = load_engine_stack(o);
  EXPECT_EQ(tight->sizing.num_blocks, want_blocks);
  EXPECT_EQ(tight->engine_config.kv.num_blocks, want_blocks);
  EngineStats tight_stats;
  const auto got = run(*tight, o.host_kv_budget_bytes, &tight_stats);
  EXPECT_GT(tight_stats.preemptions, 0) << "the workload fit: the test did not reach the cache limit";

  EngineStackOptions roomy_o = options();
  roomy_o.host_kv_budget_bytes = 64 * 1000 * 1000;
  auto roomy = load_engine_stack(roomy_o);
  EngineStats roomy_stats;
  const auto want = run(*roomy, roomy_o.host_kv_budget_bytes, &roomy_stats);
  EXPECT_EQ(roomy_stats.preemptions, 0);
  EXPECT_EQ(got, want) << "preemption at the cache limit changed outputs";
}

TEST_P(EngineFactory, ReportedBytesPerBlockAreTheBytesAllocatedPerBlock) {
  // One sequence whose prompt fills every block of the pool exactly: every paged kind of every layer writes rows
  // into every block (block_size is a multiple of every compression ratio), so each pool grows to the whole pool.
  EngineStackOptions o = options();
  auto probe = load_engine_stack(o);
  const KvFootprint f = *probe->layout.storage;
  const int bs = probe->layout.block_size;
  o.max_model_len = 2 * bs;
  o.max_num_batched_tokens = 2 * bs;
  o.host_kv_budget_bytes = o.max_num_seqs * f.bytes_per_slot + 2 * f.bytes_per_block;
  auto stack = load_engine_stack(o);
  ASSERT_EQ(stack->sizing.num_blocks, 2);
  auto engine = stack->make_engine();
  Request r;
  r.request_id = "fill";
  r.prompt_token_ids = prompt_of(GetParam().family, 0, 2 * bs);
  r.params.temperature = 0;
  engine->add_request(std::move(r));
  engine->run_to_completion();
  ASSERT_EQ(engine->take_finished().size(), 1u);
  EXPECT_EQ(stack->runner->kv_allocation().page_bytes, 2 * f.bytes_per_block)
      << "the runner allocates a different number of bytes per block than it reports";
}

TEST_P(EngineFactory, ABudgetBelowOneSequenceIsRefusedWithTheNumbers) {
  EngineStackOptions o = options();
  auto probe = load_engine_stack(o);
  const KvFootprint f = *probe->layout.storage;
  // One byte short of the slots plus one block: less than one max_model_len sequence.
  o.host_kv_budget_bytes = o.max_num_seqs * f.bytes_per_slot + f.bytes_per_block - 1;
  try {
    load_engine_stack(o);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kResourceExhausted);
    EXPECT_NE(e.message().find("max_model_len"), std::string::npos) << e.message();
  }
}

INSTANTIATE_TEST_SUITE_P(Golden, EngineFactory,
                         ::testing::Values(Param{"deepseek_v3"}, Param{"deepseek_v4"}, Param{"deepseek_v41"},
                                           Param{"deepseek_v41", false}),
                         [](const auto& info) { return info.param.name(); });

template <typename F>
void expect_error(F&& f, ErrorCode code, const std::string& text) {
  try {
    f();
    ADD_FAILURE() << "no error; expected: " << text;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.message();
    EXPECT_NE(e.message().find(text), std::string::npos) << e.message();
  }
}

TEST(EngineFactoryErrors, NameTheOptionInTheFrontEndsSpelling) {
  EngineStackOptions o = options_for("deepseek_v3");
  testing::TempDir empty;
  EngineStackOptions missing = o;
  missing.model_dir = empty.path();
  expect_error([&] { load_engine_stack(missing); }, ErrorCode::kNotFound, "has no config.json");
  EngineStackOptions bad = o;
  bad.device = "tpu";
  expect_error([&] { load_engine_stack(bad); }, ErrorCode::kInvalidArgument, "--device must be cpu or cuda, got 'tpu'");
  bad.spelling = OptionSpelling::kKeyword;
  expect_error([&] { load_engine_stack(bad); }, ErrorCode::kInvalidArgument,
               "device must be 'cpu' or 'cuda', got 'tpu'");
  EngineStackOptions util = o;
  util.gpu_memory_utilization = 1.5;
  expect_error([&] { load_engine_stack(util); }, ErrorCode::kInvalidArgument,
               "gpu_memory_utilization must be in (0, 1]");
  EngineStackOptions seqs = o;
  seqs.max_num_seqs = 0;
  expect_error([&] { load_engine_stack(seqs); }, ErrorCode::kInvalidArgument, "max_num_seqs must be positive");
#ifndef DEEPINFER_WITH_CUDA
  EngineStackOptions cuda = o;
  cuda.device = "cuda";
  expect_error([&] { load_engine_stack(cuda); }, ErrorCode::kUnsupported,
               "--device cuda: this deepinfer was built without CUDA");
  cuda.spelling = OptionSpelling::kKeyword;
  expect_error([&] { load_engine_stack(cuda); }, ErrorCode::kUnsupported,
               "device='cuda': this deepinfer was built without CUDA");
#endif
}

// Greedy outputs (10 tokens each) of four requests of `family`'s prompts run through a stack's engine to the end.
std::map<std::string, std::vector<TokenId>> greedy_outputs(EngineStack& stack, const std::string& family) {
  auto engine = stack.make_engine();
  for (int i = 0; i < 4; ++i) {
    Request r;
    r.request_id = "r" + std::to_string(i);
    r.prompt_token_ids = prompt_of(family, 5 * i, 40 + 20 * i);
    r.params.max_tokens = 10;
    r.params.temperature = 0;
    r.params.ignore_eos = true;
    engine->add_request(std::move(r));
  }
  engine->run_to_completion();
  std::map<std::string, std::vector<TokenId>> out;
  for (auto& c : engine->take_finished()) {
    EXPECT_EQ(c.output_token_ids.size(), 10u) << c.request_id;
    out[c.request_id] = c.output_token_ids;
  }
  EXPECT_EQ(out.size(), 4u);
  return out;
}

// --kv-cache-dtype bf16 (the V3 family): half the bytes a block, so the same budget holds twice the blocks (less the
// rounding of the slots' share); the engine runs a workload through it to the end with the greedy outputs of the
// f32 cache on most requests (the rows are rounded, so a near-tie may flip); unknown values are refused in the front
// end's spelling.
TEST(EngineFactoryKvCacheDtype, Bf16HalvesTheBytesPerBlockAndIsNamedWhereRefused) {
  EngineStackOptions o = options_for("deepseek_v3");
  o.host_kv_budget_bytes = 4 * 1000 * 1000;
  auto f32 = load_engine_stack(o);
  o.kv_cache_dtype = "bf16";
  auto bf16 = load_engine_stack(o);
  const KvFootprint ff = *f32->layout.storage, fb = *bf16->layout.storage;
  EXPECT_EQ(fb.bytes_per_block * 2, ff.bytes_per_block);
  EXPECT_GE(bf16->sizing.num_blocks, 2 * f32->sizing.num_blocks - 1);
  EXPECT_EQ(bf16->v3->kv_cache_dtype(), DType::kBF16);
  EXPECT_EQ(f32->v3->kv_cache_dtype(), DType::kF32);
  auto outs_f32 = greedy_outputs(*f32, "deepseek_v3"), outs_bf16 = greedy_outputs(*bf16, "deepseek_v3");
  int same = 0;
  for (const auto& [id, tokens] : outs_f32) same += outs_bf16[id] == tokens;
  EXPECT_GE(same, 3) << "a bf16 cache changed most greedy continuations";

  EngineStackOptions bad = options_for("deepseek_v3");
  bad.kv_cache_dtype = "int8";
  expect_error([&] { load_engine_stack(bad); }, ErrorCode::kInvalidArgument,
               "--kv-cache-dtype int8: must be auto, f32, bf16 or fp8");
  bad.spelling = OptionSpelling::kKeyword;
  expect_error([&] { load_engine_stack(bad); }, ErrorCode::kInvalidArgument,
               "kv_cache_dtype='int8': must be auto, f32, bf16 or fp8");
}

// V4.1 caches FP8 / FP4 fake-quantized rows, each a bf16 value: its bf16 caches take half the bytes a block and the
// engine's greedy outputs are the f32 caches' exactly (window rows, compressed entries and indexer keys all bf16), on
// one rank, over EP 2 x DP 2 in-process ranks and with CP 2.
TEST(EngineFactoryKvCacheDtype, V41Bf16CachesHalveTheBlockAndKeepTheOutputs) {
  EngineStackOptions o = options_for("deepseek_v41");
  o.host_kv_budget_bytes = 4 * 1000 * 1000;
  o.kv_cache_dtype = "f32";
  auto f32 = load_engine_stack(o);
  o.kv_cache_dtype = "bf16";
  auto bf16 = load_engine_stack(o);
  EXPECT_EQ(bf16->layout.storage->bytes_per_block * 2, f32->layout.storage->bytes_per_block);
  EXPECT_EQ(bf16->v4->kv_cache_dtype(), DType::kBF16);
  EXPECT_EQ(f32->v4->kv_cache_dtype(), DType::kF32);
  const auto want = greedy_outputs(*f32, "deepseek_v41");
  EXPECT_EQ(greedy_outputs(*bf16, "deepseek_v41"), want);
  // Every EP / DP rank's model keeps its pages in bf16, and so do context-parallel ranks: the same outputs.
  o.ep = 2;
  o.dp = 2;
  auto ranks = load_engine_stack(o);
  EXPECT_EQ(greedy_outputs(*ranks, "deepseek_v41"), want);
  o.ep = o.dp = 1;
  o.cp = 2;
  auto cp = load_engine_stack(o);
  EXPECT_EQ(greedy_outputs(*cp, "deepseek_v41"), want);
}

// --kv-cache-dtype fp8 (V4.1): the rows' FP8 / FP4 records, lossless — the f32 caches' greedy outputs on one rank,
// over EP 2 x DP 2 in-process ranks and with CP 2 — in well under half a bf16 block; refused by name for families
// whose rows are not quantized and off the CPU.
TEST(EngineFactoryKvCacheDtype, V41Fp8RecordsKeepTheOutputsInAQuarterOfTheBytes) {
  EngineStackOptions o = options_for("deepseek_v41");
  o.host_kv_budget_bytes = 4 * 1000 * 1000;
  o.kv_cache_dtype = "f32";
  auto f32 = load_engine_stack(o);
  o.kv_cache_dtype = "bf16";
  const int64_t bf16_block = load_engine_stack(o)->layout.storage->bytes_per_block;
  o.kv_cache_dtype = "fp8";
  auto fp8 = load_engine_stack(o);
  EXPECT_EQ(fp8->v4->kv_cache_dtype(), DType::kF8E4M3);
  EXPECT_LT(fp8->layout.storage->bytes_per_block * 1.8, bf16_block);
  EXPECT_GE(fp8->sizing.num_blocks, f32->sizing.num_blocks * 3);
  const auto want = greedy_outputs(*f32, "deepseek_v41");
  EXPECT_EQ(greedy_outputs(*fp8, "deepseek_v41"), want);
  o.ep = 2;
  o.dp = 2;
  EXPECT_EQ(greedy_outputs(*load_engine_stack(o), "deepseek_v41"), want);
  o.ep = o.dp = 1;
  o.cp = 2;
  EXPECT_EQ(greedy_outputs(*load_engine_stack(o), "deepseek_v41"), want);
  o.cp = 1;

  const ModelConfig v41 = load_model_config(o.model_dir + "/config.json");
  o.device = "cuda";  // the CUDA kernels read records too (cuda_kv_record_test.cc)
  EXPECT_EQ(kv_cache_dtype_of(o, v41), DType::kF8E4M3);
  for (const char* model : {"deepseek_v3", "deepseek_v4"}) {
    EngineStackOptions other = options_for(model);
    other.kv_cache_dtype = "fp8";
    expect_error(
        [&] { load_engine_stack(other); }, ErrorCode::kUnsupported,
        std::string("--kv-cache-dtype fp8: fp8 keeps the FP8 / FP4 records of the rows V4.1 fake-quantizes; ") + model +
            " caches unquantized rows");
  }
}

// auto is bf16 only where that rounds nothing: V4.1 (its cached rows are FP8 / FP4 values: cached_rows_quantized), on
// either device; the V3 family and V4 keep the rows as computed (f32), the golden fixtures' numerics.
TEST(EngineFactoryKvCacheDtype, AutoIsBf16ForV41Only) {
  for (const char* model : {"deepseek_v3", "deepseek_v4", "deepseek_v41"}) {
    EngineStackOptions o = options_for(model);
    const ModelConfig config = load_model_config(o.model_dir + "/config.json");
    ASSERT_EQ(o.kv_cache_dtype, "auto");
    const DType want = config.family == ModelFamily::kDeepseekV41 ? DType::kBF16 : DType::kF32;
    EXPECT_EQ(kv_cache_dtype_of(o, config), want) << model;
    auto stack = load_engine_stack(o);
    EXPECT_EQ(stack->v3 ? stack->v3->kv_cache_dtype() : stack->v4->kv_cache_dtype(), want) << model;
    o.device = "cuda";
    EXPECT_EQ(kv_cache_dtype_of(o, config), want) << model;
    o.device = "cpu";
    o.kv_cache_dtype = "f32";
    EXPECT_EQ(kv_cache_dtype_of(o, config), DType::kF32) << model;
    o.kv_cache_dtype = "bf16";
    EXPECT_EQ(kv_cache_dtype_of(o, config), DType::kBF16) << model;
  }
  // A V4.1 config whose widths are not whole quantization blocks caches its rows unquantized (as the reference
  // leaves them): bf16 would round them, so auto keeps f32.
  EngineStackOptions o = options_for("deepseek_v41");
  ModelConfig odd = load_model_config(o.model_dir + "/config.json");
  ASSERT_TRUE(cached_rows_quantized(odd));
  odd.attn.head_dim = 48;
  EXPECT_FALSE(cached_rows_quantized(odd));
  EXPECT_EQ(kv_cache_dtype_of(o, odd), DType::kF32);
  odd.attn.head_dim = 64;
  odd.attn.index_head_dim = 16;
  EXPECT_FALSE(cached_rows_quantized(odd));
}

// --weight-format: auto keeps a checkpoint's block-format weights quantized on CUDA in every layout (one rank, EP/DP
// ranks holding their experts quantized, CP ranks), f32 on the CPU; fp8 keeps them on any backend and layout;
// anything else is named.
TEST(EngineFactoryWeights, WeightFormatResolvesPerDeviceAndLayout) {
  EngineStackOptions o = options_for("deepseek_v3");
  EXPECT_FALSE(keep_quantized_weights(o));  // auto on the CPU
  o.device = "cuda";
  EXPECT_TRUE(keep_quantized_weights(o));
  o.ep = 2;
  EXPECT_TRUE(keep_quantized_weights(o));  // EP ranks keep their experts quantized
  o.ep = 1;
  o.cp = 2;
  EXPECT_TRUE(keep_quantized_weights(o));  // CP followers load the driver's format
  o.cp = 1;
  o.weight_format = "f32";
  EXPECT_FALSE(keep_quantized_weights(o));
  o.ep = 2;
  EXPECT_FALSE(keep_quantized_weights(o));
  o.ep = 1;
  o.device = "cpu";
  o.weight_format = "fp8";
  EXPECT_TRUE(keep_quantized_weights(o));
  o.dp = 2;
  o.ep = 2;
  EXPECT_TRUE(keep_quantized_weights(o));
  o.cp = 2;
  EXPECT_TRUE(keep_quantized_weights(o));
  o.weight_format = "auto";
  EXPECT_FALSE(keep_quantized_weights(o));  // auto on the CPU, whatever the layout
  o.ep = 1;
  o.dp = 1;
  o.cp = 1;
  o.weight_format = "int4";
  expect_error([&] { load_engine_stack(o); }, ErrorCode::kInvalidArgument,
               "--weight-format int4: must be auto, f32 or fp8");
  o.spelling = OptionSpelling::kKeyword;
  expect_error([&] { load_engine_stack(o); }, ErrorCode::kInvalidArgument,
               "weight_format='int4': must be auto, f32 or fp8");
  // The golden checkpoints are bf16: fp8 keeps nothing quantized and the models load (V4/V4.1 too).
  for (const char* m : {"deepseek_v3", "deepseek_v41"}) {
    EngineStackOptions bf16 = options_for(m);
    bf16.weight_format = "fp8";
    EXPECT_NE(load_engine_stack(bf16), nullptr) << m;
  }
}

// kernel_choices: the CUDA backend's KEY=VALUE specs, parsed once for every rank (later specs of a key win); a spec
// that does not parse is named before anything loads, and any spec on the CPU device is refused (its kernels have no
// choices), in the front end's spelling.
TEST(EngineFactoryKernelChoices, ParseForCudaAndAreRefusedOnTheCpu) {
  EngineStackOptions o = options_for("deepseek_v3");
  EXPECT_EQ(describe_kernel_choices(kernel_choices_of(o)), "");  // none: the defaults
  o.device = "cuda";
  o.kernel_choices = {"f32_scale_mma=0", "mla_bf16x3=0", "mla_tf32=1", "mla_tf32=0"};  // the first two on by default
  const cuda::KernelChoices c = kernel_choices_of(o);
  EXPECT_FALSE(c.gemm.f32_scale_mma);
  EXPECT_FALSE(c.mla_bf16x3);
  EXPECT_FALSE(c.mla_tf32);
  o.kernel_choices = {"f32_scale_mma=2"};
  expect_error([&] { kernel_choices_of(o); }, ErrorCode::kInvalidArgument, "f32_scale_mma=2");
  o.kernel_choices = {"no_such_kernel=1"};
  expect_error([&] { load_engine_stack(o); }, ErrorCode::kInvalidArgument, "unknown key 'no_such_kernel'");
  o.device = "cpu";
  o.kernel_choices = {"mla_tf32=1"};
  expect_error([&] { load_engine_stack(o); }, ErrorCode::kInvalidArgument,
               "--kernel-choice mla_tf32=1: kernel choices are the CUDA backend's");
  o.spelling = OptionSpelling::kKeyword;
  expect_error([&] { load_engine_stack(o); }, ErrorCode::kInvalidArgument, "kernel_choice='mla_tf32=1'");
}

// The device footprint the CUDA cache budget takes off: every file, less the main layers' routed experts an EP rank
// does not load; MTP layers' experts stay whole (the embedded tiny V3 has one MTP layer, index 4, with experts).
TEST(EngineFactoryWeights, DeviceWeightBytesCountARanksExpertShare) {
  for (const std::string dir : {testing::test_data_dir() + "/golden/deepseek_v4",
                                std::string(DEEPINFER_SOURCE_DIR "/models/deepinfer-tiny-v3")}) {
    SCOPED_TRACE(dir);
    int64_t total = 0, routed = 0;
    // V4 (golden names "model.layers.N.ffn.experts."): every layer is a main one; tiny V3: layers 0-3 (4 is MTP).
    auto main_expert = [](const std::string& n) {
      if (n.find(".ffn.experts.") != std::string::npos) return true;
      return n.find(".mlp.experts.") != std::string::npos && n.rfind("model.layers.4.", 0) != 0;
    };
    for (const auto& e : std::filesystem::directory_iterator(dir)) {
      if (e.path().extension() != ".safetensors" || e.path().filename() == "golden.safetensors") continue;
      total += static_cast<int64_t>(e.file_size());
      auto f = SafetensorsFile::open(e.path().string());  // outlives the loop over its entries
      for (const SafetensorsEntry& t : f->entries())
        if (main_expert(t.name)) routed += static_cast<int64_t>(t.end - t.begin);
    }
    ASSERT_GT(routed, 0);
    EngineStackOptions o;
    o.model_dir = dir;
    const int E = dir.find("tiny") != std::string::npos ? 4 : 8;
    const int64_t golden_file = std::filesystem::exists(dir + "/golden.safetensors")
                                    ? static_cast<int64_t>(std::filesystem::file_size(dir + "/golden.safetensors"))
                                    : 0;
    EXPECT_EQ(device_weight_bytes(o), total + golden_file);  // one rank: every file
    o.ep = 2;
    EXPECT_EQ(device_weight_bytes(o), total + golden_file - routed + routed * (E / 2) / E);
    o.ep = 4;
    o.eplb_interval = 1;  // EPLB: ceil(E / 4) + 1 slots per rank
    EXPECT_EQ(device_weight_bytes(o), total + golden_file - routed + routed * (E / 4 + 1) / E);
    o.eplb_slots = 3;
    EXPECT_EQ(device_weight_bytes(o), total + golden_file - routed + routed * 3 / E);
  }
}

// With max_num_seqs 1 the policy alone decides the order requests run in.
std::vector<std::string> finishing_order(SchedulingPolicyKind policy) {
  EngineStackOptions o = options_for("deepseek_v41");
  o.max_num_seqs = 1;
  o.scheduling_policy = policy;
  auto stack = load_engine_stack(o);
  auto engine = stack->make_engine();
  const int priorities[] = {3, 0, 2, 0};
  for (int i = 0; i < 4; ++i) {
    Request r;
    r.request_id = "p" + std::to_string(i);
    r.prompt_token_ids = prompt_of("deepseek_v41", i, 10);
    r.params.max_tokens = 2;
    r.params.ignore_eos = true;
    r.priority = priorities[i];
    engine->add_request(std::move(r));
  }
  std::vector<std::string> order;
  while (engine->has_unfinished()) {
    engine->step();
    for (auto& c : engine->take_finished()) order.push_back(c.request_id);
  }
  return order;
}

TEST(EngineFactoryPolicy, PriorityRunsLowerValuesFirstFcfsRunsInArrivalOrder) {
  EXPECT_EQ(finishing_order(SchedulingPolicyKind::kPriority), (std::vector<std::string>{"p1", "p3", "p2", "p0"}));
  EXPECT_EQ(finishing_order(SchedulingPolicyKind::kFcfs), (std::vector<std::string>{"p0", "p1", "p2", "p3"}));
}

}  // namespace
}  // namespace deepinfer
