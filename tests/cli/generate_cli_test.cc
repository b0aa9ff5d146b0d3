// `deepinfer generate` through the engine on the V4.1 golden model (it has a tokenizer.json): several prompts
// submitted at once and batched, results in input order, JSON records, and the error paths.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "deepinfer/io/safetensors.h"
#include "test_util.h"

namespace deepinfer {
namespace {

using testing::run_cli;

std::string v41() { return testing::test_data_dir() + "/golden/deepseek_v41"; }

std::vector<int64_t> golden_ids(const std::string& name) {
  auto g = SafetensorsFile::open(v41() + "/golden.safetensors");
  Tensor t = g->tensor(name);
  return std::vector<int64_t>(t.data_as<int64_t>(), t.data_as<int64_t>() + t.numel());
}

std::string csv(const std::vector<int64_t>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(ids[i]);
  }
  return s;
}

// The JSON records of a --json run (log lines on stderr are interleaved in `output` and skipped).
std::vector<nlohmann::json> records(const std::string& output) {
  std::vector<nlohmann::json> out;
  std::istringstream in(output);
  std::string line;
  while (std::getline(in, line))
    if (!line.empty() && line[0] == '{') out.push_back(nlohmann::json::parse(line));
  return out;
}

TEST(GenerateCliEngine, BatchedPromptIdsReproduceTransformersInInputOrder) {
  // Three prompts (5, 70, 290 tokens) at once, two sequences at a time, 48-token steps: prefills are chunked and
  // interleaved with decodes; every continuation must still be transformers' greedy one, in input order.
  std::string args =
      "generate --json --ignore-eos --exact-prefill --max-tokens 16 --max-num-seqs 2 --max-num-batched-tokens 48 "
      "--model " +
      v41();
  for (int p : {2, 0, 1}) args += " --prompt-ids " + csv(golden_ids("prompt" + std::to_string(p) + ".input_ids"));
  auto r = run_cli(args);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto recs = records(r.output);
  ASSERT_EQ(recs.size(), 3u) << r.output;
  const int order[] = {2, 0, 1};
  for (int i = 0; i < 3; ++i) {
    const std::string p = "prompt" + std::to_string(order[i]);
    EXPECT_EQ(recs[i]["index"], i);
    EXPECT_EQ(recs[i]["prompt_token_ids"].get<std::vector<int64_t>>(), golden_ids(p + ".input_ids"));
    EXPECT_EQ(recs[i]["token_ids"].get<std::vector<int64_t>>(), golden_ids(p + ".generated_ids")) << p;
    EXPECT_EQ(recs[i]["finish_reason"], "max_tokens");
    EXPECT_EQ(recs[i]["num_tokens"], 16);
    EXPECT_TRUE(recs[i]["text"].is_string());
    EXPECT_GT(recs[i]["decode_ppl"].get<double>(), 1.0);
    EXPECT_FALSE(recs[i].contains("prompt")) << "token-id prompts have no prompt text";
  }
  EXPECT_NE(r.output.find("tokens fit"), std::string::npos) << "the startup log must give the cache capacity";
}

TEST(GenerateCliEngine, SchedulingPolicyFlagReachesTheEngineAndBadNamesAreRejected) {
  const std::string ids = " --prompt-ids " + csv(golden_ids("prompt0.input_ids"));
  auto r = run_cli("generate --json --ignore-eos --max-tokens 4 --scheduling-policy priority --model " + v41() + ids);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("policy priority"), std::string::npos) << r.output;
  ASSERT_EQ(records(r.output).size(), 1u) << r.output;
  auto bad = run_cli("generate --scheduling-policy lifo --model " + v41() + ids);
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("lifo"), std::string::npos) << bad.output;
}

