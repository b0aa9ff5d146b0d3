#include "deepinfer/tokenizer/byte_level.h"

#include "deepinfer/tokenizer/utf8.h"

namespace deepinfer::tokenizer {
namespace {

struct Tables {
  std::array<char32_t, 256> byte_to_char{};
  std::array<int16_t, 512> char_to_byte{};  // every alphabet code point is < 0x200

  Tables() {
    char_to_byte.fill(-1);
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const char32_t c = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(0x100 + extra++);
      byte_to_char[b] = c;
      char_to_byte[c] = static_cast<int16_t>(b);
    }
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

}  // namespace

char32_t byte_to_char(uint8_t b) { return tables().byte_to_char[b]; }

std::optional<uint8_t> char_to_byte(char32_t c) {
  if (c >= 512) return std::nullopt;
  const int16_t b = tables().char_to_byte[c];
  if (b < 0) return std::nullopt;
  return static_cast<uint8_t>(b);
}

std::string bytes_to_alphabet(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char b : bytes) append_utf8(byte_to_char(b), &out);
  return out;
}

std::string alphabet_to_bytes(std::string_view token) {
  std::string out;
  out.reserve(token.size());
  size_t pos = 0;
  while (pos < token.size()) {
    if (utf8_sequence_length(token.substr(pos)) == 0) return std::string(token);
    const auto b = char_to_byte(next_code_point(token, &pos));
    if (!b) return std::string(token);
    out.push_back(static_cast<char>(*b));
  }
  return out;
}

}  // namespace deepinfer::tokenizer
