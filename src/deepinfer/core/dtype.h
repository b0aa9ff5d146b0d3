// Element types and their conversions. Every narrowing conversion rounds to nearest, ties to even (RNE);
// overflow behaviour follows each format's definition (see to_* below) and is what PyTorch does.
#pragma once

#include <array>
#include <bit>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

namespace deepinfer {

enum class DType : uint8_t {
  kF32,
  kF16,
  kBF16,
  kF64,
  kF8E4M3,   // e4m3fn: no inf, 0x7F/0xFF = NaN, max 448
  kF8E5M2,   // IEEE-like with inf, max 57344
  kE8M0,     // unsigned power-of-two scale 2^(e-127); 0xFF = NaN
  kFP4E2M1,  // two per byte, low nibble first; {0, .5, 1, 1.5, 2, 3, 4, 6} with sign, no inf/NaN
  kI8,
  kU8,
  kI16,
  kI32,
  kI64,
  kBool,
};

// Size of one element in bits (4 for kFP4E2M1).
int dtype_bits(DType t);
std::string_view dtype_name(DType t);  // "bf16", "fp8_e4m3", ...
// safetensors header names: F32 F16 BF16 F64 F8_E4M3 F8_E5M2 F8_E8M0 F4 I8 U8 I16 I32 I64 BOOL.
std::string_view dtype_safetensors_name(DType t);
std::optional<DType> dtype_from_safetensors(std::string_view name);
bool dtype_is_float(DType t);
// Bytes needed for `numel` elements (rounded up for sub-byte types).
int64_t dtype_bytes(DType t, int64_t numel);

// ---- bf16 / f32 ----
inline float f32_from_bits(uint32_t b) { return std::bit_cast<float>(b); }
inline uint32_t f32_bits(float f) { return std::bit_cast<uint32_t>(f); }

inline float bf16_to_f32(uint16_t h) { return f32_from_bits(static_cast<uint32_t>(h) << 16); }
inline uint16_t f32_to_bf16(float f) {
  uint32_t b = f32_bits(f);
  if ((b & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((b >> 16) | 0x0040u);  // quiet NaN
  b += 0x7FFFu + ((b >> 16) & 1u);
  return static_cast<uint16_t>(b >> 16);
}
// Round a float to the nearest bf16 value, kept in float (the "cast to bf16" of the reference models).
inline float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

// ---- f16 ----
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);  // overflow -> inf

// ---- fp8 ----
extern const std::array<float, 256> kE4M3Table;
extern const std::array<float, 256> kE5M2Table;
inline float e4m3_to_f32(uint8_t v) { return kE4M3Table[v]; }
inline float e5m2_to_f32(uint8_t v) { return kE5M2Table[v]; }
uint8_t f32_to_e4m3(float f);  // |rounded| > 448 -> NaN (0x7F/0xFF), as torch's float8_e4m3fn cast
uint8_t f32_to_e5m2(float f);  // overflow -> inf
constexpr float kE4M3Max = 448.0f;

// ---- UE8M0 scale ----
inline float e8m0_to_f32(uint8_t e) {
  if (e == 0xFF) return f32_from_bits(0x7FC00000u);
  if (e == 0) return f32_from_bits(0x00400000u);  // 2^-127 is an f32 subnormal
  return f32_from_bits(static_cast<uint32_t>(e) << 23);
}
// Smallest power of two >= f for positive finite f (clamped to [2^-127, 2^127]); the scale rule of the
// quantizers: biased exponent + (mantissa != 0).
uint8_t f32_to_e8m0_ceil(float f);

// ---- fp4 e2m1 ----
extern const std::array<float, 16> kE2M1Table;
inline float e2m1_to_f32(uint8_t nibble) { return kE2M1Table[nibble & 0xF]; }
uint8_t f32_to_e2m1(float f);  // saturates to +-6; ties to the even code
inline uint8_t fp4_get(const uint8_t* packed, int64_t i) {
  return (i & 1) ? (packed[i >> 1] >> 4) : (packed[i >> 1] & 0xF);
}
inline void fp4_set(uint8_t* packed, int64_t i, uint8_t nibble) {
  uint8_t& b = packed[i >> 1];
  b = (i & 1) ? static_cast<uint8_t>((b & 0x0F) | (nibble << 4)) : static_cast<uint8_t>((b & 0xF0) | (nibble & 0xF));
}

// Reads element i of a buffer of type t as float (integers converted; fp4 from the packed layout).
float load_as_f32(const void* data, DType t, int64_t i);
// Writes float v as element i of type t with the conversions above (integers: round to nearest, saturate).
void store_from_f32(void* data, DType t, int64_t i, float v);

}  // namespace deepinfer
