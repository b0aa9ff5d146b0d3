// `deepinfer offline` end to end: requests through the engine (continuous batching, chunked prefill, state
// slots) on the V4.1 / V4 golden models must reproduce transformers' greedy continuations exactly.
#include <gtest/gtest.h>

#include <map>
#include <regex>
#include <sstream>

#include <nlohmann/json.hpp>
#include "deepinfer/io/safetensors.h"

#include "model/dspark_fixture.h"
#include "test_util.h"
#include "v4_quant_config.h"

namespace deepinfer {
namespace {

using testing::ids_csv;
using testing::run_cli;

void check_family(const std::string& family, const std::string& engine_flags) {
  const std::string dir = testing::test_data_dir() + "/golden/" + family;
  auto golden = SafetensorsFile::open(dir + "/golden.safetensors");
  std::string args = "offline --model " + dir + " --max-tokens 16 --ignore-eos " + engine_flags;
  for (int p = 0; p < 3; ++p)
    args += " --prompt-ids " + ids_csv(golden->tensor("prompt" + std::to_string(p) + ".input_ids"));
  auto r = run_cli(args);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto got = testing::parse_offline_samples(r.output);
  ASSERT_EQ(got.size(), 3u) << r.output;
  for (int p = 0; p < 3; ++p)
    EXPECT_EQ(got[p], ids_csv(golden->tensor("prompt" + std::to_string(p) + ".generated_ids")))
        << family << " prompt " << p << " with " << engine_flags;
  EXPECT_NE(r.output.find("finite=yes"), std::string::npos);
  EXPECT_EQ(r.output.find("finite=NO"), std::string::npos);
}

TEST(OfflineCli, V41GreedyThroughTheEngineEqualsTransformers) {
  // transformers runs every layer on every token: --exact-prefill (the default is bounded replay, below).
  check_family("deepseek_v41", "--exact-prefill --max-num-seqs 4");
  check_family("deepseek_v41", "--exact-prefill --max-num-seqs 4 --no-async-scheduling");
  // Tiny token budget: prompts are prefilled in chunks of 7 interleaved with decodes; one state slot at a time.
  check_family("deepseek_v41", "--exact-prefill --max-num-seqs 1 --max-num-batched-tokens 7");
}

// The default for V4.1 is decoder SWA bounded replay: the decoder layers (3-5 of 6) run on the last 16 (window)
// prompt tokens only. Its outputs do not depend on batching or chunking, and the saved work is reported:
// (max(0, 5-16) + (70-16) + (290-16)) tokens x 3 decoder layers = 984 of the (5 + 70 + 290) x 6 = 2190 prompt
// layer-tokens.
TEST(OfflineCli, V41BoundedReplayIsTheDefaultAndReportsTheSkippedWork) {
  const std::string dir = testing::test_data_dir() + "/golden/deepseek_v41";
  auto golden = SafetensorsFile::open(dir + "/golden.safetensors");
  std::string args = "offline --model " + dir + " --max-tokens 8 --ignore-eos";
  for (int p = 0; p < 3; ++p)
    args += " --prompt-ids " + ids_csv(golden->tensor("prompt" + std::to_string(p) + ".input_ids"));
  auto a = run_cli(args + " --max-num-seqs 4");
  auto b = run_cli(args + " --max-num-seqs 1 --max-num-batched-tokens 7");
  ASSERT_EQ(a.exit_code, 0) << a.output;
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_EQ(testing::parse_offline_samples(a.output), testing::parse_offline_samples(b.output));
  EXPECT_EQ(testing::parse_offline_samples(a.output).size(), 3u);
  EXPECT_EQ(a.output.find("finite=NO"), std::string::npos) << a.output;
  for (const auto* r : {&a, &b})
    EXPECT_NE(r->output.find("1206 layer-tokens run, 984 skipped by bounded replay"), std::string::npos) << r->output;
  auto exact = run_cli(args + " --exact-prefill");
  ASSERT_EQ(exact.exit_code, 0) << exact.output;
  EXPECT_NE(exact.output.find("2190 layer-tokens run, 0 skipped by bounded replay"), std::string::npos) << exact.output;
}

TEST(OfflineCli, V4GreedyThroughTheEngineEqualsTransformers) {
  check_family("deepseek_v4", "--max-num-seqs 2 --max-num-batched-tokens 33");
}

TEST(OfflineCli, BadRequestsGetClearErrors) {
  const std::string dir = testing::test_data_dir() + "/golden/deepseek_v4";
  auto r = run_cli("offline --model " + dir + " --prompt-ids 1,2,99999");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("outside the vocabulary"), std::string::npos) << r.output;
  r = run_cli("offline --model " + dir + " --prompt-ids 1,x");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("not an integer"), std::string::npos) << r.output;
  // A prompt longer than max_model_len is rejected, not truncated.
  std::string longp = "1";
  for (int i = 0; i < 40; ++i) longp += ",1";
  r = run_cli("offline --model " + dir + " --max-model-len 32 --prompt-ids " + longp);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("max_model_len"), std::string::npos) << r.output;
}

