#include "deepinfer/core/dtype.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

#include "deepinfer/core/error.h"

namespace deepinfer {

namespace {

struct DTypeInfo {
  DType type;
  int bits;
  std::string_view name;
  std::string_view st_name;
  bool is_float;
};

constexpr DTypeInfo kInfo[] = {
    {DType::kF32, 32, "f32", "F32", true},          {DType::kF16, 16, "f16", "F16", true},
    {DType::kBF16, 16, "bf16", "BF16", true},       {DType::kF64, 64, "f64", "F64", true},
    {DType::kF8E4M3, 8, "fp8_e4m3", "F8_E4M3", true}, {DType::kF8E5M2, 8, "fp8_e5m2", "F8_E5M2", true},
    {DType::kE8M0, 8, "e8m0", "F8_E8M0", true},     {DType::kFP4E2M1, 4, "fp4_e2m1", "F4", true},
    {DType::kI8, 8, "i8", "I8", false},             {DType::kU8, 8, "u8", "U8", false},
    {DType::kI16, 16, "i16", "I16", false},         {DType::kI32, 32, "i32", "I32", false},
    {DType::kI64, 64, "i64", "I64", false},         {DType::kBool, 8, "bool", "BOOL", false},
};

const DTypeInfo& info(DType t) {
  for (const auto& i : kInfo)
    if (i.type == t) return i;
  DI_FAIL(ErrorCode::kInternal) << "unknown dtype " << static_cast<int>(t);
}

// Decodes a small float format: 1 sign bit, `eb` exponent bits, `mb` mantissa bits, IEEE bias.
float decode_small(uint32_t v, int eb, int mb, bool ieee_inf, bool fn_nan) {
  const uint32_t sign = (v >> (eb + mb)) & 1;
  const uint32_t e = (v >> mb) & ((1u << eb) - 1);
  const uint32_t m = v & ((1u << mb) - 1);
  const int bias = (1 << (eb - 1)) - 1;
  float out;
  const uint32_t emax = (1u << eb) - 1;
  if (ieee_inf && e == emax) {
    out = m == 0 ? std::numeric_limits<float>::infinity() : std::numeric_limits<float>::quiet_NaN();
  } else if (fn_nan && e == emax && m == (1u << mb) - 1) {
    out = std::numeric_limits<float>::quiet_NaN();
  } else if (e == 0) {
    out = std::ldexp(static_cast<float>(m), 1 - bias - mb);
  } else {
    out = std::ldexp(static_cast<float>(m + (1u << mb)), static_cast<int>(e) - bias - mb);
  }
  return sign ? -out : out;
}

// Rounds |f| (finite, non-negative) to the grid of a format with `mb` mantissa bits whose smallest normal
// exponent is `emin`; returns the rounded magnitude as a double (exact). Ties go to the even mantissa.
double round_to_grid(double v, int mb, int emin) {
  if (v == 0) return 0;
  int e;
  std::frexp(v, &e);  // v = f * 2^e, f in [0.5, 1)
  int exp = std::max(e - 1, emin);
  double quantum = std::ldexp(1.0, exp - mb);
  double q = std::nearbyint(v / quantum);  // default rounding mode is to nearest, ties to even
  return q * quantum;
}

// Encodes finite magnitude `r` already on the grid into (exponent, mantissa) bits.
uint32_t encode_on_grid(double r, int eb, int mb) {
  if (r == 0) return 0;
  const int bias = (1 << (eb - 1)) - 1;
  int e;
  std::frexp(r, &e);
  int exp = e - 1;
  if (exp < 1 - bias) {  // subnormal
    return static_cast<uint32_t>(std::ldexp(r, bias - 1 + mb));
  }
  uint32_t mant = static_cast<uint32_t>(std::ldexp(r, mb - exp)) - (1u << mb);
  return (static_cast<uint32_t>(exp + bias) << mb) | mant;
}

template <size_t N>
std::array<float, N> make_table(int eb, int mb, bool ieee_inf, bool fn_nan) {
  std::array<float, N> t{};
  for (uint32_t i = 0; i < N; ++i) t[i] = decode_small(i, eb, mb, ieee_inf, fn_nan);
  return t;
}

}  // namespace

int dtype_bits(DType t) { return info(t).bits; }
std::string_view dtype_name(DType t) { return info(t).name; }
std::string_view dtype_safetensors_name(DType t) { return info(t).st_name; }
bool dtype_is_float(DType t) { return info(t).is_float; }
std::optional<DType> dtype_from_safetensors(std::string_view name) {
  for (const auto& i : kInfo)
    if (i.st_name == name) return i.type;
  return std::nullopt;
}
int64_t dtype_bytes(DType t, int64_t numel) { return (numel * dtype_bits(t) + 7) / 8; }

// Dynamic initialisation; no other static initialiser reads these tables.
const std::array<float, 256> kE4M3Table = make_table<256>(4, 3, false, true);
const std::array<float, 256> kE5M2Table = make_table<256>(5, 2, true, false);
const std::array<float, 16> kE2M1Table = make_table<16>(2, 1, false, false);

float f16_to_f32(uint16_t h) { return decode_small(h, 5, 10, true, false); }

uint16_t f32_to_f16(float f) {
  const uint32_t sign = (f32_bits(f) >> 31) << 15;
  if (std::isnan(f)) return static_cast<uint16_t>(sign | 0x7E00);
  double r = round_to_grid(std::fabs(static_cast<double>(f)), 10, -14);
  if (std::isinf(f) || r > 65504.0) return static_cast<uint16_t>(sign | 0x7C00);
  return static_cast<uint16_t>(sign | encode_on_grid(r, 5, 10));
}

uint8_t f32_to_e4m3(float f) {
  const uint32_t sign = (f32_bits(f) >> 31) << 7;
  if (std::isnan(f) || std::isinf(f)) return static_cast<uint8_t>(sign | 0x7F);
  double r = round_to_grid(std::fabs(static_cast<double>(f)), 3, -6);
  if (r > 448.0) return static_cast<uint8_t>(sign | 0x7F);
  return static_cast<uint8_t>(sign | encode_on_grid(r, 4, 3));
}

uint8_t f32_to_e5m2(float f) {
  const uint32_t sign = (f32_bits(f) >> 31) << 7;
  if (std::isnan(f)) return static_cast<uint8_t>(sign | 0x7E);
  double r = round_to_grid(std::fabs(static_cast<double>(f)), 2, -14);
  if (std::isinf(f) || r > 57344.0) return static_cast<uint8_t>(sign | 0x7C);
  return static_cast<uint8_t>(sign | encode_on_grid(r, 5, 2));
}

uint8_t f32_to_e2m1(float f) {
  const uint8_t sign = std::signbit(f) ? 0x8 : 0x0;
  if (std::isnan(f)) return 0;
  double r = round_to_grid(std::min(std::fabs(static_cast<double>(f)), 6.0), 1, 0);
  if (r > 6.0) r = 6.0;
  return static_cast<uint8_t>(sign | encode_on_grid(r, 2, 1));
}

uint8_t f32_to_e8m0_ceil(float f) {
  if (std::isnan(f)) return 0xFF;
  if (!(f > 0)) return 0;
  uint32_t b = f32_bits(f);
  int e = static_cast<int>(b >> 23);
  uint32_t m = b & 0x7FFFFFu;
  if (e == 0) return m > 0x400000u ? 1 : 0;  // a subnormal above 2^-127 (m · 2^-149) takes 2^-126
  int out = e + (m != 0 ? 1 : 0);
  return static_cast<uint8_t>(std::min(out, 254));
}

float load_as_f32(const void* data, DType t, int64_t i) {
  const auto* p = static_cast<const uint8_t*>(data);
  switch (t) {
    case DType::kF32: return reinterpret_cast<const float*>(p)[i];
    case DType::kF64: return static_cast<float>(reinterpret_cast<const double*>(p)[i]);
    case DType::kBF16: return bf16_to_f32(reinterpret_cast<const uint16_t*>(p)[i]);
    case DType::kF16: return f16_to_f32(reinterpret_cast<const uint16_t*>(p)[i]);
    case DType::kF8E4M3: return e4m3_to_f32(p[i]);
    case DType::kF8E5M2: return e5m2_to_f32(p[i]);
    case DType::kE8M0: return e8m0_to_f32(p[i]);
    case DType::kFP4E2M1: return e2m1_to_f32(fp4_get(p, i));
    case DType::kI8: return static_cast<float>(reinterpret_cast<const int8_t*>(p)[i]);
    case DType::kU8: return static_cast<float>(p[i]);
    case DType::kBool: return p[i] ? 1.0f : 0.0f;
    case DType::kI16: return static_cast<float>(reinterpret_cast<const int16_t*>(p)[i]);
    case DType::kI32: return static_cast<float>(reinterpret_cast<const int32_t*>(p)[i]);
    case DType::kI64: return static_cast<float>(reinterpret_cast<const int64_t*>(p)[i]);
  }
  DI_FAIL(ErrorCode::kInternal) << "load_as_f32: bad dtype";
}

template <typename I>
static I saturate_int(float v) {
  double r = std::nearbyint(static_cast<double>(v));
  if (std::isnan(r)) return 0;
  r = std::clamp<double>(r, static_cast<double>(std::numeric_limits<I>::min()),
                         static_cast<double>(std::numeric_limits<I>::max()));
  return static_cast<I>(r);
}

void store_from_f32(void* data, DType t, int64_t i, float v) {
  auto* p = static_cast<uint8_t*>(data);
  switch (t) {
    case DType::kF32: reinterpret_cast<float*>(p)[i] = v; return;
    case DType::kF64: reinterpret_cast<double*>(p)[i] = v; return;
    case DType::kBF16: reinterpret_cast<uint16_t*>(p)[i] = f32_to_bf16(v); return;
    case DType::kF16: reinterpret_cast<uint16_t*>(p)[i] = f32_to_f16(v); return;
    case DType::kF8E4M3: p[i] = f32_to_e4m3(v); return;
    case DType::kF8E5M2: p[i] = f32_to_e5m2(v); return;
    case DType::kE8M0: p[i] = f32_to_e8m0_ceil(v); return;
    case DType::kFP4E2M1: fp4_set(p, i, f32_to_e2m1(v)); return;
    case DType::kI8: reinterpret_cast<int8_t*>(p)[i] = saturate_int<int8_t>(v); return;
    case DType::kU8: p[i] = saturate_int<uint8_t>(v); return;
    case DType::kBool: p[i] = v != 0 ? 1 : 0; return;
    case DType::kI16: reinterpret_cast<int16_t*>(p)[i] = saturate_int<int16_t>(v); return;
    case DType::kI32: reinterpret_cast<int32_t*>(p)[i] = saturate_int<int32_t>(v); return;
    case DType::kI64: reinterpret_cast<int64_t*>(p)[i] = saturate_int<int64_t>(v); return;
  }
  DI_FAIL(ErrorCode::kInternal) << "store_from_f32: bad dtype";
}

}  // namespace deepinfer
