// Loading DeepSeek-V4 / V4.1 checkpoints: quantized storage (FP8 32×32 block scales, MXFP4 experts, FP8 Engram
// tables) runs through the forward, and a broken checkpoint fails at load with every problem listed.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>

#include <nlohmann/json.hpp>

#include "deepinfer/io/safetensors.h"
#include "deepinfer/model/deepseek_v4.h"
#include "deepinfer/model/random_checkpoint.h"
#include "forwarding_backend.h"
#include "random_checkpoint_util.h"
#include "test_util.h"
#include "v4_paged_decode.h"
#include "v4_quant_config.h"

namespace deepinfer {
namespace {

std::string golden_dir(const std::string& family) { return testing::test_data_dir() + "/golden/" + family; }

void expect_same_bytes(const char* what, const HostTensor& got, const HostTensor& want) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  EXPECT_EQ(std::memcmp(got.view().data(), want.view().data(), static_cast<size_t>(want.view().nbytes())), 0) << what;
}

// The CPU reference counting linear_quant calls with split_in (the compressors' bf16 path).
class SplitInCounter : public testing::ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  void linear_quant(const QuantLinearParams& p) override {
    split_in_calls += p.split_in;
    inner_->linear_quant(p);
  }
  int split_in_calls = 0;
};

TEST(DeepseekV4Load, QuantizedV41CheckpointRunsAndChunksConsistently) {
  testing::TempDir tmp;
  nlohmann::json cfg = nlohmann::json::parse(testing::read_file_or_empty(golden_dir("deepseek_v41") + "/config.json"));
  cfg["quantization_config"] = testing::v4_quantization_config();
  const std::string ckpt_dir = testing::write_random_checkpoint_of(tmp, cfg, RandomCheckpointOptions{}.seed);
  auto backend = make_cpu_backend(0);
  std::vector<int64_t> token_map(cfg["text_config"]["vocab_size"].get<int64_t>());
  for (size_t i = 0; i < token_map.size(); ++i) token_map[i] = static_cast<int64_t>(i % 256);
  auto model = DeepseekV4Model::load(ckpt_dir, *backend, token_map);
  ASSERT_TRUE(model->config().quant.experts_fp4);
  std::vector<int64_t> ids;
  for (int i = 0; i < 45; ++i) ids.push_back((i * 37 + 11) % 512);
  auto one = model->new_sequence();
  HostTensor full = model->forward(one, ids);
  for (int64_t i = 0; i < full.numel(); ++i) ASSERT_TRUE(std::isfinite(full.data<float>()[i])) << i;
  auto chunked = model->new_sequence();
  std::vector<float> rows;
  for (size_t at = 0; at < ids.size();) {
    const size_t len = std::min<size_t>(at < 10 ? 3 : 1, ids.size() - at);
    HostTensor part = model->forward(chunked, std::span<const int64_t>(ids.data() + at, len));
    rows.insert(rows.end(), part.data<float>(), part.data<float>() + part.numel());
    at += len;
  }
  double err = 0, scale = 0;
  for (int64_t i = 0; i < full.numel(); ++i) {
    err = std::max(err, std::fabs(double(rows[i]) - full.data<float>()[i]));
    scale = std::max(scale, std::fabs(double(full.data<float>()[i])));
  }
  EXPECT_LE(err, 1e-5 * scale);
}

