// The engine's runner for DeepSeek-V4 / V4.1: window rows, compressed entries and indexer keys live in the
// runner's pages at the engine's block ids; each state slot keeps the rest (compressor pending state and
// counters, V4 CSA overlap slices, Engram look-back, V4.1 bounded-replay decoder windows).
#pragma once

#include "deepinfer/engine/slot_model_runner.h"
#include "deepinfer/model/deepseek_v4.h"

namespace deepinfer {
using V4ModelRunner = SlotModelRunner<DeepseekV4Model>;
}  // namespace deepinfer
