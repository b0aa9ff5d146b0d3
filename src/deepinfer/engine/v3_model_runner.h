// The engine's runner for the DeepSeek-V3 family (V3, R1, V3.1, V2-Lite): the MLA rows (latent + rope key per
// token and layer) live in the runner's pages at the engine's block ids, so prefix reuse needs no replay.
#pragma once

#include "deepinfer/engine/slot_model_runner.h"
#include "deepinfer/model/deepseek_v3.h"

namespace deepinfer {
using V3ModelRunner = SlotModelRunner<DeepseekV3Model>;
}  // namespace deepinfer
