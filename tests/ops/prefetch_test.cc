// Backend::prefetch on the CPU reference: the hint's checks (validate(PrefetchParams)) and nothing else — no value of
// the hinted tensors changes.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "deepinfer/core/error.h"
#include "deepinfer/ops/ops.h"

namespace deepinfer {
namespace {

TEST(Prefetch, CpuChecksTheHintAndChangesNothing) {
  auto cpu = make_cpu_backend(1);
  std::vector<float> values(64);
  for (size_t i = 0; i < values.size(); ++i) values[i] = 0.25f * static_cast<float>(i) - 3.0f;
  const std::vector<float> before = values;
  const Tensor t(values.data(), DType::kF32, {8, 8});
  cpu->prefetch({{t, Tensor{}}, 4});
  EXPECT_EQ(std::memcmp(values.data(), before.data(), sizeof(float) * values.size()), 0);
  const Tensor column(values.data(), DType::kF32, {8, 1}, {8, 1}, Device::cpu());
  EXPECT_THROW(cpu->prefetch({{column}, 1}), Error);  // not contiguous
  EXPECT_THROW(cpu->prefetch({{t}, -1}), Error);      // rows < 0
}

}  // namespace
}  // namespace deepinfer
