// The Engram compressed-id map of DeepSeek-V4.1 (MODELS.md Part A §2.5): token id → class id, where tokens
// whose text normalizes alike share a class (" The", "the", "THE").
//
// The reference (HF deepseek_v41 / DeepSeek's Engram code), per id in [0, vocab_size):
//   text = decode([id]); key = token string if text has U+FFFD (a partial UTF-8 byte token), else
//   normalize(text) or text if that is empty, with normalize = NFKC → NFD → StripAccents → Lowercase →
//   Replace([ \t\r\n]+, " ") → a lone " " kept apart from "" → Strip;
//   classes are numbered in order of first appearance.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "deepinfer/tokenizer/tokenizer.h"

namespace deepinfer::tokenizer {

struct EngramTokenMap {
  std::vector<int64_t> class_of;  // per token id
  int64_t num_classes = 0;
};

// The normalized key of one decoded token text (exposed for tests).
std::string engram_normalize(std::string_view text);

EngramTokenMap build_engram_token_map(const Tokenizer& tok);

}  // namespace deepinfer::tokenizer
