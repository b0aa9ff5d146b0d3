// The number-format conversions of core/dtype.h for the kernels, written to give the same bits as the host versions
// (RNE, the same saturation rules). Host and device code alike: the CPU tests run the device record encoder's source
// (kv_record.cuh) on the host against ops/kv_record.cc.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "deepinfer/ops/cuda/host_device.h"

namespace deepinfer::cuda {

// A value's bits as another type of its size (std::bit_cast is not device code without relaxed constexpr; a memcpy of
// a register is a move on either side).
template <class To, class From>
DI_HD To bits_as(From v) {
  static_assert(sizeof(To) == sizeof(From), "same size");
  To t;
  std::memcpy(&t, &v, sizeof t);
  return t;
}
DI_HD uint32_t bits_of_f32(float f) { return bits_as<uint32_t>(f); }
DI_HD float f32_of_bits(uint32_t u) { return bits_as<float>(u); }
DI_HD bool is_nan_bits(uint32_t b) { return (b & 0x7fffffffu) > 0x7f800000u; }

DI_HD float e8m0_to_f32_dev(uint8_t e) {
  if (e == 0xFF) return f32_of_bits(0x7FC00000u);
  if (e == 0) return f32_of_bits(0x00400000u);
  return f32_of_bits(static_cast<uint32_t>(e) << 23);
}

// f32_to_e8m0_ceil: the smallest UE8M0 power of two >= f (2^-127 at or below it, 2^127 above the range; NaN 0xFF).
DI_HD uint8_t f32_to_e8m0_ceil_dev(float f) {
  if (is_nan_bits(bits_of_f32(f))) return 0xFF;
  if (!(f > 0.0f)) return 0;
  const uint32_t b = bits_of_f32(f);
  const int e = static_cast<int>(b >> 23);
  const uint32_t m = b & 0x7FFFFFu;
  if (e == 0) return m > 0x400000u ? 1 : 0;  // a subnormal above 2^-127 takes 2^-126
  const int out = e + (m != 0 ? 1 : 0);
  return static_cast<uint8_t>(out > 254 ? 254 : out);
}
// Smallest power of two >= f, as f32_to_e8m0_ceil followed by e8m0_to_f32.
DI_HD float pow2_ceil_dev(float f) { return e8m0_to_f32_dev(f32_to_e8m0_ceil_dev(f)); }

DI_HD float e4m3_to_f32_dev(uint8_t v) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(v), __NV_E4M3)));
}
// RNE; callers clamp to ±448 first (where the host rounds an overflow to NaN, this saturates).
DI_HD uint8_t f32_to_e4m3_dev(float f) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E4M3));
}

DI_HD float e2m1_to_f32_dev(uint8_t nibble) {
  // Arithmetic decode (a table indexed at run time would live in local memory).
  const uint32_t e = (nibble >> 1) & 3u, m = nibble & 1u;
  const float v =
      e == 0 ? 0.5f * static_cast<float>(m) : (1.0f + 0.5f * static_cast<float>(m)) * static_cast<float>(1u << (e - 1));
  return (nibble & 8) ? -v : v;
}
// RNE onto {0, .5, 1, 1.5, 2, 3, 4, 6}, saturating at 6; at a midpoint the even code wins.
DI_HD uint8_t f32_to_e2m1_dev(float f) {
  if (is_nan_bits(bits_of_f32(f))) return 0;
  const uint8_t sign = bits_of_f32(f) >> 31 ? 0x8 : 0x0;
  const float a = fminf(fabsf(f), 6.0f);
  uint8_t c;
  if (a <= 0.25f)
    c = 0;
  else if (a < 0.75f)
    c = 1;
  else if (a <= 1.25f)
    c = 2;
  else if (a < 1.75f)
    c = 3;
  else if (a <= 2.5f)
    c = 4;
  else if (a < 3.5f)
    c = 5;
  else if (a <= 5.0f)
    c = 6;
  else
    c = 7;
  return sign | c;
}

DI_HD float bf16_bits_to_f32(uint16_t h) { return f32_of_bits(static_cast<uint32_t>(h) << 16); }

// f32 -> bf16 bits rounded to nearest even, a NaN kept with its payload's top bits and made quiet: the host's
// f32_to_bf16 bit for bit (cvt.rn.bf16.f32 would give every NaN the canonical 0x7fff), so caches written on either
// backend hold the same bytes.
DI_HD uint16_t f32_to_bf16_bits(float f) {
  uint32_t b = bits_of_f32(f);
  if ((b & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((b >> 16) | 0x0040u);
  b += 0x7fffu + ((b >> 16) & 1u);
  return static_cast<uint16_t>(b >> 16);
}

}  // namespace deepinfer::cuda