TEST(OfflineCli, ReferenceFlagsPrintPerSampleDiagnosticsAndProgress) {
  const std::string dir = testing::test_data_dir() + "/golden/deepseek_v41";
  const std::string base = "offline --model_name " + dir +
                           " --max_model_len 512 --gpu_memory_utilization 0.85 --ep 1 --dp 1 --cp 1 --temperature 0.8 "
                           "--seed 3 --max-tokens 10 --ignore-eos --prompt 'hello world' --prompt 'a b c d'";
  auto r = run_cli(base + " --max_num_seqs 2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* s : {"tokens fit", "max concurrency", "model resolved from --model", "text: \"",
                        "acceptance_rate=n/a", "decode_ppl=", "finite=yes", "tokens=10 stop=max_tokens",
                        "progress: 2/2 requests done", "prompt_tokens=2", "prompt_tokens=4"})
    EXPECT_NE(r.output.find(s), std::string::npos) << s << "\n" << r.output;
  EXPECT_TRUE(std::regex_search(r.output, std::regex(R"(prompt [0-9.]+ tok/s, generation [0-9.]+ tok/s)"))) << r.output;
  // --seed gives per-request seeds: the same samples with one sequence at a time.
  auto one = run_cli(base + " --max_num_seqs 1");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  EXPECT_EQ(testing::parse_offline_samples(one.output), testing::parse_offline_samples(r.output));
  EXPECT_EQ(testing::parse_offline_samples(r.output).size(), 2u);
}

// The summary's "decode rate:" line (bench/decode_rate.h) parsed: avg_SPS, steps, seconds, mean batch, delivered
// tokens/s, what the acceptance was, the full-acceptance figure and its draft length.
struct DecodeRateLine {
  double sps = 0, seconds = 0, batch = 0, delivered = 0, full = 0;
  int64_t steps = 0;
  std::string delivered_text, full_text, acceptance;
  int draft_length = -1;
};
DecodeRateLine parse_decode_rate(const std::string& out) {
  static const std::regex re(
      R"(decode rate: avg_SPS ([0-9.]+) steps/s \(([0-9]+) steps in ([0-9.]+) s, mean batch ([0-9.]+)\); )"
      R"(delivered ([0-9.]+) tokens/s \(([^)]*)\); full-acceptance assumption ([0-9.]+) tokens/s )"
      R"(\(avg_SPS x batch x \(1 \+ ([0-9]+)\)\))");
  std::smatch m;
  DecodeRateLine d;
  if (!std::regex_search(out, m, re)) return d;
  d.sps = std::stod(m[1]);
  d.steps = std::stoll(m[2]);
  d.seconds = std::stod(m[3]);
  d.batch = std::stod(m[4]);
  d.delivered_text = m[5];
  d.delivered = std::stod(m[5]);
  d.acceptance = m[6];
  d.full_text = m[7];
  d.full = std::stod(m[7]);
  d.draft_length = std::stoi(m[8]);
  return d;
}

// Two prompts of the V4 golden model, 8 tokens each, batched: the first token comes from the prefill step, the
// other 7 from 7 decode steps of both sequences; without drafts every decoded token is delivered.
TEST(OfflineCli, DecodeRateAsTheReferenceReportsIt) {
  const std::string dir = testing::test_data_dir() + "/golden/deepseek_v4";
  for (const char* flags : {"", " --no-async-scheduling"}) {
    auto r = run_cli("offline --model " + dir +
                     " --max-tokens 8 --ignore-eos --max-num-seqs 2 --prompt-ids 5,6,7 "
                     "--prompt-ids 9,10,11,12 --speculative off" +
                     std::string(flags));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const DecodeRateLine d = parse_decode_rate(r.output);
    ASSERT_EQ(d.draft_length, 0) << r.output;
    EXPECT_EQ(d.steps, 7) << r.output;
    EXPECT_DOUBLE_EQ(d.batch, 2.0) << r.output;
    EXPECT_EQ(d.acceptance, "no speculation");
    EXPECT_EQ(d.delivered_text, d.full_text) << r.output;  // no drafts: delivered == full acceptance
    EXPECT_GT(d.sps, 0);
    EXPECT_NEAR(d.sps, d.steps / d.seconds, 0.01 * d.sps + 0.01) << r.output;
    EXPECT_NEAR(d.delivered, d.sps * d.batch, 0.01 * d.delivered + 0.1) << r.output;
    // No CUDA graphs on the CPU: no warm-up step left out.
    EXPECT_NE(r.output.find("warm-up steps (a CUDA graph recorded) left out: 0 ("), std::string::npos) << r.output;
  }
}

// --random-prompt-len: every random prompt has that many tokens (a long-prompt workload without a prompt file),
// the same ids on every run; it cannot go with given prompts. Without it the lengths are 8, 13, 18, ...
TEST(OfflineCli, RandomPromptLengthSetsEveryRandomPrompt) {
  const std::string base = "offline --model " + testing::test_data_dir() +
                           "/golden/deepseek_v4 --max-tokens 2 --ignore-eos --num-prompts 3 --max-model-len 256";
  auto r = run_cli(base + " --random-prompt-len 150");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* s : {"[sample 0] prompt_tokens=150 ", "[sample 1] prompt_tokens=150 ",
                        "[sample 2] prompt_tokens=150 ", "3 requests, 450 prompt tokens computed"})
    EXPECT_NE(r.output.find(s), std::string::npos) << s << "\n" << r.output;
  auto again = run_cli(base + " --random-prompt-len 150");
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_EQ(testing::parse_offline_samples(again.output), testing::parse_offline_samples(r.output));
  auto dflt = run_cli(base);
  ASSERT_EQ(dflt.exit_code, 0) << dflt.output;
  for (const char* s : {"prompt_tokens=8 ", "prompt_tokens=13 ", "prompt_tokens=18 "})
    EXPECT_NE(dflt.output.find(s), std::string::npos) << s << "\n" << dflt.output;
  auto bad = run_cli(base + " --random-prompt-len 10 --prompt-ids 1,2,3");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("--random-prompt-len sets the length of the random prompts"), std::string::npos)
      << bad.output;
}

