// DeviceStepHooks: what a model runner can do around a step only through a device backend's own API — timestamps
// on its stream (GPU idle between steps, engine/gpu_idle.h) and the argmax of logits rows left on the device (the
// greedy fast path, ModelRunner::execute_argmax). CUDA implements them (ops/cuda/cuda_step_hooks.h); a runner
// without hooks (the CPU backend) has no timeline and reduces its logits on the host.
#pragma once

#include <cstdint>
#include <span>

#include "deepinfer/core/tensor.h"
#include "deepinfer/engine/greedy_argmax.h"
#include "deepinfer/sampling/sampling_params.h"

namespace deepinfer {

class DeviceStepHooks {
 public:
  virtual ~DeviceStepHooks() = default;
  // Around one step's GPU work: called when the runner's execute begins and when it returns (its work waited for).
  // `decode`: the step ran no prompt position.
  virtual void step_begin() = 0;
  virtual void step_end(bool decode) = 0;
  // The timeline so far: decode steps timed, their gaps and span (seconds; GpuIdleMeter).
  virtual int64_t timed_decode_steps() const = 0;
  virtual double decode_gap_seconds() const = 0;
  virtual double decode_span_seconds() const = 0;
  // f32 [rows, vocab] logits on the device → per row the argmax (sampling/sampler.h argmax), 1 where the row
  // holds NaN or +inf and, when `out.logprobs` is not empty, the chosen token's logprob (within rounding of the
  // host's token_logprob: see ops/cuda/argmax_cuda.h), on the host (waits for them; `out`'s spans hold `rows`
  // entries).
  virtual void argmax(const Tensor& logits, const ArgmaxRows& out) = 0;
};

}  // namespace deepinfer
