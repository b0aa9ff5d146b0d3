#include "deepinfer/server/api_key.h"

#include <cstddef>

namespace deepinfer::server {

bool constant_time_equal(std::string_view presented, std::string_view secret) {
  // Accumulate every difference instead of returning at the first one; the length difference is folded in too.
  size_t diff = presented.size() ^ secret.size();
  for (size_t i = 0; i < secret.size(); ++i) {
    const unsigned char p = i < presented.size() ? static_cast<unsigned char>(presented[i]) : 0;
    diff |= static_cast<size_t>(p ^ static_cast<unsigned char>(secret[i]));
  }
  // Through a volatile so that the compiler cannot turn the accumulation back into an early exit.
  volatile size_t result = diff;
  return result == 0;
}

bool api_key_matches(std::string_view authorization, std::string_view x_api_key, std::string_view key) {
  if (key.empty()) return false;
  constexpr std::string_view kBearer = "bearer ";
  bool bearer_scheme = authorization.size() >= kBearer.size();
  for (size_t i = 0; bearer_scheme && i < kBearer.size(); ++i) {
    const char c = authorization[i];
    bearer_scheme = (c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c) == kBearer[i];
  }
  const std::string_view token = bearer_scheme ? authorization.substr(kBearer.size()) : std::string_view{};
  const bool by_bearer = constant_time_equal(token, key) && bearer_scheme;
  const bool by_header = constant_time_equal(x_api_key, key) && !x_api_key.empty();
  return by_bearer || by_header;
}

}  // namespace deepinfer::server
