// DeepSeek-V3 with FP8 128×128 weights kept in their stored format on the GPU: a `deepinfer make-checkpoint` FP8
// checkpoint of the golden fixture's shape (the fixture itself is bf16) loads on CUDA with its projections and
// experts as e4m3 codes + F32 block scales (read by linear_quant / moe_quant), against the CPU reference with the
// same weights dequantized to f32 and against the CPU emulation of the CUDA GEMMs' rounding
// (tests/bf16_gemm_emulation_backend.h: exact fp32 products for <= 4 rows, bf16-rounded inputs and weights for more).
// Tolerances: token by token every GEMM has one row (the exact path), so the FP8 dequantization and GEMMs must match
// the f32 reference like the f32 path does (1e-4 of the largest logit per row, the golden tolerance); a prefill's
// many-row GEMMs round to bf16, so its error vs f32 must stay within twice what the same rounding gives on the CPU
// (the error budget; see docs/PERF.md). Also checks that the weights take less device memory than the f32 copy.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "bf16_gemm_emulation_backend.h"
#include "deepinfer/model/deepseek_v3.h"
#include "deepinfer/ops/cuda/cuda_backend.h"
#include "test_util.h"

namespace deepinfer {
namespace {

// A random FP8 checkpoint of the golden fixture's shape under tmp (empty on failure, reported); wide: 512-wide hidden
// rows (1024 dense, 256 expert intermediate), so that the GEMMs' K spans several 128-value blocks.
std::string make_fp8_checkpoint(testing::TempDir& tmp, bool wide = false, int seed = 5) {
  nlohmann::json cfg =
      nlohmann::json::parse(testing::read_file_or_empty(testing::test_data_dir() + "/golden/deepseek_v3/config.json"));
  EXPECT_FALSE(cfg.is_null());
  if (cfg.is_null()) return "";
  if (wide) {
    cfg["hidden_size"] = 512;
    cfg["intermediate_size"] = 1024;
    cfg["moe_intermediate_size"] = 256;
  }
  cfg["quantization_config"] = {
      {"quant_method", "fp8"}, {"fmt", "e4m3"}, {"activation_scheme", "dynamic"}, {"weight_block_size", {128, 128}}};
  testing::write_file(tmp.file("in.json"), cfg.dump(2));
  const std::string dir = tmp.path() + "/ckpt";
  auto r = testing::run_cli("make-checkpoint --config " + tmp.file("in.json") + " --out " + dir + " --seed " +
                            std::to_string(seed));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return r.exit_code == 0 ? dir : "";
}

TEST(CudaV3Fp8, NativeFp8WeightsWithinTheBf16RoundingBudget) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  testing::TempDir tmp;
  const std::string dir = make_fp8_checkpoint(tmp);
  ASSERT_FALSE(dir.empty());

