// Conversions checked against the formats' definitions. Rounding is monotonic, so checking every
// representable value, every midpoint between neighbours and the floats just beside each midpoint covers
// every place where the rounded result can change: the tests are exhaustive in that sense.
#include "deepinfer/core/dtype.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

namespace deepinfer {
namespace {

// Decoded value of a sign/exponent/mantissa format written directly from its definition.
double decode_definition(uint32_t code, int eb, int mb) {
  const int bias = (1 << (eb - 1)) - 1;
  const uint32_t s = (code >> (eb + mb)) & 1, e = (code >> mb) & ((1u << eb) - 1), m = code & ((1u << mb) - 1);
  double v = e == 0 ? std::pow(2.0, 1 - bias) * (m / std::pow(2.0, mb))
                    : std::pow(2.0, static_cast<int>(e) - bias) * (1 + m / std::pow(2.0, mb));
  return s ? -v : v;
}

struct Format {
  const char* name;
  int eb, mb;
  int codes;
  float (*decode)(uint32_t);
  uint32_t (*encode)(float);
  double max_finite;
  bool (*is_special)(uint32_t);  // NaN/inf codes
};

// The nearest representable value by brute force over the sorted non-negative codes; ties to the even code.
uint32_t nearest_definition(const std::vector<std::pair<double, uint32_t>>& table, double x) {
  double ax = std::fabs(x);
  auto it = std::lower_bound(table.begin(), table.end(), std::make_pair(ax, 0u));
  uint32_t best;
  if (it == table.begin()) {
    best = it->second;
  } else if (it == table.end()) {
    best = table.back().second;
  } else {
    auto lo = it - 1;
    double dlo = ax - lo->first, dhi = it->first - ax;
    if (dlo < dhi) best = lo->second;
    else if (dhi < dlo) best = it->second;
    else best = (lo->second & 1) == 0 ? lo->second : it->second;
  }
  return best;
}

void check_format(const Format& f) {
  const uint32_t sign_bit = 1u << (f.eb + f.mb);
  std::vector<std::pair<double, uint32_t>> table;  // non-negative finite values
  for (uint32_t c = 0; c < static_cast<uint32_t>(f.codes); ++c) {
    float got = f.decode(c);
    if (f.is_special(c)) {
      EXPECT_TRUE(std::isnan(got) || std::isinf(got)) << f.name << " code " << c;
      continue;
    }
    ASSERT_EQ(static_cast<double>(got), decode_definition(c, f.eb, f.mb)) << f.name << " code " << c;
    if (!(c & sign_bit)) table.push_back({got, c});
    // Every finite value encodes back to itself (-0 keeps its sign).
    EXPECT_EQ(f.encode(got), c) << f.name << " value " << got;
  }
  std::sort(table.begin(), table.end());
  auto check = [&](double x) {
    if (std::fabs(x) > f.max_finite) return;  // overflow rules are tested separately
    float xf = static_cast<float>(x);
    if (static_cast<double>(xf) != x) return;  // only values exactly representable as f32
    uint32_t want = nearest_definition(table, x) | (std::signbit(xf) ? sign_bit : 0);
    if ((want & ~sign_bit) == 0) want = std::signbit(xf) ? sign_bit : 0;
    ASSERT_EQ(f.encode(xf), want) << f.name << " x=" << x;
  };
  for (size_t i = 0; i + 1 < table.size(); ++i) {
    double a = table[i].first, b = table[i + 1].first, mid = (a + b) / 2;
    float midf = static_cast<float>(mid);
    for (double x : {a, mid, b, static_cast<double>(std::nextafter(midf, 0.0f)),
                     static_cast<double>(std::nextafter(midf, 1e30f))}) {
      check(x);
      check(-x);
    }
  }
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> u(-f.max_finite, f.max_finite);
  for (int i = 0; i < 200000; ++i) check(static_cast<float>(u(rng)));
}

TEST(DType, BF16AllCodesRoundTripAndRoundToNearestEven) {
  int checked = 0;
  for (uint32_t c = 0; c < 65536; ++c) {
    float v = bf16_to_f32(static_cast<uint16_t>(c));
    EXPECT_EQ(f32_bits(v), c << 16);
    if (std::isnan(v)) {
      EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(v))));
      continue;
    }
    EXPECT_EQ(f32_to_bf16(v), c);
    // The float halfway to the next code (upper 16 bits c, lower 0x8000) rounds to the even one of the two.
    uint32_t mid_bits = (c << 16) | 0x8000u;
    float mid = f32_from_bits(mid_bits);
    if (std::isnan(mid) || std::isinf(bf16_to_f32(static_cast<uint16_t>(c + 1)))) continue;
    uint16_t want = (c & 1) ? static_cast<uint16_t>(c + 1) : static_cast<uint16_t>(c);
    EXPECT_EQ(f32_to_bf16(mid), want) << "code " << c;
    EXPECT_EQ(f32_to_bf16(f32_from_bits(mid_bits - 1)), c);
    EXPECT_EQ(f32_to_bf16(f32_from_bits(mid_bits + 1)), static_cast<uint16_t>(c + 1));
    ++checked;
  }
  EXPECT_GT(checked, 60000);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7F80u);  // rounds up to inf, as IEEE RNE
}

