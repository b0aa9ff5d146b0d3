// Linear family on CUDA against the CPU reference: dequantize (every format, exact), f32 linear (cuBLASLt,
// full fp32), quantized linear (bf16 via cuBLASLt; FP8 128x128 and 32x32 block scales and MXFP4 via the own
// dequantizing GEMM), embedding.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <numeric>

#include "cuda/cuda_test_util.h"
#include "deepinfer/core/dtype.h"
#include "deepinfer/ops/cuda/gemm_invariant_f32.h"
#include "deepinfer/ops/cuda/gemm_invariant_mma.h"
#include "deepinfer/ops/cuda/gemm_mma.h"
#include "deepinfer/ops/cuda/gemm_rows_mma.h"
#include "deepinfer/ops/cuda/gemm_stream_mma.h"
#include "deepinfer/ops/cuda/gemm_wgmma.h"

namespace deepinfer {
namespace {

using testing::CudaOpTest;
using testing::DeviceTensor;

class CudaLinearTest : public CudaOpTest {
 protected:
  // Random e4m3 codes of moderate magnitude (no NaN codes), and power-of-two scales around 1.
  HostTensor fp8(Shape shape) {
    HostTensor t(DType::kF8E4M3, shape);
    std::uniform_real_distribution<float> d(-3.0f, 3.0f);
    for (int64_t i = 0; i < t.numel(); ++i) {
      uint8_t c = f32_to_e4m3(d(rng()));
      t.data<uint8_t>()[i] = (c & 0x7F) == 0 ? 0x38 : c;  // never zero
    }
    return t;
  }
  HostTensor f32_scales(Shape shape) {
    HostTensor t(DType::kF32, shape);
    std::uniform_real_distribution<float> d(0.01f, 2.0f);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = d(rng());
    return t;
  }
  HostTensor cpu_dequant(const HostTensor& w, const HostTensor& s, QuantFormat f, int64_t n, int64_t k, int bn = 128,
                         int bk = 128) {
    HostTensor out(DType::kF32, {n, k});
    DequantizeParams p;
    p.weight = w;
    p.scale = s.view().data() ? s.view() : Tensor{};
    p.format = f;
    p.block_n = bn;
    p.block_k = bk;
    p.out = out;
    cpu().dequantize(p);
    return out;
  }
  // linear_quant at m x n x k against the CPU in every block format the decode GEMMs read from their stored codes or a
  // bf16 scratch: FP8 128x128 / 32x32 with UE8M0 scales and MXFP4 against the bf16-rounded input at 1e-5 (A and the
  // weights exact in bf16: only the summation order differs), FP8 32x32 with f32 scales against x at 4e-3 (bf16
  // products of the f32 dequantized values).
  void check_block_formats(const std::string& label, int64_t m, int64_t n, int64_t k) {
    const HostTensor x = rand({m, k}), xr = bf16_rows(x);
    const std::string shape = " M=" + std::to_string(m) + " N=" + std::to_string(n) + " K=" + std::to_string(k);
    for (const auto& [name, block, f32] :
         {std::tuple{"fp8 128x128 e8m0", 128, false}, {"fp8 32x32 e8m0", 32, false}, {"fp8 32x32 f32", 32, true}}) {
      const HostTensor w = fp8({n, k});
      const Shape ss = {(n + block - 1) / block, (k + block - 1) / block};
      const HostTensor s = f32 ? f32_scales(ss) : e8m0(ss);
      const HostTensor want = cpu_linear(f32 ? x : xr, cpu_dequant(w, s, QuantFormat::kFP8Block, n, k, block, block));
      DeviceTensor dx = up(x), dw = up(w), ds = up(s), dout = poisoned({m, n});
      gpu().linear_quant({dx, {dw, ds, QuantFormat::kFP8Block, block, block}, dout});
      rel_err((label + " " + name + shape).c_str(), down(dout), want, f32 ? 4e-3 : 1e-5);
    }
    const HostTensor w = rand_bytes(DType::kU8, {n, k / 2}), s = e8m0({n, k / 32});
    const HostTensor want = cpu_linear(xr, cpu_dequant(w, s, QuantFormat::kMXFP4, n, k));
    DeviceTensor dx = up(x), dw = up(w), ds = up(s), dout = poisoned({m, n});
    gpu().linear_quant({dx, {dw, ds, QuantFormat::kMXFP4}, dout});
    rel_err((label + " mxfp4" + shape).c_str(), down(dout), want, 1e-5);
  }
  // x with every element rounded to bf16: the decode GEMMs of UE8M0-scaled weights take A as bf16 (weights exact),
  // so against this input only the summation order differs.
  static HostTensor bf16_rows(const HostTensor& x) {
    HostTensor r(DType::kF32, x.shape());
    for (int64_t i = 0; i < x.numel(); ++i) r.data<float>()[i] = round_bf16(x.data<float>()[i]);
    return r;
  }
  HostTensor cpu_linear(const HostTensor& x, const HostTensor& w) {
    HostTensor out(DType::kF32, {x.shape()[0], w.shape()[0]});
    cpu().linear({x, w, out});
    return out;
  }
};

TEST_F(CudaLinearTest, DequantizeEveryFormatExactly) {
  const int64_t n = 160, k = 288;  // edge tiles in both directions for 128-blocks
  struct Case {
    const char* name;
    HostTensor w, s;
    QuantFormat f;
    int bn, bk;
  };
  HostTensor bf16(DType::kBF16, {n, k});
  {
    HostTensor r = rand({n, k});
    for (int64_t i = 0; i < r.numel(); ++i) bf16.data<uint16_t>()[i] = f32_to_bf16(r.data<float>()[i]);
  }
  std::vector<Case> cases;
  cases.push_back({"dequantize bf16", std::move(bf16), HostTensor{}, QuantFormat::kFloat, 128, 128});
  cases.push_back({"dequantize fp8 128x128 e8m0", fp8({n, k}), e8m0({2, 3}), QuantFormat::kFP8Block, 128, 128});
  cases.push_back({"dequantize fp8 32x32 f32", fp8({n, k}), f32_scales({5, 9}), QuantFormat::kFP8Block, 32, 32});
  cases.push_back(
      {"dequantize mxfp4", rand_bytes(DType::kU8, {n, k / 2}), e8m0({n, k / 32}), QuantFormat::kMXFP4, 0, 0});
  cases.push_back({"dequantize fp8 row32", fp8({n, k}), e8m0({n, k / 32}), QuantFormat::kFP8Row32, 0, 0});
  for (auto& c : cases) {
    HostTensor want = cpu_dequant(c.w, c.s, c.f, n, k, c.bn ? c.bn : 128, c.bk ? c.bk : 128);
    DeviceTensor dw = up(c.w), ds = c.s.view().data() ? up(c.s) : DeviceTensor{}, dout = poisoned({n, k});
    DequantizeParams p;
    p.weight = dw;
    p.scale = c.s.view().data() ? ds.view() : Tensor{};
    p.format = c.f;
    p.block_n = c.bn ? c.bn : 128;
    p.block_k = c.bk ? c.bk : 128;
    p.out = dout;
    gpu().dequantize(p);
    rel_err(c.name, down(dout), want, 0.0);
  }
}

TEST_F(CudaLinearTest, F32LinearMatchesCpu) {
  for (auto [m, n, k] : {std::tuple{1, 300, 520}, {37, 300, 520}, {129, 64, 1000}}) {
    HostTensor x = rand({m, k}), w = rand({n, k});
    HostTensor want = cpu_linear(x, w);
    DeviceTensor dx = up(x), dw = up(w), dout = poisoned({m, n});
    gpu().linear({dx, dw, dout});
    rel_err(("linear f32 M=" + std::to_string(m)).c_str(), down(dout), want, 1e-5);
  }
}

// act_quant (--activation-quant mxfp8): every path rounds its inputs to e4m3 per 32 values first, with the fake_quant
// kernel (bit for bit the CPU's). The rounded inputs are exact in bf16 and the UE8M0-scaled weights are too, so every
// path, from the one-row fp32 kernel through the streaming and rows kernels to the tensor-core tiles, computes the
// CPU's products and differs only in the order of the sums: 1e-5 against the CPU op with act_quant. The input tensor
// stays as it was. The f32 linear (cuBLASLt fp32) the same.
TEST_F(CudaLinearTest, ActQuantRoundsTheInputsOnEveryPath) {
  const int64_t n = 320, k = 512;
  for (int64_t m : {1, 3, 8, 16, 40, 130, 300}) {
    const HostTensor x = rand({m, k}, -4.0f, 4.0f);
    const std::string rows = " M=" + std::to_string(m);
    auto check = [&](const std::string& name, const QuantMatrix& host_w, const QuantMatrix& dev_w) {
      HostTensor want(DType::kF32, {m, n});
      QuantLinearParams c{x, host_w, want};
      c.act_quant = ActQuant::kMxfp8;
      cpu().linear_quant(c);
      DeviceTensor dx = up(x), dout = poisoned({m, n});
      QuantLinearParams g{dx, dev_w, dout};
      g.act_quant = ActQuant::kMxfp8;
      gpu().linear_quant(g);
      rel_err(("act_quant linear_quant " + name + rows).c_str(), down(dout), want, 1e-5);
      const HostTensor back = down(dx);
      EXPECT_EQ(std::memcmp(back.data<float>(), x.data<float>(), sizeof(float) * m * k), 0) << name << rows;
    };
    for (const int block : {128, 32}) {
      const HostTensor w = fp8({n, k}), s = e8m0({(n + block - 1) / block, (k + block - 1) / block});
      const DeviceTensor dw = up(w), ds = up(s);
      check("fp8 " + std::to_string(block) + "x" + std::to_string(block) + " e8m0",
            {w, s, QuantFormat::kFP8Block, block, block}, {dw, ds, QuantFormat::kFP8Block, block, block});
    }
    const HostTensor w = rand_bytes(DType::kU8, {n, k / 2}), s = e8m0({n, k / 32});
    const DeviceTensor dw = up(w), ds = up(s);
    check("mxfp4", {w, s, QuantFormat::kMXFP4}, {dw, ds, QuantFormat::kMXFP4});
    const HostTensor wf = rand({n, k});
    HostTensor want(DType::kF32, {m, n});
    cpu().linear({x, wf, want, ActQuant::kMxfp8});
    DeviceTensor dx = up(x), dwf = up(wf), dout = poisoned({m, n});
    gpu().linear({dx, dwf, dout, ActQuant::kMxfp8});
    rel_err(("act_quant linear f32" + rows).c_str(), down(dout), want, 1e-5);
  }
}

// The FP8 GEMM for dense FP8-block projections under act_quant (the default): M = 1536 rows of N = 1536 (144 tiles
// of 128 x 128: the device filled), K = 640, 128 x 128 UE8M0 blocks; x quantized to MXFP8 codes. Against the CPU op
// with act_quant (1e-3: the FP8 block sums, ~2^-12 of Σ|a·w| at most) and against the bf16 path (wgmma_fp8 = never:
// cuBLASLt over the rounded input and the dequantized weight in bf16, the same products). The input stays as it was;
// 32 x 32 blocks decline (they keep the bf16 path: 1e-5 as above).
TEST_F(CudaLinearTest, ActQuantFp8GemmTakesDenseFp8BlockWeights) {
  const int64_t m = 1536, n = 1536, k = 640;
  const HostTensor x = rand({m, k}, -4.0f, 4.0f);
  for (const int block : {128, 32}) {
    const HostTensor w = fp8({n, k}), s = e8m0({(n + block - 1) / block, (k + block - 1) / block});
    const DeviceTensor dw = up(w), ds = up(s), dx = up(x);
    const QuantMatrix hw{w, s, QuantFormat::kFP8Block, block, block}, gw{dw, ds, QuantFormat::kFP8Block, block, block};
    HostTensor want(DType::kF32, {m, n});
    QuantLinearParams c{x, hw, want};
    c.act_quant = ActQuant::kMxfp8;
    cpu().linear_quant(c);
    auto run = [&] {
      DeviceTensor dout = poisoned({m, n});
      QuantLinearParams g{dx, gw, dout};
      g.act_quant = ActQuant::kMxfp8;
      gpu().linear_quant(g);
      return down(dout);
    };
    const HostTensor fp8_out = run();  // the default: the FP8 GEMM
    testing::ScopedKernelChoices fp8_off(gpu(),
                                         [](cuda::KernelChoices& ch) { ch.gemm.wgmma_fp8 = cuda::KernelPick::kNever; });
    const HostTensor plain = run();
    const std::string name = "act_quant fp8 gemm " + std::to_string(block) + "x" + std::to_string(block);
    rel_err(name.c_str(), fp8_out, want, block == 128 ? 1e-3 : 1e-5);
    rel_err((name + " vs default path").c_str(), fp8_out, plain, block == 128 ? 1e-3 : 0.0);
    const HostTensor back = down(dx);
    EXPECT_EQ(std::memcmp(back.data<float>(), x.data<float>(), sizeof(float) * m * k), 0) << name;
  }
}

// --activation-quant fp8 (the V3 family: e4m3 per 128 values, f32 or power-of-two scales) over 128 x 128 FP8 weights
// with f32 scales (V3 checkpoints): many rows take cuBLASLt's block-scaled FP8 GEMM (the x codes and their scales from
// run_fp8_block128_quantize; the tensor cores sum each k32 slice in less than fp32: 5e-4 against the CPU op over the
// rounded input), every row count takes it under lt_fp8_block = always, and lt_fp8_block =
// never keeps the own kernels (the bf16 scratch over the rounded rows for many rows: 4e-3, as for f32 scales without
// the mode; up to 8 rows the streaming kernel over the rows' e4m3 codes and scales, or the fp32 one: 1e-5). The input stays as it was. A K whose blocks are not whole groups
// of 4 (K = 640) declines cuBLASLt (its scale rows would need padding) and keeps the own kernels.
TEST_F(CudaLinearTest, ActQuantFp8Block128TakesCublasLtBlockScaledGemm) {
  const int64_t n = 384;
  for (const int64_t k : {1024, 640})
    for (const ActQuant q : {ActQuant::kFp8Block128, ActQuant::kFp8Block128Ue8m0})
      for (const int64_t m : {1, 3, 8, 40, 300, 1536}) {
        const HostTensor x = rand({m, k}, -4.0f, 4.0f), w = fp8({n, k}), s = f32_scales({n / 128, (k + 127) / 128});
        const DeviceTensor dx = up(x), dw = up(w), ds = up(s);
        const QuantMatrix hw{w, s, QuantFormat::kFP8Block, 128, 128}, gw{dw, ds, QuantFormat::kFP8Block, 128, 128};
        HostTensor want(DType::kF32, {m, n});
        QuantLinearParams c{x, hw, want};
        c.act_quant = q;
        cpu().linear_quant(c);
        auto run = [&] {
          DeviceTensor dout = poisoned({m, n});
          QuantLinearParams g{dx, gw, dout};
          g.act_quant = q;
          gpu().linear_quant(g);
          return down(dout);
        };
        const std::string name =
            std::string("act_quant ") + act_quant_name(q) + " K=" + std::to_string(k) + " M=" + std::to_string(m);
        const bool lt = k % 512 == 0;  // cuBLASLt's scale rows: whole groups of 4 blocks
        // Up to 8 rows the streaming kernels read the rows' codes and scales (exact products, fp32 sums): 1e-5; the
        // rows kernel (9-64) rounds them and the scaled weights to bf16.
        const double own_tol = m <= 8 ? 1e-5 : 4e-3;
        // cuBLASLt's FP8 sums stay within 5e-4 here (H100: 1e-4 - 4e-4 of the largest output in the probe), tighter
        // than the bf16 scratch's rounding of the inputs (~1e-3): the tolerance tells the paths apart.
        rel_err((name + " default").c_str(), run(), want, lt && m >= 300 ? 5e-4 : own_tol);
        {
          testing::ScopedKernelChoices always(
              gpu(), [](cuda::KernelChoices& ch) { ch.gemm.lt_fp8_block = cuda::KernelPick::kAlways; });
          rel_err((name + " lt_fp8_block=always").c_str(), run(), want, lt ? 5e-4 : own_tol);
        }
        {
          testing::ScopedKernelChoices never(
              gpu(), [](cuda::KernelChoices& ch) { ch.gemm.lt_fp8_block = cuda::KernelPick::kNever; });
          rel_err((name + " lt_fp8_block=never").c_str(), run(), want, own_tol);
        }
        const HostTensor back = down(dx);
        EXPECT_EQ(std::memcmp(back.data<float>(), x.data<float>(), sizeof(float) * m * k), 0) << name;
      }
}

// Block formats by M: <= 4 rows the weight-streaming kernel (fp32 products, exact up to order: 1e-5); more
// cuBLASLt on a bf16 dequantized scratch, x rounded to bf16 (2^-9 relative per element, ~1e-3 over the
// output) and f32 scales rounded too: 4e-3. (The bf16 tensor-core kernel is the MoE's: CudaMoeTest.)
TEST_F(CudaLinearTest, QuantLinearEveryFormatMatchesCpu) {
  const int64_t n = 320, k = 512;
  for (int64_t m : {1, 7, 40, 130, 300}) {
    const double tol = m <= 4 ? 1e-5 : 4e-3;
    HostTensor x = rand({m, k});
    // Up to 4 rows with UE8M0 scales: the tensor-core streaming kernel (A in bf16, exact weights): against the
    // rounded input at the fp32 tolerance; f32 scales, and one row at this few tiles, stream in fp32 (exact
    // products) against x itself.
    const HostTensor xr = bf16_rows(x);
    const HostTensor& xq = m <= 4 && cuda::gemm_stream_mma_takes_shape(m, n, 1) ? xr : x;
    // FP8 block-scaled weights: 128x128 UE8M0 (V4 checkpoints) and 32x32 (f32 scales), exact products.
    struct Fp8Case {
      const char* name;
      int block;
      bool f32;
    };
    for (const Fp8Case& c : {Fp8Case{"fp8 128x128 e8m0", 128, false}, Fp8Case{"fp8 32x32 e8m0", 32, false},
                             Fp8Case{"fp8 32x32 f32", 32, true}}) {
      HostTensor w = fp8({n, k});
      Shape ss = {(n + c.block - 1) / c.block, (k + c.block - 1) / c.block};
      HostTensor s = c.f32 ? f32_scales(ss) : e8m0(ss);
      HostTensor want = cpu_linear(c.f32 ? x : xq, cpu_dequant(w, s, QuantFormat::kFP8Block, n, k, c.block, c.block));
      DeviceTensor dx = up(x), dw = up(w), ds = up(s), dout = poisoned({m, n});
      gpu().linear_quant({dx, {dw, ds, QuantFormat::kFP8Block, c.block, c.block}, dout});
      rel_err((std::string("linear_quant ") + c.name + " M=" + std::to_string(m)).c_str(), down(dout), want, tol);
    }
    {
      HostTensor w = rand_bytes(DType::kU8, {n, k / 2}), s = e8m0({n, k / 32});
      HostTensor want = cpu_linear(xq, cpu_dequant(w, s, QuantFormat::kMXFP4, n, k));
      DeviceTensor dx = up(x), dw = up(w), ds = up(s), dout = poisoned({m, n});
      gpu().linear_quant({dx, {dw, ds, QuantFormat::kMXFP4}, dout});
      rel_err(("linear_quant mxfp4 M=" + std::to_string(m)).c_str(), down(dout), want, tol);
    }
    {
      // bf16 weights: cuBLASLt with the input rounded to bf16; the reference keeps x in f32, so the error is
      // the input rounding (about 2^-9 per element, averaged down over K).
      HostTensor wf = rand({n, k});
      HostTensor w(DType::kBF16, {n, k});
      for (int64_t i = 0; i < wf.numel(); ++i) w.data<uint16_t>()[i] = f32_to_bf16(wf.data<float>()[i]);
      HostTensor want = cpu_linear(x, cpu_dequant(w, HostTensor{}, QuantFormat::kFloat, n, k));
      DeviceTensor dx = up(x), dw = up(w), dout = poisoned({m, n});
      gpu().linear_quant({dx, {dw, Tensor{}, QuantFormat::kFloat}, dout});
      rel_err(("linear_quant bf16 M=" + std::to_string(m)).c_str(), down(dout), want, 1e-2);
    }
  }
}

// The decode GEMMs (<= 8 rows). UE8M0 scales take the tensor-core streaming kernel (gemm_stream_mma_cuda.cu): K
// split over 1-8 warps per tile (K = 512 with MXFP4 is 4 steps; 2048 / 4096 the decode shapes; 7168 at 3-8 rows
// does not fit its activation stage, so it makes 2-4 passes over the weights), 8-row tiles with a partial last one
// (N = 300, 300 / 8 leaves 4) and, at N = 20008, 16-row tiles (1,251 of them: the shape for calls with many
// tiles; the last one half full), every row count; FP8 128x128, 32x32 and per-32-column scales and MXFP4 (e2m1
// and e4m3 subnormal codes included). A is rounded to bf16 there and the weights are exact, so against the rounded
// input only the summation order differs (1e-5). f32 scales take the fp32 column-group kernel (exact products)
// against x itself.
TEST_F(CudaLinearTest, QuantLinearStreamingShapesMatchCpu) {
  for (auto [n, k] : {std::pair<int64_t, int64_t>{300, 512}, {264, 2048}, {136, 4096}, {72, 7168}, {20008, 1024}}) {
    for (int64_t m : {1, 2, 3, 4, 6, 8}) {
      // One row at few tiles takes the fp32 kernel (exact in A): against x itself.
      const HostTensor x = rand({m, k}), xr = bf16_rows(x);
      const HostTensor& xq = cuda::gemm_stream_mma_takes_shape(m, n, 1) ? xr : x;
      const std::string shape = " N=" + std::to_string(n) + " K=" + std::to_string(k) + " M=" + std::to_string(m);
      for (const auto& [name, block, f32] :
           {std::tuple{"fp8 128x128 e8m0", 128, false}, {"fp8 32x32 e8m0", 32, false}, {"fp8 32x32 f32", 32, true}}) {
        const HostTensor w = fp8({n, k});
        const Shape ss = {(n + block - 1) / block, (k + block - 1) / block};
        const HostTensor s = f32 ? f32_scales(ss) : e8m0(ss);
        const HostTensor want = cpu_linear(f32 ? x : xq, cpu_dequant(w, s, QuantFormat::kFP8Block, n, k, block, block));
        DeviceTensor dx = up(x), dw = up(w), ds = up(s), dout = poisoned({m, n});
        gpu().linear_quant({dx, {dw, ds, QuantFormat::kFP8Block, block, block}, dout});
        // f32 scales past 4 rows go through cuBLASLt on bf16 copies (input and weight rounded).
        rel_err((std::string("linear_quant ") + name + shape).c_str(), down(dout), want, f32 && m > 4 ? 4e-3 : 1e-5);
      }
      {
        const HostTensor w = fp8({n, k}), s = e8m0({n, (k + 31) / 32});
        const HostTensor want = cpu_linear(xq, cpu_dequant(w, s, QuantFormat::kFP8Row32, n, k));
        DeviceTensor dx = up(x), dw = up(w), ds = up(s), dout = poisoned({m, n});
        gpu().linear_quant({dx, {dw, ds, QuantFormat::kFP8Row32}, dout});
        rel_err(("linear_quant fp8 per-32 e8m0" + shape).c_str(), down(dout), want, 1e-5);
      }
      for (const int hi : {131, 128}) {  // scales up to 2^4 (the two-multiply decode) and up to 2^1
        const HostTensor w = rand_bytes(DType::kU8, {n, k / 2}), s = e8m0({n, k / 32}, 121, hi);
        const HostTensor want = cpu_linear(xq, cpu_dequant(w, s, QuantFormat::kMXFP4, n, k));
        DeviceTensor dx = up(x), dw = up(w), ds = up(s), dout = poisoned({m, n});
        gpu().linear_quant({dx, {dw, ds, QuantFormat::kMXFP4}, dout});
        rel_err(("linear_quant mxfp4 e8m0 <= " + std::to_string(hi) + shape).c_str(), down(dout), want, 1e-5);
      }
    }
  }
}

// FP8 blocks with f32 scales (V3 / R1 checkpoints) on the tensor-core decode kernels (f32_scale_mma). Up to 8 rows the
// streaming kernel: the codes exact, each 128-K block's sums scaled once in fp32, A rounded to bf16, so against the
// rounded input only the summation order and the scale's placement differ (1e-5). 9-64 rows the rows kernel: each
// weight scaled in fp32 and rounded to bf16 (the bf16 scratch's values), A rounded to bf16: against both rounded,
// 1e-5. Shapes: as above plus a K with a partial last block and step (1040), V3's q_b and kv_a (24576 x 1536, 576 x
// 7168: 3 passes past the streaming kernel's stage at 8 rows), 128 x 128 and 16 x 256 blocks, scales spread over
// [0.01, 2) (not powers of two). Off (f32_scale_mma = false; on by default since session 32), the same 128 x 128 calls
// keep the fp32 kernels up to 4 rows (exact products: against x) and cuBLASLt's bf16 scratch past them (4e-3).
TEST_F(CudaLinearTest, QuantLinearF32ScalesTakeTheTensorCoreDecodeKernels) {
  cuda::GemmChoices on_choices;
  on_choices.f32_scale_mma = true;
  for (auto [n, k] : {std::pair<int64_t, int64_t>{300, 512},
                      {264, 2048},
                      {136, 4096},
                      {72, 1040},
                      {20008, 1024},
                      {24576, 1536},
                      {576, 7168}}) {
    for (auto [bn, bk] : {std::pair<int, int>{128, 128}, {16, 256}}) {
      ASSERT_TRUE(cuda::gemm_stream_mma_takes_f32_scales(QuantFormat::kFP8Block, bn, bk, k, on_choices));
      const HostTensor w = fp8({n, k}), s = f32_scales({(n + bn - 1) / bn, (k + bk - 1) / bk});
      const HostTensor wd = cpu_dequant(w, s, QuantFormat::kFP8Block, n, k, bn, bk), wr = bf16_rows(wd);
      const DeviceTensor dw = up(w), ds = up(s);
      for (int64_t m : {1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 40, 64}) {
        const HostTensor x = rand({m, k}), xr = bf16_rows(x);
        const std::string shape = " N=" + std::to_string(n) + " K=" + std::to_string(k) + " block " +
                                  std::to_string(bn) + "x" + std::to_string(bk) + " M=" + std::to_string(m);
        const DeviceTensor dx = up(x);
        auto run = [&] {
          DeviceTensor dout = poisoned({m, n});
          gpu().linear_quant({dx, {dw, ds, QuantFormat::kFP8Block, bn, bk}, dout});
          return down(dout);
        };
        {
          testing::ScopedKernelChoices on(gpu(), [](cuda::KernelChoices& c) { c.gemm.f32_scale_mma = true; });
          if (m <= cuda::kGemmStreamMmaMaxRows) {
            // One row at few tiles: the fp32 column-group kernel still (exact in A).
            const bool tc = cuda::gemm_stream_mma_takes_shape(m, n, 1);
            rel_err(("linear_quant fp8 f32 scales stream_mma" + shape).c_str(), run(), cpu_linear(tc ? xr : x, wd),
                    1e-5);
          } else {
            EXPECT_TRUE(cuda::gemm_rows_mma_takes(QuantFormat::kFP8Block, false, bn, bk, n, k, m, on_choices)) << shape;
            rel_err(("linear_quant fp8 f32 scales rows_mma" + shape).c_str(), run(), cpu_linear(xr, wr), 1e-5);
          }
        }
        if (bn == 128) {
          testing::ScopedKernelChoices off(gpu(), [](cuda::KernelChoices& c) { c.gemm.f32_scale_mma = false; });
          rel_err(("linear_quant fp8 f32 scales off" + shape).c_str(), run(), cpu_linear(x, wd), m <= 4 ? 1e-5 : 4e-3);
        }
      }
    }
  }
}

// Decode batches of 9-128 rows whose tiles fill the device (gemm_mma_dense_fills: the V4 q_b shape) take the
// tensor-core kernels on the stored codes (wgmma on sm_90a) instead of a bf16 scratch for cuBLASLt: A rounded to bf16,
// the UE8M0-scaled weights exact, so against the rounded input only the summation order differs (1e-5); the f32
// scales the same through bf16 products of the f32 dequantized values (4e-3 against x, as the scratch path).
TEST_F(CudaLinearTest, QuantLinearDecodeBatchesReadTheStoredCodes) {
  for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{64, 32768, 256}, {100, 20000, 384}}) {
    ASSERT_TRUE(cuda::gemm_mma_dense_fills(m, n)) << m << " x " << n;
    check_block_formats("linear_quant decode batch", m, n, k);
  }
}

