// The engine's runner for the DeepSeek-V3 family (V3, R1, V3.1, V2-Lite): each state slot owns one
// V3SequenceState (the MLA cache: one latent + rope-key row per token and layer). Once the MLA rows move into
// paged storage, prefix reuse needs no replay (a row depends on its token only), unlike V4's compressed state.
#pragma once

#include "deepinfer/engine/slot_model_runner.h"
#include "deepinfer/model/deepseek_v3.h"

namespace deepinfer {
using V3ModelRunner = SlotModelRunner<DeepseekV3Model>;
}  // namespace deepinfer
