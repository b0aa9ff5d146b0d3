// BlockTable: the blocks of one sequence, in token order. Block i holds positions [i*block_size,
// (i+1)*block_size) of every paged cache kind; a kind with compression ratio r keeps entries
// [i*block_size/r, (i+1)*block_size/r) of that sequence in block i (block_size is a multiple of every r).
#pragma once

#include <cstdint>
#include <vector>

#include "deepinfer/kv/block_allocator.h"

namespace deepinfer {

using BlockTable = std::vector<BlockId>;

inline int64_t blocks_for_tokens(int64_t num_tokens, int block_size) {
  return (num_tokens + block_size - 1) / block_size;
}

}  // namespace deepinfer