TEST(DType, F16MatchesDefinition) {
  check_format({"f16", 5, 10, 65536, [](uint32_t c) { return f16_to_f32(static_cast<uint16_t>(c)); },
                [](float x) { return static_cast<uint32_t>(f32_to_f16(x)); }, 65504.0,
                [](uint32_t c) { return (c & 0x7C00) == 0x7C00; }});
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7BFF);  // below the halfway point to 65536
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7C00);  // halfway rounds to even = inf
  EXPECT_EQ(f32_to_f16(-1e9f), 0xFC00);
}

TEST(DType, E4M3MatchesDefinition) {
  check_format({"e4m3", 4, 3, 256, [](uint32_t c) { return e4m3_to_f32(static_cast<uint8_t>(c)); },
                [](float x) { return static_cast<uint32_t>(f32_to_e4m3(x)); }, 448.0,
                [](uint32_t c) { return (c & 0x7F) == 0x7F; }});
  EXPECT_EQ(e4m3_to_f32(0x7E), 448.0f);
  EXPECT_EQ(e4m3_to_f32(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(f32_to_e4m3(464.0f), 0x7E);   // halfway to the NaN slot rounds to even (448)
  EXPECT_EQ(f32_to_e4m3(465.0f), 0x7F);   // overflow is NaN, as torch's float8_e4m3fn cast
  EXPECT_EQ(f32_to_e4m3(-1e6f), 0xFF);
  EXPECT_TRUE(std::isnan(e4m3_to_f32(f32_to_e4m3(std::nanf("")))));
}

TEST(DType, E5M2MatchesDefinition) {
  check_format({"e5m2", 5, 2, 256, [](uint32_t c) { return e5m2_to_f32(static_cast<uint8_t>(c)); },
                [](float x) { return static_cast<uint32_t>(f32_to_e5m2(x)); }, 57344.0,
                [](uint32_t c) { return (c & 0x7C) == 0x7C; }});
  EXPECT_EQ(f32_to_e5m2(61439.0f), 0x7B);
  EXPECT_EQ(f32_to_e5m2(61440.0f), 0x7C);  // halfway to 65536 rounds to even = inf
  EXPECT_TRUE(std::isinf(e5m2_to_f32(0x7C)));
}

TEST(DType, E2M1MatchesDefinitionAndSaturates) {
  check_format({"e2m1", 2, 1, 16, [](uint32_t c) { return e2m1_to_f32(static_cast<uint8_t>(c)); },
                [](float x) { return static_cast<uint32_t>(f32_to_e2m1(x)); }, 6.0,
                [](uint32_t) { return false; }});
  const float grid[] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  for (int c = 0; c < 8; ++c) {
    EXPECT_EQ(e2m1_to_f32(static_cast<uint8_t>(c)), grid[c]);
    EXPECT_EQ(e2m1_to_f32(static_cast<uint8_t>(c | 8)), -grid[c]);
  }
  // The tie table of MODELS.md §3.3.
  EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(0.25f)), 0.0f);
  EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(0.75f)), 1.0f);
  EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(1.25f)), 1.0f);
  EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(1.75f)), 2.0f);
  EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(2.5f)), 2.0f);
  EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(3.5f)), 4.0f);
  EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(5.0f)), 4.0f);
  EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(7.0f)), 6.0f);
  EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(-100.0f)), -6.0f);
}

