// Structured output through the Engine with a real model: the DeepSeek-V3 golden fixture (random weights, so the
// unconstrained distribution is noise and only the grammar makes the output structured) and a test byte-level
// vocabulary of its 768 ids (printable ASCII, every high byte, and multi-byte JSON-ish tokens that cross
// structural boundaries such as `"},{"`). Outputs are checked by independent validators, never by our matcher:
// a small JSON Schema validator here (nlohmann::json + std::regex) and, where python3 has it, the `jsonschema`
// package; regex and GBNF outputs by std::regex equivalents.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "deepinfer/core/error.h"
#include "deepinfer/engine/engine.h"
#include "deepinfer/engine/structured_output.h"
#include "deepinfer/engine/v3_model_runner.h"
#include "deepinfer/model/deepseek_v3.h"
#include "deepinfer/structured/grammar_compiler.h"
#include "test_util.h"

namespace deepinfer {
namespace {

using json = nlohmann::json;

constexpr TokenId kBos = 0;
constexpr TokenId kEos = 1;  // the fixture's eos_token_id

// Ids: 0 BOS, 1 EOS (special), 2.. printable ASCII, '\n', '\t', bytes 0x80..0xFF, then multi-byte tokens; the
// rest of the model's 768 ids have no token (never allowed). Byte 0x01 is deliberately absent (dead-end test).
std::shared_ptr<const structured::TokenizerInfo> test_vocabulary(int64_t model_vocab) {
  std::vector<std::string> bytes{"<s>", "</s>"};
  for (int c = 0x20; c < 0x7F; ++c) bytes.push_back(std::string(1, static_cast<char>(c)));
  bytes.push_back("\n");
  bytes.push_back("\t");
  for (int c = 0x80; c < 0x100; ++c) bytes.push_back(std::string(1, static_cast<char>(c)));
  for (const char* t : {"{\"",   "\"}",  "\":",    "\": ", "\",",   "\", \"", ",\"",  "\"},{\"", "}]",   "],\"",
                        "\":\"", "\":[", "\":{\"", "true", "false", "null",   "name", "age",     "tags", "id",
                        "  ",    "    ", "\n  ",   "12",   "00",    "-1",     ".5",   "e+",      "\\n",  "\\\"",
                        "\\u00", "abc",  "ing",    "the",  " the",  "é",      "€",    "😀",       "[\"",  "\"]",
                        "},",    "ab",   "cd",     "-0",   "0-",    "2026-",  "T1",   ":0",      "Z\""})
    bytes.push_back(t);
  std::vector<bool> special(bytes.size(), false);
  special[kBos] = special[kEos] = true;
  return std::make_shared<const structured::TokenizerInfo>(
      structured::Vocabulary(std::move(bytes), {kEos}, std::move(special), static_cast<size_t>(model_vocab)));
}

struct Model {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<DeepseekV3Model> model;
};

const Model& model() {
  static Model m = [] {
    Model x;
    x.backend = make_cpu_backend(1);
    x.model = DeepseekV3Model::load(testing::test_data_dir() + "/golden/deepseek_v3", *x.backend);
    return x;
  }();
  return m;
}

struct Harness {
  explicit Harness(int32_t num_blocks = 64, int max_num_seqs = 4, int64_t max_model_len = 320) {
    const DeepseekV3Model& m = *model().model;
    runner = std::make_unique<V3ModelRunner>(m, max_num_seqs);
    compiler = std::make_shared<structured::GrammarCompiler>(test_vocabulary(m.config().vocab_size));
    EngineConfig c;
    c.scheduler = {.max_num_seqs = max_num_seqs, .max_num_batched_tokens = 64, .max_model_len = max_model_len};
    c.kv = {.num_blocks = num_blocks, .block_size = 16, .num_state_slots = max_num_seqs, .enable_prefix_cache = false};
    c.seed = 7;
    c.eos_token_ids = {kEos};
    c.grammar_compiler = compiler;
    engine = std::make_unique<Engine>(c, *runner);
  }

  std::string text(const std::vector<TokenId>& ids) const {
    std::string s;
    for (TokenId t : ids)
      if (t != kEos) s += compiler->tokenizer().vocab.token_bytes(t);
    return s;
  }

  std::map<std::string, CompletedSequence> run() {
    engine->run_to_completion();
    std::map<std::string, CompletedSequence> out;
    for (auto& c : engine->take_finished()) out[c.request_id + "/" + std::to_string(c.sample_index)] = c;
    return out;
  }

