// Chat encoders and the output parser against tests/data/tokenizer/chat_expected.json (tools/make_chat_fixtures.py:
// V4/V4.1 from deepseek-recipe, V3/V3.1 from DeepSeek's chat templates run by jinja2).
#include "deepinfer/tokenizer/chat_encoding.h"

#include <gtest/gtest.h>

#include <random>

#include <fstream>
#include <nlohmann/json.hpp>

#include "deepinfer/core/error.h"
#include "deepinfer/tokenizer/chat_output_parser.h"
#include "test_util.h"

namespace deepinfer::tokenizer {
namespace {

using nlohmann::ordered_json;

const ordered_json& fixtures() {
  static ordered_json j = [] {
    std::ifstream f(testing::test_data_dir() + "/tokenizer/chat_expected.json");
    return ordered_json::parse(f);
  }();
  return j;
}

std::string first_diff(const std::string& a, const std::string& b) {
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  size_t s = i > 60 ? i - 60 : 0;
  return "at byte " + std::to_string(i) + "\n  got:      " + a.substr(s, 160) + "\n  expected: " + b.substr(s, 160);
}

void check_format(const char* key, ChatFormat format) {
  int n = 0, bad = 0;
  ChatParseOptions opts;
  opts.require_json_object_arguments = false;
  for (const auto& c : fixtures()["cases"]) {
    if (!c.contains(key)) continue;
    ++n;
    ChatRequest req = parse_chat_request(c["conversation"], opts);
    RenderedPrompt p = render_chat(req, format);
    const auto& want = c[key];
    bool ok = p.text == want["text"].get<std::string>();
    if (ok && want.contains("special_ranges")) {
      std::vector<std::pair<size_t, size_t>> ranges;
      for (const auto& r : want["special_ranges"]) ranges.emplace_back(r[0].get<size_t>(), r[1].get<size_t>());
      ok = ranges == p.special_ranges;
      if (!ok && bad < 3) ADD_FAILURE() << key << " case " << n - 1 << ": special ranges differ";
    } else if (!ok && bad < 3) {
      ADD_FAILURE() << key << " case " << n - 1 << ": " << first_diff(p.text, want["text"].get<std::string>());
    }
    bad += !ok;
  }
  std::printf("%s: %d/%d conversations exact\n", key, n - bad, n);
  EXPECT_EQ(bad, 0);
}

TEST(ChatEncoding, V3MatchesTemplate) { check_format("v3", ChatFormat::kV3); }
TEST(ChatEncoding, V31MatchesTemplate) { check_format("v31", ChatFormat::kV31); }
TEST(ChatEncoding, V4MatchesDeepseekRecipe) { check_format("v4", ChatFormat::kV4); }
TEST(ChatEncoding, V41MatchesDeepseekRecipe) { check_format("v41", ChatFormat::kV41); }

std::string error_of(const char* json) {
  try {
    parse_chat_request(ordered_json::parse(json));
  } catch (const Error& e) {
    return e.message();
  }
  return "";
}

TEST(ChatEncoding, MalformedMessagesAreClearErrors) {
  EXPECT_NE(error_of(R"([{"role": "robot", "content": "x"}])").find("messages[0]: unknown role \"robot\""),
            std::string::npos);
  EXPECT_NE(error_of(R"([{"role": "assistant", "content": null, "tool_calls": [{"function": {"arguments": "{}"}}]}])")
                .find("messages[0].tool_calls[0]: missing function name"),
            std::string::npos);
  EXPECT_NE(error_of(R"([{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{x"}}]}])")
                .find("messages[0].tool_calls[0].arguments: not a JSON object"),
            std::string::npos);
  EXPECT_NE(error_of(R"([{"role": "user"}])").find("messages[0]: content must be a string"), std::string::npos);
  EXPECT_NE(error_of(R"({"messages": [], "reasoning_effort": "extreme"})").find("reasoning_effort"), std::string::npos);
  EXPECT_THROW(parse_chat_format("v5"), Error);
}

