// Norm, rope, fake-quant, mHC, compressor and Engram ops on CUDA against the CPU reference.
#include <gtest/gtest.h>

#include <string>
#include <tuple>

#include "cuda/cuda_test_util.h"
#include "deepinfer/ops/cpu/cpu_backend.h"
#include "deepinfer/ops/cuda/kernels.h"

namespace deepinfer {
namespace {

using testing::CudaOpTest;
using testing::DeviceTensor;

TEST_F(CudaOpTest, RmsNormWeightedUnweightedAndInPlace) {
  for (auto [m, d] : {std::pair{1, 4096}, {37, 1000}, {5, 7168}}) {
    HostTensor x = rand({m, d}, -3, 3), w = rand({d});
    for (bool weighted : {true, false}) {
      HostTensor want(DType::kF32, {m, d});
      cpu().rms_norm({x, weighted ? w.view() : Tensor{}, want, 1e-6f});
      DeviceTensor dx = up(x), dw = up(w), dout = poisoned({m, d});
      gpu().rms_norm({dx, weighted ? dw.view() : Tensor{}, dout, 1e-6f});
      rel_err(weighted ? "rms_norm weighted" : "rms_norm unweighted", down(dout), want, 1e-6);
      gpu().rms_norm({dx, weighted ? dw.view() : Tensor{}, dx, 1e-6f});  // in place
      rel_err("rms_norm in place", down(dx), want, 1e-6);
    }
  }
}

TEST_F(CudaOpTest, RopeForwardAndInverse) {
  const int64_t t = 19, h = 8, hd = 192, half = 32;
  HostTensor x = rand({t, h, hd}, -2, 2), pos = ints(DType::kI64, {t}, 0, 70000);
  HostTensor inv(DType::kF32, {half});
  for (int64_t i = 0; i < half; ++i) inv.data<float>()[i] = std::pow(10000.0f, -static_cast<float>(i) / half);
  for (bool inverse : {false, true}) {
    HostTensor want(DType::kF32, x.shape());
    std::memcpy(want.view().data(), x.view().data(), x.view().nbytes());
    cpu().rope({want, pos, inv, inverse});
    DeviceTensor dx = up(x), dp = up(pos), di = up(inv);
    gpu().rope({dx, dp, di, inverse});
    rel_err(inverse ? "rope inverse" : "rope", down(dx), want, 1e-6);
  }
}

TEST_F(CudaOpTest, FakeQuantEveryKindMatchesCpuBits) {
  for (auto kind :
       {FakeQuantKind::kFP8E4M3Ue8m0Block32, FakeQuantKind::kFP4Ue8m0Block32, FakeQuantKind::kFP4E4m3Block16,
        FakeQuantKind::kFP8E4M3Block128, FakeQuantKind::kFP8E4M3Ue8m0Block128}) {
    // Rows of very different magnitudes exercise the scale rules (including the amax floors).
    HostTensor x = rand({24, 256}, -1, 1);
    for (int64_t r = 0; r < 24; ++r) {
      const float mag = std::ldexp(1.0f, static_cast<int>(r) - 16);
      for (int64_t c = 0; c < 256; ++c) x.data<float>()[r * 256 + c] *= mag;
    }
    HostTensor want(DType::kF32, x.shape());
    std::memcpy(want.view().data(), x.view().data(), x.view().nbytes());
    cpu().fake_quant({want, kind});
    DeviceTensor dx = up(x);
    gpu().fake_quant({dx, kind});
    HostTensor got = down(dx);
    const std::string name = kind == FakeQuantKind::kFP8E4M3Ue8m0Block32 ? "fake_quant fp8 e4m3/ue8m0 b32"
                             : kind == FakeQuantKind::kFP4Ue8m0Block32   ? "fake_quant fp4/ue8m0 b32"
                             : kind == FakeQuantKind::kFP4E4m3Block16    ? "fake_quant fp4/e4m3 b16"
                             : kind == FakeQuantKind::kFP8E4M3Block128   ? "fake_quant fp8 e4m3/f32 b128"
                                                                         : "fake_quant fp8 e4m3/ue8m0 b128";
    expect_same_bytes(name.c_str(), got, want);
    // The copying form (act_quant's rounded GEMM inputs): the same bits into another buffer, the source untouched.
    DeviceTensor src = up(x), dst = poisoned(x.shape());
    cuda::FakeQuantKernelParams f;
    f.x = dst.view().data_as<float>();
    f.in = src.view().data_as<float>();
    f.rows = 24;
    f.cols = 256;
    f.kind = kind;
    cuda::run_fake_quant(f, gpu().stream());
    expect_same_bytes((name + " copy").c_str(), down(dst), want);
    expect_same_bytes((name + " copy source").c_str(), down(src), x);
  }
}

// run_mxfp8_quantize (the FP8 operand form of act_quant, for the e4m3 tensor-core GEMMs): the CPU reference's codes
// and scales byte for byte, over rows of magnitudes 2^-30 .. 2^10.
TEST_F(CudaOpTest, Mxfp8QuantizeMatchesCpuBytes) {
  const int64_t rows = 41, cols = 512;
  HostTensor x = rand({rows, cols}, -2, 2);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) x.data<float>()[r * cols + c] *= std::ldexp(1.0f, static_cast<int>(r) - 30);
  HostTensor codes(DType::kU8, {rows, cols}), scales(DType::kU8, {rows, cols / 32});
  mxfp8_quantize_rows(x.data<float>(), rows, cols, codes.data<uint8_t>(), scales.data<uint8_t>());
  DeviceTensor dx = up(x), dcodes = up(HostTensor(DType::kU8, {rows, cols})),
               dscales = up(HostTensor(DType::kU8, {rows, cols / 32}));
  cuda::Mxfp8QuantizeKernelParams p;
  p.x = dx.view().data_as<float>();
  p.codes = dcodes.view().data_as<uint8_t>();
  p.scales = dscales.view().data_as<uint8_t>();
  p.rows = rows;
  p.cols = cols;
  cuda::run_mxfp8_quantize(p, gpu().stream());
  expect_same_bytes("mxfp8 quantize codes", down(dcodes), codes);
  expect_same_bytes("mxfp8 quantize scales", down(dscales), scales);
}

// run_fp8_block128_quantize (the V3 family's act_quant as cuBLASLt's FP8 operand): the CPU reference's codes and f32
// scales byte for byte, block-major (VEC128_32F) and row-major, from a strided input (ldx > cols) into strided codes,
// over rows of magnitudes 2^-30 .. 2^10, with f32 and power-of-two scales.
TEST_F(CudaOpTest, Fp8Block128QuantizeMatchesCpuBytes) {
  const int64_t rows = 41, cols = 512, kb = cols / 128, ldx = cols + 64, ldc = cols + 16;
  HostTensor x = rand({rows, ldx}, -2, 2);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < ldx; ++c) x.data<float>()[r * ldx + c] *= std::ldexp(1.0f, static_cast<int>(r) - 30);
  HostTensor dense(DType::kF32, {rows, cols});
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(dense.data<float>() + r * cols, x.data<float>() + r * ldx, sizeof(float) * cols);
  for (const bool ue8m0 : {false, true})
    for (const bool block_major : {true, false}) {
      const int64_t srow = block_major ? 1 : kb, sblock = block_major ? rows : 1;
      HostTensor codes(DType::kU8, {rows, cols}), scales(DType::kF32, {rows * kb});
      fp8_block128_quantize_rows(dense.data<float>(), rows, cols, ue8m0, codes.data<uint8_t>(), scales.data<float>(),
                                 srow, sblock);
      HostTensor want_codes(DType::kU8, {rows, ldc});
      std::memset(want_codes.data<uint8_t>(), 0x5A, rows * ldc);
      for (int64_t r = 0; r < rows; ++r)
        std::memcpy(want_codes.data<uint8_t>() + r * ldc, codes.data<uint8_t>() + r * cols, cols);
      HostTensor init(DType::kU8, {rows, ldc});
      std::memset(init.data<uint8_t>(), 0x5A, rows * ldc);
      DeviceTensor dx = up(x), dcodes = up(init), dscales = poisoned({rows * kb});
      cuda::Fp8Block128QuantizeKernelParams p;
      p.x = dx.view().data_as<float>();
      p.ldx = ldx;
      p.codes = dcodes.view().data_as<uint8_t>();
      p.ldc = ldc;
      p.scales = dscales.view().data_as<float>();
      p.scale_row_stride = srow;
      p.scale_block_stride = sblock;
      p.rows = rows;
      p.cols = cols;
      p.ue8m0 = ue8m0;
      cuda::run_fp8_block128_quantize(p, gpu().stream());
      const std::string name = std::string("fp8 block128 quantize") + (ue8m0 ? " ue8m0" : " f32") +
                               (block_major ? " block-major" : " row-major");
      expect_same_bytes((name + " codes").c_str(), down(dcodes), want_codes);
      expect_same_bytes((name + " scales").c_str(), down(dscales), scales);
    }
}