  std::unique_ptr<V3ModelRunner> runner;
  std::shared_ptr<structured::GrammarCompiler> compiler;
  std::unique_ptr<Engine> engine;
};

Request make_request(const std::string& id, StructuredOutputParams so, float temperature, uint64_t seed,
                     int max_tokens = 256) {
  Request r;
  r.request_id = id;
  r.prompt_token_ids = {kBos};
  for (int i = 0; i < 6; ++i) r.prompt_token_ids.push_back(static_cast<TokenId>(2 + (seed * 31 + i * 17) % 95));
  r.params.temperature = temperature;
  r.params.seed = seed;
  r.params.max_tokens = max_tokens;
  r.params.structured = std::move(so);
  return r;
}

// ---- an independent JSON Schema validator for the keywords the test schemas use ---------------------------------

size_t utf8_length(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

bool validate_json(const json& v, const json& schema, const json& root, std::string* why);

bool type_matches(const json& v, const std::string& t) {
  if (t == "object") return v.is_object();
  if (t == "array") return v.is_array();
  if (t == "string") return v.is_string();
  if (t == "boolean") return v.is_boolean();
  if (t == "null") return v.is_null();
  if (t == "number") return v.is_number();
  if (t == "integer")
    return v.is_number_integer() || (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
  return false;
}

bool validate_json(const json& v, const json& s, const json& root, std::string* why) {
  auto fail = [&](const std::string& m) {
    *why = m + " in " + v.dump();
    return false;
  };
  if (s.is_boolean()) return s.get<bool>() || fail("false schema");
  if (s.contains("$ref")) {
    const std::string ref = s["$ref"];
    return validate_json(v, root.at(json::json_pointer(ref.substr(1))), root, why);
  }
  if (s.contains("type")) {
    const json& t = s["type"];
    bool ok = false;
    if (t.is_string()) ok = type_matches(v, t);
    for (const auto& x : t.is_array() ? t : json::array()) ok = ok || type_matches(v, x);
    if (!ok) return fail("type " + t.dump());
  }
  if (s.contains("enum") && std::find(s["enum"].begin(), s["enum"].end(), v) == s["enum"].end()) return fail("enum");
  if (s.contains("const") && s["const"] != v) return fail("const");
  if (s.contains("anyOf")) {
    bool ok = false;
    std::string ignored;
    for (const auto& b : s["anyOf"]) ok = ok || validate_json(v, b, root, &ignored);
    if (!ok) return fail("anyOf");
  }
  if (v.is_number()) {
    const double x = v.get<double>();
    if (s.contains("minimum") && x < s["minimum"].get<double>()) return fail("minimum");
    if (s.contains("maximum") && x > s["maximum"].get<double>()) return fail("maximum");
  }
  if (v.is_string()) {
    const std::string& str = v.get_ref<const std::string&>();
    if (s.contains("maxLength") && utf8_length(str) > s["maxLength"].get<size_t>()) return fail("maxLength");
    if (s.contains("minLength") && utf8_length(str) < s["minLength"].get<size_t>()) return fail("minLength");
    if (s.contains("pattern") && !std::regex_search(str, std::regex(s["pattern"].get<std::string>())))
      return fail("pattern");
  }
  if (v.is_array()) {
    if (s.contains("minItems") && v.size() < s["minItems"].get<size_t>()) return fail("minItems");
    if (s.contains("maxItems") && v.size() > s["maxItems"].get<size_t>()) return fail("maxItems");
    if (s.contains("items"))
      for (const auto& x : v)
        if (!validate_json(x, s["items"], root, why)) return false;
  }
  if (v.is_object()) {
    for (const auto& r : s.value("required", json::array()))
      if (!v.contains(r.get<std::string>())) return fail("required " + r.dump());
    const json props = s.value("properties", json::object());
    for (const auto& [k, x] : v.items()) {
      if (props.contains(k)) {
        if (!validate_json(x, props[k], root, why)) return false;
      } else if (s.contains("additionalProperties") && !validate_json(x, s["additionalProperties"], root, why)) {
        return false;
      }
    }
  }
  return true;
}

// ---- schemas --------------------------------------------------------------------------------------------------

const std::vector<std::string>& test_schemas() {
  static const std::vector<std::string> k = {
      R"({"type":"object","properties":{"name":{"type":"string","maxLength":8},
          "age":{"type":"integer","minimum":0,"maximum":120},
          "tags":{"type":"array","items":{"enum":["a","b","c"]},"maxItems":3},
          "active":{"type":"boolean"}},"required":["name","age"],"additionalProperties":false})",
      R"({"type":"array","items":{"anyOf":[{"type":"integer","minimum":-5,"maximum":5},{"type":"null"},
          {"const":"x"}]},"minItems":1,"maxItems":4})",
      R"({"$defs":{"node":{"type":"object","properties":{"id":{"type":"integer","minimum":0,"maximum":99},
          "next":{"anyOf":[{"$ref":"#/$defs/node"},{"type":"null"}]}},"required":["id","next"],
          "additionalProperties":false}},"$ref":"#/$defs/node"})",
      R"({"type":"object","properties":{"code":{"type":"string","pattern":"^[a-c]{2,4}-[0-9]{1,2}$"},
          "kind":{"enum":["x",1,true,null]},"ratio":{"type":"number","minimum":0,"maximum":1}},
          "required":["code","kind"],"additionalProperties":false})",
  };
  return k;
}