// Decode batches of 9-128 rows whose tiles do not fill the device (the V4 projections: N of 1-4K). By default those
// of up to kGemmRowsMmaAutoRows (64) take the rows kernel (gemm_rows_mma.h: weights read once, all rows in one pass),
// from the f32 rows or (rows_mma_bf16_a) a bf16 copy. With rows_mma = never they take the bf16 scratch for
// cuBLASLt, or with wgmma_split_k = always the wgmma kernel split along K on sm_90a (gemm_wgmma.h). Each: A rounded
// to bf16, the UE8M0-scaled weights exact, so against the rounded input only the summation order differs (1e-5).
// f32 scales take neither own kernel (4e-3 against x, the scratch path's bf16 products of the dequantized values).
TEST_F(CudaLinearTest, QuantLinearSplitKDecodeBatchesMatchCpu) {
  for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{9, 1024, 2048}, {64, 1536, 1024}, {128, 512, 4096}}) {
    ASSERT_FALSE(cuda::gemm_mma_dense_fills(m, n)) << m << " x " << n;
    ASSERT_GT(cuda::wgmma_dense_splits(m, n, k, 132), 1) << m << " x " << n << " x " << k;
    EXPECT_EQ(cuda::gemm_rows_mma_takes(QuantFormat::kFP8Block, true, 128, 128, n, k, m, {}),
              m <= cuda::kGemmRowsMmaAutoRows);
    for (const cuda::KernelPick split : {cuda::KernelPick::kAlways, cuda::KernelPick::kAuto}) {
      testing::ScopedKernelChoices choice(gpu(), [&](cuda::KernelChoices& c) {
        c.gemm.wgmma_split_k = split;
        c.gemm.rows_mma = cuda::KernelPick::kNever;
      });
      check_block_formats(split == cuda::KernelPick::kAlways ? "linear_quant split-K" : "linear_quant scratch", m, n,
                          k);
    }
    if (m > cuda::kGemmRowsMmaMaxRows) continue;
    testing::ScopedKernelChoices rows(gpu(),
                                      [&](cuda::KernelChoices& c) { c.gemm.rows_mma = cuda::KernelPick::kAlways; });
    check_block_formats("linear_quant rows kernel", m, n, k);  // f32 rows, rounded as staged
    testing::ScopedKernelChoices bf16_a(gpu(), [&](cuda::KernelChoices& c) { c.gemm.rows_mma_bf16_a = true; });
    check_block_formats("linear_quant rows kernel bf16 A", m, n, k);
  }
}

