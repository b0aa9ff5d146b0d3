// SampleOutput: token deltas → client text (incremental detokenization, stop strings cut, reasoning / content /
// tool calls split by the model's chat parser), checked for every way of splitting the stream.
#include "deepinfer/server/sample_output.h"

#include <gtest/gtest.h>

#include "test_util.h"

namespace deepinfer::server {
namespace {

std::unique_ptr<tokenizer::Tokenizer> bpe() {
  return tokenizer::Tokenizer::from_file(testing::test_data_dir() + "/tokenizer/synthetic_bpe.json");
}

struct Collected {
  std::string reasoning, content;
  std::vector<tokenizer::ParsedToolCall> calls;
  std::string finish;
};

// Every piece the client gets is whole UTF-8 (a token that ends inside a character waits for the rest).
bool valid_utf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    i += n;
  }
  return true;
}

// Streams `ids` in deltas of `chunk` tokens; the last delta is final with `reason`.
Collected run(const SampleOutputOptions& o, const std::vector<int32_t>& ids, size_t chunk, StopReason reason,
              const std::string& stop_string = {}) {
  SampleOutput out(o);
  Collected c;
  for (size_t i = 0; i < ids.size(); i += chunk) {
    SequenceDelta d;
    d.new_token_ids.assign(ids.begin() + i, ids.begin() + std::min(ids.size(), i + chunk));
    d.finished = i + chunk >= ids.size();
    if (d.finished) {
      d.stop_reason = reason;
      d.stop_string = stop_string;
    }
    auto delta = out.feed(d);
    EXPECT_TRUE(valid_utf8(delta.content)) << "chunk " << chunk << " at token " << i;
    EXPECT_TRUE(valid_utf8(delta.reasoning)) << "chunk " << chunk << " at token " << i;
    c.reasoning += delta.reasoning;
    c.content += delta.content;
    for (auto& t : delta.tool_calls) c.calls.push_back(t);
  }
  c.finish = out.finish_reason();
  EXPECT_TRUE(out.finished());
  return c;
}

TEST(SampleOutput, PlainTextIsTheDecodeForEverySplit) {
  auto tok = bpe();
  const std::string text = "Hello wörld, 日本 and more text 🙂 ÿ";
  auto ids = tok->encode(text);
  // The byte-level vocabulary splits some of these characters over several tokens.
  int partial = 0;
  for (auto id : ids) partial += !valid_utf8(tok->token_bytes(id));
  EXPECT_GT(partial, 0) << "the test needs tokens that end inside a character";
  SampleOutputOptions o;
  o.tok = tok.get();
  for (size_t chunk : {1u, 2u, 3u, 100u}) {
    auto c = run(o, ids, chunk, StopReason::kMaxTokens);
    EXPECT_EQ(c.content, tok->decode(ids, true)) << chunk;
    EXPECT_EQ(c.finish, "length");
  }
}

TEST(SampleOutput, StopStringAndWhatFollowsAreCut) {
  auto tok = bpe();
  auto ids = tok->encode("one two STOP three");
  SampleOutputOptions o;
  o.tok = tok.get();
  o.stop = {"STOP"};
  for (size_t chunk : {1u, 2u, 50u}) {
    // The engine reports the stop once the token completing it arrives; here that is the last token fed.
    std::vector<int32_t> upto;
    std::string acc;
    for (int32_t id : ids) {
      upto.push_back(id);
      if (tok->decode(upto).find("STOP") != std::string::npos) break;
    }
    auto c = run(o, upto, chunk, StopReason::kStopString, "STOP");
    EXPECT_EQ(c.content, "one two ") << chunk;
    EXPECT_EQ(c.finish, "stop");
  }
}

TEST(SampleOutput, ChatSplitsReasoningContentAndToolCalls) {
  auto tok = bpe();
  const std::string text =
      "\nLet me think.\n</think>The answer is\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"get_weather\">\n"
      "<｜DSML｜ parameter name=\"city\" string=\"true\">Paris</｜DSML｜ parameter>\n"
      "<｜DSML｜ parameter name=\"days\" string=\"false\">3</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ "
      "calls>";
  auto ids = tok->encode(text);
  SampleOutputOptions o;
  o.tok = tok.get();
  o.chat = true;
  o.format = tokenizer::ChatFormat::kV41;
  o.thinking = true;
  o.skip_special_tokens = false;
  for (size_t chunk : {1u, 3u, 1000u}) {
    auto c = run(o, ids, chunk, StopReason::kEos);
    EXPECT_EQ(c.reasoning, "Let me think.") << chunk;
    EXPECT_EQ(c.content, "The answer is") << chunk;
    ASSERT_EQ(c.calls.size(), 1u) << chunk;
    EXPECT_EQ(c.calls[0].name, "get_weather");
    EXPECT_EQ(c.calls[0].arguments, "{\"city\": \"Paris\", \"days\": 3}");
    EXPECT_EQ(c.finish, "tool_calls");
  }
}

TEST(SampleOutput, EosTokenIsNotText) {
  auto tok = bpe();
  auto ids = tok->encode("abc");
  const int32_t eos = tok->encode("<s>")[0];
  ids.push_back(eos);
  SampleOutputOptions o;
  o.tok = tok.get();
  o.skip_special_tokens = false;
  o.eos_token_ids = {eos};
  auto c = run(o, ids, 1, StopReason::kEos);
  EXPECT_EQ(c.content, "abc");
  EXPECT_EQ(c.finish, "stop");
}

}  // namespace
}  // namespace deepinfer::server
