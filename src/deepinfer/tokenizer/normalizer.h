// Normalizers of tokenizer.json ("normalizer" field): Sequence, NFC/NFD/NFKC/NFKD, Lowercase, StripAccents,
// Strip, Replace, Prepend. DeepSeek's tokenizers ship an empty Sequence; the full set also serves the Engram
// compressed-id map (NFKC → NFD → StripAccents → Lowercase → Replace → Strip).
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

namespace deepinfer::tokenizer {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual std::string normalize(std::string_view text) const = 0;
};

// Parses one normalizer object; `path` names it in errors (e.g. "normalizer.normalizers[2]").
// Returns nullptr for JSON null and for an empty Sequence (the identity).
std::unique_ptr<Normalizer> parse_normalizer(const nlohmann::json& j, const std::string& path);

// Building blocks, also used directly by the Engram map.
enum class UnicodeForm { kNFC, kNFD, kNFKC, kNFKD };
std::string unicode_normalize(std::string_view text, UnicodeForm form);
// Rust's char::to_lowercase applied per code point (full mappings, no final-sigma context).
std::string lowercase(std::string_view text);
// Removes code points of General_Category Mark (what HF's StripAccents does after NFD).
std::string strip_accents(std::string_view text);
// Trims Unicode White_Space from either end.
std::string strip(std::string_view text, bool left, bool right);

}  // namespace deepinfer::tokenizer