// The tiny V4 / V4.1 model shapes the engine's kept-quantized path runs (hidden 128, q_lora 64, 4 heads x 64,
// o_lora 32): N and K below the 128 block, K = 64 inside one scale block, UE8M0 128x128 and 32x32 blocks. One row at
// these few tiles takes the fp32 kernel (exact products: 1e-5 against x); 29 rows round A to bf16 (4e-3 against x).
TEST_F(CudaLinearTest, TinyV4ShapesMatchCpu) {
  for (auto [n, k] : {std::pair<int64_t, int64_t>{64, 128}, {256, 64}, {128, 64}, {32, 128}, {64, 32}}) {
    for (int block : {128, 32}) {
      for (int64_t m : {1, 2, 29}) {
        const HostTensor x = rand({m, k}), xr = bf16_rows(x);
        const HostTensor w = fp8({n, k}), s = e8m0({(n + block - 1) / block, (k + block - 1) / block});
        const bool rounded = m > 1;
        const HostTensor want =
            cpu_linear(rounded && m <= 8 ? xr : x, cpu_dequant(w, s, QuantFormat::kFP8Block, n, k, block, block));
        DeviceTensor dx = up(x), dw = up(w), ds = up(s), dout = poisoned({m, n});
        gpu().linear_quant({dx, {dw, ds, QuantFormat::kFP8Block, block, block}, dout});
        rel_err(("linear_quant tiny N=" + std::to_string(n) + " K=" + std::to_string(k) + " block " +
                 std::to_string(block) + " M=" + std::to_string(m))
                    .c_str(),
                down(dout), want, m > 8 ? 4e-3 : 1e-5);
      }
    }
  }
}

