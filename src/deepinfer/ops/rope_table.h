// Inverse-frequency tables of the RoPE variants (plain and YaRN; V4/V4.1 and the V3 family's MLA rope slice),
// computed in fp32 the way transformers does so that angles match bit for bit in the common case. Backend
// independent.
#pragma once

#include <vector>

#include "deepinfer/model/model_config.h"

namespace deepinfer {

// inv_freq[i] for i < rope.dim / 2 (attention_factor is 1 for every V4 config and is not applied).
std::vector<float> rope_inv_freq(const RopeConfig& rope);

// YaRN's cos/sin magnitude ("attention_factor") for the V3 family, as transformers derives it:
// mscale(factor, mscale) / mscale(factor, mscale_all_dim) when both are set (1.0 for every released V3 / V2
// config, where they are equal), 0.1·ln(factor) + 1 when either is missing, an explicit attention_factor
// when the config gives one other than 1; 1 without YaRN. mscale(s, m) = 0.1·m·ln(s) + 1 (1 when s <= 1).
double yarn_attention_factor(const RopeConfig& rope);

}  // namespace deepinfer
