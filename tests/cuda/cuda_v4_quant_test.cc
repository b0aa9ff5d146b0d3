// DeepSeek-V4 / V4.1 with their block-format weights kept on the GPU (the engine's default there): random
// checkpoints in the real storage formats (FP8 e4m3 projections and shared expert with UE8M0 block scales, MXFP4
// routed experts) load on CUDA with those matrices as codes + scales (linear_quant / moe_quant) and the output head
// in bf16 as stored (model/output_head.h), against the CPU reference with the same weights dequantized to f32 and
// against the CPU emulation of the CUDA rounding (tests/bf16_gemm_emulation_backend.h). Token by token every block
// GEMM has one row and, at these sizes, takes the fp32 kernels (exact products of the stored values:
// gemm_stream_mma_takes_shape declines); only the bf16 head rounds its input to bf16 (cuBLASLt bf16), so the logits
// must match the emulation to 1e-3 of the row's largest logit (summation order, and an input that rounds to the
// other bf16 neighbour) and the f32 reference within twice the emulation's own distance from it. A prefill's
// many-row GEMMs round their inputs to bf16 too (as V3's FP8 path: tests/cuda/cuda_v3_fp8_test.cc), so there only a
// gross bound (0.5 of the row's largest logit: a wrong code, scale or row is O(1) or NaN) is asserted — also for a
// prompt of 160 rows, whose compressor projections read their bf16 copies on the device with the activations split
// in two bf16 terms (linear_quant's split_in; its accuracy: tests/cuda/cuda_split_linear_test.cc).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "bf16_gemm_emulation_backend.h"
#include "deepinfer/model/deepseek_v4.h"
#include "deepinfer/model/kept_matrix.h"
#include "deepinfer/model/random_checkpoint.h"
#include "deepinfer/ops/cuda/cuda_backend.h"
#include "random_checkpoint_util.h"
#include "test_util.h"
#include "v4_quant_config.h"