// K = 200 is not a multiple of 16: the streaming kernel falls back to scalar weight loads (M = 3) and the
// cuBLASLt path to the generic dequantize kernel (M = 40, 100).
TEST_F(CudaLinearTest, QuantLinearScalarFallbackMatchesCpu) {
  const int64_t n = 200, k = 200;
  for (int64_t m : {3, 40, 100}) {
    HostTensor x = rand({m, k}), w = fp8({n, k}), s = e8m0({2, 2});
    HostTensor want = cpu_linear(x, cpu_dequant(w, s, QuantFormat::kFP8Block, n, k));
    DeviceTensor dx = up(x), dw = up(w), ds = up(s), dout = poisoned({m, n});
    gpu().linear_quant({dx, {dw, ds, QuantFormat::kFP8Block, 128, 128}, dout});
    rel_err(("linear_quant fp8 K=200 M=" + std::to_string(m)).c_str(), down(dout), want, m <= 4 ? 1e-5 : 4e-3);
  }
}

TEST_F(CudaLinearTest, EmbeddingGathersRows) {
  const int64_t v = 1000, d = 260, t = 77;
  HostTensor table = rand({v, d}), ids = ints(DType::kI64, {t}, 0, v - 1);
  HostTensor want(DType::kF32, {t, d});
  cpu().embedding({table, ids, want});
  DeviceTensor dt = up(table), di = up(ids), dout = poisoned({t, d});
  gpu().embedding({dt, di, dout});
  rel_err("embedding", down(dout), want, 0.0);
}

