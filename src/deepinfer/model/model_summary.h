// Derived numbers about a model: parameter counts and KV-cache bytes per cache kind. Used by `inspect`, the
// cache manager's sizing and the benchmarks' byte counts.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "deepinfer/model/model_config.h"
#include "deepinfer/model/weight_schema.h"

namespace deepinfer {

struct ParamCounts {
  int64_t total = 0;
  // Per token: everything except routed experts and lookup tables, plus top-k/n_routed of the routed experts,
  // plus the rows actually read from the embedding and Engram tables.
  int64_t active = 0;
  int64_t routed_experts = 0;
  int64_t embedding_tables = 0;  // token embedding + Engram tables
};
ParamCounts count_params(const ModelConfig& c, const std::vector<WeightSpec>& specs);

// One kind of cache the engine keeps for this model, in the engine's storage format.
struct CacheKind {
  std::string name;         // "mla_latent", "swa_ring", "compressed_kv", "index_keys", ...
  std::string format;       // e.g. "bf16 512+64", "fp8 e4m3 + ue8m0/32"
  int num_layers = 0;       // layers that keep one
  double bytes_per_token = 0;     // summed over those layers (0 for fixed-size state)
  int64_t bytes_per_sequence = 0;  // fixed per-sequence state, summed over those layers
};
std::vector<CacheKind> cache_kinds(const ModelConfig& c);
double kv_bytes_per_token(const ModelConfig& c);  // persistent (growing) bytes per token, all kinds

}  // namespace deepinfer