// stdout+stderr of a shell command (exit code 127 when the shell cannot find the program).
testing::CommandResult run_command(const std::string& cmd) {
  testing::CommandResult r{-1, ""};
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

std::string python_jsonschema_validator() {
  return R"PY(import json, sys
try:
    import jsonschema
except ImportError:
    print("NO_JSONSCHEMA"); sys.exit(0)
bad = 0
for line in open(sys.argv[1]):
    case = json.loads(line)
    try:
        jsonschema.validate(json.loads(case["output"]), case["schema"], cls=jsonschema.Draft202012Validator)
    except Exception as e:
        bad += 1
        print("INVALID", case["output"], str(e)[:200])
print("CHECKED", sum(1 for _ in open(sys.argv[1])), "BAD", bad)
)PY";
}

// Every schema, temperature 0.8 and 1.3, several seeds (n = 2 samples each): every output that ended with EOS is
// valid JSON satisfying the schema; the budget is generous so (nearly) all of them end.
TEST(StructuredOutputEngineTest, JsonSchemaOutputsValidate) {
  Harness h;
  int id = 0;
  std::map<std::string, std::string> schema_of;
  for (size_t si = 0; si < test_schemas().size(); ++si)
    for (float temp : {0.8f, 1.3f})
      for (uint64_t seed : {1, 2, 3}) {
        Request r = make_request("s" + std::to_string(si) + "_" + std::to_string(id++),
                                 StructuredOutputParams::json_schema(test_schemas()[si]), temp, seed);
        r.params.n = 2;
        schema_of[r.request_id] = test_schemas()[si];
        h.engine->add_request(r);
      }
  const auto done = h.run();
  ASSERT_EQ(done.size(), schema_of.size() * 2);
  const testing::TempDir tmp;
  std::ofstream cases(tmp.file("cases.jsonl"));
  int ended = 0;
  std::set<std::string> distinct;
  for (const auto& [key, c] : done) {
    const std::string schema_text = schema_of.at(c.request_id);
    const std::string out = h.text(c.output_token_ids);
    if (c.stop_reason != StopReason::kEos) {
      EXPECT_EQ(c.stop_reason, StopReason::kMaxTokens) << key;
      continue;
    }
    ++ended;
    distinct.insert(out);
    json v;
    ASSERT_NO_THROW(v = json::parse(out)) << key << ": not JSON: " << out;
    const json schema = json::parse(schema_text);
    std::string why;
    EXPECT_TRUE(validate_json(v, schema, schema, &why)) << key << ": " << out << ": " << why;
    cases << json{{"schema", schema}, {"output", out}}.dump() << "\n";
  }
  cases.close();
  EXPECT_GE(ended, static_cast<int>(done.size()) * 3 / 4) << "too few outputs ended within max_tokens";
  EXPECT_GE(distinct.size(), static_cast<size_t>(ended) / 2) << "sampling should give varied outputs";
  EXPECT_EQ(h.compiler->stats().misses, static_cast<int64_t>(test_schemas().size())) << "one compile per schema";
  EXPECT_GT(h.compiler->stats().hits, 0);

  testing::write_file(tmp.file("validate.py"), python_jsonschema_validator());
  const auto r = run_command("python3 " + tmp.file("validate.py") + " " + tmp.file("cases.jsonl") + " 2>&1");
  if (r.output.find("NO_JSONSCHEMA") != std::string::npos || r.exit_code == 127) {
    std::printf("[structured] python3 jsonschema not available: independent Python validation skipped\n");
  } else {
    EXPECT_NE(r.output.find("CHECKED " + std::to_string(ended) + " BAD 0"), std::string::npos) << r.output;
    std::printf("[structured] jsonschema (Python): %s", r.output.c_str());
  }
}