// Streamed tool calls put back together: name from the first piece, arguments concatenated.
std::vector<ParsedToolCall> reassemble(const std::vector<ToolCallDelta>& deltas) {
  std::vector<ParsedToolCall> calls;
  for (const auto& d : deltas) {
    if (d.index == static_cast<int>(calls.size())) {
      calls.push_back({d.name, ""});
    } else {
      EXPECT_TRUE(d.name.empty()) << "only a call's first piece names it";
      EXPECT_LT(d.index, static_cast<int>(calls.size())) << "calls stream in order";
      if (d.index >= static_cast<int>(calls.size())) continue;
    }
    calls[static_cast<size_t>(d.index)].arguments += d.arguments;
  }
  return calls;
}

ChatDelta run_parser(ChatFormat format, bool thinking, std::string_view out, size_t piece) {
  ChatOutputParser p(format, thinking);
  ChatDelta total;
  auto add = [&](ChatDelta d) {
    total.reasoning += d.reasoning;
    total.content += d.content;
    for (auto& c : d.tool_calls) total.tool_calls.push_back(std::move(c));
    for (auto& c : d.tool_call_deltas) total.tool_call_deltas.push_back(std::move(c));
  };
  for (size_t i = 0; i < out.size(); i += piece) add(p.feed(out.substr(i, piece)));
  add(p.finish());
  // Whenever the block closed, the streamed calls add up to the complete ones, at every split.
  if (!total.tool_calls.empty()) {
    std::vector<ParsedToolCall> streamed = reassemble(total.tool_call_deltas);
    EXPECT_EQ(streamed.size(), total.tool_calls.size()) << "piece " << piece << ": " << out;
    for (size_t i = 0; i < std::min(streamed.size(), total.tool_calls.size()); ++i) {
      EXPECT_EQ(streamed[i].name, total.tool_calls[i].name) << "piece " << piece << ": " << out;
      EXPECT_EQ(streamed[i].arguments, total.tool_calls[i].arguments) << "piece " << piece << ": " << out;
    }
  }
  return total;
}

// Feeds `out` one byte at a time and returns the tool-call pieces that came out before the block closed.
std::vector<ToolCallDelta> pieces_before_close(ChatFormat format, std::string_view out) {
  ChatOutputParser p(format, false);
  std::vector<ToolCallDelta> early;
  for (char ch : out) {
    ChatDelta d = p.feed(std::string_view(&ch, 1));
    if (!d.tool_calls.empty()) break;
    for (auto& c : d.tool_call_deltas) early.push_back(std::move(c));
  }
  return early;
}

// Random well-formed tool-call blocks (any number of calls and parameters; values with quotes, backslashes,
// newlines, multi-byte characters, JSON and not-quite-JSON) fed at random splits: the streamed pieces always add
// up to the complete calls (run_parser checks it) and every piece is whole UTF-8.
TEST(ChatOutputParser, StreamedToolCallsAddUpOnRandomBlocks) {
  std::mt19937 rng(7);
  const std::vector<std::string> atoms = {"a",    "Z",    " ", "\"", "\\", "\n",  "\t",   "{",   "}", "[1, 2]", "é",
                                          "日本", "🙂", "<", "</", "｜", "```", "null", "3.5", "-", ":"};
  auto value = [&] {
    std::string v;
    for (int i = static_cast<int>(rng() % 6); i > 0; --i) v += atoms[rng() % atoms.size()];
    return v;
  };
  for (int iter = 0; iter < 300; ++iter) {
    const bool dsml = iter % 2 == 0;
    const bool v41 = iter % 4 == 0;
    std::string out = "pre";
    const int ncalls = 1 + static_cast<int>(rng() % 3);
    if (dsml) {
      const std::string sp = v41 ? " " : "";
      out += "\n\n<｜DSML｜" + std::string(v41 ? " calls" : "tool_calls") + ">\n";
      for (int c = 0; c < ncalls; ++c) {
        out += "<｜DSML｜" + sp + "invoke name=\"f" + std::to_string(c) + "\">\n";
        for (int k = static_cast<int>(rng() % 4); k > 0; --k) {
          const bool str = rng() % 2;
          std::string v =
              str ? value() : std::vector<std::string>{"1", "[1, {\"a\": null}]", "true", "x y", ""}[rng() % 5];
          out += "<｜DSML｜" + sp + "parameter name=\"p" + std::to_string(k) + "\" string=\"" +
                 (str ? "true" : "false") + "\">" + v + "</｜DSML｜" + sp + "parameter>\n";
        }
        out += "</｜DSML｜" + sp + "invoke>\n";
      }
      out += "</｜DSML｜" + std::string(v41 ? " calls" : "tool_calls") + ">";
    } else {
      out += "<｜tool▁calls▁begin｜>";
      for (int c = 0; c < ncalls; ++c) {
        const bool fenced = rng() % 2;
        out += "<｜tool▁call▁begin｜>function<｜tool▁sep｜>g" + std::to_string(c) + "\n" + (fenced ? "```json\n" : "") +
               "{\"k\": \"" + value() + "\"}" + (fenced ? "\n```" : "") + "<｜tool▁call▁end｜>";
      }
      out += "<｜tool▁calls▁end｜>";
    }
    const ChatFormat format = dsml ? (v41 ? ChatFormat::kV41 : ChatFormat::kV4) : ChatFormat::kV3;
    for (size_t piece : {size_t{1}, size_t{1} + rng() % 5, size_t{3} + rng() % 17}) {
      ChatDelta d = run_parser(format, false, out, piece);
      ASSERT_EQ(d.tool_calls.size(), static_cast<size_t>(ncalls)) << out;
      for (const auto& t : d.tool_call_deltas)
        EXPECT_NO_THROW((void)ordered_json(t.arguments).dump(-1, ' ', false, nlohmann::json::error_handler_t::strict))
            << "a piece splits a UTF-8 character: " << out;
    }
  }
}

