// Counter-based random numbers for sampling. A draw is a pure function of (seed, stream, position, draw index):
// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11) with the 64-bit seed as
// the key and (position, draw, stream) as the 128-bit counter. There is no generator state to carry, so a
// sequence samples the same tokens whether it runs alone, in a batch of 64, after a preemption, or on another
// device, and a speculative verifier can re-draw position p without replaying earlier draws.
#pragma once

#include <array>
#include <cstdint>

namespace deepinfer {

// One Philox4x32-10 block: 4 random 32-bit words for a counter and a key.
std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key);

// splitmix64's finalizer: a bijective 64-bit mix, used to derive unseeded streams from ids.
uint64_t mix64(uint64_t x);

// Which random stream a sequence draws from.
//   seeded request:   {seed, sample index}  — independent of request id and batch composition
//   unseeded request: {engine seed, mix64(sequence id)}
struct RngKey {
  uint64_t seed = 0;
  uint64_t stream = 0;
};

// A uniform double in [0, 1) with 53 random bits, for the token at `position` (< 2^32) and the `draw`-th value
// needed there (0 for plain sampling; the speculative verifier uses more).
double rng_uniform(const RngKey& key, int64_t position, uint32_t draw = 0);

}  // namespace deepinfer
