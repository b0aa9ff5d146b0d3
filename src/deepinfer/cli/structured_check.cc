#include "deepinfer/cli/structured_check.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <regex>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "deepinfer/core/error.h"
#include "deepinfer/core/logging.h"
#include "deepinfer/structured/grammar_compiler.h"
#include "deepinfer/structured/grammar_matcher.h"

namespace deepinfer::cli {
namespace {

using json = nlohmann::json;

// One constrained generation and its independent acceptance test on the decoded text. Every constraint bounds
// the sentence length (maxLength, enums, counted repetitions, max_whitespace), so even a random-weight model
// finishes within kMaxTokens: an incomplete output is a failure, not bad luck.
struct Check {
  std::string name;
  std::string prompt;
  StructuredOutputParams constraint;
  std::function<std::string(const std::string&)> verify;  // "" = pass, else why not
};

constexpr int kMaxTokens = 384;

std::string verify_person(const std::string& text) {
  json v;
  try {
    v = json::parse(text);
  } catch (const json::exception& e) {
    return std::string("not JSON: ") + e.what();
  }
  if (!v.is_object()) return "not an object";
  for (const auto& [k, x] : v.items())
    if (k != "name" && k != "age" && k != "languages" && k != "active") return "unexpected key '" + k + "'";
  if (!v.contains("name") || !v["name"].is_string()) return "name missing or not a string";
  size_t chars = 0;
  for (unsigned char c : v["name"].get<std::string>()) chars += (c & 0xC0) != 0x80;
  if (chars < 1 || chars > 24) return "name length " + std::to_string(chars) + " outside [1, 24]";
  // JSON Schema: a number with a zero fractional part (35.0) is an integer.
  if (!v.contains("age") || !v["age"].is_number() || std::floor(v["age"].get<double>()) != v["age"].get<double>())
    return "age missing or not an integer";
  if (v["age"].get<double>() < 0 || v["age"].get<double>() > 150) return "age outside [0, 150]";
  if (v.contains("languages")) {
    if (!v["languages"].is_array() || v["languages"].size() > 3) return "languages not an array of <= 3";
    for (const auto& l : v["languages"])
      if (l != "en" && l != "zh" && l != "fr" && l != "de") return "language " + l.dump() + " not in the enum";
  }
  if (v.contains("active") && !v["active"].is_boolean()) return "active not a boolean";
  return "";
}

std::vector<Check> checks() {
  const std::string schema = R"({"type":"object","properties":{
      "name":{"type":"string","minLength":1,"maxLength":24},
      "age":{"type":"integer","minimum":0,"maximum":150},
      "languages":{"type":"array","items":{"enum":["en","zh","fr","de"]},"maxItems":3},
      "active":{"type":"boolean"}},
    "required":["name","age"],"additionalProperties":false})";
  auto js = StructuredOutputParams::json_schema(schema);
  js.max_whitespace = 4;
  const std::string date = R"([0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01]))";
  // GBNF: a small arithmetic expression (rules, alternation, classes, strings, counted repetition).
  const std::string ebnf = R"G(root   ::= expr
expr   ::= term ( [+-] term ){0,3}
term   ::= factor ( [*/] factor ){0,2}
factor ::= [0-9]{1,3} | "(" inner ")"
inner  ::= [0-9]{1,3} ( [+*-] [0-9]{1,3} ){0,2})G";
  const std::regex date_re(date);
  const std::regex ebnf_re(
      R"(([0-9]{1,3}|\([0-9]{1,3}([-+*][0-9]{1,3}){0,2}\))([*/]([0-9]{1,3}|\([0-9]{1,3}([-+*][0-9]{1,3}){0,2}\))){0,2})"
      R"(([-+]([0-9]{1,3}|\([0-9]{1,3}([-+*][0-9]{1,3}){0,2}\))([*/]([0-9]{1,3}|\([0-9]{1,3}([-+*][0-9]{1,3}){0,2}\))){0,2}){0,3})");
  return {
      {"json_schema", "Describe a person as a JSON object with name, age, languages and active:\n", js, verify_person},
      {"regex", "Today's date in ISO format (YYYY-MM-DD) is ", StructuredOutputParams::regex(date),
       [date_re](const std::string& t) {
         return std::regex_match(t, date_re) ? "" : std::string("does not match the date pattern");
       }},
      {"ebnf", "Write an arithmetic expression: ", StructuredOutputParams::grammar(ebnf),
       [ebnf_re](const std::string& t) {
         return std::regex_match(t, ebnf_re) ? "" : std::string("is not an expression of the grammar");
       }},
  };
}

}  // namespace

