// deepinfer structured-check: JSON Schema cases in the maskbench JSON Lines format (../shared/data/README.md:
// {"id", "schema", "tests": [{"valid", "data"}]}) through the structured-output compiler. One JSON line per case
// (compiled, or the error and its code; per instance accepted or rejected, compact and verbatim) and a summary
// line with the counts. With --tokenizer, each compact instance is also tokenized and fed token by token, every
// token checked against the matcher's full-vocabulary mask first (the path constrained decoding takes).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "deepinfer/cli/commands.h"
#include "deepinfer/core/error.h"
#include "deepinfer/engine/structured_output.h"
#include "deepinfer/structured/grammar_compiler.h"
#include "deepinfer/structured/grammar_matcher.h"
#include "deepinfer/tokenizer/tokenizer.h"

namespace deepinfer::cli {
namespace {

using json = nlohmann::ordered_json;  // keeps the schema's key order (properties order is the output order)

struct StructuredCheckArgs {
  std::string cases;
  std::string tokenizer;
  std::string eos = "<｜end▁of▁sentence｜>";
  bool lenient = false;
  int max_whitespace = 16;
};

// All whitespace outside string literals removed (the "compact" rendering of the maskbench harness).
std::string compact_json(const std::string& s) {
  std::string out;
  bool in_str = false, esc = false;
  for (char c : s) {
    if (in_str) {
      out += c;
      if (esc)
        esc = false;
      else if (c == '\\')
        esc = true;
      else if (c == '"')
        in_str = false;
    } else if (c == '"') {
      in_str = true;
      out += c;
    } else if (c != ' ' && c != '\n' && c != '\r' && c != '\t') {
      out += c;
    }
  }
  return out;
}

std::vector<std::string> read_lines(const std::string& path) {
  std::vector<std::string> lines;
  if (path.size() > 3 && path.compare(path.size() - 3, 3, ".gz") == 0) {
    std::ifstream probe(path);
    DI_CHECK_CODE(probe.good(), ErrorCode::kNotFound) << "--cases: cannot read " << path;
    FILE* p = popen(("gzip -dc '" + path + "'").c_str(), "r");
    DI_CHECK_CODE(p != nullptr, ErrorCode::kNotFound) << "--cases: cannot run gzip for " << path;
    std::string cur;
    for (int c; (c = std::fgetc(p)) != EOF;) {
      if (c == '\n')
        lines.push_back(std::exchange(cur, {}));
      else
        cur += static_cast<char>(c);
    }
    if (!cur.empty()) lines.push_back(cur);
    DI_CHECK(pclose(p) == 0) << "--cases: " << path << " is not a valid gzip file";
    return lines;
  }
  std::ifstream in(path);
  DI_CHECK_CODE(in.good(), ErrorCode::kNotFound) << "--cases: cannot read " << path;
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) lines.push_back(line);
  return lines;
}

int run_structured_check(const StructuredCheckArgs& a) {
  DI_CHECK(a.max_whitespace >= -1) << "--max-whitespace must be >= -1, got " << a.max_whitespace;
  std::unique_ptr<tokenizer::Tokenizer> tok;
  std::unique_ptr<structured::GrammarCompiler> compiler;
  TokenId eos = -1;
  if (!a.tokenizer.empty()) {
    tok = tokenizer::Tokenizer::from_file(a.tokenizer);
    const auto id = tok->token_to_id(a.eos);
    DI_CHECK(id.has_value()) << "--eos: the tokenizer has no token '" << a.eos << "'";
    eos = *id;
    const std::vector<TokenId> eos_ids{eos};
    compiler = std::make_unique<structured::GrammarCompiler>(
        make_structured_tokenizer_info(*tok, eos_ids, tok->vocab_size()), /*max_entries=*/1);
  }
  const std::vector<std::string> lines = read_lines(a.cases);
  int64_t cases = 0, compiled = 0, unsupported = 0, invalid_spec = 0, other_errors = 0;
  int64_t valid = 0, valid_accepted = 0, valid_verbatim_accepted = 0, invalid = 0, invalid_rejected = 0;
  int64_t token_checked = 0, token_accepted = 0, mask_mismatches = 0;
  for (size_t ln = 0; ln < lines.size(); ++ln) {
    json c;
    try {
      c = json::parse(lines[ln]);
    } catch (const json::exception& e) {
      DI_FAIL(ErrorCode::kInvalidArgument) << "--cases line " << ln + 1 << ": not JSON: " << e.what();
    }
    DI_CHECK(c.is_object() && c.contains("schema")) << "--cases line " << ln + 1 << ": needs a \"schema\"";
    ++cases;
    const auto started = std::chrono::steady_clock::now();
    const int64_t mismatches_before = mask_mismatches;
    json out;
    out["id"] = c.value("id", "line " + std::to_string(ln + 1));
    StructuredOutputParams p = StructuredOutputParams::json_schema(
        c["schema"].is_string() ? c["schema"].get<std::string>() : c["schema"].dump());
    p.lenient = a.lenient;
    p.max_whitespace = a.max_whitespace;
    std::shared_ptr<const structured::CompiledGrammar> grammar;
    std::shared_ptr<structured::TokenMaskCache> masks;
    try {
      std::vector<std::string> warnings;
      if (compiler) {
        structured::CompiledConstraint cc = compiler->compile(p);
        masks = cc.masks;
        grammar = masks->grammar_ptr();
        warnings = cc.warnings;
      } else {
        grammar = structured::compile_constraint_grammar(p, &warnings);
      }
      out["compiled"] = true;
      if (!warnings.empty()) out["warnings"] = warnings;
      ++compiled;
    } catch (const Error& e) {
      out["compiled"] = false;
      out["code"] = error_code_name(e.code());
      out["error"] = e.message();
      (e.code() == ErrorCode::kUnsupported       ? unsupported
       : e.code() == ErrorCode::kInvalidArgument ? invalid_spec
                                                 : other_errors)++;
    }
    if (grammar) {
      json instances = json::array();
      for (const auto& t : c.value("tests", json::array())) {
        const bool is_valid = t.value("valid", false);
        const std::string data = t.value("data", "");
        const std::string compact = compact_json(data);
        auto accepts = [&](const std::string& text) {
          structured::GrammarMatcher m(grammar);
          return m.accept_bytes(text) && m.can_terminate();
        };
        json r{{"valid", is_valid}, {"accepted", accepts(compact)}, {"accepted_verbatim", accepts(data)}};
        if (masks) {
          // Token path: every token must be in the mask computed before it, EOS last.
          std::vector<int32_t> ids = tok->encode(compact);
          ids.push_back(eos);
          structured::GrammarMatcher m(masks);
          std::vector<uint64_t> mask(structured::mask_words(masks->vocab().size()));
          bool ok = true;
          for (int32_t id : ids) {
            m.fill_mask(mask);
            const bool in_mask = structured::test_token_bit(mask, id);
            const bool accepted = m.accept_token(id);
            if (in_mask != accepted) ++mask_mismatches;
            if (!accepted) {
              ok = false;
              break;
            }
          }
          r["accepted_tokens"] = ok;
          ++token_checked;
          token_accepted += ok;
        }
        if (is_valid) {
          ++valid;
          valid_accepted += r["accepted"].get<bool>();
          valid_verbatim_accepted += r["accepted_verbatim"].get<bool>();
        } else {
          ++invalid;
          invalid_rejected += !r["accepted"].get<bool>();
        }
        instances.push_back(std::move(r));
      }
      out["instances"] = std::move(instances);
    }
    if (mask_mismatches > mismatches_before) out["mask_mismatches"] = mask_mismatches - mismatches_before;
    out["ms"] =
        std::round(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count());
    // Flushed per case: a driver (tools/structured_sweep.py) watches progress and restarts after a hung case.
    std::cout << out.dump(-1, ' ', false, json::error_handler_t::replace) << std::endl;
  }
  json summary{{"summary", true},
               {"cases", cases},
               {"compiled", compiled},
               {"unsupported", unsupported},
               {"invalid_schema", invalid_spec},
               {"other_errors", other_errors},
               {"valid", valid},
               {"valid_accepted", valid_accepted},
               {"valid_verbatim_accepted", valid_verbatim_accepted},
               {"invalid", invalid},
               {"invalid_rejected", invalid_rejected},
               {"invalid_accepted", invalid - invalid_rejected}};
  if (compiler) {
    summary["token_checked"] = token_checked;
    summary["token_accepted"] = token_accepted;
    summary["mask_mismatches"] = mask_mismatches;
  }
  std::cout << summary.dump() << "\n";
  return mask_mismatches == 0 ? 0 : 1;  // a mask that disagrees with the matcher is a bug; everything else is data
}

}  // namespace

void register_structured_check(CLI::App& app, CommandRegistry& reg) {
  auto* sub = app.add_subcommand("structured-check",
                                 "JSON Schema cases (maskbench JSON Lines) through the structured-output compiler");
  auto a = std::make_shared<StructuredCheckArgs>();
  sub->add_option("--cases", a->cases, "JSON Lines file (.gz read through gzip): {id, schema, tests:[{valid, data}]}")
      ->required();
  sub->add_option("--tokenizer", a->tokenizer, "tokenizer.json: also feed instances token by token through masks");
  sub->add_option("--eos", a->eos, "EOS token of --tokenizer")->capture_default_str();
  sub->add_flag("--lenient", a->lenient, "unsupported keywords are warnings (not enforced) instead of errors");
  sub->add_option("--max-whitespace", a->max_whitespace, "whitespace bytes per gap (-1 unbounded)")
      ->capture_default_str();
  reg.add(sub, [a] { return run_structured_check(*a); });
}

}  // namespace deepinfer::cli
