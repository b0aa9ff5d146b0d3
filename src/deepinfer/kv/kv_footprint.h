// KvFootprint: the bytes a model runner's caches really take, as the runner allocates them (storage precision
// and every layer included), so that cache sizing admits exactly what fits in the memory budget. The design
// formats in kv_layout (model_summary's cache_kinds) describe the checkpoint's intended cache; a runner may store
// more (the CPU/CUDA reference pages keep f32 rows, and a window row for every token and layer).
#pragma once

#include <cstdint>

namespace deepinfer {

struct KvFootprint {
  int64_t bytes_per_block = 0;  // one block of the engine's pool: every paged kind and layer
  int64_t bytes_per_slot = 0;   // one state slot: the most one sequence's per-slot state can hold
};

// What a runner's caches hold at one moment (to check a KvFootprint against).
struct KvAllocation {
  int64_t page_bytes = 0;      // the page pools
  int64_t slot_bytes = 0;      // every state slot
  int64_t max_slot_bytes = 0;  // the largest slot
  int64_t total() const { return page_bytes + slot_bytes; }
};

}  // namespace deepinfer
