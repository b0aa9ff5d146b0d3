// Fuzzes encode/decode of arbitrary bytes with the small tokenizers of tests/data/tokenizer.
// Input: byte 0 picks the tokenizer and the special-token mode, the tail is the text. Every id encode returns
// must be valid and decode, and streaming decode must equal decode; ids read from the tail (int16 pairs) decode or
// raise a deepinfer::Error.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "deepinfer/core/error.h"
#include "deepinfer/tokenizer/stream_decoder.h"
#include "deepinfer/tokenizer/tokenizer.h"

namespace tk = deepinfer::tokenizer;

namespace {
const std::vector<std::unique_ptr<tk::Tokenizer>>& tokenizers() {
  static const auto* all = [] {
    auto* v = new std::vector<std::unique_ptr<tk::Tokenizer>>;
    for (const char* name : {"synthetic_bpe", "synthetic_bpe_pairs", "synthetic_lowercase", "golden_v41_wordlevel",
                             "synthetic_split_Isolated_0", "synthetic_split_MergedWithNext_1",
                             "synthetic_split_Removed_0", "synthetic_split_Contiguous_1"}) {
      v->push_back(tk::Tokenizer::from_file(std::string(DEEPINFER_FUZZ_TOKENIZER_DIR) + "/" + name + ".json"));
    }
    return v;
  }();
  return *all;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const auto& toks = tokenizers();
  const tk::Tokenizer& tok = *toks[data[0] % toks.size()];
  const auto mode = static_cast<tk::SpecialTokenMode>((data[0] / toks.size()) % 3);
  std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  try {
    std::vector<int32_t> ids = tok.encode(text, mode);
    for (int32_t id : ids) {
      if (!tok.is_valid_id(id)) __builtin_trap();
    }
    // StreamDecoder's contract: the streamed chunks concatenate to decode(ids), byte for byte.
    for (bool skip : {false, true}) {
      std::string whole = tok.decode(ids, skip);
      tk::StreamDecoder stream(tok, skip);
      std::string streamed;
      for (int32_t id : ids) streamed += stream.step(id);
      streamed += stream.finish();
      if (streamed != whole) __builtin_trap();
    }
  } catch (const deepinfer::Error&) {
    // WordLevel without an unk token refuses unknown words: an Error is the contract.
  }
  std::vector<int32_t> raw(text.size() / 2);
  for (size_t i = 0; i < raw.size(); ++i) {
    int16_t v;
    std::memcpy(&v, text.data() + 2 * i, 2);
    raw[i] = v;
  }
  try {
    (void)tok.decode(raw);
  } catch (const deepinfer::Error&) {
  }
  return 0;
}
