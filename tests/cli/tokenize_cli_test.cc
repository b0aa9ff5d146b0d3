// `deepinfer tokenize` end to end through the real binary: stdin lines → one JSON id array per line, --decode,
// --no-special, and its errors. Expected ids are HF `tokenizers`' (tests/data/tokenizer/expected.json); the
// DeepSeek-V3 cases skip when ../shared is absent.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "deepinfer/io/checkpoint.h"
#include "deepinfer/tokenizer/tokenizer.h"
#include "test_util.h"

namespace deepinfer {
namespace {

using nlohmann::json;
using testing::run_cli;
using testing::TempDir;

std::string synthetic() { return testing::test_data_dir() + "/tokenizer/synthetic_bpe.json"; }

// The output lines, without log lines (run_cli merges stderr; the synthetic file's odd ids draw warnings).
std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start < s.size()) {
    size_t end = s.find('\n', start);
    if (end == std::string::npos) end = s.size();
    const std::string line = s.substr(start, end - start);
    if (line.find("] [warning] ") == std::string::npos) out.push_back(line);
    start = end + 1;
  }
  return out;
}

// Every single-line "recognize" case of `tokenizer` in expected.json, through one stdin run.
void check_stdin_against_fixture(const std::string& fixture_name, const std::string& path) {
  const json expected = json::parse(read_text_file(testing::test_data_dir() + "/tokenizer/expected.json"));
  std::string input;
  std::vector<json> want;
  for (const json& c : expected["cases"]) {
    const std::string text = c["text"];
    if (c["tokenizer"] != fixture_name || c["mode"] != "recognize" || text.find_first_of("\r\n") != std::string::npos)
      continue;
    input += text + "\n";
    want.push_back(c["ids"]);
  }
  ASSERT_GE(want.size(), 10u);
  TempDir d;
  testing::write_file(d.file("in.txt"), input);
  auto r = run_cli("tokenize --tokenizer '" + path + "' < " + d.file("in.txt"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto got = lines_of(r.output);
  ASSERT_EQ(got.size(), want.size()) << r.output;
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(json::parse(got[i]), want[i]) << "line " << i;
}

TEST(TokenizeCli, StdinLinesGiveTheReferenceIds) { check_stdin_against_fixture("synthetic_bpe.json", synthetic()); }

TEST(TokenizeCli, StdinLinesGiveTheReferenceIdsForDeepSeekV3) {
  if (!testing::shared_available()) GTEST_SKIP() << "../shared absent";
  check_stdin_against_fixture("shared:data/tokenizers/deepseek_v3/tokenizer.json",
                              testing::shared_dir() + "/data/tokenizers/deepseek_v3/tokenizer.json");
}

TEST(TokenizeCli, DecodeAndNoSpecial) {
  if (!testing::shared_available()) GTEST_SKIP() << "../shared absent";
  const std::string path = testing::shared_dir() + "/data/tokenizers/deepseek_v3/tokenizer.json";
  auto tok = tokenizer::Tokenizer::from_file(path);
  // <｜User｜> is an added token that is not special; <｜end▁of▁sentence｜> is special.
  const std::string text = "Hi<｜User｜>你好<｜end▁of▁sentence｜> 123";
  TempDir d;
  testing::write_file(d.file("in.txt"), text + "\n");

  auto plain = run_cli("tokenize --tokenizer '" + path + "' < " + d.file("in.txt"));
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  const auto ids = json::parse(lines_of(plain.output).at(0)).get<std::vector<int32_t>>();
  EXPECT_EQ(ids, tok->encode(text));
  EXPECT_NE(std::find(ids.begin(), ids.end(), *tok->token_to_id("<｜User｜>")), ids.end());

  // --no-special: the spelling of the added token is text.
  auto no_special = run_cli("tokenize --no-special --tokenizer '" + path + "' < " + d.file("in.txt"));
  ASSERT_EQ(no_special.exit_code, 0) << no_special.output;
  const auto text_ids = json::parse(lines_of(no_special.output).at(0)).get<std::vector<int32_t>>();
  EXPECT_EQ(text_ids, tok->encode(text, tokenizer::SpecialTokenMode::kAllAsText));
  EXPECT_EQ(std::find(text_ids.begin(), text_ids.end(), *tok->token_to_id("<｜User｜>")), text_ids.end());
  EXPECT_GT(text_ids.size(), ids.size());

  // --decode reverses it ("1,2,3" or a JSON array); --skip-special drops only special tokens.
  std::string list;
  for (int32_t id : ids) list += (list.empty() ? "" : ",") + std::to_string(id);
  auto dec = run_cli("tokenize --tokenizer '" + path + "' --decode " + list);
  ASSERT_EQ(dec.exit_code, 0) << dec.output;
  EXPECT_EQ(dec.output, text + "\n");
  auto skip = run_cli("tokenize --tokenizer '" + path + "' --skip-special --decode '" + json(ids).dump() + "'");
  ASSERT_EQ(skip.exit_code, 0) << skip.output;
  EXPECT_EQ(skip.output, "Hi<｜User｜>你好 123\n");
}

TEST(TokenizeCli, ErrorsNameTheProblem) {
  TempDir d;
  auto missing = run_cli("tokenize --tokenizer " + d.file("nope.json") + " --text hi");
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.output.find("nope.json"), std::string::npos) << missing.output;

  json j = json::parse(read_text_file(synthetic()));
  j["added_tokens"][0]["content"] = 7;
  testing::write_file(d.file("bad.json"), j.dump());
  auto malformed = run_cli("tokenize --tokenizer " + d.file("bad.json") + " --text hi");
  EXPECT_EQ(malformed.exit_code, 2) << malformed.output;
  EXPECT_NE(malformed.output.find("added_tokens[0].content must be a string"), std::string::npos) << malformed.output;

  testing::write_file(d.file("broken.json"), "{\"model\": ");
  auto broken = run_cli("tokenize --tokenizer " + d.file("broken.json") + " --text hi");
  EXPECT_EQ(broken.exit_code, 2) << broken.output;
  EXPECT_NE(broken.output.find("not valid JSON"), std::string::npos) << broken.output;

  auto bad_id = run_cli("tokenize --tokenizer " + synthetic() + " --decode 1,99999999");
  EXPECT_NE(bad_id.exit_code, 0);
  EXPECT_NE(bad_id.output.find("token id 99999999"), std::string::npos) << bad_id.output;
  auto negative = run_cli("tokenize --tokenizer " + synthetic() + " --decode -3");
  EXPECT_NE(negative.exit_code, 0);
  EXPECT_NE(negative.output.find("token id -3"), std::string::npos) << negative.output;
  auto wraps = run_cli("tokenize --tokenizer " + synthetic() + " --decode 4294967297");  // not read as id 1
  EXPECT_EQ(wraps.exit_code, 2) << wraps.output;
  EXPECT_NE(wraps.output.find("'4294967297' is not a token id"), std::string::npos) << wraps.output;
  auto not_a_number = run_cli("tokenize --tokenizer " + synthetic() + " --decode 1,x");
  EXPECT_EQ(not_a_number.exit_code, 2) << not_a_number.output;
  EXPECT_NE(not_a_number.output.find("'x' is not a token id"), std::string::npos) << not_a_number.output;

  auto no_source = run_cli("tokenize --text hi");
  EXPECT_NE(no_source.exit_code, 0);
  EXPECT_NE(no_source.output.find("--tokenizer"), std::string::npos) << no_source.output;
}

}  // namespace
}  // namespace deepinfer
