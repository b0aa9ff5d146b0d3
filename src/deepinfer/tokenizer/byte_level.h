// GPT-2 style byte-level alphabet: every byte maps to one printable code point so that a BPE vocabulary can be
// stored as text. Bytes 0x21-0x7E, 0xA1-0xAC and 0xAE-0xFF map to themselves; the other 68 bytes map to
// U+0100.. in byte order (so ' ' is 'Ġ' U+0120 and '\n' is 'Ċ' U+010A).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace deepinfer::tokenizer {

// The code point that byte `b` is written as.
char32_t byte_to_char(uint8_t b);

// The byte a code point stands for, or nullopt when it is outside the alphabet.
std::optional<uint8_t> char_to_byte(char32_t c);

// The UTF-8 text of `bytes` written in the alphabet (what the ByteLevel pre-tokenizer produces).
std::string bytes_to_alphabet(std::string_view bytes);

// The ByteLevel decoder's rule for one token: if every code point is in the alphabet, the bytes they stand
// for; otherwise the token's own UTF-8 (HF keeps added tokens such as "<｜User｜>" verbatim this way).
std::string alphabet_to_bytes(std::string_view token);

}  // namespace deepinfer::tokenizer