// LinearPrecision::kBF16: the same GEMM as the CPU op on bf16-rounded input and weight (fp32 accumulation, so
// only the summation order differs); switching back gives the fp32 result again.
TEST_F(CudaLinearTest, LinearBf16PrecisionEqualsRoundedInputs) {
  for (auto [m, n, k] : {std::tuple{1, 512, 256}, {37, 300, 1000}, {130, 64, 4096}}) {
    HostTensor x = rand({m, k}, -2, 2), w = rand({n, k}, -0.5f, 0.5f);
    HostTensor xr(DType::kF32, {m, k}), wr(DType::kF32, {n, k}), want(DType::kF32, {m, n}), want32(DType::kF32, {m, n});
    for (int64_t i = 0; i < x.numel(); ++i) xr.data<float>()[i] = round_bf16(x.data<float>()[i]);
    for (int64_t i = 0; i < w.numel(); ++i) wr.data<float>()[i] = round_bf16(w.data<float>()[i]);
    cpu().linear({xr, wr, want});
    cpu().linear({x, w, want32});
    DeviceTensor dx = up(x), dw = up(w), dout = poisoned({m, n});
    gpu().set_linear_precision(LinearPrecision::kBF16);
    gpu().linear({dx, dw, dout});
    rel_err("linear bf16 precision vs rounded CPU", down(dout), want, 1e-5);
    const double vs32 = rel_err("linear bf16 precision vs fp32 (loose)", down(dout), want32, 1e-2);
    EXPECT_GT(vs32, 1e-5) << "the bf16 mode should round";
    gpu().set_linear_precision(LinearPrecision::kF32);
    gpu().linear({dx, dw, dout});
    rel_err("linear back to fp32", down(dout), want32, 1e-5);
  }
}