TEST(ChatOutputParser, ToolCallArgumentsStreamBeforeTheBlockCloses) {
  // DSML string parameter: its text streams (escaped) while written; a non-string parameter when it closes.
  const std::string dsml =
      "<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"search\">\n<｜DSML｜ parameter name=\"q\" string=\"true\">"
      "caf\xc3\xa9 \"x\"\n</｜DSML｜ parameter>\n<｜DSML｜ parameter name=\"n\" string=\"false\">[1, 2]"
      "</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ calls>";
  std::vector<ToolCallDelta> early = pieces_before_close(ChatFormat::kV41, dsml);
  ASSERT_GT(early.size(), 5u) << "the arguments did not stream";
  EXPECT_EQ(early[0].name, "search");
  std::string args;
  for (auto& d : early) {
    args += d.arguments;
    // No piece ends inside a UTF-8 character (each is valid JSON-string text on its own).
    EXPECT_EQ(ordered_json(d.arguments).dump(-1, ' ', false, nlohmann::json::error_handler_t::strict).size() > 0, true);
  }
  EXPECT_EQ(args, "{\"q\": \"caf\xc3\xa9 \\\"x\\\"\\n\", \"n\": [1, 2]}");
  ChatDelta whole = run_parser(ChatFormat::kV41, false, dsml, 1);
  ASSERT_EQ(whole.tool_calls.size(), 1u);
  EXPECT_EQ(whole.tool_calls[0].arguments, args);

  // V3: the fenced JSON streams byte by byte; the closing fence never does.
  const std::string v3 =
      "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{\"a\": \"\xe2\x82\xac\"}\n```"
      "<｜tool▁call▁end｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>g\n```json\n{}\n```<｜tool▁call▁end｜>"
      "<｜tool▁calls▁end｜>";
  early = pieces_before_close(ChatFormat::kV3, v3);
  ASSERT_GE(early.size(), 3u);
  std::vector<ParsedToolCall> calls = reassemble(early);
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0].name, "f");
  EXPECT_EQ(calls[0].arguments, "{\"a\": \"\xe2\x82\xac\"}");
  EXPECT_EQ(calls[1].name, "g");
  EXPECT_EQ(calls[1].arguments, "{}");
  for (size_t piece = 1; piece < 12; ++piece) run_parser(ChatFormat::kV3, false, v3, piece);
  // V3.1: name <sep> arguments.
  ChatDelta d31 = run_parser(ChatFormat::kV31, false,
                             "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>h<｜tool▁sep｜>{\"k\": [1]}<｜tool▁call▁end｜>"
                             "<｜tool▁calls▁end｜>",
                             1);
  ASSERT_EQ(reassemble(d31.tool_call_deltas).size(), 1u);
  EXPECT_EQ(reassemble(d31.tool_call_deltas)[0].arguments, "{\"k\": [1]}");
}

