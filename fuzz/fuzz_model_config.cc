// Fuzzes config.json parsing plus everything derived from a config that parsed (layer plan, weight list,
// cache sizes): either a deepinfer::Error or a consistent config.
#include <cstddef>
#include <cstdint>
#include <string>

#include "deepinfer/core/error.h"
#include "deepinfer/model/model_config.h"
#include "deepinfer/model/model_summary.h"
#include "deepinfer/model/weight_schema.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  try {
    deepinfer::ModelConfig c = deepinfer::parse_model_config(text, "fuzz");
    if (static_cast<int>(c.layers.size()) != c.num_layers) __builtin_trap();
    // Derived data of absurdly large configs would only measure the allocator; bound it.
    if (c.num_layers <= 64 && c.moe.n_routed_experts <= 512) {
      auto specs = deepinfer::expected_weights(c);
      (void)deepinfer::count_params(c, specs);
      (void)deepinfer::cache_kinds(c);
    }
  } catch (const deepinfer::Error&) {
  }
  return 0;
}