  auto gpu = make_cuda_backend(0);
  auto cpu = make_cpu_backend(0);
  testing::Bf16GemmEmulationBackend emu_backend(make_cpu_backend(0));
  auto native = DeepseekV3Model::load(dir, *gpu, V3WeightStorage::kFP8);
  auto gpu_f32 = DeepseekV3Model::load(dir, *gpu, V3WeightStorage::kF32);
  auto ref = DeepseekV3Model::load(dir, *cpu);
  auto emu = DeepseekV3Model::load(dir, emu_backend, V3WeightStorage::kFP8);
  const int64_t v = ref->config().vocab_size;
  std::vector<int64_t> ids;
  for (int i = 0; i < 29; ++i) ids.push_back((i * 53 + 7) % v);
  for (MlaForm form : {MlaForm::kNaive, MlaForm::kAbsorbed}) {
    for (auto* m : {native.get(), gpu_f32.get(), ref.get(), emu.get()}) m->set_mla_form(form);
    auto sn = native->new_sequence(), sf = gpu_f32->new_sequence(), sr = ref->new_sequence(), se = emu->new_sequence();
    const HostTensor ln = native->forward(sn, ids), lf = gpu_f32->forward(sf, ids), lr = ref->forward(sr, ids),
                     le = emu->forward(se, ids);
    double dec = 0, dec_emu = 0;
    for (int64_t tok : {3, 11, 17}) {
      const HostTensor dn = native->forward(sn, std::span<const int64_t>(&tok, 1));
      const HostTensor dr = ref->forward(sr, std::span<const int64_t>(&tok, 1));
      const HostTensor de = emu->forward(se, std::span<const int64_t>(&tok, 1));
      dec = std::max(dec, testing::worst_row_rel(dn, dr, v));
      dec_emu = std::max(dec_emu, testing::worst_row_rel(de, dr, v));
    }
    // Token by token from the start: one-row GEMMs only (exact fp32 products of the FP8 values).
    auto st = native->new_sequence();
    HostTensor rows(DType::kF32, {29, v});
    for (int64_t i = 0; i < 29; ++i) {
      const HostTensor l = native->forward(st, std::span<const int64_t>(&ids[i], 1));
      std::copy_n(l.data<float>(), v, rows.data<float>() + i * v);
    }
    const double pre = testing::worst_row_rel(ln, lr, v), pre_emu = testing::worst_row_rel(le, lr, v),
                 pre_vs_emu = testing::worst_row_rel(ln, le, v);
    const double one_row = testing::worst_row_rel(rows, lr, v), f32_err = testing::worst_row_rel(lf, lr, v);
    std::printf(
        "[cuda-v3-fp8 %s] FP8-native vs CPU f32: prefill (29 rows) worst row rel %.3g, decode %.3g, token by token "
        "(exact path) %.3g; CPU bf16 emulation vs f32: prefill %.3g, decode %.3g; FP8-native vs emulation: prefill "
        "%.3g; CUDA f32 weights vs CPU: %.3g\n",
        form == MlaForm::kNaive ? "naive" : "absorbed", pre, dec, one_row, pre_emu, dec_emu, pre_vs_emu, f32_err);
    EXPECT_LE(one_row, 1e-4);
    EXPECT_LE(f32_err, 1e-4);
    EXPECT_LE(pre, std::max(2 * pre_emu, 1e-3));
    EXPECT_LE(dec, std::max(2 * dec_emu, 1e-3));
  }
  std::printf("[cuda-v3-fp8] weight bytes: FP8 kept %lld, f32 %lld (%.2fx less)\n",
              static_cast<long long>(native->weight_bytes()), static_cast<long long>(gpu_f32->weight_bytes()),
              double(gpu_f32->weight_bytes()) / native->weight_bytes());
  EXPECT_LT(native->weight_bytes(), 0.6 * gpu_f32->weight_bytes());
}

// --activation-quant fp8 (the reference's gemm_impl "fp8") on CUDA, on a V3 FP8 checkpoint with 512-wide hidden rows.
// Token by token every GEMM has one row: the own kernels' exact fp32 products over the rounded rows, so the GPU follows
// the CPU reference in the same mode (up to summation order; a last-bit difference can move a value across an e4m3
// rounding boundary in the next GEMM's input: 1e-2 of a row), while the mode itself moves the logits far more (the
// GPU in the mode against the CPU without it: over 10x that). A 29-token prefill (q_a, kv_a and the dense SwiGLU on
// cuBLASLt's block-scaled FP8 GEMM, the experts on the FP8 expert GEMM) must give finite logits; its numerics are the
// op tests' (CudaLinearTest / CudaMoeTest ActQuantFp8Block128*): this random tiny model amplifies any rounding
// difference of many-row GEMMs to ~0.3-0.5 of a row (bf16 ones included: NativeFp8WeightsWithinTheBf16RoundingBudget).
TEST(CudaV3Fp8, ActivationQuantFp8MatchesTheCpuReference) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  testing::TempDir tmp;
  const std::string dir = make_fp8_checkpoint(tmp, /*wide=*/true, /*seed=*/9);
  ASSERT_FALSE(dir.empty());

  auto gpu = make_cuda_backend(0);
  auto cpu = make_cpu_backend(0);
  auto native = DeepseekV3Model::load(dir, *gpu, V3WeightStorage::kFP8);
  auto ref = DeepseekV3Model::load(dir, *cpu);
  auto plain = DeepseekV3Model::load(dir, *cpu);
  native->set_activation_quant(ActQuant::kFp8Block128);
  ref->set_activation_quant(ActQuant::kFp8Block128);
  const int64_t v = ref->config().vocab_size;
  std::vector<int64_t> ids;
  for (int i = 0; i < 29; ++i) ids.push_back((i * 53 + 7) % v);
  auto sn = native->new_sequence(), sr = ref->new_sequence(), sp = plain->new_sequence();
  double err = 0, mode = 0;
  for (const int64_t id : ids) {
    const std::span<const int64_t> one(&id, 1);
    const HostTensor dn = native->forward(sn, one), dr = ref->forward(sr, one), dp = plain->forward(sp, one);
    err = std::max(err, testing::worst_row_rel(dn, dr, v));
    mode = std::max(mode, testing::worst_row_rel(dn, dp, v));
  }
  auto sf = native->new_sequence();
  const HostTensor pre = native->forward(sf, ids);
  bool finite = true;
  for (int64_t i = 0; i < pre.numel(); ++i) finite = finite && std::isfinite(pre.data<float>()[i]);
  std::printf(
      "[cuda-v3-act-fp8] token by token: GPU vs CPU under fp8 worst row rel %.3g; GPU under fp8 vs CPU without %.3g; "
      "prefill (29 rows) logits finite: %s\n",
      err, mode, finite ? "yes" : "NO");
  EXPECT_LE(err, 1e-2);
  EXPECT_GT(mode, 10 * err);
  EXPECT_TRUE(finite);
}

