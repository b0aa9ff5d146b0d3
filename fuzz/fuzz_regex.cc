// Fuzzes the regex front end (the input is the pattern) and, when it compiles, the matcher and token masks
// (structured_fuzz_common.h): either a deepinfer::Error or a grammar that runs consistently.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "deepinfer/structured/regex.h"
#include "structured_fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace deepinfer::structured;
  try {
    Grammar g = grammar_from_regex(std::string_view(reinterpret_cast<const char*>(data), size));
    fuzz::exercise(g, data, size);
  } catch (const deepinfer::Error&) {
  }
  return 0;
}
