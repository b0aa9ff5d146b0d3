// The greedy fast path and the GPU-idle figure through `deepinfer offline --device cuda` on the golden models:
// with --no-logprobs every greedy step reduces its logits to ids on the device (ModelRunner::execute_argmax), and
// its ids must equal the same run with the argmax on the host (--no-device-argmax: the full rows copied back) and
// the CPU backend's; the summary must carry a GPU-idle percentage in [0, 100] (CUDA events, engine/gpu_idle.h).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <regex>

#include "deepinfer/io/safetensors.h"
#include "deepinfer/ops/cuda/cuda_runtime.h"
#include "test_util.h"

namespace deepinfer {
namespace {

struct IdleLine {
  double percent = NAN, gap_ms = NAN, span_ms = NAN;
  int64_t steps = -1, device_steps = -1, host_steps = -1;
};

// "gpu idle between decode steps: X% (gaps G ms over span S ms, N steps); greedy fast path: D steps argmax on the
// device, H on the host"
std::optional<IdleLine> parse_idle(const std::string& out) {
  static const std::regex re(
      R"(gpu idle between decode steps: ([-0-9.naif]+)% \(gaps ([-0-9.naif]+) ms over span ([-0-9.naif]+) ms, (\d+) )"
      R"(steps\); greedy fast path: (\d+) steps argmax on the device, (\d+) on the host)");
  std::smatch m;
  if (!std::regex_search(out, m, re)) return std::nullopt;
  IdleLine l;
  l.percent = std::stod(m[1]);
  l.gap_ms = std::stod(m[2]);
  l.span_ms = std::stod(m[3]);
  l.steps = std::stoll(m[4]);
  l.device_steps = std::stoll(m[5]);
  l.host_steps = std::stoll(m[6]);
  return l;
}

// `with_cpu`: also run the CPU backend (its ids do not depend on CUDA-only flags such as --enforce-eager).
void check_family(const std::string& family, const std::string& flags, bool with_cpu = true) {
  const std::string dir = testing::test_data_dir() + "/golden/" + family;
  auto golden = SafetensorsFile::open(dir + "/golden.safetensors");
  std::string args = " --model " + dir + " --max-tokens 16 --ignore-eos --no-logprobs " + flags;
  for (int p = 0; golden->find("prompt" + std::to_string(p) + ".input_ids"); ++p)
    args += " --prompt-ids " + testing::ids_csv(golden->tensor("prompt" + std::to_string(p) + ".input_ids"));
  auto fast = testing::run_cli("offline --device cuda" + args);
  auto host = testing::run_cli("offline --device cuda --no-device-argmax" + args);
  auto cpu = with_cpu ? testing::run_cli("offline --device cpu" + args) : fast;
  for (const auto* r : {&fast, &host, &cpu}) ASSERT_EQ(r->exit_code, 0) << r->output;
  const auto f = testing::parse_offline_samples(fast.output), h = testing::parse_offline_samples(host.output),
             c = testing::parse_offline_samples(cpu.output);
  ASSERT_GE(f.size(), 3u) << fast.output;
  EXPECT_EQ(f, h) << family << " " << flags << ": device argmax vs host argmax\n"
                  << fast.output << "\n---- host\n"
                  << host.output;
  EXPECT_EQ(f, c) << family << " " << flags << ": GPU vs CPU\n" << fast.output << "\n---- cpu\n" << cpu.output;

  const auto fi = parse_idle(fast.output), hi = parse_idle(host.output);
  ASSERT_TRUE(fi.has_value()) << fast.output;
  ASSERT_TRUE(hi.has_value()) << host.output;
  for (const IdleLine* l : {&*fi, &*hi}) {
    EXPECT_TRUE(std::isfinite(l->percent)) << fast.output;
    EXPECT_GE(l->percent, 0.0);
    EXPECT_LE(l->percent, 100.0);
    EXPECT_GT(l->steps, 0) << "decode steps timed";
    EXPECT_GT(l->span_ms, 0.0);
    EXPECT_LE(l->gap_ms, l->span_ms);
  }
  // Every step of a greedy run without logprobs takes the fast path: on the device here, on the host with the flag.
  EXPECT_GT(fi->device_steps, 0) << fast.output;
  EXPECT_EQ(hi->device_steps, 0) << host.output;
  EXPECT_GT(hi->host_steps, 0) << host.output;
  // The CPU backend has no device timeline.
  if (with_cpu) EXPECT_NE(cpu.output.find("gpu idle between decode steps: n/a"), std::string::npos) << cpu.output;
  std::printf(
      "[cuda-greedy-fast-path %s %s] ids equal (device/host/cpu): %s/%s; idle device argmax %.2f%% (%lld steps), "
      "host argmax %.2f%% (%lld steps)\n",
      family.c_str(), flags.c_str(), f == h ? "yes" : "NO", f == c ? "yes" : "NO", fi->percent,
      static_cast<long long>(fi->steps), hi->percent, static_cast<long long>(hi->steps));
}

TEST(CudaOfflineCli, GreedyFastPathOnTheDeviceEqualsHostArgmaxAndTheCpu) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  for (const std::string family : {"deepseek_v41", "deepseek_v4", "deepseek_v3"})
    check_family(family, "--max-num-seqs 3 --max-num-batched-tokens 33");
  // Decode graphs off (eager batched steps): the argmax reads a step-local logits buffer instead of the graphs'.
  check_family("deepseek_v41", "--max-num-seqs 3 --max-num-batched-tokens 33 --enforce-eager", false);
  check_family("deepseek_v3", "--max-num-seqs 3 --max-num-batched-tokens 33 --enforce-eager", false);
}

// The default offline run asks for the chosen tokens' logprobs (decode perplexity): its greedy steps take the fast
// path too (ids and logprobs reduced on the device), and the idle figure is there.
TEST(CudaOfflineCli, GpuIdleFigureWithTheDefaultLogprobs) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const std::string dir = testing::test_data_dir() + "/golden/deepseek_v41";
  auto r = testing::run_cli("offline --device cuda --model " + dir + " --num-prompts 4 --max-tokens 24 --ignore-eos");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto l = parse_idle(r.output);
  ASSERT_TRUE(l.has_value()) << r.output;
  EXPECT_TRUE(std::isfinite(l->percent));
  EXPECT_GE(l->percent, 0.0);
  EXPECT_LE(l->percent, 100.0);
  EXPECT_GT(l->steps, 0);
  EXPECT_GT(l->device_steps, 0) << "the chosen tokens' logprobs keep the fast path on the device";
  EXPECT_NE(r.output.find("finite=yes"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("finite=NO"), std::string::npos) << r.output;
  std::printf("[cuda-gpu-idle v41 logprobs] %.2f%% over %lld steps\n", l->percent, static_cast<long long>(l->steps));
}

}  // namespace
}  // namespace deepinfer
