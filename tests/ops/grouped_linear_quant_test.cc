// Backend::grouped_linear_quant on the CPU reference (the default: linear_quant on each group's row slices, which
// quant_rows cuts with their scales): group g's output rows are linear_quant of group g's input rows with the rows
// [g·N, (g+1)·N) of the stacked weight, bit for bit, for FP8 blocks and MXFP4; and the op's checks.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "deepinfer/core/error.h"
#include "deepinfer/ops/ops.h"
#include "op_test_util.h"

namespace deepinfer {
namespace {

HostTensor random_bytes(DType dtype, Shape shape, int lo, int hi, uint32_t seed) {
  HostTensor t(dtype, std::move(shape));
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> d(lo, hi);
  auto* p = static_cast<uint8_t*>(t.view().data());
  for (int64_t i = 0; i < t.view().nbytes(); ++i) p[i] = static_cast<uint8_t>(d(rng));
  return t;
}

TEST(GroupedLinearQuant, CpuIsLinearQuantPerGroup) {
  auto cpu = make_cpu_backend(1);
  struct Case {
    QuantFormat format;
    int64_t groups, n, k;
  };
  for (const Case& c : {Case{QuantFormat::kFP8Block, 4, 128, 256}, Case{QuantFormat::kMXFP4, 3, 32, 64}}) {
    const int64_t rows = c.groups * c.n, t = 3;
    const bool fp8 = c.format == QuantFormat::kFP8Block;
    const HostTensor w = fp8 ? random_bytes(DType::kF8E4M3, {rows, c.k}, 0x20, 0x4F, 1)
                             : random_bytes(DType::kU8, {rows, c.k / 2}, 0, 255, 2);
    const HostTensor s = fp8 ? random_bytes(DType::kE8M0, {rows / 128, c.k / 128}, 124, 130, 3)
                             : random_bytes(DType::kE8M0, {rows, c.k / 32}, 120, 128, 4);
    const QuantMatrix m{w.view(), s.view(), c.format, 128, 128};
    const HostTensor x = testing::random_tensor({c.groups * t, c.k}, 5);
    HostTensor got(DType::kF32, {c.groups * t, c.n}), want(DType::kF32, {c.groups * t, c.n});
    cpu->grouped_linear_quant({x.view(), m, c.groups, got.view()});
    for (int64_t g = 0; g < c.groups; ++g) {
      // The group's weight copied out on its own (its codes and scales), so the slicing is checked too.
      const int64_t wb = fp8 ? c.k : c.k / 2, srows = fp8 ? c.n / 128 : c.n, scols = fp8 ? c.k / 128 : c.k / 32;
      HostTensor wg(w.dtype(), {c.n, wb}), sg(DType::kE8M0, {srows, scols});
      std::memcpy(wg.view().data(), static_cast<const uint8_t*>(w.view().data()) + g * c.n * wb, c.n * wb);
      std::memcpy(sg.view().data(), static_cast<const uint8_t*>(s.view().data()) + g * srows * scols, srows * scols);
      cpu->linear_quant({x.view().slice(g * t, (g + 1) * t),
                         {wg.view(), sg.view(), c.format, 128, 128},
                         want.view().slice(g * t, (g + 1) * t)});
    }
    EXPECT_EQ(std::memcmp(got.view().data(), want.view().data(), want.view().nbytes()), 0)
        << (fp8 ? "fp8" : "mxfp4") << ": the grouped call differs from linear_quant per group";
  }
}

TEST(GroupedLinearQuant, RejectsBadGroups) {
  auto cpu = make_cpu_backend(1);
  const HostTensor w = random_bytes(DType::kF8E4M3, {256, 128}, 0x20, 0x4F, 6);
  const HostTensor s = random_bytes(DType::kE8M0, {2, 1}, 126, 128, 7);
  const QuantMatrix m{w.view(), s.view(), QuantFormat::kFP8Block, 128, 128};
  const HostTensor x = testing::random_tensor({4, 128}, 8);
  HostTensor out2(DType::kF32, {4, 128}), out4(DType::kF32, {4, 64});
  cpu->grouped_linear_quant({x.view(), m, 2, out2.view()});                       // 2 groups of 128 rows: fine
  EXPECT_THROW(cpu->grouped_linear_quant({x.view(), m, 3, out2.view()}), Error);  // 256 rows in 3 groups
  EXPECT_THROW(cpu->grouped_linear_quant({x.view(), m, 4, out4.view()}), Error);  // 64-row groups cut 128-row blocks
  EXPECT_THROW(cpu->grouped_linear_quant({x.view(), m, 2, out4.view()}), Error);  // out [4, 64] for N = 128
  const HostTensor wf = testing::random_tensor({256, 128}, 9);
  const QuantMatrix f{wf.view(), Tensor{}, QuantFormat::kFloat};
  EXPECT_THROW(cpu->grouped_linear_quant({x.view(), f, 2, out2.view()}), Error);  // not a block format
}

}  // namespace
}  // namespace deepinfer
