// GPU idle between decode steps, from timestamps taken on the device's own stream (CUDA events), without nsys.
//
// A runner with device hooks (engine/device_step_hooks.h) records one event on the backend's stream when a step's
// execute begins and one when it returns. The stream runs its work in order, so on the GPU's clock the time from
// step N's end event to step N+1's start event is time the stream had nothing to run: the host sampling step N's
// rows, scheduling, building step N+1's batch. The events are read only once they have completed (a non-blocking
// query, usually one step later), so measuring adds no synchronisation to the critical path.
//
// What it does not see: bubbles inside a step (the host preparing inputs or waiting between launches within one
// execute) count as the step's own time, so the figure is a lower bound of the GPU's total idle time.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <string>

namespace deepinfer {

// Sums over the decode steps (steps that ran no prompt position) that followed another step: the gap before each
// and the span, gap plus the step's own GPU time, so gap / span is the idle share of the decode phase's timeline.
class GpuIdleMeter {
 public:
  // One step, in stream order: `gap_before` (seconds) from the previous step's end to this one's start, nullopt for
  // the first step; `busy` its own time; `decode` whether it ran no prompt position.
  void add(std::optional<double> gap_before, double busy, bool decode);

  int64_t decode_steps() const { return steps_; }
  double gap_seconds() const { return gap_; }
  double span_seconds() const { return span_; }

 private:
  int64_t steps_ = 0;
  double gap_ = 0, span_ = 0;
};

// The pairing of a step's events with its neighbours', over opaque event handles: `elapsed(a, b)` gives the
// seconds from event a to event b once both have completed (nullopt while either has not, never blocking);
// `release(e)` hands an event back once no later reading needs it.
class StepTimeline {
 public:
  using Elapsed = std::function<std::optional<double>(int from, int to)>;
  StepTimeline(Elapsed elapsed, std::function<void(int)> release);

  // A step's start and end events, recorded in this order on the stream after the previous step's; then every
  // step whose end event has completed is added to the meter, oldest first.
  void step(int start, int end, bool decode);
  // Adds the steps that have completed since (no new step).
  void poll();
  const GpuIdleMeter& meter() const { return meter_; }
  int64_t pending() const { return static_cast<int64_t>(pending_.size()); }

 private:
  struct Step {
    int start = 0, end = 0;
    bool decode = false;
  };
  Elapsed elapsed_;
  std::function<void(int)> release_;
  std::deque<Step> pending_;     // recorded, end not seen complete yet
  std::optional<int> prev_end_;  // the last added step's end event: the next gap starts there
  GpuIdleMeter meter_;
};

// `deepinfer offline`'s summary line: "gpu idle between decode steps: X% (gaps G ms over span S ms, N steps)", or
// why there is no figure ("n/a (...)") for zero timed steps (a backend without a device timeline: the CPU).
std::string format_gpu_idle(int64_t decode_steps, double gap_seconds, double span_seconds);

}  // namespace deepinfer