// Batch-invariant mode: a row's output is the same bytes whether it runs alone, in a short run, in 11 rows or in
// all 37, in any order. UE8M0 block formats take the tensor-core sequence (gemm_invariant_mma.h: the streaming
// kernel up to 8 rows, the tile kernel above): A rounded to bf16, weights exact, so against the rounded input only
// the summation order differs (1e-5). f32 and bf16 weights, f32 scales and FP8 with K = 200 (not a multiple of the
// 16-wide chunks) keep fp32 FMA chains — for f32 / bf16 weights of N = 300 the K-sliced chains at every row count
// (gemm_invariant_f32.h), for the others the column-chain kernel up to 8 rows and above the SIMT tile (or, at this
// N of 3 SIMT tiles, the chain kernel over blocks of 8 rows): exact fp32 products against x itself (1e-5).
TEST_F(CudaLinearTest, BatchInvariantModeRowsDoNotDependOnTheBatch) {
  gpu().set_batch_invariant(true);
  const int64_t m = 37, n = 300;
  struct Case {
    std::string name;
    int64_t k;
    HostTensor w, s;
    QuantFormat f;
    int block;
  };
  std::vector<Case> cases;
  cases.push_back({"f32", 520, rand({n, 520}), HostTensor{}, QuantFormat::kFloat, 0});
  cases.push_back({"fp8 128x128 e8m0", 512, fp8({n, 512}), e8m0({3, 4}), QuantFormat::kFP8Block, 128});
  cases.push_back({"fp8 32x32 f32", 512, fp8({n, 512}), f32_scales({10, 16}), QuantFormat::kFP8Block, 32});
  cases.push_back({"fp8 128x128 K=200", 200, fp8({n, 200}), e8m0({3, 2}), QuantFormat::kFP8Block, 128});
  cases.push_back({"mxfp4", 512, rand_bytes(DType::kU8, {n, 256}), e8m0({n, 16}), QuantFormat::kMXFP4, 0});
  {
    HostTensor wf = rand({n, 512}), w(DType::kBF16, {n, 512});
    for (int64_t i = 0; i < wf.numel(); ++i) w.data<uint16_t>()[i] = f32_to_bf16(wf.data<float>()[i]);
    cases.push_back({"bf16", 512, std::move(w), HostTensor{}, QuantFormat::kFloat, 0});
  }
  for (const Case& c : cases) {
    const bool f32 = c.w.dtype() == DType::kF32;
    const HostTensor x = rand({m, c.k});
    const int block = c.block ? c.block : 128;
    const bool rounds = cuda::gemm_invariant_mma_takes(c.f, c.s.dtype() == DType::kE8M0, block, block, c.k);
    const HostTensor xr = bf16_rows(x);
    const HostTensor& xq = rounds ? xr : x;
    const HostTensor want = f32 ? cpu_linear(x, c.w) : cpu_linear(xq, cpu_dequant(c.w, c.s, c.f, n, c.k, block, block));
    const DeviceTensor dw = up(c.w), ds = c.s.view().data() ? up(c.s) : DeviceTensor{};
    auto call = [&](const HostTensor& xs) {
      const DeviceTensor dx = up(xs), dout = poisoned({xs.shape()[0], n});
      if (f32)
        gpu().linear({dx, dw, dout});
      else
        gpu().linear_quant({dx, {dw, ds.view(), c.f, block, block}, dout});
      return down(dout);
    };
    const HostTensor full = call(x);
    rel_err(("batch-invariant linear " + c.name).c_str(), full, want, 1e-5);
    for (const auto& rows : invariance_subsets(m))
      expect_rows_bitwise("batch-invariant linear " + c.name + " rows=" + std::to_string(rows.size()),
                          call(take_rows(x, rows)), full, rows);
  }
}

// Batch-invariant mode at decode shapes: 1-8 rows run the few-row kernels, 12 rows the tile kernels; every row must
// be the same bytes either way. UE8M0 block formats with K a multiple of 16 take the tensor-core pair (the streaming
// kernel, the invariant tile; A rounded to bf16: against the rounded input, 1e-5), the rest the fp32 chains (the
// column-chain kernels, the SIMT tile; exact fp32 products against x, 1e-5). The shapes stress the chain kernel's
// tiling: N not a multiple of its 32 columns (4500, 1000, 300), K a multiple of neither its 128-wide FP8 stage (2064,
// 1040) nor its 256-wide MXFP4 stage (4128), K = 7168, f32 rows with K % 16 = 4 (1300: zero chunks up to the tile's
// 16-wide k-steps) and K % 4 != 0 (1302: the scalar fallback), FP8 K = 200 (scalar fallback), MXFP4 scales past 2^113
// (the chain's product there is (code · 2^-14 · 2^14) · scale, not code · 2^-14 · (scale · 2^14), which would overflow;
// the tensor-core decode applies such scales in two exact bf16 multiplies), FP8 with arbitrary f32 scales (V3) and
// per-32-column scales. On a 132-SM device N = 4500 at 8 rows takes the chain's two-rows-per-thread variant (141 column
// blocks x 8 rows > 8 warps per SM), at 1-7 rows one row per warp; N = 40000 (FP8) and 30000 (MXFP4) take the shallow
// cp.async ring, the others the deep one. The 12-row f32 calls take the SIMT tile when its tiles fill a quarter of the
// device (N = 4500), else (N = 1000) the chain kernel over blocks of 8 rows; K = 1302 (no 16-byte chunks) always the
// SIMT tile. f32 weights of at most 512 rows with K % 4 == 0 take the K-sliced chains at every row count instead
// (gemm_invariant_f32.h; K = 1302 does not).
TEST_F(CudaLinearTest, BatchInvariantDecodeShapesMatchTheTile) {
  gpu().set_batch_invariant(true);
  const int64_t m = 12;
  struct Case {
    std::string name;
    int64_t n, k;
    HostTensor w, s;
    QuantFormat f;
    int block;
  };
  std::vector<Case> cases;
  cases.push_back({"fp8 128x128 e8m0", 4500, 7168, fp8({4500, 7168}), e8m0({36, 56}), QuantFormat::kFP8Block, 128});
  cases.push_back({"fp8 32x32 f32", 1000, 2064, fp8({1000, 2064}), f32_scales({32, 65}), QuantFormat::kFP8Block, 32});
  cases.push_back({"fp8 128x128 f32", 300, 1040, fp8({300, 1040}), f32_scales({3, 9}), QuantFormat::kFP8Block, 128});
  cases.push_back({"fp8 per-32 e8m0", 1000, 2064, fp8({1000, 2064}), e8m0({1000, 65}), QuantFormat::kFP8Row32, 0});
  cases.push_back({"fp8 128x128 K=200", 1000, 200, fp8({1000, 200}), e8m0({8, 2}), QuantFormat::kFP8Block, 128});
  cases.push_back(
      {"mxfp4", 2304, 5120, rand_bytes(DType::kU8, {2304, 2560}), e8m0({2304, 160}), QuantFormat::kMXFP4, 0});
  // Enough column blocks that the launch takes the shallow ring (more blocks per SM).
  cases.push_back({"fp8 128x128 e8m0", 40000, 1040, fp8({40000, 1040}), e8m0({313, 9}), QuantFormat::kFP8Block, 128});
  cases.push_back(
      {"mxfp4", 30000, 512, rand_bytes(DType::kU8, {30000, 256}), e8m0({30000, 16}), QuantFormat::kMXFP4, 0});
  cases.push_back(
      {"mxfp4 K=4128", 300, 4128, rand_bytes(DType::kU8, {300, 2064}), e8m0({300, 129}), QuantFormat::kMXFP4, 0});
  {
    HostTensor s = e8m0({300, 16});
    // 2^114 .. 2^119: finite products (6 · 2^119 · 32 < FLT_MAX), but scale · 2^14 overflows.
    for (int64_t i = 0; i < s.numel(); i += 7) s.data<uint8_t>()[i] = static_cast<uint8_t>(241 + i % 6);
    cases.push_back({"mxfp4 scales past 2^113", 300, 512, rand_bytes(DType::kU8, {300, 256}), std::move(s),
                     QuantFormat::kMXFP4, 0});
  }
  cases.push_back({"f32 K=1300", 1000, 1300, rand({1000, 1300}), HostTensor{}, QuantFormat::kFloat, 0});
  // 36 column tiles of the SIMT tile at 12 rows (a quarter of a 132-SM device or more: the SIMT tile; N = 1000 above
  // is 8 tiles, which run the chain kernel over blocks of 8 rows instead).
  cases.push_back({"f32 K=1300 N=4500", 4500, 1300, rand({4500, 1300}), HostTensor{}, QuantFormat::kFloat, 0});
  cases.push_back({"f32 K=1302", 300, 1302, rand({300, 1302}), HostTensor{}, QuantFormat::kFloat, 0});
  // Small f32 weights (N <= 512, K % 4 == 0): the K-sliced chains at every row count (gemm_invariant_f32.h): a router
  // (8 slices of 512) and 2 uneven slices (325 float4s).
  cases.push_back({"f32 router", 256, 4096, rand({256, 4096}), HostTensor{}, QuantFormat::kFloat, 0});
  cases.push_back({"f32 K=1300 N=300", 300, 1300, rand({300, 1300}), HostTensor{}, QuantFormat::kFloat, 0});
  const std::vector<std::vector<int64_t>> subsets = {{0},
                                                     {11},
                                                     {5, 6},
                                                     {9, 2, 4},
                                                     {0, 1, 2, 3},
                                                     {3, 4, 5, 6, 7},
                                                     {6, 7, 8, 9, 10, 11},
                                                     {1, 2, 3, 4, 5, 6, 7},
                                                     {0, 1, 2, 3, 4, 5, 6, 7},
                                                     {11, 10, 9, 8, 7, 6, 5, 4}};
  for (const Case& c : cases) {
    const bool f32 = c.f == QuantFormat::kFloat;
    const HostTensor x = rand({m, c.k});
    const int block = c.block ? c.block : 128;
    const bool rounds = cuda::gemm_invariant_mma_takes(c.f, c.s.dtype() == DType::kE8M0, block, block, c.k);
    const HostTensor xr = bf16_rows(x);
    const HostTensor want =
        f32 ? cpu_linear(x, c.w) : cpu_linear(rounds ? xr : x, cpu_dequant(c.w, c.s, c.f, c.n, c.k, block, block));
    const DeviceTensor dw = up(c.w), ds = c.s.view().data() ? up(c.s) : DeviceTensor{};
    auto call = [&](const HostTensor& xs) {
      const DeviceTensor dx = up(xs), dout = poisoned({xs.shape()[0], c.n});
      if (f32)
        gpu().linear({dx, dw, dout});
      else
        gpu().linear_quant({dx, {dw, ds.view(), c.f, block, block}, dout});
      return down(dout);
    };
    const std::string name =
        "batch-invariant decode " + c.name + " N=" + std::to_string(c.n) + " K=" + std::to_string(c.k);
    const HostTensor full = call(x);
    rel_err(name.c_str(), full, want, 1e-5);
    for (const auto& rows : subsets)
      expect_rows_bitwise(name + " rows=" + std::to_string(rows.size()), call(take_rows(x, rows)), full, rows);
  }
}

