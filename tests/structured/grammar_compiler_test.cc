// GrammarCompiler: one compile per distinct constraint (LRU cache), errors that name the request option.
#include "deepinfer/structured/grammar_compiler.h"

#include <gtest/gtest.h>

#include "deepinfer/core/error.h"
#include "deepinfer/structured/grammar_matcher.h"

namespace deepinfer::structured {
namespace {

std::shared_ptr<const TokenizerInfo> ascii_vocab() {
  std::vector<std::string> bytes{"</s>"};
  for (int c = 0x20; c < 0x7F; ++c) bytes.push_back(std::string(1, static_cast<char>(c)));
  bytes.push_back("{\"");
  std::vector<bool> special(bytes.size(), false);
  special[0] = true;
  return std::make_shared<const TokenizerInfo>(Vocabulary(std::move(bytes), {0}, std::move(special), 128));
}

TEST(GrammarCompilerTest, CachesPerConstraintWithLruEviction) {
  GrammarCompiler c(ascii_vocab(), /*max_entries=*/2);
  const auto a = StructuredOutputParams::regex("a+");
  const auto b = StructuredOutputParams::regex("b+");
  const auto d = StructuredOutputParams::regex("d+");
  auto a1 = c.compile(a);
  auto a2 = c.compile(a);
  EXPECT_EQ(a1.masks, a2.masks) << "same constraint, same shared mask cache";
  auto lenient = a;
  lenient.max_whitespace = 3;  // options are part of the key
  EXPECT_NE(c.compile(lenient).masks, a1.masks);
  EXPECT_EQ(c.stats().hits, 1);
  EXPECT_EQ(c.stats().misses, 2);
  c.compile(b);  // evicts a (least recently used)
  EXPECT_EQ(c.num_cached(), 2u);
  auto a3 = c.compile(a);
  EXPECT_NE(a3.masks, a1.masks) << "a was evicted and compiled again";
  c.compile(d);
  EXPECT_EQ(c.stats().misses, 5);
  // Evicted caches stay usable by the matchers that hold them.
  GrammarMatcher m(a1.masks);
  EXPECT_TRUE(m.accept_bytes("aaa"));
  EXPECT_TRUE(m.can_terminate());
  EXPECT_EQ(c.vocab_size(), 128u);
}

TEST(GrammarCompilerTest, ErrorsNameTheOptionAndKeepTheirCode) {
  GrammarCompiler c(ascii_vocab());
  auto expect_error = [&](const StructuredOutputParams& p, ErrorCode code, const std::string& needle) {
    try {
      c.compile(p);
      ADD_FAILURE() << "compiled: " << p.spec;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), code) << e.message();
      EXPECT_EQ(e.message().rfind("structured output (" + std::string(structured_output_kind_name(p.kind)) + "): ", 0),
                0u)
          << e.message();
      EXPECT_NE(e.message().find(needle), std::string::npos) << e.message();
    }
  };
  expect_error(StructuredOutputParams::json_schema("[1,"), ErrorCode::kInvalidArgument, "not valid JSON");
  expect_error(StructuredOutputParams::json_schema(R"({"type":"string","not":{}})"), ErrorCode::kUnsupported, "not");
  expect_error(StructuredOutputParams::regex("a(?=b)"), ErrorCode::kUnsupported, "look");
  expect_error(StructuredOutputParams::grammar("root ::= \"a\" undefined"), ErrorCode::kInvalidArgument, "undefined");
  expect_error(StructuredOutputParams::regex("[b-a]"), ErrorCode::kInvalidArgument, "");
  EXPECT_EQ(c.stats().failures, 5);
  EXPECT_EQ(c.num_cached(), 0u) << "failures are not cached";
  auto lenient = StructuredOutputParams::json_schema(R"({"type":"string","not":{}})");
  lenient.lenient = true;
  const CompiledConstraint ok = c.compile(lenient);
  ASSERT_EQ(ok.warnings.size(), 1u);
  EXPECT_NE(ok.warnings[0].find("not"), std::string::npos);
}

TEST(GrammarCompilerTest, SamplingParamsValidateTheConstraintShape) {
  SamplingParams p;
  p.structured = StructuredOutputParams::json_object();
  EXPECT_NO_THROW(validate(p));
  p.structured.spec = "{}";
  EXPECT_THROW(validate(p), Error);
  p.structured = StructuredOutputParams::regex("");
  EXPECT_THROW(validate(p), Error);
  p.structured = StructuredOutputParams::regex("a");
  p.structured.max_whitespace = -2;
  EXPECT_THROW(validate(p), Error);
}

}  // namespace
}  // namespace deepinfer::structured