// Greedy decoding under a grammar is deterministic and valid; random sampling with the same seed reproduces.
TEST(StructuredOutputEngineTest, GreedyAndSeededAreDeterministic) {
  std::vector<std::string> outs;
  for (int pass = 0; pass < 2; ++pass) {
    Harness h;
    h.engine->add_request(make_request("g", StructuredOutputParams::json_schema(test_schemas()[0]), 0.0f, 1));
    h.engine->add_request(make_request("r", StructuredOutputParams::json_schema(test_schemas()[1]), 1.0f, 5));
    const auto done = h.run();
    for (const auto& [key, c] : done) outs.push_back(h.text(c.output_token_ids));
  }
  ASSERT_EQ(outs.size(), 4u);
  EXPECT_EQ(outs[0], outs[2]);
  EXPECT_EQ(outs[1], outs[3]);
  for (int i = 0; i < 2; ++i) {
    const json schema = json::parse(test_schemas()[i]);
    std::string why;
    json v;
    ASSERT_NO_THROW(v = json::parse(outs[i])) << outs[i];
    EXPECT_TRUE(validate_json(v, schema, schema, &why)) << outs[i] << ": " << why;
  }
}

// Regex and GBNF constraints, checked with std::regex equivalents; json_object gives a JSON object.
TEST(StructuredOutputEngineTest, RegexGrammarAndJsonObject) {
  Harness h;
  const std::string gbnf = R"(root ::= "[" item ("," item){0,3} "]"
item ::= [0-9]{1,3} | "\"" [a-z]{0,4} "\"")";
  const std::regex gbnf_equiv(R"(\[([0-9]{1,3}|"[a-z]{0,4}")(,([0-9]{1,3}|"[a-z]{0,4}")){0,3}\])");
  const std::string pattern = "(ab|cd)[0-9]{2,4}(-[a-f]+)?x?";
  for (uint64_t seed : {1, 2, 3, 4}) {
    h.engine->add_request(
        make_request("re" + std::to_string(seed), StructuredOutputParams::regex(pattern), 1.0f, seed));
    h.engine->add_request(make_request("eb" + std::to_string(seed), StructuredOutputParams::grammar(gbnf), 1.0f, seed));
    auto jo = make_request("jo" + std::to_string(seed), StructuredOutputParams::json_object(), 1.0f, seed, 300);
    jo.params.structured.max_whitespace = 2;
    h.engine->add_request(jo);
  }
  int objects = 0;
  for (const auto& [key, c] : h.run()) {
    const std::string out = h.text(c.output_token_ids);
    if (key.rfind("jo", 0) == 0) {
      if (c.stop_reason != StopReason::kEos) continue;  // any JSON may nest deeply; only finished ones count
      json v;
      ASSERT_NO_THROW(v = json::parse(out)) << out;
      EXPECT_TRUE(v.is_object()) << out;
      ++objects;
      continue;
    }
    ASSERT_EQ(c.stop_reason, StopReason::kEos) << key << ": " << out;
    EXPECT_TRUE(std::regex_match(out, key.rfind("re", 0) == 0 ? std::regex(pattern) : gbnf_equiv))
        << key << ": " << out;
  }
  EXPECT_GE(objects, 1) << "no json_object sample finished";
}

// Preemption by recompute drops the matcher; it is rebuilt from the output and the result equals an unpreempted
// run token for token (seeded sampling is a function of the position, not of the batch).
TEST(StructuredOutputEngineTest, PreemptionRebuildsMatcher) {
  auto workload = [](Harness& h) {
    for (int i = 0; i < 4; ++i) {
      auto r = make_request("p" + std::to_string(i), StructuredOutputParams::json_schema(test_schemas()[i % 4]), 1.0f,
                            10 + i, 120);
      h.engine->add_request(r);
    }
  };
  Harness roomy(/*num_blocks=*/128, /*max_num_seqs=*/4, /*max_model_len=*/128);
  workload(roomy);
  const auto want = roomy.run();
  EXPECT_EQ(roomy.engine->stats().preemptions, 0);
  Harness tight(/*num_blocks=*/9, /*max_num_seqs=*/4, /*max_model_len=*/128);  // 8 blocks = one full sequence
  workload(tight);
  const auto got = tight.run();
  EXPECT_GT(tight.engine->stats().preemptions, 0) << "the test needs preemptions to mean anything";
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [key, c] : want) {
    EXPECT_EQ(got.at(key).output_token_ids, c.output_token_ids) << key;
    EXPECT_EQ(got.at(key).stop_reason, c.stop_reason) << key;
  }
}

