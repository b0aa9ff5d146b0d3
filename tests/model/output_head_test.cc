// The output head beside kept block-format weights (model/output_head.h). A V4 / V4.1 checkpoint with FP8 / MXFP4
// matrices loaded with keep_quant (the engine's default on CUDA) keeps head.weight in bf16 as stored: half the
// bytes. The CPU reference widens it exactly, so the target's logits (prefill, decode, batched paged decode) and
// the MTP / DSpark drafts' equal the f32 head's bit for bit. A bf16-only checkpoint (nothing kept) and the f32 mode
// keep an f32 head. The CUDA rounding (activations to bf16 for the cuBLASLt bf16 GEMM) is emulated on the CPU
// (Bf16GemmEmulationBackend) against the f32 model: within a stated tolerance, greedy tokens unchanged on the
// prompts of the GPU engine test (tests/cuda/cuda_v4_quant_test.cc).
#include "deepinfer/model/output_head.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <span>

#include <nlohmann/json.hpp>

#include "bf16_gemm_emulation_backend.h"
#include "deepinfer/core/dtype.h"
#include "deepinfer/core/error.h"
#include "deepinfer/model/deepseek_v4.h"
#include "deepinfer/model/dspark_draft.h"
#include "deepinfer/model/kept_matrix.h"
#include "deepinfer/model/random_checkpoint.h"
#include "deepinfer/model/v4_mtp_draft.h"
#include "model/dspark_fixture.h"
#include "random_checkpoint_util.h"
#include "test_util.h"
#include "v4_paged_decode.h"
#include "v4_quant_config.h"

