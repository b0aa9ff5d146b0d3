// The CUDA backend's DeviceStepHooks (engine/device_step_hooks.h): timing events on the backend's stream around
// every step (engine/gpu_idle.h reads them once they have completed, never waiting), and the greedy fast path's
// row argmax (argmax_cuda.h) with only [rows] ids and flags (and the chosen tokens' logprobs) copied back.
#pragma once

#include <memory>

#include "deepinfer/engine/device_step_hooks.h"

namespace deepinfer {

class CudaBackend;

// The hooks use `backend` (its stream, memory) from the thread that executes the runner's steps; the backend must
// outlive them.
std::unique_ptr<DeviceStepHooks> make_cuda_step_hooks(CudaBackend& backend);

}  // namespace deepinfer
