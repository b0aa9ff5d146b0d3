// Fuzzes the chat path of a request: JSON messages → parse_chat_request → render_chat for every format →
// encode_prompt. Either a deepinfer::Error (malformed messages, a special token the tokenizer lacks) or a
// prompt whose special-token ranges are ascending, disjoint and inside the text.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "deepinfer/core/error.h"
#include "deepinfer/tokenizer/chat_encoding.h"
#include "deepinfer/tokenizer/tokenizer.h"

namespace tk = deepinfer::tokenizer;

namespace {
void check_prompt(const tk::RenderedPrompt& p) {
  size_t prev_end = 0;
  for (const auto& [b, e] : p.special_ranges) {
    if (b < prev_end || e <= b || e > p.text.size()) __builtin_trap();
    prev_end = e;
  }
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const auto tok = tk::Tokenizer::from_file(std::string(DEEPINFER_FUZZ_TOKENIZER_DIR) + "/synthetic_bpe.json");
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return 0;
  for (bool require_object : {true, false}) {
    tk::ChatRequest req;
    try {
      req = tk::parse_chat_request(j, tk::ChatParseOptions{.require_json_object_arguments = require_object});
    } catch (const deepinfer::Error&) {
      continue;
    }
    for (auto format : {tk::ChatFormat::kV3, tk::ChatFormat::kV31, tk::ChatFormat::kV4, tk::ChatFormat::kV41}) {
      try {
        tk::RenderedPrompt p = tk::render_chat(req, format);
        check_prompt(p);
        (void)tk::encode_prompt(*tok, p);
      } catch (const deepinfer::Error&) {
      }
    }
  }
  return 0;
}