// EOS only where the grammar may end; a complete sentence with EOS suppressed, or an unspellable continuation,
// finishes the sequence with its own reason instead of failing the sampler.
TEST(StructuredOutputEngineTest, EndsAndDeadEnds) {
  Harness h;
  auto ignore = make_request("ignore_eos", StructuredOutputParams::regex("abc"), 1.0f, 1);
  ignore.params.ignore_eos = true;
  auto min_tokens = make_request("min_tokens", StructuredOutputParams::regex("ab"), 0.0f, 1);
  min_tokens.params.min_tokens = 10;
  auto dead = make_request("dead", StructuredOutputParams::regex("a\\x01b"), 1.0f, 1);  // no token has byte 0x01
  auto plain = make_request("plain", StructuredOutputParams::regex("(ab){1,3}"), 1.0f, 3);
  for (auto* r : {&ignore, &min_tokens, &dead, &plain}) h.engine->add_request(*r);
  const auto done = h.run();
  EXPECT_EQ(h.text(done.at("ignore_eos/0").output_token_ids), "abc");
  EXPECT_EQ(done.at("ignore_eos/0").stop_reason, StopReason::kGrammarComplete);
  EXPECT_EQ(h.text(done.at("min_tokens/0").output_token_ids), "ab");
  EXPECT_EQ(done.at("min_tokens/0").stop_reason, StopReason::kGrammarComplete);
  EXPECT_EQ(h.text(done.at("dead/0").output_token_ids), "a");
  EXPECT_EQ(done.at("dead/0").stop_reason, StopReason::kGrammarDeadEnd);
  const auto& p = done.at("plain/0");
  EXPECT_EQ(p.stop_reason, StopReason::kEos);
  EXPECT_EQ(p.output_token_ids.back(), kEos);
  EXPECT_TRUE(std::regex_match(h.text(p.output_token_ids), std::regex("(ab){1,3}"))) << h.text(p.output_token_ids);
  EXPECT_EQ(stop_reason_name(StopReason::kGrammarDeadEnd), "grammar_dead_end");
}

