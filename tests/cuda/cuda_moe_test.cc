// The MoE ops on CUDA against the CPU reference: the expert grouping plan, moe (f32 experts) and moe_quant (MXFP4 /
// FP8 routed experts, FP8 shared expert) on every kernel path, act_quant, batch-invariant mode and chunked prefill.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <numeric>
#include <tuple>

#include "cuda/cuda_test_util.h"
#include "deepinfer/core/dtype.h"
#include "deepinfer/ops/cuda/cuda_runtime.h"
#include "deepinfer/ops/cuda/gemm_invariant_mma.h"
#include "deepinfer/ops/cuda/kernels.h"

namespace deepinfer {
namespace {

using testing::CudaOpTest;
using testing::DeviceTensor;
using testing::ScopedKernelChoices;

// The expert grouping plan (run directly: the MoE tests see it only through their outputs) at decode and prefill
// sizes, k = 6: perm must hold every valid slot once, grouped by expert in id order; the row and tile offsets
// and the list of non-empty experts must match a host count; out-of-range ids are left out and reported.
TEST_F(CudaOpTest, MoePlanGroupsSlotsByExpert) {
  const int64_t k = 6;
  for (int64_t e : {int64_t{256}, int64_t{384}}) {
    for (int64_t t : {int64_t{1}, int64_t{64}, int64_t{256}, int64_t{4096}}) {
      for (bool bad : {false, true}) {
        const int64_t slots = t * k;
        // Skewed towards the first experts so that some groups span several GEMM tiles.
        HostTensor idx = ints(DType::kI32, {slots}, 0, e - 1);
        int32_t* ids = idx.data<int32_t>();
        for (int64_t s = 0; s < slots; s += 3) ids[s] = ids[s] % 8;
        if (bad) {
          ids[0] = -1;
          ids[slots - 1] = static_cast<int32_t>(e);
        }
        HostTensor zero = ints(DType::kI32, {1}, 0, 0);
        DeviceTensor di = up(idx), dstatus = up(zero), dperm = poisoned_bytes(DType::kI32, {slots});
        DeviceTensor dgo = poisoned_bytes(DType::kI32, {e + 1}), dto = poisoned_bytes(DType::kI32, {e + 1});
        DeviceTensor dag = poisoned_bytes(DType::kI32, {e + 1}), dcur = poisoned_bytes(DType::kI32, {e});
        // The pass table for the streaming GEMM's 8-row passes (skewed groups: several passes each).
        const int64_t pass_rows = 8, cap = cuda::moe_pass_capacity(slots, e, pass_rows);
        DeviceTensor dap = poisoned_bytes(DType::kI32, {cap + 1});
        cuda::MoePlanKernelParams p;
        p.active_passes = static_cast<int32_t*>(dap.data());
        p.pass_rows = static_cast<int>(pass_rows);
        p.pass_capacity = cap;
        p.indices = static_cast<const int32_t*>(di.data());
        p.slots = slots;
        p.experts = static_cast<int>(e);
        p.perm = static_cast<int32_t*>(dperm.data());
        p.group_offsets = static_cast<int32_t*>(dgo.data());
        p.tile_offsets = static_cast<int32_t*>(dto.data());
        p.active_groups = static_cast<int32_t*>(dag.data());
        p.cursor = static_cast<int32_t*>(dcur.data());
        p.status = static_cast<uint32_t*>(dstatus.data());
        cuda::run_moe_plan(p, nullptr);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const HostTensor perm = down(dperm), go = down(dgo), to = down(dto), ag = down(dag), st = down(dstatus),
                         ap = down(dap);
        std::vector<std::vector<int32_t>> want(e);
        for (int64_t s = 0; s < slots; ++s)
          if (ids[s] >= 0 && ids[s] < e) want[ids[s]].push_back(static_cast<int32_t>(s));
        const std::string name = "moe_plan E=" + std::to_string(e) + " T=" + std::to_string(t) + (bad ? " bad" : "");
        int64_t rows = 0, tiles = 0, active = 0, passes = 0, wrong = 0;
        for (int64_t x = 0; x < e; ++x) {
          const int64_t c = static_cast<int64_t>(want[x].size());
          wrong += go.data<int32_t>()[x] != rows || to.data<int32_t>()[x] != tiles;
          if (c > 0) wrong += ag.data<int32_t>()[active++] != x;
          for (int64_t q = 0; q * pass_rows < c; ++q) wrong += ap.data<int32_t>()[passes++] != (x | (q << 16));
          std::vector<int32_t> got(perm.data<int32_t>() + rows, perm.data<int32_t>() + rows + c);
          std::sort(got.begin(), got.end());
          wrong += got != want[x];
          rows += c;
          tiles += (c + cuda::kGemmTileM - 1) / cuda::kGemmTileM;
        }
        wrong += go.data<int32_t>()[e] != rows || to.data<int32_t>()[e] != tiles || ag.data<int32_t>()[e] != active;
        wrong += ap.data<int32_t>()[cap] != passes || passes > cap;
        EXPECT_EQ(wrong, 0) << name << " (seed " << seed_ << ")";
        EXPECT_EQ((st.data<uint32_t>()[0] & cuda::kStatusExpertIdRange) != 0, bad) << name;
      }
    }
  }
}

// Batch-invariant MoE tolerance (BatchInvariantModeTokensDoNotDependOnTheBatch says why).
double bi_moe_tolerance() { return 8e-3; }

class CudaMoeTest : public CudaOpTest {
 protected:
  // Bf16ExpertsMatchCpuOnEveryPath at one intermediate size.
  void check_bf16_experts(int64_t inter);
  // Distinct random experts per token (as a top-k would give).
  HostTensor distinct_indices(int64_t t, int64_t k, int64_t e) {
    HostTensor idx(DType::kI32, {t, k});
    std::vector<int32_t> all(e);
    std::iota(all.begin(), all.end(), 0);
    for (int64_t i = 0; i < t; ++i) {
      std::shuffle(all.begin(), all.end(), rng());
      for (int64_t j = 0; j < k; ++j) idx.data<int32_t>()[i * k + j] = all[j];
    }
    return idx;
  }
  HostTensor fp8(Shape shape) {
    HostTensor t(DType::kF8E4M3, shape);
    std::uniform_real_distribution<float> d(-2.0f, 2.0f);
    for (int64_t i = 0; i < t.numel(); ++i) {
      uint8_t c = f32_to_e4m3(d(rng()));
      t.data<uint8_t>()[i] = (c & 0x7F) == 0 ? 0x30 : c;
    }
    return t;
  }
  HostTensor dequant(const HostTensor& w, const HostTensor& s, QuantFormat f, int64_t n, int64_t k, int block) {
    HostTensor out(DType::kF32, {n, k});
    cpu().dequantize({w, s, f, block, block, out});
    return out;
  }
  // MXFP4 routed experts (E8M0 per 32) and an FP8 128x128 shared expert on the device, with their f32
  // dequantized copies for the CPU op.
  struct QuantMoe {
    std::vector<HostTensor> host;
    std::vector<DeviceTensor> dev;
    std::vector<ExpertWeights> cpu_experts;
    std::vector<QuantExpertWeights> gpu_experts;
    ExpertWeights cpu_shared;
    QuantExpertWeights gpu_shared;
  };
  // Routed experts in `routed` (MXFP4: E8M0 per 32; FP8 block: 128 x 128 E8M0 blocks).
  // f32_scales: the FP8 blocks' scales in f32 (V3 checkpoints) instead of UE8M0, routed (kFP8Block) and shared.
  std::unique_ptr<QuantMoe> quant_moe(int64_t d, int64_t inter, int64_t e, QuantFormat routed = QuantFormat::kMXFP4,
                                      bool f32_scales = false) {
    auto q = std::make_unique<QuantMoe>();
    std::vector<HostTensor>& host = q->host;
    std::vector<DeviceTensor>& dev = q->dev;
    host.reserve(16 * e);
    dev.reserve(16 * e);
    q->cpu_experts.resize(e);
    q->gpu_experts.resize(e);
    auto keep = [&](HostTensor h) -> std::pair<const HostTensor*, const DeviceTensor*> {
      host.push_back(std::move(h));
      dev.push_back(up(host.back()));
      return {&host.back(), &dev.back()};
    };
    for (int64_t i = 0; i < e; ++i) {
      for (auto [rows, cols, cw, gw] : {std::tuple{inter, d, &q->cpu_experts[i].w1, &q->gpu_experts[i].w1},
                                        {inter, d, &q->cpu_experts[i].w3, &q->gpu_experts[i].w3},
                                        {d, inter, &q->cpu_experts[i].w2, &q->gpu_experts[i].w2}}) {
        if (routed == QuantFormat::kFP8Block) {
          auto [hw, dw] = keep(fp8({rows, cols}));
          const Shape ss = {(rows + 127) / 128, (cols + 127) / 128};
          auto [hs, ds] = keep(f32_scales ? rand(ss, 0.03f, 2.0f) : e8m0(ss, 122, 128));
          auto [hf, df] = keep(dequant(*hw, *hs, QuantFormat::kFP8Block, rows, cols, 128));
          (void)df;
          *cw = *hf;
          *gw = QuantMatrix{*dw, *ds, QuantFormat::kFP8Block, 128, 128};
          continue;
        }
        auto [hw, dw] = keep(rand_bytes(DType::kU8, {rows, cols / 2}));
        auto [hs, ds] = keep(e8m0({rows, cols / 32}, 122, 128));
        auto [hf, df] = keep(dequant(*hw, *hs, QuantFormat::kMXFP4, rows, cols, 128));
        (void)df;
        *cw = *hf;
        *gw = QuantMatrix{*dw, *ds, QuantFormat::kMXFP4};
      }
    }
    for (auto [rows, cols, cw, gw] : {std::tuple{inter, d, &q->cpu_shared.w1, &q->gpu_shared.w1},
                                      {inter, d, &q->cpu_shared.w3, &q->gpu_shared.w3},
                                      {d, inter, &q->cpu_shared.w2, &q->gpu_shared.w2}}) {
      auto [hw, dw] = keep(fp8({rows, cols}));
      const Shape ss = {(rows + 127) / 128, (cols + 127) / 128};
      auto [hs, ds] = keep(f32_scales ? rand(ss, 0.03f, 2.0f) : e8m0(ss, 122, 128));
      auto [hf, df] = keep(dequant(*hw, *hs, QuantFormat::kFP8Block, rows, cols, 128));
      (void)df;
      *cw = *hf;
      *gw = QuantMatrix{*dw, *ds, QuantFormat::kFP8Block, 128, 128};
    }
    return q;
  }
  // moe_quant of q's experts on the tokens x (weights, idx: their routing; SwiGLU clamp 10, routing weight before or
  // after w2) into a NaN-poisoned output, against the CPU op on the dequantized experts within tol.
  void expect_moe_quant_matches_cpu(const std::string& name, const QuantMoe& q, const HostTensor& x,
                                    const HostTensor& weights, const HostTensor& idx, bool before, double tol) {
    const int64_t t = x.shape()[0], d = x.shape()[1];
    HostTensor want(DType::kF32, {t, d});
    cpu().moe({x, weights, idx, &q.cpu_experts, &q.cpu_shared, want, 10.0f, before});
    const DeviceTensor dx = up(x), dwts = up(weights), didx = up(idx), dout = poisoned({t, d});
    gpu().moe_quant({dx, dwts, didx, &q.gpu_experts, &q.gpu_shared, dout, 10.0f, before});
    rel_err(name.c_str(), down(dout), want, tol);
  }
  // Batch-invariant mode: moe_quant of all the tokens x against the CPU op within bi_moe_tolerance(), then the tokens
  // of each subset in a call of their own, which must give the full call's rows byte for byte.
  void expect_moe_quant_batch_invariant(const std::string& name, const QuantMoe& q, const HostTensor& x,
                                        const HostTensor& weights, const HostTensor& idx, bool before,
                                        const std::vector<std::vector<int64_t>>& subsets) {
    const int64_t t = x.shape()[0], d = x.shape()[1];
    auto call = [&](const HostTensor& xs, const HostTensor& ws, const HostTensor& is) {
      const DeviceTensor dx = up(xs), dwts = up(ws), didx = up(is), dout = poisoned({xs.shape()[0], d});
      gpu().moe_quant({dx, dwts, didx, &q.gpu_experts, &q.gpu_shared, dout, 10.0f, before});
      return down(dout);
    };
    const HostTensor full = call(x, weights, idx);
    HostTensor want(DType::kF32, {t, d});
    cpu().moe({x, weights, idx, &q.cpu_experts, &q.cpu_shared, want, 10.0f, before});
    rel_err(name.c_str(), full, want, bi_moe_tolerance());
    for (const auto& rows : subsets)
      expect_rows_bitwise(name + " tokens=" + std::to_string(rows.size()),
                          call(take_rows(x, rows), take_rows(weights, rows), take_rows(idx, rows)), full, rows);
  }
  // expect_moe_quant_batch_invariant for MXFP4 and for FP8-block routed experts (quant_moe(d, inter, e)) on t random
  // tokens taking k experts each, weights after w2; named "batch-invariant <label> moe_quant mxfp4 / fp8".
  void expect_moe_quant_batch_invariant_formats(const std::string& label, int64_t d, int64_t inter, int64_t e,
                                                int64_t k, int64_t t,
                                                const std::vector<std::vector<int64_t>>& subsets) {
    for (QuantFormat f : {QuantFormat::kMXFP4, QuantFormat::kFP8Block}) {
      const std::unique_ptr<QuantMoe> q = quant_moe(d, inter, e, f);
      const HostTensor x = rand({t, d}), weights = rand({t, k}, 0.05f, 1.0f), idx = distinct_indices(t, k, e);
      expect_moe_quant_batch_invariant(
          "batch-invariant " + label + " moe_quant " + (f == QuantFormat::kMXFP4 ? "mxfp4" : "fp8"), *q, x, weights,
          idx, false, subsets);
    }
  }
  // `fixed` followed by, for each length, that many consecutive tokens centred in t.
  static std::vector<std::vector<int64_t>> with_centred_runs(std::vector<std::vector<int64_t>> fixed, int64_t t,
                                                             std::initializer_list<int64_t> lengths) {
    for (int64_t len : lengths) {
      std::vector<int64_t> rows(len);
      std::iota(rows.begin(), rows.end(), (t - len) / 2);
      fixed.push_back(rows);
    }
    return fixed;
  }
};

// bf16 routed and shared experts (a bf16 checkpoint's, kept as stored) against the CPU op on their widened values.
// The routed experts follow the rows per used expert, T·k / min(E, T·k): T = 1 and 3 (1 row) stream the bf16 weights
// with fp32 products; T = 21 and 100 (5 and 25 rows) take the mma.sync kernel (both its warp layouts, which skip
// the m16 tiles past a group's rows), T = 300 (75 rows) and 600 (150: the tall tile's
// pairs and leftovers) the wgmma kernel where K % 64 == 0 (gate / up, K = D = 256; down with I = 192) and the mma.sync
// one otherwise (down with I = 160), all on x's and h's hi + lo bf16 terms (~2^-16 of fp32: 3e-5). The shared expert
// streams at T <= 4 and goes through cuBLASLt on the split rows past it. I = 160 leaves a partial 256-column tile.
// bf16_split_a = 0 rounds the many-row inputs to bf16 (4e-3, the block formats' many-row tolerance); batch-invariant
// mode has no bf16 expert kernel and says so.
TEST_F(CudaMoeTest, Bf16ExpertsMatchCpuOnEveryPath) {
  for (const int64_t inter : {160, 192}) check_bf16_experts(inter);
}

void CudaMoeTest::check_bf16_experts(int64_t inter) {
  const int64_t d = 256, e = 16, k = 4;
  std::vector<HostTensor> host;
  std::vector<DeviceTensor> dev;
  host.reserve(6 * (e + 1));
  dev.reserve(3 * (e + 1));
  std::vector<ExpertWeights> cpu_experts(e);
  std::vector<QuantExpertWeights> gpu_experts(e);
  auto make = [&](ExpertWeights& c, QuantExpertWeights& g) {
    for (auto [rows, cols, cw, gw] :
         {std::tuple{inter, d, &c.w1, &g.w1}, {inter, d, &c.w3, &g.w3}, {d, inter, &c.w2, &g.w2}}) {
      HostTensor f = rand({rows, cols}, -0.2f, 0.2f), b(DType::kBF16, {rows, cols});
      for (int64_t i = 0; i < f.numel(); ++i) {
        b.data<uint16_t>()[i] = f32_to_bf16(f.data<float>()[i]);
        f.data<float>()[i] = bf16_to_f32(b.data<uint16_t>()[i]);
      }
      host.push_back(std::move(f));
      *cw = host.back();
      host.push_back(std::move(b));
      dev.push_back(up(host.back()));
      *gw = QuantMatrix{dev.back(), Tensor{}, QuantFormat::kFloat};
    }
  };
  for (int64_t i = 0; i < e; ++i) make(cpu_experts[i], gpu_experts[i]);
  ExpertWeights cpu_shared;
  QuantExpertWeights gpu_shared;
  make(cpu_shared, gpu_shared);
  auto check = [&](int64_t t, bool split, double tol) {
    const HostTensor x = rand({t, d}), weights = rand({t, k}, 0.05f, 1.0f), idx = distinct_indices(t, k, e);
    for (bool before : {false, true}) {
      HostTensor want(DType::kF32, {t, d});
      cpu().moe({x, weights, idx, &cpu_experts, &cpu_shared, want, 10.0f, before});
      const DeviceTensor dx = up(x), dwts = up(weights), didx = up(idx), dout = poisoned({t, d});
      gpu().moe_quant({dx, dwts, didx, &gpu_experts, &gpu_shared, dout, 10.0f, before});
      rel_err(("moe_quant bf16 I=" + std::to_string(inter) + (split ? "" : " split_a=0") +
               (before ? " before_w2" : "") + " T=" + std::to_string(t))
                  .c_str(),
              down(dout), want, tol);
    }
  };
  const std::vector<int64_t> many = inter == 160 ? std::vector<int64_t>{21, 100, 300} : std::vector<int64_t>{300, 600};
  if (inter == 160)
    for (int64_t t : {1, 3}) check(t, true, 1e-5);
  for (int64_t t : many) check(t, true, 3e-5);
  {
    ScopedKernelChoices one_term(gpu(), [](cuda::KernelChoices& c) { c.gemm.bf16_split_a = false; });
    for (int64_t t : many) check(t, false, 4e-3);
  }
  gpu().set_batch_invariant(true);
  const HostTensor x = rand({3, d}), weights = rand({3, k}, 0.05f, 1.0f), idx = distinct_indices(3, k, e);
  const DeviceTensor dx = up(x), dwts = up(weights), didx = up(idx), dout = poisoned({3, d});
  try {
    gpu().moe_quant({dx, dwts, didx, &gpu_experts, &gpu_shared, dout, 10.0f, false});
    ADD_FAILURE() << "batch-invariant moe_quant over bf16 experts must refuse";
  } catch (const Error& err) {
    EXPECT_EQ(err.code(), ErrorCode::kUnsupported) << err.what();
    EXPECT_NE(std::string(err.what()).find("batch-invariant"), std::string::npos) << err.what();
  }
  gpu().set_batch_invariant(false);
}

// T=1 and T=13 (4 rows per used expert) run the weight-streaming kernel for the routed experts, T=40 (10 rows)
// the SIMT tile; the shared expert (a dense GEMM of T rows) streams at T=1 only. Both are fp32 products.
TEST_F(CudaMoeTest, F32ExpertsWithSharedClampAndBothWeightModes) {
  const int64_t d = 96, inter = 64, e = 12, k = 3;
  std::vector<HostTensor> host;
  std::vector<DeviceTensor> dev;
  std::vector<ExpertWeights> cpu_experts, gpu_experts;
  auto make = [&](ExpertWeights& c, ExpertWeights& g) {
    for (auto [rows, cols, cw, gw] :
         {std::tuple{inter, d, &c.w1, &g.w1}, {inter, d, &c.w3, &g.w3}, {d, inter, &c.w2, &g.w2}}) {
      host.push_back(rand({rows, cols}, -0.3f, 0.3f));
      dev.push_back(up(host.back()));
      *cw = host.back();
      *gw = dev.back();
    }
  };
  host.reserve(3 * (e + 1));
  dev.reserve(3 * (e + 1));
  cpu_experts.resize(e);
  gpu_experts.resize(e);
  for (int64_t i = 0; i < e; ++i) make(cpu_experts[i], gpu_experts[i]);
  ExpertWeights cpu_shared, gpu_shared;
  make(cpu_shared, gpu_shared);
  for (int64_t t : {1, 13, 40}) {
    HostTensor x = rand({t, d}), weights = rand({t, k}, 0.05f, 1.0f), idx = distinct_indices(t, k, e);
    DeviceTensor dx = up(x), dwts = up(weights), didx = up(idx);
    for (float limit : {0.0f, 0.4f})
      for (bool before : {false, true}) {
        HostTensor want(DType::kF32, {t, d});
        cpu().moe({x, weights, idx, &cpu_experts, &cpu_shared, want, limit, before});
        DeviceTensor dout = poisoned({t, d});
        gpu().moe({dx, dwts, didx, &gpu_experts, &gpu_shared, dout, limit, before});
        rel_err(("moe f32 T=" + std::to_string(t) + " limit=" + std::to_string(limit).substr(0, 3) +
                 (before ? " before_w2" : " after_w2"))
                    .c_str(),
                down(dout), want, 1e-5);
      }
  }
}

// The routed experts' kernel follows the average rows per used expert, T·k / min(E, T·k): T=3 (1 row) runs
// the tensor-core weight-streaming kernel, T=21 (6 rows) and T=300 (75 rows) the pipelined mma.sync one; all of
// them round x and h to bf16 (~1e-3 relative; weights exact in bf16 with UE8M0 scales). The shared expert is a
// dense GEMM of T rows: streamed at T=3, at T=21 and 300 (too few tiles to fill the device) a bf16 dequantized
// scratch through cuBLASLt, x and h rounded to bf16 as for the routed experts.
TEST_F(CudaMoeTest, Mxfp4ExpertsAndFp8SharedMatchDequantizedCpu) {
  const int64_t d = 256, inter = 128, e = 16, k = 4;
  const std::unique_ptr<QuantMoe> q = quant_moe(d, inter, e);
  for (int64_t t : {3, 21, 300}) {
    HostTensor x = rand({t, d}), weights = rand({t, k}, 0.05f, 1.0f), idx = distinct_indices(t, k, e);
    for (bool before : {false, true})
      expect_moe_quant_matches_cpu(
          std::string("moe_quant mxfp4+fp8 shared") + (before ? " before_w2" : "") + " T=" + std::to_string(t), *q, x,
          weights, idx, before, 4e-3);
  }
}

// act_quant (--activation-quant mxfp8): x and h rounded to e4m3 per 32 values before the GEMMs, routed and shared
// experts alike, on the streaming (T = 3), mma.sync (T = 21) and tensor-core tile (T = 300) paths. The rounded x is the
// CPU's bit for bit and exact in bf16, so the gate / up products are the CPU's; h is rounded from the device's own
// SwiGLU, which can differ from the CPU's in the last bits and then, rarely, round to the neighbouring e4m3 value
// (one element of ~inter, ~2^-4 of it): 4e-3, half the unrounded paths' bf16 tolerance.
TEST_F(CudaMoeTest, ActQuantRoundsXAndHOnEveryPath) {
  const int64_t d = 256, inter = 128, e = 16, k = 4;
  const std::unique_ptr<QuantMoe> q = quant_moe(d, inter, e);
  for (int64_t t : {3, 21, 300}) {
    HostTensor x = rand({t, d}), weights = rand({t, k}, 0.05f, 1.0f), idx = distinct_indices(t, k, e);
    for (bool before : {false, true}) {
      HostTensor want(DType::kF32, {t, d});
      cpu().moe({x, weights, idx, &q->cpu_experts, &q->cpu_shared, want, 10.0f, before, ActQuant::kMxfp8});
      const DeviceTensor dx = up(x), dwts = up(weights), didx = up(idx), dout = poisoned({t, d});
      gpu().moe_quant({dx, dwts, didx, &q->gpu_experts, &q->gpu_shared, dout, 10.0f, before, ActQuant::kMxfp8});
      rel_err((std::string("act_quant moe_quant") + (before ? " before_w2" : "") + " T=" + std::to_string(t)).c_str(),
              down(dout), want, 4e-3);
    }
  }
}

// The FP8 expert GEMM (gemm_wgmma_fp8.h) under act_quant, the default (wgmma_fp8 = never: the bf16 path): MXFP4 routed
// experts of ~150 rows each (T = 300 tokens taking 4 of 8 experts), hidden 256 and inter 128 (multiples of 128, as the
// kernel takes), x and h as MXFP8 codes. Against the CPU's act_quant MoE with the bf16 path's 4e-3 (the FP8 block sums'
// error, ~2^-12 of Σ|a·w| at most, sits well inside it), and against the device's bf16 path on the same rounded inputs
// (2e-3).
TEST_F(CudaMoeTest, ActQuantFp8ExpertGemmMatchesCpu) {
  const int64_t d = 256, inter = 128, e = 8, k = 4, t = 300;
  const std::unique_ptr<QuantMoe> q = quant_moe(d, inter, e);
  HostTensor x = rand({t, d}), weights = rand({t, k}, 0.05f, 1.0f), idx = distinct_indices(t, k, e);
  const DeviceTensor dx = up(x), dwts = up(weights), didx = up(idx);
  for (bool before : {false, true}) {
    HostTensor want(DType::kF32, {t, d});
    cpu().moe({x, weights, idx, &q->cpu_experts, &q->cpu_shared, want, 10.0f, before, ActQuant::kMxfp8});
    auto run = [&] {
      const DeviceTensor dout = poisoned({t, d});
      gpu().moe_quant({dx, dwts, didx, &q->gpu_experts, &q->gpu_shared, dout, 10.0f, before, ActQuant::kMxfp8});
      return down(dout);
    };
    const HostTensor fp8 = run();  // the default: the FP8 GEMM
    testing::ScopedKernelChoices fp8_off(gpu(),
                                         [](cuda::KernelChoices& c) { c.gemm.wgmma_fp8 = cuda::KernelPick::kNever; });
    const HostTensor bf16 = run();
    const std::string tag = before ? " before_w2" : "";
    rel_err(("act_quant moe_quant fp8 experts" + tag).c_str(), fp8, want, 4e-3);
    rel_err(("act_quant moe_quant fp8 vs bf16 experts" + tag).c_str(), fp8, bf16, 2e-3);
  }
}

// --activation-quant fp8 (the V3 family) over FP8 128 x 128 experts with f32 scales (V3 checkpoints), routed and
// shared: ~150 rows an expert (T = 300 taking 4 of 8), hidden 256 and inter 128. The default takes the FP8 expert
// GEMM in its per-128 form (x and h as e4m3 codes with an f32 scale a block of 128, a step's four k32 products summed
// by the tensor core and promoted once); against the CPU's act_quant MoE at 4e-3 (as the mxfp8 test above: the rounded
// h can differ in its last bits; H100: 2.4e-3). wgmma_fp8 = never takes the bf16 path over the same rounded values,
// which with f32 scales rounds x, h and the weights to bf16 once more (H100: 1.4e-2 against the CPU): 3e-2 for it,
// which the FP8 path's 4e-3 beats. f32 and power-of-two activation scales alike; the FP8 GEMM's 128 x 128 tile
// (wgmma_fp8_wide = 0; the default is the wide 128 x 256 one) at the same 4e-3.
TEST_F(CudaMoeTest, ActQuantFp8Block128ExpertGemmMatchesCpu) {
  const int64_t d = 256, inter = 128, e = 8, k = 4, t = 300;
  const std::unique_ptr<QuantMoe> q = quant_moe(d, inter, e, QuantFormat::kFP8Block, true);
  HostTensor x = rand({t, d}), weights = rand({t, k}, 0.05f, 1.0f), idx = distinct_indices(t, k, e);
  const DeviceTensor dx = up(x), dwts = up(weights), didx = up(idx);
  for (const ActQuant aq : {ActQuant::kFp8Block128, ActQuant::kFp8Block128Ue8m0})
    for (bool before : {false, true}) {
      HostTensor want(DType::kF32, {t, d});
      cpu().moe({x, weights, idx, &q->cpu_experts, &q->cpu_shared, want, 10.0f, before, aq});
      auto run = [&] {
        const DeviceTensor dout = poisoned({t, d});
        gpu().moe_quant({dx, dwts, didx, &q->gpu_experts, &q->gpu_shared, dout, 10.0f, before, aq});
        return down(dout);
      };
      const HostTensor fp8 = run();  // the default: the FP8 GEMM, per-128 promotion
      {
        testing::ScopedKernelChoices narrow(gpu(), [](cuda::KernelChoices& c) { c.gemm.wgmma_fp8_wide = 0; });
        rel_err(("act_quant moe_quant fp8-128 experts, 128x128 tile " + std::string(act_quant_name(aq)) +
                 (before ? " before_w2" : ""))
                    .c_str(),
                run(), want, 4e-3);
      }
      testing::ScopedKernelChoices fp8_off(gpu(),
                                           [](cuda::KernelChoices& c) { c.gemm.wgmma_fp8 = cuda::KernelPick::kNever; });
      const HostTensor bf16 = run();
      const std::string tag = std::string(" ") + act_quant_name(aq) + (before ? " before_w2" : "");
      rel_err(("act_quant moe_quant fp8-128 experts" + tag).c_str(), fp8, want, 4e-3);
      rel_err(("act_quant moe_quant fp8-128 bf16 path" + tag).c_str(), bf16, want, 3e-2);
    }
}

// The same mode at decode shapes (T = 3 / 4 tokens x 4 of 8 experts: ~2 rows an expert, the shared expert at 3-4 rows):
// the streaming kernel over f32-scaled experts reads x's and h's e4m3 codes with their per-128 scales, exact products
// promoted a 128-K block at a time (the codes' sums times weight scale x row scale), so a token's output is the CPU
// op's up to fp32 order: 1e-5 of its row's largest value. One exception is allowed: h comes from the device's own
// SwiGLU, whose last bit can differ from the CPU's and then, rarely, round to the neighbouring e4m3 code (H100: one
// run of several, 1.5e-4 on one token), so all but one token are held to 1e-5 and every token to 4e-3 (as the other
// act_quant tests). Staging the rounded rows as bf16, as before session 35, put every token ~1.5e-3 off.
TEST_F(CudaMoeTest, ActQuantFp8Block128DecodeReadsCodesExactly) {
  const int64_t d = 256, inter = 128, e = 8, k = 4;
  const std::unique_ptr<QuantMoe> q = quant_moe(d, inter, e, QuantFormat::kFP8Block, true);
  for (const int64_t t : {3, 4}) {
    HostTensor x = rand({t, d}, -4.0f, 4.0f), weights = rand({t, k}, 0.05f, 1.0f), idx = distinct_indices(t, k, e);
    const DeviceTensor dx = up(x), dwts = up(weights), didx = up(idx);
    for (const ActQuant aq : {ActQuant::kFp8Block128, ActQuant::kFp8Block128Ue8m0})
      for (bool before : {false, true}) {
        HostTensor want(DType::kF32, {t, d});
        cpu().moe({x, weights, idx, &q->cpu_experts, &q->cpu_shared, want, 10.0f, before, aq});
        const DeviceTensor dout = poisoned({t, d});
        gpu().moe_quant({dx, dwts, didx, &q->gpu_experts, &q->gpu_shared, dout, 10.0f, before, aq});
        const std::string name = "act_quant moe_quant fp8-128 decode T=" + std::to_string(t) + " " +
                                 act_quant_name(aq) + (before ? " before_w2" : "");
        const HostTensor got = down(dout);
        rel_err(name.c_str(), got, want, 4e-3);
        int off = 0;
        for (int64_t r = 0; r < t; ++r) {
          double worst = 0.0, scale = 0.0;
          for (int64_t j = 0; j < d; ++j) {
            const double w = want.data<float>()[r * d + j], g = got.data<float>()[r * d + j];
            worst = std::max(worst, std::abs(g - w));
            scale = std::max(scale, std::abs(w));
          }
          if (!(worst <= 1e-5 * scale)) ++off;
        }
        EXPECT_LE(off, 1) << name << ": tokens past 1e-5 of their row";
      }
  }
}

// The pipelined mma.sync kernel (gemm_mma_cuda.cu; many rows per expert in a block format, x and h as bf16):
// MXFP4 and FP8-block routed experts, hidden 640 (gate/up K = 640: 20 k-steps; down N = 640: a partial 256-column
// tile), inter 320 (gate/up N: a partial tile; down K = 320), 24 experts of which each token takes 6. T = 40 gives
// ~10 rows per expert (one partial 64-row tile each), T = 700 ~175 (three tiles, the last partial). Tolerance:
// x and h are rounded to bf16 (each ~2^-9 / sqrt(3) = 1.1e-3 rms relative), the SwiGLU between compounds them;
// the first H200 run measured 3.0-4.2e-3 over these shapes, so 8e-3 (a misplaced tile or a wrong scale is O(1)).
TEST_F(CudaMoeTest, PipelinedTensorCoreExpertsMatchCpu) {
  const int64_t d = 640, inter = 320, e = 24, k = 6;
  for (QuantFormat f : {QuantFormat::kMXFP4, QuantFormat::kFP8Block}) {
    const std::unique_ptr<QuantMoe> q = quant_moe(d, inter, e, f);
    for (int64_t t : {40, 700}) {
      HostTensor x = rand({t, d}), weights = rand({t, k}, 0.05f, 1.0f), idx = distinct_indices(t, k, e);
      for (bool before : {false, true})
        expect_moe_quant_matches_cpu(std::string("moe_quant mma ") + (f == QuantFormat::kMXFP4 ? "mxfp4" : "fp8") +
                                         (before ? " before_w2" : "") + " T=" + std::to_string(t),
                                     *q, x, weights, idx, before, 8e-3);
    }
  }
}

// Decode-like shapes for the grouped tensor-core streaming kernel: hidden 2048 (gate/up K = 2048), inter 512 (down
// K = 512), 1 and 2 rows per used expert, T <= 4 so the shared expert streams too. At 4 rows (T = 4 over 2
// experts) the experts take the mma.sync kernel (kGemmMmaMinRows). Both round x and h to bf16: 8e-3 as for the
// mma.sync test (a wrong code, scale or row is O(1)).
TEST_F(CudaMoeTest, Mxfp4ExpertsStreamAtDecodeShapes) {
  const int64_t d = 2048, inter = 512;
  for (auto [e, k, tokens] : {std::tuple<int64_t, int64_t, std::vector<int64_t>>{8, 2, {1, 3}}, {2, 2, {2, 4}}}) {
    const std::unique_ptr<QuantMoe> q = quant_moe(d, inter, e);
    for (int64_t t : tokens) {
      HostTensor x = rand({t, d}), weights = rand({t, k}, 0.05f, 1.0f), idx = distinct_indices(t, k, e);
      const bool mma = t * k / std::min(e, t * k) >= 3;
      expect_moe_quant_matches_cpu(
          "moe_quant " + std::string(mma ? "mma" : "streaming") + " E=" + std::to_string(e) + " T=" + std::to_string(t),
          *q, x, weights, idx, false, 8e-3);
    }
  }
}

// Decode batches over many experts (T = 16 / 64 tokens x 6 of 64 experts: 96 / 384 slots, a mean of 2 / 6 rows per
// used expert): from kGroupedFullPassSlots slots the streaming kernel stages 8 rows a pass whatever the mean, so the
// experts above it (up to ~14 rows at T = 64) take one or two passes with partly empty stages. 8e-3 as above.
TEST_F(CudaMoeTest, Mxfp4ExpertsStreamAtLargeDecodeBatches) {
  const int64_t d = 1024, inter = 256, e = 64, k = 6;
  const std::unique_ptr<QuantMoe> q = quant_moe(d, inter, e);
  for (int64_t t : {16, 64}) {
    HostTensor x = rand({t, d}), weights = rand({t, k}, 0.05f, 1.0f), idx = distinct_indices(t, k, e);
    for (bool before : {false, true})
      expect_moe_quant_matches_cpu(std::string("moe_quant streaming 8-row passes") + (before ? " before_w2" : "") +
                                       " E=64 T=" + std::to_string(t),
                                   *q, x, weights, idx, before, 8e-3);
  }
  // Skewed routing: every token's first expert is one of 0..3 (24 rows each at T=96: three 8-row passes, each its
  // own block through the plan's pass table), the other five spread over the rest.
  const int64_t t = 96;
  HostTensor x = rand({t, d}), weights = rand({t, k}, 0.05f, 1.0f), idx = distinct_indices(t, k, e - 4);
  for (int64_t i = 0; i < t; ++i) {
    int32_t* row = idx.data<int32_t>() + i * k;
    for (int64_t j = 0; j < k; ++j) row[j] += 4;
    row[0] = static_cast<int32_t>(i % 4);
  }
  for (bool before : {false, true})
    expect_moe_quant_matches_cpu(std::string("moe_quant streaming skewed passes") + (before ? " before_w2" : ""), *q, x,
                                 weights, idx, before, 8e-3);
}

// A decode batch large enough that the streaming kernel gives a block two tile groups over one staging of its rows
// (T = 256 x 6 of 128 experts, gate / up N = 1024: 64 tiles of 16 rows, two groups of 8; the plan's pass table, 8-row
// passes): within the MoE tolerance of the CPU op (the other decode tests' shapes give one group a block).
TEST_F(CudaMoeTest, Mxfp4ExpertsStreamOverTwoTileGroups) {
  const int64_t d = 512, inter = 1024, e = 128, k = 6, t = 256;
  const std::unique_ptr<QuantMoe> q = quant_moe(d, inter, e);
  const HostTensor x = rand({t, d}), weights = rand({t, k}, 0.05f, 1.0f), idx = distinct_indices(t, k, e);
  expect_moe_quant_matches_cpu("moe_quant streaming, two tile groups a block", *q, x, weights, idx, false, 8e-3);
}

// The shared expert on the side stream (KernelChoices::moe_shared_stream): the same kernels on the same inputs as on
// the stream, so the same bytes, eagerly and replayed from a CUDA graph (the fork and the join recorded in it), at
// decode sizes where the shared expert takes the streaming kernels (T = 1, 3) and the rows kernel (T = 16, 40); and
// the CPU op within the MoE tolerance.
TEST_F(CudaMoeTest, SharedExpertOnTheSideStreamGivesTheSameBytes) {
  const int64_t d = 1024, inter = 512, e = 32, k = 6;
  const std::unique_ptr<QuantMoe> q = quant_moe(d, inter, e);
  for (const int64_t t : {1, 3, 16, 40}) {
    const HostTensor x = rand({t, d}), weights = rand({t, k}, 0.05f, 1.0f), idx = distinct_indices(t, k, e);
    const DeviceTensor dx = up(x), dwts = up(weights), didx = up(idx);
    const std::string name = "moe_quant shared expert on the side stream T=" + std::to_string(t);
    HostTensor out[2];
    for (bool side : {false, true}) {
      ScopedKernelChoices choice(gpu(), [&](cuda::KernelChoices& c) { c.moe_shared_stream = side; });
      const DeviceTensor dout = poisoned({t, d});
      gpu().moe_quant({dx, dwts, didx, &q->gpu_experts, &q->gpu_shared, dout, 10.0f, false});
      out[side] = down(dout);
      if (!side) continue;
      std::unique_ptr<CudaGraph> graph = gpu().capture_graph(
          [&] { gpu().moe_quant({dx, dwts, didx, &q->gpu_experts, &q->gpu_shared, dout, 10.0f, false}); });
      const DeviceTensor poison = poisoned({t, d});
      ASSERT_EQ(testing::copy_and_sync(dout.data(), poison.data(), t * d * sizeof(float), cudaMemcpyDeviceToDevice),
                cudaSuccess);
      graph->replay();
      expect_same_bytes((name + ", graph replay").c_str(), down(dout), out[1]);
    }
    expect_same_bytes((name + " = on the stream").c_str(), out[1], out[0]);
    HostTensor want(DType::kF32, {t, d});
    cpu().moe({x, weights, idx, &q->cpu_experts, &q->cpu_shared, want, 10.0f, false});
    rel_err(name.c_str(), out[1], want, 8e-3);
  }
}

// V3's experts as V3 / R1 checkpoints store them (FP8 128 x 128 blocks with f32 scales, routed and shared) at decode
// batches (T = 1, 3, 16, 64 tokens x 6 of 64 experts) with f32_scale_mma (the default): the routed experts and the
// shared one (up to 8 rows) on the streaming tensor-core kernel, each 128-K block's sums scaled in fp32, x and h
// rounded to bf16 (8e-3 as the other MoE tests); then the same calls with it off (the fp32 kernels and the scratch).
TEST_F(CudaMoeTest, Fp8F32ScaleExpertsStreamThroughTheTensorCores) {
  const int64_t d = 1024, inter = 384, e = 64, k = 6;
  const std::unique_ptr<QuantMoe> q = quant_moe(d, inter, e, QuantFormat::kFP8Block, /*f32_scales=*/true);
  for (int64_t t : {1, 3, 16, 64}) {
    HostTensor x = rand({t, d}), weights = rand({t, k}, 0.05f, 1.0f), idx = distinct_indices(t, k, e);
    for (bool on : {true, false}) {
      testing::ScopedKernelChoices choice(gpu(), [&](cuda::KernelChoices& c) { c.gemm.f32_scale_mma = on; });
      for (bool before : {false, true})
        expect_moe_quant_matches_cpu(std::string("moe_quant fp8 f32 scales") + (on ? " stream_mma" : " off") +
                                         (before ? " before_w2" : "") + " T=" + std::to_string(t),
                                     *q, x, weights, idx, before, 8e-3);
    }
  }
}

// The tiny V4 model's MoE (hidden 128, inter 32: the down projection's K is one MXFP4 block; 8 MXFP4 experts, top
// 6, FP8 shared expert with one partial 128x128 scale block) as the engine's kept-quantized path runs it: one token
// takes the fp32 kernels (exact products: 1e-5), more tokens round x and h to bf16 (8e-3 as the other MoE tests).
TEST_F(CudaMoeTest, TinyV4ShapesMatchCpu) {
  const int64_t d = 128, inter = 32, e = 8, k = 6;
  const std::unique_ptr<QuantMoe> q = quant_moe(d, inter, e);
  for (int64_t t : {1, 2, 29}) {
    HostTensor x = rand({t, d}), weights = rand({t, k}, 0.05f, 1.0f), idx = distinct_indices(t, k, e);
    for (bool before : {false, true})
      expect_moe_quant_matches_cpu("moe_quant tiny V4 T=" + std::to_string(t) + (before ? " before_w2" : ""), *q, x,
                                   weights, idx, before, t == 1 ? 1e-5 : 8e-3);
  }
}

// Batch-invariant mode: the routed experts' grouped GEMMs and the shared expert run one fixed arithmetic per output
// whatever the rows per expert (UE8M0 block formats: the tensor-core streaming kernel for groups counted as few, the
// invariant tile kernel above, gemm_invariant_mma.h; T=60 with k=4 of 16 experts gives ~15 rows per expert, the
// subsets 1-11 tokens), so a token's output is the same bytes alone, in a few tokens or in all 60, in any order.
// x and h are rounded to bf16 there (weights exact): 8e-3 against the dequantized CPU op, as the default mode's
// MoE tests.
TEST_F(CudaMoeTest, BatchInvariantModeTokensDoNotDependOnTheBatch) {
  gpu().set_batch_invariant(true);
  const int64_t d = 256, inter = 128, e = 16, k = 4, t = 60;
  const std::unique_ptr<QuantMoe> q = quant_moe(d, inter, e);
  const HostTensor x = rand({t, d}), weights = rand({t, k}, 0.05f, 1.0f), idx = distinct_indices(t, k, e);
  for (bool before : {false, true})
    expect_moe_quant_batch_invariant(std::string("batch-invariant moe_quant") + (before ? " before_w2" : ""), *q, x,
                                     weights, idx, before, invariance_subsets(t));
}

// Batch-invariant mode at decode shapes: hidden 2048 (gate/up K: 8 MXFP4 chain stages of 256, 16 FP8 ones of 128),
// inter 352 (gate/up N: 11 column blocks of the chain kernel; down K: a partial last stage), 4 experts of which each
// token takes 2, MXFP4 and FP8-block routed experts. All 24 tokens give 12 rows per expert (SIMT tiles); the
// subsets of 1-8 tokens give the chain kernel 1-4 rows per expert on average, gathered through a_rows (an expert
// with more rows than a pass of the launch's rows makes several passes), and the shared expert 1-8 dense rows. Each
// token's output must be the same bytes, and within bi_moe_tolerance() of the CPU. (UE8M0 formats: the tensor-core
// streaming kernel for the subsets, the invariant tile kernel for all 24 tokens.)
TEST_F(CudaMoeTest, BatchInvariantDecodeShapesMatchTheTile) {
  gpu().set_batch_invariant(true);
  const int64_t d = 2048, inter = 352, e = 4, k = 2, t = 24;
  const std::vector<std::vector<int64_t>> subsets = {{0},
                                                     {23},
                                                     {3, 17},
                                                     {5, 6, 7},
                                                     {0, 1, 2, 3},
                                                     {10, 11, 12, 13, 14},
                                                     {18, 19, 20, 21, 22, 23},
                                                     {2, 4, 6, 8, 10, 12, 14},
                                                     {16, 17, 18, 19, 20, 21, 22, 23},
                                                     {7, 6, 5, 4, 3, 2, 1, 0}};
  expect_moe_quant_batch_invariant_formats("decode", d, inter, e, k, t, subsets);
}

// Long prefills: a MoE call of more tokens than one chunk's intermediates allow runs in equal chunks of at least 8192
// tokens (run_moe). A token's result must not depend on how the call is chunked (the grouped GEMMs compute each row
// alone and the combine walks a token's experts in id order): the 20000-token call (3 chunks of 6667) and a call of
// tokens 3000 .. 9666 alone (one chunk of the same size, across the first chunk boundary) give those tokens the same
// bytes; tokens at both ends and at the chunk boundaries also match the CPU op.
TEST_F(CudaMoeTest, ChunkedLongPrefillDoesNotDependOnTheChunks) {
  const int64_t d = 2048, inter = 1024, e = 16, k = 8, t = 20000;
  const std::unique_ptr<QuantMoe> q = quant_moe(d, inter, e);
  HostTensor x = rand({t, d}), weights = rand({t, k}, 0.05f, 1.0f), idx = distinct_indices(t, k, e);
  DeviceTensor dx = up(x), dwts = up(weights), didx = up(idx);
  DeviceTensor dout = poisoned({t, d});
  gpu().moe_quant({dx, dwts, didx, &q->gpu_experts, &q->gpu_shared, dout, 10.0f, false});
  const HostTensor chunked = down(dout);
  {
    const int64_t s0 = 3000, n = 6667;
    std::vector<int64_t> rows(n);
    std::iota(rows.begin(), rows.end(), s0);
    const DeviceTensor sx = up(take_rows(x, rows)), sw = up(take_rows(weights, rows)), si = up(take_rows(idx, rows));
    const DeviceTensor sout = poisoned({n, d});
    gpu().moe_quant({sx, sw, si, &q->gpu_experts, &q->gpu_shared, sout, 10.0f, false});
    const HostTensor alone = down(sout);
    EXPECT_EQ(0, std::memcmp(chunked.data<float>() + s0 * d, alone.data<float>(), sizeof(float) * n * d))
        << "the MoE output depends on the chunking";
  }
  for (int64_t t0 : {int64_t{0}, int64_t{4996}, int64_t{6664}, int64_t{13330}, t - 4}) {
    const int64_t n = 4;
    HostTensor xs(DType::kF32, {n, d}), ws(DType::kF32, {n, k}), is(DType::kI32, {n, k}), got(DType::kF32, {n, d});
    std::memcpy(xs.data<float>(), x.data<float>() + t0 * d, sizeof(float) * n * d);
    std::memcpy(ws.data<float>(), weights.data<float>() + t0 * k, sizeof(float) * n * k);
    std::memcpy(is.data<int32_t>(), idx.data<int32_t>() + t0 * k, sizeof(int32_t) * n * k);
    std::memcpy(got.data<float>(), chunked.data<float>() + t0 * d, sizeof(float) * n * d);
    HostTensor want(DType::kF32, {n, d});
    cpu().moe({xs, ws, is, &q->cpu_experts, &q->cpu_shared, want, 10.0f, false});
    rel_err(("chunked moe_quant rows " + std::to_string(t0)).c_str(), got, want, 8e-3);
  }
}

// Batch-invariant mode with many experts (128, top 4) and few rows each: from 64 (token, expert) slots on the
// backend hands the streaming kernel bf16 copies of x and h (its blocks stage all of K of their group's rows), below
// it the kernel rounds x itself. Tokens alone and in 5 (20 slots: f32 staging), 16 (64 slots: bf16), 24, 100, 150
// and 250 (96-1000 slots, 1-8 rows an expert: bf16, up to 8-row passes) must give the bytes of the full 300-token
// call (~10 rows an expert: the tile kernel); against the CPU at bi_moe_tolerance().
TEST_F(CudaMoeTest, BatchInvariantManyExpertsStageBf16) {
  gpu().set_batch_invariant(true);
  const int64_t d = 512, inter = 256, e = 128, k = 4, t = 300;
  expect_moe_quant_batch_invariant_formats("many experts", d, inter, e, k, t,
                                           with_centred_runs({{0}, {299}}, t, {5, 16, 24, 100, 150, 250}));
  gpu().set_batch_invariant(false);
}

// Batch-invariant mode with prefill-sized expert groups: T = 300 tokens, 2 of 4 experts each (~150 rows per
// expert: three plan tiles of 64, the last partial, in the invariant tile kernel), hidden 1024 (gate/up K: MXFP4 8
// steps, FP8 16), inter 352 (down K: 11 MXFP4 chunks, the last step 3 of 4 chunks; gate/up N: a partial 128-row
// weight block). Tokens taken alone or in 2-9 (the streaming kernel: up to 5 rows a group on average, the shared
// expert's 1-8 dense rows), 17 and 40 (the tile kernel with ~9 / ~20 rows a group: every row at another position of
// its tile) and all but one token must give the same bytes as in the full call; against the CPU at
// bi_moe_tolerance().
TEST_F(CudaMoeTest, BatchInvariantPrefillGroupsMatchDecode) {
  gpu().set_batch_invariant(true);
  const int64_t d = 1024, inter = 352, e = 4, k = 2, t = 300;
  expect_moe_quant_batch_invariant_formats("prefill", d, inter, e, k, t,
                                           with_centred_runs({{0}, {299}, {150, 7}}, t, {3, 8, 9, 17, 40, 299}));
  gpu().set_batch_invariant(false);
}

}  // namespace
}  // namespace deepinfer
