// Inverse-frequency tables of the two V4/V4.1 RoPE variants (plain and YaRN), computed in fp32 the way
// transformers does so that angles match bit for bit in the common case. Backend independent.
#pragma once

#include <vector>

#include "deepinfer/model/model_config.h"

namespace deepinfer {

// inv_freq[i] for i < rope.dim / 2 (attention_factor is 1 for every V4 config and is not applied).
std::vector<float> rope_inv_freq(const RopeConfig& rope);

}  // namespace deepinfer
