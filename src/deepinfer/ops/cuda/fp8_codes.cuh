// Code conversions for FP8 tensor-core operands, host and device: MXFP4's e2m1 codes widened to e4m3 bytes exactly
// (every e2m1 value {0, .5, 1, 1.5, 2, 3, 4, 6} is an e4m3 value), four codes a `prmt`. The groundwork of the e4m3
// wgmma path that --activation-quant mxfp8 opens (docs/PERF.md, "Next steps after session 26"; on sm_90a only wgmma
// runs e4m3 at the FP8 rate, mma.sync converts to f16). Host-callable, so that the bit tricks are tested exhaustively
// on the CPU (tests/ops/fp8_codes_test.cc).
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define DI_FP8_HD __host__ __device__ __forceinline__
#else
#define DI_FP8_HD inline
#endif

namespace deepinfer::cuda::fp8 {

// PTX prmt.b32 in its default mode: byte i of the result is byte (sel >> 4i) & 7 of the eight bytes {b, a} (a the
// low word); when bit 3 of that selector nibble is set, the chosen byte's sign bit is replicated instead. The host
// form spells the same rule out.
DI_FP8_HD uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
#if defined(__CUDA_ARCH__)
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
#else
  const uint64_t v = (static_cast<uint64_t>(b) << 32) | a;
  uint32_t d = 0;
  for (int i = 0; i < 4; ++i) {
    const uint32_t n = (sel >> (4 * i)) & 0xF;
    uint32_t byte = static_cast<uint32_t>(v >> (8 * (n & 7))) & 0xFF;
    if (n & 8) byte = (byte & 0x80) ? 0xFF : 0x00;
    d |= byte << (8 * i);
  }
  return d;
#endif
}

// The e4m3 bytes of the e2m1 magnitudes 0-7 (0, .5, 1, 1.5, 2, 3, 4, 6): a prmt table of two words.
constexpr uint32_t kE2m1MagLo = 0x3C383000u, kE2m1MagHi = 0x4C484440u;

// Shifts a block's UE8M0 scale may take relative to a reference exponent and stay exact in e4m3: every e2m1
// magnitude times 2^d is an e4m3 value for d in [-8, 6] (0.5 · 2^-8 is e4m3's smallest subnormal, 6 · 2^6 = 384 <=
// 448). A weight row whose block scales all lie within that span of one reference folds them into its codes, the
// reference applied once per output.
constexpr int kFoldShiftMin = -8, kFoldShiftMax = 6;

// The prmt table of the magnitudes times 2^d (kFoldShiftMin <= d <= kFoldShiftMax): byte m = e4m3(mag(m) · 2^d).
// With d = 0 it is kE2m1MagLo / kE2m1MagHi.
DI_FP8_HD void e2m1_e4m3_table(int d, uint32_t& lo, uint32_t& hi) {
  lo = hi = 0;
  for (int m = 1; m < 8; ++m) {
    // mag(m) = (1 + f/2) · 2^e: m = 1 is 0.5 (e2m1's subnormal), then e = m/2 - 1 with f = m & 1.
    const int e = m == 1 ? -1 : m / 2 - 1, f = m == 1 ? 0 : (m & 1), x = e + d;
    // Normal e4m3 from exponent -6 on (bias 7, 3 mantissa bits, f the top one); below it the value in units of 2^-9.
    const uint32_t byte =
        x >= -6 ? static_cast<uint32_t>(((x + 7) << 3) | (f << 2)) : static_cast<uint32_t>((2 + f) << (x + 9)) >> 1;
    if (m < 4)
      lo |= byte << (8 * m);
    else
      hi |= byte << (8 * (m - 4));
  }
}

