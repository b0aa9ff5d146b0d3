// Tokenizer unit tests. Expected ids come from HF `tokenizers` via tools/make_tokenizer_fixtures.py
// (tests/data/tokenizer/expected.json); cases on DeepSeek-V3's tokenizer skip when ../shared is absent.
#include "deepinfer/tokenizer/tokenizer.h"

#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "deepinfer/core/error.h"
#include "deepinfer/core/thread_pool.h"
#include "deepinfer/io/checkpoint.h"
#include "deepinfer/tokenizer/byte_level.h"
#include "deepinfer/tokenizer/regex.h"
#include "deepinfer/tokenizer/utf8.h"
#include "test_util.h"

namespace deepinfer::tokenizer {
namespace {

using nlohmann::json;

std::string data_path(const std::string& name) { return testing::test_data_dir() + "/tokenizer/" + name; }

std::string v3_path() { return testing::shared_dir() + "/data/tokenizers/deepseek_v3/tokenizer.json"; }

// Loads each tokenizer once per test binary run (V3 takes a while to parse).
const Tokenizer* load(const std::string& name) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  auto it = cache.find(name);
  if (it != cache.end()) return it->second.get();
  std::string path;
  if (name.rfind("shared:", 0) == 0) {
    if (!testing::shared_available()) return nullptr;
    path = testing::shared_dir() + "/" + name.substr(7);
  } else {
    path = data_path(name);
  }
  return (cache[name] = Tokenizer::from_file(path)).get();
}

TEST(TokenizerFixtures, IdsAndDecodeMatchTokenizers) {
  const json expected = json::parse(read_text_file(data_path("expected.json")));
  int checked = 0, skipped = 0;
  for (const json& c : expected["cases"]) {
    const Tokenizer* tok = load(c["tokenizer"]);
    if (!tok) {
      ++skipped;
      continue;
    }
    const std::string text = c["text"];
    const auto mode = c["mode"] == "recognize" ? SpecialTokenMode::kRecognize : SpecialTokenMode::kSpecialAsText;
    const auto want = c["ids"].get<std::vector<int32_t>>();
    const auto got = tok->encode(text, mode);
    EXPECT_EQ(got, want) << c["tokenizer"] << " " << c["mode"] << " text: " << json(text).dump();
    EXPECT_EQ(tok->decode(want), c["decoded"].get<std::string>()) << json(text).dump();
    EXPECT_EQ(tok->decode(want, true), c["decoded_skip_special"].get<std::string>()) << json(text).dump();
    ++checked;
  }
  EXPECT_GT(checked, 300);
  if (skipped) std::printf("skipped %d DeepSeek-V3 cases (../shared absent)\n", skipped);
}

TEST(TokenizerFixtures, PairAndStringMergesAreEquivalent) {
  const Tokenizer* a = load("synthetic_bpe.json");
  const Tokenizer* b = load("synthetic_bpe_pairs.json");
  for (const char* text : {"abc aab aaab abab", "Hello world", "hello12345", "aaaaaaab"}) {
    EXPECT_EQ(a->encode(text), b->encode(text)) << text;
  }
}

TEST(TokenizerV3, SpecialTokensAndModes) {
  if (!testing::shared_available()) GTEST_SKIP() << "../shared absent";
  const Tokenizer* tok = load("shared:data/tokenizers/deepseek_v3/tokenizer.json");
  EXPECT_EQ(tok->vocab_size(), 128815);
  EXPECT_EQ(tok->token_to_id("<｜begin▁of▁sentence｜>"), 0);
  EXPECT_EQ(tok->token_to_id("<｜User｜>"), 128803);
  EXPECT_TRUE(tok->is_special(0));
  EXPECT_FALSE(tok->is_special(128806));  // <｜tool▁calls▁begin｜> is added but not special
  // kAllAsText: no added token is recognised, so "<｜User｜>" becomes ordinary pieces.
  const auto as_text = tok->encode("<｜User｜>", SpecialTokenMode::kAllAsText);
  EXPECT_GT(as_text.size(), 1u);
  EXPECT_EQ(tok->decode(as_text), "<｜User｜>");
  EXPECT_EQ(tok->encode("<｜User｜>"), std::vector<int32_t>{128803});
}

TEST(TokenizerV3, AdversarialInputs) {
  if (!testing::shared_available()) GTEST_SKIP() << "../shared absent";
  const Tokenizer* tok = load("shared:data/tokenizers/deepseek_v3/tokenizer.json");
  for (const std::string& text : {std::string(1 << 20, 'a'), std::string(100000, ' '), std::string(100000, '\n'),
                                  std::string(30000, '1') + "x", std::string("\xff\xfe\xc0\xaf\xed\xa0\x80 ok")}) {
    const auto ids = tok->encode(text);
    EXPECT_FALSE(ids.empty());
    EXPECT_EQ(tok->decode(ids), sanitize_utf8(text));
  }
  // Invalid UTF-8 is repaired exactly like Python's errors="replace" (one U+FFFD per maximal subpart).
  EXPECT_EQ(tok->encode("a\xe0\x80z"), tok->encode("a\xef\xbf\xbd\xef\xbf\xbdz"));
}

TEST(TokenizerBatch, EqualsSequentialEncode) {
  const Tokenizer* tok = load("synthetic_bpe.json");
  std::vector<std::string> texts;
  for (int i = 0; i < 200; ++i)
    texts.push_back(std::string(i % 17, 'a') + " Hello world 12345 <s> ab" + std::to_string(i) +
                    std::string(i % 5, '\n'));
  ThreadPool pool(4);
  const auto batch = tok->encode_batch(texts, pool);
  ASSERT_EQ(batch.size(), texts.size());
  for (size_t i = 0; i < texts.size(); ++i) EXPECT_EQ(batch[i], tok->encode(texts[i])) << i;
}

TEST(TokenizerDecode, UnknownIdIsAnError) {
  const Tokenizer* tok = load("synthetic_bpe.json");
  const std::vector<int32_t> bad = {97, 5000};
  EXPECT_THROW(tok->decode(bad), Error);
  const std::vector<int32_t> negative = {-1};
  EXPECT_THROW(tok->decode(negative), Error);
  const std::vector<int32_t> gap = {1008};  // between the added ids 1000..1007 and nothing
  EXPECT_THROW(tok->decode(gap), Error);
}

TEST(TokenizerUtf8, MaximalSubpartReplacement) {
  // Expected strings are Python's bytes.decode("utf-8", "replace").
  const std::string r = "\xef\xbf\xbd";
  EXPECT_EQ(sanitize_utf8("\x80"), r);
  EXPECT_EQ(sanitize_utf8("\xe0\x80\xaf"), r + r + r);
  EXPECT_EQ(sanitize_utf8("\xe2\x82"), r);
  EXPECT_EQ(sanitize_utf8("\xe2\x82z"), r + "z");
  EXPECT_EQ(sanitize_utf8("\xf0\x9f\x98"), r);
  EXPECT_EQ(sanitize_utf8("\xed\xa0\x80"), r + r + r);
  EXPECT_EQ(sanitize_utf8("\xf4\x90\x80\x80"), r + r + r + r);
  EXPECT_EQ(sanitize_utf8("ok\xc3\xa9"), "ok\xc3\xa9");
  EXPECT_EQ(utf8_stable_prefix("ab\xf0\x9f\x98"), 2u);
  EXPECT_EQ(utf8_stable_prefix("ab\xf0\x9f\x98\x80"), 6u);
  EXPECT_EQ(utf8_stable_prefix("ab\xe0\x80"), 4u);  // can never complete: final now
}

TEST(TokenizerByteLevel, AlphabetRoundTrip) {
  EXPECT_EQ(byte_to_char(' '), 0x120u);
  EXPECT_EQ(byte_to_char('\n'), 0x10Au);
  EXPECT_EQ(byte_to_char('a'), static_cast<char32_t>('a'));
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  EXPECT_EQ(alphabet_to_bytes(bytes_to_alphabet(all)), all);
  // A token with a code point outside the alphabet decodes to its own UTF-8 (HF keeps added tokens so).
  EXPECT_EQ(alphabet_to_bytes("<｜User｜>"), "<｜User｜>");
}

TEST(TokenizerRegex, OnigurumaWhiteSpace) {
  // Oniguruma's \s is White_Space: U+180E is not in it, U+3000 and U+0085 are.
  Regex re("\\s+");
  std::vector<Span> m;
  re.find_all(
      "a\xe1\xa0\x8e"
      "b\xe3\x80\x80"
      "c\xc2\x85",
      &m);
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0], Span(5, 8));
  EXPECT_EQ(m[1], Span(9, 11));
}

