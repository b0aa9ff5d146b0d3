// `deepinfer offline --check_structured_output`: regex, JSON Schema and EBNF constrained generations on the loaded
// model (the same engine that then runs the ordinary prompts), reported pass/fail like the reference does. Each
// constraint runs greedy and sampled (two seeds); an output passes when it ended with EOS, its decoded text
// passes an independent check (JSON parse + the schema's rules written out, std::regex equivalents) and it is a
// sentence of the constraint's grammar. One "[structured] ..." line per generation and a summary line.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "deepinfer/cli/engine_setup.h"

namespace deepinfer::cli {

// Runs the checks on `setup`'s idle engine; returns the number of failed generations. Unsupported (never a
// silent pass) when the model has no tokenizer.json or a tokenizer whose tokens do not concatenate.
int run_structured_output_checks(EngineSetup& setup);

// The constraint flags of `deepinfer generate`: --json-schema FILE, --json-object, --regex PATTERN,
// --grammar FILE (GBNF), --lenient-schema. At most one constraint; InvalidArgument naming the flags otherwise,
// NotFound for an unreadable file. No flag: an inactive constraint.
struct StructuredFlags {
  std::string json_schema_file;
  bool json_object = false;
  std::string regex;
  std::string grammar_file;
  bool lenient = false;
};
void add_structured_flags(CLI::App* sub, StructuredFlags& flags);
StructuredOutputParams structured_params_from_flags(const StructuredFlags& flags);

}  // namespace deepinfer::cli