TEST(DType, Fp4PackingIsLowNibbleFirst) {
  uint8_t buf[2] = {0, 0};
  fp4_set(buf, 0, 0x3);
  fp4_set(buf, 1, 0xA);
  fp4_set(buf, 2, 0x7);
  EXPECT_EQ(buf[0], 0xA3);
  EXPECT_EQ(buf[1], 0x07);
  EXPECT_EQ(fp4_get(buf, 0), 0x3);
  EXPECT_EQ(fp4_get(buf, 1), 0xA);
  EXPECT_EQ(load_as_f32(buf, DType::kFP4E2M1, 1), -1.0f);
}

TEST(DType, E8M0IsPowerOfTwoAndCeilMatchesDefinition) {
  for (int e = 1; e < 255; ++e) EXPECT_EQ(e8m0_to_f32(static_cast<uint8_t>(e)), std::ldexp(1.0f, e - 127));
  EXPECT_EQ(e8m0_to_f32(0), std::ldexp(1.0f, -127));
  EXPECT_TRUE(std::isnan(e8m0_to_f32(0xFF)));
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-30, 30);
  for (int i = 0; i < 100000; ++i) {
    float x = std::exp2(u(rng));
    float s = e8m0_to_f32(f32_to_e8m0_ceil(x));
    EXPECT_GE(s, x);
    EXPECT_LT(s / 2, x);  // the smallest power of two >= x
  }
  EXPECT_EQ(f32_to_e8m0_ceil(1.0f), 127);
  EXPECT_EQ(f32_to_e8m0_ceil(1.0000001f), 128);
  // Subnormals: 2^-127 covers those up to itself, 2^-126 the ones above it (the record encoder's FP4 key blocks).
  EXPECT_EQ(f32_to_e8m0_ceil(std::ldexp(1.0f, -130)), 0);
  EXPECT_EQ(f32_to_e8m0_ceil(std::ldexp(1.0f, -127)), 0);
  EXPECT_EQ(f32_to_e8m0_ceil(std::ldexp(1.5f, -127)), 1);
  EXPECT_EQ(f32_to_e8m0_ceil(std::ldexp(1.0f, -126)), 1);
}

TEST(DType, SafetensorsNamesRoundTrip) {
  for (auto t : {DType::kF32, DType::kF16, DType::kBF16, DType::kF64, DType::kF8E4M3, DType::kF8E5M2, DType::kE8M0,
                 DType::kFP4E2M1, DType::kI8, DType::kU8, DType::kI16, DType::kI32, DType::kI64, DType::kBool}) {
    auto back = dtype_from_safetensors(dtype_safetensors_name(t));
    ASSERT_TRUE(back.has_value());
    EXPECT_EQ(*back, t);
  }
  EXPECT_FALSE(dtype_from_safetensors("F12").has_value());
  EXPECT_EQ(dtype_bytes(DType::kFP4E2M1, 5), 3);
  EXPECT_EQ(dtype_bytes(DType::kBF16, 5), 10);
}

TEST(DType, IntegerStoresSaturate) {
  int8_t i8[1];
  store_from_f32(i8, DType::kI8, 0, 1000.0f);
  EXPECT_EQ(i8[0], 127);
  store_from_f32(i8, DType::kI8, 0, -2.5f);
  EXPECT_EQ(i8[0], -2);  // ties to even
}

}  // namespace
}  // namespace deepinfer
