#include "deepinfer/cli/structured_check.h"

#include "deepinfer/core/error.h"

namespace deepinfer::cli {

int run_structured_output_checks(EngineSetup&) {
  DI_FAIL(ErrorCode::kUnsupported)
      << "--check_structured_output: structured output (regex / JSON Schema / EBNF constraints) is not wired into "
         "the engine's sampler yet (issue 8); run without the flag";
}

}  // namespace deepinfer::cli