// The split-K coefficient kernel at the real V4-Flash size (hc·D = 16384: 32 splits) with one token and with
// several token tiles (70 tokens = 9 tiles of 8; 2100, a long prefill's 66 tiles of 32 with a short last one).
TEST_F(CudaOpTest, HcMixRealSizeSplitK) {
  const int64_t hc = 4, d = 4096, mix = (2 + hc) * hc;
  for (int64_t t : {1, 70, 2100}) {
    HostTensor streams = rand({t, hc, d}, -2, 2), fn = rand({mix, hc * d}, -0.01f, 0.01f), base = rand({mix});
    HostTensor scale = rand({3}, 0.5f, 1.5f);
    HostTensor pre(DType::kF32, {t, hc}), post(DType::kF32, {t, hc}), comb(DType::kF32, {t, hc, hc});
    cpu().hc_mix({streams, fn, base, scale, pre, post, comb, 1e-6f, 1e-6f, 20});
    DeviceTensor ds = up(streams), dfn = up(fn), db = up(base), dsc = up(scale);
    DeviceTensor dpre = poisoned({t, hc}), dpost = poisoned({t, hc}), dcomb = poisoned({t, hc, hc});
    gpu().hc_mix({ds, dfn, db, dsc, dpre, dpost, dcomb, 1e-6f, 1e-6f, 20});
    const std::string n = " D=4096 T=" + std::to_string(t);
    rel_err(("hc_mix pre" + n).c_str(), down(dpre), pre, 1e-5);
    rel_err(("hc_mix post" + n).c_str(), down(dpost), post, 1e-5);
    rel_err(("hc_mix comb" + n).c_str(), down(dcomb), comb, 1e-5);
  }
}

