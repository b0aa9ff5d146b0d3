// Fuzzes tokenizer.json loading (normalizers, pre-tokenizers with their regexes, BPE/WordLevel models, added
// tokens, decoders): either a deepinfer::Error or a tokenizer that encodes and decodes a fixed text.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "deepinfer/core/error.h"
#include "deepinfer/tokenizer/tokenizer.h"

namespace tk = deepinfer::tokenizer;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  std::unique_ptr<tk::Tokenizer> tok;
  try {
    tok = tk::Tokenizer::from_json(text);
  } catch (const deepinfer::Error&) {
    return 0;
  }
  // A tokenizer that loaded must handle any text; encoding may still refuse (e.g. an unknown piece with no
  // unk token) but only with an Error, and the ids it returns must decode.
  static const char* kSamples[] = {"Hello world 123 <s> [L] x", "日本語 ÜÑ\xff\xfe 4567 \t\n  a", ""};
  for (const char* s : kSamples) {
    for (auto mode :
         {tk::SpecialTokenMode::kRecognize, tk::SpecialTokenMode::kSpecialAsText, tk::SpecialTokenMode::kAllAsText}) {
      std::vector<int32_t> ids;
      try {
        ids = tok->encode(s, mode);
      } catch (const deepinfer::Error&) {
        continue;
      }
      for (int32_t id : ids) {
        if (!tok->is_valid_id(id)) __builtin_trap();
      }
      (void)tok->decode(ids);
      (void)tok->decode(ids, /*skip_special_tokens=*/true);
    }
  }
  for (int32_t id = -1; id <= tok->vocab_size() && id < 64; ++id) {
    (void)tok->id_to_token(id);
    if (tok->is_valid_id(id)) (void)tok->token_bytes(id);
  }
  return 0;
}
