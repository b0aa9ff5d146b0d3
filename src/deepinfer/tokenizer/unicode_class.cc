#include "deepinfer/tokenizer/unicode_class.h"

#include <map>
#include <vector>

namespace deepinfer::tokenizer {
namespace {

// Oniguruma's \s: White_Space = \t-\r, space, U+0085, U+00A0, U+1680, U+2000-U+200A, U+2028, U+2029, U+202F,
// U+205F, U+3000 (unchanged since Unicode 6.3).
bool is_white_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

struct Built {
  UnicodeClassTable table;
  std::vector<uint8_t> bits;

  Built() {
    static constexpr uint8_t kCategoryBits[] = {0, kClassL, kClassN, kClassP, kClassS, kClassM};
    std::map<std::vector<uint8_t>, uint16_t> unique;  // identical blocks are stored once
    std::vector<uint8_t> block(256);
    size_t run = 0;
    for (uint32_t b = 0; b < UnicodeClassTable::kBlocks; ++b) {
      for (uint32_t i = 0; i < 256; ++i) {
        const char32_t c = (b << 8) | i;
        while (run + 1 < kUnicode16CategoryRunCount && kUnicode16CategoryRuns[run + 1].first <= c) ++run;
        block[i] = kCategoryBits[kUnicode16CategoryRuns[run].category] | (is_white_space(c) ? kClassSpace : 0);
      }
      auto [it, inserted] = unique.emplace(block, static_cast<uint16_t>(unique.size()));
      if (inserted) bits.insert(bits.end(), block.begin(), block.end());
      table.block[b] = it->second;
    }
    table.bits = bits.data();
  }
};

}  // namespace

const UnicodeClassTable& unicode_classes() {
  static const Built built;
  return built.table;
}

}  // namespace deepinfer::tokenizer