TEST(OfflineCli, UnsupportedLayoutsAndChecksAreClearErrors) {
  const std::string m = " --model_name " + testing::test_data_dir() + "/golden/deepseek_v4";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--ep 4 --cp 2", "must be dp·cp = 2; pick ep dividing dp·cp"},
      {"--ep 16", "--ep 16: the model has only 8 routed experts"},
      {"--ep 0", "--ep must be >= 1"},
      {"--eplb-interval 2", "--eplb-interval needs expert parallelism"},
      {"--ep-fp8-dispatch", "--ep-fp8-dispatch needs expert parallelism"},
      {"--cp 0", "--cp must be >= 1"},
      {"--check_structured_output", "--check_structured_output needs"},  // no tokenizer.json
      {"--gpu_memory_utilization 1.5", "gpu_memory_utilization must be in (0, 1]"},
      {"--temperature -1", "temperature must be"},
  };
  for (const auto& [flags, message] : cases) {
    auto r = run_cli("offline " + flags + m);
    EXPECT_NE(r.exit_code, 0) << flags;
    EXPECT_NE(r.output.find(message), std::string::npos) << flags << "\n" << r.output;
  }
}

// Expert and attention data parallelism with in-process ranks: the same greedy ids as one rank (EP2, EP4 with
// replicated attention, DP2 x EP2 with EPLB every 2 steps).
TEST(OfflineCli, ExpertAndDataParallelGiveTheSingleRankOutput) {
  const std::string base = "offline --model_name " + testing::test_data_dir() +
                           "/golden/deepseek_v4 --max_model_len 128 --num-prompts 3 --max-tokens 5 --threads 2 "
                           "--ignore-eos";
  auto one = run_cli(base);
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const auto expect = testing::parse_offline_samples(one.output);
  ASSERT_EQ(expect.size(), 3u);
  for (const std::string flags : {" --ep 2", " --ep 4", " --ep 2 --dp 2 --eplb-interval 2"}) {
    auto r = run_cli(base + flags);
    ASSERT_EQ(r.exit_code, 0) << flags << "\n" << r.output;
    EXPECT_EQ(testing::parse_offline_samples(r.output), expect) << flags;
    EXPECT_NE(r.output.find("parallel layout: world"), std::string::npos) << r.output;
    if (flags.find("eplb") != std::string::npos) {
      EXPECT_NE(r.output.find("EPLB: "), std::string::npos) << r.output;
    }
  }
  // FP8 dispatch is lossy (exactness: ExpertParallel.Fp8Dispatch*); here it runs through the CLI and finishes
  // every sample.
  auto fp8 = run_cli(base + " --ep 2 --ep-fp8-dispatch");
  ASSERT_EQ(fp8.exit_code, 0) << fp8.output;
  EXPECT_EQ(testing::parse_offline_samples(fp8.output).size(), 3u) << fp8.output;
}

// A random checkpoint of the golden `family` config in the released quantization (FP8 dense, MXFP4 experts), made by
// the CLI into `tmp`/q; its directory.
std::string quantized_checkpoint(const testing::TempDir& tmp, const std::string& family, int seed) {
  nlohmann::json cfg = nlohmann::json::parse(
      testing::read_file_or_empty(testing::test_data_dir() + "/golden/" + family + "/config.json"));
  cfg["quantization_config"] = testing::v4_quantization_config();
  testing::write_file(tmp.file("q.json"), cfg.dump());
  const std::string dir = tmp.path() + "/q";
  auto made =
      run_cli("make-checkpoint --config " + tmp.file("q.json") + " --out " + dir + " --seed " + std::to_string(seed));
  EXPECT_EQ(made.exit_code, 0) << made.output;
  return dir;
}

// --weight-format fp8 under EP / EP x DP (with EPLB): every rank keeps its MXFP4 experts and loads only those; the
// samples equal the one-rank run with the same kept weights.
TEST(OfflineCli, QuantizedExpertsUnderExpertParallelGiveTheSingleRankOutput) {
  testing::TempDir tmp;
  const std::string dir = quantized_checkpoint(tmp, "deepseek_v4", 4);
  ASSERT_FALSE(::testing::Test::HasFailure());
  const std::string base = "offline --model_name " + dir +
                           " --max_model_len 128 --num-prompts 3 --max-tokens 5 --threads 2 --ignore-eos "
                           "--weight-format fp8";
  auto one = run_cli(base);
  ASSERT_EQ(one.exit_code, 0) << one.output;
  EXPECT_NE(one.output.find("kept quantized"), std::string::npos) << one.output;
  const auto expect = testing::parse_offline_samples(one.output);
  ASSERT_EQ(expect.size(), 3u);
  // auto on the CPU holds f32 weights on every rank (the same codes dequantized exactly: the same samples).
  auto f32 = run_cli("offline --model_name " + dir +
                     " --max_model_len 128 --num-prompts 3 --max-tokens 5 --threads 2 --ignore-eos --ep 2");
  ASSERT_EQ(f32.exit_code, 0) << f32.output;
  EXPECT_NE(f32.output.find("f32 on every rank"), std::string::npos) << f32.output;
  EXPECT_EQ(testing::parse_offline_samples(f32.output), expect);
  for (const std::string flags : {" --ep 2", " --ep 2 --dp 2 --eplb-interval 2", " --ep 4"}) {
    auto r = run_cli(base + flags);
    ASSERT_EQ(r.exit_code, 0) << flags << "\n" << r.output;
    EXPECT_EQ(testing::parse_offline_samples(r.output), expect) << flags;
    EXPECT_NE(r.output.find("kept quantized on every rank"), std::string::npos) << r.output;
    if (flags.find("eplb") != std::string::npos) EXPECT_NE(r.output.find("EPLB: "), std::string::npos) << r.output;
  }
}