namespace deepinfer {
namespace {

// A random checkpoint of the golden fixture's shape with FP8 (block x block, UE8M0) projections and MXFP4 experts.
std::string make_quant_checkpoint(testing::TempDir& tmp, const std::string& family, int block) {
  nlohmann::json cfg = nlohmann::json::parse(
      testing::read_file_or_empty(testing::test_data_dir() + "/golden/" + family + "/config.json"));
  EXPECT_FALSE(cfg.is_null());
  if (cfg.is_null()) return "";
  cfg["quantization_config"] = testing::v4_quantization_config(block);
  return testing::write_random_checkpoint_of(tmp, cfg, 11);
}

TEST(CudaV4Quant, KeptWeightsMatchTheF32ReferenceTokenByToken) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  for (const auto& [family, block] : {std::pair{"deepseek_v4", 128}, {"deepseek_v41", 32}}) {
    SCOPED_TRACE(family);
    testing::TempDir tmp;
    const std::string dir = make_quant_checkpoint(tmp, family, block);
    ASSERT_FALSE(dir.empty());
    std::vector<int64_t> token_map(100000);
    for (size_t i = 0; i < token_map.size(); ++i) token_map[i] = static_cast<int64_t>(i % 256);
    auto gpu = make_cuda_backend(0);
    auto cpu = make_cpu_backend(0);
    auto kept = DeepseekV4Model::load(dir, *gpu, token_map, true);
    auto gpu_f32 = DeepseekV4Model::load(dir, *gpu, token_map, false);
    auto ref = DeepseekV4Model::load(dir, *cpu, token_map, false);
    testing::Bf16GemmEmulationBackend emu_backend(make_cpu_backend(0));
    auto emu = DeepseekV4Model::load(dir, emu_backend, token_map, true);
    ASSERT_TRUE(kept->weights().layers[0].quant_experts);
    ASSERT_TRUE(kept->weights().layers[0].attn.wq_b.quantized());
    const int64_t v = ref->config().vocab_size, d = ref->config().hidden_size;
    // The head on the device in bf16: half the f32 head's bytes.
    EXPECT_EQ(kept->weights().head.dtype(), DType::kBF16);
    EXPECT_EQ(kept->weights().head.device().kind, DeviceKind::kCUDA);
    EXPECT_EQ(owned_bytes(kept->weights().head), 2 * v * d);
    EXPECT_EQ(gpu_f32->weights().head.dtype(), DType::kF32);
    EXPECT_EQ(owned_bytes(gpu_f32->weights().head), 4 * v * d);
    std::vector<int64_t> ids;
    for (int i = 0; i < 29; ++i) ids.push_back((i * 53 + 7) % v);
    // Token by token from the start: one-row GEMMs only.
    auto sk = kept->new_sequence(), sr = ref->new_sequence(), se = emu->new_sequence();
    HostTensor rows_k(DType::kF32, {29, v}), rows_r(DType::kF32, {29, v}), rows_e(DType::kF32, {29, v});
    for (int64_t i = 0; i < 29; ++i) {
      const std::span<const int64_t> one(&ids[i], 1);
      const HostTensor lk = kept->forward(sk, one), lr = ref->forward(sr, one), le = emu->forward(se, one);
      std::copy_n(lk.data<float>(), v, rows_k.data<float>() + i * v);
      std::copy_n(lr.data<float>(), v, rows_r.data<float>() + i * v);
      std::copy_n(le.data<float>(), v, rows_e.data<float>() + i * v);
    }
    auto pk = kept->new_sequence(), pf = gpu_f32->new_sequence(), pr = ref->new_sequence();
    const HostTensor prefill_k = kept->forward(pk, ids), prefill_f = gpu_f32->forward(pf, ids),
                     prefill_r = ref->forward(pr, ids);
    const double one_row = testing::worst_row_rel(rows_k, rows_r, v),
                 one_row_emu = testing::worst_row_rel(rows_k, rows_e, v),
                 emu_err = testing::worst_row_rel(rows_e, rows_r, v),
                 pre = testing::worst_row_rel(prefill_k, prefill_r, v),
                 f32_err = testing::worst_row_rel(prefill_f, prefill_r, v);
    std::printf(
        "[cuda-v4-quant %s] kept weights (bf16 head) vs CPU f32: token by token (one-row GEMMs) worst row rel %.3g "
        "(vs the CPU emulation %.3g; emulation vs f32 %.3g), prefill (29 rows, bf16-rounded GEMM inputs) %.3g; CUDA "
        "f32 weights vs CPU prefill %.3g; weight bytes kept %lld, f32 %lld\n",
        family, one_row, one_row_emu, emu_err, pre, f32_err, static_cast<long long>(kept->weight_bytes()),
        static_cast<long long>(gpu_f32->weight_bytes()));
    EXPECT_LE(one_row_emu, 1e-3);
    EXPECT_LE(one_row, std::max(2 * emu_err, 1e-4));
    EXPECT_LE(f32_err, 1e-4);
    EXPECT_LE(pre, 0.5);
    EXPECT_LT(kept->weight_bytes(), 0.6 * gpu_f32->weight_bytes());

    int compressors = 0;
    for (const V4LayerWeights& lw : kept->weights().layers)
      if (lw.attn.comp_wkv_bf16.view().data() != nullptr) {
        ++compressors;
        EXPECT_EQ(lw.attn.comp_wkv_bf16.dtype(), DType::kBF16);
        EXPECT_EQ(lw.attn.comp_wkv_bf16.device().kind, DeviceKind::kCUDA);
      }
    EXPECT_GT(compressors, 0);
    std::vector<int64_t> long_ids;
    for (int i = 0; i < 160; ++i) long_ids.push_back((i * 37 + 11) % v);
    // A sanity bound only: at 160 rows the random tiny model turns any difference into discrete flips (indexer and
    // router top-k), so even the CPU emulation of the same bf16 roundings, which differs in summation order alone,
    // ends as far away as the f32 model (H200, session 16: worst row vs emulation 0.39 / 0.36, vs f32 0.38 / 0.69
    // for V4 / V4.1; uncorrelated logits would be ~1.4). split_in's accuracy is CudaSplitLinearTest's; that the
    // model takes it, DeepseekV4Load's counting backend.
    auto lk = kept->new_sequence(), lr = ref->new_sequence(), le = emu->new_sequence();
    const HostTensor long_k = kept->forward(lk, long_ids), long_r = ref->forward(lr, long_ids),
                     long_e = emu->forward(le, long_ids);
    const double long_pre = testing::worst_row_rel(long_k, long_r, v),
                 long_emu = testing::worst_row_rel(long_k, long_e, v);
    std::printf(
        "[cuda-v4-quant %s] prefill of 160 rows (compressors on bf16 copies, split_in): worst row rel vs the CPU "
        "emulation %.3g, vs CPU f32 %.3g\n",
        family, long_emu, long_pre);
    EXPECT_LE(long_emu, 1.0);
    EXPECT_LE(long_pre, 1.0);
  }
}

// The engine keeps a V4 checkpoint's block-format weights quantized on CUDA by default (--weight-format auto) and
// dequantizes them with --weight-format f32 or on the CPU. One-token prompts and one sequence at a time keep every
// GEMM on the one-row exact path, so the GPU's greedy ids must equal the CPU's f32 reference.
TEST(CudaV4Quant, EngineKeepsQuantizedWeightsOnCudaByDefault) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  testing::TempDir tmp;
  const std::string dir = make_quant_checkpoint(tmp, "deepseek_v4", 128);
  ASSERT_FALSE(dir.empty());
  std::string args = " --model " + dir + " --max-tokens 12 --ignore-eos --max-num-seqs 1";
  for (const char* p : {"7", "300", "41"}) args += std::string(" --prompt-ids ") + p;
  const auto kept = testing::run_cli("offline --device cuda" + args);
  const auto f32 = testing::run_cli("offline --device cuda --weight-format f32" + args);
  const auto cpu = testing::run_cli("offline --device cpu" + args);
  for (const auto* r : {&kept, &f32, &cpu}) ASSERT_EQ(r->exit_code, 0) << r->output;
  EXPECT_NE(kept.output.find("weights: block-format matrices (FP8, MXFP4) kept quantized"), std::string::npos)
      << kept.output;
  EXPECT_NE(kept.output.find("output head: bf16 as stored"), std::string::npos) << kept.output;
  EXPECT_NE(f32.output.find("weights: f32, block-format matrices dequantized"), std::string::npos) << f32.output;
  EXPECT_NE(f32.output.find("output head: f32"), std::string::npos) << f32.output;
  EXPECT_NE(cpu.output.find("weights: f32, block-format matrices dequantized"), std::string::npos) << cpu.output;
  const auto want = testing::parse_offline_samples(cpu.output);
  ASSERT_EQ(want.size(), 3u) << cpu.output;
  EXPECT_EQ(testing::parse_offline_samples(kept.output), want) << kept.output;
  EXPECT_EQ(testing::parse_offline_samples(f32.output), want) << f32.output;
  EXPECT_EQ(kept.output.find("finite=NO"), std::string::npos);
}

}  // namespace
}  // namespace deepinfer
