#include "deepinfer/sampling/rng.h"

#include "deepinfer/core/error.h"

namespace deepinfer {

namespace {
constexpr uint32_t kPhiloxM0 = 0xD2511F53u;
constexpr uint32_t kPhiloxM1 = 0xCD9E8D57u;
constexpr uint32_t kPhiloxW0 = 0x9E3779B9u;  // golden ratio
constexpr uint32_t kPhiloxW1 = 0xBB67AE85u;  // sqrt(3) - 1
}  // namespace

std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> c, std::array<uint32_t, 2> k) {
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kPhiloxM0) * c[0];
    const uint64_t p1 = static_cast<uint64_t>(kPhiloxM1) * c[2];
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    c = {hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0};
    k[0] += kPhiloxW0;
    k[1] += kPhiloxW1;
  }
  return c;
}

uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

double rng_uniform(const RngKey& key, int64_t position, uint32_t draw) {
  DI_CHECK(position >= 0 && position < (int64_t{1} << 32)) << "rng position out of range: " << position;
  const std::array<uint32_t, 4> counter = {static_cast<uint32_t>(position), draw, static_cast<uint32_t>(key.stream),
                                           static_cast<uint32_t>(key.stream >> 32)};
  const std::array<uint32_t, 2> k = {static_cast<uint32_t>(key.seed), static_cast<uint32_t>(key.seed >> 32)};
  const auto r = philox4x32_10(counter, k);
  const uint64_t bits = (static_cast<uint64_t>(r[0]) << 32 | r[1]) >> 11;
  return static_cast<double>(bits) * 0x1.0p-53;
}

}  // namespace deepinfer
