// grouped_linear_quant (ops/cuda/grouped_linear.h) against the CPU reference: group g of the output is the CPU
// linear of group g's input rows with group g's dequantized weight. Up to 4 rows per group the call is one grouped
// launch of the decode kernels: UE8M0 scales take the tensor-core streaming kernel (A rounded to bf16, weights exact),
// so against the bf16-rounded input only the summation order differs (1e-5); f32 scales and f32 weights stream in
// fp32 (exact products) against x itself (1e-5). More rows fall back to one linear_quant per group (cuBLASLt on a bf16
// copy: x rounded, 4e-3 against x, as CudaLinearTest.QuantLinearEveryFormatMatchesCpu), except in batch-invariant
// mode, where the one grouped launch runs the same arithmetic per output as linear_quant's (bitwise equal), or with
// a raised KernelChoices::grouped_one_launch_rows (grouped_linear.h).
#include <gtest/gtest.h>

#include <cstring>
#include <optional>

#include "cuda/cuda_test_util.h"
#include "deepinfer/core/dtype.h"
#include "deepinfer/core/error.h"
#include "deepinfer/ops/cuda/gemm_invariant_mma.h"
#include "deepinfer/ops/cuda/gemm_stream_mma.h"
#include "deepinfer/ops/cuda/grouped_linear.h"

namespace deepinfer {
namespace {

using testing::CudaOpTest;
using testing::DeviceTensor;
using testing::ScopedKernelChoices;

class CudaGroupedLinearTest : public CudaOpTest {
 protected:
  struct Weights {
    std::vector<HostTensor> w, s;         // host codes and scales per group
    std::vector<DeviceTensor> dw, ds;     // the same on the device
    std::vector<QuantMatrix> mats;        // views of dw / ds
    std::vector<HostTensor> dequantized;  // f32 [n, k] per group (CPU)
  };
  enum class Kind { kFp8E8m0_128, kFp8F32_32, kMxfp4, kF32 };
  static const char* name(Kind k) {
    switch (k) {
      case Kind::kFp8E8m0_128:
        return "fp8 128x128 e8m0";
      case Kind::kFp8F32_32:
        return "fp8 32x32 f32";
      case Kind::kMxfp4:
        return "mxfp4";
      case Kind::kF32:
        return "f32";
    }
    return "?";
  }
  // Whether the one-launch path reads A as bf16 (UE8M0 block formats: the tensor-core streaming kernel).
  static bool rounds_a(Kind k) { return k == Kind::kFp8E8m0_128 || k == Kind::kMxfp4; }

  // Random e4m3 codes (never zero, no NaN codes) and power-of-two scales around 1.
  HostTensor fp8(Shape shape) {
    HostTensor t(DType::kF8E4M3, shape);
    std::uniform_real_distribution<float> d(-3.0f, 3.0f);
    for (int64_t i = 0; i < t.numel(); ++i) {
      uint8_t c = f32_to_e4m3(d(rng()));
      t.data<uint8_t>()[i] = (c & 0x7F) == 0 ? 0x38 : c;
    }
    return t;
  }
  HostTensor f32_scales(Shape shape) { return rand(std::move(shape), 0.01f, 2.0f); }
  static HostTensor bf16_rows(const HostTensor& x) {
    HostTensor r(DType::kF32, x.shape());
    for (int64_t i = 0; i < x.numel(); ++i) r.data<float>()[i] = round_bf16(x.data<float>()[i]);
    return r;
  }