// Eight e2m1 codes (code i in bits 4i..4i+3 of w, as MXFP4 packs them: the low nibble of a byte is the even element)
// as eight e4m3 bytes in the same order: lo holds codes 0-3 (byte i = code i), hi codes 4-7. Exact, signed zeros
// included (code 8 is -0: byte 0x80). Per half: one masked prmt for the magnitudes, one prmt that doubles the two
// code bytes, a shift and the masks for the signs (bit 3 of code i to bit 7 of byte i). tab_lo / tab_hi: the
// magnitudes' table (e2m1_e4m3_table: a block scale folded in; the default is the plain one).
DI_FP8_HD void e2m1x8_to_e4m3x8(uint32_t w, uint32_t& lo, uint32_t& hi, uint32_t tab_lo = kE2m1MagLo,
                                uint32_t tab_hi = kE2m1MagHi) {
  lo = prmt(tab_lo, tab_hi, w & 0x7777u);
  hi = prmt(tab_lo, tab_hi, (w >> 16) & 0x7777u);
  // Bytes [c01, c01, c23, c23] (c01: the byte of codes 0 and 1): code 2j's sign is bit 3 of its byte, 4 below where
  // byte 2j wants it; code 2j+1's is bit 7 already.
  const uint32_t y_lo = prmt(w, 0, 0x1100u), y_hi = prmt(w, 0, 0x3322u);
  lo |= ((y_lo << 4) & 0x00800080u) | (y_lo & 0x80008000u);
  hi |= ((y_hi << 4) & 0x00800080u) | (y_hi & 0x80008000u);
}

// The fold of an MXFP4 weight row's UE8M0 block scales into its e4m3 codes (the FP8 expert GEMM, gemm_wgmma_fp8.h).
// The row's fold exponent E is the largest scale among its blocks that hold a nonzero code; block b (scale S_b) widens
// through the table of shift d_b = S_b - E + kFoldShiftMax, so code · 2^(S_b - 127) = e4m3 byte · 2^(E - kFoldShiftMax
// - 127): the row's factor, applied once per output. Exact when every nonzero block has d_b >= kFoldShiftMin (a span
// of at most kFoldSpan below E: fold_row's `fits`); a block of zero codes is zero under any shift (fold_shift clamps
// its shift into the table's).
constexpr int kFoldSpan = kFoldShiftMax - kFoldShiftMin;
// E of a row without a nonzero block (any value would do: its products are zero).
constexpr int kFoldEmpty = 127;

DI_FP8_HD int fold_shift(int scale, int e) {
  const int d = scale - e + kFoldShiftMax;
  return d < kFoldShiftMin ? kFoldShiftMin : (d > kFoldShiftMax ? kFoldShiftMax : d);
}

// The f32 bits of a row's factor 2^(E - kFoldShiftMax - 127), exact for every E in [0, 255] (a subnormal below E = 7).
DI_FP8_HD uint32_t fold_factor_bits(int e) {
  const int biased = e - kFoldShiftMax;  // the f32 exponent field of the factor when normal
  return biased >= 1 ? static_cast<uint32_t>(biased) << 23 : 1u << (biased + 22);
}

// Whether a block of 32 e2m1 codes (16 bytes: four words) holds a nonzero value (-0 is zero).
DI_FP8_HD bool e2m1_block_nonzero(uint32_t w0, uint32_t w1, uint32_t w2, uint32_t w3) {
  return ((w0 | w1 | w2 | w3) & 0x77777777u) != 0;
}

struct FoldRow {
  int e = kFoldEmpty;
  bool fits = true;
};
// A row's fold from its `blocks` scales and codes (16 bytes a block, as MXFP4 stores a row: blocks * 16 bytes). The
// rule the device's fold kernel (run_mxfp4_fold) applies with a warp a row.
inline FoldRow fold_row(const uint8_t* scales, const uint8_t* codes, int64_t blocks) {
  int hi = -1, lo = 256;
  for (int64_t b = 0; b < blocks; ++b) {
    uint32_t w[4];
    std::memcpy(w, codes + 16 * b, sizeof(w));  // little-endian words, as the device loads them
    if (!e2m1_block_nonzero(w[0], w[1], w[2], w[3])) continue;
    hi = scales[b] > hi ? scales[b] : hi;
    lo = scales[b] < lo ? scales[b] : lo;
  }
  FoldRow f;
  if (hi >= 0) {
    f.e = hi;
    f.fits = lo >= hi - kFoldSpan;
  }
  return f;
}

}  // namespace deepinfer::cuda::fp8

#undef DI_FP8_HD
