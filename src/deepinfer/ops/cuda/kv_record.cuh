// Quantized cache records on the device (ops/kv_record.h has the layout and the encoder's rule; pool_format.h the
// formats). The encoder repeats the host's search step for step, so a record written on the GPU is the CPU's byte for
// byte, and the decoder the host's arithmetic (code value times scale, one f32 multiply), so both read the same values.
// All of it is host code too, which the CPU tests run against ops/kv_record.cc.
#pragma once

#include <vector_functions.h>
#include <vector_types.h>

#include <cstdint>

#include "deepinfer/ops/cuda/format_math.cuh"
#include "deepinfer/ops/cuda/pool_format.h"

namespace deepinfer::cuda {

// A read-only load: through the read-only data cache on the device.
template <typename T>
DI_HD T load_ro(const T* p) {
#ifdef __CUDA_ARCH__
  return __ldg(p);
#else
  return *p;
#endif
}

DI_HD float record_scale(PoolFormat f, uint8_t byte) {
  return f == PoolFormat::kFp4E4m3B16 ? e4m3_to_f32_dev(byte) : e8m0_to_f32_dev(byte);
}
DI_HD float record_code(PoolFormat f, uint8_t code) {
  return f == PoolFormat::kFp8Ue8m0B32 ? e4m3_to_f32_dev(code) : e2m1_to_f32_dev(code);
}

// Values 4·i .. 4·i + 3 of a record of `width` values as loaded: their codes (FP8: 4 bytes; FP4: 2 bytes, in the low
// half) and their block's scale byte (the record 4-byte aligned: one 4- or 2-byte load and one byte load). Fetching
// and decoding apart lets a kernel keep many rows' loads in flight in few registers.
struct RecordQuad {
  uint32_t codes, scale;
};
DI_HD float4 record_decode4(RecordQuad q, PoolFormat f) {
  const float s = record_scale(f, static_cast<uint8_t>(q.scale));
  const uint32_t c = q.codes;
  if (f == PoolFormat::kFp8Ue8m0B32)
    return make_float4(e4m3_to_f32_dev(c & 0xFFu) * s, e4m3_to_f32_dev((c >> 8) & 0xFFu) * s,
                       e4m3_to_f32_dev((c >> 16) & 0xFFu) * s, e4m3_to_f32_dev(c >> 24) * s);
  return make_float4(e2m1_to_f32_dev(c & 0xFu) * s, e2m1_to_f32_dev((c >> 4) & 0xFu) * s,
                     e2m1_to_f32_dev((c >> 8) & 0xFu) * s, e2m1_to_f32_dev((c >> 12) & 0xFu) * s);
}
DI_HD RecordQuad record_fetch4(const void* record, int64_t i, PoolFormat f, int64_t width) {
  const auto* rec = static_cast<const uint8_t*>(record);
  RecordQuad q;
  q.scale = load_ro(rec + record_code_bytes(f, width) + 4 * i / record_block(f));
  q.codes = f == PoolFormat::kFp8Ue8m0B32 ? load_ro(reinterpret_cast<const uint32_t*>(rec) + i)
                                          : static_cast<uint32_t>(load_ro(reinterpret_cast<const uint16_t*>(rec) + i));
  return q;
}
// Values 4·i .. 4·i + 3 of a record of `width` values.
DI_HD float4 record_load4(const void* record, int64_t i, PoolFormat f, int64_t width) {
  return record_decode4(record_fetch4(record, i, f, width), f);
}
DI_HD float record_load1(const void* record, int64_t i, PoolFormat f, int64_t width) {
  const auto* rec = static_cast<const uint8_t*>(record);
  const float s = record_scale(f, load_ro(rec + record_code_bytes(f, width) + i / record_block(f)));
  if (f == PoolFormat::kFp8Ue8m0B32) return e4m3_to_f32_dev(load_ro(rec + i)) * s;
  const uint8_t b = load_ro(rec + i / 2);
  return e2m1_to_f32_dev(i & 1 ? b >> 4 : b & 0xFu) * s;
}

namespace record_detail {
// A block stored as NaNs: NaN codes (FP8) or a NaN scale (FP4).
DI_HD void nan_block(PoolFormat f, int n, uint8_t* codes, uint8_t& scale) {
  for (int i = 0; i < n; ++i) codes[i] = f == PoolFormat::kFp8Ue8m0B32 ? 0x7F : 0;
  scale = f == PoolFormat::kFp4E4m3B16 ? 0x7F : 0xFF;
}
DI_HD uint8_t encode_one(PoolFormat f, float v) {
  return f == PoolFormat::kFp8Ue8m0B32 ? f32_to_e4m3_dev(v) : f32_to_e2m1_dev(v);
}
// kv_record.cc's try_scale.
DI_HD bool try_scale(PoolFormat f, const float* v, int n, float s, uint8_t* codes) {
  bool ok = true;
  for (int i = 0; i < n; ++i) {
    codes[i] = encode_one(f, v[i] / s);
    ok = ok && bits_of_f32(record_code(f, codes[i]) * s) == bits_of_f32(v[i]);
  }
  return ok;
}
}  // namespace record_detail

// kv_record.cc's encode_block: the codes of n values (16 or 32) and the block's scale byte; false when they are not
// codes of the format times one scale. A block with a NaN or an infinity gets NaN codes (FP8) or a NaN scale (FP4).
DI_HD bool record_encode_block(PoolFormat f, const float* v, int n, uint8_t* codes, uint8_t& scale) {
  float amax = 0.0f;
  bool finite = true;
  for (int i = 0; i < n; ++i) {
    finite = finite && (bits_of_f32(v[i]) & 0x7f800000u) != 0x7f800000u;
    amax = fmaxf(amax, fabsf(v[i]));
  }
  if (!finite) {
    record_detail::nan_block(f, n, codes, scale);
    return true;
  }
  if (f == PoolFormat::kFp4E4m3B16) {
    if (amax == 0.0f) {
      scale = f32_to_e4m3_dev(1.0f);
      return record_detail::try_scale(f, v, n, 1.0f, codes);
    }
    const float grid[7] = {6.0f, 4.0f, 3.0f, 2.0f, 1.5f, 1.0f, 0.5f};
#pragma unroll
    for (int c = 0; c < 7; ++c) {
      const float s = amax / grid[c];
      const uint8_t code = f32_to_e4m3_dev(s);
      if (!(s > 0.0f) || bits_of_f32(e4m3_to_f32_dev(code)) != bits_of_f32(s)) continue;
      if (record_detail::try_scale(f, v, n, s, codes)) {
        scale = code;
        return true;
      }
    }
    return false;
  }
  scale = f32_to_e8m0_ceil_dev(amax / (f == PoolFormat::kFp8Ue8m0B32 ? 448.0f : 6.0f));
  return record_detail::try_scale(f, v, n, e8m0_to_f32_dev(scale), codes);
}

// Block b of the record of `row` (width values) into `record`: its codes and scale byte, and (b == 0) the padding.
// A block that is no record of the format is stored as NaNs and reported (false).
DI_HD bool record_write_block(PoolFormat f, const float* row, int64_t width, int64_t b, uint8_t* record) {
  const int n = record_block(f);
  const int64_t scales_at = record_code_bytes(f, width);
  uint8_t codes[32];
  uint8_t scale = 0;
  const bool ok = record_encode_block(f, row + b * n, n, codes, scale);
  if (!ok) record_detail::nan_block(f, n, codes, scale);
  if (f == PoolFormat::kFp8Ue8m0B32) {
    for (int i = 0; i < n; ++i) record[b * n + i] = codes[i];
  } else {
    for (int i = 0; i < n; i += 2) record[(b * n + i) / 2] = static_cast<uint8_t>(codes[i] | codes[i + 1] << 4);
  }
  record[scales_at + b] = scale;
  if (b == 0)
    for (int64_t i = scales_at + width / n; i < pool_row_bytes(f, width); ++i) record[i] = 0;
  return ok;
}

}  // namespace deepinfer::cuda