// --activation-quant mxfp8 (the reference's GEMM numerics): kept quantized or dequantized at load, on one rank or
// with the experts over two EP ranks (which round the rows they receive), the samples are the same; the logs name
// the mode; the samples differ from the default numerics' (the rounding reaches the logits); V3 refuses it by name.
TEST(OfflineCli, ActivationQuantIsTheSameUnderEveryWeightLayout) {
  testing::TempDir tmp;
  const std::string dir = quantized_checkpoint(tmp, "deepseek_v4", 4);
  ASSERT_FALSE(::testing::Test::HasFailure());
  const std::string base = "offline --model_name " + dir +
                           " --max_model_len 128 --num-prompts 3 --max-tokens 6 --threads 2 --ignore-eos "
                           "--activation-quant mxfp8";
  auto one = run_cli(base + " --weight-format fp8");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  EXPECT_NE(one.output.find("activations: mxfp8"), std::string::npos) << one.output;
  const auto expect = testing::parse_offline_samples(one.output);
  ASSERT_EQ(expect.size(), 3u);
  for (const std::string flags : {" --weight-format f32", " --ep 2", " --ep 2 --weight-format fp8"}) {
    auto r = run_cli(base + flags);
    ASSERT_EQ(r.exit_code, 0) << flags << "\n" << r.output;
    EXPECT_EQ(testing::parse_offline_samples(r.output), expect) << flags;
  }
  auto plain = run_cli("offline --model_name " + dir +
                       " --max_model_len 128 --num-prompts 3 --max-tokens 6 --threads 2 --ignore-eos "
                       "--weight-format fp8");
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  EXPECT_EQ(plain.output.find("activations: mxfp8"), std::string::npos) << plain.output;
  EXPECT_NE(testing::parse_offline_samples(plain.output), expect);

  auto v3 = run_cli("offline --model_name " + testing::test_data_dir() +
                    "/golden/deepseek_v3 --max_model_len 64 --num-prompts 1 --max-tokens 2 --activation-quant mxfp8");
  EXPECT_NE(v3.exit_code, 0);
  EXPECT_NE(v3.output.find("--activation-quant mxfp8"), std::string::npos) << v3.output;
  EXPECT_NE(v3.output.find("mxfp8 is DeepSeek-V4 / V4.1's rounding"), std::string::npos) << v3.output;
  auto v4_fp8 = run_cli("offline --model_name " + dir +
                        " --max_model_len 64 --num-prompts 1 --max-tokens 2 "
                        "--activation-quant fp8");
  EXPECT_NE(v4_fp8.exit_code, 0);
  EXPECT_NE(v4_fp8.output.find("fp8 is the DeepSeek-V3 family's rounding"), std::string::npos) << v4_fp8.output;
  // A checkpoint without block-format weights (the golden V4 model): nothing to round, said so.
  auto none = run_cli("offline --model_name " + testing::test_data_dir() +
                      "/golden/deepseek_v4 --max_model_len 64 --num-prompts 1 --max-tokens 2 --activation-quant mxfp8");
  EXPECT_EQ(none.exit_code, 0) << none.output;
  EXPECT_NE(none.output.find("stores no FP8 / MXFP4 weights: nothing is rounded"), std::string::npos) << none.output;
  auto bad = run_cli("offline --model_name " + dir + " --activation-quant fp4");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("--activation-quant"), std::string::npos) << bad.output;
}

// --kernel-choice (offline, generate, serve): the CUDA backend's KEY=VALUE specs; on the CPU device, and for a key
// that does not exist, a clear error before anything loads.
TEST(OfflineCli, KernelChoicesAreRefusedOnTheCpuAndNamedWhenUnknown) {
  const std::string head = "offline --model_name " + testing::test_data_dir() +
                           "/golden/deepseek_v3 --max_model_len 64 --num-prompts 1 --max-tokens 2";
  auto cpu = run_cli(head + " --kernel-choice f32_scale_mma=1");
  EXPECT_NE(cpu.exit_code, 0);
  EXPECT_NE(cpu.output.find("--kernel-choice f32_scale_mma=1: kernel choices are the CUDA backend's"),
            std::string::npos)
      << cpu.output;
  auto unknown = run_cli(head + " --device cuda --kernel-choice no_such_kernel=1");
  EXPECT_NE(unknown.exit_code, 0);
  EXPECT_NE(unknown.output.find("unknown key 'no_such_kernel'"), std::string::npos) << unknown.output;
}

