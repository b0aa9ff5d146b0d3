// The element format of a paged pool as the CUDA kernels read it: f32, bf16 (--kv-cache-dtype bf16) or one of V4.1's
// quantized records (--kv-cache-dtype fp8, ops/kv_record.h: codes, then one scale byte a block, padded to 4 bytes).
// Host and device code both size rows with pool_row_bytes, which must agree with kv_record_bytes.
#pragma once

#include <cstdint>

#include "deepinfer/ops/cuda/host_device.h"

namespace deepinfer::cuda {

enum class PoolFormat : uint8_t {
  kF32,
  kBf16,
  kFp8Ue8m0B32,  // window rows: e4m3 codes, a UE8M0 scale per 32 (kWindowRecord)
  kFp4E4m3B16,   // compressed entries: e2m1 codes, an e4m3 scale per 16 (kEntryRecord)
  kFp4Ue8m0B32,  // indexer keys: e2m1 codes, a UE8M0 scale per 32 (kIndexKeyRecord)
};

DI_HD constexpr bool pool_record(PoolFormat f) { return f != PoolFormat::kF32 && f != PoolFormat::kBf16; }
DI_HD constexpr int record_block(PoolFormat f) { return f == PoolFormat::kFp4E4m3B16 ? 16 : 32; }
// Bytes of a record's codes; its scales follow them.
DI_HD constexpr int64_t record_code_bytes(PoolFormat f, int64_t width) {
  return f == PoolFormat::kFp8Ue8m0B32 ? width : width / 2;
}
DI_HD constexpr int64_t pool_row_bytes(PoolFormat f, int64_t width) {
  return f == PoolFormat::kF32    ? 4 * width
         : f == PoolFormat::kBf16 ? 2 * width
                                  : (record_code_bytes(f, width) + width / record_block(f) + 3) / 4 * 4;
}

}  // namespace deepinfer::cuda
