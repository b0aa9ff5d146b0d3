// `deepinfer bench` end to end on the CPU backend (the tiny slice): the ceilings line, one row per shape and
// the breakdown; bad options are clear errors.
#include <gtest/gtest.h>

#include <regex>
#include <sstream>

#include "test_util.h"

namespace deepinfer {
namespace {

using testing::run_cli;

// Table rows of the slice in `phase` (the timing table and the breakdown both print one per shape).
int rows_of(const std::string& out, const std::string& phase) {
  std::istringstream in(out);
  int n = 0;
  for (std::string line; std::getline(in, line);)
    if (line.rfind("tiny ", 0) == 0 && line.find(" " + phase + " ") != std::string::npos) ++n;
  return n;
}

TEST(BenchCli, TinySliceOnCpu) {
  auto r = run_cli("bench --device cpu --threads 1 --prompt 8 --batch 1 --batch 2 --context 16 --warmup 0 --iters 1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("ceilings (measured in this run)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("slice tiny: 4 layers"), std::string::npos) << r.output;
  EXPECT_EQ(rows_of(r.output, "prefill"), 2) << r.output;  // 1 prompt length, table + breakdown
  EXPECT_EQ(rows_of(r.output, "decode"), 4) << r.output;   // 2 batches × 1 context, table + breakdown
  EXPECT_NE(r.output.find("breakdown"), std::string::npos) << r.output;
  // The reference's decode figures per decode row; no drafts in the bench, so delivered == full acceptance.
  EXPECT_NE(r.output.find("decode as the reference reports it"), std::string::npos) << r.output;
  const std::regex rate(R"(tiny\s+batch\s+([0-9]+) context\s+16  avg_SPS\s+([0-9.]+) steps/s  delivered\s+([0-9.]+) )"
                        R"(tokens/s  full-acceptance\s+([0-9.]+) tokens/s)");
  int rates = 0;
  for (auto it = std::sregex_iterator(r.output.begin(), r.output.end(), rate); it != std::sregex_iterator(); ++it) {
    const std::smatch& m = *it;
    ++rates;
    EXPECT_EQ(m[3].str(), m[4].str()) << m[0];
    EXPECT_NEAR(std::stod(m[3]), std::stod(m[2]) * std::stod(m[1]), 0.01 * std::stod(m[3]) + 0.1) << m[0];
  }
  EXPECT_EQ(rates, 2) << r.output;  // batch 1 and 2
}

// The tiny slice's first layer runs Engram (its own breakdown column); --no-engram drops it.
TEST(BenchCli, EngramColumnAndNoEngram) {
  const std::string args = "bench --device cpu --threads 1 --no-prefill --batch 2 --context 16 --warmup 0 --iters 1";
  auto with = run_cli(args);
  ASSERT_EQ(with.exit_code, 0) << with.output;
  const std::regex row(R"(tiny\s+decode\s+2\s+16(\s+[0-9.]+){6}\s+([0-9.]+)\s)");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(with.output, m, row)) << with.output;  // the breakdown row: 7 segment columns
  EXPECT_GT(std::stod(m[2]), 0.0) << "engram column: " << m[0];
  auto without = run_cli(args + " --no-engram");
  ASSERT_EQ(without.exit_code, 0) << without.output;
  ASSERT_TRUE(std::regex_search(without.output, m, row)) << without.output;
  EXPECT_EQ(std::stod(m[2]), 0.0) << "engram column with --no-engram: " << m[0];
}

TEST(BenchCli, UnknownSliceIsAnError) {
  auto r = run_cli("bench --device cpu --model v5-giant --iters 1");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("unknown slice 'v5-giant'"), std::string::npos) << r.output;
}

// --v2-lite-ffn takes the two formats V2-Lite's FFN can be kept in, nothing else.
TEST(BenchCli, V2LiteFfnFormatIsChecked) {
  auto r = run_cli("bench --device cpu --model v2-lite --v2-lite-ffn fp8 --iters 1");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--v2-lite-ffn"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("fp8"), std::string::npos) << r.output;
}

// --kv-cache-dtype bf16: the MLA slices' decode and the V4 slices' paged calls read bf16 caches (the slice lines say
// so); other values are not taken.
TEST(BenchCli, KvCacheDtypeForTheSlices) {
  auto f32 = run_cli("bench --device cpu --model tiny-mla --no-prefill --batch 2 --context 32 --warmup 0 --iters 1");
  auto bf16 = run_cli(
      "bench --device cpu --model tiny-mla --no-prefill --batch 2 --context 32 --warmup 0 --iters 1 "
      "--kv-cache-dtype bf16");
  ASSERT_EQ(f32.exit_code, 0) << f32.output;
  ASSERT_EQ(bf16.exit_code, 0) << bf16.output;
  EXPECT_NE(f32.output.find("(decode; its cache f32)"), std::string::npos) << f32.output;
  EXPECT_NE(bf16.output.find("(decode; its cache bf16)"), std::string::npos) << bf16.output;
  auto v4 = run_cli(
      "bench --device cpu --model tiny --no-prefill --batch 2 --context 64 --warmup 0 --iters 1 "
      "--kv-cache-dtype bf16");
  ASSERT_EQ(v4.exit_code, 0) << v4.output;
  EXPECT_NE(v4.output.find("paged caches bf16"), std::string::npos) << v4.output;
  // auto (the default) is the engine's: f32 but for the V4.1 slice (v41-flash, too large for this test).
  auto v4_auto = run_cli("bench --device cpu --model tiny --no-prefill --batch 2 --context 64 --warmup 0 --iters 1");
  ASSERT_EQ(v4_auto.exit_code, 0) << v4_auto.output;
  EXPECT_NE(v4_auto.output.find("paged caches f32"), std::string::npos) << v4_auto.output;
  // fp8 records are V4.1's: refused by name for the other slices.
  for (const char* model : {"tiny-mla", "tiny"}) {
    auto bad = run_cli(std::string("bench --device cpu --model ") + model + " --kv-cache-dtype fp8 --iters 1");
    EXPECT_NE(bad.exit_code, 0);
    EXPECT_NE(bad.output.find("--kv-cache-dtype fp8: the quantized records are V4.1's"), std::string::npos)
        << bad.output;
  }
  auto unknown = run_cli("bench --device cpu --model tiny --kv-cache-dtype int8 --iters 1");
  EXPECT_NE(unknown.exit_code, 0);
  EXPECT_NE(unknown.output.find("--kv-cache-dtype"), std::string::npos) << unknown.output;
}

// --kernel-choice: a bad spec fails before any device work (so on a machine without a GPU too), and the choices are
// the CUDA backend's: with --device cpu they are an error, not silently ignored; so is --fill-device.
TEST(BenchCli, KernelChoiceAndFillDeviceErrors) {
  auto bad = run_cli("bench --device cuda --kernel-choice attn_mma=sometimes --iters 1");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("--kernel-choice attn_mma=sometimes: the value must be one of auto | never | always"),
            std::string::npos)
      << bad.output;
  auto fill = run_cli("bench --device cpu --fill-device --iters 1");
  EXPECT_NE(fill.exit_code, 0);
  EXPECT_NE(fill.output.find("bench --fill-device: the target has no memory budget"), std::string::npos) << fill.output;
  auto cpu = run_cli("bench --device cpu --kernel-choice wgmma=never --iters 1");
  EXPECT_NE(cpu.exit_code, 0);
  EXPECT_NE(cpu.output.find("the choices are the CUDA backend's (--device cuda)"), std::string::npos) << cpu.output;
}

}  // namespace
}  // namespace deepinfer
