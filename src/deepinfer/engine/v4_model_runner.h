// The engine's runner for DeepSeek-V4 / V4.1: each state slot owns one V4SequenceState (SWA rings, compressor
// state, compressed entries, indexer keys, Engram look-back).
#pragma once

#include "deepinfer/engine/slot_model_runner.h"
#include "deepinfer/model/deepseek_v4.h"

namespace deepinfer {
using V4ModelRunner = SlotModelRunner<DeepseekV4Model>;
}  // namespace deepinfer
