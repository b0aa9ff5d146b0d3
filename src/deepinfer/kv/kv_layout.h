// KvLayout: the cache kinds of a model (model_summary.h's cache_kinds) classified for the engine, and the sizing
// of the cache pools from a memory budget.
//
// Two granularities of storage:
//   paged kinds (bytes_per_token > 0: MLA latents, V4 compressed entries, indexer keys) live in token blocks;
//     one block id addresses block_size tokens of every paged kind at once, so a sequence has one block table.
//   per-sequence kinds (fixed bytes: SWA rings, compressor pending state, Engram look-back) live in state
//     slots, one per running sequence (at most max_num_seqs).
// Prefix reuse: a kind is prefix-reusable if its content for a cached prefix can be had without running the
// prefix — paged kinds (the blocks themselves), V4.1 compressor state (empty at a block boundary because
// block_size is a multiple of every ratio), Engram look-back (recomputed from token ids). The SWA ring is not:
// it holds the last `window` tokens' KV, which a later sequence can only rebuild by re-running those tokens
// ("bounded replay", replay_tokens = window).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "deepinfer/kv/kv_cache_manager.h"
#include "deepinfer/kv/kv_footprint.h"
#include "deepinfer/model/model_config.h"
#include "deepinfer/model/model_summary.h"

namespace deepinfer {

struct CacheKindSpec {
  CacheKind kind;
  bool paged = false;           // stored in token blocks (bytes_per_token > 0)
  bool prefix_reusable = true;  // see the file comment
  int replay_tokens = 0;        // not reusable: tokens before a prefix boundary to re-run to rebuild it
};

struct KvLayout {
  int block_size = 0;
  std::vector<CacheKindSpec> kinds;

  // What the model runner really allocates (ModelRunner::kv_footprint). When set, sizing and the startup log
  // count it instead of the kinds' design formats, so a memory budget admits exactly the blocks that fit.
  std::optional<KvFootprint> storage;

  double bytes_per_token() const;      // design formats: paged kinds, all layers
  int64_t bytes_per_block() const;     // storage's, else the design formats' (rounded up)
  int64_t bytes_per_sequence() const;  // storage's per slot, else the design's per-sequence kinds, all layers
  // Tokens before a prefix hit that must be re-run: max replay_tokens over non-reusable kinds (0: exact reuse).
  int replay_tokens() const;
};

// The smallest multiple of 64 that every compression ratio of the model divides (V3: 64, V4.1: 64, V4: 128).
int default_block_size(const ModelConfig& c);
// Throws InvalidArgument if block_size is not a positive multiple of every compression ratio.
KvLayout make_kv_layout(const ModelConfig& c, int block_size = 0);

struct KvSizing {
  int32_t num_blocks = 0;
  int32_t num_state_slots = 0;
  int64_t token_capacity = 0;   // num_blocks * block_size
  int32_t max_concurrency = 0;  // sequences that fit at full max_model_len (also bounded by the slots)
  int64_t bytes_used = 0;
};

// The bytes the cache may use: utilization * total - weights - activations (the CPU engine passes a host budget
// as `total` with utilization 1). Throws ResourceExhausted when nothing is left, naming the numbers.
int64_t kv_budget_bytes(int64_t total_bytes, double utilization, int64_t weight_bytes, int64_t activation_bytes);

// Reserves max_num_seqs state slots, then fills the rest of the budget with blocks. Throws ResourceExhausted
// when one sequence of max_model_len tokens does not fit, with the numbers needed to fix the configuration.
KvSizing size_kv_cache(const KvLayout& layout, int64_t budget_bytes, int max_num_seqs, int64_t max_model_len);

// The cache manager's config for a sized layout. A layout whose state is not all prefix-reusable (V4/V4.1's SWA
// ring) can only reuse prefixes by bounded replay, which is exact for per-sequence state that depends on the last
// replay_tokens() tokens only; with allow_bounded_replay false the prefix cache is switched off for it.
KvCacheConfig make_kv_cache_config(const KvLayout& layout, const KvSizing& sizing, bool enable_prefix_cache,
                                   bool allow_bounded_replay);

// One line per kind plus the totals, for the startup log and `inspect`.
std::string describe_kv_cache(const KvLayout& layout, const KvSizing& sizing, int64_t max_model_len);
void log_kv_sizing(const KvLayout& layout, const KvSizing& sizing, int64_t max_model_len);

}  // namespace deepinfer
