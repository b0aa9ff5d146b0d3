// `deepinfer offline --check_structured_output`: regex, JSON Schema and EBNF constrained generations on the loaded
// model, reported pass/fail like the reference does. The hook lives here so that the structured-output work
// (issue 8) can fill it in once constraints reach the engine's sampler (SamplingContext::allowed_tokens).
#pragma once

#include "deepinfer/cli/engine_setup.h"

namespace deepinfer::cli {

// Runs the checks on `setup`'s engine; returns the number of failed checks. Until request constraints are
// wired into the engine it throws Unsupported saying so (never a silent pass).
int run_structured_output_checks(EngineSetup& setup);

}  // namespace deepinfer::cli
