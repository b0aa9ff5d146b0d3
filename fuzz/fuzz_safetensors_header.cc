// Fuzzes the safetensors header validator: any input is either accepted with consistent entries or rejected
// with deepinfer::Error; nothing else (crash, other exception, sanitizer report) is allowed.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "deepinfer/core/error.h"
#include "deepinfer/io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 8) return 0;
  uint64_t data_size = 0;
  for (int i = 0; i < 8; ++i) data_size = (data_size << 8) | data[i];
  data_size %= (uint64_t{1} << 40);
  std::string_view header(reinterpret_cast<const char*>(data + 8), size - 8);
  try {
    auto entries = deepinfer::parse_safetensors_header(header, data_size, nullptr, "fuzz");
    for (const auto& e : entries) {
      if (e.end > data_size || e.begin > e.end) __builtin_trap();  // accepted entries must be in range
    }
  } catch (const deepinfer::Error&) {
  }
  return 0;
}
