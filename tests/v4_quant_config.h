// The quantization_config of a V4 / V4.1 checkpoint in the released form, for tests that realise a block-quantized
// checkpoint from a float config: FP8 e4m3 dense weights with UE8M0 scales per block x block, MXFP4 experts.
#pragma once

#include <nlohmann/json.hpp>

namespace deepinfer::testing {

inline nlohmann::json v4_quantization_config(int block = 32) {
  return {{"quant_method", "fp8"},
          {"fmt", "e4m3"},
          {"weight_block_size", {block, block}},
          {"scale_fmt", "ue8m0"},
          {"expert_dtype", "fp4"}};
}

}  // namespace deepinfer::testing