  Weights make(Kind kind, int groups, int64_t n, int64_t k) {
    const QuantFormat format = kind == Kind::kMxfp4 ? QuantFormat::kMXFP4
                               : kind == Kind::kF32 ? QuantFormat::kFloat
                                                    : QuantFormat::kFP8Block;
    const int block = kind == Kind::kFp8F32_32 ? 32 : 128;
    Weights out;
    for (int g = 0; g < groups; ++g) {
      switch (kind) {
        case Kind::kFp8E8m0_128:
        case Kind::kFp8F32_32: {
          const Shape ss = {(n + block - 1) / block, (k + block - 1) / block};
          out.w.push_back(fp8({n, k}));
          out.s.push_back(kind == Kind::kFp8E8m0_128 ? e8m0(ss) : f32_scales(ss));
          break;
        }
        case Kind::kMxfp4:
          out.w.push_back(rand_bytes(DType::kU8, {n, k / 2}));
          out.s.push_back(e8m0({n, k / 32}, 121, g % 2 == 0 ? 128 : 131));  // both decodes of the streaming kernel
          break;
        case Kind::kF32:
          out.w.push_back(rand({n, k}, -0.5f, 0.5f));
          out.s.push_back(HostTensor{});
          break;
      }
      const bool scaled = out.s.back().view().data() != nullptr;
      out.dw.push_back(up(out.w.back()));
      out.ds.push_back(scaled ? up(out.s.back()) : DeviceTensor{});
      HostTensor dq(DType::kF32, {n, k});
      DequantizeParams p;
      p.weight = out.w.back();
      p.scale = scaled ? out.s.back().view() : Tensor{};
      p.format = format;
      p.block_n = block;
      p.block_k = block;
      p.out = dq;
      cpu().dequantize(p);
      out.dequantized.push_back(std::move(dq));
    }
    for (int g = 0; g < groups; ++g)
      out.mats.push_back(
          {out.dw[g].view(), out.s[g].view().data() ? out.ds[g].view() : Tensor{}, format, block, block});
    return out;
  }