// --kv-cache-dtype bf16 on the golden models: the engine runs to the end with finite samples and logs the cache (V4.1:
// lossless, the f32 cache's samples), with the one-rank figures over --ep 2 / --dp 2 and with --cp 2.
TEST(OfflineCli, KvCacheDtypeBf16RunsEveryFamilyAndLayout) {
  const std::string args = " --max_model_len 128 --num-prompts 2 --max-tokens 4 --ignore-eos --kv-cache-dtype bf16";
  auto v3 = run_cli("offline --model_name " + testing::test_data_dir() + "/golden/deepseek_v3" + args);
  ASSERT_EQ(v3.exit_code, 0) << v3.output;
  EXPECT_NE(v3.output.find("KV cache: bf16, rows rounded as written"), std::string::npos) << v3.output;
  EXPECT_EQ(testing::parse_offline_samples(v3.output).size(), 2u);
  EXPECT_EQ(v3.output.find("finite=NO"), std::string::npos) << v3.output;
  // V4.1: lossless (its cached rows are fake-quantized), the f32 cache's samples exactly.
  const std::string v41_dir = testing::test_data_dir() + "/golden/deepseek_v41";
  auto v41 = run_cli("offline --model_name " + v41_dir + args);
  ASSERT_EQ(v41.exit_code, 0) << v41.output;
  EXPECT_NE(v41.output.find("KV cache: bf16 (lossless"), std::string::npos) << v41.output;
  auto v41_f32 = run_cli("offline --model_name " + v41_dir +
                         " --max_model_len 128 --num-prompts 2 --max-tokens 4 "
                         "--ignore-eos --kv-cache-dtype f32");
  ASSERT_EQ(v41_f32.exit_code, 0) << v41_f32.output;
  EXPECT_EQ(testing::parse_offline_samples(v41.output), testing::parse_offline_samples(v41_f32.output));
  auto v4 = run_cli("offline --model_name " + testing::test_data_dir() + "/golden/deepseek_v4" + args);
  ASSERT_EQ(v4.exit_code, 0) << v4.output;
  EXPECT_NE(v4.output.find("KV cache: bf16 (rows rounded as written)"), std::string::npos) << v4.output;
  auto ep = run_cli("offline --model_name " + v41_dir + args + " --ep 2");
  ASSERT_EQ(ep.exit_code, 0) << ep.output;
  EXPECT_EQ(testing::parse_offline_samples(ep.output), testing::parse_offline_samples(v41_f32.output));
  // The V3 family's bf16 cache rounds, so its decode perplexities move; every EP / DP rank's model keeps bf16 pages:
  // the one-rank bf16 figures exactly.
  const auto ppl = [](const std::string& out) {
    std::vector<std::string> v;
    for (size_t at = out.find("decode_ppl="); at != std::string::npos; at = out.find("decode_ppl=", at + 1))
      v.push_back(out.substr(at, out.find(' ', at) - at));
    return v;
  };
  const std::string v3_dir = testing::test_data_dir() + "/golden/deepseek_v3";
  auto v3_f32 = run_cli("offline --model_name " + v3_dir +
                        " --max_model_len 128 --num-prompts 2 --max-tokens 4 "
                        "--ignore-eos");
  auto v3_ranks = run_cli("offline --model_name " + v3_dir + args + " --ep 2 --dp 2");
  ASSERT_EQ(v3_ranks.exit_code, 0) << v3_ranks.output;
  ASSERT_EQ(ppl(v3.output).size(), 2u) << v3.output;
  EXPECT_EQ(ppl(v3_ranks.output), ppl(v3.output)) << v3_ranks.output;
  EXPECT_NE(ppl(v3_f32.output), ppl(v3.output)) << "the bf16 cache gave the f32 cache's perplexities";
  auto cp = run_cli("offline --model_name " + v41_dir + args + " --cp 2");
  ASSERT_EQ(cp.exit_code, 0) << cp.output;
  EXPECT_EQ(testing::parse_offline_samples(cp.output), testing::parse_offline_samples(v41_f32.output));
  // Context parallelism's scratch ranks keep their rows outside the pools, rounded as the pages are: the same figures.
  auto v3_cp = run_cli("offline --model_name " + v3_dir + args + " --cp 2");
  ASSERT_EQ(v3_cp.exit_code, 0) << v3_cp.output;
  EXPECT_EQ(ppl(v3_cp.output), ppl(v3.output)) << v3_cp.output;
  auto v4_cp = run_cli("offline --model_name " + testing::test_data_dir() + "/golden/deepseek_v4" + args + " --cp 2");
  ASSERT_EQ(v4_cp.exit_code, 0) << v4_cp.output;
  EXPECT_EQ(ppl(v4_cp.output), ppl(v4.output)) << v4_cp.output;
}

