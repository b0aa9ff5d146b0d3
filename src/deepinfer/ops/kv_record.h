// Quantized cache records (--kv-cache-dtype fp8, V4.1): a cached row kept as the reference stores it, codes plus block
// scales, instead of the values those codes make. V4.1 fake-quantizes every row before caching it (MODELS.md: window
// rows FP8 e4m3 in blocks of 32 with a power-of-two scale, compressed entries FP4 e2m1 in blocks of 16 with an e4m3
// scale, indexer keys FP4 in blocks of 32 with a power-of-two scale), so a record holds a row exactly: decoding gives
// the f32 values back bit for bit, at 528 / 288 / 68 bytes a 512 / 512 / 128-value row instead of 1,024 / 1,024 / 256
// in bf16.
//
// Layout of one record of `width` values: the codes (FP8 one byte each; FP4 two a byte, the lower nibble first), then
// one scale byte a block (UE8M0: 2^(byte - 127); e4m3: the scale's code), then zero bytes up to a multiple of 4, so
// that every record of a pool starts 4-byte aligned (the CUDA loaders read 4 FP8 or 8 FP4 codes at a time; the
// reference's widths need none: 528 / 288 / 68 B). The encoder recovers codes and scales from
// the values (any that reproduce them; the quantizer's own are among them), so a writer needs only the rows it
// computed.
#pragma once

#include <cstdint>

#include "deepinfer/ops/ops.h"

namespace deepinfer {

// Whether rows fake-quantized by `kind` have a record (the three cache kinds above).
bool kv_record_kind(FakeQuantKind kind);
// Bytes of the record of a row of `width` values (width a whole number of the kind's blocks), padding included.
int64_t kv_record_bytes(FakeQuantKind kind, int64_t width);
// The record of `row` (width values) into `record`; false when a block's values are not codes of the kind times one
// of its scales (a row the kind did not fake-quantize). A block holding a NaN or an infinity is stored as NaNs.
bool kv_record_encode(FakeQuantKind kind, const float* row, int64_t width, uint8_t* record);
// The values of `record` into `row` (width values).
void kv_record_decode(FakeQuantKind kind, const uint8_t* record, int64_t width, float* row);

// The records of the V4.1 cache kinds.
constexpr FakeQuantKind kWindowRecord = FakeQuantKind::kFP8E4M3Ue8m0Block32;
constexpr FakeQuantKind kEntryRecord = FakeQuantKind::kFP4E4m3Block16;
constexpr FakeQuantKind kIndexKeyRecord = FakeQuantKind::kFP4Ue8m0Block32;

}  // namespace deepinfer
