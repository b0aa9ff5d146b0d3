// Fuzzes the HTTP request-body layer shared by the OpenAI routes (chat completions, completions, responses after
// its translation to chat, and Anthropic messages through the same sampling parser): the nesting pre-check, JSON
// parsing and SamplingParams from the fields. Every outcome is parameters that validate, or an ApiError 400 that
// names a field; never a crash, another exception type or an unbounded walk.
#include <cstddef>
#include <cstdint>
#include <string>

#include "deepinfer/core/error.h"
#include "deepinfer/server/request_fields.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace deepinfer;
  const std::string body(reinterpret_cast<const char*>(data), size);
  server::RequestLimits limits;
  limits.max_json_depth = 32;
  limits.max_constraint_bytes = 1024;
  try {
    const server::Json j = server::parse_body(body, limits.max_json_depth);
    for (bool chat : {false, true}) {
      try {
        std::string field;
        SamplingParams p = server::parse_openai_sampling(j, chat, /*vocab_size=*/1000, limits, &field);
        validate(p, 1000);  // what the parser returns must be valid
        if (p.n < 1 || p.n > limits.max_n) __builtin_trap();
        if (p.structured.spec.size() > limits.max_constraint_bytes) __builtin_trap();
        server::fit_to_context(&p, 5, 64, "prompt");
        if (!p.max_tokens || *p.max_tokens < 1 || *p.max_tokens > 59) __builtin_trap();
      } catch (const server::ApiError& e) {
        if (e.status() != 400) __builtin_trap();
      }
    }
  } catch (const server::ApiError& e) {
    if (e.status() != 400) __builtin_trap();
  }
  return 0;
}