// Malformed tokenizer.json: the error names the field.
std::string load_error(const std::string& text) {
  try {
    Tokenizer::from_json(text);
  } catch (const Error& e) {
    return e.message();
  }
  return "(no error)";
}

TEST(TokenizerJson, MalformedFilesNameTheField) {
  json good = json::parse(read_text_file(data_path("synthetic_bpe.json")));
  EXPECT_NO_THROW(Tokenizer::from_json(good.dump()));
  EXPECT_NE(load_error("{not json").find("not valid JSON"), std::string::npos);
  // A number JSON allows but no double holds (fuzz_tokenizer_json found it escaping as an uncaught out_of_range).
  EXPECT_NE(load_error("{\"model\": {\"vocab\": {\"a\": 1" + std::string(400, '5') + "}}}").find("not valid JSON"),
            std::string::npos);
  EXPECT_NE(load_error("[1e999]").find("not valid JSON"), std::string::npos);
  EXPECT_NE(load_error("{}").find("model is missing"), std::string::npos);

  json j = good;
  j["model"]["merges"][3] = "a";
  EXPECT_NE(load_error(j.dump()).find("model.merges[3]"), std::string::npos);
  j = good;
  j["model"]["merges"][2] = json::array({"zz", "q"});
  EXPECT_NE(load_error(j.dump()).find("model.merges[2]: token \"zz\""), std::string::npos);
  j = good;
  j["model"]["merges"][1] = 7;
  EXPECT_NE(load_error(j.dump()).find("model.merges[1]"), std::string::npos);
  j = good;
  j["model"]["vocab"]["a"] = "x";
  EXPECT_NE(load_error(j.dump()).find("model.vocab[\"a\"]"), std::string::npos);
  j = good;
  j["model"]["vocab"]["b"] = 97;
  EXPECT_NE(load_error(j.dump()).find("id 97 is used by both"), std::string::npos);
  j = good;  // an id far past the entries would size the id table by itself (the fuzzer's out-of-memory input)
  j["model"]["vocab"]["b"] = (int64_t{1} << 31) - 1;
  EXPECT_NE(load_error(j.dump()).find("id 2147483647 leaves more than 1048576 ids unused"), std::string::npos);
  j = good;
  j["added_tokens"][1].erase("content");
  EXPECT_NE(load_error(j.dump()).find("added_tokens[1].content"), std::string::npos);
  j = good;
  j["added_tokens"][0]["special"] = "yes";
  EXPECT_NE(load_error(j.dump()).find("added_tokens[0].special"), std::string::npos);
  j = good;
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"] = json{{"Regex", "(unclosed"}};
  EXPECT_NE(load_error(j.dump()).find("invalid regex"), std::string::npos);
  j = good;
  j["pre_tokenizer"]["pretokenizers"][1]["behavior"] = "Sideways";
  EXPECT_NE(load_error(j.dump()).find("pre_tokenizer.pretokenizers[1].behavior"), std::string::npos);
  j = good;
  j["pre_tokenizer"]["pretokenizers"][0]["type"] = "Metaspace";
  EXPECT_NE(load_error(j.dump()).find("pre_tokenizer.pretokenizers[0].type \"Metaspace\""), std::string::npos);
  j = good;
  j["normalizer"] = json{{"type", "Precompiled"}};
  EXPECT_NE(load_error(j.dump()).find("normalizer.type \"Precompiled\""), std::string::npos);
  j = good;
  j["model"]["type"] = "Unigram";
  EXPECT_NE(load_error(j.dump()).find("model.type \"Unigram\""), std::string::npos);
  j = good;
  j["decoder"] = json{{"type", "WordPiece"}};
  EXPECT_NE(load_error(j.dump()).find("decoder.type"), std::string::npos);

  try {
    Tokenizer::from_file("/nonexistent/tokenizer.json");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNotFound);
  }
}

}  // namespace
}  // namespace deepinfer::tokenizer
