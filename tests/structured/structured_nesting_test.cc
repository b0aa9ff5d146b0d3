// Deeply nested constraints (64 KiB of '(' or stacked quantifiers, within the server's size limit) are clear
// InvalidArgument errors, not a stack overflow in the recursive-descent parsers or in the walks over the
// expression tree that follow them.
#include <gtest/gtest.h>

#include <string>

#include "deepinfer/core/error.h"
#include "deepinfer/structured/grammar_compiler.h"

namespace deepinfer::structured {
namespace {

void expect_nesting_error(const StructuredOutputParams& p, const std::string& what) {
  try {
    compile_constraint_grammar(p, nullptr);
    FAIL() << "compiled a constraint nested " << what;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.message();
    EXPECT_NE(e.message().find("nested deeper than"), std::string::npos) << e.message().substr(0, 300);
  }
}

TEST(StructuredNestingTest, DeepRegexGroupsAreRejected) {
  constexpr int kDepth = 32 * 1024;
  expect_nesting_error(StructuredOutputParams::regex(std::string(kDepth, '(') + "a" + std::string(kDepth, ')')),
                       "32k groups deep");
  expect_nesting_error(StructuredOutputParams::regex("a" + std::string(60000, '?')), "by 60k stacked quantifiers");
  // Reasonable nesting still compiles.
  EXPECT_NE(compile_constraint_grammar(
                StructuredOutputParams::regex(std::string(100, '(') + "ab" + std::string(100, ')') + "+?"), nullptr),
            nullptr);
}

TEST(StructuredNestingTest, DeepGrammarGroupsAreRejected) {
  constexpr int kDepth = 32 * 1024;
  expect_nesting_error(
      StructuredOutputParams::grammar("root ::= " + std::string(kDepth, '(') + "\"a\"" + std::string(kDepth, ')')),
      "32k groups deep");
  expect_nesting_error(StructuredOutputParams::grammar("root ::= \"a\"" + std::string(60000, '?')),
                       "by 60k stacked quantifiers");
  EXPECT_NE(compile_constraint_grammar(
                StructuredOutputParams::grammar("root ::= " + std::string(100, '(') + "\"a\"" + std::string(100, ')')),
                nullptr),
            nullptr);
}

}  // namespace
}  // namespace deepinfer::structured