// keep_quant (what the engine does on CUDA by default): the FP8 projections and the MXFP4 / FP8 experts stay in
// their stored format and the forward reads them through linear_quant / moe_quant. The CPU reference dequantizes
// them per call exactly as the loader does at load, so prefill, per-sequence decode and the batched paged decode
// must give the f32 model's logits bit for bit, from about a quarter of the weight bytes. V4 with 128x128 blocks
// keeps wo_a in f32 (its 32-row head groups cut the scale blocks); V4.1 with 32x32 blocks keeps it quantized and
// runs the group slices.
TEST(DeepseekV4Load, KeptQuantizedWeightsGiveTheF32LogitsBitForBit) {
  for (const auto& [family, block] : {std::pair{"deepseek_v4", 128}, {"deepseek_v41", 32}}) {
    SCOPED_TRACE(family);
    testing::TempDir tmp;
    nlohmann::json cfg = nlohmann::json::parse(testing::read_file_or_empty(golden_dir(family) + "/config.json"));
    cfg["quantization_config"] = testing::v4_quantization_config(block);
    const std::string ckpt_dir = testing::write_random_checkpoint_of(tmp, cfg, 3);
    auto backend = make_cpu_backend(0);
    SplitInCounter counted(make_cpu_backend(0));
    const nlohmann::json& text = cfg.contains("text_config") ? cfg["text_config"] : cfg;
    std::vector<int64_t> token_map(text["vocab_size"].get<int64_t>());
    for (size_t i = 0; i < token_map.size(); ++i) token_map[i] = static_cast<int64_t>(i % 256);
    auto kept = DeepseekV4Model::load(ckpt_dir, counted, token_map, true);
    auto f32 = DeepseekV4Model::load(ckpt_dir, *backend, token_map, false);
    const V4LayerWeights& lw = kept->weights().layers[0];
    EXPECT_TRUE(lw.attn.wq_a.quantized() && lw.attn.wq_b.quantized() && lw.attn.wkv.quantized() &&
                lw.attn.wo_b.quantized());
    EXPECT_EQ(lw.attn.wo_a.quantized(), block == 32);
    EXPECT_TRUE(lw.quant_experts);
    EXPECT_EQ(lw.qexperts[0].w1.format, QuantFormat::kMXFP4);
    EXPECT_EQ(lw.qshared.w1.format, QuantFormat::kFP8Block);
    EXPECT_FALSE(f32->weights().layers[0].attn.wq_a.quantized());
    EXPECT_FALSE(f32->weights().layers[0].quant_experts);
    std::printf("[v4-kept %s] weight bytes: kept %lld, f32 %lld\n", family,
                static_cast<long long>(kept->weight_bytes()), static_cast<long long>(f32->weight_bytes()));
    // The tiny model's f32 embedding, head and mHC tables dilute the total; the experts alone shrink ~7x.
    EXPECT_LT(kept->weight_bytes(), 0.6 * f32->weight_bytes());
    int64_t kept_experts = 0, f32_experts = 0;
    for (const V4LayerWeights& l : kept->weights().layers)
      for (const KeptMatrix& m : l.quant_storage) kept_experts += m.bytes();
    for (const V4LayerWeights& l : f32->weights().layers)
      for (const OwnedTensor& t : l.expert_storage) f32_experts += dtype_bytes(t.dtype(), t.numel());
    EXPECT_LT(kept_experts, f32_experts / 5);

    std::vector<int64_t> ids;
    for (int i = 0; i < 37; ++i) ids.push_back((i * 37 + 11) % 512);
    auto sk = kept->new_sequence(), sf = f32->new_sequence();
    expect_same_bytes("prefill", kept->forward(sk, ids), f32->forward(sf, ids));
    for (int64_t tok : {5, 301, 77}) {
      const std::span<const int64_t> one(&tok, 1);
      expect_same_bytes("decode", kept->forward(sk, one), f32->forward(sf, one));
    }
    // The compressor projections keep their stored bf16 values beside the f32 ones, and a prompt of at least 128
    // rows reads them through linear_quant's split_in (deepseek_v4_attention.cc): exact on the CPU reference. The
    // 37-row prefill and the decode steps above keep the f32 weights.
    EXPECT_EQ(counted.split_in_calls, 0);
    int compressors = 0;
    for (size_t l = 0; l < kept->weights().layers.size(); ++l) {
      const V4AttentionWeights& ka = kept->weights().layers[l].attn;
      const V4AttentionWeights& fa = f32->weights().layers[l].attn;
      EXPECT_EQ(ka.comp_wkv_bf16.view().data() != nullptr, ka.comp_wkv.view().data() != nullptr) << "layer " << l;
      EXPECT_EQ(ka.idx_comp_wgate_bf16.view().data() != nullptr, ka.idx_comp_wgate.view().data() != nullptr);
      EXPECT_EQ(fa.comp_wkv_bf16.view().data(), nullptr);
      if (ka.comp_wkv_bf16.view().data() != nullptr) {
        ++compressors;
        EXPECT_EQ(ka.comp_wkv_bf16.dtype(), DType::kBF16);
        EXPECT_EQ(ka.comp_wkv_bf16.shape(), ka.comp_wkv.shape());
      }
    }
    EXPECT_GT(compressors, 0);
    std::vector<int64_t> long_ids;
    for (int i = 0; i < 160; ++i) long_ids.push_back((i * 53 + 7) % 512);
    auto lk = kept->new_sequence(), lf = f32->new_sequence();
    expect_same_bytes("prefill of 160", kept->forward(lk, long_ids), f32->forward(lf, long_ids));
    EXPECT_GT(counted.split_in_calls, 0);

    const std::vector<testing::Spec> specs = testing::make_specs(*f32, {19, 40, 7}, 4);
    const auto paged_kept = testing::paged_decode(*kept, specs, false, true);
    const auto paged_f32 = testing::paged_decode(*f32, specs, false, true);
    ASSERT_EQ(paged_kept.size(), paged_f32.size());
    for (size_t i = 0; i < paged_f32.size(); ++i)
      EXPECT_EQ(paged_kept[i], paged_f32[i]) << "batched decode, sequence " << i;
  }
}

TEST(DeepseekV4Load, BrokenCheckpointListsEveryProblem) {
  testing::TempDir tmp;
  const std::string src = golden_dir("deepseek_v4");
  auto file = SafetensorsFile::open(src + "/model.safetensors");
  std::vector<SafetensorsWriteItem> items;
  HostTensor wrong(DType::kBF16, {63, 128});
  for (const auto& e : file->entries()) {
    if (e.name == "model.layers.1.attn.wq_a.weight") continue;  // missing
    if (e.name == "model.layers.2.attn.wkv.weight") {           // wrong shape
      items.push_back({e.name, DType::kBF16, {63, 128}, wrong.data<void>()});
      continue;
    }
    Tensor t = file->tensor(e);
    if (e.name == "model.layers.0.ffn.gate.tid2eid") {  // wrong dtype: float hash table
      items.push_back({e.name, DType::kF32, {t.shape()[0], t.shape()[1] * 2}, t.data()});
      continue;
    }
    items.push_back({e.name, e.dtype, e.shape, t.data()});
  }
  write_safetensors(tmp.file("model.safetensors"), items);
  testing::write_file(tmp.file("config.json"), testing::read_file_or_empty(src + "/config.json"));
  auto backend = make_cpu_backend(1);
  try {
    DeepseekV4Model::load(tmp.path(), *backend);
    FAIL() << "a broken checkpoint loaded";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("layers.1.attn.wq_a.weight"), std::string::npos) << msg;
    EXPECT_NE(msg.find("layers.2.attn.wkv.weight"), std::string::npos) << msg;
    EXPECT_NE(msg.find("tid2eid"), std::string::npos) << msg;
    EXPECT_NE(msg.find("3 problem(s)"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace deepinfer