TEST(GenerateCliEngine, TextPromptsFromFlagsAndFileAgreeAndSeededSamplingIgnoresTheBatch) {
  testing::TempDir tmp;
  const std::vector<std::string> texts = {"hello world", "the quick brown fox", "a b c d e f g"};
  testing::write_file(tmp.file("prompts.txt"), texts[0] + "\n" + texts[1] + "\r\n" + texts[2] + "\n");
  const std::string common =
      " --json --ignore-eos --max-tokens 12 --temperature 0.9 --top-p 0.95 --top-k 40 "
      "--seed 11 --model " +
      v41();
  auto from_file = run_cli("generate --prompts-file " + tmp.file("prompts.txt") + common);
  ASSERT_EQ(from_file.exit_code, 0) << from_file.output;
  auto from_flags =
      run_cli("generate --prompt '" + texts[0] + "' --prompt '" + texts[1] + "' --prompt '" + texts[2] + "'" + common);
  ASSERT_EQ(from_flags.exit_code, 0) << from_flags.output;
  const auto a = records(from_file.output), b = records(from_flags.output);
  ASSERT_EQ(a.size(), 3u);
  ASSERT_EQ(b.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(a[i]["prompt"], texts[i]);
    EXPECT_EQ(a[i]["token_ids"], b[i]["token_ids"]) << i;
    EXPECT_EQ(a[i]["text"], b[i]["text"]) << i;
    EXPECT_FALSE(a[i]["text"].get<std::string>().empty());
  }
  // A seeded request samples the same tokens alone as inside the batch (and with a different max-num-seqs).
  auto alone = run_cli("generate --prompt '" + texts[1] + "' --max-num-seqs 1" + common);
  ASSERT_EQ(alone.exit_code, 0) << alone.output;
  const auto c = records(alone.output);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0]["token_ids"], a[1]["token_ids"]);
  // Sampling really happened: the seeded tokens differ from greedy ones somewhere.
  auto greedy =
      run_cli("generate --json --ignore-eos --max-tokens 12 --model " + v41() + " --prompt '" + texts[1] + "'");
  ASSERT_EQ(greedy.exit_code, 0) << greedy.output;
  EXPECT_NE(records(greedy.output).at(0)["token_ids"], c[0]["token_ids"]);
}

TEST(GenerateCliEngine, PlainOutputHasIdsTextAndPerplexityPerPrompt) {
  auto r = run_cli("generate --max-tokens 4 --ignore-eos --model " + v41() + " --prompt 'hello world' --prompt-ids " +
                   csv(golden_ids("prompt0.input_ids")));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* s : {"[0] ids: ", "[0] text: \"", "[1] ids: ",
                        "[0] prompt_tokens=2 tokens=4 finish=max_tokens decode_ppl ", "[1] prompt_tokens=5 tokens=4"})
    EXPECT_NE(r.output.find(s), std::string::npos) << s << "\n" << r.output;
  std::vector<int64_t> first4 = golden_ids("prompt0.generated_ids");
  first4.resize(4);
  EXPECT_NE(r.output.find("[1] ids: " + csv(first4) + "\n"), std::string::npos) << r.output;
}

TEST(GenerateCliEngine, BadInputGetsClearErrors) {
  testing::TempDir tmp;
  struct Case {
    std::string args, message;
  };
  const std::string m = " --model " + v41();
  std::string long_prompt = "1";
  for (int i = 0; i < 20; ++i) long_prompt += ",2";
  testing::write_file(tmp.file("gap.txt"), "one\n\nthree\n");
  const std::vector<Case> cases = {
      {"generate --prompts-file " + tmp.file("missing.txt") + m, "cannot read '" + tmp.file("missing.txt") + "'"},
      {"generate --prompts-file " + tmp.file("gap.txt") + m, "line 2 is empty"},
      {"generate --max-model-len 16 --prompt-ids " + long_prompt + m,
       "the prompt has 21 tokens, more than max_model_len 16"},
      {"generate --temperature -1 --prompt hi" + m, "temperature must be a finite value >= 0"},
      {"generate --top-p 1.5 --prompt hi" + m, "top_p must be in (0, 1]"},
      {"generate --max-tokens 0 --prompt hi" + m, "max_tokens must be >= 1"},
      {"generate" + m, "no prompt"},
      {"generate --prompt-ids 1,x" + m, "'x' is not an integer"},
      {"generate --prompt-ids 1,99999" + m, "token id 99999 outside the vocabulary"},
      // The V4 fixture has no tokenizer.json: text prompts cannot be encoded.
      {"generate --prompt hi --model " + testing::test_data_dir() + "/golden/deepseek_v4", "tokenizer.json"},
  };
  for (const auto& c : cases) {
    auto r = run_cli(c.args);
    EXPECT_NE(r.exit_code, 0) << c.args;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << c.args << "\n" << r.output;
    EXPECT_EQ(r.output.find("internal error"), std::string::npos) << r.output;
  }
}

}  // namespace
}  // namespace deepinfer
