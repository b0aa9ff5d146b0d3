// Fuzzes the JSON Schema front end (the input is the schema text; its length's parity picks lenient mode) and,
// when it compiles, the matcher and token masks (structured_fuzz_common.h): either a deepinfer::Error or a grammar
// that runs consistently.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "deepinfer/structured/json_schema.h"
#include "structured_fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace deepinfer::structured;
  try {
    JsonSchemaOptions o;
    o.lenient = size % 2 == 1;
    o.max_whitespace = 2;
    JsonSchemaGrammar g = json_schema_to_grammar(std::string_view(reinterpret_cast<const char*>(data), size), o);
    fuzz::exercise(g.grammar, data, size);
  } catch (const deepinfer::Error&) {
  }
  return 0;
}
