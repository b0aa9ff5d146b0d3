// `deepinfer offline --check_structured_output` end to end: the DeepSeek-V3 golden model (random weights) with a
// ByteLevel BPE tokenizer.json written here (its 768 ids: <s>, </s> = the model's BOS/EOS, the 256 bytes and a
// few merges), so the checks run the real CLI path: tokenizer -> GrammarCompiler -> engine -> decode -> verify.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "test_util.h"

namespace deepinfer {
namespace {

// GPT-2's byte -> printable code point map (the ByteLevel alphabet), as UTF-8.
std::string byte_level_char(int b) {
  int cp = b;
  if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255))) {
    int n = 0;
    for (int x = 0; x < b; ++x)
      if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255))) ++n;
    cp = 256 + n;
  }
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

std::string byte_level_tokenizer_json() {
  nlohmann::ordered_json vocab = nlohmann::ordered_json::object();
  vocab["<s>"] = 0;  // the added tokens are in the model's vocabulary too, as in DeepSeek's tokenizer.json
  vocab["</s>"] = 1;
  for (int b = 0; b < 256; ++b) vocab[byte_level_char(b)] = 2 + b;
  nlohmann::ordered_json merges = nlohmann::ordered_json::array();
  int next = 258;
  for (const char* pair : {"{ \"", "\" :", "\" ,", "n a", "na m", "nam e", "a g", "ag e", "t r", "tr u", "tru e", "1 9",
                           "2 0", "e n", "z h"}) {
    std::string a(pair, std::strchr(pair, ' ')), b(std::strchr(pair, ' ') + 1);
    merges.push_back(a + " " + b);
    vocab[a + b] = next++;
  }
  // The model has 768 ids: the rest are plain tokens no merge produces (decodable, so unconstrained samples print).
  for (; next < 768; ++next) vocab["<unused" + std::to_string(next) + ">"] = next;
  auto added = [](int id, const char* content) {
    return nlohmann::ordered_json{{"id", id},        {"content", content},  {"single_word", false}, {"lstrip", false},
                                  {"rstrip", false}, {"normalized", false}, {"special", true}};
  };
  nlohmann::ordered_json j = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", {added(0, "<s>"), added(1, "</s>")}},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}}},
      {"post_processor", nullptr},
      {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr},
        {"fuse_unk", false},
        {"byte_fallback", false},
        {"vocab", vocab},
        {"merges", merges}}},
  };
  return j.dump();
}

// A model directory: the V3 golden config and weights (links) with the tokenizer above.
void make_model_dir(const testing::TempDir& dir) {
  const std::string golden = testing::test_data_dir() + "/golden/deepseek_v3";
  for (const char* f : {"config.json", "model.safetensors"})
    std::filesystem::create_symlink(golden + "/" + f, dir.file(f));
  testing::write_file(dir.file("tokenizer.json"), byte_level_tokenizer_json());
}