TEST(ChatOutputParser, MatchesDeepseekRecipeAtEverySplit) {
  int n = 0, bad = 0;
  for (const auto& c : fixtures()["parses"]) {
    ++n;
    const ChatFormat format = c["version"] == "v4" ? ChatFormat::kV4 : ChatFormat::kV41;
    const std::string out = c["output"];
    const auto& want = c["expected"];
    bool ok = true;
    for (size_t piece : {out.size(), size_t{1}, size_t{2}, size_t{7}}) {
      ChatDelta got = run_parser(format, c["thinking"].get<bool>(), out, std::max<size_t>(piece, 1));
      bool same = got.reasoning == want["reasoning"].get<std::string>() &&
                  got.content == want["content"].get<std::string>() &&
                  got.tool_calls.size() == want["tool_calls"].size();
      for (size_t i = 0; same && i < got.tool_calls.size(); ++i)
        same = got.tool_calls[i].name == want["tool_calls"][i]["name"].get<std::string>() &&
               got.tool_calls[i].arguments == want["tool_calls"][i]["arguments"].get<std::string>();
      if (!same && ok && bad < 3) {
        std::string calls;
        for (auto& t : got.tool_calls) calls += t.name + " " + t.arguments + "; ";
        ADD_FAILURE() << "parse " << n - 1 << " piece " << piece << "\n got reasoning=" << ordered_json(got.reasoning)
                      << " content=" << ordered_json(got.content) << " calls=" << calls << "\n want " << want.dump();
      }
      ok = ok && same;
    }
    bad += !ok;
  }
  std::printf("parser: %d/%d outputs exact at every split\n", n - bad, n);
  EXPECT_EQ(bad, 0);
}

TEST(ChatOutputParser, V3ToolCalls) {
  std::string out =
      "Sure<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{\"a\": 1}\n```"
      "<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>";
  for (size_t piece : {size_t{1}, size_t{3}, out.size()}) {
    ChatDelta d = run_parser(ChatFormat::kV3, false, out, piece);
    EXPECT_EQ(d.content, "Sure");
    ASSERT_EQ(d.tool_calls.size(), 1u);
    EXPECT_EQ(d.tool_calls[0].name, "f");
    EXPECT_EQ(d.tool_calls[0].arguments, "{\"a\": 1}");
  }
  ChatDelta d = run_parser(ChatFormat::kV31, true,
                           "why\n</think>ok<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>g"
                           "<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
                           1);
  EXPECT_EQ(d.reasoning, "why");
  EXPECT_EQ(d.content, "ok");
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0].name, "g");
}

// Found while writing fuzz/fuzz_chat_output (its check: fed in chunks == fed whole): a `</think>` inside a tool-call
// block was dropped when the output came in one piece and kept when it came in pieces. The block's text is the model's
// call, so it is kept either way.
TEST(ChatOutputParser, ThinkEndInsideToolBlockIsKeptAtEverySplit) {
  const std::string out =
      "Hi<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n<｜DSML｜ parameter name=\"q\" string=\"true\">a</think>b"
      "</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ calls>";
  for (size_t piece : {out.size(), size_t{1}, size_t{5}}) {
    ChatDelta d = run_parser(ChatFormat::kV41, false, out, piece);
    EXPECT_EQ(d.content, "Hi") << "piece " << piece;
    ASSERT_EQ(d.tool_calls.size(), 1u) << "piece " << piece;
    EXPECT_EQ(d.tool_calls[0].arguments, "{\"q\": \"a</think>b\"}") << "piece " << piece;
  }
  // Before the block it is still dropped.
  EXPECT_EQ(run_parser(ChatFormat::kV41, false, "x</think>y", 100).content, "xy");
}

// Found by fuzz/fuzz_chat_output: dropping a `</think>` from the answer spliced `<｜DSML` + `｜ calls>` into a
// block opener when fed whole; fed in pieces `<｜DSML` was already content. Now it is content either way.
TEST(ChatOutputParser, DroppedThinkEndDoesNotSpliceABlockOpener) {
  const std::string out = "text<｜DSML</think>｜ calls>x\n\n</think>\n<｜DSML｜ calls></｜DSML｜ calls>";
  for (size_t piece : {out.size(), size_t{1}, size_t{9}}) {
    ChatDelta d = run_parser(ChatFormat::kV41, false, out, piece);
    EXPECT_EQ(d.content, "text<｜DSML｜ calls>x") << "piece " << piece;
    EXPECT_TRUE(d.tool_calls.empty()) << "piece " << piece;
  }
}

}  // namespace
}  // namespace deepinfer::tokenizer
