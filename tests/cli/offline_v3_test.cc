// `deepinfer offline` and `deepinfer generate` on the DeepSeek-V3 golden model: the family is picked from
// config.json, and greedy continuations through the engine (continuous batching, chunked prefill, state
// slots) and through the plain greedy loop equal transformers'.
#include <gtest/gtest.h>

#include <map>
#include <regex>
#include <sstream>

#include "deepinfer/io/safetensors.h"
#include "test_util.h"

namespace deepinfer {
namespace {

using testing::ids_csv;
using testing::run_cli;

std::string v3_dir() { return testing::test_data_dir() + "/golden/deepseek_v3"; }

void check_offline(const std::string& engine_flags) {
  auto golden = SafetensorsFile::open(v3_dir() + "/golden.safetensors");
  std::string args = "offline --model " + v3_dir() + " --max-tokens 16 --ignore-eos " + engine_flags;
  for (int p = 0; p < 3; ++p)
    args += " --prompt-ids " + ids_csv(golden->tensor("prompt" + std::to_string(p) + ".input_ids"));
  auto r = run_cli(args);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto got = testing::parse_offline_samples(r.output);
  ASSERT_EQ(got.size(), 3u) << r.output;
  for (int p = 0; p < 3; ++p)
    EXPECT_EQ(got[p], ids_csv(golden->tensor("prompt" + std::to_string(p) + ".generated_ids")))
        << "prompt " << p << " with " << engine_flags;
  EXPECT_NE(r.output.find("finite=yes"), std::string::npos);
  EXPECT_EQ(r.output.find("finite=NO"), std::string::npos);
}

TEST(OfflineCliV3, GreedyThroughTheEngineEqualsTransformers) {
  check_offline("--max-num-seqs 4");
  // Tiny token budget: prompts prefilled in chunks of 7 interleaved with decodes, one state slot at a time.
  check_offline("--max-num-seqs 1 --max-num-batched-tokens 7");
}

TEST(GenerateCliV3, GreedyEqualsTransformers) {
  auto golden = SafetensorsFile::open(v3_dir() + "/golden.safetensors");
  auto r = run_cli("generate --model " + v3_dir() + " --max-tokens 16 --prompt-ids " +
                   ids_csv(golden->tensor("prompt1.input_ids")));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(ids_csv(golden->tensor("prompt1.generated_ids"))), std::string::npos) << r.output;
}

}  // namespace
}  // namespace deepinfer