int run_structured_output_checks(EngineSetup& setup) {
  DI_CHECK_CODE(setup.tokenizer() != nullptr, ErrorCode::kUnsupported)
      << "--check_structured_output needs " << setup.model_dir()
      << "/tokenizer.json: constraints are on text, so the model's tokenizer must be known";
  DI_CHECK_CODE(setup.tokenizer()->token_separator().empty(), ErrorCode::kUnsupported)
      << "--check_structured_output needs a ByteLevel tokenizer (tokens that concatenate into the text); "
      << setup.model_dir() << "/tokenizer.json puts '" << setup.tokenizer()->token_separator() << "' between tokens";
  Engine& engine = setup.engine();
  DI_CHECK(!engine.has_unfinished()) << "--check_structured_output runs on an idle engine";
  const std::vector<Check> all = checks();
  // Each constraint greedy and sampled (two seeds), all submitted at once: they run batched on one engine.
  struct Variant {
    const char* label;
    float temperature;
    uint64_t seed;
  };
  const std::vector<Variant> variants = {{"greedy", 0.0f, 0}, {"t=0.8 seed=1", 0.8f, 1}, {"t=1.0 seed=2", 1.0f, 2}};
  std::map<std::string, std::pair<const Check*, const Variant*>> ids;
  for (const Check& c : all) {
    const std::vector<TokenId> prompt = setup.encode(c.prompt, "structured check prompt");
    const int64_t room = setup.max_model_len() - static_cast<int64_t>(prompt.size());
    DI_CHECK(room >= 64) << "--check_structured_output: max_model_len " << setup.max_model_len()
                         << " leaves no room for the checks' outputs";
    for (const Variant& v : variants) {
      Request r;
      r.request_id = "structured-" + c.name + "-" + std::to_string(&v - variants.data());
      r.prompt_token_ids = prompt;
      r.params.temperature = v.temperature;
      r.params.seed = v.seed;
      r.params.max_tokens = static_cast<int>(std::min<int64_t>(kMaxTokens, room));
      r.params.structured = c.constraint;
      engine.add_request(r);  // an engine without a grammar compiler throws here, naming the reason
      ids[r.request_id] = {&c, &v};
    }
  }
  engine.run_to_completion();
  int passed = 0, failed = 0;
  std::vector<CompletedSequence> done = engine.take_finished();
  std::sort(done.begin(), done.end(), [](const auto& a, const auto& b) { return a.request_id < b.request_id; });
  for (const CompletedSequence& d : done) {
    const auto [check, variant] = ids.at(d.request_id);
    std::vector<TokenId> out = d.output_token_ids;
    if (d.stop_reason == StopReason::kEos && !out.empty()) out.pop_back();
    const std::string text = setup.decode(out);
    std::string why;
    if (d.stop_reason != StopReason::kEos) {
      why = fmt::format("did not finish (stop={})", stop_reason_name(d.stop_reason));
    } else {
      why = check->verify(text);
      if (why.empty()) {
        // The decoded text must also be a sentence of the grammar itself (tokenizer round trip).
        structured::GrammarMatcher m(structured::compile_constraint_grammar(check->constraint));
        if (!m.accept_bytes(text) || !m.can_terminate()) why = "the decoded text is not a sentence of the grammar";
      }
    }
    const bool ok = why.empty();
    (ok ? passed : failed)++;
    std::cout << fmt::format("[structured] {} ({}): {} tokens={} stop={} text={}{}\n", check->name, variant->label,
                             ok ? "PASS" : "FAIL", d.output_token_ids.size(), stop_reason_name(d.stop_reason),
                             quote_for_display(text), ok ? "" : " -- " + why);
  }
  std::cout << fmt::format("structured output checks: {} passed, {} failed (regex, JSON Schema, EBNF)\n", passed,
                           failed);
  return failed;
}

void add_structured_flags(CLI::App* sub, StructuredFlags& f) {
  sub->add_option("--json-schema", f.json_schema_file, "constrain every output to this JSON Schema (file)");
  sub->add_flag("--json-object", f.json_object, "constrain every output to a JSON object");
  sub->add_option("--regex", f.regex, "constrain every output to match this regex (whole output)");
  sub->add_option("--grammar", f.grammar_file, "constrain every output to this GBNF grammar (file, rule `root`)");
  sub->add_flag("--lenient-schema", f.lenient, "unsupported JSON Schema keywords are warnings, not errors");
}

StructuredOutputParams structured_params_from_flags(const StructuredFlags& f) {
  const int n = !f.json_schema_file.empty() + f.json_object + !f.regex.empty() + !f.grammar_file.empty();
  DI_CHECK(n <= 1) << "give at most one of --json-schema, --json-object, --regex, --grammar";
  DI_CHECK(!f.lenient || !f.json_schema_file.empty()) << "--lenient-schema applies to --json-schema only";
  auto read = [](const std::string& path, const char* flag) {
    std::ifstream in(path, std::ios::binary);
    DI_CHECK_CODE(in.good(), ErrorCode::kNotFound) << flag << ": cannot read " << path;
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  StructuredOutputParams p;
  if (!f.json_schema_file.empty()) {
    p = StructuredOutputParams::json_schema(read(f.json_schema_file, "--json-schema"));
    p.lenient = f.lenient;
  } else if (f.json_object) {
    p = StructuredOutputParams::json_object();
  } else if (!f.regex.empty()) {
    p = StructuredOutputParams::regex(f.regex);
  } else if (!f.grammar_file.empty()) {
    p = StructuredOutputParams::grammar(read(f.grammar_file, "--grammar"));
  }
  return p;
}

}  // namespace deepinfer::cli