// Batch-invariant mode, small f32 weights (the routers: V4-Flash 256 x 4096, V4.1 384 x 7168; and 300 x 1300 in 2
// uneven slices): the K-sliced chains run as 8-row blocks below 64 rows and as a 64 x 64 tile from 64 rows
// (gemm_invariant_f32.h); a row's bytes must be the same in both, wherever it sits, and within 1e-5 of the CPU
// (exact fp32 products, another summation order).
TEST_F(CudaLinearTest, BatchInvariantF32RouterRowsMatchAtEveryRowCount) {
  gpu().set_batch_invariant(true);
  const int64_t m = 200;
  for (auto [n, k] : {std::pair<int64_t, int64_t>{256, 4096}, {384, 7168}, {300, 1300}}) {
    const HostTensor x = rand({m, k}), w = rand({n, k});
    const DeviceTensor dw = up(w);
    auto call = [&](const HostTensor& xs) {
      const DeviceTensor dx = up(xs), dout = poisoned({xs.shape()[0], n});
      gpu().linear({dx, dw, dout});
      return down(dout);
    };
    const std::string name = "batch-invariant f32 sliced N=" + std::to_string(n) + " K=" + std::to_string(k) +
                             " slices=" + std::to_string(cuda::gemm_invariant_f32_slices(k));
    const HostTensor full = call(x);
    rel_err(name.c_str(), full, cpu_linear(x, w), 1e-5);
    std::vector<std::vector<int64_t>> subsets = {{0}, {m - 1}};
    for (int64_t len : std::initializer_list<int64_t>{8, 12, 63, 64, 65, 130, m - 1}) {
      std::vector<int64_t> rows(len);
      std::iota(rows.begin(), rows.end(), m - len);
      subsets.push_back(rows);
    }
    std::vector<int64_t> reversed(m);
    std::iota(reversed.rbegin(), reversed.rend(), 0);
    subsets.push_back(reversed);
    for (const auto& rows : subsets)
      expect_rows_bitwise(name + " rows=" + std::to_string(rows.size()), call(take_rows(x, rows)), full, rows);
  }
}