// --kv-cache-dtype fp8: V4.1's rows kept as their FP8 / FP4 records give the f32 cache's samples (and decode
// perplexities) exactly, and the log says so; a family whose rows are not quantized is named and refused.
TEST(OfflineCli, KvCacheDtypeFp8KeepsV41SamplesAndRefusesOtherFamilies) {
  const std::string args = " --max_model_len 128 --num-prompts 2 --max-tokens 4 --ignore-eos --kv-cache-dtype ";
  const std::string v41_dir = testing::test_data_dir() + "/golden/deepseek_v41";
  auto fp8 = run_cli("offline --model_name " + v41_dir + args + "fp8");
  auto f32 = run_cli("offline --model_name " + v41_dir + args + "f32");
  ASSERT_EQ(fp8.exit_code, 0) << fp8.output;
  ASSERT_EQ(f32.exit_code, 0) << f32.output;
  EXPECT_NE(fp8.output.find("KV cache: fp8 records (lossless"), std::string::npos) << fp8.output;
  EXPECT_EQ(testing::parse_offline_samples(fp8.output).size(), 2u) << fp8.output;
  EXPECT_EQ(testing::parse_offline_samples(fp8.output), testing::parse_offline_samples(f32.output));
  // DSpark speculation writes and rolls back draft rows through the same records: the f32 cache's greedy ids.
  const testing::DraftFixture& d = testing::dspark_fixture("deepseek_v41");
  // V4.1's Engram reads its token map from the tokenizer: the golden one serves the generated checkpoint.
  testing::write_file(d.dir + "/tokenizer.json", testing::read_file_or_empty(v41_dir + "/tokenizer.json"));
  std::string spec = "offline --model " + d.dir + " --max-tokens 10 --ignore-eos --max-num-batched-tokens 16";
  for (int p = 0; p < 2; ++p) {
    std::string csv;
    for (int64_t t : testing::dspark_prompt(7 + 9 * p, d.model->config().vocab_size - p))
      csv += (csv.empty() ? "" : ",") + std::to_string(t);
    spec += " --prompt-ids " + csv;
  }
  auto spec_f32 = run_cli(spec + " --kv-cache-dtype f32");
  auto spec_fp8 = run_cli(spec + " --kv-cache-dtype fp8 --speculative dspark --num-draft-tokens 4");
  ASSERT_EQ(spec_f32.exit_code, 0) << spec_f32.output;
  ASSERT_EQ(spec_fp8.exit_code, 0) << spec_fp8.output;
  EXPECT_EQ(testing::parse_offline_samples(spec_fp8.output).size(), 2u) << spec_fp8.output;
  EXPECT_NE(spec_fp8.output.find("speculative: acceptance_rate="), std::string::npos) << spec_fp8.output;
  EXPECT_EQ(testing::parse_offline_samples(spec_fp8.output), testing::parse_offline_samples(spec_f32.output));
  auto v3 = run_cli("offline --model_name " + testing::test_data_dir() + "/golden/deepseek_v3" + args + "fp8");
  EXPECT_NE(v3.exit_code, 0);
  EXPECT_NE(v3.output.find("--kv-cache-dtype fp8"), std::string::npos) << v3.output;
  EXPECT_NE(v3.output.find("deepseek_v3 caches unquantized rows"), std::string::npos) << v3.output;
}

// --activation-quant fp8 on a V3 FP8 checkpoint (the reference's gemm_impl "fp8": per 128 values, f32 scales; with
// scale_fmt ue8m0 power-of-two ones): kept quantized or dequantized at load, on one rank or with the experts over two
// EP ranks, the samples are the same; the logs name the mode; the samples differ from the default numerics'.
TEST(OfflineCli, V3ActivationQuantFp8IsTheSameUnderEveryWeightLayout) {
  for (const bool ue8m0 : {false, true}) {
    SCOPED_TRACE(ue8m0 ? "scale_fmt ue8m0" : "f32 scales");
    testing::TempDir tmp;
    nlohmann::json cfg = nlohmann::json::parse(
        testing::read_file_or_empty(testing::test_data_dir() + "/golden/deepseek_v3/config.json"));
    cfg["quantization_config"] = {
        {"quant_method", "fp8"}, {"fmt", "e4m3"}, {"activation_scheme", "dynamic"}, {"weight_block_size", {128, 128}}};
    if (ue8m0) cfg["quantization_config"]["scale_fmt"] = "ue8m0";
    testing::write_file(tmp.file("q.json"), cfg.dump());
    const std::string dir = tmp.path() + "/q";
    auto made = run_cli("make-checkpoint --config " + tmp.file("q.json") + " --out " + dir + " --seed 6");
    ASSERT_EQ(made.exit_code, 0) << made.output;
    const std::string head =
        "offline --model_name " + dir + " --max_model_len 128 --num-prompts 3 --max-tokens 6 --threads 2 --ignore-eos";
    auto one = run_cli(head + " --activation-quant fp8 --weight-format fp8");
    ASSERT_EQ(one.exit_code, 0) << one.output;
    EXPECT_NE(one.output.find(ue8m0 ? "activations: fp8-ue8m0" : "activations: fp8 "), std::string::npos) << one.output;
    const auto expect = testing::parse_offline_samples(one.output);
    ASSERT_EQ(expect.size(), 3u);
    for (const std::string flags : {" --weight-format f32", " --ep 2", " --ep 2 --weight-format fp8"}) {
      auto r = run_cli(head + " --activation-quant fp8" + flags);
      ASSERT_EQ(r.exit_code, 0) << flags << "\n" << r.output;
      EXPECT_EQ(testing::parse_offline_samples(r.output), expect) << flags;
    }
    auto plain = run_cli(head + " --weight-format fp8");
    ASSERT_EQ(plain.exit_code, 0) << plain.output;
    EXPECT_EQ(plain.output.find("activations: fp8"), std::string::npos) << plain.output;
    EXPECT_NE(testing::parse_offline_samples(plain.output), expect);
  }
}