// GemmChoices::f32_scale_mma (the default since session 32): the checkpoint's f32-scaled FP8 matrices on the
// tensor-core decode kernels. Prefills of 6 rows (the streaming kernel: A rounded to bf16, the weights exact) and of 29
// rows (the dense GEMMs on the rows kernel: A and the scaled weights rounded to bf16, as the scratch path it replaces;
// the experts' few rows each on the streaming kernel) stay within NativeFp8WeightsWithinTheBf16RoundingBudget's budget
// against the CPU's f32 model: twice the CPU emulation's error (bf16 inputs and weights past 4 rows), or 1e-3.
TEST(CudaV3Fp8, F32ScaleMmaWithinTheBf16RoundingBudget) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  testing::TempDir tmp;
  const std::string dir = make_fp8_checkpoint(tmp, /*wide=*/true);
  ASSERT_FALSE(dir.empty());
  auto gpu = make_cuda_backend(0);
  cuda::KernelChoices choices = gpu->kernel_choices();
  choices.gemm.f32_scale_mma = true;
  gpu->set_kernel_choices(choices);
  auto cpu = make_cpu_backend(0);
  testing::Bf16GemmEmulationBackend emu_backend(make_cpu_backend(0));
  auto native = DeepseekV3Model::load(dir, *gpu, V3WeightStorage::kFP8);
  auto ref = DeepseekV3Model::load(dir, *cpu);
  auto emu = DeepseekV3Model::load(dir, emu_backend, V3WeightStorage::kFP8);
  const int64_t v = ref->config().vocab_size;
  for (const int n : {6, 29}) {
    std::vector<int64_t> ids;
    for (int i = 0; i < n; ++i) ids.push_back((i * 53 + 7) % v);
    auto sn = native->new_sequence(), sr = ref->new_sequence(), se = emu->new_sequence();
    const HostTensor ln = native->forward(sn, ids), lr = ref->forward(sr, ids), le = emu->forward(se, ids);
    const double err = testing::worst_row_rel(ln, lr, v), budget = testing::worst_row_rel(le, lr, v);
    std::printf("[cuda-v3-f32-scale-mma] prefill %d rows: GPU vs CPU f32 worst row rel %.3g; CPU bf16 emulation %.3g\n",
                n, err, budget);
    EXPECT_LE(err, std::max(2 * budget, 1e-3)) << n << " rows";
  }
}

// The engine keeps an FP8 checkpoint FP8 on CUDA by default (--weight-format auto) and dequantizes it with
// --weight-format f32 or on the CPU. Prompts of <= 4 tokens and one sequence at a time keep every GEMM on the exact
// few-row path (fp32 products of the FP8 values), so the GPU's greedy ids must equal the CPU's f32 reference.
TEST(CudaV3Fp8, EngineKeepsFp8WeightsOnCudaByDefault) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  testing::TempDir tmp;
  const std::string dir = make_fp8_checkpoint(tmp);
  ASSERT_FALSE(dir.empty());
  std::string args = " --model " + dir + " --max-tokens 12 --ignore-eos --max-num-seqs 1";
  for (const char* p : {"7,300,41", "5", "120,9,77,401"}) args += std::string(" --prompt-ids ") + p;
  const auto fp8 = testing::run_cli("offline --device cuda" + args);
  const auto f32 = testing::run_cli("offline --device cuda --weight-format f32" + args);
  const auto cpu = testing::run_cli("offline --device cpu" + args);
  for (const auto* r : {&fp8, &f32, &cpu}) ASSERT_EQ(r->exit_code, 0) << r->output;
  EXPECT_NE(fp8.output.find("weights: FP8 block-scaled matrices kept quantized"), std::string::npos) << fp8.output;
  EXPECT_NE(f32.output.find("weights: f32, FP8 block-scaled matrices dequantized"), std::string::npos) << f32.output;
  EXPECT_NE(cpu.output.find("weights: f32, FP8 block-scaled matrices dequantized"), std::string::npos) << cpu.output;
  const auto want = testing::parse_offline_samples(cpu.output);
  ASSERT_EQ(want.size(), 3u) << cpu.output;
  EXPECT_EQ(testing::parse_offline_samples(fp8.output), want) << fp8.output;
  EXPECT_EQ(testing::parse_offline_samples(f32.output), want) << f32.output;
  EXPECT_EQ(fp8.output.find("finite=NO"), std::string::npos);
}

}  // namespace
}  // namespace deepinfer
