#include "deepinfer/engine/gpu_idle.h"

#include <fmt/format.h>

#include <algorithm>

namespace deepinfer {

void GpuIdleMeter::add(std::optional<double> gap_before, double busy, bool decode) {
  if (!decode || !gap_before) return;
  // An in-order stream never reads negative; clamp anyway: a timing glitch must not fail a step.
  const double gap = std::max(0.0, *gap_before);
  ++steps_;
  gap_ += gap;
  span_ += gap + std::max(0.0, busy);
}

StepTimeline::StepTimeline(Elapsed elapsed, std::function<void(int)> release)
    : elapsed_(std::move(elapsed)), release_(std::move(release)) {}

void StepTimeline::step(int start, int end, bool decode) {
  pending_.push_back({start, end, decode});
  poll();
}

void StepTimeline::poll() {
  while (!pending_.empty()) {
    const Step s = pending_.front();
    const std::optional<double> busy = elapsed_(s.start, s.end);
    if (!busy) return;  // not done on the device yet: read at a later step
    std::optional<double> gap;
    if (prev_end_) {
      gap = elapsed_(*prev_end_, s.start);  // both precede s.end on the stream, which has completed
      release_(*prev_end_);
    }
    meter_.add(gap, *busy, s.decode);
    release_(s.start);
    prev_end_ = s.end;
    pending_.pop_front();
  }
}

std::string format_gpu_idle(int64_t decode_steps, double gap_seconds, double span_seconds) {
  if (decode_steps <= 0 || span_seconds <= 0)
    return "gpu idle between decode steps: n/a (no device timeline: CUDA only, and decode steps after a first step)";
  return fmt::format("gpu idle between decode steps: {:.2f}% (gaps {:.3f} ms over span {:.3f} ms, {} steps)",
                     100.0 * gap_seconds / span_seconds, 1e3 * gap_seconds, 1e3 * span_seconds, decode_steps);
}

}  // namespace deepinfer
