// Streaming detokenizer and the Engram compressed-id map.
#include <gtest/gtest.h>

#include <random>

#include "deepinfer/io/safetensors.h"
#include "deepinfer/tokenizer/engram_map.h"
#include "deepinfer/tokenizer/stream_decoder.h"
#include "deepinfer/tokenizer/tokenizer.h"
#include "deepinfer/tokenizer/utf8.h"
#include "test_util.h"

namespace deepinfer::tokenizer {
namespace {

std::string data_path(const std::string& name) { return testing::test_data_dir() + "/tokenizer/" + name; }

// Streams ids and checks: every chunk is valid UTF-8, and the chunks add up to decode().
void expect_stream_equals_decode(const Tokenizer& tok, const std::vector<int32_t>& ids, bool skip_special) {
  StreamDecoder stream(tok, skip_special);
  std::string joined;
  for (int32_t id : ids) {
    const std::string chunk = stream.step(id);
    EXPECT_TRUE(is_valid_utf8(chunk));
    joined += chunk;
  }
  joined += stream.finish();
  EXPECT_EQ(joined, tok.decode(ids, skip_special));
}

TEST(TokenizerStream, ChunksAreValidUtf8AndSumToDecode) {
  auto tok = Tokenizer::from_file(data_path("synthetic_bpe.json"));
  // Byte tokens that split characters: "é" = C3 A9, "😀" = F0 9F 98 80 (ids are the bytes in this vocab).
  const std::vector<int32_t> split = {'a', 0xC3, 0xA9, 0xF0, 0x9F, 0x98, 0x80, 'b'};
  expect_stream_equals_decode(*tok, split, false);
  StreamDecoder stream(*tok);
  EXPECT_EQ(stream.step(0xF0), "");
  EXPECT_EQ(stream.pending_bytes(), 1u);
  EXPECT_EQ(stream.step(0x9F), "");
  EXPECT_EQ(stream.step(0x98), "");
  EXPECT_EQ(stream.step(0x80), "\xF0\x9F\x98\x80");
  // A broken sequence becomes U+FFFD as soon as it cannot complete, and at finish().
  EXPECT_EQ(stream.step(0xE2), "");
  EXPECT_EQ(stream.step('x'), "\xEF\xBF\xBDx");
  EXPECT_EQ(stream.step(0xE2), "");
  EXPECT_EQ(stream.finish(), "\xEF\xBF\xBD");
  // Unknown ids throw and leave the state alone.
  EXPECT_THROW(stream.step(99999), Error);
  // Random id sequences, with and without skipping special tokens (ids 283.. are added tokens).
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<int32_t> ids;
    for (int k = 0; k < 30; ++k) ids.push_back(static_cast<int32_t>(rng() % tok->vocab_size()));
    expect_stream_equals_decode(*tok, ids, trial % 2 == 0);
  }
}

TEST(TokenizerStream, V3SpecialTokensAndText) {
  if (!testing::shared_available()) GTEST_SKIP() << "../shared absent";
  auto tok = Tokenizer::from_file(testing::shared_dir() + "/data/tokenizers/deepseek_v3/tokenizer.json");
  const auto ids = tok->encode("<｜User｜>你好 😀 naïve<｜Assistant｜><｜tool▁sep｜>\nok😀😀<｜end▁of▁sentence｜>");
  expect_stream_equals_decode(*tok, ids, false);
  expect_stream_equals_decode(*tok, ids, true);
  StreamDecoder skip(*tok, true);
  std::string text;
  for (int32_t id : ids) text += skip.step(id);
  text += skip.finish();
  EXPECT_EQ(text.find("<｜end▁of▁sentence｜>"), std::string::npos);  // special: skipped
  EXPECT_NE(text.find("<｜User｜>"), std::string::npos);  // added but not special in V3: kept
}

TEST(TokenizerEngram, NormalizedKeys) {
  EXPECT_EQ(engram_normalize(" The"), "the");
  EXPECT_EQ(engram_normalize("THE"), "the");
  EXPECT_EQ(engram_normalize("Ｃafé"), "cafe");
  EXPECT_EQ(engram_normalize(" "), " ");  // a lone space survives Strip (sentinel)
  EXPECT_EQ(engram_normalize("\t\n "), " ");
  EXPECT_EQ(engram_normalize("a \t b "), "a b");
  EXPECT_EQ(engram_normalize("ﬁ"), "fi");
}

TEST(TokenizerEngram, MatchesGoldenV41TokenMap) {
  if (!testing::shared_available()) GTEST_SKIP() << "../shared absent";
  auto tok = Tokenizer::from_file(data_path("golden_v41_wordlevel.json"));
  const EngramTokenMap map = build_engram_token_map(*tok);
  auto golden = SafetensorsFile::open(testing::shared_dir() + "/golden/deepseek_v41/golden.safetensors");
  const Tensor want = golden->tensor("engram.token_map");
  ASSERT_EQ(want.numel(), static_cast<int64_t>(map.class_of.size()));
  const auto* w = static_cast<const int64_t*>(want.data());
  for (size_t i = 0; i < map.class_of.size(); ++i) EXPECT_EQ(map.class_of[i], w[i]) << "token " << i;
  EXPECT_EQ(map.num_classes, 256);  // engram_compressed_vocab_size in the golden config
}

}  // namespace
}  // namespace deepinfer::tokenizer