  // The CPU reference: group g's rows of x through group g's dequantized weight.
  HostTensor reference(const HostTensor& x, const Weights& w, int64_t rows) {
    const int64_t groups = static_cast<int64_t>(w.dequantized.size()), k = x.shape()[1];
    const int64_t n = w.dequantized[0].shape()[0];
    HostTensor out(DType::kF32, {groups * rows, n});
    for (int64_t g = 0; g < groups; ++g) {
      HostTensor xg(DType::kF32, {rows, k}), yg(DType::kF32, {rows, n});
      std::memcpy(xg.view().data(), x.data<float>() + g * rows * k, rows * k * sizeof(float));
      cpu().linear({xg, w.dequantized[g], yg});
      std::memcpy(out.data<float>() + g * rows * n, yg.view().data(), rows * n * sizeof(float));
    }
    return out;
  }
};

// V4's output projection (8 groups of [1024, 4096], FP8 128x128) and smaller odd shapes (a partial last 16-row tile,
// 32x32 blocks), every format, 1-4 rows per group (one launch) and 7 (one launch for UE8M0 block formats — the
// streaming kernel takes up to 8 rows — and one linear_quant per group for f32 scales and f32 weights).
TEST_F(CudaGroupedLinearTest, MatchesPerGroupCpuLinear) {
  struct Shape3 {
    int groups;
    int64_t n, k;
  };
  for (const Shape3& sh : {Shape3{8, 1024, 4096}, Shape3{3, 300, 512}, Shape3{5, 72, 1024}}) {
    for (Kind kind : {Kind::kFp8E8m0_128, Kind::kFp8F32_32, Kind::kMxfp4, Kind::kF32}) {
      Weights w = make(kind, sh.groups, sh.n, sh.k);
      for (int64_t rows : {1, 2, 3, 4, 7}) {
        const std::string what = std::string("grouped ") + name(kind) + " G=" + std::to_string(sh.groups) +
                                 " N=" + std::to_string(sh.n) + " K=" + std::to_string(sh.k) +
                                 " rows=" + std::to_string(rows);
        auto plan = plan_grouped_linear(gpu(), w.mats, rows);
        const bool one = rows <= 4 || (rounds_a(kind) && rows <= cuda::kGemmStreamMmaMaxRows);
        EXPECT_EQ(plan->one_launch(false, gpu().kernel_choices()), one) << what;
        const HostTensor x = rand({sh.groups * rows, sh.k});
        const HostTensor xr = bf16_rows(x);
        // One row a group at few tiles: the fp32 column-group kernel, exact in A.
        const bool rounded = one && rounds_a(kind) && cuda::gemm_stream_mma_takes_shape(rows, sh.n, sh.groups);
        const HostTensor want = reference(rounded ? xr : x, w, rows);
        DeviceTensor dx = up(x), dout = poisoned({sh.groups * rows, sh.n});
        grouped_linear_quant(gpu(), dx, *plan, dout);
        rel_err(what.c_str(), down(dout), want, one ? 1e-5 : 4e-3);
      }
    }
  }
}

// act_quant (--activation-quant mxfp8): the input rounded to e4m3 per 32 values (the CPU's fake_quant, bit for bit)
// before the one launch or the per-group linear_quant calls: against the CPU linear of the rounded rows at 1e-5 for
// the UE8M0 formats (rounded values are exact in bf16) and one-launch f32 weights, 4e-3 where the per-group fallback
// runs cuBLASLt on bf16 copies of f32-scaled weights.
TEST_F(CudaGroupedLinearTest, ActQuantRoundsTheInputFirst) {
  const int groups = 3;
  const int64_t n = 300, k = 512;
  for (Kind kind : {Kind::kFp8E8m0_128, Kind::kFp8F32_32, Kind::kMxfp4}) {
    Weights w = make(kind, groups, n, k);
    for (int64_t rows : {1, 4, 7, 20}) {
      const std::string what = std::string("act_quant grouped ") + name(kind) + " rows=" + std::to_string(rows);
      auto plan = plan_grouped_linear(gpu(), w.mats, rows);
      const HostTensor x = rand({groups * rows, k}, -4.0f, 4.0f);
      HostTensor xq(DType::kF32, x.shape());
      std::memcpy(xq.view().data(), x.view().data(), x.view().nbytes());
      cpu().fake_quant({xq, FakeQuantKind::kFP8E4M3Ue8m0Block32});
      const HostTensor want = reference(xq, w, rows);
      DeviceTensor dx = up(x), dout = poisoned({groups * rows, n});
      grouped_linear_quant(gpu(), dx, *plan, dout, ActQuant::kMxfp8);
      const bool exact = rounds_a(kind) || plan->one_launch(false, gpu().kernel_choices());
      rel_err(what.c_str(), down(dout), want, exact ? 1e-5 : 4e-3);
    }
  }
}

// Batch-invariant mode: one launch at any row count, and each group's rows equal linear_quant of that group alone
// byte for byte (the same sequence per output: for these UE8M0 formats the tensor-core streaming kernel at 1 and 7
// rows, the invariant tile kernel at 70, A rounded to bf16: against the rounded input at 1e-5).
TEST_F(CudaGroupedLinearTest, BatchInvariantIsOneLaunchAndEqualsLinearQuant) {
  gpu().set_batch_invariant(true);
  for (Kind kind : {Kind::kFp8E8m0_128, Kind::kMxfp4}) {
    const int groups = 4;
    const int64_t n = 264, k = 1024;
    Weights w = make(kind, groups, n, k);
    for (int64_t rows : {1, 7, 70}) {
      const std::string what = std::string("grouped invariant ") + name(kind) + " rows=" + std::to_string(rows);
      auto plan = plan_grouped_linear(gpu(), w.mats, rows);
      EXPECT_TRUE(plan->one_launch(true, gpu().kernel_choices())) << what;
      const HostTensor x = rand({groups * rows, k});
      DeviceTensor dx = up(x), dout = poisoned({groups * rows, n});
      grouped_linear_quant(gpu(), dx, *plan, dout);
      const HostTensor got = down(dout);
      const bool rounds =
          cuda::gemm_invariant_mma_takes(w.mats[0].format, true, w.mats[0].block_n, w.mats[0].block_k, k);
      const HostTensor xr = bf16_rows(x);
      rel_err(what.c_str(), got, reference(rounds ? xr : x, w, rows), 1e-5);
      HostTensor each(DType::kF32, {groups * rows, n});
      for (int g = 0; g < groups; ++g) {
        DeviceTensor og = poisoned({rows, n});
        gpu().linear_quant({dx.view().slice(g * rows, (g + 1) * rows), w.mats[g], og});
        const HostTensor h = down(og);
        std::memcpy(each.data<float>() + g * rows * n, h.view().data(), h.view().nbytes());
      }
      expect_same_bytes((what + " vs linear_quant per group").c_str(), got, each);
    }
  }
  gpu().set_batch_invariant(false);
}

// KernelChoices::grouped_one_launch_rows: raised, more rows of UE8M0 block formats go through one grouped
// tensor-core launch on a bf16 copy of A (weights exact in bf16: against the rounded input 1e-5); 0, every call runs
// per group (the decode kernels per group: 1e-5 against the rounded input again). f32 scales never take the grouped
// tensor-core path (their products are not exact in bf16).
TEST_F(CudaGroupedLinearTest, ChoiceMovesTheOneLaunchBound) {
  cuda::KernelChoices choices;
  EXPECT_EQ(grouped_one_launch_rows(choices), cuda::kGemmStreamMmaMaxRows);
  std::optional<ScopedKernelChoices> guard;
  guard.emplace(gpu(), [](cuda::KernelChoices& c) { c.grouped_one_launch_rows = 1000; });
  for (Kind kind : {Kind::kFp8E8m0_128, Kind::kMxfp4, Kind::kFp8F32_32}) {
    const int groups = 8;
    const int64_t n = 1024, k = 512;
    Weights w = make(kind, groups, n, k);
    for (int64_t rows : {7, 70}) {
      const std::string what = std::string("grouped A/B 1000 ") + name(kind) + " rows=" + std::to_string(rows);
      auto plan = plan_grouped_linear(gpu(), w.mats, rows);
      EXPECT_EQ(plan->one_launch(false, gpu().kernel_choices()), kind != Kind::kFp8F32_32) << what;
      const HostTensor x = rand({groups * rows, k}), xr = bf16_rows(x);
      DeviceTensor dx = up(x), dout = poisoned({groups * rows, n});
      grouped_linear_quant(gpu(), dx, *plan, dout);
      if (kind == Kind::kFp8F32_32)
        rel_err(what.c_str(), down(dout), reference(x, w, rows), 4e-3);
      else
        rel_err(what.c_str(), down(dout), reference(xr, w, rows), 1e-5);
    }
  }
  guard.reset();
  guard.emplace(gpu(), [](cuda::KernelChoices& c) { c.grouped_one_launch_rows = 0; });
  {
    Weights w = make(Kind::kFp8E8m0_128, 8, 1024, 512);
    auto plan = plan_grouped_linear(gpu(), w.mats, 1);
    EXPECT_FALSE(plan->one_launch(false, gpu().kernel_choices()));
    const HostTensor x = rand({8, 512}), xr = bf16_rows(x);
    DeviceTensor dx = up(x), dout = poisoned({8, 1024});
    grouped_linear_quant(gpu(), dx, *plan, dout);
    rel_err("grouped A/B 0 fp8 rows=1 (per group)", down(dout),
            reference(cuda::gemm_stream_mma_takes_shape(1, 1024, 1) ? xr : x, w, 1), 1e-5);
  }
  guard.reset();
  EXPECT_EQ(gpu().kernel_choices().grouped_one_launch_rows, -1) << "restored";
}

// GemmChoices::stream_mma_one_row_tiles: one row a group over 8 groups of 1024 outputs is 512 16-row tiles, below the
// default bound (768), so the fp32 column-group kernel runs it with A exact; with the bound at 512 the streaming
// tensor-core kernel does, with A rounded to bf16. Each against its own reference within 1e-5 (the two references
// differ by ~1e-3 of the output, so a choice that moved nothing fails the second).
TEST_F(CudaGroupedLinearTest, ChoiceMovesTheOneRowTileBound) {
  const int groups = 8;
  const int64_t n = 1024, k = 512;
  ASSERT_FALSE(cuda::gemm_stream_mma_takes_shape(1, n, groups));
  cuda::GemmChoices lowered;
  lowered.stream_mma_one_row_tiles = 512;
  ASSERT_TRUE(cuda::gemm_stream_mma_takes_shape(1, n, groups, lowered));
  for (Kind kind : {Kind::kMxfp4, Kind::kFp8E8m0_128}) {
    Weights w = make(kind, groups, n, k);
    auto plan = plan_grouped_linear(gpu(), w.mats, 1);
    const HostTensor x = rand({groups, k}), xr = bf16_rows(x);
    const DeviceTensor dx = up(x);
    for (bool moved : {false, true}) {
      ScopedKernelChoices guard(gpu(), [&](cuda::KernelChoices& c) {
        if (moved) c.gemm.stream_mma_one_row_tiles = 512;
      });
      DeviceTensor dout = poisoned({groups, n});
      grouped_linear_quant(gpu(), dx, *plan, dout);
      rel_err((std::string("one row a group, ") + name(kind) + (moved ? ", bound 512: stream-mma" : ", fp32 kernel"))
                  .c_str(),
              down(dout), reference(moved ? xr : x, w, 1), 1e-5);
    }
  }
}

// The call uploads nothing: it captures into a CUDA graph, and the replay writes the eager call's output.
TEST_F(CudaGroupedLinearTest, CapturesInAGraph) {
  const int groups = 8;
  const int64_t n = 512, k = 1024, rows = 1;
  Weights w = make(Kind::kFp8E8m0_128, groups, n, k);
  auto plan = plan_grouped_linear(gpu(), w.mats, rows);
  const HostTensor x = rand({groups * rows, k});
  DeviceTensor dx = up(x), dout = poisoned({groups * rows, n});
  grouped_linear_quant(gpu(), dx, *plan, dout);
  const HostTensor eager = down(dout);
  const HostTensor xr = bf16_rows(x);
  rel_err("grouped eager vs cpu", eager,
          reference(cuda::gemm_stream_mma_takes_shape(rows, n, groups) ? xr : x, w, rows), 1e-5);
  std::unique_ptr<CudaGraph> graph = gpu().capture_graph([&] { grouped_linear_quant(gpu(), dx, *plan, dout); });
  DeviceTensor poison = poisoned({groups * rows, n});
  ASSERT_EQ(
      testing::copy_and_sync(dout.data(), poison.data(), groups * rows * n * sizeof(float), cudaMemcpyDeviceToDevice),
      cudaSuccess);
  graph->replay();
  expect_same_bytes("grouped replay vs eager", down(dout), eager);
}

TEST_F(CudaGroupedLinearTest, BadInputsAreRejected) {
  Weights w = make(Kind::kFp8E8m0_128, 3, 256, 512);
  EXPECT_THROW(plan_grouped_linear(gpu(), {}, 1), Error);
  EXPECT_THROW(plan_grouped_linear(gpu(), w.mats, 0), Error);
  {
    // A weight of another shape (or format) in the group.
    Weights other = make(Kind::kFp8E8m0_128, 1, 128, 512);
    std::vector<QuantMatrix> mixed = w.mats;
    mixed[1] = other.mats[0];
    EXPECT_THROW(plan_grouped_linear(gpu(), mixed, 1), Error);
    Weights mx = make(Kind::kMxfp4, 1, 256, 512);
    mixed[1] = mx.mats[0];
    EXPECT_THROW(plan_grouped_linear(gpu(), mixed, 1), Error);
  }
  auto plan = plan_grouped_linear(gpu(), w.mats, 2);
  DeviceTensor in = up(rand({6, 512})), out = poisoned({6, 256});
  DeviceTensor in_rows = up(rand({4, 512})), out_rows = poisoned({4, 256});  // 2 groups' worth of rows
  EXPECT_THROW(grouped_linear_quant(gpu(), in_rows, *plan, out_rows), Error);
  DeviceTensor out_n = poisoned({6, 255});
  EXPECT_THROW(grouped_linear_quant(gpu(), in, *plan, out_n), Error);
  const HostTensor host_in = rand({6, 512});
  EXPECT_THROW(grouped_linear_quant(gpu(), host_in, *plan, out), Error);  // input on the host
  grouped_linear_quant(gpu(), in, *plan, out);                            // the good call still runs
  EXPECT_NO_THROW(gpu().synchronize());
}

}  // namespace
}  // namespace deepinfer

