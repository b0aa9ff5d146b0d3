#include "deepinfer/sampling/rng.h"

#include <gtest/gtest.h>

#include <set>

namespace deepinfer {
namespace {

// Known-answer vectors of Random123 (kat_vectors, philox4x32 10 rounds).
TEST(SamplingRng, PhiloxKnownAnswers) {
  EXPECT_EQ(philox4x32_10({0, 0, 0, 0}, {0, 0}),
            (std::array<uint32_t, 4>{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
  EXPECT_EQ(philox4x32_10({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, {0xffffffffu, 0xffffffffu}),
            (std::array<uint32_t, 4>{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}));
  EXPECT_EQ(philox4x32_10({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, {0xa4093822u, 0x299f31d0u}),
            (std::array<uint32_t, 4>{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}));
}

TEST(SamplingRng, PureFunctionOfKeyPositionAndDraw) {
  const RngKey k{42, 3};
  EXPECT_EQ(rng_uniform(k, 17), rng_uniform(k, 17));
  std::set<double> seen;
  for (uint64_t seed : {0ull, 1ull})
    for (uint64_t stream : {0ull, 1ull, 1ull << 40})
      for (int64_t pos : {0, 1, 1000})
        for (uint32_t draw : {0u, 1u}) seen.insert(rng_uniform({seed, stream}, pos, draw));
  EXPECT_EQ(seen.size(), 2u * 3 * 3 * 2) << "every coordinate must change the value";
}

TEST(SamplingRng, UniformInUnitIntervalAndEvenlySpread) {
  constexpr int kN = 100000, kBins = 20;
  std::vector<int> bins(kBins, 0);
  double sum = 0;
  for (int i = 0; i < kN; ++i) {
    const double u = rng_uniform({7, 9}, i);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
    ++bins[static_cast<int>(u * kBins)];
  }
  EXPECT_NEAR(sum / kN, 0.5, 0.005);
  double chi2 = 0;
  const double expected = static_cast<double>(kN) / kBins;
  for (int b : bins) chi2 += (b - expected) * (b - expected) / expected;
  EXPECT_LT(chi2, 43.8) << "chi-square with 19 degrees of freedom above its 0.999 quantile";
}

TEST(SamplingRng, PositionOutOfRangeIsRejected) {
  EXPECT_THROW(rng_uniform({1, 1}, -1), std::exception);
  EXPECT_THROW(rng_uniform({1, 1}, int64_t{1} << 32), std::exception);
}

}  // namespace
}  // namespace deepinfer
