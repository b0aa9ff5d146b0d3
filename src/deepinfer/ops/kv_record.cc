#include "deepinfer/ops/kv_record.h"

#include <cmath>
#include <cstring>

#include "deepinfer/core/dtype.h"
#include "deepinfer/core/error.h"

namespace deepinfer {
namespace {

bool fp8(FakeQuantKind kind) { return kind == FakeQuantKind::kFP8E4M3Ue8m0Block32; }
bool e4m3_scale(FakeQuantKind kind) { return kind == FakeQuantKind::kFP4E4m3Block16; }

int64_t code_bytes(FakeQuantKind kind, int64_t width) { return fp8(kind) ? width : width / 2; }

uint8_t encode_one(FakeQuantKind kind, float v) { return fp8(kind) ? f32_to_e4m3(v) : f32_to_e2m1(v); }
float decode_one(FakeQuantKind kind, uint8_t code) { return fp8(kind) ? e4m3_to_f32(code) : e2m1_to_f32(code); }
float scale_of(FakeQuantKind kind, uint8_t byte) { return e4m3_scale(kind) ? e4m3_to_f32(byte) : e8m0_to_f32(byte); }

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof(float)) == 0; }

// Codes of v[0, n) under scale s into codes[]; true when every code times s gives its value back bit for bit.
bool try_scale(FakeQuantKind kind, const float* v, int n, float s, uint8_t* codes) {
  for (int i = 0; i < n; ++i) {
    codes[i] = encode_one(kind, v[i] / s);  // s is a power of two or divides the value exactly: no rounding
    if (!same_bits(decode_one(kind, codes[i]) * s, v[i])) return false;
  }
  return true;
}

// One block: its codes and scale byte. Power-of-two scales: the smallest that keeps the block's largest value inside
// the code range — never above the quantizer's own (which kept it inside), so each value is its code times a power of
// two >= 1, again a code (e4m3's and e2m1's grids are closed under doubling up to their maxima). e4m3 scales: the
// largest value is some code c times the quantizer's scale, so amax / c for each c of the grid is tried.
bool encode_block(FakeQuantKind kind, const float* v, int n, uint8_t* codes, uint8_t& scale) {
  float amax = 0.0f;
  bool finite = true;
  for (int i = 0; i < n; ++i) {
    finite = finite && std::isfinite(v[i]);
    amax = std::fmax(amax, std::fabs(v[i]));
  }
  if (!finite) {  // NaN codes (FP8) or a NaN scale (FP4): the block reads as NaNs, as an f32 cache would pass them on
    for (int i = 0; i < n; ++i) codes[i] = fp8(kind) ? 0x7F : 0;
    scale = e4m3_scale(kind) ? 0x7F : 0xFF;
    return true;
  }
  if (e4m3_scale(kind)) {
    if (amax == 0.0f) {
      scale = f32_to_e4m3(1.0f);
      return try_scale(kind, v, n, 1.0f, codes);
    }
    for (const float c : {6.0f, 4.0f, 3.0f, 2.0f, 1.5f, 1.0f, 0.5f}) {
      const float s = amax / c;
      const uint8_t code = f32_to_e4m3(s);
      if (!(s > 0.0f) || !same_bits(e4m3_to_f32(code), s)) continue;
      if (try_scale(kind, v, n, s, codes)) {
        scale = code;
        return true;
      }
    }
    return false;
  }
  // The smallest power of two >= amax / the code maximum (the ratio may be an f32 subnormal: the FP4 keys' quantizer
  // floors its scale at 2^-126, so blocks with amax < 6 · 2^-126 occur).
  scale = f32_to_e8m0_ceil(amax / (fp8(kind) ? kE4M3Max : 6.0f));
  return try_scale(kind, v, n, e8m0_to_f32(scale), codes);
}

}  // namespace

bool kv_record_kind(FakeQuantKind kind) {
  return kind == kWindowRecord || kind == kEntryRecord || kind == kIndexKeyRecord;
}

int64_t kv_record_bytes(FakeQuantKind kind, int64_t width) {
  DI_CHECK_INTERNAL(kv_record_kind(kind) && width % fake_quant_block_len(kind) == 0)
      << "kv record: no record of " << width << " values for this kind";
  return (code_bytes(kind, width) + width / fake_quant_block_len(kind) + 3) / 4 * 4;
}

bool kv_record_encode(FakeQuantKind kind, const float* row, int64_t width, uint8_t* record) {
  const int block = fake_quant_block_len(kind);
  const int64_t scales_at = code_bytes(kind, width);
  DI_CHECK_INTERNAL(kv_record_bytes(kind, width) > 0);
  uint8_t codes[32];
  const int64_t end = scales_at + width / block;
  std::memset(record + end, 0, kv_record_bytes(kind, width) - end);
  for (int64_t b = 0; b < width / block; ++b) {
    if (!encode_block(kind, row + b * block, block, codes, record[scales_at + b])) return false;
    for (int i = 0; i < block; ++i) {
      const int64_t at = b * block + i;
      if (fp8(kind))
        record[at] = codes[i];
      else
        fp4_set(record, at, codes[i]);
    }
  }
  return true;
}

void kv_record_decode(FakeQuantKind kind, const uint8_t* record, int64_t width, float* row) {
  const int block = fake_quant_block_len(kind);
  const int64_t scales_at = code_bytes(kind, width);
  for (int64_t b = 0; b < width / block; ++b) {
    const float s = scale_of(kind, record[scales_at + b]);
    for (int i = 0; i < block; ++i) {
      const int64_t at = b * block + i;
      row[at] = decode_one(kind, fp8(kind) ? record[at] : fp4_get(record, at)) * s;
    }
  }
}

}  // namespace deepinfer
