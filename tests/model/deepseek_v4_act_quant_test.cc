// DeepseekV4Model::set_activation_quant (--activation-quant mxfp8, the reference's numerics): every GEMM over a
// block-format weight rounds its inputs, nothing else does, and the logits move by a small amount. Checked on random
// block-quantized V4 / V4.1 checkpoints (the released quantization_config) and on the unquantized golden model.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include <nlohmann/json.hpp>

#include "deepinfer/model/deepseek_v4.h"
#include "deepinfer/model/random_checkpoint.h"
#include "forwarding_backend.h"
#include "logit_diff.h"
#include "random_checkpoint_util.h"
#include "test_util.h"
#include "v4_quant_config.h"

namespace deepinfer {
namespace {

std::string golden_dir(const std::string& family) { return testing::test_data_dir() + "/golden/" + family; }

bool same_bits(const HostTensor& a, const HostTensor& b) {
  return a.shape() == b.shape() && std::memcmp(a.view().data(), b.view().data(), a.view().nbytes()) == 0;
}

// The CPU reference, counting the GEMM calls by whether they round their inputs.
class ActQuantCounter : public testing::ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  void linear(const LinearParams& p) override {
    ++(p.act_quant == ActQuant::kNone ? plain : rounded);
    inner_->linear(p);
  }
  void linear_quant(const QuantLinearParams& p) override {
    ++(p.act_quant == ActQuant::kNone ? plain : rounded);
    if (p.weight.format == QuantFormat::kFloat && p.act_quant != ActQuant::kNone) ++rounded_float;
    inner_->linear_quant(p);
  }
  void moe(const MoeParams& p) override {
    ++(p.act_quant == ActQuant::kNone ? plain_moe : rounded_moe);
    inner_->moe(p);
  }
  void moe_quant(const QuantMoeParams& p) override {
    ++(p.act_quant == ActQuant::kNone ? plain_moe : rounded_moe);
    inner_->moe_quant(p);
  }
  int plain = 0, rounded = 0, rounded_float = 0, plain_moe = 0, rounded_moe = 0;
};

struct Ckpt {
  testing::TempDir tmp;
  std::string dir;
  std::vector<int64_t> token_map;
};

std::unique_ptr<Ckpt> quantized_checkpoint(const std::string& family, int block) {
  auto c = std::make_unique<Ckpt>();
  nlohmann::json cfg = nlohmann::json::parse(testing::read_file_or_empty(golden_dir(family) + "/config.json"));
  cfg["quantization_config"] = testing::v4_quantization_config(block);
  c->dir = testing::write_random_checkpoint_of(c->tmp, cfg, 5);
  const nlohmann::json& text = cfg.contains("text_config") ? cfg["text_config"] : cfg;
  c->token_map.resize(text["vocab_size"].get<int64_t>());
  for (size_t i = 0; i < c->token_map.size(); ++i) c->token_map[i] = static_cast<int64_t>(i % 256);
  return c;
}

// Prefill of 29 tokens, then three decode steps.
std::vector<HostTensor> run(const DeepseekV4Model& m) { return testing::prefill_then_decode(m, 29, 512); }

TEST(DeepseekV4ActQuant, RoundsEveryBlockFormatGemmAndMovesTheLogitsALittle) {
  for (const auto& [family, block] : {std::pair{"deepseek_v4", 128}, {"deepseek_v41", 32}}) {
    SCOPED_TRACE(family);
    auto ck = quantized_checkpoint(family, block);
    ActQuantCounter counted(make_cpu_backend(0));
    auto backend = make_cpu_backend(0);
    auto kept = DeepseekV4Model::load(ck->dir, counted, ck->token_map, true);
    auto f32 = DeepseekV4Model::load(ck->dir, *backend, ck->token_map, false);
    auto plain = DeepseekV4Model::load(ck->dir, *backend, ck->token_map, false);
    EXPECT_EQ(kept->activation_quant(), ActQuant::kNone);
    kept->set_activation_quant(ActQuant::kMxfp8);
    f32->set_activation_quant(ActQuant::kMxfp8);
    EXPECT_EQ(kept->activation_quant(), ActQuant::kMxfp8);

    const std::vector<HostTensor> a = run(*kept), b = run(*f32), p = run(*plain);
    // Kept quantized or dequantized at load, the CPU reference multiplies the same values: the same bits.
    for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(same_bits(a[i], b[i])) << "step " << i;
    // Every attention projection and MoE call rounded; the bf16 / f32 matrices (compressors, indexer keys and
    // weights, the head, the router) not.
    EXPECT_GT(counted.rounded, 0);
    EXPECT_GT(counted.plain, 0);
    EXPECT_EQ(counted.rounded_float, 0);
    EXPECT_GT(counted.rounded_moe, 0);
    EXPECT_EQ(counted.plain_moe, 0);
    // The rounding is real but small: e4m3 keeps 3 mantissa bits (relative error <= 2^-4 an input).
    for (size_t i = 0; i < a.size(); ++i) {
      const testing::LogitDiff d = testing::logit_diff(a[i], p[i]);
      EXPECT_GT(d.max_abs, 0.0) << "step " << i << ": the rounding changed nothing";
      // A loose bound: a random-weight model amplifies perturbations (0.93-0.997 measured at 3e5d6c1).
      EXPECT_GT(d.cosine, 0.9) << "step " << i;
      std::printf("[v4-act-quant %s] step %zu: max |mxfp8 - none| = %.3g of max |logit| %.3g, cosine %.4f\n", family, i,
                  d.max_abs, d.max_ref, d.cosine);
    }
  }
}

// The draft modules' projections: the MTP module's e_proj / h_proj (FP8 in a quantized checkpoint, kept f32 here)
// take the mode like the blocks' projections, and only while it is set.
TEST(DeepseekV4ActQuant, MtpProjectionsFollowTheMode) {
  auto ck = quantized_checkpoint("deepseek_v4_mtp", 128);
  auto backend = make_cpu_backend(0);
  auto m = DeepseekV4Model::load(ck->dir, *backend, ck->token_map, false);
  ASSERT_TRUE(m->weights().mtp.has_value());
  const V4MtpWeights& mtp = *m->weights().mtp;
  EXPECT_TRUE(mtp.e_proj.block_format && mtp.h_proj.block_format && mtp.block.attn.wq_a.block_format);
  EXPECT_EQ(mtp.e_proj.act_quant, ActQuant::kNone);
  m->set_activation_quant(ActQuant::kMxfp8);
  EXPECT_EQ(mtp.e_proj.act_quant, ActQuant::kMxfp8);
  EXPECT_EQ(mtp.h_proj.act_quant, ActQuant::kMxfp8);
  EXPECT_EQ(mtp.block.attn.wq_a.act_quant, ActQuant::kMxfp8);
  EXPECT_EQ(mtp.block.moe_act_quant, ActQuant::kMxfp8);
  m->set_activation_quant(ActQuant::kNone);
  EXPECT_EQ(mtp.e_proj.act_quant, ActQuant::kNone);
  EXPECT_EQ(mtp.block.moe_act_quant, ActQuant::kNone);
}

// A checkpoint without block-format weights (the golden model, all f32 / bf16): nothing to round, so the mode
// changes no bit.
TEST(DeepseekV4ActQuant, UnquantizedCheckpointIsUnchanged) {
  auto backend = make_cpu_backend(0);
  std::vector<int64_t> token_map(512);
  for (size_t i = 0; i < token_map.size(); ++i) token_map[i] = static_cast<int64_t>(i % 256);
  for (const char* family : {"deepseek_v4", "deepseek_v41"}) {
    SCOPED_TRACE(family);
    auto ref = DeepseekV4Model::load(golden_dir(family), *backend, token_map);
    auto rounded = DeepseekV4Model::load(golden_dir(family), *backend, token_map);
    if (ref->config().quant.fp8 || ref->config().quant.experts_fp4) GTEST_SKIP() << "the golden model is quantized";
    rounded->set_activation_quant(ActQuant::kMxfp8);
    const std::vector<HostTensor> a = run(*rounded), b = run(*ref);
    for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(same_bits(a[i], b[i])) << "step " << i;
  }
}

}  // namespace
}  // namespace deepinfer