TEST_F(CudaOpTest, HcMixHeadCollapseExpand) {
  const int64_t t = 9, d = 1024;
  const HcMixed m = expect_hc_mix_and_head_match_cpu(t, d, 0.05f, "");
  const HostTensor &streams = m.streams, &pre = m.pre, &post = m.post, &comb = m.comb;
  DeviceTensor ds = up(streams);

  HostTensor out(DType::kF32, {t, d});
  cpu().hc_collapse({streams, pre, out});
  DeviceTensor dout = poisoned({t, d}), dpre_in = up(pre);
  gpu().hc_collapse({ds, dpre_in, dout});
  rel_err("hc_collapse", down(dout), out, 1e-6);

  HostTensor y = rand({t, d});
  HostTensor want(DType::kF32, streams.shape());
  std::memcpy(want.view().data(), streams.view().data(), streams.view().nbytes());
  cpu().hc_expand({want, y, post, comb});
  DeviceTensor dy = up(y), dpost_in = up(post), dcomb_in = up(comb);
  gpu().hc_expand({ds, dy, dpost_in, dcomb_in});
  rel_err("hc_expand", down(ds), want, 1e-6);
}

// Slots per group = the compress ratio r (1, 2, 4, 128: V4.1 and the real V4 configs; the golden fixtures use
// r = 16 for V4's HCA) or 2r (V4 CSA's overlapping windows, 8 for r = 4).
TEST_F(CudaOpTest, CompressPoolWithMissingSlots) {
  for (auto [g, s, c] : {std::tuple{33, 8, 520}, {7, 1, 512}, {20, 2, 128}, {9, 4, 640}, {3, 128, 512}, {2, 256, 96}}) {
    HostTensor kv = rand({g, s, c}), gate = rand({g, s, c}, -4, 4);
    // V4's missing predecessor window: −inf gates on some slots (never all of a group's).
    for (int64_t gi = 0; gi < g && s > 1; gi += 3)
      for (int64_t si = 0; si < s / 2; ++si)
        for (int64_t ci = 0; ci < c; ++ci) gate.data<float>()[(gi * s + si) * c + ci] = -INFINITY;
    HostTensor want(DType::kF32, {g, c});
    cpu().compress_pool({kv, gate, want});
    DeviceTensor dkv = up(kv), dg = up(gate), dout = poisoned({g, c});
    gpu().compress_pool({dkv, dg, dout});
    rel_err(("compress_pool slots=" + std::to_string(s)).c_str(), down(dout), want, 1e-6);
  }
}

TEST_F(CudaOpTest, EngramHashAndGate) {
  const int64_t t = 50, n = 4, heads = 8;
  HostTensor tokens = ints(DType::kI64, {t, n}, 0, 129279), mult = ints(DType::kI64, {n}, 1, 1 << 20);
  HostTensor primes = ints(DType::kI64, {n - 1, heads}, 100003, 900001),
             offsets = ints(DType::kI64, {(n - 1) * heads}, 0, 1 << 22);
  HostTensor want(DType::kI64, {t, (n - 1) * heads});
  cpu().engram_hash({tokens, mult, primes, offsets, want});
  DeviceTensor dt = up(tokens), dm = up(mult), dp = up(primes), doff = up(offsets);
  DeviceTensor dout(gpu(), DType::kI64, {t, (n - 1) * heads});
  gpu().engram_hash({dt, dm, dp, doff, dout});
  expect_same_bytes("engram_hash", down(dout), want);

  const int64_t hc = 4, d = 1536;
  HostTensor streams = rand({t, hc, d}, -2, 2), key = rand({t, hc, d}, -2, 2), value = rand({t, d}), w = rand({hc, d});
  HostTensor gwant(DType::kF32, streams.shape());
  std::memcpy(gwant.view().data(), streams.view().data(), streams.view().nbytes());
  cpu().engram_gate({gwant, key, value, w, 1e-6f});
  DeviceTensor ds = up(streams), dk = up(key), dv = up(value), dw = up(w);
  gpu().engram_gate({ds, dk, dv, dw, 1e-6f});
  rel_err("engram_gate", down(ds), gwant, 1e-6);
}

}  // namespace
}  // namespace deepinfer
