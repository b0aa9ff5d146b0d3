// The GPU-idle arithmetic (engine/gpu_idle.h) on the CPU: the meter's sums over decode steps, the timeline's
// pairing of each step's events with the previous step's end (over a fake clock whose events complete late, as
// CUDA events read without waiting do), and the summary line.
#include "deepinfer/engine/gpu_idle.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>

namespace deepinfer {
namespace {

TEST(GpuIdleMeter, SumsGapsAndSpansOfDecodeStepsThatFollowAStep) {
  GpuIdleMeter m;
  m.add(std::nullopt, 5.0, false);  // the first step: no gap before it
  m.add(1.0, 3.0, false);           // prefill: not a decode step
  m.add(0.5, 2.0, true);
  m.add(0.25, 2.0, true);
  m.add(std::nullopt, 9.0, true);  // a decode step without a previous one: nothing to measure
  EXPECT_EQ(m.decode_steps(), 2);
  EXPECT_DOUBLE_EQ(m.gap_seconds(), 0.75);
  EXPECT_DOUBLE_EQ(m.span_seconds(), 0.75 + 4.0);
  m.add(-1e-9, 1.0, true);  // a clock glitch counts as no gap, never a negative one
  EXPECT_EQ(m.decode_steps(), 3);
  EXPECT_DOUBLE_EQ(m.gap_seconds(), 0.75);
  EXPECT_DOUBLE_EQ(m.span_seconds(), 5.75);
}

// Events with GPU timestamps that complete only when the test says so.
struct FakeClock {
  std::map<int, double> t;
  std::set<int> done, released;
  std::optional<double> elapsed(int a, int b) {
    if (!done.count(a) || !done.count(b)) return std::nullopt;
    EXPECT_FALSE(released.count(a) || released.count(b)) << "an event was read after its release";
    return t.at(b) - t.at(a);
  }
};

TEST(StepTimeline, PairsEachStepWithThePreviousEndOnceTheEventsComplete) {
  FakeClock clock;
  StepTimeline tl([&](int a, int b) { return clock.elapsed(a, b); },
                  [&](int e) { EXPECT_TRUE(clock.released.insert(e).second) << "event " << e << " released twice"; });
  // Steps on the GPU clock (ms-like units): [0, 10] prefill, [12, 15] decode, [15.5, 18] decode, [21, 22] decode.
  const double spans[4][2] = {{0, 10}, {12, 15}, {15.5, 18}, {21, 22}};
  const bool decode[4] = {false, true, true, true};
  for (int s = 0; s < 4; ++s) {
    clock.t[2 * s] = spans[s][0];
    clock.t[2 * s + 1] = spans[s][1];
  }
  // Step 0 recorded; its end has not completed yet: nothing is read.
  clock.done = {0};
  tl.step(0, 1, decode[0]);
  EXPECT_EQ(tl.pending(), 1);
  EXPECT_EQ(tl.meter().decode_steps(), 0);
  // Step 1 recorded after step 0 completed: step 0 is read (the first: no gap), step 1 waits for its end.
  clock.done.insert({1, 2});
  tl.step(2, 3, decode[1]);
  EXPECT_EQ(tl.pending(), 1);
  EXPECT_EQ(tl.meter().decode_steps(), 0);
  // Steps 2 and 3 recorded before anything else completes; then everything completes and a poll reads all three.
  tl.step(4, 5, decode[2]);
  tl.step(6, 7, decode[3]);
  EXPECT_EQ(tl.pending(), 3);
  for (int e = 0; e < 8; ++e) clock.done.insert(e);
  tl.poll();
  EXPECT_EQ(tl.pending(), 0);
  EXPECT_EQ(tl.meter().decode_steps(), 3);
  // Gaps before the decode steps: 12-10, 15.5-15, 21-18; spans: each gap plus its step.
  EXPECT_DOUBLE_EQ(tl.meter().gap_seconds(), 2.0 + 0.5 + 3.0);
  EXPECT_DOUBLE_EQ(tl.meter().span_seconds(), (2.0 + 3.0) + (0.5 + 2.5) + (3.0 + 1.0));
  // Every event but the last end (the next gap starts there) went back.
  EXPECT_EQ(clock.released, (std::set<int>{0, 1, 2, 3, 4, 5, 6}));
}

TEST(StepTimeline, ReadsInStreamOrderOnly) {
  FakeClock clock;
  StepTimeline tl([&](int a, int b) { return clock.elapsed(a, b); }, [&](int e) { clock.released.insert(e); });
  clock.t = {{0, 0}, {1, 1}, {2, 3}, {3, 4}};
  // A later step's events completing cannot be read before the earlier step's end has been (it never happens on
  // one stream; the timeline must still not skip a step).
  clock.done = {0, 2, 3};
  tl.step(0, 1, true);
  tl.step(2, 3, true);
  EXPECT_EQ(tl.pending(), 2);
  clock.done.insert(1);
  tl.poll();
  EXPECT_EQ(tl.pending(), 0);
  EXPECT_EQ(tl.meter().decode_steps(), 1);
  EXPECT_DOUBLE_EQ(tl.meter().gap_seconds(), 2.0);
  EXPECT_DOUBLE_EQ(tl.meter().span_seconds(), 3.0);
}

TEST(GpuIdleLine, FormatsThePercentageOrSaysWhyThereIsNone) {
  EXPECT_EQ(format_gpu_idle(3, 0.0015, 0.03),
            "gpu idle between decode steps: 5.00% (gaps 1.500 ms over span 30.000 ms, 3 steps)");
  EXPECT_NE(format_gpu_idle(0, 0, 0).find("n/a"), std::string::npos);
  EXPECT_NE(format_gpu_idle(2, 0, 0).find("n/a"), std::string::npos);
}

}  // namespace
}  // namespace deepinfer