// Bad constraints are rejected at add_request with the request id, the option and the reason; the engine keeps
// working and the request id stays free.
TEST(StructuredOutputEngineTest, InvalidConstraintsAreRejected) {
  Harness h;
  struct Case {
    StructuredOutputParams so;
    ErrorCode code;
    std::string needle;
  };
  StructuredOutputParams object_with_spec = StructuredOutputParams::json_object();
  object_with_spec.spec = "{}";
  const std::vector<Case> cases = {
      {StructuredOutputParams::json_schema("{not json"), ErrorCode::kInvalidArgument, "not valid JSON"},
      {StructuredOutputParams::json_schema(R"({"type":"strin"})"), ErrorCode::kInvalidArgument, "strin"},
      {StructuredOutputParams::json_schema(R"({"not":{"type":"string"}})"), ErrorCode::kUnsupported, "not"},
      {StructuredOutputParams::json_schema(R"({"minLength":"3","type":"string"})"), ErrorCode::kInvalidArgument,
       "must be a non-negative integer"},
      {StructuredOutputParams::json_schema(""), ErrorCode::kInvalidArgument, "empty"},
      {StructuredOutputParams::regex("(ab"), ErrorCode::kInvalidArgument, "regex"},
      {StructuredOutputParams::regex("(a)\\1"), ErrorCode::kUnsupported, "backreference"},
      {StructuredOutputParams::grammar("root ::= item"), ErrorCode::kInvalidArgument, "item"},
      {StructuredOutputParams::grammar("start ::= \"a\""), ErrorCode::kInvalidArgument, "root"},
      {StructuredOutputParams::grammar("root ::= root \"a\" | \"b\""), ErrorCode::kInvalidArgument, "left recursion"},
      {StructuredOutputParams::grammar("root ::= [a-"), ErrorCode::kInvalidArgument, "1:"},
      {object_with_spec, ErrorCode::kInvalidArgument, "json_object"},
  };
  for (const Case& c : cases) {
    Request r = make_request("bad", c.so, 1.0f, 1);
    try {
      h.engine->add_request(r);
      ADD_FAILURE() << "accepted: " << c.so.spec;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), c.code) << c.so.spec << ": " << e.message();
      EXPECT_NE(e.message().find(c.needle), std::string::npos) << c.so.spec << ": " << e.message();
      if (c.so.kind != StructuredOutputKind::kJsonObject && !c.so.spec.empty()) {
        EXPECT_NE(e.message().find("request 'bad'"), std::string::npos) << e.message();
      }
    }
  }
  EXPECT_FALSE(h.engine->has_unfinished());
  // Lenient: the unsupported keyword is a warning and the request runs.
  auto lenient = StructuredOutputParams::json_schema(R"({"type":"integer","minimum":0,"maximum":9,"not":{"const":3}})");
  lenient.lenient = true;
  h.engine->add_request(make_request("bad", lenient, 1.0f, 1));
  const auto done = h.run();
  ASSERT_EQ(done.at("bad/0").stop_reason, StopReason::kEos);
  const json v = json::parse(h.text(done.at("bad/0").output_token_ids));
  EXPECT_TRUE(v.is_number_integer() && v.get<int>() >= 0 && v.get<int>() <= 9) << v.dump();

  // An engine without a grammar compiler refuses constrained requests with a clear message.
  EngineConfig c;
  c.scheduler = {.max_num_seqs = 1, .max_num_batched_tokens = 64, .max_model_len = 64};
  c.kv = {.num_blocks = 8, .block_size = 16, .num_state_slots = 1, .enable_prefix_cache = false};
  c.eos_token_ids = {kEos};
  V3ModelRunner runner(*model().model, 1);
  Engine plain(c, runner);
  try {
    plain.add_request(make_request("x", StructuredOutputParams::regex("a"), 1.0f, 1));
    ADD_FAILURE() << "accepted without a grammar compiler";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("structured output needs an engine configured with a tokenizer"), std::string::npos);
  }
  // A compiler whose vocabulary does not fit the model is a configuration error.
  c.grammar_compiler = std::make_shared<structured::GrammarCompiler>(test_vocabulary(1000));
  EXPECT_THROW(Engine(c, runner), Error);
}

// rollback(n) (speculative decoding) restores the mask exactly; the per-sequence mask is the matcher's.
TEST(StructuredOutputEngineTest, MatcherRollbackRestoresMask) {
  auto compiler = std::make_shared<structured::GrammarCompiler>(test_vocabulary(768));
  StructuredState st{compiler->compile(StructuredOutputParams::json_schema(test_schemas()[0]))};
  Sequence s;
  auto params = std::make_shared<SamplingParams>();
  s.params = params;
  s.tokens = {kBos};
  s.prompt_len = 1;
  std::vector<float> logits(768, 0.0f);
  ASSERT_EQ(prepare_structured_mask(st, s, std::vector<TokenId>{kEos}, logits), StructuredMaskOutcome::kSample);
  const std::vector<uint32_t> first = st.allowed;
  const auto& vocab = compiler->tokenizer().vocab;
  for (const char* piece : {"{\"", "name", "\":\"", "ab"}) {
    TokenId t = -1;
    for (size_t i = 0; i < vocab.num_bytes_tokens(); ++i)
      if (vocab.token_bytes(static_cast<TokenId>(i)) == piece) t = static_cast<TokenId>(i);
    ASSERT_GE(t, 0) << piece;
    ASSERT_TRUE((st.allowed[t / 32] >> (t % 32)) & 1) << piece;
    accept_structured_token(st, t);
    s.tokens.push_back(t);
    ASSERT_EQ(prepare_structured_mask(st, s, std::vector<TokenId>{kEos}, logits), StructuredMaskOutcome::kSample);
  }
  EXPECT_NE(st.allowed, first);
  st.matcher->rollback(4);
  s.tokens.resize(1);
  ASSERT_EQ(prepare_structured_mask(st, s, std::vector<TokenId>{kEos}, logits), StructuredMaskOutcome::kSample);
  EXPECT_EQ(st.allowed, first);
  EXPECT_FALSE((st.allowed[kEos / 32] >> (kEos % 32)) & 1) << "EOS before the object is complete";
}

}  // namespace
}  // namespace deepinfer