TEST(StructuredCheckCli, OfflineChecksPassOnTheGoldenModel) {
  testing::TempDir dir;
  make_model_dir(dir);
  const auto r = testing::run_cli("offline --model_name " + dir.path() +
                                  " --check_structured_output --max_model_len 1024 --max-tokens 4 --prompt 'hi'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("structured output checks: 9 passed, 0 failed"), std::string::npos) << r.output;
  for (const char* name : {"json_schema (greedy): PASS", "regex (t=0.8 seed=1): PASS", "ebnf (t=1.0 seed=2): PASS"})
    EXPECT_NE(r.output.find(name), std::string::npos) << name << "\n" << r.output;
  // The ordinary generation still runs afterwards on the same engine.
  EXPECT_NE(r.output.find("[sample 0]"), std::string::npos) << r.output;
}

// generate --json-schema / --regex / --grammar: every record's text (EOS stripped) satisfies the constraint.
TEST(StructuredCheckCli, GenerateWithConstraints) {
  testing::TempDir dir;
  make_model_dir(dir);
  testing::write_file(dir.file("schema.json"),
                      R"({"type":"object","properties":{"ok":{"type":"boolean"},"n":{"type":"integer","minimum":1,)"
                      R"("maximum":9}},"required":["ok","n"],"additionalProperties":false})");
  testing::write_file(dir.file("g.gbnf"), "root ::= (\"yes\" | \"no\") \"!\"{1,3}\n");
  const std::string base = "generate --model " + dir.path() +
                           " --prompt 'a' --prompt 'b c' --max-tokens 200 --temperature 0.9 --seed 4 --json ";
  struct Case {
    std::string flags;
    std::function<bool(const std::string&)> ok;
  };
  const std::vector<Case> cases = {
      {"--json-schema " + dir.file("schema.json"),
       [](const std::string& t) {
         auto v = nlohmann::json::parse(t, nullptr, false);
         return v.is_object() && v.size() == 2 && v["ok"].is_boolean() && v["n"].is_number() && v["n"] >= 1 &&
                v["n"] <= 9;
       }},
      {"--regex '[a-c]{2}[0-9]{1,3}'",
       [](const std::string& t) { return std::regex_match(t, std::regex("[a-c]{2}[0-9]{1,3}")); }},
      {"--grammar " + dir.file("g.gbnf"),
       [](const std::string& t) { return std::regex_match(t, std::regex("(yes|no)!{1,3}")); }},
  };
  for (const Case& c : cases) {
    const auto r = testing::run_cli(base + c.flags);
    ASSERT_EQ(r.exit_code, 0) << c.flags << "\n" << r.output;
    int records = 0;
    std::istringstream lines(r.output);
    for (std::string line; std::getline(lines, line);) {
      if (line.empty() || line[0] != '{') continue;
      const auto j = nlohmann::json::parse(line);
      ++records;
      EXPECT_EQ(j["finish_reason"], "eos") << line;
      std::string text = j["text"];
      ASSERT_TRUE(text.size() >= 4 && text.substr(text.size() - 4) == "</s>") << line;
      text.resize(text.size() - 4);
      EXPECT_TRUE(c.ok(text)) << c.flags << ": " << text;
    }
    EXPECT_EQ(records, 2) << r.output;
  }
  const std::vector<std::pair<std::string, std::string>> errors = {
      {"--regex a --json-object", "at most one of"},
      {"--json-schema " + dir.file("missing.json"), "cannot read"},
      {"--regex '(a'", "structured output (regex)"},
      {"--lenient-schema --regex a", "--lenient-schema applies to --json-schema only"},
  };
  for (const auto& [flags, message] : errors) {
    const auto r = testing::run_cli(base + flags);
    EXPECT_NE(r.exit_code, 0) << flags;
    EXPECT_NE(r.output.find(message), std::string::npos) << flags << "\n" << r.output;
  }
}

// structured-check: maskbench-format cases -> one JSON line per case and a summary; with --tokenizer the
// instances also go token by token through the masks.
TEST(StructuredCheckCli, CasesFileSummaries) {
  testing::TempDir dir;
  testing::write_file(dir.file("tokenizer.json"), byte_level_tokenizer_json());
  const std::string cases =
      R"({"id":"a","schema":{"type":"object","properties":{"name":{"type":"string"},"n":{"type":"integer"}},)"
      R"("required":["name"],"additionalProperties":false},"tests":[{"valid":true,"data":"{\n  \"name\": \"x\",\n  \"n\": 3\n}"},)"
      R"({"valid":false,"data":"{\"n\":3}"},{"valid":false,"data":"{\"name\":1}"}]})"
      "\n"
      R"({"id":"b","schema":{"not":{"type":"string"}},"tests":[{"valid":true,"data":"1"}]})"
      "\n"
      R"({"id":"c","schema":{"type":"strin"},"tests":[]})"
      "\n"
      R"({"id":"d","schema":{"enum":["x","y"]},"tests":[{"valid":true,"data":"\"y\""},{"valid":false,"data":"\"z\""}]})"
      "\n";
  testing::write_file(dir.file("cases.jsonl"), cases);
  for (const std::string extra : {std::string(), " --tokenizer " + dir.file("tokenizer.json") + " --eos '</s>'"}) {
    const auto r = testing::run_cli("structured-check --cases " + dir.file("cases.jsonl") + extra);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    std::map<std::string, nlohmann::json> lines;
    nlohmann::json summary;
    std::istringstream in(r.output);
    for (std::string line; std::getline(in, line);) {
      if (line.empty() || line[0] != '{') continue;
      auto j = nlohmann::json::parse(line);
      if (j.contains("summary"))
        summary = j;
      else
        lines[j["id"]] = j;
    }
    ASSERT_EQ(lines.size(), 4u) << r.output;
    EXPECT_EQ(summary["cases"], 4);
    EXPECT_EQ(summary["compiled"], 2);
    EXPECT_EQ(summary["unsupported"], 1);
    EXPECT_EQ(summary["invalid_schema"], 1);
    EXPECT_EQ(summary["valid"], 2);
    EXPECT_EQ(summary["valid_accepted"], 2);
    EXPECT_EQ(summary["invalid"], 3);
    EXPECT_EQ(summary["invalid_rejected"], 3);
    EXPECT_EQ(lines["b"]["code"], "Unsupported");
    EXPECT_NE(lines["c"]["error"].get<std::string>().find("strin"), std::string::npos);
    EXPECT_EQ(lines["a"]["instances"][0]["accepted_verbatim"], true);
    if (!extra.empty()) {
      EXPECT_EQ(summary["token_checked"], 5);
      EXPECT_EQ(summary["token_accepted"], 2) << "the two valid instances, through the masks";
      EXPECT_EQ(summary["mask_mismatches"], 0);
    }
  }
  const auto missing = testing::run_cli("structured-check --cases " + dir.file("nope.jsonl"));
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.output.find("cannot read"), std::string::npos) << missing.output;
}

}  // namespace
}  // namespace deepinfer
