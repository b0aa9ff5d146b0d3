// oneOf is exact (src/deepinfer/structured/json_one_of.cc): branches proven disjoint compile as alternatives, the
// others are made mutually exclusive, and what cannot be made exclusive is Unsupported - never matched as anyOf
// by default. The schemas are reduced from the 11 maskbench false positives of the full sweep (instances valid
// for two branches that the anyOf approximation accepted).
#include <gtest/gtest.h>

#include <string>

#include "deepinfer/core/error.h"
#include "deepinfer/structured/json_schema.h"
#include "structured_test_helpers.h"

namespace deepinfer::structured {
namespace {

using testing::compile;
using testing::matches;

JsonSchemaGrammar convert(const std::string& text, JsonSchemaOptions opt = {}) {
  return json_schema_to_grammar(std::string_view(text), opt);
}

std::shared_ptr<const CompiledGrammar> schema(const std::string& text, JsonSchemaOptions opt = {}) {
  return compile(convert(text, opt).grammar);
}

bool warned(const JsonSchemaGrammar& g, const std::string& part) {
  for (const auto& w : g.warnings)
    if (w.find(part) != std::string::npos) return true;
  return false;
}

// "Exactly one of these keys" (Github_easy---o68297 / o68337, Github_medium---o54553 / o6768, draft-04): an
// instance with both keys satisfies both branches and is invalid.
TEST(JsonOneOfTest, RequiredOnlyBranchesExcludeEachOther) {
  const std::string s = R"({"$schema":"http://json-schema.org/draft-04/schema#","type":"object",
      "properties":{"appId":{"type":"string"},"appIds":{"type":"object"},"bidfloor":{"type":"number"}},
      "oneOf":[{"required":["appId"]},{"required":["appIds"]}]})";
  auto g = schema(s);
  for (const char* ok : {R"({"appId":"1","bidfloor":1.5})", R"({"appIds":{"video":"2"}})"})
    EXPECT_TRUE(matches(g, ok)) << ok;
  for (const char* bad : {R"({"appId":"1","appIds":{"video":"2"},"bidfloor":1.5})", R"({"bidfloor":1.5})", "{}"})
    EXPECT_FALSE(matches(g, bad)) << bad;
  // Multi-key branches (Github_medium---o54553: {series, index} vs {id}): not both complete.
  auto m = schema(R"({"type":"object","properties":{"series":{"type":"integer"},"index":{"type":"integer"},
      "id":{"type":"string"}},"oneOf":[{"required":["id"]},{"required":["series","index"]}]})");
  for (const char* ok : {R"({"id":"p"})", R"({"series":0,"index":1})", R"({"series":0,"id":"p"})"})
    EXPECT_TRUE(matches(m, ok)) << ok;
  for (const char* bad : {R"({"series":0,"index":1,"id":"p"})", R"({"series":0})"})
    EXPECT_FALSE(matches(m, bad)) << bad;
  // Without `type` in the base, a non-object satisfies every required-only branch: invalid under oneOf.
  auto untyped = schema(R"({"oneOf":[{"required":["a"]},{"required":["b"]}]})");
  EXPECT_TRUE(matches(untyped, R"({"a":1})"));
  EXPECT_FALSE(matches(untyped, R"("text")"));
  EXPECT_FALSE(matches(untyped, R"({"a":1,"b":2})"));
}

// Branch j fails also when one of its type-only properties has another type (Github_trivial---o42159).
TEST(JsonOneOfTest, TypeOnlyPropertiesNegateByType) {
  auto g = schema(R"({"type":"object","oneOf":[{"properties":{"password":{"type":"string"}},"required":["password"]},
      {"properties":{"login":{"type":"string"}},"required":["login"]}]})");
  for (const char* ok :
       {R"({"login":"x"})", R"({"password":"y"})", R"({"login":"x","password":5})", R"({"password":"y","login":null})"})
    EXPECT_TRUE(matches(g, ok)) << ok;
  for (const char* bad : {R"({"login":"x","password":"y"})", R"({"password":"y","login":"x"})", R"({"other":1})"})
    EXPECT_FALSE(matches(g, bad)) << bad;
}

// Nested negation (Github_medium---o85194): both branches require `content`; one needs content.background-image,
// the other content.src and content.alt. Valid: exactly one of the two nested shapes.
TEST(JsonOneOfTest, NestedRequiredMembersNegateRecursively) {
  auto g = schema(R"({"type":"object","definitions":{
      "image":{"type":"object","required":["content"],"properties":{"content":{"type":"object",
        "required":["src","alt"],"properties":{"src":{"type":"string"},"alt":{"type":"string"}}}}},
      "picture":{"type":"object","required":["content"],"properties":{"content":{"type":"object",
        "required":["background-image"],"properties":{"background-image":{"type":"object"}}}}}},
      "oneOf":[{"$ref":"#/definitions/picture"},{"$ref":"#/definitions/image"}]})");
  for (const char* ok : {R"({"content":{"background-image":{}}})", R"({"content":{"src":"a","alt":"b"}})",
                         R"({"content":{"background-image":{"vp1":"x"},"alt":"b"}})"})
    EXPECT_TRUE(matches(g, ok)) << ok;
  for (const char* bad : {R"({"content":{"alt":"b","src":"a","background-image":{}}})", R"({"content":{}})"})
    EXPECT_FALSE(matches(g, bad)) << bad;
}