// --weight-format fp8 with context parallelism: the CP ranks hold the driver's quantized weights; a prompt long enough
// to split over them (41 tokens in chunks of <= 24) gives the one-rank fp8 samples, alone and inside EP.
TEST(OfflineCli, QuantizedWeightsUnderContextParallelGiveTheSingleRankOutput) {
  testing::TempDir tmp;
  const std::string dir = quantized_checkpoint(tmp, "deepseek_v41", 6);
  ASSERT_FALSE(::testing::Test::HasFailure());
  std::string ids;
  for (int i = 0; i < 41; ++i) ids += (i ? "," : "") + std::to_string(20 + (13 * i) % 90);
  // V4.1 Engram layers need a token map: the golden one (the generated checkpoint has no tokenizer).
  const std::string base =
      "offline --model_name " + dir + " --engram-token-map " + testing::test_data_dir() +
      "/golden/deepseek_v41/golden.safetensors --max_model_len 128 --max-tokens 4 --threads 2 "
      "--ignore-eos --temperature 0 --max-num-batched-tokens 24 --weight-format fp8 --prompt-ids " +
      ids + " --prompt-ids 5,6,7,8,9,10";
  auto one = run_cli(base);
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const auto expect = testing::parse_offline_samples(one.output);
  ASSERT_EQ(expect.size(), 2u);
  for (const std::string flags : {" --cp 2", " --ep 2 --cp 2"}) {
    auto r = run_cli(base + flags);
    ASSERT_EQ(r.exit_code, 0) << flags << "\n" << r.output;
    EXPECT_EQ(testing::parse_offline_samples(r.output), expect) << flags;
    EXPECT_NE(r.output.find("context parallel: prompt chunks"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("kept quantized"), std::string::npos) << r.output;
  }
}

// Context parallelism with in-process ranks: long prompt chunks split zig-zag over 2 and 3 ranks give one rank's
// samples (V3 MLA and V4.1, chunked prefill under a 24-token budget; the 41-token prompt spans two chunks), also
// combined with EP2 (the shard's two ranks are the CP group).
TEST(OfflineCli, ContextParallelGivesTheSingleRankOutput) {
  std::string ids;
  for (int i = 0; i < 41; ++i) ids += (i ? "," : "") + std::to_string(20 + (13 * i) % 90);
  for (const char* model : {"deepseek_v3", "deepseek_v41"}) {
    const std::string base = "offline --model_name " + testing::test_data_dir() + "/golden/" + model +
                             " --max_model_len 128 --max-tokens 4 --threads 2 --ignore-eos --temperature 0 "
                             "--max-num-batched-tokens 24 --prompt-ids " +
                             ids + " --prompt-ids 5,6,7,8,9,10";
    auto one = run_cli(base);
    ASSERT_EQ(one.exit_code, 0) << one.output;
    const auto expect = testing::parse_offline_samples(one.output);
    ASSERT_EQ(expect.size(), 2u);
    for (const std::string flags : {" --cp 2", " --cp 3", " --ep 2 --cp 2"}) {
      auto r = run_cli(base + flags);
      ASSERT_EQ(r.exit_code, 0) << model << flags << "\n" << r.output;
      EXPECT_EQ(testing::parse_offline_samples(r.output), expect) << model << flags;
      EXPECT_NE(r.output.find("context parallel: prompt chunks"), std::string::npos) << r.output;
    }
  }
}

// --speculative dspark on a generated V4-Flash-0731-shaped checkpoint with DSpark draft weights: the same greedy ids
// as without, and the DSpark diagnostics per sample and in total.
TEST(OfflineCli, DsparkSpeculationKeepsGreedyOutputAndPrintsAcceptance) {
  const testing::DraftFixture& f = testing::dspark_fixture("deepseek_v4");
  const int64_t V = f.model->config().vocab_size;
  std::string args = "offline --model " + f.dir + " --max-tokens 12 --ignore-eos --max-num-batched-tokens 16";
  for (int p = 0; p < 3; ++p) {
    std::string csv;
    for (int64_t t : testing::dspark_prompt(6 + 9 * p, V - p)) csv += (csv.empty() ? "" : ",") + std::to_string(t);
    args += " --prompt-ids " + csv;
  }
  auto plain = run_cli(args);
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  auto spec = run_cli(args + " --speculative dspark --num-draft-tokens 4 --draft-confidence-threshold 0.2");
  ASSERT_EQ(spec.exit_code, 0) << spec.output;
  EXPECT_EQ(testing::parse_offline_samples(spec.output), testing::parse_offline_samples(plain.output));
  EXPECT_EQ(testing::parse_offline_samples(spec.output).size(), 3u);
  const std::regex per_sample(R"(acceptance_rate=[0-9.]+ mean_accepted_len=[0-9.]+ drafted=[0-9]+ accepted=[0-9]+ )"
                              R"(accepted_by_position=[0-9]+/[0-9]+)");
  auto begin = std::sregex_iterator(spec.output.begin(), spec.output.end(), per_sample);
  EXPECT_GE(std::distance(begin, std::sregex_iterator()), 3) << spec.output;  // each sample, then the total
  EXPECT_NE(spec.output.find("speculative: acceptance_rate="), std::string::npos) << spec.output;
  // A checkpoint without DSpark weights, and a V3 one: clear errors naming the option.
  auto no_draft = run_cli("offline --model " + testing::test_data_dir() + "/golden/deepseek_v4 --speculative dspark");
  EXPECT_NE(no_draft.exit_code, 0);
  EXPECT_NE(no_draft.output.find("--speculative dspark"), std::string::npos) << no_draft.output;
  auto v3 = run_cli("offline --model " + testing::test_data_dir() + "/golden/deepseek_v3 --speculative dspark");
  EXPECT_NE(v3.exit_code, 0);
  EXPECT_NE(v3.output.find("--speculative dspark: DSpark drafting needs"), std::string::npos) << v3.output;
}

// --speculative mtp on a generated V4-Flash-base-shaped checkpoint with its MTP module: the same greedy ids as
// without (greedy and sampled draft modes), acceptance printed; clear errors where the module is missing.
TEST(OfflineCli, V4MtpSpeculationKeepsGreedyOutputAndPrintsAcceptance) {
  const testing::DraftFixture& f = testing::v4_mtp_fixture();
  const int64_t V = f.model->config().vocab_size;
  std::string args = "offline --model " + f.dir + " --max-tokens 10 --ignore-eos --max-num-batched-tokens 16";
  for (int p = 0; p < 2; ++p) {
    std::string csv;
    for (int64_t t : testing::dspark_prompt(7 + 11 * p, V - p)) csv += (csv.empty() ? "" : ",") + std::to_string(t);
    args += " --prompt-ids " + csv;
  }
  auto plain = run_cli(args);
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  for (const std::string mode : {"greedy", "sampled"}) {
    auto spec = run_cli(args + " --speculative mtp --num-draft-tokens 2 --draft-sampling " + mode);
    ASSERT_EQ(spec.exit_code, 0) << spec.output;
    EXPECT_EQ(testing::parse_offline_samples(spec.output), testing::parse_offline_samples(plain.output)) << mode;
    EXPECT_NE(spec.output.find("speculative: acceptance_rate="), std::string::npos) << spec.output;
    // Reference-style decode figures: full acceptance counts 1 + 2 tokens per sequence step, delivered the
    // measured ones; the two agree only if every draft was accepted.
    const DecodeRateLine d = parse_decode_rate(spec.output);
    ASSERT_EQ(d.draft_length, 2) << spec.output;
    EXPECT_GT(d.steps, 0) << spec.output;
    EXPECT_EQ(d.acceptance.rfind("measured acceptance ", 0), 0u) << spec.output;
    EXPECT_NEAR(d.full, d.sps * d.batch * 3, 0.01 * d.full + 0.1) << spec.output;
    EXPECT_LE(d.delivered, d.full + 0.1) << spec.output;
    EXPECT_GE(d.delivered, d.sps * d.batch * 0.99 - 0.1) << spec.output;  // at least one token per sequence step
  }
  // The V4 golden checkpoint has no MTP layers; DSpark checkpoints draft with dspark; dspark refuses sampled drafts.
  auto none = run_cli("offline --model " + testing::test_data_dir() + "/golden/deepseek_v4 --speculative mtp");
  EXPECT_NE(none.exit_code, 0);
  EXPECT_NE(none.output.find("--speculative mtp: the model config has no V4 MTP layers"), std::string::npos)
      << none.output;
  auto dspark = run_cli("offline --model " + testing::dspark_fixture("deepseek_v4").dir + " --speculative mtp");
  EXPECT_NE(dspark.exit_code, 0);
  EXPECT_NE(dspark.output.find("drafts with --speculative dspark"), std::string::npos) << dspark.output;
  auto sampled_dspark = run_cli("offline --model " + testing::dspark_fixture("deepseek_v4").dir +
                                " --speculative dspark --draft-sampling sampled");
  EXPECT_NE(sampled_dspark.exit_code, 0);
  EXPECT_NE(sampled_dspark.output.find("--draft-sampling sampled"), std::string::npos) << sampled_dspark.output;
}

// Greedy steps take the fast path (ModelRunner::execute_argmax; on the CPU the host reduction) with and without the
// chosen tokens' logprobs the default run asks for, and give the same ids; the CPU has no device timeline, so the
// GPU-idle figure is n/a.
TEST(OfflineCli, NoLogprobsTakesTheGreedyFastPathWithTheSameIds) {
  const std::string dir = testing::test_data_dir() + "/golden/deepseek_v41";
  const std::string base = "offline --model " + dir + " --num-prompts 3 --max-tokens 8 --ignore-eos --max-num-seqs 2";
  auto with = run_cli(base);
  auto without = run_cli(base + " --no-logprobs");
  ASSERT_EQ(with.exit_code, 0) << with.output;
  ASSERT_EQ(without.exit_code, 0) << without.output;
  EXPECT_EQ(testing::parse_offline_samples(with.output), testing::parse_offline_samples(without.output));
  EXPECT_EQ(testing::parse_offline_samples(without.output).size(), 3u);
  EXPECT_NE(without.output.find("decode_ppl=n/a (--no-logprobs)"), std::string::npos) << without.output;
  EXPECT_NE(without.output.find("finite=yes"), std::string::npos) << without.output;
  EXPECT_NE(with.output.find("gpu idle between decode steps: n/a"), std::string::npos) << with.output;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(without.output, m,
                                std::regex(R"(greedy fast path: (\d+) steps argmax on the device, (\d+) on the host)")))
      << without.output;
  EXPECT_EQ(m[1], "0");
  EXPECT_GT(std::stoi(m[2]), 0);
  ASSERT_TRUE(std::regex_search(with.output, m,
                                std::regex(R"(greedy fast path: (\d+) steps argmax on the device, (\d+) on the host)")))
      << with.output;
  EXPECT_EQ(m[1], "0");
  EXPECT_GT(std::stoi(m[2]), 0) << "the chosen tokens' logprobs keep the fast path";
  EXPECT_NE(with.output.find("finite=yes"), std::string::npos) << with.output;
  EXPECT_TRUE(std::regex_search(with.output, std::regex(R"(decode_ppl=[0-9]+\.[0-9]{4} )"))) << with.output;
}

}  // namespace
}  // namespace deepinfer
