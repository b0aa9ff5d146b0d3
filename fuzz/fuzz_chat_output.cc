// Fuzzes ChatOutputParser (reasoning / content / tool calls of model output, V3/V3.1/V4/V4.1 markup).
// Input: byte 0 picks format and thinking, byte 1 the chunk size; the tail is the model output. The parser's
// contract is checked: the totals are the same whether the text is fed whole or in chunks.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "deepinfer/core/error.h"
#include "deepinfer/tokenizer/chat_output_parser.h"

namespace tk = deepinfer::tokenizer;

namespace {
struct Totals {
  std::string reasoning, content, calls;
  bool operator==(const Totals&) const = default;
};

void add(Totals* t, const tk::ChatDelta& d) {
  t->reasoning += d.reasoning;
  t->content += d.content;
  for (const auto& c : d.tool_calls) t->calls += c.name + '\0' + c.arguments + '\0';
}

Totals run(tk::ChatFormat format, bool thinking, std::string_view text, size_t chunk) {
  tk::ChatOutputParser p(format, thinking);
  Totals t;
  for (size_t i = 0; i < text.size(); i += chunk) add(&t, p.feed(text.substr(i, chunk)));
  add(&t, p.finish());
  return t;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  static const tk::ChatFormat kFormats[] = {tk::ChatFormat::kV3, tk::ChatFormat::kV31, tk::ChatFormat::kV4,
                                            tk::ChatFormat::kV41};
  const tk::ChatFormat format = kFormats[data[0] % 4];
  const bool thinking = (data[0] / 4) % 2;
  const size_t chunk = 1 + data[1] % 16;
  std::string_view text(reinterpret_cast<const char*>(data + 2), size - 2);
  Totals whole, split;
  try {
    whole = run(format, thinking, text, text.size() + 1);
  } catch (const deepinfer::Error&) {
    return 0;
  }
  split = run(format, thinking, text, chunk);
  if (!(whole == split)) __builtin_trap();
  return 0;
}