// The batch-invariant sequence's choices depend on the weight only (host functions: no device needed). K slices:
// the streaming kernel's rule at one group slot, for dense weights and weight tables alike; which weights take it:
// UE8M0 block formats with K a multiple of the 16-byte chunk and power-of-two FP8 blocks at least 16 wide in K.
TEST(GemmInvariantMma, ChoicesFollowTheWeightOnly) {
  using cuda::gemm_invariant_mma_slices;
  EXPECT_EQ(gemm_invariant_mma_slices(QuantFormat::kFP8Block, 300, 1040), 8);  // 17 steps: 2-3 a slice
  EXPECT_EQ(gemm_invariant_mma_slices(QuantFormat::kFP8Block, 4500, 7168), 8);
  EXPECT_EQ(gemm_invariant_mma_slices(QuantFormat::kFP8Block, 10000, 1024), 4);  // 625 tiles
  EXPECT_EQ(gemm_invariant_mma_slices(QuantFormat::kFP8Block, 20008, 2048), 2);  // 1251 tiles
  EXPECT_EQ(gemm_invariant_mma_slices(QuantFormat::kMXFP4, 30000, 512), 2);      // 1875 tiles
  EXPECT_EQ(gemm_invariant_mma_slices(QuantFormat::kMXFP4, 32800, 512), 1);      // 2050 tiles
  EXPECT_EQ(gemm_invariant_mma_slices(QuantFormat::kMXFP4, 300, 352), 1);        // 3 steps
  EXPECT_EQ(gemm_invariant_mma_slices(QuantFormat::kMXFP4, 2304, 5120), 8);      // 144 tiles (a V4.1 expert)
  using cuda::gemm_invariant_mma_takes;
  EXPECT_TRUE(gemm_invariant_mma_takes(QuantFormat::kFP8Block, true, 128, 128, 7168));
  EXPECT_TRUE(gemm_invariant_mma_takes(QuantFormat::kFP8Block, true, 32, 16, 48));
  EXPECT_FALSE(gemm_invariant_mma_takes(QuantFormat::kFP8Block, false, 128, 128, 7168));  // f32 scales
  EXPECT_FALSE(gemm_invariant_mma_takes(QuantFormat::kFP8Block, true, 128, 128, 200));    // K % 16
  EXPECT_FALSE(gemm_invariant_mma_takes(QuantFormat::kFP8Block, true, 96, 128, 7168));    // block_n not 2^n
  EXPECT_FALSE(gemm_invariant_mma_takes(QuantFormat::kFP8Block, true, 128, 8, 7168));     // block_k < 16
  EXPECT_TRUE(gemm_invariant_mma_takes(QuantFormat::kFP8Row32, true, 0, 0, 2064));
  EXPECT_TRUE(gemm_invariant_mma_takes(QuantFormat::kMXFP4, true, 0, 0, 4128));
  EXPECT_FALSE(gemm_invariant_mma_takes(QuantFormat::kMXFP4, true, 0, 0, 4112));  // K % 32
  EXPECT_FALSE(gemm_invariant_mma_takes(QuantFormat::kFloat, true, 128, 128, 512));
  // Small f32 weights: K-sliced chains of about 512 k, up to 8.
  EXPECT_TRUE(cuda::gemm_invariant_f32_split_takes(256, 4096));
  EXPECT_FALSE(cuda::gemm_invariant_f32_split_takes(1000, 4096));  // N > 512
  EXPECT_FALSE(cuda::gemm_invariant_f32_split_takes(300, 1302));   // K % 4
  EXPECT_EQ(cuda::gemm_invariant_f32_slices(4096), 8);
  EXPECT_EQ(cuda::gemm_invariant_f32_slices(1300), 2);
  EXPECT_EQ(cuda::gemm_invariant_f32_slices(300), 1);
  EXPECT_EQ(cuda::gemm_invariant_f32_slices(100000), 8);
}

// Batch-invariant mode on the tensor cores (gemm_invariant_mma.h), dense: the streaming kernel (1-8 rows) and the
// tile kernel (more rows; 128 weight rows x 64 rows a block) must give every row the same bytes, wherever the row
// sits in the call (alone, at another position of an n8 tile or of a 64-row tile, in a partial last tile). The
// shapes cover each K-slice count of the sequence (kw = 8: N = 300 / 264 / 1000 / 2304 / 4500 and the K = 49168
// one, slices of 2-3 steps at K = 1040; 4: N = 10000; 2: N = 20008 / 30000; 1: MXFP4 K = 352, 3 steps, the last
// with 3 of its 4 chunks), a last step with 1 of its 4 chunks (K = 1040, 2064, 4128), K
// = 7168 (the streaming kernel makes 2 passes of 4 rows over the weights at 8 rows) and K = 49168, whose activation
// stage does not fit the streaming kernel even for one row (the tile kernel takes every call), partial 128-row
// weight blocks and 16-row tiles, FP8 128x128 / 32x32 / per-32 scales and MXFP4, random codes (subnormals
// included) and scales. Against the CPU on the bf16-rounded input (weights exact: only the summation order
// differs): 1e-5.
TEST_F(CudaLinearTest, BatchInvariantTensorCoreRowsMatchAtEveryRowCount) {
  gpu().set_batch_invariant(true);
  struct Case {
    std::string name;
    int64_t n, k, m;
    QuantFormat f;
    int block;
  };
  const std::vector<Case> cases = {
      {"fp8 128x128", 300, 1040, 300, QuantFormat::kFP8Block, 128},
      {"fp8 128x128", 4500, 7168, 40, QuantFormat::kFP8Block, 128},
      {"fp8 128x128", 20008, 2048, 40, QuantFormat::kFP8Block, 128},
      {"fp8 128x128", 10000, 1024, 70, QuantFormat::kFP8Block, 128},
      {"fp8 128x128", 40, 49168, 140, QuantFormat::kFP8Block, 128},
      {"fp8 32x32", 264, 2064, 200, QuantFormat::kFP8Block, 32},
      {"fp8 per-32", 1000, 2064, 80, QuantFormat::kFP8Row32, 0},
      {"mxfp4", 300, 4128, 300, QuantFormat::kMXFP4, 0},
      {"mxfp4", 2304, 5120, 72, QuantFormat::kMXFP4, 0},
      {"mxfp4", 30000, 512, 70, QuantFormat::kMXFP4, 0},
      {"mxfp4", 300, 352, 300, QuantFormat::kMXFP4, 0},
  };
  auto run_of = [](int64_t a, int64_t len) {
    std::vector<int64_t> v;
    for (int64_t i = 0; i < len; ++i) v.push_back(a + i);
    return v;
  };
  for (const Case& c : cases) {
    const int block = c.block ? c.block : 128;
    const HostTensor w = c.f == QuantFormat::kMXFP4 ? rand_bytes(DType::kU8, {c.n, c.k / 2}) : fp8({c.n, c.k});
    const HostTensor s = c.f == QuantFormat::kMXFP4      ? e8m0({c.n, c.k / 32})
                         : c.f == QuantFormat::kFP8Row32 ? e8m0({c.n, (c.k + 31) / 32})
                                                         : e8m0({(c.n + block - 1) / block, (c.k + block - 1) / block});
    ASSERT_TRUE(cuda::gemm_invariant_mma_takes(c.f, true, block, block, c.k)) << c.name;
    const HostTensor x = rand({c.m, c.k});
    const HostTensor dq = cpu_dequant(w, s, c.f, c.n, c.k, block, block);
    const DeviceTensor dw = up(w), ds = up(s);
    auto call = [&](const HostTensor& xs) {
      const DeviceTensor dx = up(xs), dout = poisoned({xs.shape()[0], c.n});
      gpu().linear_quant({dx, {dw, ds.view(), c.f, block, block}, dout});
      return down(dout);
    };
    const std::string name = "batch-invariant mma " + c.name + " N=" + std::to_string(c.n) +
                             " K=" + std::to_string(c.k) +
                             " kw=" + std::to_string(cuda::gemm_invariant_mma_slices(c.f, c.n, c.k));
    const HostTensor full = call(x);
    rel_err((name + " M=" + std::to_string(c.m)).c_str(), full, cpu_linear(bf16_rows(x), dq), 1e-5);
    // 1-8 rows (the streaming kernel: 1, 2, 4, 8 rows a pass), 9-130 rows (the tile kernel: partial 64-row tiles,
    // rows at other positions of their tiles), all rows but the first, all rows reversed.
    std::vector<std::vector<int64_t>> subsets = {{0}, {c.m - 1}, {c.m / 2, 3}, run_of(5, 3)};
    for (int64_t len : {4, 5, 8, 9, 13, 64, 65, 130})
      if (len + 3 <= c.m) subsets.push_back(run_of(c.m - len - 3 + (len % 3), len));
    subsets.push_back(run_of(1, c.m - 1));
    std::vector<int64_t> reversed = run_of(0, c.m);
    std::reverse(reversed.begin(), reversed.end());
    subsets.push_back(reversed);
    for (const auto& rows : subsets)
      expect_rows_bitwise(name + " rows=" + std::to_string(rows.size()), call(take_rows(x, rows)), full, rows);
  }
}

}  // namespace
}  // namespace deepinfer