namespace deepinfer {
namespace {

// CudaBackend::grouped_linear_quant (the Backend op the engine's V4 grouped output calls): one stacked [G·N, K] weight,
// group g its rows [g·N, (g+1)·N). With KernelChoices::grouped_output_one_launch (a grouped launch over a plan made on
// the call's first eager use) it must give the bytes of the default (linear_quant per group), eagerly and replayed
// from a graph, and a first use inside a capture (no plan yet: no upload allowed) must fall back and still record.
class CudaGroupedOpTest : public testing::CudaOpTest {};

TEST_F(CudaGroupedOpTest, OneLaunchGivesThePerGroupBytes) {
  struct Case {
    const char* what;
    QuantFormat format;
    int64_t groups, n, k;
  };
  for (const Case& c : {Case{"fp8 128x128 e8m0", QuantFormat::kFP8Block, 8, 128, 512},
                        Case{"mxfp4", QuantFormat::kMXFP4, 4, 64, 256}}) {
    const int64_t rows = c.groups * c.n;
    const bool fp8 = c.format == QuantFormat::kFP8Block;
    const HostTensor w =
        fp8 ? rand_bytes(DType::kF8E4M3, {rows, c.k}, 0x20, 0x4F) : rand_bytes(DType::kU8, {rows, c.k / 2});
    const HostTensor s = fp8 ? e8m0({rows / 128, c.k / 128}, 124, 130) : e8m0({rows, c.k / 32}, 118, 128);
    const DeviceTensor dw = up(w), ds = up(s);
    const QuantMatrix m{dw, ds, c.format, 128, 128};
    for (const int64_t t : {int64_t{1}, int64_t{3}, int64_t{8}}) {
      const DeviceTensor dx = up(rand({c.groups * t, c.k})), dout = poisoned({c.groups * t, c.n});
      const GroupedQuantLinearParams p{dx, m, c.groups, dout};
      gpu().grouped_linear_quant(p);  // default: linear_quant per group
      const HostTensor per_group = down(dout);
      testing::ScopedKernelChoices on(gpu(), [](cuda::KernelChoices& k) { k.grouped_output_one_launch = true; });
      const DeviceTensor fresh = poisoned({c.groups * t, c.n});
      gpu().grouped_linear_quant({dx, m, c.groups, fresh});
      const std::string what = std::string(c.what) + " T=" + std::to_string(t);
      expect_same_bytes((what + " one launch").c_str(), down(fresh), per_group);
      // Replayed from a graph (the plan exists: made by the eager call above).
      const DeviceTensor replayed = poisoned({c.groups * t, c.n});
      std::unique_ptr<CudaGraph> g = gpu().capture_graph([&] {
        gpu().grouped_linear_quant({dx, m, c.groups, replayed});
      });
      g->replay();
      expect_same_bytes((what + " one launch, graph").c_str(), down(replayed), per_group);
    }
    // A row count first seen inside a capture: the per-group fallback records.
    testing::ScopedKernelChoices on(gpu(), [](cuda::KernelChoices& k) { k.grouped_output_one_launch = true; });
    const DeviceTensor dx = up(rand({c.groups * 2, c.k})), want = poisoned({c.groups * 2, c.n});
    {
      testing::ScopedKernelChoices off(gpu(), [](cuda::KernelChoices& k) { k.grouped_output_one_launch = false; });
      gpu().grouped_linear_quant({dx, m, c.groups, want});
    }
    const HostTensor per_group = down(want);
    const DeviceTensor got = poisoned({c.groups * 2, c.n});
    std::unique_ptr<CudaGraph> g = gpu().capture_graph([&] { gpu().grouped_linear_quant({dx, m, c.groups, got}); });
    g->replay();
    expect_same_bytes((std::string(c.what) + " first use in a capture").c_str(), down(got), per_group);
  }
}

}  // namespace
}  // namespace deepinfer