namespace deepinfer {
namespace {

std::string golden_dir(const std::string& family) { return testing::test_data_dir() + "/golden/" + family; }

// A random checkpoint of the golden tiny config of `family` with FP8 (block x block, UE8M0) projections and MXFP4
// experts; `mtp`: with one V4 MTP module.
std::string quant_checkpoint(testing::TempDir& tmp, const std::string& family, int block, uint64_t seed,
                             bool mtp = false) {
  nlohmann::json cfg = nlohmann::json::parse(testing::read_file_or_empty(golden_dir(family) + "/config.json"));
  EXPECT_FALSE(cfg.is_null());
  cfg["quantization_config"] = testing::v4_quantization_config(block);
  if (mtp) cfg["num_nextn_predict_layers"] = 1;
  return testing::write_random_checkpoint_of(tmp, cfg, seed);
}

std::vector<int64_t> token_map_of(int64_t n) {
  std::vector<int64_t> m(static_cast<size_t>(n));
  for (size_t i = 0; i < m.size(); ++i) m[i] = static_cast<int64_t>(i % 256);
  return m;
}

bool same_bytes(const HostTensor& a, const HostTensor& b) {
  return a.shape() == b.shape() &&
         std::memcmp(a.view().data(), b.view().data(), static_cast<size_t>(a.view().nbytes())) == 0;
}

// The bf16 head widened to f32 is the f32 head, value for value (the checkpoint stores it in bf16).
void expect_widens_to(const OwnedTensor& bf16, const OwnedTensor& f32) {
  ASSERT_EQ(bf16.dtype(), DType::kBF16);
  ASSERT_EQ(f32.dtype(), DType::kF32);
  ASSERT_EQ(bf16.shape(), f32.shape());
  const uint16_t* b = bf16.data<uint16_t>();
  const float* f = f32.data<float>();
  int64_t differ = 0;
  for (int64_t i = 0; i < f32.numel(); ++i) {
    const uint32_t bits = static_cast<uint32_t>(b[i]) << 16;
    float w;
    std::memcpy(&w, &bits, sizeof(w));
    differ += std::memcmp(&w, &f[i], sizeof(w)) != 0;
  }
  EXPECT_EQ(differ, 0);
}

TEST(OutputHead, KeptQuantizedCheckpointKeepsTheHeadInBf16WithTheF32Logits) {
  for (const auto& [family, block] : {std::pair{"deepseek_v4", 128}, {"deepseek_v41", 32}}) {
    SCOPED_TRACE(family);
    testing::TempDir tmp;
    const std::string dir = quant_checkpoint(tmp, family, block, 3);
    auto backend = make_cpu_backend(0);
    auto kept = DeepseekV4Model::load(dir, *backend, token_map_of(100000), true);
    auto f32 = DeepseekV4Model::load(dir, *backend, token_map_of(100000), false);
    const int64_t V = f32->config().vocab_size, D = f32->config().hidden_size;
    const OwnedTensor& head = kept->weights().head;
    EXPECT_EQ(head.dtype(), DType::kBF16);
    EXPECT_EQ(head.shape(), Shape({V, D}));
    EXPECT_EQ(owned_bytes(head), 2 * V * D);
    EXPECT_EQ(owned_bytes(f32->weights().head), 4 * V * D);
    expect_widens_to(head, f32->weights().head);
    std::printf("[output-head %s] weight bytes: kept %lld (bf16 head %lld), f32 %lld (f32 head %lld)\n", family,
                static_cast<long long>(kept->weight_bytes()), static_cast<long long>(owned_bytes(head)),
                static_cast<long long>(f32->weight_bytes()), static_cast<long long>(owned_bytes(f32->weights().head)));

    std::vector<int64_t> ids;
    for (int i = 0; i < 23; ++i) ids.push_back((i * 37 + 11) % V);
    auto sk = kept->new_sequence(), sf = f32->new_sequence();
    EXPECT_TRUE(same_bytes(kept->forward(sk, ids), f32->forward(sf, ids))) << "prefill";
    for (int64_t tok : {5, 301}) {
      const std::span<const int64_t> one(&tok, 1);
      EXPECT_TRUE(same_bytes(kept->forward(sk, one), f32->forward(sf, one))) << "decode " << tok;
    }
    // The last-rows head (what the engine's prefill reads).
    auto lk = kept->new_sequence(), lf = f32->new_sequence();
    EXPECT_TRUE(same_bytes(kept->forward(lk, ids, nullptr, nullptr, nullptr, 1),
                           f32->forward(lf, ids, nullptr, nullptr, nullptr, 1)))
        << "last row";
    // The batched paged decode (DecodeBatch's head).
    const std::vector<testing::Spec> specs = testing::make_specs(*f32, {11, 30}, 3);
    const auto paged_kept = testing::paged_decode(*kept, specs, false, true);
    const auto paged_f32 = testing::paged_decode(*f32, specs, false, true);
    ASSERT_EQ(paged_kept.size(), paged_f32.size());
    for (size_t i = 0; i < paged_f32.size(); ++i) EXPECT_EQ(paged_kept[i], paged_f32[i]) << "paged, sequence " << i;
  }
}

// Nothing to keep quantized (the golden checkpoints are bf16 only) or the f32 mode: the head stays f32, so a
// device run of a bf16 checkpoint computes as the CPU reference does.
TEST(OutputHead, Bf16CheckpointAndF32ModeKeepAnF32Head) {
  auto backend = make_cpu_backend(0);
  const std::string dir = golden_dir("deepseek_v4");
  auto kept = DeepseekV4Model::load(dir, *backend, std::nullopt, true);
  auto f32 = DeepseekV4Model::load(dir, *backend, std::nullopt, false);
  EXPECT_FALSE(kept->weights().layers[0].attn.wq_b.quantized());
  EXPECT_EQ(kept->weights().head.dtype(), DType::kF32);
  EXPECT_EQ(kept->weight_bytes(), f32->weight_bytes());
  testing::TempDir tmp;
  auto q = DeepseekV4Model::load(quant_checkpoint(tmp, "deepseek_v4", 128, 3), *backend, std::nullopt, false);
  EXPECT_EQ(q->weights().head.dtype(), DType::kF32);
}

// The MTP draft reads the target's head: with a bf16 head its logits are the f32 head's bit for bit on the CPU.
TEST(OutputHead, MtpDraftReadsTheBf16Head) {
  testing::TempDir tmp;
  const std::string dir = quant_checkpoint(tmp, "deepseek_v4", 128, 9, true);
  auto backend = make_cpu_backend(0);
  auto kept = DeepseekV4Model::load(dir, *backend, std::nullopt, true);
  auto f32 = DeepseekV4Model::load(dir, *backend, std::nullopt, false);
  ASSERT_TRUE(kept->weights().mtp.has_value());
  ASSERT_EQ(kept->weights().head.dtype(), DType::kBF16);
  const int64_t V = f32->config().vocab_size, T = 9;
  std::vector<int64_t> ids;
  for (int i = 0; i < T; ++i) ids.push_back((i * 53 + 7) % V);
  std::vector<float> features;
  auto seq = f32->new_sequence();
  f32->forward_features(seq, ids, &features);
  const std::vector<float> in(features.begin(), features.begin() + (T - 1) * f32->feature_dim());
  const std::vector<int64_t> next(ids.begin() + 1, ids.end());
  const V4MtpDraft dk(*kept), df(*f32);
  V4MtpCache ck = dk.new_cache(), cf = df.new_cache();
  EXPECT_TRUE(same_bytes(dk.forward(ck, in, next), df.forward(cf, in, next)));
}

// The DSpark draft (V4.1 with 3 draft layers) reads the target's head too: bit for bit on the CPU.
TEST(OutputHead, DsparkDraftReadsTheBf16Head) {
  testing::TempDir tmp;
  nlohmann::json cfg = testing::dspark_config("deepseek_v41");
  cfg["quantization_config"] = testing::v4_quantization_config(32);
  const std::string dir = testing::write_random_checkpoint_of(tmp, cfg, 5);
  auto backend = make_cpu_backend(0);
  auto kept = DeepseekV4Model::load(dir, *backend, token_map_of(100000), true);
  auto f32 = DeepseekV4Model::load(dir, *backend, token_map_of(100000), false);
  ASSERT_TRUE(kept->weights().dspark.has_value());
  ASSERT_EQ(kept->weights().head.dtype(), DType::kBF16);
  auto block_logits = [](const DeepseekV4Model& m) {
    const DsparkDraft draft(m);
    const std::vector<int64_t> ids = testing::dspark_prompt(40, m.config().vocab_size);
    V4StreamCapture cap = draft.make_capture();
    auto seq = m.new_sequence();
    m.forward(seq, ids, nullptr, &cap);
    DsparkContext ctx = draft.new_context();
    draft.append_context(ctx, cap);
    return draft.block(ctx, 17).base_logits;
  };
  EXPECT_TRUE(same_bytes(block_logits(*kept), block_logits(*f32)));
}

// CUDA rounds the head's input to bf16 (cuBLASLt bf16; the FP8 projections' one-row GEMMs stay exact). Emulated on
// the CPU on the GPU test's checkpoint (seed 11), token by token: every logit row within 1e-2 of its largest f32
// logit (bf16 RNE moves an activation by <= 2^-9 of itself; a wrong head is O(1)), not bit-equal (the rounding
// happens), and the greedy continuations of the GPU engine test's one-token prompts unchanged.
TEST(OutputHead, CudaBf16RoundingOfTheHeadInputKeepsGreedyTokens) {
  testing::TempDir tmp;
  const std::string dir = quant_checkpoint(tmp, "deepseek_v4", 128, 11);
  auto cpu = make_cpu_backend(0);
  testing::Bf16GemmEmulationBackend emu_backend(make_cpu_backend(0));
  auto emu = DeepseekV4Model::load(dir, emu_backend, std::nullopt, true);
  auto ref = DeepseekV4Model::load(dir, *cpu, std::nullopt, false);
  ASSERT_EQ(emu->weights().head.dtype(), DType::kBF16);
  const int64_t V = ref->config().vocab_size;
  std::vector<int64_t> ids;
  for (int i = 0; i < 29; ++i) ids.push_back((i * 53 + 7) % V);
  HostTensor rows_e(DType::kF32, {29, V}), rows_r(DType::kF32, {29, V});
  auto se = emu->new_sequence(), sr = ref->new_sequence();
  for (int64_t i = 0; i < 29; ++i) {
    const std::span<const int64_t> one(&ids[i], 1);
    const HostTensor le = emu->forward(se, one), lr = ref->forward(sr, one);
    std::copy_n(le.data<float>(), V, rows_e.data<float>() + i * V);
    std::copy_n(lr.data<float>(), V, rows_r.data<float>() + i * V);
  }
  const double rel = testing::worst_row_rel(rows_e, rows_r, V);
  std::printf("[output-head] emulated CUDA bf16 head vs f32 head, token by token: worst row rel %.3g\n", rel);
  EXPECT_LE(rel, 1e-2);
  EXPECT_GT(rel, 0.0);

  auto argmax = [V](const HostTensor& l) {
    const float* p = l.data<float>() + l.numel() - V;
    return static_cast<int64_t>(std::max_element(p, p + V) - p);
  };
  int flips = 0;
  for (int64_t prompt : {7, 300, 41}) {
    auto a = emu->new_sequence(), b = ref->new_sequence();
    int64_t ta = prompt, tb = prompt;
    std::vector<int64_t> got, want;
    for (int step = 0; step < 12; ++step) {
      ta = argmax(emu->forward(a, std::span<const int64_t>(&ta, 1)));
      tb = argmax(ref->forward(b, std::span<const int64_t>(&tb, 1)));
      got.push_back(ta);
      want.push_back(tb);
    }
    EXPECT_EQ(got, want) << "prompt " << prompt;
    flips += got != want;
  }
  std::printf("[output-head] greedy continuations changed by the bf16 head input: %d of 3\n", flips);
}

// The engine end to end on the CPU: --weight-format fp8 keeps the block formats and a bf16 head (the log says so)
// and, the CPU widening the head exactly, samples the f32 run's greedy ids (prefill and batched paged decode).
TEST(OutputHead, EngineLogsTheBf16HeadAndKeepsTheF32Tokens) {
  testing::TempDir tmp;
  const std::string dir = quant_checkpoint(tmp, "deepseek_v4", 128, 11);
  std::string args = " --device cpu --model " + dir + " --max-tokens 6 --ignore-eos";
  for (const char* p : {"7", "300,5,9,41"}) args += std::string(" --prompt-ids ") + p;
  const auto kept = testing::run_cli("offline --weight-format fp8" + args);
  const auto f32 = testing::run_cli("offline --weight-format f32" + args);
  for (const auto* r : {&kept, &f32}) ASSERT_EQ(r->exit_code, 0) << r->output;
  EXPECT_NE(kept.output.find("output head: bf16 as stored"), std::string::npos) << kept.output;
  EXPECT_NE(f32.output.find("output head: f32"), std::string::npos) << f32.output;
  const auto want = testing::parse_offline_samples(f32.output);
  ASSERT_EQ(want.size(), 2u) << f32.output;
  EXPECT_EQ(testing::parse_offline_samples(kept.output), want) << kept.output;
}

TEST(OutputHead, HeadLinearTakesF32OrBf16Heads) {
  auto backend = make_cpu_backend(0);
  const int64_t M = 3, V = 10, D = 16;
  HostTensor in(DType::kF32, {M, D}), wf(DType::kF32, {V, D}), wb(DType::kBF16, {V, D});
  for (int64_t i = 0; i < in.numel(); ++i) in.data<float>()[i] = std::sin(0.37f * static_cast<float>(i)) * 3.1f;
  for (int64_t i = 0; i < wf.numel(); ++i) {
    wf.data<float>()[i] = round_bf16(std::cos(0.11f * static_cast<float>(i)));
    uint32_t bits;
    std::memcpy(&bits, &wf.data<float>()[i], sizeof(bits));
    wb.data<uint16_t>()[i] = static_cast<uint16_t>(bits >> 16);
  }
  HostTensor want(DType::kF32, {M, V}), got_f(DType::kF32, {M, V}), got_b(DType::kF32, {M, V});
  backend->linear({in, wf, want});
  head_linear(*backend, in, wf, got_f);
  head_linear(*backend, in, wb, got_b);
  EXPECT_TRUE(same_bytes(got_f, want));
  EXPECT_TRUE(same_bytes(got_b, want));
  HostTensor wh(DType::kF16, {V, D});
  EXPECT_THROW(head_linear(*backend, in, wh, got_b), Error);
}

}  // namespace
}  // namespace deepinfer
