// The FP8 operand conversions of ops/cuda/fp8_codes.cuh, on their host forms: prmt against the PTX rule written
// out on examples, and the e2m1 -> e4m3 widening exhaustively (every 16-bit pattern of four codes, both halves of a
// word): each byte must be the e4m3 code of exactly the e2m1 value (signed zero included).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>

#include "deepinfer/core/dtype.h"
#include "deepinfer/ops/cuda/fp8_codes.cuh"

namespace deepinfer {
namespace {

using cuda::fp8::prmt;

TEST(Fp8Codes, PrmtSelectsAndReplicatesSigns) {
  const uint32_t a = 0x83828180u, b = 0x07060504u;  // bytes 0-3 with the sign bit, 4-7 without
  EXPECT_EQ(prmt(a, b, 0x3210u), a);
  EXPECT_EQ(prmt(a, b, 0x7654u), b);
  EXPECT_EQ(prmt(a, b, 0x4701u), 0x04078081u);
  // Selector bit 3: the chosen byte's sign bit replicated (0x8x bytes -> 0xFF, 0x0x -> 0x00).
  EXPECT_EQ(prmt(a, b, 0x8C89u), 0xFF00FFFFu);
}

TEST(Fp8Codes, E2m1WidensToE4m3ExactlyForEveryCodePattern) {
  for (uint32_t half = 0; half < 0x10000u; ++half) {
    for (int shift : {0, 16}) {
      // The half at the word's low or high 16 bits, the other half a fixed pattern (it must not leak in).
      const uint32_t w = shift == 0 ? (half | 0xA5C30000u) : ((half << 16) | 0x5A3Cu);
      uint32_t lo = 0, hi = 0;
      cuda::fp8::e2m1x8_to_e4m3x8(w, lo, hi);
      const uint32_t got = shift == 0 ? lo : hi;
      for (int i = 0; i < 4; ++i) {
        const uint8_t code = static_cast<uint8_t>((half >> (4 * i)) & 0xF);
        const uint8_t byte = static_cast<uint8_t>(got >> (8 * i));
        const float want = e2m1_to_f32(code), have = e4m3_to_f32(byte);
        ASSERT_EQ(have, want) << "half " << std::hex << half << " code " << int(code) << " byte " << int(byte);
        ASSERT_EQ(std::signbit(have), std::signbit(want)) << "half " << std::hex << half << " code " << int(code);
      }
    }
  }
}

// A block scale folded into the table: for every shift of the exact span each magnitude's byte is the e4m3 code of
// mag · 2^d (subnormal results included), d = 0 is the plain table, and words widened through a shifted table give
// every code's value times 2^d with its sign. One step past the span is not exact (the bound is tight).
TEST(Fp8Codes, FoldedScalesStayExactOverTheSpan) {
  uint32_t lo = 0, hi = 0;
  cuda::fp8::e2m1_e4m3_table(0, lo, hi);
  EXPECT_EQ(lo, cuda::fp8::kE2m1MagLo);
  EXPECT_EQ(hi, cuda::fp8::kE2m1MagHi);
  for (int d = cuda::fp8::kFoldShiftMin; d <= cuda::fp8::kFoldShiftMax; ++d) {
    cuda::fp8::e2m1_e4m3_table(d, lo, hi);
    for (int m = 0; m < 8; ++m) {
      const uint8_t byte = static_cast<uint8_t>((m < 4 ? lo : hi) >> (8 * (m % 4)));
      ASSERT_EQ(e4m3_to_f32(byte), std::ldexp(e2m1_to_f32(static_cast<uint8_t>(m)), d)) << "d " << d << " m " << m;
    }
    for (uint32_t w : {0x01234567u, 0x89ABCDEFu, 0xF7E6D5C4u, 0x3B2A1908u}) {
      uint32_t a = 0, b = 0;
      cuda::fp8::e2m1x8_to_e4m3x8(w, a, b, lo, hi);
      for (int i = 0; i < 8; ++i) {
        const uint8_t code = static_cast<uint8_t>((w >> (4 * i)) & 0xF);
        const uint8_t byte = static_cast<uint8_t>((i < 4 ? a : b) >> (8 * (i % 4)));
        const float want = std::ldexp(e2m1_to_f32(code), d);
        ASSERT_EQ(e4m3_to_f32(byte), want) << "d " << d << " code " << int(code);
        ASSERT_EQ(std::signbit(e4m3_to_f32(byte)), std::signbit(want)) << "d " << d << " code " << int(code);
      }
    }
  }
  // Past the span: 1.5 · 2^-9 (d = -9) is no e4m3 value, nor is 6 · 2^7 = 768 (d = 7).
  EXPECT_NE(e4m3_to_f32(f32_to_e4m3(std::ldexp(1.5f, -9))), std::ldexp(1.5f, -9));
  EXPECT_NE(e4m3_to_f32(f32_to_e4m3(std::ldexp(6.0f, 7))), std::ldexp(6.0f, 7));
}

// The fold of a row's block scales (fold_row, fold_shift, fold_factor_bits): on random rows whose nonzero blocks span
// at most kFoldSpan below the largest scale, with all-zero blocks at scales far outside it, every code widened through
// its block's shifted table times the row's factor is exactly the code times its block scale (the value the CPU
// dequantizes); one block one binade further down makes the row not fit; a row of zero codes fits with kFoldEmpty.
TEST(Fp8Codes, FoldedRowsReproduceEveryBlockScaleExactly) {
  std::mt19937 rng(11);
  constexpr int kBlocks = 12;
  for (int trial = 0; trial < 400; ++trial) {
    uint8_t scales[kBlocks], codes[16 * kBlocks];
    const int top = 20 + static_cast<int>(rng() % 216);  // the row's largest scale, 20..235
    for (int b = 0; b < kBlocks; ++b) {
      const bool zero = b % 5 == 3;
      scales[b] =
          static_cast<uint8_t>(zero ? (b % 2 ? 0 : 254) : top - static_cast<int>(rng() % (cuda::fp8::kFoldSpan + 1)));
      for (int i = 0; i < 16; ++i)
        codes[16 * b + i] = zero ? static_cast<uint8_t>((rng() & 1) ? 0x88 : 0x00) : static_cast<uint8_t>(rng());
    }
    scales[0] = static_cast<uint8_t>(top);
    codes[0] |= 0x01;  // block 0 nonzero at the top scale
    const cuda::fp8::FoldRow f = cuda::fp8::fold_row(scales, codes, kBlocks);
    ASSERT_TRUE(f.fits) << "trial " << trial;
    ASSERT_EQ(f.e, top) << "trial " << trial;
    float factor = 0;
    const uint32_t bits = cuda::fp8::fold_factor_bits(f.e);
    std::memcpy(&factor, &bits, 4);
    ASSERT_EQ(factor, std::ldexp(1.0f, f.e - cuda::fp8::kFoldShiftMax - 127));
    for (int b = 0; b < kBlocks; ++b) {
      uint32_t lo = 0, hi = 0;
      cuda::fp8::e2m1_e4m3_table(cuda::fp8::fold_shift(scales[b], f.e), lo, hi);
      for (int wi = 0; wi < 4; ++wi) {
        uint32_t w = 0;
        std::memcpy(&w, codes + 16 * b + 4 * wi, 4);
        uint32_t a = 0, c = 0;
        cuda::fp8::e2m1x8_to_e4m3x8(w, a, c, lo, hi);
        for (int i = 0; i < 8; ++i) {
          const uint8_t code = static_cast<uint8_t>((w >> (4 * i)) & 0xF);
          const uint8_t byte = static_cast<uint8_t>((i < 4 ? a : c) >> (8 * (i % 4)));
          const double want = std::ldexp(static_cast<double>(e2m1_to_f32(code)), scales[b] - 127);
          ASSERT_EQ(static_cast<double>(e4m3_to_f32(byte)) * factor, want)
              << "trial " << trial << " block " << b << " scale " << int(scales[b]) << " code " << int(code);
        }
      }
    }
    // A nonzero block one binade below the span: the row no longer fits.
    scales[1] = static_cast<uint8_t>(top - cuda::fp8::kFoldSpan - 1);
    codes[16] |= 0x01;
    if (top - cuda::fp8::kFoldSpan - 1 >= 0) EXPECT_FALSE(cuda::fp8::fold_row(scales, codes, kBlocks).fits);
  }
  uint8_t zs[2] = {3, 250}, zc[32] = {};
  zc[5] = 0x80;  // -0
  const cuda::fp8::FoldRow z = cuda::fp8::fold_row(zs, zc, 2);
  EXPECT_TRUE(z.fits);
  EXPECT_EQ(z.e, cuda::fp8::kFoldEmpty);
  // The factor is exact down to E = 0 (subnormal f32).
  for (int e : {0, 1, 6, 7, 133, 255}) {
    const uint32_t bits = cuda::fp8::fold_factor_bits(e);
    float v = 0;
    std::memcpy(&v, &bits, 4);
    EXPECT_EQ(v, std::ldexp(1.0f, e - cuda::fp8::kFoldShiftMax - 127)) << "e " << e;
  }
}

}  // namespace
}  // namespace deepinfer