// Discriminators and types prove branches disjoint: no negation, no warning (object_excludes in json_one_of.cc).
TEST(JsonOneOfTest, DisjointBranchesNeedNoNegation) {
  auto r = convert(R"({"oneOf":[
      {"type":"object","properties":{"kind":{"const":"a"},"x":{"type":"integer"}},"required":["kind"]},
      {"type":"object","properties":{"kind":{"enum":["b","c"]},"y":{"type":"string"}},"required":["kind","y"]},
      {"type":"object","properties":{"z":{"type":"null"}},"required":["z"],"additionalProperties":false},
      {"type":"array"}]})");
  EXPECT_TRUE(r.warnings.empty()) << r.warnings.front();
  auto g = compile(r.grammar);
  for (const char* ok : {R"({"kind":"a","x":1})", R"({"kind":"c","y":"s"})", R"({"z":null})", "[1]"})
    EXPECT_TRUE(matches(g, ok)) << ok;
  for (const char* bad : {R"({"kind":"d","y":"s"})", R"({"z":null,"kind":"b"})", R"({"kind":"b"})", "1"})
    EXPECT_FALSE(matches(g, bad)) << bad;
}

// A branch whose failure cannot be written out (here: a pattern) is left out of the negation: the result is
// stricter (a warning says so), never looser.
TEST(JsonOneOfTest, InexpressibleNegationIsStricterWithAWarning) {
  auto r = convert(R"({"type":"object","properties":{"a":{"type":"string"},"b":{"type":"string"}},
      "oneOf":[{"required":["a"]},{"required":["b"],"properties":{"b":{"pattern":"^x"}}}]})");
  EXPECT_TRUE(warned(r, "stricter, never looser"));
  auto g = compile(r.grammar);
  EXPECT_TRUE(matches(g, R"({"a":"1"})"));
  EXPECT_TRUE(matches(g, R"({"b":"xy"})"));
  EXPECT_FALSE(matches(g, R"({"a":"1","b":"xy"})"));  // both branches: invalid, rejected
  EXPECT_FALSE(matches(g, R"({"a":"1","b":"yy"})"));  // valid (b fails its pattern) but left out: stricter
}

// When the stricter branches leave nothing (Github_trivial---o10020: two objects closed by additionalProperties:
// false, each with its own optional key - the negation of "no other key" cannot be written), the schema is
// satisfiable ({"key":"a"} is valid) and the compiler's limitation is reported as Unsupported, not as an
// unsatisfiable schema.
TEST(JsonOneOfTest, StricterBranchesThatLeaveNothingAreUnsupported) {
  const std::string s = R"({"type":"object","oneOf":[
      {"additionalProperties":false,"properties":{"key":{"type":"string","pattern":"^[a-z]+$"}}},
      {"additionalProperties":false,"properties":{"keys":{"type":"array","items":{"type":"string"}}}}]})";
  try {
    convert(s);
    FAIL() << "expected Unsupported";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported) << e.what();
    EXPECT_NE(std::string(e.what()).find("leave no instance"), std::string::npos) << e.what();
  }
  // A schema that really has no instance is still reported as such (InvalidArgument from the compiler).
  try {
    compile(convert(R"({"type":"integer","minimum":5,"maximum":3})").grammar);
    FAIL() << "expected an empty language";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
  }
}

// Overlapping branches that cannot be made exclusive are Unsupported by default; the anyOf approximation is an
// explicit opt-in.
TEST(JsonOneOfTest, OverlapThatCannotBeExcludedIsUnsupported) {
  const std::string s = R"({"type":"string","oneOf":[{"pattern":"^a"},{"pattern":"b$"}]})";
  try {
    convert(s);
    FAIL() << "expected Unsupported";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("oneOf"), std::string::npos) << e.what();
  }
  JsonSchemaOptions approx;
  approx.oneof_as_anyof = true;
  auto r = convert(s, approx);
  EXPECT_TRUE(warned(r, "matched as anyOf"));
  EXPECT_TRUE(matches(compile(r.grammar), R"("ab")"));  // the documented approximation: valid for both
  // Up to draft 7 keywords next to $ref are ignored, while the compiler merges them: such a branch cannot be
  // used to prove or negate (its "required" would be assumed), so the oneOf is unsupported there.
  const std::string legacy = R"({"$schema":"http://json-schema.org/draft-07/schema#","type":"object",
      "definitions":{"a":{"properties":{"a":{"type":"string"}}}},
      "oneOf":[{"$ref":"#/definitions/a","required":["a"]},{"required":["b"]}]})";
  EXPECT_THROW(convert(legacy), Error);
  auto modern = schema(R"({"type":"object","definitions":{"a":{"properties":{"a":{"type":"string"}}}},
      "oneOf":[{"$ref":"#/definitions/a","required":["a"]},{"required":["b"]}]})");
  EXPECT_TRUE(matches(modern, R"({"a":"x"})"));
  EXPECT_FALSE(matches(modern, R"({"a":"x","b":1})"));
  // Every branch satisfied whenever the object is valid: the schema is unsatisfiable, a compile error.
  EXPECT_THROW(schema(R"({"type":"object","properties":{"a":{},"b":{}},"required":["a","b"],
      "oneOf":[{"required":["a"]},{"required":["b"]}]})"),
               Error);
}

}  // namespace
}  // namespace deepinfer::structured
